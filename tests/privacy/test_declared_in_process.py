"""What each party sends and receives is what the method declares, checked in one process and for every method.

tests/privacy/test_recorder.py checks a method's declaration against a Flower run with the message recorder on;
those runs are slow, so only two methods run there by default.  Here the same check runs for every method without
Flower's runtime (tests/in_process.py): the strategy's own round loop (``start``) talks through the server's
recording Grid wrapper to a stand-in Grid whose nodes are the real ClientApp handlers (``client_app.app``: train,
evaluate, queries), behind the client's recording mod, on the user's default settings shrunk in nodes, rounds and
training samples.  A
declaration that leaves out (or misnames) a record, an array or an entry that a real message carries, or a message
that carries one it does not declare, fails here.
"""

from __future__ import annotations

import copy

import pytest

from server_app.app import build_strategy
from strategies.disclosure import disagreements, mismatches
from task.config import parse_settings
from task.methods import METHODS
from tests.in_process import NODES, OTHER_MODE, run_in_process


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_message_of_a_run_with_real_clients_is_what_the_method_declares(method, tmp_path):
    _, server, clients, config = run_in_process(method, tmp_path)
    assert sorted(clients) == list(range(NODES))  # every client recorded what it received and sent
    assert disagreements(server, [line for lines in clients.values() for line in lines]) == []
    declared = build_strategy(parse_settings(config)).disclosure()
    assert mismatches(declared, server, clients=NODES) == []
    used = {line["type"] for line in server}
    assert {line["round"] for line in server} == {1, 2} and "train" in used
    assert {q for q in METHODS[method].queries if f"query.{q}" not in used} == OTHER_MODE.get(method, set())


def without_entry(line: dict, kind: str, record: str, entry: str) -> dict:
    out = copy.deepcopy(line)
    out["content"][kind][record] = [e for e in out["content"][kind][record] if e != entry]
    return out


@pytest.mark.parametrize("method", ["fedavg", "pfedlia"])
def test_every_message_declares_its_round_and_phase_as_always_sent(method, tmp_path):
    """The round and the phase are in the config of every message the server sends (train, evaluate, queries): a
    message without either does not match the declaration."""
    _, server, _, config = run_in_process(method, tmp_path)
    declared = build_strategy(parse_settings(config)).disclosure()
    pushed = {line["type"]: line for line in server if line["direction"] == "pushed"}
    assert len(pushed) >= 2
    for line in pushed.values():
        for entry in ("server-round", "phase"):
            assert mismatches(declared, [without_entry(line, "configs", "config", entry)]), (line["type"], entry)


@pytest.mark.parametrize("method,phase,metric", [("ifca", "evaluate", "cluster"), ("pifl", "bid", "tier-acc")])
def test_a_metric_the_server_does_not_read_is_still_declared_as_always_sent(method, phase, metric, tmp_path):
    """IFCA's clients report the cluster they chose and PI-FL's bids each tier's accuracy, which the server does not
    read: declared all the same, as sent in every reply, so a reply without it does not match."""
    strategy, server, _, config = run_in_process(method, tmp_path)
    assert metric in strategy.unread_metrics[phase]
    declared = build_strategy(parse_settings(config)).disclosure()
    replies = [line for line in server if line["direction"] == "pulled" and line["type"] in (phase, f"query.{phase}")]
    assert replies and all(metric in line["content"]["metrics"]["metrics"] for line in replies)
    assert mismatches(declared, [without_entry(replies[0], "metrics", "metrics", metric)])


def test_fedsofts_messages_declare_the_clients_own_importance_weights_as_always_sent(tmp_path):
    """Every FedSoft train and evaluate message brings the client its own importance weights ``u``: declared as
    always there, so a message without them does not match."""
    _, server, _, config = run_in_process("fedsoft", tmp_path)
    declared = build_strategy(parse_settings(config)).disclosure()
    pushed = [line for line in server if line["direction"] == "pushed" and line["type"] in ("train", "evaluate")]
    assert pushed and all("u" in line["content"]["configs"]["fedsoft"] for line in pushed)
    assert mismatches(declared, [without_entry(pushed[0], "configs", "fedsoft", "u")])

"""What each party sends and receives is what the method declares, checked in one process: every method, both DP
modes and the runs that are not the tidy default.

Without Flower's runtime (tests/in_process.py): the strategy's own round loop (``start``) talks through the server's
recording Grid wrapper to a stand-in Grid whose nodes are the real ClientApp handlers (``client_app.app``: train,
evaluate, queries), behind the client's recording mod, on the user's default settings shrunk in nodes, rounds and
training samples.  A declaration that leaves out (or misnames) a record, an array, an entry or a list's length that a
real message carries, or a message that carries one it does not declare, fails here; counts bounded by the
federation (one model per client, the peers' ids) are held to its size.  The runs with options that change the
messages, a sampled cohort, a late joiner and a resumed run are in VARIANTS below.  tests/privacy/test_recorder.py
runs the same check through Flower for a few of them (it says why only a few).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import pytest

from server_app.app import build_strategy
from strategies.disclosure_check import disagreements, mismatches
from task.config import parse_settings
from task.methods import METHODS
from tests.in_process import NODE_IDS, NODES, OTHER_MODE, RESUMED_NODE_IDS, run_in_process


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


# ---------------------------------------------------------------------------------------------- the untidy runs
def _pushed(server: list[dict], kind: str) -> list[dict]:
    return [line for line in server if line["direction"] == "pushed" and line["type"] == kind]


def _sent_peers(server: list[dict]) -> set[int]:
    return {
        line["content"]["lengths"].get("peer-clients", {}).get("client-ids", 0) for line in _pushed(server, "train")
    }


def _fewer_trained(server: list[dict]) -> bool:
    return any(len({line["node"] for line in _pushed(server, "train") if line["round"] == r}) < NODES for r in (1, 2))


def _late(server: list[dict]) -> bool:
    late = next(node for node, pid in NODE_IDS.items() if pid == NODES - 1)
    return {line["round"] for line in server if line["node"] == late} == {2}


def _resumed(server: list[dict]) -> bool:
    """Round 1 went to the first run's nodes, round 2 to the resumed run's (new node ids)."""
    before = {line["node"] for line in server if line["round"] == 1}
    after = {line["node"] for line in server if line["round"] == 2}
    return before == set(NODE_IDS) and after == set(RESUMED_NODE_IDS)


def _beneficial(server: list[dict]) -> bool:
    lia = [line for line in server if line["direction"] == "pulled" and line["type"] == "query.lia"]
    return bool(lia) and all("beneficial" in line["content"]["metrics"]["metrics"] for line in lia)


def _label_histogram(server: list[dict]) -> bool:
    trained = [line for line in server if line["direction"] == "pulled" and line["type"] == "train"]
    return bool(trained) and all(line["content"]["lengths"]["metrics"]["label-histogram"] == 10 for line in trained)


def _no_integer_buffers(server: list[dict]) -> bool:
    released = [line for line in server if line["direction"] == "pulled" and "arrays" in line["content"]["arrays"]]
    return bool(released) and all(
        not any(dtype.startswith("int") for _, dtype in line["content"]["arrays"]["arrays"].values())
        for line in released
    )


#: Option values and federations that change what travels, each with what shows in the messages that it took effect
#: (several in one run where they do not get in each other's way).  Through the same real clients and recording as
#: the default runs above; a late joiner connects after round 1 (min-nodes 2), a resumed run stops after round 1 as
#: a crash would and a new server resumes it with new node ids and fresh ClientApps.  Both DP modes run here: central
#: for FedAvg, local for FedC2I and pFedLIA.
LATE = {"late": [NODES - 1], "min-nodes": NODES - 1}
RESUMED = {"resume_after": 1}
Variant = tuple[str, dict[str, Any], tuple[Callable[[list[dict]], bool], ...]]
VARIANTS: dict[str, Variant] = {
    "fedavg-central-dp-sampled": (
        "fedavg",
        {"dp-mode": "central", "fraction-train": 0.67},
        (_no_integer_buffers, _fewer_trained),
    ),
    "fedavg-central-dp-resumed": ("fedavg", {"dp-mode": "central", **RESUMED}, (_no_integer_buffers, _resumed)),
    "fedc2i-local-dp-resumed": ("fedc2i", {"dp-mode": "local", **RESUMED}, (_no_integer_buffers, _resumed)),
    "fedc2i-peers-sampled": (
        "fedc2i",
        {"c2i-peers": 2, "fraction-train": 0.67},
        (lambda server: _sent_peers(server) == {0, 1}, _fewer_trained),
    ),
    "fedc2i-late-joiner": ("fedc2i", LATE, (_late,)),
    "pfedlia-local-dp": ("pfedlia", {"dp-mode": "local"}, (_no_integer_buffers,)),
    "pfedlia-p2p-late-joiner": ("pfedlia", {"lia-mode": "p2p", **LATE}, (_beneficial, _late)),
    "pfedlia-resumed": ("pfedlia", RESUMED, (_resumed,)),
    "fedcac-diagnostics-late-joiner": ("fedcac", {"fedcac-diagnostics": True, **LATE}, (_label_histogram, _late)),
    "pifl-late-joiner": ("pifl", LATE, (_late,)),
    "pifl-resumed": ("pifl", RESUMED, (_resumed,)),
    "client2vec-late-joiner": ("client2vec", LATE, (_late,)),
}


#: Client2Vec's Federated mode trains the DSA-IGN by FedAvg over the clients' embeddings: 30 s here, so it runs with
#: ``-m extended``
EXTENDED: dict[str, Variant] = {
    "client2vec-federated-ign": (
        "client2vec",
        {"c2v-ign-mode": "federated"},
        (lambda server: bool(_pushed(server, "query.c2v_ign")),),
    ),
}


@pytest.mark.parametrize(
    "name", [*sorted(VARIANTS), *(pytest.param(n, marks=pytest.mark.extended) for n in sorted(EXTENDED))]
)
def test_every_message_of_an_untidy_run_is_what_the_method_declares(name, tmp_path):
    method, options, took_effect = {**VARIANTS, **EXTENDED}[name]
    options = dict(options)
    late, resume_after = options.pop("late", ()), options.pop("resume_after", 0)
    _, server, clients, config = run_in_process(method, tmp_path, late=late, resume_after=resume_after, **options)
    shown = {check.__name__: check(server) for check in took_effect}
    assert all(shown.values()), f"{name}: the variant did not show in the messages: {shown}"
    assert sorted(clients) == list(range(NODES))
    assert disagreements(server, [line for lines in clients.values() for line in lines]) == []
    declared = build_strategy(parse_settings(config)).disclosure()
    assert mismatches(declared, server, clients=NODES) == []
    assert {line["round"] for line in server} == {1, 2}


def test_a_list_of_another_length_than_declared_is_caught_in_a_real_recording(tmp_path):
    """The tripwire on list lengths, on a real FedC2I recording: one more influence score than the models the client
    was sent (and than clients in the federation) is a mismatch."""
    _, server, _, config = run_in_process("fedc2i", tmp_path)
    declared = build_strategy(parse_settings(config)).disclosure()
    reply = next(line for line in server if line["direction"] == "pulled" and line["type"] == "train")
    longer = copy.deepcopy(reply)
    longer["content"]["lengths"]["metrics"]["influence"] = NODES + 1
    assert mismatches(declared, [reply], clients=NODES) == []
    where = f"pulled train (round {reply['round']}, node {reply['node']})"
    assert mismatches(declared, [longer], clients=NODES) == [
        f"{where}: record 'metrics' entry 'influence' is a list of {NODES + 1} values, declared 1..N"
    ]

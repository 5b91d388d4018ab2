"""What each party sends and receives is what the method declares, checked in one process and for every method.

tests/privacy/test_recorder.py checks a method's declaration against a Flower run with the message recorder on;
those runs are slow, so only two methods run there by default.  Here the same check runs for every method without
Flower's runtime: the strategy's own round loop (``start``) talks through the server's recording Grid wrapper to
a stand-in Grid whose nodes are the real ClientApp handlers (``client_app.app``: train, evaluate, queries), behind
the client's recording mod, on the user's default settings shrunk in nodes, rounds and training samples.  A
declaration that leaves out (or misnames) a record, an array or an entry that a real message carries, or a message
that carries one it does not declare, fails here.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any, cast
from unittest import mock

import pytest
from flwr.app import Context, Message, RecordDict
from flwr.serverapp import Grid

import client_app.app as client_app
from client_app.faults import InjectedFault
from server_app.app import build_strategy
from server_app.disclosure import NEEDS
from server_app.recorder import RecordingGrid
from strategies.disclosure import disagreements, mismatches
from task.config import parse_settings
from task.methods import METHODS
from task.params import to_record
from task.recording import SERVER_FILE, read_run
from tests.privacy.test_recorder import NODES, OTHER_MODE, SETTINGS, SHRUNK
from tests.strategy_harness import ReplayGrid, outgoing_messages, reply_message

NODE_IDS = {1001 + 7 * pid: pid for pid in range(NODES)}


class Reply:
    """Stands in for the ``flwr.app.Message`` a handler returns (``Message(content=..., reply_to=msg)``), which
    Flower only builds inside a running app."""

    def __init__(self, content: RecordDict, reply_to: Any) -> None:
        if reply_to is None:  # Flower would take it for a new message, which a ClientApp cannot send
            raise TypeError("a ClientApp's reply must name the message it answers (reply_to)")
        self.content = content
        self.reply_to = reply_to

    def has_error(self) -> bool:
        return False


def handler(message_type: str):
    if message_type in ("train", "evaluate"):
        return getattr(client_app, message_type)
    return client_app._query_handler(message_type.removeprefix("query."))


def run_in_process(method: str, tmp_path, **extra: Any) -> tuple[Any, list[dict], dict[int, list[dict]], dict]:
    """Two rounds (``SHRUNK``) of ``method`` with ``NODES`` real clients (``extra``: more run config); (the
    strategy after them, the server's recording, each client's, the run config)."""
    config = {"method": method, **SHRUNK, **NEEDS.get(method, {}), **SETTINGS.get(method, {}), **extra}
    strategy = build_strategy(parse_settings(config))
    strategy.results_dir = tmp_path / "run"
    strategy.results_dir.mkdir()
    contexts = {
        node: Context(
            run_id=1,
            node_id=node,
            node_config={"partition-id": pid, "num-partitions": NODES, "cache-dir": ""},
            state=RecordDict(),
            run_config=config,
        )
        for node, pid in NODE_IDS.items()
    }

    def respond(message: Any) -> list[Any]:
        node, kind = message.metadata.dst_node_id, message.metadata.message_type
        received = SimpleNamespace(  # the node's own copy, as after Flower's transport
            content=copy.deepcopy(message.content), metadata=SimpleNamespace(message_type=kind)
        )
        try:
            reply = client_app.recorder_mod(cast(Message, received), contexts[node], handler(kind))
        except InjectedFault as err:  # Flower turns an exception in a handler into an error reply (any other one
            # fails the test here)
            return [reply_message(node, error=f"{type(err).__name__}: {err}")]
        return [reply_message(node, reply.content)]

    grid = RecordingGrid(cast(Grid, ReplayGrid(NODE_IDS, respond)), strategy.results_dir / SERVER_FILE)
    with outgoing_messages(), mock.patch.object(client_app, "Message", Reply):
        strategy.start(
            grid=grid,
            initial_arrays=to_record(strategy.global_state),
            num_rounds=int(config["num-server-rounds"]),
            timeout=strategy.settings.round_timeout,
        )
    server, clients = read_run(strategy.results_dir)
    return strategy, server, clients, config


@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_message_of_a_run_with_real_clients_is_what_the_method_declares(method, tmp_path):
    _, server, clients, config = run_in_process(method, tmp_path)
    assert sorted(clients) == list(range(NODES))  # every client recorded what it received and sent
    assert disagreements(server, [line for lines in clients.values() for line in lines]) == []
    declared = build_strategy(parse_settings(config)).disclosure()
    assert mismatches(declared, server) == []
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

"""A federation of real clients in one process: a strategy's own round loop (``start``) against the real ClientApp
handlers (``client_app.app``: train, evaluate, queries), without Flower's runtime.

The server side talks through the recording Grid wrapper to a stand-in Grid (``ReplayGrid``) whose nodes run the
handlers behind the client's recording mod, each with its own ``Context``.  A run uses the defaults a user gets from
``flwr run . --run-config "method='X'"`` (the ``cnn`` with BatchNorm, the method's default options), shrunk in nodes,
rounds and training samples (``SHRUNK``); the same shrunk settings serve the Flower runs of tests/privacy/
test_recorder.py, so the two check the same federation.
"""

from __future__ import annotations

import copy
from types import SimpleNamespace
from typing import Any, cast
from unittest import mock

from flwr.app import Context, Message, RecordDict
from flwr.serverapp import Grid

import client_app.app as client_app
from client_app.faults import InjectedFault
from server_app.app import build_strategy
from server_app.disclosure import NEEDS
from server_app.recorder import RecordingGrid
from task.config import parse_settings
from task.params import to_record
from task.recording import SERVER_FILE, read_run
from tests.strategy_harness import ReplayGrid, outgoing_messages, reply_message

#: the fewest nodes that exercise every message: PI-FL's tiers need more clients than tiers, and a FedC2I client
#: receives more than one peer
NODES = 3
#: two rounds; the user's defaults otherwise, with fewer training samples per client for speed
SHRUNK = {"num-server-rounds": 2, "min-nodes": NODES, "train-samples": 40, "record-messages": True}
#: Settings that must shrink with the rounds.  pFedLIA and the Oracle cluster after their FedAvg warm-up: with two
#: rounds the warm-up must be one round (the default, 5, is refused at start-up with two rounds), so the clustering
#: round (query.lazy, query.lia) is run
WARMUP = {"warmup-rounds": 1}
#: CFL may split clusters from round cfl-min-rounds on (the default, 5, is refused with two rounds)
#: The Oracle's planted groups need at least one node each (the default num-clusters, 5, exceeds the nodes).
SETTINGS = {"pfedlia": WARMUP, "oracle": {**WARMUP, "num-clusters": NODES}, "cfl": {"cfl-min-rounds": 2}}
#: phases only another mode of the method uses (Client2Vec's DSA-IGN is trained in Global mode by default)
OTHER_MODE = {"client2vec": {"c2v_ign"}}

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


def run_in_process(
    method: str, tmp_path, nodes: int = NODES, **extra: Any
) -> tuple[Any, list[dict], dict[int, list[dict]], dict]:
    """Two rounds (``SHRUNK``) of ``method`` with ``nodes`` real clients (``extra``: more run config); (the
    strategy after them, the server's recording, each client's, the run config)."""
    node_ids = {1001 + 7 * pid: pid for pid in range(nodes)}
    config = {
        "method": method,
        **SHRUNK,
        "min-nodes": nodes,
        **NEEDS.get(method, {}),
        **SETTINGS.get(method, {}),
        **extra,
    }
    strategy = build_strategy(parse_settings(config))
    strategy.results_dir = tmp_path / "run"
    strategy.results_dir.mkdir()
    contexts = {
        node: Context(
            run_id=1,
            node_id=node,
            node_config={"partition-id": pid, "num-partitions": nodes, "cache-dir": ""},
            state=RecordDict(),
            run_config=config,
        )
        for node, pid in node_ids.items()
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

    grid = RecordingGrid(cast(Grid, ReplayGrid(node_ids, respond)), strategy.results_dir / SERVER_FILE)
    with outgoing_messages(), mock.patch.object(client_app, "Message", Reply):
        strategy.start(
            grid=grid,
            initial_arrays=to_record(strategy.global_state),
            num_rounds=int(config["num-server-rounds"]),
            timeout=strategy.settings.round_timeout,
        )
    server, clients = read_run(strategy.results_dir)
    return strategy, server, clients, config

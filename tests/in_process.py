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
from client_app.floor import RunRefused
from server_app.app import build_strategy, resume_point
from server_app.disclosure import NEEDS
from server_app.recorder import RecordingGrid
from strategies.persistence import SimulatedCrash
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


def handled(message_type: str, content: RecordDict, context: Context) -> RecordDict:
    """What the ClientApp's handler of ``message_type`` replies to ``content`` on the node of ``context``, outside
    a run (the message as after Flower's transport, the reply built as :class:`Reply`)."""
    message = cast(Message, SimpleNamespace(content=content, metadata=SimpleNamespace(message_type=message_type)))
    with mock.patch.object(client_app, "Message", Reply):
        return handler(message_type)(message, context).content


class JoiningGrid(ReplayGrid):
    """A ReplayGrid whose ``late`` nodes connect only once the strategy has finished round 1 (a late joiner)."""

    def __init__(self, nodes: dict[int, int], respond: Any, late: set[int], strategy: Any) -> None:
        super().__init__(nodes, respond)
        self.late, self.strategy = late, strategy

    def get_node_ids(self) -> list[int]:
        joined = self.strategy.rounds_done >= 1
        return [n for n in self.nodes if joined or n not in self.late]


def federation(
    strategy: Any, config: dict, node_ids: dict[int, int], node_configs: dict[int, dict], late: set[int]
) -> None:
    """``strategy.start`` against real clients on ``node_ids`` (node id -> partition id), each with a fresh Context
    (as Flower gives a run's ClientApps), its recording mod on, until the run's last round (or a simulated crash)."""
    contexts = {
        node: Context(
            run_id=1,
            node_id=node,
            node_config={
                "partition-id": pid,
                "num-partitions": len(node_ids),
                "cache-dir": "",
                **node_configs.get(pid, {}),
            },
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
        except (InjectedFault, RunRefused) as err:  # Flower turns an exception in a handler into an error reply, in
            # these words (any other exception fails the test here)
            return [reply_message(node, error=f"{type(err)}:<'{err}'>")]
        return [reply_message(node, reply.content)]

    late_nodes = {node for node, pid in node_ids.items() if pid in late}
    grid = RecordingGrid(
        cast(Grid, JoiningGrid(node_ids, respond, late_nodes, strategy)), strategy.results_dir / SERVER_FILE
    )
    with outgoing_messages(), mock.patch.object(client_app, "Message", Reply):
        strategy.start(
            grid=grid,
            initial_arrays=to_record(strategy.global_state),
            num_rounds=int(config["num-server-rounds"]),
            timeout=strategy.settings.round_timeout,
        )


#: the node ids of a resumed run's clients (Flower gives a resumed run new ones)
RESUMED_NODE_IDS = {2003 + 11 * pid: pid for pid in range(NODES)}


def run_in_process(
    method: str,
    tmp_path,
    node_configs: Any = None,  # dict[int, dict]; these three are Any because callers pass run-config keys as
    *,  # **{"key": value}, which a type checker would otherwise match against them
    late: Any = (),  # Iterable[int]
    resume_after: Any = 0,  # int
    nodes: Any = NODES,  # int
    **extra: Any,
) -> tuple[Any, list[dict], dict[int, list[dict]], dict]:
    """Two rounds (``SHRUNK``) of ``method`` with ``nodes`` real clients (``extra``: more run config;
    ``node_configs``: more node config by partition id; ``late``: the partition ids whose nodes connect only after
    round 1; ``resume_after``: the run stops after that round as a crash would (``stop-after``) and a new server
    resumes it (``resume-from``, as the ServerApp does) with new node ids and fresh clients, recording into the same
    folder); (the strategy after them, the server's recording, each client's, the run config)."""
    config = {
        "method": method,
        **SHRUNK,
        "min-nodes": nodes,
        **NEEDS.get(method, {}),
        **SETTINGS.get(method, {}),
        **extra,
    }
    node_ids = {1001 + 7 * pid: pid for pid in range(nodes)}
    folder = tmp_path / "run"
    folder.mkdir()
    first = {**config, "stop-after": resume_after} if resume_after else config
    strategy = build_strategy(parse_settings(first))
    strategy.results_dir = folder
    try:
        federation(strategy, first, node_ids, node_configs or {}, set(late))
    except SimulatedCrash:
        if not resume_after:
            raise
        config = {**config, "resume-from": str(folder)}
        settings = parse_settings(config)
        strategy = build_strategy(settings)
        assert resume_point(settings, strategy) == (folder, resume_after)
        strategy.results_dir = folder
        federation(strategy, config, {2003 + 11 * pid: pid for pid in range(nodes)}, node_configs or {}, set())
    else:
        assert not resume_after, f"stop-after={resume_after} did not stop the run"
    server, clients = read_run(folder)
    return strategy, server, clients, config

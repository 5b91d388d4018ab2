"""The personalized base every strategy here stands on.

:class:`PersonalizedStrategy` is a ``flwr.serverapp.strategy.Strategy`` (Message API) that owns what all
methods share: waiting for nodes, seeded sampling, one message per node (so each node can get its own
``ArrayRecord``), extra ``query.<name>`` phases, one validation gate for every reply of every phase,
communication accounting, per-round history and progress lines.

Clients are known by their **client id**, the ``partition-id`` their node reports (stable across runs and
restarts), not by Flower's node id (random per simulated run).  Per-client state is keyed by client id;
node ids only address messages.  The first valid reply of a node binds its client id for the rest of the
run (a deployed SuperNode keeps its node id across restarts: it is tied to its registered key); a reply
that claims another client id, or a client id another node holds, is rejected.  A partition id is
self-declared: a node that connects first can claim a partition id meant for another, which the real
owner's rejected replies then show in failures.json (see deploy/README.md's threat model).  When the server must choose among nodes it has not heard from yet
(sampling, PI-FL's tiers) it first asks them who they are (``query.identify``), so that a seed draws the
same clients in every run.

A method overrides these hooks, and nothing else of the base:

- :meth:`shared_keys` - which state keys the server aggregates and broadcasts;
- :meth:`reply_spec` - what a reply of a phase must carry (see :mod:`strategies.replies`);
- :meth:`round_config`, :meth:`train_payload`, :meth:`evaluate_payload` - what one node receives;
- :meth:`prepare_round` - extra phases (queries) before the round's cohort is drawn;
- :meth:`wants_client_ids` - whether the cohort depends on which client each node is;
- :meth:`sample` - the round's cohort;
- :meth:`aggregate` - what happens with the round's valid train replies;
- :meth:`on_evaluated` - what happens with the round's valid evaluate replies (after the common metrics);
- :meth:`on_round_end` - after evaluation of every round;
- :meth:`write_artifacts` - the method's files in the results folder.
"""

from __future__ import annotations

import logging
import random
import re
import resource
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from strategies.message_timing import breakdown, summarize
from strategies.replies import BASE, EVALUATE, TRAIN, Arrays, InvalidReply, ReplySpec, parse_reply
from task.checkpoint import restore_into, save_checkpoint, to_tree
from task.config import Settings
from task.export import model_manifest, save_model
from task.params import to_record, weighted_average

log = logging.getLogger("flwr.pflower")

IDENTIFY = "identify"


class RunAborted(RuntimeError):
    """Every reply of a phase failed for the same reason: running more rounds would only repeat it."""


class NodeWaitTimeout(RunAborted):
    """Fewer than ``min-nodes`` nodes connected within ``node-wait-timeout`` seconds."""


class SimulatedCrash(RuntimeError):
    """``stop-after``: the ServerApp stops after a round's checkpoint as a crash would (for testing resume)."""


#: run-config keys that may differ between an interrupted run and its resumption
RESUMABLE_CHANGES = {
    "num-server-rounds",
    "resume-from",
    "stop-after",
    "results-dir",
    "round-timeout",
    "checkpoint-every",
    "save-models",
    "save-every",
    "save-best",
    "min-nodes",
    "node-wait-timeout",
}


def checkpoint_meta(settings: Settings) -> dict[str, Any]:
    """What a resumed run must agree on: every run-config key but those in :data:`RESUMABLE_CHANGES`."""
    from task.config import RunOptions

    declared = {**RunOptions.declared(), **type(settings.options).declared()}
    config = {k: settings.raw.get(k, o.default) for k, o in declared.items() if k not in RESUMABLE_CHANGES}
    return {"method": settings.method, "model": settings.model, "dataset": settings.data.dataset, "run-config": config}


def _gist(reason: str) -> str:
    """A failure reason without what differs between nodes (ids, process ids, partition numbers, addresses)."""
    return re.sub(r"[0-9a-fA-F]{8,}|\d+", "#", reason)


def short_reason(reason: str) -> str:
    """One line of a failure reason: the client's own exception message from an error reply's traceback."""
    if "Message: " in reason:
        reason = reason.rsplit("Message: ", 1)[1]
    lines = [line.strip() for line in reason.splitlines() if line.strip()]
    return (lines[0] if lines else reason).rstrip("'>").strip()


@dataclass
class Reply:
    """One validated reply: only what the phase's :class:`ReplySpec` declares, already checked."""

    node_id: int
    client: int
    num_examples: int
    metrics: dict[str, Any]
    records: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """The ``arrays`` record (the model update of a train reply)."""
        return self.records.get("arrays", {})


@dataclass
class RoundLog:
    server_round: int
    train: dict[str, float] = field(default_factory=dict)
    evaluate: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def content_bytes(content: RecordDict) -> int:
    """Payload size of a message's records (arrays, metrics and configs), as Flower counts them."""
    return sum(rec.count_bytes() for rec in content.values())


def wait_for_nodes(
    grid: Grid,
    minimum: int,
    *,
    timeout: float = 0.0,
    known: Mapping[int, int] | None = None,
    poll: float = 0.5,
    report_every: float = 10.0,
    clock=time.monotonic,
    sleep=time.sleep,
) -> list[int]:
    """Node ids once at least ``minimum`` nodes are connected (``get_node_ids`` can be empty at first).

    While it waits it warns every ``report_every`` seconds (a quarter of ``timeout`` when that is shorter) how
    many nodes are connected and required, and which clients seen earlier in the run (``known``: client id ->
    its node id) are not connected; after ``timeout`` seconds (0: no limit) it raises :class:`NodeWaitTimeout`.
    """
    every = min(report_every, timeout / 4) if timeout else report_every
    start = last = clock()
    while len(ids := sorted(grid.get_node_ids())) < minimum:
        waited = clock() - start
        timed_out = bool(timeout) and waited >= timeout
        if timed_out or clock() - last >= every:
            connected = set(ids)
            gone = sorted(c for c, n in (known or {}).items() if n not in connected)
            state = f"{len(ids)} connected, min-nodes={minimum} required" + (
                f"; partition ids seen earlier in this run whose nodes are not connected: {gone}" if gone else ""
            )
            if timed_out:
                raise NodeWaitTimeout(
                    f"gave up waiting for nodes after {timeout:g} s (node-wait-timeout): {state}. Start more "
                    f'SuperNodes (simulation: --federation-config "num-supernodes=N" with N >= {minimum}), lower '
                    f"min-nodes to the nodes you have, or raise node-wait-timeout (0: wait without limit)"
                )
            limit = f"giving up after {timeout:g} s (node-wait-timeout)" if timeout else "no time limit"
            log.warning("waiting for nodes: %s (%.0f s waited, %s)", state, waited, limit)
            last = clock()
        sleep(poll)
    return ids


class PersonalizedStrategy(Strategy):
    """Round loop, client identities and reply validation shared by all methods (see module docstring)."""

    #: human-readable name used in logs and results
    name = "base"
    #: whether the server holds a global model whose accuracy clients report as ``global-acc``
    has_global_model = True
    #: whether a round's evaluation may ride on the next round's train messages (one message per client and
    #: round); methods that train only some clients, or settle after evaluation, keep an evaluate phase
    evaluate_in_train = True
    #: attributes that are not the run's state (rebuilt from the settings, or per-process / per-run values):
    #: left out of checkpoints; methods add their own
    transient = frozenset(
        {
            "settings",
            "options",
            "initial_state",
            "all_keys",
            "body_keys",
            "head_keys",
            "shapes",
            "client_of",
            "node_of",
            "_outbox",
            "results_dir",
            "_t0",
            "_round_start",
            "name",
            "_fused_round",
            "_first_round",
            "_pushed_at",
            "_pulled_at",
            "_timing_rows",
            "_records",
        }
    )
    #: the longest wait between two pulls for replies (Flower's own send_and_receive waits 3 s between pulls in
    #: deployment, 0.1 s in simulation, and a round pays on average half of it once per phase)
    reply_poll_seconds = 0.1
    #: the wait between two pulls grows with the time already waited (this share of it, at least
    #: ``reply_poll_min_seconds``, at most ``reply_poll_seconds``): a phase's last reply is seen within about
    #: 5 % of the phase's length after it arrives, and a long phase (a deployed round) pulls no more often
    #: than every ``reply_poll_seconds``
    reply_poll_share = 0.05
    reply_poll_min_seconds = 0.002

    def __init__(self, settings: Settings, initial_state: Mapping[str, np.ndarray], body: list[str], head: list[str]):
        self.settings = settings
        self.options = settings.options  # the method's own typed options (task.methods)
        self.name = settings.method
        self.initial_state = {k: np.array(v) for k, v in initial_state.items()}
        self.all_keys = list(initial_state)
        self.body_keys, self.head_keys = list(body), list(head)
        self.shapes = {k: tuple(np.shape(v)) for k, v in initial_state.items()}
        self._global_state: dict[str, np.ndarray] | None = None
        self.client_of: dict[int, int] = {}  # node id -> client id (its partition id)
        self.node_of: dict[int, int] = {}  # client id -> the node currently speaking for it
        self.rng = random.Random(settings.seed)
        self.history: list[RoundLog] = []
        self.failures: list[dict[str, Any]] = []
        self.client_eval: dict[int, dict[str, float]] = {}  # client id -> last evaluate metrics
        self.comm: dict[int, dict[str, int]] = {}
        # metadata of the messages sent per (round, phase), to name the node behind an error reply the SuperLink
        # made for it (its src_node_id is the SuperLink's) and to record nodes that never replied.  Only the
        # metadata: the grid fills in message_id on it when pushing, and the payloads are not kept alive.
        self._outbox: dict[tuple[int, str], list[Any]] = {}
        self.results_dir: Path | None = None
        self._t0 = time.monotonic()
        self._round_start = self._t0
        self._pending_evaluation = 0  # a round whose evaluation rides on the next round's train messages
        self._fused_round = 0  # the round evaluated by this round's train replies (0: none)
        self._identify_all = False  # after a resume: ask every node who it is before the first round
        self._first_round = 1  # the first round this process runs (> 1 after a resume)
        self._pushed_at: dict[str, float] = {}  # message id -> when it was pushed (unix s)
        self._pulled_at: dict[str, float] = {}  # id of the message a reply answers -> when it was pulled
        self._timing_rows: dict[str, list[dict[str, float]]] = {}  # phase -> this round's message breakdowns
        self._records: dict[int, tuple[Any, ArrayRecord]] | None = None  # see record_of

    # ------------------------------------------------------------------ hooks for methods
    def shared_keys(self) -> list[str]:
        """State keys the server aggregates and sends (default: the whole model)."""
        return list(self.all_keys)

    def reply_spec(self, phase: str, node_id: int) -> ReplySpec:
        """What a reply of ``phase`` from ``node_id`` must carry.  Default: train replies carry the shared keys
        in ``arrays``; evaluate replies the personalized accuracy; queries only the client's identity."""
        if phase == "train":
            keys = list(self.expected_reply_shapes(node_id))
            spec = TRAIN.with_records(arrays=Arrays.like(self.initial_state, keys)) if keys else TRAIN
            if self._fused_round:  # the node was asked for the evaluation of its previous round's model
                spec = spec.with_evaluation(
                    {k: v for k, v in self.reply_spec("evaluate", node_id).metrics.items() if k not in BASE.metrics}
                )
            return spec
        if phase == "evaluate":
            return EVALUATE
        return BASE

    def expected_reply_shapes(self, node_id: int) -> dict[str, tuple[int, ...]]:
        """The arrays a train reply returns (default: the shared keys)."""
        return {k: self.shapes[k] for k in self.shared_keys()}

    def round_config(self, server_round: int, phase: str) -> ConfigRecord:
        """The config of every message: the round and phase; where clients keep state and models (a node's own
        node config wins); whether to evaluate (train) and to save the personalized model."""
        cfg = ConfigRecord({"server-round": server_round, "phase": phase})
        if self.results_dir is not None:
            cfg["run-key"] = self.results_dir.name
            cfg["state-dir"] = str(self.results_dir / "client-state")
            cfg["model-dir"] = str(self.results_dir / "models" / "clients")
        evaluated = self._fused_round if phase == "train" else (server_round if phase == "evaluate" else 0)
        if phase == "train" and self._fused_round:
            cfg["evaluate"] = True
            cfg["evaluate-round"] = self._fused_round
        if evaluated and self.save_round(evaluated):
            cfg["save-model"] = True
            cfg["save-best"] = self.settings.save_best
        return cfg

    def server_models(self) -> dict[str, dict[str, np.ndarray]]:
        """The models the server holds, by name (default: the global model, where the method has one)."""
        return {"global": self.global_state} if self.has_global_model and self.global_state else {}

    def record_of(self, state: Mapping[str, Any]) -> ArrayRecord:
        """``state`` as an ArrayRecord for a message.  While one phase's messages are built, each distinct state
        object is converted once and its record shared by every message that carries it (the global model goes
        to every node: converting it per node was most of the server's time per round at 100 clients)."""
        if self._records is None:
            return to_record(state)
        hit = self._records.get(id(state))
        if hit is None or hit[0] is not state:
            hit = self._records[id(state)] = (state, to_record(state))
        return hit[1]

    def train_payload(self, node_id: int, server_round: int) -> RecordDict:
        return RecordDict({"arrays": self.record_of(self.global_state)})

    def evaluate_payload(self, node_id: int, server_round: int) -> RecordDict:
        return self.train_payload(node_id, server_round)

    def prepare_round(self, grid: Grid, server_round: int, nodes: list[int]) -> None:
        """Extra phases before the round's cohort is drawn (bids, clustering, the client index); default none."""

    def wants_client_ids(self, server_round: int, nodes: list[int]) -> bool:
        """Whether the cohort depends on which client each node is (then unknown nodes are identified first).
        Default: when only part of the nodes is drawn."""
        return self.cohort_size(len(nodes), self.settings.fraction_train) < len(nodes)

    def sample(self, server_round: int, nodes: list[int]) -> list[int]:
        """The round's cohort: ``fraction-train`` of the nodes, drawn by client id with the run's seed."""
        return self.draw(nodes, self.cohort_size(len(nodes), self.settings.fraction_train))

    def aggregate(self, server_round: int, updates: list[Reply]) -> dict[str, Any]:
        """Default: example-weighted average of the shared keys (FedAvg).  Returns extra history entries."""
        if updates and self.shared_keys():
            self.global_state = weighted_average([u.arrays for u in updates], [u.num_examples for u in updates])
        return {}

    def on_evaluated(self, server_round: int, replies: list[Reply]) -> None:
        """The round's valid evaluate replies, after the common metrics were recorded (default: nothing)."""

    def on_round_end(self, server_round: int) -> None:
        """Called after evaluation of every round (e.g. to settle tokens or record tier tables)."""

    def write_artifacts(self, folder: Path) -> None:
        """Write the method's artefacts (JSON, PNG) into the run's results folder (default: none)."""

    # ------------------------------------------------------------------ state
    @property
    def global_state(self) -> dict[str, np.ndarray]:
        """The shared model (the shared keys of the common initial model until the first aggregation)."""
        if self._global_state is None:
            self._global_state = {k: np.array(self.initial_state[k]) for k in self.shared_keys()}
        return self._global_state

    @global_state.setter
    def global_state(self, value: dict[str, np.ndarray]) -> None:
        self._global_state = value

    def client(self, node_id: int) -> int | None:
        """The client id behind ``node_id`` (None until the node has replied once)."""
        return self.client_of.get(node_id)

    # ------------------------------------------------------------------ sampling
    @staticmethod
    def cohort_size(available: int, fraction: float) -> int:
        return min(available, max(1, int(round(fraction * available))))

    def by_client(self, nodes: Iterable[int]) -> list[int]:
        """``nodes`` ordered by client id (nodes not identified yet last, by node id)."""
        return sorted(nodes, key=lambda n: (n not in self.client_of, self.client_of.get(n, 0), n))

    def draw(self, nodes: list[int], k: int) -> list[int]:
        """``k`` of ``nodes`` drawn with the run's generator in client-id order (all of them when k >= len)."""
        ordered = self.by_client(nodes)
        if k >= len(ordered):
            return ordered
        return self.by_client(self.rng.sample(ordered, k))

    def identify(self, grid: Grid, server_round: int, nodes: list[int]) -> list[Reply]:
        """Ask nodes that never replied which client they are (a tiny ``query.identify``); their valid replies."""
        unknown = [n for n in nodes if n not in self.client_of]
        if not unknown:
            return []
        return self.send_query(grid, server_round, IDENTIFY, {n: RecordDict() for n in unknown})

    def available_nodes(self, grid: Grid) -> list[int]:
        """The connected nodes, once there are ``min-nodes`` of them (:func:`wait_for_nodes`)."""
        return wait_for_nodes(
            grid, self.settings.min_nodes, timeout=self.settings.node_wait_timeout, known=self.node_of
        )

    # ------------------------------------------------------------------ messages
    def _messages(self, server_round: int, nodes: Iterable[int], phase: str, message_type: str) -> list[Message]:
        msgs = []
        self._records = {}  # nothing changes the models while the phase's payloads are built (record_of)
        try:
            for nid in nodes:
                payload = (
                    self.train_payload(nid, server_round)
                    if phase == "train"
                    else self.evaluate_payload(nid, server_round)
                )
                payload["config"] = self.round_config(server_round, phase)
                self._count(server_round, f"{phase}-bytes-down", content_bytes(payload))
                msgs.append(Message(content=payload, message_type=message_type, dst_node_id=nid))
        finally:
            self._records = None
        self._outbox[(server_round, phase)] = [m.metadata for m in msgs]
        return msgs

    def _count(self, server_round: int, key: str, n: int) -> None:
        c = self.comm.setdefault(server_round, {})
        c[key] = c.get(key, 0) + int(n)

    def send_query(
        self, grid: Grid, server_round: int, name: str, payloads: Mapping[int, RecordDict], timeout: float | None = None
    ) -> list[Reply]:
        """Extra phase: send ``query.<name>`` with each node's own payload; return the replies that match
        ``reply_spec(name, node)``, ordered by client id (the others are recorded in failures)."""
        msgs = []
        for nid, payload in payloads.items():
            payload["config"] = self.round_config(server_round, name)
            self._count(server_round, f"{name}-bytes-down", content_bytes(payload))
            msgs.append(Message(content=payload, message_type=f"{MessageType.QUERY}.{name}", dst_node_id=nid))
        self._outbox[(server_round, name)] = [m.metadata for m in msgs]
        wait = timeout or self.settings.round_timeout
        return self.receive(server_round, name, self.exchange(grid, msgs, wait), wait)

    def exchange(self, grid: Grid, messages: Iterable[Message], timeout: float | None) -> list[Message]:
        """Push ``messages`` and pull their replies until all are in or ``timeout`` s have passed (Flower's
        Grid API, as ``Grid.send_and_receive`` does, pulling again after :meth:`poll_wait`); notes when
        each message was pushed and each reply pulled (:mod:`strategies.message_timing`)."""
        messages = list(messages)
        if not messages:
            return []
        pushed = time.time()
        waiting = {mid for mid in grid.push_messages(messages) if mid}
        self._pushed_at.update(dict.fromkeys(waiting, pushed))
        begun = time.monotonic()
        deadline = begun + (timeout if timeout is not None else 3600.0)
        replies: list[Message] = []
        while waiting:
            got = list(grid.pull_messages(waiting))
            now = time.time()
            for msg in got:
                self._pulled_at[msg.metadata.reply_to_message_id] = now
                waiting.discard(msg.metadata.reply_to_message_id)
            replies.extend(got)
            if not waiting or time.monotonic() >= deadline:
                break
            time.sleep(self.poll_wait(time.monotonic() - begun))
        return replies

    def poll_wait(self, waited: float) -> float:
        """Seconds to wait before the next pull, after ``waited`` seconds of a phase: short while the phase is
        young (a simulated round lasts a fraction of a second), growing to :attr:`reply_poll_seconds`."""
        return min(self.reply_poll_seconds, max(self.reply_poll_min_seconds, self.reply_poll_share * waited))

    # ------------------------------------------------------------------ validation
    def receive(self, server_round: int, phase: str, replies: list[Any], timeout: float | None) -> list[Reply]:
        """The valid replies of one phase, ordered by client id; every other reply (error, duplicate, a field
        that does not match the spec, a client id that clashes) and every silent node is recorded.

        Raises :class:`RunAborted` when there were replies, none was valid and all failed for the same reason
        (e.g. every client lacks the data set): the remaining rounds would fail the same way.
        """
        seen: set[int] = set()
        before = len(self.failures)
        valid = [r for msg in replies if (r := self.validate_reply(server_round, msg, phase, seen)) is not None]
        rejected = [f["reason"] for f in self.failures[before:]]
        self.record_silent(server_round, phase, replies, timeout)
        self._note_timing(phase)
        if replies and not valid and len({_gist(r) for r in rejected}) == 1:
            raise RunAborted(
                f"round {server_round}: every {phase} reply failed for the same reason, so the run stops "
                f"here: {short_reason(rejected[0])}"
            )
        return sorted(valid, key=lambda r: r.client)

    def validate_reply(self, server_round: int, msg: Any, phase: str, seen: set[int]) -> Reply | None:
        nid = self.reply_node(server_round, phase, msg)
        if msg.has_error():
            self.record_failure(server_round, nid, phase, f"error reply: {msg.error.reason}")
            return None
        reply = self.check_reply(server_round, nid, msg.content, phase, seen)
        stamps = reply.metrics.pop("timing", None) if reply is not None else None
        if stamps:
            answered = msg.metadata.reply_to_message_id
            row = breakdown(self._pushed_at.pop(answered, None), stamps, self._pulled_at.pop(answered, None))
            self._timing_rows.setdefault(phase, []).append(row)
        return reply

    def _note_timing(self, phase: str) -> None:
        """The phase's median message breakdown into the round's log (``message-timing`` in rounds.json)."""
        rows = self._timing_rows.pop(phase, [])
        if rows and self.history:
            self.history[-1].extra.setdefault("message-timing", {})[phase] = summarize(rows)

    def check_reply(self, server_round: int, nid: int, content: RecordDict, phase: str, seen: set[int]) -> Reply | None:
        """``content`` as a :class:`Reply`, or None (logged, recorded) when any declared field is unusable.

        Nothing of the strategy's state changes for a rejected reply.
        """
        if nid in seen:
            self.record_failure(server_round, nid, phase, "duplicate reply from the same node")
            return None
        try:
            metrics, records = parse_reply(content, self.reply_spec(phase, nid))
        except InvalidReply as err:
            self.record_failure(server_round, nid, phase, str(err))
            return None
        client = int(metrics["partition-id"])
        known = self.client_of.get(nid)
        if known is not None and known != client:
            self.record_failure(
                server_round,
                nid,
                phase,
                f"reports partition-id {client}, but reported {known} before (a node cannot change it)",
            )
            return None
        owner = self.node_of.get(client)
        if owner is not None and owner != nid:
            self.record_failure(
                server_round,
                nid,
                phase,
                f"partition-id {client} is already used by node {owner} (each node needs its own)",
            )
            return None
        seen.add(nid)
        self.client_of[nid], self.node_of[client] = client, nid
        self._count(server_round, f"{phase}-bytes-up", content_bytes(content))
        return Reply(nid, client, int(metrics["num-examples"]), metrics, records)

    # ------------------------------------------------------------------ failure handling
    def record_failure(self, server_round: int, node_id: int, phase: str, reason: str) -> None:
        log.warning("round %d %s: reply from node %d rejected: %s", server_round, phase, node_id, reason)
        entry: dict[str, Any] = {"round": server_round, "node-id": node_id, "phase": phase, "reason": reason}
        if node_id in self.client_of:
            entry["client"] = self.client_of[node_id]
        self.failures.append(entry)

    def reply_node(self, server_round: int, phase: str, msg: Any) -> int:
        """The node a reply is about.

        A node's own replies carry its id as ``src_node_id``; an error reply the SuperLink makes for a node it
        lost ("Node Unavailable") carries the SuperLink's id instead, so it is matched to the message it
        answers (``reply_to_message_id``) and that message's destination.
        """
        md = msg.metadata
        if md.src_node_id != SUPERLINK_NODE_ID:
            return int(md.src_node_id)
        for sent in self._outbox.get((server_round, phase), []):
            if md.reply_to_message_id and sent.message_id == md.reply_to_message_id:
                return int(sent.dst_node_id)
        return int(md.src_node_id)

    def record_silent(self, server_round: int, phase: str, replies: Iterable[Any], timeout: float | None) -> None:
        """Record every node that was sent a ``phase`` message and did not answer at all (not even an error)."""
        answered = {self.reply_node(server_round, phase, r) for r in replies}
        for sent in self._outbox.pop((server_round, phase), []):
            self._pushed_at.pop(sent.message_id, None)  # the phase is over: forget its push/pull times
            self._pulled_at.pop(sent.message_id, None)
            nid = int(sent.dst_node_id)
            if nid not in answered:
                limit = f"{timeout:g} s" if timeout else "the round's time limit"
                self.record_failure(server_round, nid, phase, f"no reply within {limit} (round-timeout)")

    # ------------------------------------------------------------------ Flower Strategy API
    def summary(self) -> None:
        s = self.settings
        log.info(
            "%s on %s (%s), model %s, %d rounds, fraction-train %.2f, seed %d",
            self.name,
            s.data.dataset,
            s.data.partition,
            s.model,
            s.num_rounds,
            s.fraction_train,
            s.seed,
        )

    def _server_time(self, seconds: float) -> None:
        if self.history:
            extra = self.history[-1].extra
            extra["server-seconds"] = extra.get("server-seconds", 0.0) + seconds

    def save_round(self, server_round: int) -> bool:
        """Whether models are saved after ``server_round`` (the last round; every ``save-every``; every evaluated
        round with ``save-best``, where each client keeps only its best)."""
        s = self.settings
        return s.save_models and (
            server_round == s.num_rounds
            or bool(s.save_every and server_round % s.save_every == 0)
            or (s.save_best and self.evaluation_round(server_round))
        )

    def fused_evaluation(self, server_round: int) -> bool:
        """Whether round ``server_round``'s evaluation rides on the next round's train messages: every client
        evaluates the model it starts round r + 1 from (round r's result, before local training) in the
        same message as its local update.  Only where every evaluated client trains in the next round."""
        s = self.settings
        return (
            self.evaluate_in_train
            and server_round < s.num_rounds
            and self.evaluation_round(server_round)
            and s.fraction_train >= 1.0
            and s.fraction_evaluate >= 1.0
        )

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn=None,
        first_round: int = 1,
    ):
        """Flower's round loop (``Strategy.start``: configure, send and receive, aggregate; train then
        evaluate), from ``first_round`` on, so that a resumed run continues where its checkpoint ends."""
        log.info("[%s] rounds %d..%d", self.name, first_round, num_rounds)
        self._first_round = first_round
        train_config = ConfigRecord() if train_config is None else train_config
        evaluate_config = ConfigRecord() if evaluate_config is None else evaluate_config
        arrays = initial_arrays
        for server_round in range(first_round, num_rounds + 1):
            log.info("[ROUND %s/%s]", server_round, num_rounds)
            replies = self.exchange(grid, self.configure_train(server_round, arrays, train_config, grid), timeout)
            agg, _ = self.aggregate_train(server_round, replies)
            arrays = agg if agg is not None else arrays
            replies = self.exchange(grid, self.configure_evaluate(server_round, arrays, evaluate_config, grid), timeout)
            self.aggregate_evaluate(server_round, replies)

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self._round_start = time.monotonic()
        nodes = self.available_nodes(grid)  # before the round is logged: a run that gives up here has no round r
        self.history.append(RoundLog(server_round))
        if self._identify_all or self.wants_client_ids(server_round, nodes):
            self.identify(grid, server_round, nodes)
            self._identify_all = False
        self.prepare_round(grid, server_round, nodes)
        cohort = self.sample(server_round, nodes)
        self._fused_round, self._pending_evaluation = self._pending_evaluation, 0
        start = time.perf_counter()
        msgs = self._messages(server_round, cohort, "train", MessageType.TRAIN)
        self._server_time(time.perf_counter() - start)
        return msgs

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        start = time.perf_counter()
        updates = self.receive(server_round, "train", list(replies), self.settings.round_timeout)
        if self._fused_round:  # the previous round's evaluation came with these replies
            evaluated = [Reply(u.node_id, u.client, u.num_examples, u.metrics.pop("evaluation")) for u in updates]
            self.record_evaluation(self._fused_round, evaluated)
            self._fused_round = 0
        extra = self.aggregate(server_round, updates) if updates else {}
        if not updates:
            log.warning("round %d: no valid train replies; state left unchanged", server_round)
        metrics = self._mean_metrics(updates, ("train-loss", "train-acc", "trained-acc", "time-train", "time-method"))
        for key in ("time-train", "time-method", "peak-rss-mb"):
            vals = [float(u.metrics[key]) for u in updates if key in u.metrics]
            if vals:
                metrics[f"{key}-max"] = max(vals)
        metrics["num-replies"] = len(updates)
        self.history[-1].train = metrics
        self.history[-1].extra.update(extra)
        result = (
            (to_record(self.global_state) if self.global_state else ArrayRecord()),
            MetricRecord({k: v for k, v in metrics.items() if isinstance(v, (int, float))}),
        )
        self._server_time(time.perf_counter() - start)
        return result

    def evaluation_round(self, server_round: int) -> bool:
        """Evaluate every ``eval-every`` rounds and always in the last one."""
        return server_round % self.settings.eval_every == 0 or server_round == self.settings.num_rounds

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        if not self.evaluation_round(server_round):
            return []
        if self.fused_evaluation(server_round):
            self._pending_evaluation = server_round
            return []
        nodes = self.available_nodes(grid)
        k = self.cohort_size(len(nodes), self.settings.fraction_evaluate)
        if k < len(nodes):
            self.identify(grid, server_round, nodes)
        nodes = self.draw(nodes, k)
        start = time.perf_counter()
        msgs = self._messages(server_round, nodes, "evaluate", MessageType.EVALUATE)
        self._server_time(time.perf_counter() - start)
        return msgs

    def record_evaluation(self, server_round: int, updates: list[Reply]) -> None:
        """Round ``server_round``'s evaluation replies: each client's last metrics, the round's means, the
        method's :meth:`on_evaluated`."""
        for u in updates:
            self.client_eval[u.client] = {k: float(v) for k, v in u.metrics.items() if isinstance(v, (int, float))}
        keys = ("personal-acc", "personal-loss", "global-acc", "global-loss")
        metrics = self._mean_metrics(updates, keys)
        metrics.update({f"{k}-weighted": v for k, v in self._mean_metrics(updates, keys, weighted=True).items()})
        metrics["num-replies"] = len(updates)
        entry = next(r for r in self.history if r.server_round == server_round)
        entry.evaluate = metrics
        self.on_evaluated(server_round, updates)
        if server_round != self.history[-1].server_round:
            accs = ", ".join(f"{k} {metrics[k]:.4f}" for k in ("personal-acc", "global-acc") if k in metrics)
            log.info(
                "[%s] round %d evaluated (with round %d's train replies): %s",
                self.name,
                server_round,
                server_round + 1,
                accs or "no evaluation replies",
            )

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        replies = list(replies)
        metrics: dict[str, float] = {}
        if self.evaluation_round(server_round) and not self.fused_evaluation(server_round):
            updates = self.receive(server_round, "evaluate", replies, self.settings.round_timeout)
            self.record_evaluation(server_round, updates)
            metrics = self.history[-1].evaluate
        self.on_round_end(server_round)
        self.history[-1].extra["comm"] = dict(self.comm.get(server_round, {}))
        self.history[-1].extra["seconds"] = time.monotonic() - self._round_start
        self.history[-1].extra["server-peak-rss-mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
        if self.save_round(server_round) and self.results_dir is not None:
            self.save_server_models(server_round)
        self._progress(server_round, metrics)
        if self.settings.checkpoint_every and (
            server_round % self.settings.checkpoint_every == 0 or server_round == self.settings.num_rounds
        ):
            self.checkpoint(server_round)
        if self.settings.stop_after == server_round and server_round < self.settings.num_rounds:
            raise SimulatedCrash(
                f"stop-after={server_round}: the ServerApp stops here as if it crashed (testing resume); "
                f"resume with resume-from='{self.results_dir}'"
            )
        return MetricRecord({k: v for k, v in metrics.items() if isinstance(v, (int, float))})

    # ------------------------------------------------------------------ models out, checkpoints, resume
    def save_server_models(self, server_round: int) -> None:
        """The server's models (global, cluster, tier) under ``<results>/models/server/`` (safetensors + manifest)."""
        for name, state in self.server_models().items():
            save_model(
                self.results_dir / "models" / "server" / name,
                state,
                model_manifest(self.settings, round=server_round, **{"server-model": name}),
            )

    def state_for_checkpoint(self) -> dict[str, Any]:
        """Everything of this strategy a resumed run needs (all attributes but the transient ones)."""
        return {k: v for k, v in vars(self).items() if k not in self.transient}

    def checkpoint(self, server_round: int) -> None:
        if self.results_dir is None:
            return
        start = time.perf_counter()
        tree, arrays = to_tree(self.state_for_checkpoint(), skip=self.transient | {"_holdouts"})
        save_checkpoint(self.results_dir / "checkpoints", server_round, tree, arrays, checkpoint_meta(self.settings))
        self.history[-1].extra["checkpoint-seconds"] = time.perf_counter() - start

    def resume(self, state: Mapping[str, Any]) -> None:
        """Continue from a checkpoint's state: node ids change between runs (simulation), so every node is
        asked who it is before the first round."""
        restore_into(self, {k: v for k, v in state.items() if k not in self.transient})
        self._identify_all = True
        self._t0 = time.monotonic()

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _mean_metrics(updates: list[Reply], keys: Iterable[str], weighted: bool = False) -> dict[str, float]:
        out = {}
        for k in keys:
            vals = [(float(u.metrics[k]), u.num_examples) for u in updates if k in u.metrics]
            if vals:
                v, w = np.array(vals).T
                out[k] = float(np.average(v, weights=w)) if weighted and w.sum() > 0 else float(v.mean())
        return out

    def _progress(self, server_round: int, metrics: dict[str, float]) -> None:
        done = server_round - self._first_round + 1
        per_round = (time.monotonic() - self._t0) / max(done, 1)
        eta = per_round * (self.settings.num_rounds - server_round)
        accs = ", ".join(f"{k} {metrics[k]:.4f}" for k in ("personal-acc", "global-acc") if k in metrics)
        if not accs:
            if self.fused_evaluation(server_round):
                accs = "evaluated with the next round's train messages"
            else:
                accs = "no evaluation replies" if self.evaluation_round(server_round) else "not evaluated this round"
        log.info(
            "[%s] round %d/%d done: %s | %.1f s/round, ETA %.0f s",
            self.name,
            server_round,
            self.settings.num_rounds,
            accs,
            per_round,
            eta,
        )

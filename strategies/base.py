"""The personalized base every strategy here stands on.

:class:`PersonalizedStrategy` is a ``flwr.serverapp.strategy.Strategy`` (Message API) that owns what all
methods share: seeded node sampling that waits for nodes, one message per node (so each node can get its
own ``ArrayRecord``), a per-client store keyed by node id, validation of every reply (errors, duplicates,
wrong keys or shapes, NaN) that drops a bad reply with a logged reason while the round goes on with the
rest, communication accounting, per-round history and progress lines.  A method overrides a few hooks:

- :meth:`shared_keys` - which state keys the server aggregates and broadcasts;
- :meth:`train_payload` / :meth:`evaluate_payload` - what one node receives;
- :meth:`expected_reply_shapes` - what a train reply must carry;
- :meth:`aggregate` - what happens with the round's valid updates.
"""

from __future__ import annotations

import logging
import random
import resource
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy

from task.config import Settings
from task.params import check_arrays, record_to_numpy, to_record, weighted_average

log = logging.getLogger("flwr.pflower")


@dataclass
class ClientUpdate:
    """One validated train reply."""

    node_id: int
    partition_id: int
    num_examples: int
    arrays: dict[str, np.ndarray]
    metrics: dict[str, Any]
    content: RecordDict


@dataclass
class RoundLog:
    server_round: int
    train: dict[str, float] = field(default_factory=dict)
    evaluate: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


def content_bytes(content: RecordDict) -> int:
    """Payload size of a message's records (arrays, metrics and configs), as Flower counts them."""
    return sum(rec.count_bytes() for rec in content.values())


def wait_for_nodes(grid: Grid, minimum: int, poll: float = 0.5, report_every: float = 10.0) -> list[int]:
    """Node ids once at least ``minimum`` nodes are connected (``get_node_ids`` can be empty at first)."""
    start = last = time.monotonic()
    while len(ids := sorted(grid.get_node_ids())) < minimum:
        if time.monotonic() - last > report_every:
            log.info("waiting for nodes: %d connected, %d required (%.0f s)", len(ids), minimum, time.monotonic() - start)
            last = time.monotonic()
        time.sleep(poll)
    return ids


class PersonalizedStrategy(Strategy):
    """Round loop and per-client store shared by all methods (see module docstring)."""

    #: human-readable name used in logs and results
    name = "base"
    #: whether the server holds a global model whose accuracy clients report as ``global-acc``
    has_global_model = True

    def __init__(self, settings: Settings, initial_state: Mapping[str, np.ndarray], body: list[str], head: list[str]):
        self.settings = settings
        self.all_keys = list(initial_state)
        self.body_keys, self.head_keys = list(body), list(head)
        self.shapes = {k: tuple(np.shape(v)) for k, v in initial_state.items()}
        self.global_state: dict[str, np.ndarray] = {k: np.array(initial_state[k]) for k in self.shared_keys()}
        self.client_store: dict[int, dict[str, Any]] = {}
        self.node_partition: dict[int, int] = {}
        self.rng = random.Random(settings.seed)
        self.history: list[RoundLog] = []
        self.failures: list[dict[str, Any]] = []
        self.client_eval: dict[int, dict[str, float]] = {}  # partition id -> last evaluate metrics
        self.comm: dict[int, dict[str, int]] = {}
        # metadata of the messages sent per (round, phase), to name the node behind an error reply the SuperLink
        # made for it (its src_node_id is the SuperLink's) and to record nodes that never replied.  Only the
        # metadata: the grid fills in message_id on it when pushing, and the payloads are not kept alive.
        self._outbox: dict[tuple[int, str], list[Any]] = {}
        self._t0 = time.monotonic()
        self._round_start = self._t0

    # ------------------------------------------------------------------ hooks for methods
    def shared_keys(self) -> list[str]:
        """State keys the server aggregates and sends (default: the whole model)."""
        return list(self.all_keys)

    def round_config(self, server_round: int, phase: str) -> ConfigRecord:
        return ConfigRecord({"server-round": server_round, "phase": phase})

    def train_payload(self, node_id: int, server_round: int) -> RecordDict:
        return RecordDict({"arrays": to_record(self.global_state)})

    def evaluate_payload(self, node_id: int, server_round: int) -> RecordDict:
        return self.train_payload(node_id, server_round)

    def expected_reply_shapes(self, node_id: int) -> dict[str, tuple[int, ...]]:
        return {k: self.shapes[k] for k in self.shared_keys()}

    def aggregate(self, server_round: int, updates: list[ClientUpdate]) -> dict[str, Any]:
        """Default: example-weighted average of the shared keys (FedAvg)."""
        if updates and self.shared_keys():
            self.global_state = weighted_average([u.arrays for u in updates], [u.num_examples for u in updates])
        return {}

    def on_round_end(self, server_round: int) -> None:
        """Called after evaluation of every round (e.g. to write method artefacts)."""

    # ------------------------------------------------------------------ sampling and messages
    def sample(self, grid: Grid, server_round: int) -> list[int]:
        nodes = wait_for_nodes(grid, self.settings.min_nodes)
        k = max(min(len(nodes), self.settings.min_nodes), int(round(self.settings.fraction_train * len(nodes))))
        return sorted(self.rng.sample(nodes, k)) if k < len(nodes) else nodes

    def _messages(self, server_round: int, nodes: Iterable[int], phase: str, message_type: str) -> list[Message]:
        msgs = []
        for nid in nodes:
            payload = self.train_payload(nid, server_round) if phase == "train" else self.evaluate_payload(nid, server_round)
            payload["config"] = self.round_config(server_round, phase)
            self._count(server_round, f"{phase}-bytes-down", content_bytes(payload))
            msgs.append(Message(content=payload, message_type=message_type, dst_node_id=nid))
        self._outbox[(server_round, phase)] = [m.metadata for m in msgs]
        return msgs

    def _count(self, server_round: int, key: str, n: int) -> None:
        c = self.comm.setdefault(server_round, {})
        c[key] = c.get(key, 0) + int(n)

    def send_query(self, grid: Grid, server_round: int, name: str, payloads: Mapping[int, RecordDict],
                   timeout: float | None = None) -> list[Message]:
        """Extra phase: send ``query.<name>`` with each node's own payload and return the valid replies."""
        msgs = []
        for nid, payload in payloads.items():
            payload["config"] = self.round_config(server_round, name)
            self._count(server_round, f"{name}-bytes-down", content_bytes(payload))
            msgs.append(Message(content=payload, message_type=f"{MessageType.QUERY}.{name}", dst_node_id=nid))
        self._outbox[(server_round, name)] = [m.metadata for m in msgs]
        wait = timeout or self.settings.round_timeout
        replies = list(grid.send_and_receive(msgs, timeout=wait))
        ok = []
        for r in replies:
            if r.has_error():
                self.record_failure(server_round, self.reply_node(server_round, name, r), name,
                                    f"error reply: {r.error.reason}")
                continue
            self._count(server_round, f"{name}-bytes-up", content_bytes(r.content))
            ok.append(r)
        self.record_silent(server_round, name, replies, wait)
        return ok

    # ------------------------------------------------------------------ failure handling
    def record_failure(self, server_round: int, node_id: int, phase: str, reason: str) -> None:
        log.warning("round %d %s: reply from node %d rejected: %s", server_round, phase, node_id, reason)
        self.failures.append({"round": server_round, "node-id": node_id, "phase": phase, "reason": reason})

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
            nid = int(sent.dst_node_id)
            if nid not in answered:
                limit = f"{timeout:g} s" if timeout else "the round's time limit"
                self.record_failure(server_round, nid, phase, f"no reply within {limit} (round-timeout)")

    def validate_reply(self, server_round: int, msg: Message, phase: str, seen: set[int]) -> ClientUpdate | None:
        nid = self.reply_node(server_round, phase, msg)
        if msg.has_error():
            self.record_failure(server_round, nid, phase, f"error reply: {msg.error.reason}")
            return None
        return self.validate_content(server_round, nid, msg.content, phase, seen)

    def validate_content(self, server_round: int, nid: int, content: RecordDict, phase: str,
                         seen: set[int]) -> ClientUpdate | None:
        """A reply's content as a :class:`ClientUpdate`, or None (logged, recorded) when it is unusable."""
        if nid in seen:
            self.record_failure(server_round, nid, phase, "duplicate reply from the same node")
            return None
        if "metrics" not in content.metric_records:
            self.record_failure(server_round, nid, phase, "reply has no 'metrics' MetricRecord")
            return None
        metrics = dict(content.metric_records["metrics"])
        n = metrics.get("num-examples")
        if not isinstance(n, (int, float)) or isinstance(n, bool) or not np.isfinite(n) or n <= 0:
            self.record_failure(server_round, nid, phase, f"invalid num-examples {n!r}")
            return None
        arrays: dict[str, np.ndarray] = {}
        if phase == "train":
            expected = self.expected_reply_shapes(nid)
            if expected:
                if "arrays" not in content.array_records:
                    self.record_failure(server_round, nid, phase, "reply has no 'arrays' ArrayRecord")
                    return None
                arrays = record_to_numpy(content.array_records["arrays"])
                problem = check_arrays(arrays, expected)
                if problem:
                    self.record_failure(server_round, nid, phase, problem)
                    return None
        for k, v in metrics.items():
            if isinstance(v, float) and not np.isfinite(v):
                self.record_failure(server_round, nid, phase, f"non-finite metric {k!r}")
                return None
        seen.add(nid)
        pid = int(metrics.get("partition-id", -1))
        if pid >= 0:
            self.node_partition[nid] = pid
        self._count(server_round, f"{phase}-bytes-up", content_bytes(content))
        return ClientUpdate(nid, pid, int(n), arrays, metrics, content)

    # ------------------------------------------------------------------ Flower Strategy API
    def summary(self) -> None:
        s = self.settings
        log.info("%s on %s (%s), model %s, %d rounds, fraction-train %.2f, seed %d", self.name, s.data.dataset,
                 s.data.partition, s.model, s.num_rounds, s.fraction_train, s.seed)

    def _server_time(self, seconds: float) -> None:
        if self.history:
            extra = self.history[-1].extra
            extra["server-seconds"] = extra.get("server-seconds", 0.0) + seconds

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        self._round_start = time.monotonic()
        self.history.append(RoundLog(server_round))
        nodes = self.sample(grid, server_round)
        start = time.perf_counter()
        msgs = self._messages(server_round, nodes, "train", MessageType.TRAIN)
        self._server_time(time.perf_counter() - start)
        return msgs

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        start = time.perf_counter()
        seen: set[int] = set()
        replies = list(replies)
        updates = [u for r in replies if (u := self.validate_reply(server_round, r, "train", seen)) is not None]
        self.record_silent(server_round, "train", replies, self.settings.round_timeout)
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
        result = (to_record(self.global_state) if self.global_state else ArrayRecord()), MetricRecord(
            {k: v for k, v in metrics.items() if isinstance(v, (int, float))}
        )
        self._server_time(time.perf_counter() - start)
        return result

    def evaluation_round(self, server_round: int) -> bool:
        """Evaluate every ``eval-every`` rounds and always in the last one."""
        return server_round % self.settings.eval_every == 0 or server_round == self.settings.num_rounds

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        if not self.evaluation_round(server_round):
            return []
        nodes = wait_for_nodes(grid, self.settings.min_nodes)
        k = max(1, int(round(self.settings.fraction_evaluate * len(nodes))))
        if k < len(nodes):
            nodes = sorted(self.rng.sample(nodes, k))
        start = time.perf_counter()
        msgs = self._messages(server_round, nodes, "evaluate", MessageType.EVALUATE)
        self._server_time(time.perf_counter() - start)
        return msgs

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        seen: set[int] = set()
        replies = list(replies)
        updates = [u for r in replies if (u := self.validate_reply(server_round, r, "evaluate", seen)) is not None]
        self.record_silent(server_round, "evaluate", replies, self.settings.round_timeout)
        for u in updates:
            self.client_eval[u.partition_id if u.partition_id >= 0 else u.node_id] = {
                k: float(v) for k, v in u.metrics.items() if isinstance(v, (int, float))
            }
        keys = ("personal-acc", "personal-loss", "global-acc", "global-loss")
        metrics = self._mean_metrics(updates, keys)
        metrics.update({f"{k}-weighted": v for k, v in self._mean_metrics(updates, keys, weighted=True).items()})
        metrics["num-replies"] = len(updates)
        self.history[-1].evaluate = metrics
        self.on_round_end(server_round)
        self.history[-1].extra["comm"] = dict(self.comm.get(server_round, {}))
        self.history[-1].extra["seconds"] = time.monotonic() - self._round_start
        self.history[-1].extra["server-peak-rss-mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
        self._progress(server_round, metrics)
        return MetricRecord({k: v for k, v in metrics.items() if isinstance(v, (int, float))})

    # ------------------------------------------------------------------ helpers
    @staticmethod
    def _mean_metrics(updates: list[ClientUpdate], keys: Iterable[str], weighted: bool = False) -> dict[str, float]:
        out = {}
        for k in keys:
            vals = [(float(u.metrics[k]), u.num_examples) for u in updates if k in u.metrics]
            if vals:
                v, w = np.array(vals).T
                out[k] = float(np.average(v, weights=w)) if weighted and w.sum() > 0 else float(v.mean())
        return out

    def _progress(self, server_round: int, metrics: dict[str, float]) -> None:
        elapsed = time.monotonic() - self._t0
        per_round = elapsed / server_round
        eta = per_round * (self.settings.num_rounds - server_round)
        accs = ", ".join(f"{k} {metrics[k]:.4f}" for k in ("personal-acc", "global-acc") if k in metrics)
        if not accs:
            accs = "no evaluation replies" if self.evaluation_round(server_round) else "not evaluated this round"
        log.info("[%s] round %d/%d done: %s | %.1f s/round, ETA %.0f s", self.name, server_round,
                 self.settings.num_rounds, accs, per_round, eta)

"""The reply gate: every reply of every phase passes here before a strategy may read it.

The gate validates and rejects, nothing else.  The message exchange (:mod:`strategies.exchange`) hands it a phase's
replies already attributed to their nodes, with the nodes that never answered; the gate admits a reply when it is
not an error, not a second reply of the same node, matches its phase's :class:`~strategies.replies.ReplySpec`
(:func:`parse_reply`) and claims a client id that fits the node.  Clients are known by their **client id**, the
``partition-id`` their node reports (stable across runs and restarts), not by Flower's node id (random per simulated
run).  The first valid reply of a node binds its client id for the rest of the run (a deployed SuperNode keeps its
node id across restarts: it is tied to its registered key); a reply that claims another client id, or a client id
another node holds, is rejected.  A partition id is self-declared: a node that connects first can claim a partition
id meant for another, which the real owner's rejected replies then show in failures.json (see deploy/README.md's
threat model).

Every rejected reply and every node that never answered is recorded in :attr:`ReplyGate.failures` with its
reason (``failures.json``); the round goes on without it, and nothing of the strategy's state changes.
When a phase had replies, none was valid and all failed for the same reason (every client lacks the data
set, say), :class:`RunAborted` stops the run: the remaining rounds would fail the same way.

Since the gate knows which client each node is, it also orders and draws nodes by client id
(:meth:`ReplyGate.by_client`, :meth:`ReplyGate.draw`): a seed then draws the same clients in every run, whatever
node ids Flower gave them.  :func:`shared_model` checks the arrays Flower hands the strategy the same way.
"""

from __future__ import annotations

import logging
import math
import random
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, RecordDict

from strategies.exchange import Arrival, Arrivals, RunAborted
from strategies.replies import TIMING, Arrays, Dim, InvalidReply, Number, Numbers, Reply, ReplySpec, Tensor

log = logging.getLogger("flwr.pflower")


def _number_problem(value: Any, kind: type, minimum: float, maximum: float) -> str | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return f"must be {'an integer' if kind is int else 'a number'}, got {type(value).__name__}"
    if kind is int and not isinstance(value, int):
        return f"must be an integer, got {value!r}"
    if not math.isfinite(value):
        return f"must be finite, got {value!r}"
    if value < minimum or value > maximum:
        return f"must be in [{minimum:g}, {maximum:g}], got {value!r}"
    return None


def problem(rule: Number | Numbers, value: Any) -> str | None:
    """What is wrong with a metric's ``value`` under its declared ``rule`` (None: nothing): a :class:`Number` is a
    finite int or float in its bounds; :class:`Numbers` a list of them, of its length, distinct and summing to its
    total where it says so."""
    if isinstance(rule, Number):
        return _number_problem(value, rule.kind, rule.minimum, rule.maximum)
    if not isinstance(value, list):
        return f"must be a list, got {type(value).__name__}"
    if rule.length is not None and len(value) != rule.length:
        return f"must have {rule.length} elements, got {len(value)}"
    if rule.max_length is not None and len(value) > rule.max_length:
        return f"must have at most {rule.max_length} elements, got {len(value)}"
    for i, v in enumerate(value):
        bad = _number_problem(v, rule.kind, rule.minimum, rule.maximum)
        if bad:
            return f"element {i} {bad}"
    if rule.distinct and len(set(value)) != len(value):
        return "must not repeat an element"
    if rule.total is not None and value and abs(math.fsum(value) - rule.total) > 1e-4 * max(1.0, abs(rule.total)):
        return f"must sum to {rule.total:g}, got {math.fsum(value)!r}"
    return None


def array_problem(tensor: Tensor, arr: np.ndarray) -> str | None:
    """What is wrong with an array under its declared :class:`Tensor` (None: nothing): dtype, shape, sign, NaN."""
    if arr.dtype != np.dtype(tensor.dtype):
        return f"has dtype {arr.dtype}, expected {tensor.dtype}"
    if arr.ndim != len(tensor.shape) or any(
        (n not in d) if isinstance(d, Dim) else n != d for n, d in zip(arr.shape, tensor.shape, strict=True)
    ):
        return f"has shape {tuple(arr.shape)}, expected {tensor.shape}"
    if tensor.finite and np.issubdtype(arr.dtype, np.floating) and not np.isfinite(arr).all():
        return "has non-finite values (NaN/inf)"
    if tensor.nonnegative and arr.size and bool((arr < 0).any()):
        return f"has negative values (min {float(arr.min()):g}); a variance cannot be negative"
    return None


def _parse_metrics(content: RecordDict, name: str, rules: Mapping[str, Number | Numbers]) -> dict[str, Any]:
    raw = dict(content.metric_records[name]) if name in content.metric_records else None
    if raw is None:
        if rules:
            raise InvalidReply(f"reply has no {name!r} MetricRecord")
        return {}
    where = "metric" if name == "metrics" else f"{name} metric"
    metrics: dict[str, Any] = {}
    for key, rule in rules.items():
        if key not in raw:
            if rule.required:
                raise InvalidReply(f"{where} {key!r} is missing")
            continue
        bad = problem(rule, raw[key])
        if bad:
            raise InvalidReply(f"{where} {key!r} {bad}")
        value: Any = raw[key]
        metrics[key] = rule.kind(value) if isinstance(rule, Number) else [rule.kind(v) for v in value]
    return metrics


def parse_reply(content: RecordDict, spec: ReplySpec) -> tuple[dict[str, Any], dict[str, dict[str, np.ndarray]]]:
    """(metrics, records) holding exactly what ``spec`` declares, converted; raises :class:`InvalidReply`.

    Metrics live in the ``metrics`` MetricRecord.  Optional entries that are absent are left out.  With
    ``spec.evaluation`` the ``evaluation`` MetricRecord is parsed too, into ``metrics["evaluation"]``; an
    optional ``timing`` record (:data:`TIMING`) into ``metrics["timing"]``.
    """
    metrics = _parse_metrics(content, "metrics", spec.metrics)
    if "timing" in content.metric_records:
        metrics["timing"] = _parse_metrics(content, "timing", TIMING)
    if spec.evaluation is not None:
        if "evaluation" not in content.metric_records:
            raise InvalidReply("reply has no 'evaluation' MetricRecord (the server asked for one)")
        metrics["evaluation"] = _parse_metrics(content, "evaluation", spec.evaluation)
    records: dict[str, dict[str, np.ndarray]] = {}
    for name, rule in spec.records.items():
        if name not in content.array_records:
            if rule.required:
                raise InvalidReply(f"reply has no {name!r} ArrayRecord")
            continue
        rec = content.array_records[name]
        keys = set(rec.keys())
        if keys != set(rule.tensors):
            extra, missing = sorted(keys - set(rule.tensors)), sorted(set(rule.tensors) - keys)
            raise InvalidReply(
                f"record {name!r}: keys differ from the expected ones (unexpected {extra[:3]}, missing {missing[:3]})"
            )
        arrays = {}
        for key, tensor in rule.tensors.items():
            try:
                arr = np.asarray(rec[key].numpy())
            except Exception as err:  # a malformed Array (bad bytes / header) must not escape as a crash
                raise InvalidReply(f"record {name!r}: array {key!r} cannot be read ({type(err).__name__})") from err
            bad = array_problem(tensor, arr)
            if bad:
                raise InvalidReply(f"record {name!r}: array {key!r} {bad}")
            arrays[key] = arr
        records[name] = arrays
    for cross_field in spec.rules:
        bad = cross_field(metrics, records)
        if bad:
            raise InvalidReply(bad)
    return metrics, records


def gist(reason: str) -> str:
    """A failure reason without what differs between nodes (ids, process ids, partition numbers, addresses)."""
    return re.sub(r"[0-9a-fA-F]{8,}|\d+", "#", reason)


def short_reason(reason: str) -> str:
    """One line of a failure reason: the client's own exception message from an error reply's traceback."""
    if "Message: " in reason:
        reason = reason.rsplit("Message: ", 1)[1]
    lines = [line.strip() for line in reason.splitlines() if line.strip()]
    return (lines[0] if lines else reason).rstrip("'>").strip()


def cohort_size(available: int, fraction: float) -> int:
    """How many of ``available`` nodes a ``fraction`` of them is: rounded, at least one, at most all."""
    return min(available, max(1, round(fraction * available)))


def shared_model(arrays: ArrayRecord, model: Mapping[str, np.ndarray], keys: list[str]) -> dict[str, np.ndarray]:
    """Flower's ``arrays`` as the shared model: exactly ``keys`` of ``model``, with its shapes and dtypes, finite
    (:class:`ValueError` otherwise)."""
    spec = ReplySpec(records={"arrays": Arrays.like(model, keys)})
    try:
        _, records = parse_reply(RecordDict({"arrays": arrays}), spec)
    except InvalidReply as err:
        raise ValueError(f"the arrays given to the strategy are not this method's shared model: {err}") from None
    return {k: np.array(v) for k, v in records["arrays"].items()}


class ReplyGate:
    """Admits the valid replies of a phase and binds node ids to client ids (see the module docstring).

    ``spec_of(phase, node_id)`` is the strategy's :meth:`reply_spec`.
    """

    def __init__(self, spec_of: Callable[[str, int], ReplySpec]) -> None:
        self.spec_of = spec_of
        self.client_of: dict[int, int] = {}  # node id -> client id (its partition id)
        self.node_of: dict[int, int] = {}  # client id -> the node currently speaking for it
        self.failures: list[dict[str, Any]] = []

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the gate: the rejected replies and silent nodes so far."""
        return {"failures": self.failures}

    def restore(self, state: Mapping[str, Any]) -> None:
        self.failures[:] = state["failures"]  # the same list: the strategy shares it

    def admit(self, server_round: int, phase: str, arrivals: Arrivals) -> list[tuple[Arrival, Reply]]:
        """The valid replies of one phase with what they arrived as, ordered by client id; every other reply (error,
        duplicate, a field that does not match the spec, a client id that clashes) and every silent node is
        recorded.

        Raises :class:`RunAborted` when there were replies, none was valid and all failed for the same reason.
        """
        seen: set[int] = set()
        before = len(self.failures)
        valid = [(a, r) for a in arrivals.replies if (r := self.screen(server_round, a, phase, seen)) is not None]
        rejected = [f["reason"] for f in self.failures[before:]]
        limit = f"{arrivals.timeout:g} s" if arrivals.timeout else "the round's time limit"
        for node in arrivals.silent:
            self.reject(server_round, node, phase, f"no reply within {limit} (round-timeout)")
        if arrivals.replies and not valid and len({gist(r) for r in rejected}) == 1:
            raise RunAborted(
                f"round {server_round}: every {phase} reply failed for the same reason, so the run stops "
                f"here: {short_reason(rejected[0])}"
            )
        return sorted(valid, key=lambda pair: pair[1].client)

    def screen(self, server_round: int, arrival: Arrival, phase: str, seen: set[int]) -> Reply | None:
        """One reply: an error reply is recorded; its content goes through :meth:`check`."""
        msg = arrival.message
        if msg.has_error():
            self.reject(server_round, arrival.node, phase, f"error reply: {msg.error.reason}")
            return None
        return self.check(server_round, arrival.node, msg.content, phase, seen)

    def check(self, server_round: int, node: int, content: RecordDict, phase: str, seen: set[int]) -> Reply | None:
        """``content`` from ``node`` as a :class:`Reply`, or None (logged, recorded) when any declared field is
        unusable, the node already replied in this phase (``seen``) or its client id clashes."""
        if node in seen:
            self.reject(server_round, node, phase, "duplicate reply from the same node")
            return None
        try:
            metrics, records = parse_reply(content, self.spec_of(phase, node))
        except InvalidReply as err:
            self.reject(server_round, node, phase, str(err))
            return None
        client = int(metrics["partition-id"])
        known = self.client_of.get(node)
        if known is not None and known != client:
            reason = f"reports partition-id {client}, but reported {known} before (a node cannot change it)"
            self.reject(server_round, node, phase, reason)
            return None
        owner = self.node_of.get(client)
        if owner is not None and owner != node:
            reason = f"partition-id {client} is already used by node {owner} (each node needs its own)"
            self.reject(server_round, node, phase, reason)
            return None
        seen.add(node)
        self.client_of[node], self.node_of[client] = client, node
        timing = metrics.pop("timing", {})
        return Reply(node, client, int(metrics["num-examples"]), metrics, records, timing)

    def reject(self, server_round: int, node: int, phase: str, reason: str) -> None:
        """Record a rejected reply (or a silent node) with its reason."""
        log.warning("round %d %s: reply from node %d rejected: %s", server_round, phase, node, reason)
        entry: dict[str, Any] = {"round": server_round, "node-id": node, "phase": phase, "reason": reason}
        if node in self.client_of:
            entry["client"] = self.client_of[node]
        self.failures.append(entry)

    # ------------------------------------------------------------------ nodes by client id
    def unknown(self, nodes: Iterable[int]) -> list[int]:
        """The nodes of ``nodes`` that never sent a valid reply (their client id is not known yet)."""
        return [n for n in nodes if n not in self.client_of]

    def by_client(self, nodes: Iterable[int]) -> list[int]:
        """``nodes`` ordered by client id (nodes not identified yet last, by node id)."""
        return sorted(nodes, key=lambda n: (n not in self.client_of, self.client_of.get(n, 0), n))

    def draw(self, rng: random.Random, nodes: list[int], k: int) -> list[int]:
        """``k`` of ``nodes`` drawn with ``rng`` in client-id order, ordered by client id (all when k >= len)."""
        ordered = self.by_client(nodes)
        return ordered if k >= len(ordered) else self.by_client(rng.sample(ordered, k))

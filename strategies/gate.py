"""The reply gate: every reply of every phase passes here before a strategy may read it.

A reply is admitted when it is not an error, not a second reply of the same node, matches its phase's
:class:`~strategies.replies.ReplySpec` and claims a client id that fits the node.  Clients are known by
their **client id**, the ``partition-id`` their node reports (stable across runs and restarts), not by
Flower's node id (random per simulated run).  The first valid reply of a node binds its client id for the
rest of the run (a deployed SuperNode keeps its node id across restarts: it is tied to its registered key);
a reply that claims another client id, or a client id another node holds, is rejected.  A partition id is
self-declared: a node that connects first can claim a partition id meant for another, which the real
owner's rejected replies then show in failures.json (see deploy/README.md's threat model).

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
import random
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import ArrayRecord, RecordDict

from strategies.exchange import MessageExchange, RunAborted, content_bytes
from strategies.replies import Arrays, InvalidReply, ReplySpec, parse_reply

log = logging.getLogger("flwr.pflower")


@dataclass
class Reply:
    """One admitted reply: only what the phase's :class:`ReplySpec` declares, already checked."""

    node_id: int
    client: int
    num_examples: int
    metrics: dict[str, Any]
    records: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """The ``arrays`` record (the model update of a train reply)."""
        return self.records.get("arrays", {})


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

    ``spec_of(phase, node_id)`` is the strategy's :meth:`reply_spec`; the exchange names the node behind each
    reply, finds the silent ones, times the messages and counts the bytes of admitted replies.
    """

    def __init__(self, exchange: MessageExchange, spec_of: Callable[[str, int], ReplySpec]) -> None:
        self.exchange = exchange
        self.spec_of = spec_of
        self.client_of: dict[int, int] = {}  # node id -> client id (its partition id)
        self.node_of: dict[int, int] = {}  # client id -> the node currently speaking for it
        self.failures: list[dict[str, Any]] = []

    def admit(self, server_round: int, phase: str, replies: Iterable[Any]) -> list[Reply]:
        """The valid replies of one phase, ordered by client id; every other reply (error, duplicate, a field
        that does not match the spec, a client id that clashes) and every silent node is recorded.

        Raises :class:`RunAborted` when there were replies, none was valid and all failed for the same reason.
        """
        replies = list(replies)
        seen: set[int] = set()
        before = len(self.failures)
        valid = [r for msg in replies if (r := self.screen(server_round, msg, phase, seen)) is not None]
        rejected = [f["reason"] for f in self.failures[before:]]
        limit = f"{self.exchange.timeout:g} s" if self.exchange.timeout else "the round's time limit"
        for node in self.exchange.close_phase(server_round, phase, replies):
            self.reject(server_round, node, phase, f"no reply within {limit} (round-timeout)")
        if replies and not valid and len({gist(r) for r in rejected}) == 1:
            raise RunAborted(
                f"round {server_round}: every {phase} reply failed for the same reason, so the run stops "
                f"here: {short_reason(rejected[0])}"
            )
        return sorted(valid, key=lambda r: r.client)

    def screen(self, server_round: int, msg: Any, phase: str, seen: set[int]) -> Reply | None:
        """One reply message: an error reply is recorded; its content goes through :meth:`check`."""
        node = self.exchange.sender_of(server_round, phase, msg)
        if msg.has_error():
            self.reject(server_round, node, phase, f"error reply: {msg.error.reason}")
            return None
        reply = self.check(server_round, node, msg.content, phase, seen)
        stamps = reply.metrics.pop("timing", None) if reply is not None else None
        if stamps:
            self.exchange.note_timing(phase, msg, stamps)
        return reply

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
        self.exchange.count(server_round, f"{phase}-bytes-up", content_bytes(content))
        return Reply(node, client, int(metrics["num-examples"]), metrics, records)

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

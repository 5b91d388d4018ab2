"""The message exchange: how a strategy's messages reach the nodes and how their replies come back.

Messages go out and replies come in through Flower's Grid API (``push_messages`` / ``pull_messages``), as
``Grid.send_and_receive`` does, except that the wait between two pulls grows with the time already waited
(:meth:`MessageExchange.poll_wait`): Flower waits 3 s between pulls in deployment and 0.1 s in simulation,
and a round pays on average half of that once per phase.

A reply travels one way: :meth:`MessageExchange.receive` attributes each reply of a phase to its node, stamps it
with when its message was pushed and it was pulled (an :class:`Arrival`) and names the nodes that never answered;
the reply gate (:mod:`strategies.gate`) then validates and rejects, never calling back; :meth:`account` counts
what the gate admitted.  To do that the exchange keeps:

- the **outbox**: the metadata of the messages sent per (round, phase), to name the node behind an error
  reply the SuperLink made for it (its ``src_node_id`` is the SuperLink's) and to find the nodes that never
  replied.  Only the metadata: the grid fills in ``message_id`` on it when pushing, and the payloads are
  not kept alive;
- the **message timing**: when each message was pushed and each reply pulled, which with the stamps of the
  reply's ``timing`` record say where a message's time went (:mod:`strategies.message_timing`);
- the **bytes** sent and received per round and phase (``<phase>-bytes-down`` / ``-up``);
- the **shared records**: while one phase's messages are built, each distinct state object is converted to an
  ``ArrayRecord`` once and shared by every message that carries it (the global model goes to every node:
  converting it per node was most of the server's time per round at 100 clients).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from flwr.app import ArrayRecord, Message, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import Grid

from strategies.message_timing import breakdown, summarize
from strategies.replies import Reply
from task.params import to_record

log = logging.getLogger("flwr.pflower")


def content_bytes(content: RecordDict) -> int:
    """Payload size of a message's records (arrays, metrics and configs), as Flower counts them."""
    return sum(rec.count_bytes() for rec in content.values())


class RunAborted(RuntimeError):
    """The run cannot go on: every reply of a phase failed for the same reason (:mod:`strategies.gate`), or the
    nodes it needs never connected; running more rounds would only repeat it."""


class NodeWaitTimeout(RunAborted):
    """Fewer than ``min-nodes`` nodes connected within ``node-wait-timeout`` seconds."""


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


@dataclass
class Arrival:
    """One reply as it came back: the node it is about (:meth:`MessageExchange.sender_of`), the message, and when
    the message it answers was pushed and it was pulled (unix s; None where the exchange did not see it)."""

    node: int
    message: Any
    pushed: float | None = None
    pulled: float | None = None


@dataclass
class Arrivals:
    """A phase's replies as they came back, the nodes that were sent a message and never answered (``silent``),
    and how long the phase waited for them (``timeout``, s; 0: as long as the round)."""

    replies: list[Arrival]
    silent: list[int] = field(default_factory=list)
    timeout: float = 0.0


class MessageExchange:
    """Sends a phase's messages through the Grid and collects their replies (see the module docstring)."""

    #: the longest wait between two pulls for replies
    poll_seconds = 0.1
    #: the wait between two pulls is this share of the time already waited (at least ``poll_min_seconds``, at
    #: most ``poll_seconds``): a phase's last reply is seen within about 5 % of the phase's length after it
    #: arrives, and a long phase (a deployed round) pulls no more often than every ``poll_seconds``
    poll_share = 0.05
    poll_min_seconds = 0.002

    def __init__(self, timeout: float) -> None:
        #: seconds to wait for a phase's replies (run-config ``round-timeout``)
        self.timeout = timeout
        #: bytes per round: ``<phase>-bytes-down`` (messages) and ``<phase>-bytes-up`` (valid replies)
        self.comm: dict[int, dict[str, int]] = {}
        self._outbox: dict[tuple[int, str], list[Any]] = {}
        self._pushed_at: dict[str, float] = {}  # message id -> when it was pushed (unix s)
        self._pulled_at: dict[str, float] = {}  # id of the message a reply answers -> when it was pulled
        self._records: dict[int, tuple[Any, ArrayRecord]] | None = None  # see record_of

    # ------------------------------------------------------------------ building messages
    def count(self, server_round: int, key: str, n: int) -> None:
        """Add ``n`` bytes to round ``server_round``'s counter ``key``."""
        counters = self.comm.setdefault(server_round, {})
        counters[key] = counters.get(key, 0) + int(n)

    @contextlib.contextmanager
    def sharing_records(self, known: Mapping[int, tuple[Any, ArrayRecord]] | None = None) -> Iterator[None]:
        """While a phase's payloads are built (nothing changes the models meanwhile), :meth:`record_of` converts
        each state object once; ``known`` maps ``id(state)`` to (state, its record) already made."""
        self._records = dict(known or {})
        try:
            yield
        finally:
            self._records = None

    def record_of(self, state: Mapping[str, Any]) -> ArrayRecord:
        """``state`` as an ArrayRecord for a message, shared by every message of the phase that carries it."""
        if self._records is None:
            return to_record(state)
        hit = self._records.get(id(state))
        if hit is None or hit[0] is not state:
            hit = self._records[id(state)] = (state, to_record(state))
        return hit[1]

    def address(
        self, server_round: int, phase: str, message_type: str, payloads: Mapping[int, RecordDict]
    ) -> list[Message]:
        """One message per node (node id -> its content), counted and noted in the outbox."""
        messages = []
        for node, content in payloads.items():
            self.count(server_round, f"{phase}-bytes-down", content_bytes(content))
            messages.append(Message(content=content, message_type=message_type, dst_node_id=node))
        self._outbox[(server_round, phase)] = [m.metadata for m in messages]
        return messages

    # ------------------------------------------------------------------ sending and receiving
    def send(self, grid: Grid, messages: Iterable[Message], timeout: float | None = None) -> list[Message]:
        """Push ``messages`` and pull their replies until all are in or ``timeout`` s (default: the exchange's)
        have passed, pulling again after :meth:`poll_wait`; notes when each was pushed and each reply pulled."""
        messages = list(messages)
        if not messages:
            return []
        pushed = time.time()
        waiting = {mid for mid in grid.push_messages(messages) if mid}
        self._pushed_at.update(dict.fromkeys(waiting, pushed))
        begun = time.monotonic()
        deadline = begun + (self.timeout if timeout is None else timeout)
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
        young (a simulated round lasts a fraction of a second), growing to :attr:`poll_seconds`."""
        return min(self.poll_seconds, max(self.poll_min_seconds, self.poll_share * waited))

    # ------------------------------------------------------------------ what came back
    def sender_of(self, server_round: int, phase: str, reply: Any) -> int:
        """The node a reply is about.

        A node's own replies carry its id as ``src_node_id``; an error reply the SuperLink makes for a node it
        lost ("Node Unavailable") carries the SuperLink's id instead, so it is matched to the message it
        answers (``reply_to_message_id``) and that message's destination.
        """
        md = reply.metadata
        if md.src_node_id != SUPERLINK_NODE_ID:
            return int(md.src_node_id)
        for sent in self._outbox.get((server_round, phase), []):
            if md.reply_to_message_id and sent.message_id == md.reply_to_message_id:
                return int(sent.dst_node_id)
        return int(md.src_node_id)

    def receive(self, server_round: int, phase: str, replies: Iterable[Any]) -> Arrivals:
        """The phase's replies, each attributed to its node (:meth:`sender_of`) and stamped with when the message
        it answers was pushed and it was pulled, and the nodes that were sent a message and did not answer at all
        (not even with an error).  The phase's outbox and message times are forgotten."""
        arrivals = []
        for reply in replies:
            answered = reply.metadata.reply_to_message_id
            node = self.sender_of(server_round, phase, reply)
            arrivals.append(Arrival(node, reply, self._pushed_at.get(answered), self._pulled_at.get(answered)))
        answered_by = {a.node for a in arrivals}
        silent = []
        for sent in self._outbox.pop((server_round, phase), []):
            self._pushed_at.pop(sent.message_id, None)
            self._pulled_at.pop(sent.message_id, None)
            if int(sent.dst_node_id) not in answered_by:
                silent.append(int(sent.dst_node_id))
        return Arrivals(arrivals, silent, self.timeout)

    def account(
        self, server_round: int, phase: str, admitted: Iterable[tuple[Arrival, Reply]]
    ) -> dict[str, float] | None:
        """Count the bytes of the replies the gate admitted (``<phase>-bytes-up``) and return where their messages'
        time went: the phase's median breakdown (:mod:`strategies.message_timing`; None when no admitted reply
        carried timing stamps)."""
        rows = []
        for arrival, reply in admitted:
            self.count(server_round, f"{phase}-bytes-up", content_bytes(arrival.message.content))
            if reply.timing:
                rows.append(breakdown(arrival.pushed, reply.timing, arrival.pulled))
        return summarize(rows) if rows else None

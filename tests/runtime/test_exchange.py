"""The message exchange (strategies/exchange.py): how a phase's messages go out and their replies come back.

On a fake grid and a fake clock: replies are pulled often while a phase is young and no more often than every
``poll_seconds`` later, waiting stops at the time-out, each message's push and pull times reach its timing,
the outbox names the node behind an error reply the SuperLink made and the nodes that never answered, bytes
are counted per round and phase, and a state carried by many messages of a phase is converted once.
"""

from __future__ import annotations

from collections.abc import Iterable
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from flwr.app import ConfigRecord, MetricRecord, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID

from strategies import exchange as exchange_module
from strategies.exchange import MessageExchange, content_bytes
from strategies.replies import Reply
from task.params import to_record
from tests.strategy_harness import GridDouble, outgoing_messages

STAMPS = {"handler-start": 103.0, "setup-done": 103.5, "handler-end": 105.0}


class Clock:
    """time.time / time.monotonic / time.sleep of the exchange module, under the test's control."""

    def __init__(self, monkeypatch, start: float = 100.0) -> None:
        self.now = start
        self.slept: list[float] = []
        monkeypatch.setattr(exchange_module.time, "time", lambda: self.now)
        monkeypatch.setattr(exchange_module.time, "monotonic", lambda: self.now)
        monkeypatch.setattr(exchange_module.time, "sleep", self.sleep)

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


class SlowGrid(GridDouble):
    """Each message's reply comes from the node it was sent to and becomes available ``delays[message id]`` seconds
    after the push (never when absent)."""

    def __init__(self, clock: Clock, delays: dict[str, float]) -> None:
        self.clock, self.delays, self.pulls = clock, delays, 0
        self.pushed: float | None = None
        self.addressee: dict[str, int] = {}

    def push_messages(self, messages: Iterable[Any]) -> list[str]:
        self.pushed = self.clock.now
        messages = list(messages)
        self.addressee.update({m.metadata.message_id: m.metadata.dst_node_id for m in messages})
        return [m.metadata.message_id for m in messages]

    def pull_messages(self, message_ids: Iterable[str]) -> list[Any]:
        self.pulls += 1
        if self.pushed is None:
            return []
        waited = self.clock.now - self.pushed
        ready = [i for i in message_ids if i in self.delays and waited >= self.delays[i]]
        return [
            SimpleNamespace(
                metadata=SimpleNamespace(reply_to_message_id=i, src_node_id=self.addressee[i]), content=RecordDict()
            )
            for i in ready
        ]


def sent(*ids: str) -> list[Any]:
    """Messages as the exchange reads them (an id and the node they go to), one per id, all to node 0."""
    return [SimpleNamespace(metadata=SimpleNamespace(message_id=i, dst_node_id=0)) for i in ids]


def test_replies_are_pulled_often_while_the_phase_is_young_and_the_last_one_soon_after_it_came(monkeypatch):
    clock = Clock(monkeypatch)
    grid = SlowGrid(clock, {"m0": 0.1, "m1": 0.35, "m2": 0.5})
    ex = MessageExchange(timeout=30)
    replies = ex.send(grid, sent("m0", "m1", "m2"))
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["m0", "m1", "m2"]
    assert grid.pulls > 10  # Flower's 3 s between pulls would make it 2
    assert clock.slept == pytest.approx([ex.poll_wait(sum(clock.slept[:i])) for i in range(len(clock.slept))])
    assert sum(clock.slept) - 0.5 <= ex.poll_wait(0.5) + 1e-9  # the last reply is pulled one wait after it came


def test_the_wait_between_pulls_grows_with_the_phase_and_is_bounded():
    ex = MessageExchange(timeout=30)
    waits = [ex.poll_wait(t) for t in (0.0, 0.01, 0.2, 0.5, 1.0, 1.9, 2.0, 5.0, 60.0)]
    assert waits == sorted(waits)
    assert waits[0] == ex.poll_min_seconds > 0  # no busy loop at the start
    assert ex.poll_wait(0.5) == pytest.approx(ex.poll_share * 0.5)
    assert ex.poll_wait(60.0) == ex.poll_seconds  # a long phase: no more often than the cap


@pytest.mark.parametrize("own,given", [(0.3, None), (3600.0, 0.3)])
def test_waiting_stops_at_the_time_out_the_exchange_has_or_is_given(monkeypatch, own, given):
    clock = Clock(monkeypatch)
    grid = SlowGrid(clock, {"m0": 0.1})  # m1 never answers
    replies = MessageExchange(timeout=own).send(grid, sent("m0", "m1"), timeout=given)
    assert [r.metadata.reply_to_message_id for r in replies] == ["m0"]
    assert 0.3 <= clock.now - 100.0 <= 0.3 + MessageExchange.poll_seconds
    assert MessageExchange(timeout=1).send(grid, []) == [] and grid.pulls  # nothing sent: nothing to wait for


def test_push_and_pull_times_split_the_message_and_are_forgotten_when_the_phase_closes(monkeypatch):
    clock = Clock(monkeypatch, start=100.0)
    grid = SlowGrid(clock, {"m0": 0.25})
    ex = MessageExchange(timeout=30)
    with outgoing_messages():
        messages = ex.address(1, "train", "train", {5: RecordDict(), 6: RecordDict()})
    ids = [m.metadata.message_id for m in messages]
    grid.delays = {ids[0]: 6.0}
    (reply,) = ex.send(grid, messages)
    arrivals = ex.receive(1, "train", [reply])
    (arrival,) = arrivals.replies
    assert arrival.node == 5 and arrival.message is reply  # the reply of the first message, sent to node 5
    assert arrivals.silent == [6] and arrivals.timeout == 30  # node 6 never answered
    timed = Reply(5, 0, 1, {}, timing={"handler-start": 102.0, "setup-done": 102.5, "handler-end": 105.0})
    summary = ex.account(1, "train", [(arrival, timed)])
    assert summary is not None
    assert summary["messages"] == 1 and summary["dispatch"] == 2.0 and summary["work"] == 2.5
    assert 6.0 <= summary["total"] <= 6.0 + ex.poll_seconds  # pulled one wait after it was there (push at 100)
    assert summary["return"] == pytest.approx(summary["total"] + 100.0 - 105.0)
    assert ex.account(1, "train", [(arrival, Reply(5, 0, 1, {}))]) is None  # a reply without stamps is not timed
    (late,) = ex.receive(1, "train", [reply]).replies  # after the phase: no push / pull time is left for the message
    assert late.pushed is None and late.pulled is None
    assert set(ex.account(1, "train", [(late, Reply(5, 0, 1, {}, timing=STAMPS))]) or {}) == {
        "messages",
        "setup",
        "work",
        "fresh-processes",
        "handler-sum",
    }


def test_the_outbox_names_the_node_behind_a_superlink_error_and_the_silent_ones():
    ex = MessageExchange(timeout=120)
    with outgoing_messages():
        messages = ex.address(3, "train", "train", {7: RecordDict(), 8: RecordDict(), 9: RecordDict()})
    m7, m8, _ = (m.metadata.message_id for m in messages)

    def reply(src, to):
        return SimpleNamespace(metadata=SimpleNamespace(src_node_id=src, reply_to_message_id=to))

    lost, own = reply(SUPERLINK_NODE_ID, m7), reply(8, m8)  # node 7 lost (the SuperLink answers), 8 itself
    assert ex.sender_of(3, "train", lost) == 7 and ex.sender_of(3, "train", own) == 8
    assert ex.sender_of(3, "evaluate", lost) == SUPERLINK_NODE_ID  # another phase's outbox does not match
    assert ex.sender_of(3, "train", reply(SUPERLINK_NODE_ID, "")) == SUPERLINK_NODE_ID
    arrivals = ex.receive(3, "train", [lost, own])
    assert [(a.node, a.message) for a in arrivals.replies] == [(7, lost), (8, own)] and arrivals.silent == [9]
    again = ex.receive(3, "train", [lost])  # the phase's outbox is gone
    assert again.silent == [] and again.replies[0].node == SUPERLINK_NODE_ID


def test_bytes_are_counted_per_round_and_phase():
    ex = MessageExchange(timeout=1)
    small = RecordDict({"metrics": MetricRecord({"a": 1.0})})
    big = RecordDict({"arrays": to_record({"w": np.zeros(100, np.float32)}), "config": ConfigRecord({"x": 1})})
    with outgoing_messages():
        ex.address(2, "train", "train", {1: small, 2: big})
        ex.address(2, "lia", "query.lia", {1: small})
        ex.address(3, "train", "train", {1: small})
    ex.count(2, "train-bytes-up", 5)
    assert ex.comm[2] == {
        "train-bytes-down": content_bytes(small) + content_bytes(big),
        "lia-bytes-down": content_bytes(small),
        "train-bytes-up": 5,
    }
    assert ex.comm[3] == {"train-bytes-down": content_bytes(small)} and content_bytes(big) > 400


def test_a_state_carried_by_a_phase_is_converted_once_and_never_stale():
    ex = MessageExchange(timeout=1)
    state = {"w": np.arange(3, dtype=np.float32)}
    outside = ex.record_of(state)
    assert ex.record_of(state) is not outside  # outside a phase: converted each time
    known = to_record({"w": np.ones(3, np.float32)})
    with ex.sharing_records({id(state): (state, known)}):
        assert ex.record_of(state) is known  # the record the caller already made
        other = {"w": np.full(3, 7, np.float32)}
        first = ex.record_of(other)
        assert ex.record_of(other) is first
        np.testing.assert_array_equal(first["w"].numpy(), other["w"])
    with ex.sharing_records():
        replaced = {"w": np.full(3, 9, np.float32)}
        np.testing.assert_array_equal(ex.record_of(replaced)["w"].numpy(), replaced["w"])
        del replaced  # a new object may reuse the id of one converted before: it is converted again
        again = {"w": np.full(3, 4, np.float32)}
        np.testing.assert_array_equal(ex.record_of(again)["w"].numpy(), again["w"])
    assert ex.record_of(state) is not known

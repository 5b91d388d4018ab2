"""Where a message's time goes (issue 17): the client's stamps, the server's split, the server's own pulling."""

import math
import time
from types import SimpleNamespace

import pytest
from flwr.app import MetricRecord, RecordDict

from strategies.message_timing import breakdown, summarize
from strategies.replies import BASE, InvalidReply, parse_reply

STAMPS = {
    "process-start": 100.0,
    "app-import": 100.5,
    "app-ready": 103.0,
    "handler-start": 103.25,
    "setup-done": 103.5,
    "handler-end": 105.0,
}


def test_a_fresh_process_splits_the_message_into_every_component_that_adds_up_to_the_total():
    row = breakdown(pushed=97.0, stamps=STAMPS, pulled=106.0)
    assert row == {
        "dispatch": 3.0,
        "start-up": 0.5,
        "imports": 2.5,
        "handoff": 0.25,
        "setup": 0.25,
        "work": 1.5,
        "return": 1.0,
        "total": 9.0,
    }
    assert math.isclose(sum(v for k, v in row.items() if k != "total"), row["total"])


def test_a_process_that_was_already_running_pays_no_start_up():
    row = breakdown(pushed=103.0, stamps=STAMPS, pulled=105.5)  # process and imports happened before the push
    assert "start-up" not in row and "imports" not in row and "handoff" not in row
    assert row["dispatch"] == 0.25 and row["total"] == 2.5
    assert math.isclose(row["dispatch"] + row["setup"] + row["work"] + row["return"], row["total"])


def test_without_push_or_pull_times_only_the_client_side_is_split():
    assert breakdown(None, STAMPS, None) == {"setup": 0.25, "work": 1.5}
    assert breakdown(97.0, {"app-import": 1.0}, 106.0) == {}  # no handler stamps: nothing to say


def test_summary_is_the_median_per_component_and_counts_fresh_processes():
    rows = [breakdown(97.0, STAMPS, 106.0), breakdown(103.0, STAMPS, 105.5), breakdown(103.0, STAMPS, 107.5)]
    s = summarize(rows)
    assert s["messages"] == 3 and s["fresh-processes"] == 1
    assert s["total"] == 4.5 and s["dispatch"] == 0.25 and s["start-up"] == 0.5
    assert s["handler-sum"] == 3 * (0.25 + 1.5)  # every message's set-up and work, summed


@pytest.mark.parametrize("bad", [math.nan, math.inf, -1.0, 1e12, "soon", [1.0]])
def test_a_malformed_timing_record_is_rejected_like_any_other_field(bad):
    content = RecordDict(
        {
            "metrics": MetricRecord({"num-examples": 3, "partition-id": 0}),
            "timing": MetricRecord({**STAMPS, "handler-end": 1.0}),
        }
    )
    metrics, _ = parse_reply(content, BASE)
    assert metrics["timing"]["handler-end"] == 1.0
    content = RecordDict({"metrics": MetricRecord({"num-examples": 3, "partition-id": 0})})
    try:
        content["timing"] = MetricRecord({"handler-end": bad})
    except (TypeError, ValueError):
        return  # Flower itself refuses this value in a MetricRecord
    with pytest.raises(InvalidReply, match="timing metric 'handler-end'"):
        parse_reply(content, BASE)


class SlowGrid:
    """Replies become available only after ``delay`` seconds; counts the pulls."""

    def __init__(self, delay: float) -> None:
        self.delay, self.pulls, self.pushed = delay, 0, None

    def push_messages(self, messages):
        self.pushed = time.monotonic()
        return [m.metadata.message_id for m in messages]

    def pull_messages(self, ids):
        self.pulls += 1
        if time.monotonic() - self.pushed < self.delay:
            return []
        return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i)) for i in ids]


def test_the_strategy_pulls_replies_often_instead_of_every_3_s():
    from strategies.base import PersonalizedStrategy

    s = PersonalizedStrategy.__new__(PersonalizedStrategy)
    s._pushed_at, s._pulled_at = {}, {}
    grid = SlowGrid(delay=0.35)
    msgs = [SimpleNamespace(metadata=SimpleNamespace(message_id=f"m{i}")) for i in range(3)]
    replies = s.exchange(grid, msgs, timeout=30)
    assert sorted(r.metadata.reply_to_message_id for r in replies) == ["m0", "m1", "m2"]
    assert grid.pulls >= 3  # it kept asking while nothing was there (a 3 s wait between pulls makes 2)
    assert set(s._pulled_at) == {"m0", "m1", "m2"} and set(s._pushed_at) == {"m0", "m1", "m2"}


def test_the_wait_between_pulls_grows_with_the_phase_and_is_bounded():
    """A young phase (a simulated round of a fraction of a second) is pulled often, so its last reply is seen
    soon after it arrives; a long phase (a deployed round) is pulled at most every reply_poll_seconds."""
    from strategies.base import PersonalizedStrategy as S

    s = S.__new__(S)
    waits = [s.poll_wait(t) for t in (0.0, 0.01, 0.2, 0.5, 1.0, 1.9, 2.0, 5.0, 60.0)]
    assert waits == sorted(waits)  # never shorter later in the phase
    assert waits[0] == S.reply_poll_min_seconds > 0  # no busy loop at the start
    assert s.poll_wait(0.5) == pytest.approx(S.reply_poll_share * 0.5)  # the lag is a share of the time waited
    assert s.poll_wait(0.5) < S.reply_poll_seconds / 2  # a half-second round is pulled far more often than every 0.1 s
    assert s.poll_wait(60.0) == S.reply_poll_seconds  # a long phase: no more often than the cap


def test_exchange_sleeps_the_growing_wait_between_pulls(monkeypatch):
    from strategies import base
    from strategies.base import PersonalizedStrategy

    s = PersonalizedStrategy.__new__(PersonalizedStrategy)
    s._pushed_at, s._pulled_at = {}, {}
    clock = [100.0]
    slept = []

    def fake_sleep(seconds):
        slept.append(seconds)
        clock[0] += seconds

    class Grid(SlowGrid):
        def push_messages(self, messages):
            self.pushed = clock[0]
            return [m.metadata.message_id for m in messages]

        def pull_messages(self, ids):
            self.pulls += 1
            if clock[0] - self.pushed < self.delay:
                return []
            return [SimpleNamespace(metadata=SimpleNamespace(reply_to_message_id=i)) for i in ids]

    monkeypatch.setattr(base.time, "sleep", fake_sleep)
    monkeypatch.setattr(base.time, "monotonic", lambda: clock[0])
    grid = Grid(delay=0.5)
    msgs = [SimpleNamespace(metadata=SimpleNamespace(message_id="m0"))]
    assert len(s.exchange(grid, msgs, timeout=30)) == 1
    assert slept == pytest.approx(
        [s.poll_wait(sum(slept[:i])) for i in range(len(slept))]
    )  # each wait from the time waited so far
    assert sum(slept) - grid.delay <= s.poll_wait(grid.delay) + 1e-9  # the reply is pulled one wait after it came


def test_the_strategy_stops_waiting_at_the_timeout():
    from strategies.base import PersonalizedStrategy

    s = PersonalizedStrategy.__new__(PersonalizedStrategy)
    s._pushed_at, s._pulled_at = {}, {}
    msgs = [SimpleNamespace(metadata=SimpleNamespace(message_id="m0"))]
    assert s.exchange(SlowGrid(delay=1e9), msgs, timeout=0.3) == []


def test_the_client_stamps_its_reply_in_the_order_things_happened():
    from client_app import app as client_app

    before = time.time()
    content = client_app.stamped(
        RecordDict({"metrics": MetricRecord({"num-examples": 3, "partition-id": 0})}),
        handler_start=before - 0.002,
        setup_done=before - 0.001,
    )
    stamps = dict(content["timing"])
    assert stamps["handler-start"] == before - 0.002 and stamps["setup-done"] == before - 0.001
    assert before <= stamps["handler-end"] <= time.time()  # stamped when the reply is made
    assert stamps["process-start"] <= stamps["app-import"] <= stamps["app-ready"] <= before  # /proc on Linux
    assert stamps["process-start"] > before - 24 * 3600  # this process, not the machine's boot
    metrics, _ = parse_reply(content, BASE)  # and the server accepts what the client sends
    assert metrics["timing"] == pytest.approx(stamps)
    row = breakdown(stamps["handler-start"] - 1.0, metrics["timing"], stamps["handler-end"] + 0.5)
    assert row["setup"] == pytest.approx(0.001, abs=1e-5) and row["return"] == pytest.approx(0.5, abs=1e-5)

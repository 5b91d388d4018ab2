"""Where a message's time goes: the client's stamps and the server's split (the server's own pulling:
tests/runtime/test_exchange.py)."""

import math
import subprocess
import sys
import time

import pytest
from flwr.app import MetricRecord, RecordDict

from strategies.gate import parse_reply
from strategies.message_timing import FRESH_SLACK, breakdown, summarize
from strategies.replies import BASE, InvalidReply

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


def test_the_client_stamps_its_reply_in_the_order_things_happened():
    from client_app import app as client_app

    before = time.time()
    content = client_app.stamped(
        RecordDict({"metrics": MetricRecord({"num-examples": 3, "partition-id": 0})}),
        handler_start=before - 0.002,
        setup_done=before - 0.001,
    )
    stamps = {k: v for k, v in content.metric_records["timing"].items() if isinstance(v, (int, float))}
    assert stamps["handler-start"] == before - 0.002 and stamps["setup-done"] == before - 0.001
    assert before <= stamps["handler-end"] <= time.time()  # stamped when the reply is made
    assert stamps["process-start"] <= stamps["app-import"] <= stamps["app-ready"] <= before  # /proc on Linux
    assert stamps["process-start"] > before - 24 * 3600  # this process, not the machine's boot
    metrics, _ = parse_reply(content, BASE)  # and the server accepts what the client sends
    assert metrics["timing"] == pytest.approx(stamps)
    row = breakdown(stamps["handler-start"] - 1.0, metrics["timing"], stamps["handler-end"] + 0.5)
    assert row["setup"] == pytest.approx(0.001, abs=1e-5) and row["return"] == pytest.approx(0.5, abs=1e-5)


def test_the_import_stamp_is_taken_before_the_app_loads_anything_heavy():
    """``app-import`` is stamped when the client package begins to import (client_app/__init__.py), before flwr, numpy,
    torch and the app's own modules load: in a fresh process, ``imports`` counts all of them."""
    heavy = ("flwr", "numpy", "torch", "client_app.app", "client_app.base", "task")
    code = f"import sys, client_app; print([m for m in {heavy!r} if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_every_phase_of_a_round_with_real_clients_says_where_its_messages_time_went(tmp_path):
    """Two rounds of pFedLIA (train, evaluate and two queries) with its real clients in one process: each round's
    history holds, for every phase whose messages it sent, the breakdown of those messages' time, one per client."""
    from tests.in_process import NODES, run_in_process

    strategy, server, _, _ = run_in_process("pfedlia", tmp_path)
    for server_round, entry in enumerate(strategy.history, start=1):
        sent = {line["type"].removeprefix("query.") for line in server if line["round"] == server_round}
        timing = entry.extra["message-timing"]
        assert set(timing) == sent and {"train", "evaluate", "lazy", "lia"} >= sent
        for row in timing.values():
            assert row["messages"] == NODES
            assert 0 <= row["work"] <= row["total"]


def test_a_process_started_within_the_slack_before_the_push_counts_as_started_for_the_message():
    """/proc's clock ticks are coarse: a process stamped up to FRESH_SLACK before the push was still started for it
    (a fresh process's start-up is split off), and one started earlier was already running."""
    pushed = 100.5
    for proc in (pushed - FRESH_SLACK, pushed - FRESH_SLACK / 5):
        row = breakdown(pushed, {**STAMPS, "process-start": proc}, None)
        assert row["dispatch"] == proc - pushed and row["start-up"] == STAMPS["app-import"] - proc
    before = breakdown(pushed, {**STAMPS, "process-start": pushed - 2 * FRESH_SLACK}, None)
    assert "start-up" not in before and before["dispatch"] == STAMPS["handler-start"] - pushed


def test_without_a_set_up_stamp_the_whole_handler_is_work_and_half_a_handler_says_nothing():
    stamps = {"handler-start": 10.0, "handler-end": 12.5}
    assert breakdown(9.0, stamps, 13.0) == {"dispatch": 1.0, "work": 2.5, "return": 0.5, "total": 4.0}
    assert breakdown(9.0, {"handler-start": 10.0}, 13.0) == {}
    assert breakdown(9.0, {"handler-end": 12.5}, 13.0) == {}


def test_the_handler_sum_counts_set_up_and_work_where_a_message_has_them():
    rows = [{"work": 2.0}, {"setup": 0.5}, {"dispatch": 1.0}, {"setup": 0.25, "work": 1.0}]
    assert summarize(rows)["handler-sum"] == 2.0 + 0.5 + 0.25 + 1.0

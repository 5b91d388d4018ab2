"""The engine-against-flwr-run check of the evidence: a re-run cell is called identical only when every number of the
two records agrees (seconds, memory and bytes aside), and the page says how many were."""

from __future__ import annotations

import copy

from benchmarks.records import write_record
from benchmarks.reporting import engine_check


def grid_record(acc: float = 0.91) -> dict:
    return {
        "grid": "grids-label-skew",
        "cell": {"samples": 0, "heterogeneity": "a0.5", "method": "fedavg", "setting": "lr=0.05", "seed": 0},
        "engine": "in-process",
        "error": None,
        "summary": {"personal-acc": acc, "seconds": 12.5},
        "rounds": [{"round": 1, "personal-acc": acc, "seconds": 1.2, "bytes-down": 900}],
        "clients": {"columns": ["client", "personal-acc", "peak-rss-mb"], "rows": [[0, acc, 800.0], [1, acc, 801.0]]},
    }


def rerun(original: dict, **changes) -> dict:
    rec = copy.deepcopy(original)
    rec.update(grid=engine_check.GRID, engine="flwr-run", cell={"family": "label-skew", "method": "fedavg", "seed": 0})
    rec["compared-with"] = {"grid": original["grid"], "cell": original["cell"], "engine": "in-process"}
    # what differs between two runtimes without being a result: seconds, memory, bytes
    rec["summary"]["seconds"] = 40.0
    rec["rounds"][0].update(seconds=9.9, **{"bytes-down": 912})
    rec["clients"]["rows"][0][2] = 300.0
    for path, value in changes.items():
        rec["summary"][path] = value
    return rec


def test_a_rerun_that_agrees_in_every_number_is_identical(tmp_path):
    original = grid_record()
    write_record(original, tmp_path)
    write_record(rerun(original), tmp_path)
    assert engine_check.differences(original, rerun(original)) == []
    text = engine_check.render_engine_check(tmp_path, {})
    assert "| label-skew / fedavg / seed 0 | 0.9100 | 0.9100 | identical |" in text
    assert "1 of 1 gave the same numbers" in str(engine_check.verdict(tmp_path))


def test_one_number_that_differs_is_named(tmp_path):
    original = grid_record()
    write_record(original, tmp_path)
    write_record(rerun(original, **{"personal-acc": 0.9101}), tmp_path)
    text = engine_check.render_engine_check(tmp_path, {})
    assert "1 numbers differ (first: `/summary/personal-acc`)" in text
    said = str(engine_check.verdict(tmp_path))
    assert "0 of 1 gave the same numbers" in said and "label-skew / fedavg / seed 0 (1 numbers differ)" in said


def test_nothing_rerun_says_how_to_run_it(tmp_path):
    assert engine_check.verdict(tmp_path) is None
    assert "engine_check" in engine_check.render_engine_check(tmp_path, {})

"""The engine-speed table (benchmarks/reporting/engine_speed.py): each goal is called met only when the measurement
meets it, and a missed one says by how much, in the engine's seconds."""

from __future__ import annotations

from benchmarks.records import write_record
from benchmarks.reporting import engine_speed


def record(grid: str, what: str, measurements: dict) -> dict:
    return {"grid": grid, "cell": {"what": what}, "engine": "in-process", "error": None, "measurements": measurements}


def fresh(engine: float, flwr: float) -> dict:
    return record(
        "engine-fresh",
        "default-job",
        {"pairs": [], "engine-median": engine, "flwr-run-median": flwr, "ratio": flwr / engine, "goal": 2.0},
    )


def grid(engine: float, flwr: float, peaks: list[float]) -> dict:
    return record(
        "engine-grid",
        "default-job-x40",
        {
            "runs": 40,
            "jobs": 2,
            "engine-seconds": engine,
            "flwr-run-seconds": flwr,
            "ratio": flwr / engine,
            "goal": 6.0,
            "worker-peak-rss-mb": peaks,
            "memory-goal-mb": 1200,
        },
    )


def row(text: str, start: str) -> str:
    [line] = [ln for ln in text.splitlines() if ln.startswith(f"| {start}")]
    return line


def test_a_ratio_just_short_of_its_goal_is_missed_by_the_engine_seconds_beyond_the_goals_time(tmp_path):
    write_record(fresh(10.0, 19.0), tmp_path)  # 1.9x: the engine needed 9.5 s
    line = row(engine_speed.render_engine_speed(tmp_path, {}), "the default job in a fresh process")
    assert "1.90x faster" in line and "missed: 0.50 s over the 2x time (9.50 s)" in line


def test_a_grid_and_memory_within_their_goals_are_met_and_a_worker_over_the_memory_goal_is_not(tmp_path):
    write_record(grid(100.0, 800.0, [1000.0, 1250.0]), tmp_path)
    text = engine_speed.render_engine_speed(tmp_path, {})
    assert row(text, "a 40-run grid").endswith("| 8.00x faster | at least 6x | met |")
    memory = row(text, "peak memory per worker")
    assert "1,000 MB / 1,250 MB" in memory and "missed: 50 MB over" in memory


def test_no_records_say_how_to_measure(tmp_path):
    assert engine_speed.COMMAND in engine_speed.render_engine_speed(tmp_path, {})

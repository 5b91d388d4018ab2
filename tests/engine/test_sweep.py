"""``python -m server_app.sweep``: a grid from the command line as a user writes it, its runs on the engine, progress,
resuming, failures recorded, the table, exit codes; and the same grid on a Ray cluster."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from server_app.engine import APP_DIR, App, EngineError
from server_app.job import Exit
from server_app.sweep import Spec, check, expand, plan, sweep_exit, table_rows
from tests.ray_head import ray_head

# --------------------------------------------------------------------------- the grid, without running anything


def test_an_array_is_an_axis_and_every_combination_is_a_run():
    specs = plan(["method=['fedavg','fedcac'] seed=[0,1,2] lr=0.1"], ["num-supernodes=5"])
    assert [(s.run_config["method"], s.run_config["seed"]) for s in specs] == [
        ("fedavg", 0), ("fedavg", 1), ("fedavg", 2), ("fedcac", 0), ("fedcac", 1), ("fedcac", 2)
    ]  # fmt: skip
    assert all(s.run_config["lr"] == 0.1 and s.num_supernodes == 5 for s in specs)
    # what varies is what the table shows
    assert [s.varied for s in specs][:2] == [{"method": "fedavg", "seed": 0}, {"method": "fedavg", "seed": 1}]


def test_each_run_config_option_is_a_line_of_the_grid_and_a_run_twice_is_one_run():
    specs = plan(["method='fedavg' seed=[0,1]", "method='local'", "method='fedavg' seed=1"])
    assert [s.run_config for s in specs] == [
        {"method": "fedavg", "seed": 0},
        {"method": "fedavg", "seed": 1},
        {"method": "local"},
    ]
    assert len({s.key for s in specs}) == 3


def test_a_grid_file_has_a_base_axes_a_federation_and_further_lines(tmp_path):
    import tomllib

    (tmp_path / "grid.toml").write_text(
        "[base]\nnum-server-rounds = 3\n[axes]\nseed = [0, 1]\n[federation]\nnum-supernodes = [4, 6]\n"
        "[[runs]]\nmethod = 'fedavg'\n[[runs]]\nmethod = 'pfedlia'\nwarmup-rounds = [1, 2]\n"
    )
    grid = tomllib.loads((tmp_path / "grid.toml").read_text())
    specs = plan(["lr=0.1"], [], grid)
    assert len(specs) == 2 * 2 + 2 * 2 * 2
    assert {s.num_supernodes for s in specs} == {4, 6}
    assert all(s.run_config["num-server-rounds"] == 3 and s.run_config["lr"] == 0.1 for s in specs)
    assert {s.run_config.get("warmup-rounds") for s in specs if s.run_config["method"] == "pfedlia"} == {1, 2}
    assert "num-supernodes" in specs[0].varied


@pytest.mark.parametrize(
    "grid, message",
    [({"bases": {}}, "'bases' unknown"), ({"axes": {"seed": []}}, "'seed' has no values")],
)
def test_a_bad_grid_is_refused_with_what_is_allowed(grid, message):
    with pytest.raises(EngineError, match=message):
        plan([], [], grid)


def test_an_axis_of_nested_values_is_refused():
    with pytest.raises(EngineError, match="an axis' values are numbers, strings or booleans"):
        expand({"seed": [[0, 1]]})


def test_every_run_config_is_checked_before_anything_runs():
    app = App.load(APP_DIR)
    specs = plan(["method=['fedcac','nope'] tau=[0.5,1.5]"])
    problems = check(specs, app)
    # both runs of the unknown method, and FedCAC's with tau 1.5 (tau is in [0, 1]), each named
    assert len(problems) == 3
    assert sum("got 'nope'" in p for p in problems) == 2
    assert any(p.startswith("method=fedcac tau=1.5: ") for p in problems)
    with pytest.raises(EngineError, match="did you mean 'tau'"):
        app.overrides("tua=0.5")


def test_the_exit_status_of_a_grid_is_that_of_its_first_run_that_did_not_complete():
    specs = [Spec({"seed": i}, 2) for i in range(3)]
    entries = {specs[0].key: {"exit": 0}, specs[1].key: {"exit": 5}, specs[2].key: {"exit": 3}}
    assert sweep_exit(specs, entries) == Exit.ABORTED
    assert sweep_exit(specs[:1], entries) == Exit.COMPLETED
    assert sweep_exit(specs, {}) == Exit.FLOWER_ERROR  # a run with no entry did not complete


def test_a_row_that_covers_only_some_clients_says_so():
    """summary.json's coverage (server_app/coverage.py): the final evaluation's covered / total clients."""
    spec = Spec({"seed": 0}, 10, varied={"seed": 0})

    def row_of(covered: int, code: int = 0) -> dict:
        coverage = {"covered": covered, "total": 10, "min-share": 0.5, "met": covered >= 5, "by-mean": {}}
        entry = {"exit": code, "summary": {"personal-acc": 1.0, "coverage": coverage}, "seconds": 1.0}
        (row,) = table_rows([spec], {spec.key: entry})
        return row

    assert row_of(7)["outcome"] == "completed (over 7 of 10 clients)"
    assert row_of(10)["outcome"] == "completed"
    assert row_of(2, code=5)["outcome"].startswith("aborted") and row_of(2, 5)["outcome"].endswith("of 10 clients)")


# --------------------------------------------------------------------------- the command, end to end

#: the smallest federation that runs every phase of FedAvg, in a second or two per run
TINY = "num-server-rounds=1 min-nodes=2 train-samples=40"


def sweep(*args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 600):
    return subprocess.run(
        [sys.executable, "-m", "server_app.sweep", str(APP_DIR), *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(APP_DIR), **(env or {})},
        check=False,
    )


def ledger(out: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((out / "runs").glob("*.json"))]


@pytest.mark.slow
def test_a_grid_from_the_command_line_with_progress_a_failure_resume_and_the_table(tmp_path):
    # three runs: two complete; in the third every client crashes, so its round has no reply and the run aborts
    args = [
        "--run-config",
        f"{TINY} seed=[0,1]",
        "--run-config",
        f"{TINY} fault='crash@0,crash@1'",
        "--federation-config",
        "num-supernodes=2",
        "--jobs",
        "1",
    ]
    first = sweep(*args, cwd=tmp_path)
    assert first.returncode == Exit.ABORTED, first.stdout + first.stderr
    assert "3 runs, 0 already done, 3 to run" in first.stdout
    assert "3/3" in first.stderr and "failed=1" in first.stderr  # the progress bar, with the failures
    assert "failed: fault=crash@0,crash@1" in first.stderr
    entries = ledger(tmp_path / "results" / "sweep")
    assert sorted(e["exit"] for e in entries) == [0, 0, Exit.ABORTED]
    for entry in entries:  # every run wrote the results folder flwr run writes, and its log
        assert (Path(entry["results"]) / "summary.json").is_file() and (
            Path(entry["results"]) / "rounds.json"
        ).is_file()
        assert (tmp_path / "results" / "sweep" / "logs" / f"{entry['key']}.log").is_file()
    with (tmp_path / "results" / "sweep" / "table.csv").open() as fh:
        rows = list(csv.DictReader(fh))
    assert [r["seed"] for r in rows] == ["0", "1", ""] and [r["fault"] for r in rows] == ["", "", "crash@0,crash@1"]
    assert all(0 < float(r["personal-acc"]) <= 1 and float(r["seconds"]) > 0 for r in rows[:2])
    assert rows[2]["outcome"].startswith("aborted")
    assert "personal-acc-std" in rows[0] and "personal-acc-min" in rows[0]
    # the same command again: the completed runs are skipped, the failed one runs again
    again = sweep(*args, cwd=tmp_path)
    assert again.returncode == Exit.ABORTED
    assert "3 runs, 2 already done, 1 to run" in again.stdout
    assert len(ledger(tmp_path / "results" / "sweep")) == 3


@pytest.mark.slow
def test_one_run_prints_the_summary_line_and_exits_as_a_job_would(tmp_path):
    done = sweep("--run-config", TINY, "--federation-config", "num-supernodes=2", cwd=tmp_path)
    assert done.returncode == Exit.COMPLETED, done.stdout + done.stderr
    assert "pflower fedavg on digits/dirichlet: 1 rounds, 2 clients" in done.stdout
    assert done.stdout.rstrip().endswith("(exit 0)")
    refused = sweep("--run-config", "method='fedcac' tau=1.5", cwd=tmp_path)
    assert refused.returncode == Exit.REFUSED and "tau" in refused.stderr
    unknown = sweep("--run-config", "num-rounds=3", cwd=tmp_path)
    assert unknown.returncode == Exit.REFUSED and "did you mean 'num-server-rounds'" in unknown.stderr
    stopped = sweep(
        "--run-config", "num-server-rounds=2 min-nodes=2 stop-after=1", "--federation-config", "num-supernodes=2",
        cwd=tmp_path,
    )  # fmt: skip
    assert stopped.returncode == Exit.STOPPED, stopped.stdout[-2000:]


@pytest.mark.slow
def test_two_workers_run_a_grid_in_parallel_each_process_reused(tmp_path):
    done = sweep(
        "--run-config", f"{TINY} seed=[0,1,2,3]", "--federation-config", "num-supernodes=2", "--jobs", "2",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == Exit.COMPLETED, done.stdout + done.stderr
    entries = ledger(tmp_path / "results" / "sweep")
    assert len(entries) == 4 and len({e["pid"] for e in entries}) == 2  # two workers, each ran two runs


@pytest.mark.slow
def test_a_grid_on_an_existing_ray_cluster(tmp_path):
    with ray_head() as (address, _):
        done = sweep(
            "--run-config", f"{TINY} seed=[0,1]", "--federation-config", "num-supernodes=2", "--ray-address", address,
            cwd=tmp_path, env={"RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO": "0"},
        )  # fmt: skip
    assert done.returncode == Exit.COMPLETED, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"on Ray at {address}" in done.stdout
    entries = ledger(tmp_path / "results" / "sweep")
    assert len(entries) == 2 and all(e["exit"] == 0 and Path(e["results"]).is_dir() for e in entries)
    assert all(e["pid"] != os.getpid() for e in entries)  # run by the cluster's workers

"""The engine (Flower's simulation runtime in one process, ``python -m server_app.sweep``) against ``flwr run``.

Every measurement is paired with its reference in the same invocation, on the same machine and load, and the goal
is stated as a ratio (or, where the issue states seconds, next to the reference's seconds).  Parts, each writing one
raw record per measurement to ``benchmarks/raw/engine-<part>/``:

``fresh``   the default job (FedAvg, digits, 10 clients, 10 rounds) in a fresh process, ``python -m
            server_app.sweep . --federation-config num-supernodes=10``, against ``flwr run . --stream`` with the
            README's ``client-resources-num-cpus=1`` on a SuperLink that is already running; ``--repeats`` pairs,
            interleaved.  Goal: the engine at least 2x faster.
``second``  the default job run three times in one worker process: the second and third runs' seconds (imports,
            data and models already loaded), the process's peak memory.  Goal: the second run at most 4 s.
``grid``    a grid of ``--grid-runs`` runs (the default job at seeds 0..N-1) with ``--jobs 2``, against the same
            runs through ``flwr run`` one after another on one SuperLink; each worker's peak memory.  Goals: at
            least 6x faster; at most 1.2 GB per worker.
``scale``   1,000 clients, FedAvg, 10 % of them per round (``fraction-train=0.1``), a few rounds: seconds per round
            after the first on the engine, and through ``flwr run``.  Goal: at most 2 s a round.

Reproduce: python -m benchmarks.engine_speed fresh second grid scale       (about 25 minutes on 2 cores)
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.records import BENCHMARKS, write_record
from benchmarks.reporting import print_section
from benchmarks.running import measurement_record, parser
from server_app.runner import CONNECTION, LocalSimulation

REPO = BENCHMARKS.parent
#: the README's default job: FedAvg on digits, 10 clients, the pyproject defaults
DEFAULT_NODES = 10
FLWR_FEDERATION = f"num-supernodes={DEFAULT_NODES} client-resources-num-cpus=1"


def timed(cmd: list[str], env: dict[str, str], cwd: Path, timeout: float = 3600) -> tuple[float, str, int]:
    start = time.monotonic()
    proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False)
    return time.monotonic() - start, proc.stdout + proc.stderr, proc.returncode


def summary_of(output: str) -> str | None:
    lines = [ln for ln in output.splitlines() if ln.startswith("pflower ") and " -> " in ln]
    return lines[-1].split(", ", 2)[-1].rsplit(" -> ", 1)[0] if lines else None


def accuracy_of(output: str) -> str | None:
    """The summary line's accuracies (what both engines must agree on), without the seconds and the folder."""
    lines = [ln for ln in output.splitlines() if ln.startswith("pflower ") and " -> " in ln]
    if not lines:
        return None
    said = lines[-1].rsplit(" -> ", 1)[0]
    return said.rsplit(", ", 1)[0]  # the last item is the run's seconds


def flwr_cmd(run_config: str) -> list[str]:
    return [
        shutil.which("flwr") or "flwr", "run", str(REPO), CONNECTION, "--stream",
        "--federation-config", FLWR_FEDERATION, "--run-config", run_config,
    ]  # fmt: skip


def sweep_cmd(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "server_app.sweep", str(REPO), "--out", str(out), *extra]


def part_fresh(args, work: Path) -> None:
    results = work / "fresh-results"
    pairs: list[dict[str, Any]] = []
    with LocalSimulation(num_cpus=1) as sim:
        env = {**sim.env, "PYTHONPATH": str(REPO)}
        for i in range(args.repeats):
            out = work / f"fresh-{i}"
            engine_s, engine_out, engine_rc = timed(
                sweep_cmd(out, "--federation-config", f"num-supernodes={DEFAULT_NODES}",
                          "--run-config", f"results-dir='{results}'"),
                env, work,
            )  # fmt: skip
            flwr_s, flwr_out, flwr_rc = timed(flwr_cmd(f"results-dir='{results}'"), sim.env, REPO)
            pairs.append(
                {
                    "engine-seconds": engine_s,
                    "flwr-run-seconds": flwr_s,
                    "engine-exit": engine_rc,
                    "flwr-run-exit": flwr_rc,
                    "engine-result": accuracy_of(engine_out),
                    "flwr-run-result": accuracy_of(flwr_out),
                }
            )
            print(f"[fresh] {i + 1}/{args.repeats}: engine {engine_s:.1f} s, flwr run {flwr_s:.1f} s", flush=True)
    engine = statistics.median(float(p["engine-seconds"] or 0) for p in pairs)
    flwr = statistics.median(float(p["flwr-run-seconds"] or 0) for p in pairs)
    write_record(
        measurement_record(
            "engine-fresh",
            {"what": "default-job"},
            {"pairs": pairs, "engine-median": engine, "flwr-run-median": flwr, "ratio": flwr / engine, "goal": 2.0},
        ),
        args.raw_dir,
    )


SECOND_RUN = """
import json, resource, sys, time
t0 = time.monotonic()
from server_app.engine import run_app
imported = time.monotonic() - t0
runs = []
for _ in range(3):
    result = run_app({"results-dir": sys.argv[1]}, {"num-supernodes": int(sys.argv[2])}, echo=False)
    assert result.error is None, result.output[-3000:]
    runs.append(result.seconds)
print(json.dumps({"import-seconds": imported, "run-seconds": runs,
                  "peak-rss-mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def part_second(args, work: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    wall, out, rc = timed(
        [sys.executable, "-c", SECOND_RUN, str(work / "second-results"), str(DEFAULT_NODES)], env, work
    )
    if rc != 0:
        raise SystemExit(f"[second] the in-process runs failed:\n{out[-3000:]}")
    m = json.loads(out.strip().splitlines()[-1])
    m.update({"wall-seconds": wall, "goal-seconds": 4.0})
    write_record(measurement_record("engine-second", {"what": "default-job"}, m), args.raw_dir)
    print(
        f"[second] runs {', '.join(f'{s:.2f}' for s in m['run-seconds'])} s; peak {m['peak-rss-mb']:.0f} MB", flush=True
    )


def part_grid(args, work: Path) -> None:
    n = args.grid_runs
    seeds = "[" + ",".join(str(s) for s in range(n)) + "]"
    results = work / "grid-results"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = work / "grid-sweep"
    engine_s, engine_out, rc = timed(
        sweep_cmd(out, "--run-config", f"seed={seeds} results-dir='{results}'",
                  "--federation-config", f"num-supernodes={DEFAULT_NODES}", "--jobs", "2"),
        env, work, timeout=7200,
    )  # fmt: skip
    if rc != 0:
        raise SystemExit(f"[grid] the sweep failed (exit {rc}):\n{engine_out[-3000:]}")
    entries = [json.loads(p.read_text()) for p in (out / "runs").glob("*.json")]
    by_worker: dict[int, float] = {}
    for e in entries:
        by_worker[e["pid"]] = max(by_worker.get(e["pid"], 0.0), float(e["peak-rss-mb"]))
    print(f"[grid] engine, {n} runs with --jobs 2: {engine_s:.0f} s", flush=True)
    flwr_runs = []
    start = time.monotonic()
    with LocalSimulation(num_cpus=1) as sim:
        for seed in range(n):
            s, o, code = timed(flwr_cmd(f"seed={seed} results-dir='{results}'"), sim.env, REPO)
            flwr_runs.append({"seed": seed, "seconds": s, "exit": code, "result": accuracy_of(o)})
            print(f"[grid] flwr run {seed + 1}/{n}: {s:.1f} s", flush=True)
    flwr_s = time.monotonic() - start
    engine_results = {e["run-config"]["seed"]: e["summary"] for e in entries}
    m = {
        "runs": n,
        "jobs": 2,
        "engine-seconds": engine_s,
        "flwr-run-seconds": flwr_s,
        "ratio": flwr_s / engine_s,
        "goal": 6.0,
        "worker-peak-rss-mb": sorted(by_worker.values()),
        "memory-goal-mb": 1200,
        "flwr-runs": flwr_runs,
        "engine-runs": [{"seed": k, **v} for k, v in sorted(engine_results.items())],
    }
    write_record(measurement_record("engine-grid", {"what": f"default-job-x{n}"}, m), args.raw_dir)
    print(f"[grid] flwr run: {flwr_s:.0f} s; ratio {flwr_s / engine_s:.1f}x", flush=True)


def part_scale(args, work: Path) -> None:
    cfg = {
        "method": "fedavg",
        "dataset": args.scale_dataset,
        "partition": "iid",
        "model": "softmax",
        "fraction-train": 0.1,
        "fraction-evaluate": 0.1,
        "num-server-rounds": args.scale_rounds,
        "eval-every": args.scale_rounds,
        "min-nodes": args.scale_clients,
        "results-dir": str(work / "scale-results"),
        **({"mnist1d-samples": 30 * args.scale_clients} if args.scale_dataset == "mnist1d" else {}),
    }
    from server_app.engine import Engine

    measurements: dict[str, Any] = {"run-config": cfg, "clients": args.scale_clients, "goal-seconds": 2.0}
    with Engine(workdir=work / "scale-engine") as engine:
        summary = engine.run(cfg, num_supernodes=args.scale_clients)
    measurements["engine"] = round_seconds(Path(summary["results"]))
    print(f"[scale] engine: {measurements['engine']}", flush=True)
    if args.scale_flwr:
        with LocalSimulation(num_cpus=1) as sim:
            summary = sim.run(cfg, num_supernodes=args.scale_clients, timeout=7200)
        measurements["flwr-run"] = round_seconds(Path(summary["results"]))
        print(f"[scale] flwr run: {measurements['flwr-run']}", flush=True)
    write_record(measurement_record("engine-scale", {"clients": args.scale_clients}, measurements), args.raw_dir)


def round_seconds(folder: Path) -> dict[str, Any]:
    rounds = json.loads((folder / "rounds.json").read_text())
    secs = [r["extra"]["seconds"] for r in rounds]
    return {"round-seconds": secs, "median-after-first": statistics.median(secs[1:]) if len(secs) > 1 else None}


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("parts", nargs="+", choices=["fresh", "second", "grid", "scale"])
    ap.add_argument("--repeats", type=int, default=3, help="fresh: pairs (default 3)")
    ap.add_argument("--grid-runs", type=int, default=40, help="grid: runs (default 40)")
    ap.add_argument("--scale-clients", type=int, default=1000)
    ap.add_argument("--scale-rounds", type=int, default=4)
    ap.add_argument("--scale-dataset", default="mnist1d", help="scale: a data set that holds the clients")
    ap.add_argument("--scale-flwr", action="store_true", help="scale: also through flwr run (minutes)")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pflower-engine-speed-"))
    try:
        for part in args.parts:
            {"fresh": part_fresh, "second": part_second, "grid": part_grid, "scale": part_scale}[part](args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print_section("engine-fresh", args.raw_dir)


if __name__ == "__main__":
    main()

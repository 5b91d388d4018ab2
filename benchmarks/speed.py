"""How close pflower's rounds come to what Flower's runtime allows.

Three parts; each writes one raw record per measurement to ``benchmarks/raw/speed-<part>/`` and prints the
table ``python -m benchmarks.report`` builds from them:

``sim``      at 20 and 100 clients (digits, pathological 2 classes per client, the 38,330-parameter cnn,
             batch 10, lr 0.005, 1 local epoch, 20 rounds, evaluation every round, 2 clients at a time:
             ``client-resources-num-cpus=1``): FedAvg and FedCAC next to a no-op Flower app
             (``benchmarks/noop_app``: a ClientApp that replies at once) sending the same messages to the same
             number of nodes, with the model's arrays each way (the cnn's state: 16 arrays, 38,428 floats, as
             FedAvg sends; Flower serialises every array of a record on its own).  Median and mean seconds per round,
             the first round, the whole ``flwr run`` wall time, and the ratio
             round / (no-op round + the clients' own compute per round / clients at a time).
``deploy``   a loopback deployment (``python -m deploy.local_cluster``: TLS, node authentication) of 2 and 4
             nodes, 4 rounds: seconds per round and the per-message breakdown (``message-timing`` in
             rounds.json), next to ``python -c "import torch, flwr"`` timed in the same run; 2 nodes once
             more with Flower's default task poll interval (1 s) to show what the setting buys.
``compose``  the docker-compose demo (``deploy/docker/run_demo.sh``): seconds from its start to the end of
             round 1, and per round after that (from the run's progress lines).  Without an image registry,
             build a local base first and name it: ``PFLOWER_BASE=pflower-base:local`` (deploy/docker/README.md);
             the record says which images ran.

Reproduce: python -m benchmarks.speed sim deploy compose       (about 30 minutes on 2 cores)
"""

from __future__ import annotations

import json
import math
import os
import re
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
from benchmarks.running import measurement_record, parser, split
from server_app.runner import CONNECTION, LocalSimulation, RunFailed, run_config_arg

NOOP_APP = BENCHMARKS / "noop_app"
REPO = BENCHMARKS.parent
#: the setting the speed target was set on
SETTING = {
    "dataset": "digits",
    "partition": "pathological",
    "classes-per-client": 2,
    "model": "cnn",
    "batch-size": 10,
    "lr": 0.005,
    "local-epochs": 1,
    "eval-every": 1,
    "seed": 0,
}
NUM_CPUS = 1  # client-resources-num-cpus: as many clients at a time as cores


def median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def workers(clients: int) -> int:
    return max(1, min(clients, (os.cpu_count() or 1) // NUM_CPUS))


def model_shapes() -> list[list[int]]:
    """The shapes of the arrays a FedAvg message of the setting carries (the cnn's state: 16 arrays): Flower
    serialises each array of a record on its own, so the no-op app sends the same arrays, not one of the same size."""
    from server_app.app import build_strategy
    from task.config import parse_settings

    state = build_strategy(parse_settings({**SETTING, "method": "fedavg"})).initial_state
    return [list(v.shape) for v in state.values()]


def noop_run(sim: LocalSimulation, clients: int, rounds: int) -> dict[str, Any]:
    """The no-op app through ``flwr run`` on the same SuperLink: per-round seconds and the wall time."""
    out_file = Path(tempfile.mkdtemp(prefix="pflower-noop-")) / "noop.json"
    shapes = model_shapes()
    cfg = {
        "num-server-rounds": rounds,
        "min-nodes": clients,
        "payload-shapes": json.dumps(shapes),
        "results-file": str(out_file),
    }
    cmd = [
        shutil.which("flwr") or "flwr",
        "run",
        str(NOOP_APP),
        CONNECTION,
        "--stream",
        "--federation-config",
        f"num-supernodes={clients} client-resources-num-cpus={NUM_CPUS}",
        "--run-config",
        run_config_arg(cfg),
    ]
    start = time.monotonic()
    proc = subprocess.run(cmd, env=sim.env, capture_output=True, text=True, timeout=3600, cwd=NOOP_APP, check=False)
    wall = time.monotonic() - start
    if proc.returncode != 0 or not out_file.exists():
        raise RunFailed(f"no-op run failed (exit {proc.returncode}):\n{(proc.stdout + proc.stderr)[-3000:]}")
    data = json.loads(out_file.read_text())
    shutil.rmtree(out_file.parent, ignore_errors=True)
    secs = [r["seconds"] for r in data["rounds"]]
    return {
        "wall-seconds": wall,
        "round-seconds": secs,
        "replies": [r["replies"] for r in data["rounds"]],
        "payload-arrays": len(shapes),
        "payload-floats": sum(math.prod(x) for x in shapes),
    }


def pflower_run(sim: LocalSimulation, method: str, clients: int, rounds: int) -> dict[str, Any]:
    cfg = {
        **SETTING,
        "method": method,
        "num-server-rounds": rounds,
        "min-nodes": clients,
        "results-dir": str(Path(tempfile.gettempdir()) / "pflower-speed-runs"),
    }
    start = time.monotonic()
    summary = sim.run(cfg, num_supernodes=clients, num_cpus=NUM_CPUS, timeout=3600)
    wall = time.monotonic() - start
    rounds_json = json.loads((Path(summary["results"]) / "rounds.json").read_text())
    secs = [r["extra"]["seconds"] for r in rounds_json]
    # the clients' own compute per round: handler time summed over the round's messages (train, and the
    # evaluation that rides on them or has its own phase), spread over the clients that run at a time
    compute = [
        sum(t.get("handler-sum", 0.0) for t in r["extra"].get("message-timing", {}).values()) / workers(clients)
        for r in rounds_json
    ]
    timing = [r["extra"].get("message-timing", {}).get("train", {}) for r in rounds_json]
    return {
        "wall-seconds": wall,
        "round-seconds": secs,
        "compute-seconds": compute,
        "run-config": cfg,
        "personal-acc": summary.get("personal-acc"),
        "global-acc": summary.get("global-acc"),
        "failures": summary.get("failures"),
        "train-message-timing": timing,
    }


def part_sim(args) -> None:
    for n in [int(c) for c in split(args.clients)]:
        with LocalSimulation() as sim:
            noop = noop_run(sim, n, args.rounds)
            write_record(measurement_record("speed-sim", {"clients": n, "app": "noop"}, noop), args.raw_dir)
            print(
                f"[sim] {n} clients, no-op: median {median(noop['round-seconds']):.3f} s per round, "
                f"{noop['wall-seconds']:.1f} s in all",
                flush=True,
            )
            for method in split(args.methods):
                try:
                    m = pflower_run(sim, method, n, args.rounds)
                except RunFailed as exc:
                    m = {"error": str(exc)[-2000:]}
                rec = measurement_record("speed-sim", {"clients": n, "app": method}, m)
                write_record(rec, args.raw_dir)
                if "error" in m:
                    print(f"[sim] {n} clients, {method}: FAILED {m['error'][-300:]}", flush=True)
                    continue
                ratio = statistics.median(m["round-seconds"]) / (
                    statistics.median(noop["round-seconds"]) + statistics.median(m["compute-seconds"])
                )
                print(
                    f"[sim] {n} clients, {method}: median {median(m['round-seconds']):.3f} s per round, "
                    f"compute {median(m['compute-seconds']):.3f} s, ratio {ratio:.2f}, "
                    f"{m['wall-seconds']:.1f} s in all",
                    flush=True,
                )
    print_section("speed-sim", args.raw_dir)


def import_reference(repeats: int = 3) -> list[float]:
    """Seconds of ``python -c "import torch, flwr"`` (the floor of a fresh ClientApp process)."""
    out = []
    for _ in range(repeats):
        start = time.monotonic()
        subprocess.run([sys.executable, "-c", "import torch, flwr"], check=True)
        out.append(time.monotonic() - start)
    return out


def deployed_run(nodes: int, rounds: int, poll: float) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="pflower-speed-deploy-"))
    cmd = [
        sys.executable,
        "-m",
        "deploy.local_cluster",
        "--nodes",
        str(nodes),
        "--rounds",
        str(rounds),
        "--workdir",
        str(work),
        "--quiet",
        "--task-poll-interval",
        f"{poll:g}",
    ]
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=3600, check=False, cwd=REPO)
    wall = time.monotonic() - start
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    report: dict[str, Any] = json.loads(lines[-1]) if lines else {"ok": False, "error": proc.stderr[-2000:]}
    out: dict[str, Any] = {
        "wall-seconds": wall,
        "ok": report.get("ok"),
        "task-poll-interval": poll,
        "error": report.get("error"),
    }
    if report.get("results"):
        rj = json.loads((Path(report["results"]) / "rounds.json").read_text())
        out["round-seconds"] = [r["extra"]["seconds"] for r in rj]
        out["message-timing"] = [r["extra"].get("message-timing", {}) for r in rj]
        out["personal-acc"] = report.get("accuracy")
    shutil.rmtree(work, ignore_errors=True)
    return out


def part_deploy(args) -> None:
    ref = import_reference()
    write_record(measurement_record("speed-deploy", {"what": "import-torch-flwr"}, {"seconds": ref}), args.raw_dir)
    print(f"[deploy] python -c 'import torch, flwr': median {median(ref):.2f} s", flush=True)
    cells = [(n, 0.1) for n in (int(c) for c in split(args.nodes))] + [(2, 1.0)]
    for n, poll in cells:
        m = deployed_run(n, args.deploy_rounds, poll)
        write_record(measurement_record("speed-deploy", {"nodes": n, "task-poll-interval": poll}, m), args.raw_dir)
        secs = m.get("round-seconds") or []
        print(
            f"[deploy] {n} nodes, task poll {poll:g} s: {'ok' if m['ok'] else 'FAILED ' + str(m['error'])[-300:]}; "
            f"median {median(secs) or float('nan'):.1f} s per round, {m['wall-seconds']:.0f} s in all",
            flush=True,
        )
    print_section("speed-deploy", args.raw_dir)


ROUND_DONE = re.compile(r"round (\d+)/(\d+) done")


def part_compose(args) -> None:
    script = REPO / "deploy" / "docker" / "run_demo.sh"
    if shutil.which("docker") is None:
        print("[compose] skipped: no docker on this machine (apt-get install docker.io)")
        return
    start = time.monotonic()
    proc = subprocess.Popen(["bash", str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    done: dict[int, float] = {}
    tail: list[str] = []
    assert proc.stdout is not None  # stdout=PIPE
    for line in proc.stdout:
        tail = ([*tail, line])[-40:]
        found = ROUND_DONE.search(line)
        if found and int(found.group(1)) not in done:
            done[int(found.group(1))] = time.monotonic() - start
    code = proc.wait()
    total = time.monotonic() - start
    rounds = sorted(done)
    per_round = [done[r] - done[r - 1] for r in rounds if r - 1 in done]
    m = {
        "exit": code,
        "wall-seconds": total,
        "to-first-round-end": done.get(1),
        "round-seconds": per_round,
        "rounds": len(rounds),
        "error": None if code == 0 else "".join(tail)[-2000:],
        # run_demo.sh's images: Flower's published ones unless PFLOWER_BASE names a local base
        "base-image": os.environ.get("PFLOWER_BASE") or "Flower's published images",
    }
    write_record(measurement_record("speed-compose", {"what": "run_demo"}, m), args.raw_dir)
    print(
        f"[compose] exit {code}: round 1 ends {done.get(1)} s after the start; per round {per_round}; "
        f"{total:.0f} s in all",
        flush=True,
    )
    print_section("speed-compose", args.raw_dir)


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("parts", nargs="+", choices=["sim", "deploy", "compose"])
    ap.add_argument("--clients", default="20,100", help="sim: client counts (default 20,100)")
    ap.add_argument("--methods", default="fedavg,fedcac", help="sim: pflower methods (default fedavg,fedcac)")
    ap.add_argument("--rounds", type=int, default=20, help="sim: rounds (default 20)")
    ap.add_argument("--nodes", default="2,4", help="deploy: node counts (default 2,4)")
    ap.add_argument("--deploy-rounds", type=int, default=4, help="deploy: rounds (default 4)")
    args = ap.parse_args()
    for part in args.parts:
        {"sim": part_sim, "deploy": part_deploy, "compose": part_compose}[part](args)


if __name__ == "__main__":
    main()

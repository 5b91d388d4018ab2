"""Speed and scale of every method through Flower's simulation runtime (issue 9).

Three parts, each printing a table and writing JSON to benchmarks/out/:

``overhead``  every method on digits at 10 and 50 clients: seconds per round split into local training,
              method-specific client work (influence, masks, bids, index), server work and the rest
              (Flower messaging, scheduling, process dispatch); bytes down/up per client per round; peak
              memory of the server and of the largest client process; and the ratio of a whole round to
              the pure local training it contains.  The floor is sum(client training) / workers, since
              the simulation runs ``workers`` clients at a time (one per core with client-resources-num-cpus=1).
``floor``     FedAvg at 10 clients on a workload where one client's local training takes about a second:
              the round against its local training (target: within 1.5x).
``scale``     FedAvg, FedCAC and FedC2I (c2i-peers=5) at 10, 100 and 1,000 clients (softmax model, a few
              samples each, every client trains every round): seconds per round and memory.
``kernels``   the server-side work that is quadratic in clients, timed at 1,000 clients in-process:
              FedCAC's mask overlap and customized models, Client2Vec's similarity and sampling,
              pFedLIA's OPTICS on a 1,000 x 1,000 influence matrix.

Reproduce: python benchmarks/scale.py overhead floor scale kernels     (all; about an hour on 2 cores)
           python benchmarks/scale.py kernels                           (seconds)
Per-round numbers are medians over the rounds after the first (which pays for process start-up) that have no
evaluation phase (overhead: 4 rounds, evaluation in the last; pFedLIA 5, its clustering round included).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from server_app.runner import LocalSimulation  # noqa: E402

OUT = Path(__file__).parent / "out"
WORKERS = max(1, os.cpu_count() or 1)  # one client per core (client-resources-num-cpus=1)

METHODS = {
    "local": {}, "fedavg": {}, "fedprox": {}, "fedper": {}, "fedrep": {}, "fedrod": {}, "ditto": {},
    "fedcac": {}, "fedc2i": {"c2i-peers": 5}, "pfedlia": {"warmup-rounds": 1, "lazy-epochs": 2},
    "cfl": {}, "pifl": {"slots-performance": 2}, "ifca": {}, "fedsoft": {"fedsoft-clients-per-cluster": 3},
    "client2vec": {"c2v-encoder": "synthetic", "c2v-ign-epochs": 2, "fraction-train": 0.5},
    "moon": {},
}


def round_stats(folder: Path) -> dict:
    """Median per-round split of one run's rounds.json (rounds after the first)."""
    rounds = json.loads((folder / "rounds.json").read_text())
    later = rounds[1:] or rounds
    # rounds without an evaluation phase, when there are any: the split is then of training rounds only
    later = [r for r in later if not r.get("evaluate", {}).get("num-replies")] or later
    rows = []
    for r in later:
        t, e = r["train"], r["extra"]
        n = max(1, int(t.get("num-replies", 0)))
        train_sum = t.get("time-train", 0.0) * n
        method_sum = t.get("time-method", 0.0) * n
        seconds = e.get("seconds") or 0.0
        server = e.get("server-seconds", 0.0)
        comm = e.get("comm", {})
        down = sum(v for k, v in comm.items() if k.endswith("bytes-down")) / n
        up = sum(v for k, v in comm.items() if k.endswith("bytes-up")) / n
        floor = train_sum / min(WORKERS, n)
        rows.append({
            "seconds": seconds, "local-train": floor, "method-client": method_sum / min(WORKERS, n),
            "server": server, "rest": seconds - floor - method_sum / min(WORKERS, n) - server,
            "ratio": seconds / floor if floor > 0 else None, "bytes-down": down, "bytes-up": up,
            "server-rss-mb": e.get("server-peak-rss-mb"), "client-rss-mb": t.get("peak-rss-mb-max"),
            "train-seconds-per-client": t.get("time-train"), "clients": n,
        })
    return {k: (float(np.median([r[k] for r in rows if r[k] is not None])) if any(r[k] is not None for r in rows) else None)
            for k in rows[0]}


def run(sim: LocalSimulation, cfg: dict, clients: int) -> dict:
    t0 = time.time()
    s = sim.run(cfg, num_supernodes=clients, timeout=7200)
    stats = round_stats(Path(s["results"]))
    stats["wall"] = time.time() - t0
    return stats


def table(rows: list[dict], title: str) -> None:
    print(f"\n{title}")
    print("| method | clients | s / round | local training (floor) | method client work | server | rest (Flower, dispatch) "
          "| round / floor | KB down / client | KB up / client | server peak MB | client peak MB |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    f = lambda v, d=2: "—" if v is None else f"{v:.{d}f}"  # noqa: E731
    for r in rows:
        print(f"| {r['method']} | {r['n']} | {f(r['seconds'])} | {f(r['local-train'])} | {f(r['method-client'])} | "
              f"{f(r['server'])} | {f(r['rest'])} | {f(r['ratio'])} | {f(r['bytes-down'] / 1e3, 1)} | "
              f"{f(r['bytes-up'] / 1e3, 1)} | {f(r['server-rss-mb'], 0)} | {f(r['client-rss-mb'], 0)} |")


def part_overhead(args) -> list[dict]:
    rows = []
    base = {"dataset": "digits", "partition": "dirichlet", "num-server-rounds": 4, "eval-every": 4,
            "local-epochs": 2, "val-fraction": 0.2, "model": "cnn"}
    with LocalSimulation() as sim:
        for n in (10, 50):
            for m in args.methods.split(","):
                cfg = {**base, "method": m, "min-nodes": n, **METHODS[m]}
                if m == "pfedlia":  # warm-up round 1, clustering round 2, clustered rounds 3-5
                    cfg["num-server-rounds"] = cfg["eval-every"] = 5
                rows.append({"method": m, "n": n, **run(sim, cfg, n)})
                print(f"  {m} @ {n}: {rows[-1]['seconds']:.2f} s / round, ratio {rows[-1]['ratio']}", flush=True)
    table(rows, f"every method, digits, cnn, 2 local epochs, Dirichlet 0.5 ({WORKERS} workers)")
    return rows


def part_floor(args) -> list[dict]:
    """FedAvg at 10 clients where one client's training takes about a second."""
    rows = []
    with LocalSimulation() as sim:
        cfg = {"method": "fedavg", "dataset": "digits", "partition": "iid", "model": "cnn", "data-copies": 4,
               "local-epochs": args.floor_epochs, "num-server-rounds": 6, "eval-every": 6, "min-nodes": 10}
        rows.append({"method": "fedavg", "n": 10, **run(sim, cfg, 10)})
    table(rows, f"FedAvg, 10 clients, about 1 s of local training each ({args.floor_epochs} epochs on ~500 samples)")
    r = rows[0]
    print(f"one client's local training: {r['train-seconds-per-client']:.2f} s; round {r['seconds']:.2f} s vs floor "
          f"{r['local-train']:.2f} s = {r['ratio']:.2f}x (target <= 1.5x)")
    return rows


def part_scale(args) -> list[dict]:
    rows = []
    sizes = [int(x) for x in args.sizes.split(",")]
    with LocalSimulation() as sim:
        chosen = args.scale_methods.split(",")
        for m, extra in [x for x in (("fedavg", {}), ("fedcac", {}), ("fedc2i", {"c2i-peers": 5})) if x[0] in chosen]:
            for n in sizes:
                copies = max(1, int(np.ceil(n * 12 / 1797)))  # ~12 samples per client
                cfg = {"method": m, "dataset": "digits", "partition": "iid", "model": "softmax", "data-copies": copies,
                       "local-epochs": 1, "num-server-rounds": 3, "eval-every": 3, "min-nodes": n,
                       "test-fraction": 0.2, "val-fraction": 0.0, "round-timeout": 7200.0, **extra}
                rows.append({"method": m, "n": n, **run(sim, cfg, n)})
                print(f"  {m} @ {n}: {rows[-1]['seconds']:.2f} s / round, server {rows[-1]['server-rss-mb']} MB, "
                      f"wall {rows[-1]['wall']:.0f} s", flush=True)
    table(rows, "scaling: every client trains every round, softmax model, ~12 samples per client")
    for m in ("fedavg", "fedcac", "fedc2i"):
        sel = sorted((r["n"], r["seconds"]) for r in rows if r["method"] == m)
        if len(sel) > 1:
            per_client = [s / n for n, s in sel]
            print(f"{m}: seconds per participating client per round " + ", ".join(
                f"{n}: {p * 1000:.1f} ms" for (n, _), p in zip(sel, per_client)))
    return rows


def part_kernels(args) -> list[dict]:
    import torch

    from strategies.client2vec_math import C2VServerState
    from strategies.fedcac_math import customized_models, mask_overlap
    from task.models import build_model

    torch.set_num_threads(1)
    rows = []
    m = 1000
    rng = np.random.default_rng(0)
    n_params = sum(p.numel() for p in build_model("cnn", 1, 8, 10).parameters())
    masks = rng.random((m, n_params)) < 0.5

    def timed(name, fn, repeat=3):
        best = min((lambda t0: (fn(), time.perf_counter() - t0)[1])(time.perf_counter()) for _ in range(repeat))
        rows.append({"kernel": name, "clients": m, "seconds": best})
        print(f"  {name}: {best:.3f} s", flush=True)

    timed(f"FedCAC mask overlap ({m} x {m}, {n_params} params)", lambda: mask_overlap(masks))
    params = rng.standard_normal((m, n_params)).astype(np.float32)
    collab = [np.sort(rng.choice(m, 50, replace=False)) for _ in range(m)]
    timed(f"FedCAC customized models ({m} clients x 50 collaborators)", lambda: customized_models(params, collab))
    bf, bl = rng.standard_normal((m, 512)), rng.standard_normal((m, 512))
    timed(f"Client2Vec index similarity + 20 sampling rounds ({m} clients)", lambda: _c2v(C2VServerState, bf, bl, m))
    from sklearn.cluster import OPTICS

    infl = rng.standard_normal((m, m))
    timed(f"pFedLIA OPTICS on the {m} x {m} influence matrix", lambda: OPTICS(min_samples=5).fit(infl), repeat=1)
    print("\n| server kernel | clients | seconds |\n|---|---|---|")
    for r in rows:
        print(f"| {r['kernel']} | {r['clients']} | {r['seconds']:.3f} |")
    return rows


def _c2v(cls, bf, bl, m):
    st = cls(bf, bl, np.full(m, 10.0), tau=0.5)
    for t in range(1, 21):
        st.observe(st.sample(t, m // 10, True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("parts", nargs="+", choices=["overhead", "floor", "scale", "kernels"])
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--sizes", default="10,100,1000")
    ap.add_argument("--scale-methods", default="fedavg,fedcac,fedc2i")
    ap.add_argument("--floor-epochs", type=int, default=10)
    args = ap.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB, Python {platform.python_version()}")
    OUT.mkdir(parents=True, exist_ok=True)
    for part in args.parts:
        rows = globals()[f"part_{part}"](args)
        (OUT / f"scale_{part}.json").write_text(json.dumps(rows, indent=1))
    print(f"\ncommand: python benchmarks/scale.py {' '.join(sys.argv[1:])}")


if __name__ == "__main__":
    main()

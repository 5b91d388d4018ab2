"""Baselines on digits: does personalization pay where it should, and not where it should not?

Runs every method through Flower (a private simulation SuperLink, ``flwr run``) and prints a table of the
final personalized accuracy (each client's own model on its own test split, mean over clients) and the
global model's accuracy where one exists, with mean and std over seeds.

Expected (issue 2): on pathological 2 classes/client, Local and FedPer/FedRep beat FedAvg's global model;
on IID, FedAvg's global model beats Local.

Reproduce:  python benchmarks/baselines.py            (about 10 minutes on 2 cores)
            python benchmarks/baselines.py --rounds 5 --methods local,fedavg --partitions iid   (quick)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from server_app.runner import LocalSimulation  # noqa: E402

PARTITIONS = {
    "pathological": {"partition": "pathological", "classes-per-client": 2},
    "iid": {"partition": "iid"},
    "dirichlet-0.5": {"partition": "dirichlet", "alpha": 0.5},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--methods", default="local,fedavg,fedprox,fedper,fedrep,fedrod,ditto")
    ap.add_argument("--partitions", default="pathological,iid")
    ap.add_argument("--clients", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--seeds", default="0")
    ap.add_argument("--noise-std", type=float, default=0.0, help="fixed Gaussian pixel noise (0.7 makes digits harder)")
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "baselines.json"))
    args = ap.parse_args()
    methods, partitions = args.methods.split(","), args.partitions.split(",")
    seeds = [int(s) for s in args.seeds.split(",")]
    rows = []
    t0 = time.time()
    with LocalSimulation() as sim:
        total = len(methods) * len(partitions) * len(seeds)
        done = 0
        for part in partitions:
            for method in methods:
                for seed in seeds:
                    cfg = {"method": method, "num-server-rounds": args.rounds, "seed": seed,
                           "min-nodes": args.clients, "noise-std": args.noise_std, **PARTITIONS[part]}
                    s = sim.run(cfg, num_supernodes=args.clients)
                    done += 1
                    print(f"[{done}/{total}] {part:13s} {method:8s} seed {seed}: personalized "
                          f"{s['personal-acc']:.4f} global {s['global-acc'] if s['global-acc'] is None else round(s['global-acc'], 4)}"
                          f" ({s['seconds']:.0f} s, {time.time() - t0:.0f} s total)", flush=True)
                    rows.append({"partition": part, "method": method, "seed": seed,
                                 **{k: s[k] for k in ("personal-acc", "global-acc", "seconds", "results")}})
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1))
    print()
    print(f"digits (noise-std {args.noise_std}), {args.clients} clients, {args.rounds} rounds, seeds {seeds}; accuracy on each client's own test split, "
          "mean over clients (mean ± std over seeds)")
    print(f"| partition | method | personalized acc | global-model acc |")
    print(f"|---|---|---|---|")

    def fmt(vals):
        vals = [v for v in vals if v is not None]
        return "—" if not vals else f"{np.mean(vals):.4f} ± {np.std(vals):.4f}"

    for part in partitions:
        for method in methods:
            sel = [r for r in rows if r["partition"] == part and r["method"] == method]
            print(f"| {part} | {method} | {fmt([r['personal-acc'] for r in sel])} | {fmt([r['global-acc'] for r in sel])} |")
    print(f"\nwrote {args.out}; command: python benchmarks/baselines.py {' '.join(sys.argv[1:])}")


if __name__ == "__main__":
    main()

"""FedCAC against Local, FedAvg, FedPer, FedRep and Ditto on noisy digits (spec fedcac §8).

Digits with fixed Gaussian pixel noise (std 0.7), 20 clients, 40 % of each client's data held out for
testing (class proportions as in its training data), SGD lr 0.05 momentum 0.9, 5 local epochs, batch 20;
FedCAC tau 0.5, beta = rounds / 2.  Accuracy: each client's model on its own test split, mean over
clients, at the last round (FedCAC: after Eq. 11, the headline of spec §6.9), mean ± std over seeds.

Reproduce: python benchmarks/fedcac.py                       (54 runs; about 35 minutes on 2 cores)
           python benchmarks/fedcac.py --seeds 0 --rounds 10  (quick look)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import print_table, run_grid  # noqa: E402

PARTITIONS = {
    "pathological": {"partition": "pathological", "classes-per-client": 2},
    "dirichlet-0.5": {"partition": "dirichlet", "alpha": 0.5},
    "dirichlet-1.0": {"partition": "dirichlet", "alpha": 1.0},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--partitions", default=",".join(PARTITIONS))
    ap.add_argument("--methods", default="local,fedavg,fedper,fedrep,ditto,fedcac")
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "fedcac.json"))
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    base = {"noise-std": 0.7, "test-fraction": 0.4, "val-fraction": 0.0, "lr": 0.05, "momentum": 0.9,
            "local-epochs": 5, "batch-size": 20, "num-server-rounds": args.rounds,
            "tau": 0.5, "beta": max(1, args.rounds // 2)}
    partitions = {k: PARTITIONS[k] for k in args.partitions.split(",")}
    methods = {m: {"method": m} for m in args.methods.split(",")}
    rows = run_grid(partitions, methods, seeds, base, args.clients, Path(args.out))
    print(f"\nnoisy digits (std 0.7), {args.clients} clients, {args.rounds} rounds, 5 local epochs, seeds {seeds}; "
          "final-round accuracy, mean ± std over seeds")
    print_table(rows, list(partitions), list(methods))
    print(f"\nwrote {args.out}; command: python benchmarks/fedcac.py {' '.join(sys.argv[1:])}")


if __name__ == "__main__":
    main()

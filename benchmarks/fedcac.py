"""FedCAC against Local, FedAvg, FedPer, FedRep and Ditto on noisy digits (fedcac.md §8).

Digits with fixed Gaussian pixel noise (std 0.7), 20 clients, 40 % of each client's data held out for
testing (class proportions as in its training data), SGD lr 0.05 momentum 0.9, 5 local epochs, batch 20;
FedCAC tau 0.5, beta = rounds / 2.  Accuracy: each client's model on its own test split, mean over
clients, at the last round (FedCAC: after Eq. 11, the headline of fedcac.md §6.9), mean ± std over seeds.
One raw record per run goes to ``benchmarks/raw/fedcac/``; the table is ``python -m benchmarks.report``'s.

Reproduce: python -m benchmarks.fedcac                       (54 runs; about 35-70 minutes on 2 cores)
           python -m benchmarks.fedcac --seeds 0 --rounds 10 --raw-dir /tmp/raw  (quick look)
"""

from __future__ import annotations

from typing import Any

from benchmarks.reporting import print_section
from benchmarks.running import parser, product, run_grid, split

PARTITIONS: dict[str, dict[str, Any]] = {
    "pathological": {"partition": "pathological", "classes-per-client": 2},
    "dirichlet-0.5": {"partition": "dirichlet", "alpha": 0.5},
    "dirichlet-1.0": {"partition": "dirichlet", "alpha": 1.0},
}


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--partitions", default=",".join(PARTITIONS))
    ap.add_argument("--methods", default="local,fedavg,fedper,fedrep,ditto,fedcac")
    args = ap.parse_args()
    base = {
        "noise-std": 0.7,
        "test-fraction": 0.4,
        "val-fraction": 0.0,
        "lr": 0.05,
        "momentum": 0.9,
        "local-epochs": 5,
        "batch-size": 20,
        "num-server-rounds": args.rounds,
        "tau": 0.5,
        "beta": max(1, args.rounds // 2),
    }
    axes: dict[str, dict[str, dict]] = {
        "partition": {p: PARTITIONS[p] for p in split(args.partitions)},
        "method": {m: {"method": m} for m in split(args.methods)},
    }
    run_grid("fedcac", product(axes, [int(s) for s in split(args.seeds)], base), args.clients, args.raw_dir)
    print_section("fedcac", args.raw_dir)


if __name__ == "__main__":
    main()

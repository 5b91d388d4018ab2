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
from benchmarks.running import Declared, method_axis

PARTITIONS: dict[str, dict[str, Any]] = {
    "pathological": {"partition": "pathological", "classes-per-client": 2},
    "dirichlet-0.5": {"partition": "dirichlet", "alpha": 0.5},
    "dirichlet-1.0": {"partition": "dirichlet", "alpha": 1.0},
}
SPEC = Declared(
    "fedcac",
    axes={"partition": PARTITIONS, "method": method_axis},
    defaults={"clients": 20, "methods": "local,fedavg,fedper,fedrep,ditto,fedcac"},
    base={
        "noise-std": 0.7,
        "test-fraction": 0.4,
        "val-fraction": 0.0,
        "lr": 0.05,
        "momentum": 0.9,
        "local-epochs": 5,
        "batch-size": 20,
        "tau": 0.5,
    },
)


def main() -> None:
    args = SPEC.parse(SPEC.parser(__doc__))
    SPEC.run(args, SPEC.cells(args, beta=max(1, args.rounds // 2)))
    print_section("fedcac", args.raw_dir)


if __name__ == "__main__":
    main()

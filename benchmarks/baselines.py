"""Baselines on digits: does personalization pay where it should, and not where it should not?

Runs every method through Flower (a private simulation SuperLink, ``flwr run``), writes one raw record per
run to ``benchmarks/raw/baselines-<grid>/`` and prints the table ``python -m benchmarks.report`` builds from them:
final personalized accuracy (each client's own model on its own test split, mean over clients) and the global
model's accuracy where one exists, mean and std over seeds.

Expected: on pathological 2 classes/client, Local and FedPer/FedRep beat FedAvg's global model;
on IID, FedAvg's global model beats Local.

Grids (``--grid``; any option below overrides the grid's value):
  clean   clean digits, 7 methods, pathological + IID, seed 0          (14 runs, about 10 minutes on 2 cores)
  noisy   Gaussian pixel noise 0.7, local/fedavg/fedper/fedrep/ditto, seeds 0-2   (30 runs, about 20 minutes)

Reproduce:  python -m benchmarks.baselines --grid clean
            python -m benchmarks.baselines --grid noisy
            python -m benchmarks.baselines --rounds 5 --methods local,fedavg --partitions iid \
                --raw-dir /tmp/raw  (quick)
"""

from __future__ import annotations

from typing import Any

from benchmarks.reporting import print_section
from benchmarks.running import Declared, method_axis

PARTITIONS: dict[str, dict[str, Any]] = {
    "pathological": {"partition": "pathological", "classes-per-client": 2},
    "iid": {"partition": "iid"},
    "dirichlet-0.5": {"partition": "dirichlet", "alpha": 0.5},
}
SPEC = Declared(
    "baselines",
    defaults={"clients": 10},
    axes={"partition": PARTITIONS, "method": method_axis},
    presets={
        "clean": {
            "grid": "baselines-clean",
            "methods": "local,fedavg,fedprox,fedper,fedrep,fedrod,ditto",
            "partitions": "pathological,iid",
            "seeds": "0",
            "noise_std": 0.0,
        },
        "noisy": {
            "grid": "baselines-noisy",
            "methods": "local,fedavg,fedper,fedrep,ditto",
            "partitions": "pathological,iid",
            "seeds": "0,1,2",
            "noise_std": 0.7,
        },
    },
)


def main() -> None:
    ap = SPEC.parser(__doc__)
    ap.add_argument("--noise-std", type=float, help="fixed Gaussian pixel noise (0.7 makes digits harder)")
    args = SPEC.parse(ap)
    SPEC.run(args, SPEC.cells(args, **{"noise-std": args.noise_std}))
    print_section(args.grid_name, args.raw_dir)


if __name__ == "__main__":
    main()

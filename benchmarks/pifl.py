"""PI-FL on two-source data: synthetic concept shift (10:90, 30:70) and digits mixtures (10:90, 30:70,
linear, random), against FedAvg, IFCA, FedSoft and PI-FL(NI) (random bids).

``python -m benchmarks.report`` prints, from one raw record per run (``benchmarks/raw/pifl/``): personalized
accuracy (``personal-acc``: each client's model on its goal data; FedAvg: the global model on the same data)
as mean and std over seeds, the paired difference to FedAvg (per seed on the same data: mean, std, wins;
refused when the runs' data fingerprints disagree); per tier, its members' mean share of source A at the
last round (how well tiers specialise: near 0.9 / 0.1 on 10:90 means one tier per source); and the
tier-level table of the paper's Tables 1-2: each tier (cluster) model's accuracy on the source A and
source B holdouts at the last round (PI-FL, PI-FL(NI), IFCA, FedSoft).

Reproduce: python -m benchmarks.pifl              (3 seeds, 90 runs; about 70 minutes on 2 cores)
           python -m benchmarks.pifl --seeds 0 --partitions synth-10:90,digits-10:90 --raw-dir /tmp/raw  (reduced)
"""

from __future__ import annotations

from benchmarks.reporting import print_section
from benchmarks.running import Declared

PARTITIONS = {
    "synth-10:90": {"dataset": "synth-concept", "mixture": "10:90"},
    "synth-30:70": {"dataset": "synth-concept", "mixture": "30:70"},
    "digits-10:90": {"mixture": "10:90"},
    "digits-30:70": {"mixture": "30:70"},
    "digits-linear": {"mixture": "linear"},
    "digits-random": {"mixture": "random"},
}
METHODS = {
    "fedavg": {"method": "fedavg"},
    "ifca": {"method": "ifca"},
    "fedsoft": {"method": "fedsoft"},
    "pifl": {"method": "pifl"},
    "pifl-ni": {"method": "pifl-ni"},
}


SPEC = Declared(
    "pifl",
    defaults={"clients": 20, "rounds": 15},
    axes={"partition": PARTITIONS, "method": METHODS},
    base={
        "partition": "two-source",
        "local-epochs": 2,
        "val-fraction": 0.2,
        "slots-performance": 4,
        "slots-random": 1,
    },
)


def main() -> None:
    args = SPEC.parse(SPEC.parser(__doc__))
    SPEC.run(args)
    print_section("pifl", args.raw_dir)


if __name__ == "__main__":
    main()

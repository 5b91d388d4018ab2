"""FedC2I on feature-shift digits (5 domains, one client each; spec fedc2i §8 "Digit-5-lite" stand-in).

Domains: original, inverted, rotated, noisy, shifted (task.data.DOMAINS), IID labels, the c2i-small CNN,
Adam lr 1e-3, 2 local epochs, batch 32, 20 rounds.  Same protocol for every method (spec §6.12/§8):
``personal-acc`` is each client's own model on its own test split; for FedAvg/FedProx that is the global
model, so ``trained-acc`` (the model right after local training, "FedAvg + fine-tuning") is printed too —
about half of a personalized method's edge over FedAvg comes from that protocol difference alone.

Reproduce: python benchmarks/fedc2i.py              (24 runs, about 15 minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import print_table, run_grid  # noqa: E402

METHODS = {
    "local": {"method": "local"},
    "fedavg": {"method": "fedavg"},
    "fedprox": {"method": "fedprox", "proximal-mu": 0.01},
    "fedrep": {"method": "fedrep"},
    "fedrod": {"method": "fedrod"},
    "fedc2i": {"method": "fedc2i", "gamma": 5.0},
    "lambda-only": {"method": "fedc2i", "gamma": 5.0, "c2i-variant": "lambda-only"},
    "Lambda-only": {"method": "fedc2i", "gamma": 5.0, "c2i-variant": "Lambda-only"},
}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "fedc2i.json"))
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    base = {"partition": "iid", "feature-shift": 5, "model": "c2i-small", "optimizer": "adam", "lr": 0.001,
            "local-epochs": 2, "batch-size": 32, "num-server-rounds": args.rounds}
    methods = {m: METHODS[m] for m in args.methods.split(",")}
    keys = ("personal-acc", "trained-acc", "global-acc")
    rows = run_grid({"feature-shift-5": {}}, methods, seeds, base, 5, Path(args.out), keys)
    print(f"\nfeature-shift digits, 5 clients (one domain each), {args.rounds} rounds, seeds {seeds}; "
          "final-round accuracy, mean ± std over seeds")
    print_table(rows, ["feature-shift-5"], list(methods), keys)
    print(f"\nwrote {args.out}; command: python benchmarks/fedc2i.py {' '.join(sys.argv[1:])}")


if __name__ == "__main__":
    main()

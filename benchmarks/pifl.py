"""PI-FL on two-source data: synthetic concept shift (10:90, 30:70) and digits mixtures (10:90, 30:70,
linear, random), against FedAvg, IFCA and PI-FL(NI) (random bids).

Prints personalized accuracy (each client's one-shot mixture on its goal data, held-out half; FedAvg: the
global model on the same data) and, per tier, its members' mean share of source A at the last round (how
well tiers specialise: near 0.9 / 0.1 on 10:90 means one tier per source).  FedSoft is not implemented yet.

Reproduce: python benchmarks/pifl.py              (3 seeds; about 40 minutes on 2 cores)
           python benchmarks/pifl.py --seeds 0 --partitions synth-10:90,digits-10:90   (reduced)
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import fmt, run_grid  # noqa: E402

PARTITIONS = {
    "synth-10:90": {"dataset": "synth-concept", "mixture": "10:90"},
    "synth-30:70": {"dataset": "synth-concept", "mixture": "30:70"},
    "digits-10:90": {"mixture": "10:90"}, "digits-30:70": {"mixture": "30:70"},
    "digits-linear": {"mixture": "linear"}, "digits-random": {"mixture": "random"},
}
METHODS = {"fedavg": {"method": "fedavg"}, "ifca": {"method": "ifca"}, "pifl": {"method": "pifl"},
           "pifl-ni": {"method": "pifl-ni"}}


def tier_shares(folder: str) -> list[float]:
    path = Path(folder) / "pifl_ledger.json"
    if not path.exists():
        return []
    last = json.loads(path.read_text())["rounds"][-1]["tiers"]
    return sorted(t["source-a-share"] for t in last.values() if t["source-a-share"] is not None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--partitions", default=",".join(PARTITIONS))
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "pifl.json"))
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    base = {"partition": "two-source", "num-server-rounds": args.rounds, "local-epochs": 2, "val-fraction": 0.2,
            "slots-performance": 4, "slots-random": 1}
    partitions = {k: PARTITIONS[k] for k in args.partitions.split(",")}
    methods = {m: METHODS[m] for m in args.methods.split(",")}
    rows = run_grid(partitions, methods, seeds, base, args.clients, Path(args.out))
    for r in rows:
        r["tier-source-a-shares"] = tier_shares(r["results"])
    Path(args.out).write_text(json.dumps(rows, indent=1))
    print(f"\ntwo-source data, {args.clients} clients, {args.rounds} rounds, seeds {seeds}")
    print("| data / mixture | method | personalized acc | tier source-A shares (last round, mean over seeds) |")
    print("|---|---|---|---|")
    for part in partitions:
        for m in methods:
            sel = [r for r in rows if r["partition"] == part and r["method"] == m]
            shares = [r["tier-source-a-shares"] for r in sel if r["tier-source-a-shares"]]
            tiers = "—" if not shares else " / ".join(f"{v:.2f}" for v in np.mean(np.array(shares), axis=0))
            print(f"| {part} | {m} | {fmt([r['personal-acc'] for r in sel])} | {tiers} |")
    print(f"\nwrote {args.out}; command: python benchmarks/pifl.py {' '.join(sys.argv[1:])}")


if __name__ == "__main__":
    main()

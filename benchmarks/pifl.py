"""PI-FL on two-source data: synthetic concept shift (10:90, 30:70) and digits mixtures (10:90, 30:70,
linear, random), against FedAvg, IFCA and PI-FL(NI) (random bids).

Prints personalized accuracy (each client's one-shot mixture on its goal data, held-out half; FedAvg: the
global model on the same data) and, per tier, its members' mean share of source A at the last round (how
well tiers specialise: near 0.9 / 0.1 on 10:90 means one tier per source), and the tier-level table of the
paper's Tables 1-2: each tier (cluster) model's accuracy on the source A and source B holdouts at the
last round (PI-FL, PI-FL(NI), IFCA, FedSoft).

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
METHODS = {"fedavg": {"method": "fedavg"}, "ifca": {"method": "ifca"}, "fedsoft": {"method": "fedsoft"},
           "pifl": {"method": "pifl"}, "pifl-ni": {"method": "pifl-ni"}}


def tier_table(folder: str) -> list[dict]:
    """Last round's [{A: acc, B: acc}] per tier, tiers ordered by their accuracy on A (best first)."""
    rounds = json.loads((Path(folder) / "rounds.json").read_text())
    tables = [r["extra"]["tier-table"] for r in rounds if r["extra"].get("tier-table")]
    return sorted(tables[-1], key=lambda t: -t["A"]) if tables else []


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
        r["tier-table"] = tier_table(r["results"])
    Path(args.out).write_text(json.dumps(rows, indent=1))
    print(f"\ntwo-source data, {args.clients} clients, {args.rounds} rounds, seeds {seeds}")
    print("| data / mixture | method | personalized acc | tier source-A shares (last round, mean over seeds) | "
          "tier accuracy on source A / B holdouts (tiers ordered by A accuracy; mean over seeds) |")
    print("|---|---|---|---|---|")
    for part in partitions:
        for m in methods:
            sel = [r for r in rows if r["partition"] == part and r["method"] == m]
            shares = [r["tier-source-a-shares"] for r in sel if r["tier-source-a-shares"]]
            tiers = "—" if not shares else " / ".join(f"{v:.2f}" for v in np.mean(np.array(shares), axis=0))
            tables = [r["tier-table"] for r in sel if r["tier-table"]]
            table = "—"
            if tables and len({len(t) for t in tables}) == 1:
                mean = [{k: np.mean([t[i][k] for t in tables]) for k in ("A", "B")} for i in range(len(tables[0]))]
                table = "; ".join(f"θ{i}: {t['A']:.3f} / {t['B']:.3f}" for i, t in enumerate(mean))
            print(f"| {part} | {m} | {fmt([r['personal-acc'] for r in sel])} | {tiers} | {table} |")
    print(f"\nwrote {args.out}; command: python benchmarks/pifl.py {' '.join(sys.argv[1:])}")


if __name__ == "__main__":
    main()

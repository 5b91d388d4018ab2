"""Client2Vec's case studies on top of FedAvg (spec client2vec §8), paired over seeds.

Digits with 4 feature-shift domains (original, inverted, rotated, noisy; domain = client id mod 4) crossed
with Dirichlet label skew over 40 clients, 4 clients per round (10 %), 5 local epochs, SGD lr 0.05 batch
32, weight decay 5e-5, MLP (64-d features); the synthetic CLIP encoder (spec §8: random CLIP text towers
blur the label half), DSA-IGN in Global mode (FF 256, dropout 0, Adam 1e-3, ``--ign-epochs``);
tau 0.5, gamma 0.5, lambda1 1, w 1.  Arms: FedAvg, +i (sampling), +ii (aggregation), +iii (local loss),
+i+ii+iii.  Every arm of a seed shares data, split, initial model and (for the index arms) the index.

Accuracy: the global model on each client's own test split, unweighted mean over clients, best round and
last round; the paired delta is arm minus FedAvg on the same seed, "wins" counts seeds where it is > 0.
Also printed: the index phase's seconds next to one training round, and the index's domain block gap.

Reproduce: python benchmarks/client2vec.py                         (default grid, see --help)
           python benchmarks/client2vec.py --seeds 0 --rounds 10   (quick look)
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

ARMS = {
    "FedAvg": {"c2v-sampling": False, "c2v-aggregation": False, "c2v-local": False},
    "+i": {"c2v-sampling": True, "c2v-aggregation": False, "c2v-local": False},
    "+ii": {"c2v-sampling": False, "c2v-aggregation": True, "c2v-local": False},
    "+iii": {"c2v-sampling": False, "c2v-aggregation": False, "c2v-local": True},
    "+i+ii+iii": {"c2v-sampling": True, "c2v-aggregation": True, "c2v-local": True},
}
SETTINGS = {
    "4dom-a0.1": {"feature-shift": 4, "alpha": 0.1},
    "4dom-a100": {"feature-shift": 4, "alpha": 100.0},
    "1dom-a0.1": {"feature-shift": 0, "alpha": 0.1},
}


def run_one(sim: LocalSimulation, cfg: dict, clients: int) -> dict:
    s = sim.run(cfg, num_supernodes=clients)
    folder = Path(s["results"])
    rounds = json.loads((folder / "rounds.json").read_text())
    accs = [r["evaluate"].get("global-acc") for r in rounds if r["evaluate"].get("global-acc") is not None]
    info = json.loads((folder / "client2vec.json").read_text()) if (folder / "client2vec.json").exists() else {}
    train_s = [r["extra"]["seconds"] for r in rounds[1:] if r["extra"].get("seconds")]
    return {"best": max(accs), "last": accs[-1], "index-seconds": info.get("index-seconds", 0.0),
            "round-seconds": float(np.median(train_s)) if train_s else None,
            "block-gap": info.get("index-quality", {}).get("beta-f-block-gap"), "results": str(folder)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="0,1,2,3,4")
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--clients", type=int, default=40)
    ap.add_argument("--ign-epochs", type=int, default=5)
    ap.add_argument("--settings", default="4dom-a0.1")
    ap.add_argument("--arms", default=",".join(ARMS))
    ap.add_argument("--out", default=str(Path(__file__).parent / "out" / "client2vec.json"))
    args = ap.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    arms = args.arms.split(",")
    base = {"method": "client2vec", "dataset": "digits", "partition": "dirichlet", "model": "mlp",
            "num-server-rounds": args.rounds, "fraction-train": 0.1, "min-nodes": args.clients, "local-epochs": 5,
            "lr": 0.05, "momentum": 0.0, "batch-size": 32, "weight-decay": 5e-5, "c2v-encoder": "synthetic",
            "c2v-ign-epochs": args.ign_epochs, "c2v-tau": 0.5, "c2v-gamma": 0.5, "c2v-lambda1": 1.0,
            "c2v-local-weight": 1.0, "c2v-cache-dir": str(Path(args.out).parent / "c2v-cache")}
    rows, t0 = [], time.time()
    total = len(args.settings.split(",")) * len(seeds) * len(arms)
    with LocalSimulation() as sim:
        for setting in args.settings.split(","):
            for seed in seeds:
                for arm in arms:
                    cfg = {**base, **SETTINGS[setting], **ARMS[arm], "seed": seed}
                    r = {"setting": setting, "arm": arm, "seed": seed, **run_one(sim, cfg, args.clients)}
                    rows.append(r)
                    print(f"[{len(rows)}/{total}] {setting} seed {seed} {arm:10s}: best {r['best']:.4f} last "
                          f"{r['last']:.4f} (index {r['index-seconds']:.1f} s, round {r['round-seconds'] or 0:.2f} s; "
                          f"{time.time() - t0:.0f} s total)", flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(rows, indent=1))
    print(f"\ndigits, {args.clients} clients, {args.rounds} rounds, 10 % per round, seeds {seeds}; global model on "
          "each client's test split, unweighted mean; paired delta vs FedAvg (same seed)")
    print("| setting | arm | best-round acc | last-round acc | paired Δ best | wins (best) | index s | round s | β_f block gap |")
    print("|---|---|---|---|---|---|---|---|---|")
    for setting in args.settings.split(","):
        ref = {r["seed"]: r for r in rows if r["setting"] == setting and r["arm"] == "FedAvg"}
        for arm in arms:
            sel = [r for r in rows if r["setting"] == setting and r["arm"] == arm]
            best = np.array([r["best"] for r in sel])
            last = np.array([r["last"] for r in sel])
            if ref and arm != "FedAvg":
                delta = np.array([r["best"] - ref[r["seed"]]["best"] for r in sel if r["seed"] in ref])
                d = f"{delta.mean():+.4f}" if delta.size else "—"
                wins = f"{int((delta > 0).sum())}/{delta.size}" if delta.size else "—"
            else:
                d, wins = "—", "—"
            idx = np.mean([r["index-seconds"] for r in sel])
            rs = np.mean([r["round-seconds"] for r in sel if r["round-seconds"]])
            gaps = [r["block-gap"] for r in sel if r["block-gap"] is not None]
            gap = f"{np.mean(gaps):.2f}" if gaps else "—"
            print(f"| {setting} | {arm} | {best.mean():.4f} ± {best.std():.4f} | {last.mean():.4f} ± {last.std():.4f} | "
                  f"{d} | {wins} | {idx:.1f} | {rs:.2f} | {gap} |")
    print(f"\nwrote {args.out}; command: python benchmarks/client2vec.py {' '.join(sys.argv[1:])}")


if __name__ == "__main__":
    main()

"""Why FedC2I, PI-FL and FedSoft trail FedAvg or Local at the defaults a new user gets.

Every run is ``flwr run . --run-config "method='X' seed=S"`` on 10 simulated nodes (``min-nodes=10``) and nothing
else: digits, Dirichlet alpha 0.5, the ``cnn`` (BatchNorm), SGD lr 0.05 momentum 0.9, batch 20, one local epoch,
10 rounds.  Next to the five methods at their defaults (3 seeds), one-key ablations isolate what each design costs
on this data:

- ``fedc2i gamma=0``: uniform mixing instead of the sharpened leave-one-out influence (Eqs. 5, 9);
- ``fedc2i momentum=0`` and ``fedavg momentum=0``: local training without momentum;
- ``fedc2i local-epochs=2`` and ``fedavg local-epochs=2``: two local epochs per round (the paper's E);
- ``pifl slots-performance=9``: 10 slots per tier, so every bidder trains every round;
- ``pifl-ni``: PI-FL's non-incentive ablation (random bids), which trails Local by more than 2 points at the
  defaults too, with the same measurements as PI-FL;
- ``fedsoft fedsoft-clients-per-cluster=10``: every client is drawn for every centre, so every client trains
  every round.

And the one cell of the feature-shift grid where FedC2I collapses (25 training samples per client, two domains,
20 rounds: ``SMALL``), at the settings the grid ran there: Local, FedAvg and FedC2I, and FedC2I with two local
epochs or with one full batch per epoch (table ``fedc2i-small``; these five cells ran on seeds 0 and 1).

After each run the script measures, from the run's saved models and artefacts (no further training):
FedC2I's mean self-influence and largest peer weight per round; for PI-FL each client's mixture (Eq. 4), its best
single tier by validation accuracy and every tier on its test split; for FedSoft how often each client trained.
These go into the run's raw record (``analysis``), in ``benchmarks/raw/defaults-gaps/``.

The tables of docs/methods/fedc2i.md and docs/methods/pifl.md ("At the defaults on digits") are generated from
those records by ``benchmarks/reporting/gaps.py``.

Reproduce: python -m benchmarks.gaps             (54 runs, about 80 minutes on 2 busy cores)
           python -m benchmarks.gaps --cells fedc2i,fedavg --seeds 0 --raw-dir /tmp/raw   (reduced)
           python -m benchmarks.gaps --report    (rewrite the docs' tables from the records; --check: compare only)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.records import write_record
from benchmarks.reporting.gaps import DOCS, GRID, render, rewrite_docs
from benchmarks.running import OUT, Bench, parser, split

CLIENTS = 10
SMALL = {"train-samples": 25, "feature-shift": 2, "partition": "iid", "val-fraction": 0.2, "num-server-rounds": 20}
CELLS: dict[str, tuple[str, dict[str, Any]]] = {
    "local": ("local", {}),
    "fedavg": ("fedavg", {}),
    "fedc2i": ("fedc2i", {}),
    "pifl": ("pifl", {}),
    "fedsoft": ("fedsoft", {}),
    "fedc2i gamma=0": ("fedc2i", {"gamma": 0.0}),
    "fedc2i momentum=0": ("fedc2i", {"momentum": 0.0}),
    "fedavg momentum=0": ("fedavg", {"momentum": 0.0}),
    "fedc2i local-epochs=2": ("fedc2i", {"local-epochs": 2}),
    "fedavg local-epochs=2": ("fedavg", {"local-epochs": 2}),
    "pifl slots-performance=9": ("pifl", {"slots-performance": 9}),
    "pifl-ni": ("pifl-ni", {}),
    "fedsoft fedsoft-clients-per-cluster=10": ("fedsoft", {"fedsoft-clients-per-cluster": 10}),
    # the feature-shift grid's cell where FedC2I collapses (benchmarks/grids.py: 25 training samples per client,
    # two domains, 20 rounds), at the settings the grid ran there, and two changes of the local phase
    "local 25 samples": ("local", SMALL),
    "fedavg 25 samples": ("fedavg", SMALL),
    "fedc2i 25 samples": ("fedc2i", SMALL),
    "fedc2i 25 samples local-epochs=2": ("fedc2i", {**SMALL, "local-epochs": 2}),
    "fedc2i 25 samples batch-size=25": ("fedc2i", {**SMALL, "batch-size": 25}),
}


# --------------------------------------------------------------------------- what the saved run shows
def _fedc2i(folder: Path) -> dict[str, Any]:
    rows = json.loads((folder / "fedc2i_influence.json").read_text())
    self_w, top_peer = {}, {}
    for rnd, clients in rows.items():
        if not clients or all(len(r) < 2 for r in clients.values()):
            continue
        self_w[rnd] = float(np.mean([r[c] for c, r in clients.items()]))
        top_peer[rnd] = float(np.mean([max(w for p, w in r.items() if p != c) for c, r in clients.items()]))
    return {
        "self-influence": self_w,
        "top-peer-influence": top_peer,
        "clients": _saved_model_accuracies(folder),
    }


def _saved_model_accuracies(folder: Path) -> dict[str, Any]:
    """Every client's saved personalized model on its test split, as saved and with its BatchNorm statistics
    recomputed on the client's training split (one forward pass, no training: does the mixed BatchNorm state
    cost accuracy?); and every saved tier model (PI-FL) on the client's validation and test splits."""
    import torch
    from safetensors.torch import load_file

    from task.config import parse_settings
    from task.data import load_client_data
    from task.models import build_model
    from task.train import evaluate

    torch.set_num_threads(1)
    s = parse_settings(json.loads((folder / "config.json").read_text())["run-config"])
    tiers = [load_file(p) for p in sorted((folder / "models" / "server").glob("*.safetensors"))]
    net = build_model(s.model, s.in_channels, s.image_size, s.num_classes, seed=s.seed)

    def acc(state, x, y) -> float:
        net.load_state_dict(state)
        return evaluate(net, x, y)[1]

    def with_batchnorm_recomputed(state, x) -> dict:
        net.load_state_dict(state)
        norms = [m for m in net.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
        for m in norms:
            m.reset_running_stats()
            m.momentum = None  # a cumulative average over the one pass
        net.train()
        with torch.no_grad():
            net(x)
        for m in norms:
            m.momentum = 0.1
        return {k: v.clone() for k, v in net.state_dict().items()}

    out: dict[str, dict[str, Any]] = {}
    for pid in range(CLIENTS):
        d = load_client_data(s.data, pid, CLIENTS)
        val = [acc(t, d.x_val, d.y_val) for t in tiers]
        test = [acc(t, d.x_test, d.y_test) for t in tiers]
        own = load_file(str(folder / "models" / "clients" / f"client-{pid}.safetensors"))
        out[str(pid)] = {
            "personal": acc(own, d.x_test, d.y_test),
            "personal-batchnorm-recomputed": acc(with_batchnorm_recomputed(own, d.x_train), d.x_test, d.y_test),
            "test-examples": len(d.y_test),
        }
        if tiers:
            out[str(pid)].update({"tiers-val": val, "tiers-test": test, "best-tier-by-val": test[int(np.argmax(val))]})
    return out


def _pifl(folder: Path) -> dict[str, Any]:
    rounds = json.loads((folder / "rounds.json").read_text())
    sizes = [sum((r.get("extra", {}).get("pifl", {}).get("tier-sizes") or {}).values()) for r in rounds]
    return {"trained-per-round": sizes, "clients": _saved_model_accuracies(folder)}


def _fedsoft(folder: Path) -> dict[str, Any]:
    selected = json.loads((folder / "fedsoft_clusters.json").read_text())["selected"]
    trained = {str(c): 0 for c in range(CLIENTS)}
    per_round = []
    for _, centres in sorted(selected.items(), key=lambda kv: int(kv[0])):
        members = {c for m in centres.values() for c in m}
        per_round.append(len(members))
        for c in members:
            trained[str(c)] += 1
    return {"trained-per-round": per_round, "times-trained": trained}


ANALYSES = {"fedc2i": _fedc2i, "pifl": _pifl, "pifl-ni": _pifl, "fedsoft": _fedsoft}


def analyse(rec: dict) -> dict:
    method = rec["run-config"]["method"]
    if rec.get("error") or not rec.get("run") or method not in ANALYSES:
        return rec
    folder = OUT / "runs" / rec["run"]
    rec["analysis"] = ANALYSES[method](folder)
    return rec


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--cells", default=",".join(CELLS), help=f"comma-separated, from: {', '.join(CELLS)}")
    ap.add_argument("--report", action="store_true", help="only rewrite the docs' tables from the records")
    ap.add_argument("--check", action="store_true", help="only check that the docs' tables match the records")
    ap.add_argument(
        "--reanalyse", action="store_true", help="only redo the measurements on the saved runs (benchmarks/out/runs)"
    )
    args = ap.parse_args()
    raw = Path(args.raw_dir)
    if args.reanalyse:
        for path in sorted((raw / GRID).glob("*.json")):
            rec = json.loads(path.read_text())
            if rec.get("run") and (OUT / "runs" / rec["run"]).is_dir():
                write_record(analyse(rec), raw)
        return
    if args.report or args.check:
        same = rewrite_docs(raw, check=args.check)
        print("docs tables " + ("up to date" if same else ("differ from the records" if args.check else "rewritten")))
        sys.exit(1 if args.check and not same else 0)
    names = split(args.cells)
    unknown = [n for n in names if n not in CELLS]
    if unknown:
        raise SystemExit(f"unknown cells {unknown}; allowed: {list(CELLS)}")
    seeds = [int(s) for s in split(args.seeds)]
    cells = [(name, seed) for seed in seeds for name in names]
    with Bench(GRID, raw_dir=raw, total=len(cells)) as bench:
        for name, seed in cells:
            method, over = CELLS[name]
            cfg = {"method": method, "seed": seed, **over}
            rec = bench.run({"cell": name, "seed": seed}, cfg, CLIENTS)
            write_record(analyse(rec), raw)
    for name in DOCS:
        print(f"\n{name}\n{render(name, raw)}")
    print("\nrewrite the docs' tables with: python -m benchmarks.gaps --report")


if __name__ == "__main__":
    main()

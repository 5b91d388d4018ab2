"""The table of ``benchmarks/fedcac.py`` (grid ``fedcac``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.records import PERSONAL, axis, load_records, mean, ok, select, values

from .pairing import versus
from .settings import Paper, fixed, header, key, n_clients, n_seeds, percent, trained_model
from .text import NAMES, bullets, md_table, mean_std, missing

FEDCAC_PAPER = [
    Paper("clients", "40", n_clients, "fedcac §3"),
    Paper("local epochs", "5", key("local-epochs"), "fedcac §3"),
    Paper("batch size", "100", key("batch-size"), "fedcac §3"),
    Paper("lr", "0.1", key("lr"), "fedcac §3"),
    Paper("momentum", "0.9", key("momentum"), "fedcac §3, official config"),
    Paper("rounds", "500", key("num-server-rounds"), "fedcac §3"),
    Paper("beta", "100 (CIFAR-10)", key("beta"), "fedcac §3"),
    Paper("tau", "0.5", key("tau"), "fedcac §3"),
    Paper("participation", "100 %", key("fraction-train", percent), "fedcac §3"),
    Paper("seeds", "5", n_seeds, "fedcac §3"),
    Paper(
        "data",
        "CIFAR-10 / CIFAR-100 / Tiny ImageNet, 500 train / 100 test samples per client",
        fixed("digits (8x8) with Gaussian pixel noise, all samples split among clients"),
        "fedcac §4",
    ),
    Paper("model", "ResNet-8 / ResNet-10", trained_model, "fedcac §4"),
    Paper("headline metric", "best round", fixed("last round"), "fedcac §3"),
]
FEDCAC_METHODS = ["local", "fedavg", "fedper", "fedrep", "ditto", "fedcac"]


def render_fedcac(raw: Path, d: dict[str, Any]) -> str:
    recs = load_records("fedcac", raw)
    intro = (
        "FedCAC against Local, FedAvg, FedPer, FedRep and Ditto on noisy digits (spec fedcac §8). Final-round "
        "accuracy of each client's model on its own test split (FedCAC: after Eq. 11), mean over clients, "
        "mean ± std over seeds; FedAvg: its global model. Bold: the best mean of a row."
    )
    if not recs:
        return intro + "\n\n" + missing("python -m benchmarks.fedcac")
    methods = axis(recs, "method", FEDCAC_METHODS)
    rows, claims = [], []
    for part in axis(recs, "partition", ["pathological", "dirichlet-0.5", "dirichlet-1.0"]):
        means = {m: mean(select(recs, partition=part, method=m), PERSONAL) for m in methods}
        known = {m: v for m, v in means.items() if v is not None}
        best = max(known, key=known.__getitem__, default=None)
        cells = [mean_std(select(recs, partition=part, method=m), PERSONAL) for m in methods]
        rows.append([part] + [f"**{c}**" if m == best else c for m, c in zip(methods, cells, strict=True)])
        if "fedcac" in methods and best is not None and "fedcac" in known:
            others = [m for m in known if m != "fedcac"]
            rival = max(others, key=known.__getitem__) if others else None
            std = max(np.std(values(select(recs, partition=part, method=m), PERSONAL)) for m in ("fedcac", rival))
            line = f"{part}: best mean {NAMES.get(best, best)}"
            if rival:
                gap = known["fedcac"] - known[rival]
                within = "within" if abs(gap) <= std else "more than"
                line += (
                    "; "
                    + versus(
                        "FedCAC",
                        select(recs, partition=part, method="fedcac"),
                        f"the best other method, {NAMES.get(rival, rival)}",
                        select(recs, partition=part, method=rival),
                        PERSONAL,
                    )
                    + f"; the gap is {within} one seed std"
                )
            claims.append(line + ".")
    wins = sum(1 for r in rows if "**" in r[1 + methods.index("fedcac")]) if "fedcac" in methods else 0
    claims.insert(0, f"FedCAC has the best mean in {wins} of {len(rows)} partitions.")
    ratios = {
        r["artefacts"]["fedcac"].get("mask-to-model-ratio") for r in ok(recs) if r.get("artefacts", {}).get("fedcac")
    }
    if ratios and None not in ratios:
        claims.append(
            f"The packed mask a client sends costs 1/{1 / max(ratios):.0f} of the float32 model "
            "(`fedcac_communication.json`)."
        )
    return "\n\n".join([intro, header(recs, FEDCAC_PAPER, d), md_table(["partition", *methods], rows), bullets(claims)])

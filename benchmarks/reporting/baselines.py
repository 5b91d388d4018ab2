"""The tables of ``benchmarks/baselines.py`` (grids ``baselines-clean``, ``baselines-noisy``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.records import GLOBAL, PERSONAL, TIE, Rec, axis, load_records, seeds_of, select

from .pairing import paired, versus, versus_many
from .settings import header
from .text import NAMES, bullets, md_table, mean_std, missing

BASELINE_METHODS = ["local", "fedavg", "fedprox", "fedper", "fedrep", "fedrod", "ditto"]


def _baselines_table(recs: list[Rec]) -> str:
    rows = []
    for part in axis(recs, "partition", ["pathological", "iid"]):
        for m in axis(recs, "method", BASELINE_METHODS):
            sel = select(recs, partition=part, method=m)
            rows.append([part, m, mean_std(sel, PERSONAL), mean_std(sel, GLOBAL)])
    n = len(seeds_of(recs))
    over = "" if n == 1 else f" (mean ± std over {n} seeds)"
    return md_table(["partition", "method", f"personalized acc{over}", "global-model acc"], rows)


def _baselines_claims(recs: list[Rec]) -> list[str]:
    out = []

    def fedavg(part: str) -> list[Rec]:
        return select(recs, partition=part, method="fedavg")

    arms = [
        (NAMES[m], select(recs, partition="pathological", method=m)) for m in ("local", "fedper", "fedrep", "ditto")
    ]
    if any(a for _, a in arms) and fedavg("pathological"):
        out.append(
            "Pathological split: "
            + versus_many([x for x in arms if x[1]], "FedAvg's global model", fedavg("pathological"), PERSONAL, GLOBAL)
            + "."
        )
    local = select(recs, partition="pathological", method="local")
    pers = [(NAMES[m], select(recs, partition="pathological", method=m)) for m in ("fedper", "fedrep", "ditto")]
    if local and any(a for _, a in pers):
        out.append(
            "Pathological split, against training alone: "
            + versus_many([x for x in pers if x[1]], "Local", local, PERSONAL)
            + "."
        )
    if select(recs, partition="iid", method="local"):
        out.append(
            "IID: "
            + versus(
                "FedAvg's global model",
                fedavg("iid"),
                "Local",
                select(recs, partition="iid", method="local"),
                GLOBAL,
                PERSONAL,
            )
            + "."
        )
    for part in axis(recs, "partition"):
        ditto, avg = select(recs, partition=part, method="ditto"), fedavg(part)
        p = paired(ditto, avg, GLOBAL)
        if p.ok:
            gap = max(abs(d) for d in p.deltas)
            out.append(
                f"{part}: Ditto's global model "
                + ("equals FedAvg's in every seed" if gap <= TIE else f"differs from FedAvg's by up to {gap:.4f}")
                + "."
            )
    if select(recs, method="fedprox"):
        out.append(
            "FedProx vs FedAvg: "
            + "; ".join(
                f"{part}: "
                + versus("FedProx", select(recs, partition=part, method="fedprox"), "FedAvg", fedavg(part), PERSONAL)
                for part in axis(recs, "partition")
            )
            + "."
        )
    return out


def render_baselines(raw: Path, d: dict[str, Any]) -> str:
    intro = (
        "The baseline methods (Local, FedAvg and the personalized baselines) on the embedded digits. Expected: on the "
        "pathological split (2 classes per "
        "client) Local and the personalized methods beat FedAvg's global model; on IID, FedAvg's global model "
        "beats Local. Accuracy = each client's own model on its own test split, mean over clients, last round."
    )
    parts = [intro]
    for grid, title, command in (
        ("baselines-clean", "Clean digits", "python -m benchmarks.baselines --grid clean"),
        (
            "baselines-noisy",
            "Noisy digits (fixed Gaussian pixel noise, as the FedCAC spec uses to separate methods)",
            "python -m benchmarks.baselines --grid noisy",
        ),
    ):
        recs = load_records(grid, raw)
        parts.append(f"### {title}")
        if not recs:
            parts.append(missing(command))
            continue
        parts += [header(recs, [], d), _baselines_table(recs)]
        if len(seeds_of(recs)) == 1:
            parts.append("One seed: no spread is measured, so small differences below may be noise.")
        parts.append(bullets(_baselines_claims(recs)))
    return "\n\n".join(parts)

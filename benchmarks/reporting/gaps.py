"""The tables of docs/methods/fedc2i.md and docs/methods/pifl.md ("At the defaults on digits") from the records of
``benchmarks/gaps.py`` (grid ``defaults-gaps``): why FedC2I, PI-FL and FedSoft trail FedAvg or Local at the
defaults, one row per seed and the mean, each table between its ``<!-- gaps:<name> -->`` markers.
``python -m benchmarks.gaps --report`` rewrites them (``--check``: compares only)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.records import BENCHMARKS, RAW, load_records

from .text import md_table, num

GRID = "defaults-gaps"
METHODS_DOCS = BENCHMARKS.parent / "docs" / "methods"


def _by_cell(raw: Path) -> dict[str, dict[int, dict]]:
    out: dict[str, dict[int, dict]] = {}
    for r in load_records(GRID, raw):
        if not r.get("error"):
            out.setdefault(r["cell"]["cell"], {})[int(r["cell"]["seed"])] = r
    return out


def _acc(rec: dict | None) -> float | None:
    return None if rec is None else rec["summary"]["personal-acc"]


COUNTS = {"clients trained per round", "fewest rounds a client trained"}  # counts: one decimal


def _rows(cells: dict, columns: list[tuple[str, Any]]) -> list[list[str]]:
    """One row per seed present in every column's cell, then the mean row."""
    seeds = sorted(set.intersection(*(set(cells.get(cell, {})) for _, (cell, _) in columns)))
    values = [[fn(cells[cell][s]) for _, (cell, fn) in columns] for s in seeds]
    digits = [1 if header in COUNTS else 3 for header, _ in columns]
    rows = [
        [str(s), *(num(v, nd) for v, nd in zip(vals, digits, strict=True))]
        for s, vals in zip(seeds, values, strict=True)
    ]
    if len(seeds) > 1:
        means = [
            np.mean([v[i] for v in values]) if all(v[i] is not None for v in values) else None
            for i in range(len(columns))
        ]
        rows.append(["mean", *(f"**{num(m, nd)}**" for m, nd in zip(means, digits, strict=True))])
    return rows


def _last(series: dict[str, float]) -> float | None:
    return series[max(series, key=int)] if series else None


def _trained_acc_last(rec: dict) -> float | None:
    accs = [r.get("trained-acc") for r in rec["rounds"] if r.get("trained-acc") is not None]
    return accs[-1] if accs else None


def _clients_mean(key: str):
    return lambda r: float(np.mean([v[key] for v in r["analysis"]["clients"].values()]))


def _tier_spread(rec: dict) -> float:
    """How far the tiers have drifted apart: per client, its best minus its worst tier on its test split."""
    return float(np.mean([max(v["tiers-test"]) - min(v["tiers-test"]) for v in rec["analysis"]["clients"].values()]))


def render(name: str, raw: Path = RAW) -> str:
    c = _by_cell(raw)
    base = [("FedAvg", ("fedavg", _acc)), ("Local", ("local", _acc))]
    if name == "fedc2i":
        cols = [
            ("FedC2I", ("fedc2i", _acc)),
            *base,
            ("FedAvg after its local epoch", ("fedavg", _trained_acc_last)),
            ("FedC2I gamma=0", ("fedc2i gamma=0", _acc)),
            ("FedC2I, BatchNorm statistics recomputed", ("fedc2i", _clients_mean("personal-batchnorm-recomputed"))),
            ("self-influence, last round", ("fedc2i", lambda r: _last(r["analysis"]["self-influence"]))),
            ("largest peer weight", ("fedc2i", lambda r: _last(r["analysis"]["top-peer-influence"]))),
        ]
    elif name == "fedc2i-training":
        cols = [
            ("FedC2I momentum=0", ("fedc2i momentum=0", _acc)),
            ("FedAvg momentum=0", ("fedavg momentum=0", _acc)),
            ("FedAvg momentum=0 after its local epoch", ("fedavg momentum=0", _trained_acc_last)),
            ("FedC2I local-epochs=2", ("fedc2i local-epochs=2", _acc)),
            ("FedAvg local-epochs=2", ("fedavg local-epochs=2", _acc)),
            ("FedAvg local-epochs=2 after its local epochs", ("fedavg local-epochs=2", _trained_acc_last)),
        ]
    elif name == "fedc2i-small":
        cols = [
            ("FedC2I", ("fedc2i 25 samples", _acc)),
            ("FedAvg", ("fedavg 25 samples", _acc)),
            ("Local", ("local 25 samples", _acc)),
            ("FedAvg after its local epoch", ("fedavg 25 samples", _trained_acc_last)),
            (
                "FedC2I, BatchNorm statistics recomputed",
                ("fedc2i 25 samples", _clients_mean("personal-batchnorm-recomputed")),
            ),
            ("self-influence, last round", ("fedc2i 25 samples", lambda r: _last(r["analysis"]["self-influence"]))),
            ("largest peer weight", ("fedc2i 25 samples", lambda r: _last(r["analysis"]["top-peer-influence"]))),
            ("FedC2I local-epochs=2", ("fedc2i 25 samples local-epochs=2", _acc)),
            ("FedC2I batch-size=25 (one step per epoch)", ("fedc2i 25 samples batch-size=25", _acc)),
        ]
    elif name == "pifl":
        cols = [
            ("PI-FL", ("pifl", _acc)),
            *base,
            ("mixture, BatchNorm statistics recomputed", ("pifl", _clients_mean("personal-batchnorm-recomputed"))),
            ("best single tier by validation", ("pifl", _clients_mean("best-tier-by-val"))),
            ("tiers apart (best minus worst tier, mean over clients)", ("pifl", _tier_spread)),
            ("clients trained per round", ("pifl", lambda r: float(np.mean(r["analysis"]["trained-per-round"])))),
            ("PI-FL, every bidder trains", ("pifl slots-performance=9", _acc)),
        ]
    elif name == "pifl-ni":
        cols = [
            ("PI-FL(NI)", ("pifl-ni", _acc)),
            *base,
            ("best single tier by validation", ("pifl-ni", _clients_mean("best-tier-by-val"))),
            ("tiers apart (best minus worst tier, mean over clients)", ("pifl-ni", _tier_spread)),
            ("clients trained per round", ("pifl-ni", lambda r: float(np.mean(r["analysis"]["trained-per-round"])))),
        ]
    elif name == "fedsoft":
        cols = [
            ("FedSoft", ("fedsoft", _acc)),
            *base,
            ("clients trained per round", ("fedsoft", lambda r: float(np.mean(r["analysis"]["trained-per-round"])))),
            (
                "fewest rounds a client trained",
                ("fedsoft", lambda r: float(min(r["analysis"]["times-trained"].values()))),
            ),
            ("FedSoft, every client trains", ("fedsoft fedsoft-clients-per-cluster=10", _acc)),
        ]
    else:
        raise ValueError(f"unknown table {name!r}")
    if any(cell not in c for _, (cell, _) in cols):
        missing = sorted({cell for _, (cell, _) in cols if cell not in c})
        return f"(no records yet for {', '.join(missing)}: run python -m benchmarks.gaps)"
    return md_table(["seed", *(h for h, _ in cols)], _rows(c, cols))


DOCS = {
    "fedc2i": METHODS_DOCS / "fedc2i.md",
    "fedc2i-training": METHODS_DOCS / "fedc2i.md",
    "fedc2i-small": METHODS_DOCS / "fedc2i.md",
    "pifl": METHODS_DOCS / "pifl.md",
    "pifl-ni": METHODS_DOCS / "pifl.md",
    "fedsoft": METHODS_DOCS / "pifl.md",
}


def rewrite_docs(raw: Path, check: bool) -> bool:
    """Put each table between its ``<!-- gaps:<name> -->`` and ``<!-- /gaps:<name> -->`` markers; True if the
    docs already held exactly these tables."""
    same = True
    for name, path in DOCS.items():
        text = path.read_text()
        pattern = re.compile(rf"(<!-- gaps:{name} -->\n)(?:.*?\n)?(<!-- /gaps:{name} -->)", re.DOTALL)
        if not pattern.search(text):
            raise SystemExit(f"{path} has no <!-- gaps:{name} --> ... <!-- /gaps:{name} --> block")
        table = render(name, raw)

        def between_markers(m: re.Match[str], table: str = table) -> str:
            return m.group(1) + table + "\n" + m.group(2)

        new = pattern.sub(between_markers, text)
        same &= new == text
        if not check:
            path.write_text(new)
    return same

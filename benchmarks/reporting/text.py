"""Text of the tables and claims: numbers, differences in points, markdown tables, bullets, method names."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from benchmarks.records import PERSONAL, TIE, Rec, error_line, values

#: how a method (or a benchmark's arm) is named in the claims under a table
NAMES = {
    "local": "Local",
    "fedavg": "FedAvg",
    "fedprox": "FedProx",
    "fedper": "FedPer",
    "fedrep": "FedRep",
    "fedrod": "FedRoD",
    "ditto": "Ditto",
    "fedcac": "FedCAC",
    "cfl": "CFL (Sattler's thresholds)",
    "cfl-tuned": "CFL (tuned thresholds)",
    "oracle": "Oracle",
    "pfedlia-central": "pFedLIA central (OPTICS)",
    "pfedlia-p2p": "pFedLIA peer-to-peer",
    "ifca": "IFCA",
    "fedsoft": "FedSoft",
    "pifl": "PI-FL",
    "pifl-ni": "PI-FL(NI)",
}


def span(vals: Iterable[float], nd: int = 1, unit: str = "") -> str:
    """ "a-b" (or "a" when they agree at this precision)."""
    vals = list(vals)
    lo, hi = f"{min(vals):.{nd}f}", f"{max(vals):.{nd}f}"
    return f"{lo}{unit}" if lo == hi else f"{lo}-{hi}{unit}"


def num(v: float | None, nd: int = 4) -> str:
    return "—" if v is None else f"{v:.{nd}f}"


def pts(delta: float) -> str:
    """A difference of accuracies in percentage points, signed (two decimals when it is below 0.05)."""
    if abs(delta) <= TIE:
        return "0 points"
    return f"{delta * 100:+.{2 if abs(delta) < 5e-4 else 1}f} points"


def mean_std(recs: list[Rec], metric: Callable[[Rec], Any], nd: int = 4) -> str:
    """``mean ± std`` over the runs (population std, as numpy), a single value for one run; failures noted."""
    vals = values(recs, metric)
    failed = [r for r in recs if r.get("error")]
    if not vals:
        return f"failed: {error_line(failed[0]['error'])}" if failed else "—"
    text = f"{vals[0]:.{nd}f}" if len(vals) == 1 else f"{np.mean(vals):.{nd}f} ± {np.std(vals):.{nd}f}"
    return text + (f" ({len(failed)} of {len(recs)} runs failed)" if failed else "")


def mean_range(vals: list[float], nd: int = 4, scale: float = 1.0, sign: str = "") -> str:
    """``mean (min-max)`` of the values (just the value when there is one), ``—`` when there is none."""
    if not vals:
        return "—"
    m, lo, hi = (f"{v * scale:{sign}.{nd}f}" for v in (sum(vals) / len(vals), min(vals), max(vals)))
    return m if len(vals) == 1 else f"{m} ({lo} to {hi})" if sign else f"{m} ({lo}-{hi})"


def accuracy_cell(sel: list[Rec]) -> str:
    """Mean personalized accuracy (min-max), the failed runs counted, or the error when every run failed."""
    acc, failed = values(sel, PERSONAL), [r for r in sel if r.get("error")]
    if not acc:
        return mean_std(sel, PERSONAL).replace("|", "\\|")  # the error line, kept inside its table cell
    return mean_range(acc) + (f" ({len(failed)} of {plural(len(sel), 'run')} failed)" if failed else "")


def md_table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")


def bullets(lines: Iterable[str]) -> str:
    return "\n".join(f"- {line}" for line in lines)


def value_range(vals: list[Any]) -> str:
    """ "a-b" of the values that are not None ("a" when they agree, "—" when there is none)."""
    vals = sorted(v for v in vals if v is not None)
    if not vals:
        return "—"
    return str(vals[0]) if vals[0] == vals[-1] else f"{vals[0]}-{vals[-1]}"


def missing(command: str) -> str:
    return f"*Not yet re-run with raw outputs: run `{command}`, then `python -m benchmarks.report`.*"

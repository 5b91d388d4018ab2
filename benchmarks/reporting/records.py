"""Raw records as the tables read them: select the runs of a cell, their values, their failures.

A record is one run's JSON from ``benchmarks/raw/<grid>/`` (schema: ``benchmarks/common.py``); a grid cell is
``record["cell"]`` (e.g. ``{"partition": ..., "method": ..., "seed": ...}``).  A *metric* is a function of a
record that returns a number or None (``summary("personal-acc")``, or a renderer's own).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from common import failure_line

Rec = dict[str, Any]
TIE = 1e-9  # accuracies closer than this are equal (float noise of the mean over clients)


def ok(recs: Iterable[Rec]) -> list[Rec]:
    return [r for r in recs if not r.get("error")]


def select(recs: Iterable[Rec], **coords: Any) -> list[Rec]:
    return [r for r in recs if all(r["cell"].get(k) == v for k, v in coords.items())]


def axis(recs: Iterable[Rec], name: str, order: Iterable[str] = ()) -> list[Any]:
    """The values of a grid axis present in the records, in ``order`` first, then sorted."""
    present = {r["cell"].get(name) for r in recs} - {None}
    first = [v for v in order if v in present]
    return first + sorted(present - set(first), key=str)


_EXCEPTION_LINE = re.compile(r"^(?:[a-z_]\w*\.)*[A-Z]\w*: \S")  # "task.options.ConfigConflict: run-config key ..."


def error_line(error: str | None) -> str:
    """The line of a failed run's log tail that names its error: the last exception line of a traceback
    (``package.module.SomeConflict: ...``) when there is one, else ``common.failure_line``'s choice (which
    looks for names ending in Error / Exception / Timeout and falls back to the last line)."""
    lines = [re.sub(r"\x1b\[[0-9;]*m", "", ln).strip() for ln in (error or "").splitlines()]
    raised = [ln for ln in lines if _EXCEPTION_LINE.match(ln)]
    return raised[-1] if raised else failure_line(error)


def values(recs: Iterable[Rec], metric: Callable[[Rec], Any]) -> list[float]:
    return [float(v) for v in (metric(r) for r in ok(recs)) if v is not None]


def mean(recs: Iterable[Rec], metric: Callable[[Rec], Any]) -> float | None:
    vals = values(recs, metric)
    return float(np.mean(vals)) if vals else None


def summary(key: str) -> Callable[[Rec], Any]:
    """The metric that reads ``key`` of a record's summary (final-round values)."""
    return lambda r: r["summary"].get(key)


PERSONAL, GLOBAL = summary("personal-acc"), summary("global-acc")


def seeds_of(recs: Iterable[Rec]) -> list[int]:
    return sorted({r["cell"]["seed"] for r in recs if "seed" in r["cell"]})


def label(cell: dict[str, Any]) -> str:
    """A row's label: its grid coordinates except the seed."""
    return " / ".join(str(v) for k, v in cell.items() if k != "seed")

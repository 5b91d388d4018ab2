"""The compute the records took: per grid, the runs, how many failed, and their wall seconds summed.

A run's wall time is ``flwr run`` end to end as the running layer measured it (``wall-seconds``: Flower's start-up
included); a record without it (an older record, an in-process measurement) counts its ServerApp seconds
(``summary.seconds``) instead, and the table says how many did.  The machine of each grid is named by its cores and
the load it shared them under, from the records.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.records import Rec, load_records

from .text import md_table, plural


def seconds(rec: Rec) -> tuple[float, bool]:
    """(seconds, whether they are wall seconds) of one record."""
    if rec.get("wall-seconds"):
        return float(rec["wall-seconds"]), True
    return float((rec.get("summary") or {}).get("seconds") or 0.0), False


def _hours(s: float) -> str:
    return f"{s / 3600:.1f} h" if s >= 360 else f"{s / 60:.0f} min"


def render_compute(raw: Path) -> str:
    grids = sorted(p.name for p in Path(raw).iterdir() if p.is_dir()) if Path(raw).is_dir() else []
    rows, total, total_wall = [], 0.0, 0.0
    for grid in grids:
        recs = load_records(grid, raw)
        if not recs:
            continue
        timed = [seconds(r) for r in recs]
        s = sum(t for t, _ in timed)
        walls = sum(1 for _, w in timed if w)
        total += s
        total_wall += sum(t for t, w in timed if w)
        cores = sorted({int(c) for r in recs if (c := (r.get("machine") or {}).get("cores")) is not None})
        loads = [float(r["machine"]["load-before"]) for r in recs if (r.get("machine") or {}).get("load-before")]
        rows.append(
            [
                grid,
                str(len(recs)),
                str(sum(1 for r in recs if r.get("error"))),
                _hours(s),
                f"{walls} of {len(recs)}",
                "-".join(map(str, cores)) or "—",
                f"{np.median(loads):.1f}" if loads else "—",
            ]
        )
    if not rows:
        return "*No records.*"
    intro = (
        f"{plural(len(rows), 'grid')}, {_hours(total)} of compute in all ({_hours(total_wall)} of it measured as wall "
        "time of `flwr run`, the rest as ServerApp seconds of records that have no wall time). Each run used the "
        "cores named, shared with other work at the load shown (the median 1-minute load average when a run started)."
    )
    table = md_table(
        ["grid", "runs", "failed", "compute", "runs with wall time", "cores", "median load"],
        rows,
    )
    return f"{intro}\n\n{table}"

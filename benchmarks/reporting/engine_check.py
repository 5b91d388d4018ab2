"""The table of ``benchmarks/engine_check.py`` (grid ``engine-check``): one cell per family, run on the engine for the
grids and again through ``flwr run``, compared number by number; and the sentence the choosing page shows."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmarks.records import RAW, load_records

from .settings import machine_note
from .text import md_table, missing, num

GRID = "engine-check"
COMMAND = 'benchmarks/run_committed.sh "engine_check"'


def name_of(cell: dict[str, Any]) -> str:
    return f"{cell['family']} / {cell['method']} / seed {cell['seed']}"


def _comparable(rec: dict[str, Any]) -> dict[str, Any]:
    """What two runs of one run config share whatever runtime ran them (a record's numbers without seconds, memory
    and byte counts: the messages carry the run's folder, whose name ends in the run id)."""

    def keep(key: str) -> bool:
        return not any(w in key for w in ("seconds", "rss", "bytes", "time"))

    def clean(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items() if keep(k)}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    columns = rec["clients"]["columns"]
    kept = [i for i, c in enumerate(columns) if keep(c)]
    return {
        "summary": clean(rec["summary"]),
        "rounds": clean(rec["rounds"]),
        "clients": [[row[i] for i in kept] for row in rec["clients"]["rows"]],
    }


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Where two records' numbers differ (exactly), as paths."""
    found: list[str] = []

    def walk(x: Any, y: Any, path: str) -> None:
        if isinstance(x, dict) and isinstance(y, dict):
            for k in sorted(set(x) | set(y)):
                walk(x.get(k), y.get(k), f"{path}/{k}")
        elif isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
            for i, (u, v) in enumerate(zip(x, y, strict=True)):
                walk(u, v, f"{path}[{i}]")
        elif json.dumps(x) != json.dumps(y):
            found.append(path)

    walk(_comparable(a), _comparable(b), "")
    return found


def _pairs(raw: Path) -> list[tuple[dict[str, Any], dict[str, Any] | None]]:
    """(the flwr run record, the grid record it re-ran, None when that record is gone)."""
    out = []
    for rec in load_records(GRID, raw):
        asked = rec.get("compared-with") or {}
        original = next((r for r in load_records(asked.get("grid", ""), raw) if r["cell"] == asked.get("cell")), None)
        out.append((rec, original))
    return out


def verdict(raw: Path = RAW) -> str | None:
    """One sentence: how many of the re-run cells gave what the engine gave; None when nothing was re-run."""
    pairs = [(a, b) for a, b in _pairs(raw) if b is not None and not a.get("error")]
    if not pairs:
        return None
    same = [a for a, b in pairs if not differences(b, a)]
    families = sorted({a["cell"]["family"] for a, _ in pairs})
    text = (
        f"The engine against Flower's runtime on these records: {len(pairs)} cells of {len(families)} families "
        "(FedAvg and a method from the papers at each family's middle cell, seed 0) were run again through `flwr run` "
        f"(Ray, clients in their own processes); {len(same)} of {len(pairs)} gave the same numbers, summary, rounds "
        "and every client's row"
    )
    if len(same) < len(pairs):
        text += "; the others: " + "; ".join(
            f"{name_of(a['cell'])} ({len(differences(b, a))} numbers differ)" for a, b in pairs if differences(b, a)
        )
    return text + ' (RESULTS.md, "Engine against Flower\'s runtime on the evidence").'


def render_engine_check(raw: Path, d: dict[str, Any]) -> str:
    pairs = _pairs(raw)
    if not pairs:
        return missing(COMMAND)
    rows = []
    for rec, original in pairs:
        if original is None:
            rows.append([name_of(rec["cell"]), "—", num(rec["summary"].get("personal-acc")), "its grid record is gone"])
            continue
        if rec.get("error"):
            rows.append(
                [name_of(rec["cell"]), num(original["summary"].get("personal-acc")), "failed", rec["error"][:80]]
            )
            continue
        found = differences(original, rec)
        rows.append(
            [
                name_of(rec["cell"]),
                num(original["summary"].get("personal-acc")),
                num(rec["summary"].get("personal-acc")),
                "identical" if not found else f"{len(found)} numbers differ (first: `{found[0]}`)",
            ]
        )
    intro = (
        "Each cell's grid record (made on the engine) and the same run config run again through `flwr run` on a "
        "private SuperLink: personalized accuracy of each, and whether every number of the two records agrees (the "
        "summary, every round's accuracies and losses, every client's row; seconds, memory and byte counts set aside)."
    )
    table = md_table(["family / method / seed", "engine", "`flwr run`", "records"], rows)
    return "\n\n".join(
        x
        for x in (intro, f"Command: `{COMMAND}`.", table, verdict(raw) or "", machine_note([p[0] for p in pairs]))
        if x
    )

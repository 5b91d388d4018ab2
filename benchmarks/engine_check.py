"""The engine against Flower's runtime on the evidence itself: one cell per family run again through ``flwr run``.

The grids' records are made on the in-process engine (``server_app/engine.py``).  For every family this takes its
middle cell at seed 0 for FedAvg and for the family's first method from the papers that has a grid record there,
runs the very run config of that record again through ``flwr run`` on a private SuperLink (Flower's Ray backend,
clients in their own processes), keeps that run's record under ``benchmarks/raw/engine-check/`` and compares the two
records number by number: the summary, every round's accuracies and losses, and every client's row (seconds, memory
and byte counts set aside).  ``python -m benchmarks.report`` shows the comparison (RESULTS.md, "Engine against Flower's
runtime on the evidence").

    benchmarks/run_committed.sh "engine_check"     # after the grids, at their commit
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.families import FAMILIES, Family
from benchmarks.records import load_records, write_record
from benchmarks.reporting import print_section
from benchmarks.reporting.engine_check import GRID, differences, name_of
from benchmarks.running import Bench, parser

#: the rows a family's check runs: FedAvg, and the first of these the family has (the methods of the papers)
PAPER_METHODS = ("fedcac", "pfedlia", "pifl", "fedc2i", "client2vec")


def checked_records(fam: Family, raw_dir: Path) -> list[dict[str, Any]]:
    """The family's grid records to check: its middle cell at seed 0, FedAvg and its first paper method there."""
    samples, heterogeneity = fam.middle
    at_middle = [
        r
        for r in load_records(fam.grid, raw_dir)
        if not r.get("error")
        and r["cell"].get("seed") == 0
        and r["cell"].get("samples") == samples
        and r["cell"].get("heterogeneity") == heterogeneity
    ]
    by_method = {r["cell"]["method"]: r for r in at_middle}
    paper = next((m for m in PAPER_METHODS if m in by_method), None)
    return [by_method[m] for m in ("fedavg", paper) if m is not None and m in by_method]


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--families", default=",".join(FAMILIES), help="families to check (default: all)")
    args = ap.parse_args()
    raw = Path(args.raw_dir)
    todo = []
    for name in [f for f in args.families.split(",") if f]:
        fam = FAMILIES[name]
        for rec in checked_records(fam, raw):
            cell = {"family": name, "method": rec["cell"]["method"], "seed": rec["cell"]["seed"]}
            todo.append((cell, rec))
    with Bench(GRID, raw_dir=raw, total=len(todo), engine="flwr-run") as bench:
        for cell, rec in todo:
            config = {k: v for k, v in rec["run-config"].items() if k != "results-dir"}
            out = bench.run(cell, config, rec["num-supernodes"])
            out["compared-with"] = {"grid": rec["grid"], "cell": rec["cell"], "engine": rec.get("engine")}
            write_record(out, raw)
            print(f"[engine-check] {name_of(cell)}: {'identical' if not differences(rec, out) else 'DIFFERS'}")
    print_section(GRID, raw)


if __name__ == "__main__":
    main()

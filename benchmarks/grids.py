"""When does each method pay off? Grids over samples per client and heterogeneity, every method tuned alike, and the
federations users run (many clients with a tenth per round, a domain per client, newcomers).

The families, their rows, settings and seeds and the selection rule are specified in ``benchmarks/families.py``;
this script runs them through Flower.  One raw record per run goes to ``<raw-dir>/grids-<family>-select/`` and
``<raw-dir>/grids-<family>/``; a run whose record exists is skipped (the script resumes where it stopped;
``--retry-failed`` reruns failed ones), unless the record is stale: its method's code changed since the record's
commit (``reporting/freshness.py``; ``--keep-stale`` keeps it).  Order: selection (seed by seed), its learning-rate
extensions (rows whose choice sits at an edge of the grid, until none does), then the middle cell of every method,
then the axes (seed by seed), so that a partial run is as useful as it can be.  A family whose run-config keys the
app lacks (``Family.needs``) is left out with a message.  ``benchmarks/reporting/grids.py`` renders the records:
the script prints its section of RESULTS.md after its runs, ``python -m benchmarks.report`` puts it in RESULTS.md
and draws its figures.

    python -m benchmarks.grids --dry-run             # the plan: runs per family and phase, estimated hours
    python -m benchmarks.grids --measure             # short timing runs per family (what --dry-run estimates from)
    benchmarks/run_committed.sh "grids"              # the full compute, on a committed tree (resumable)
    python -m benchmarks.grids --smoke --raw-dir /tmp/grids-smoke   # a tiny rehearsal; prints every renderer's text
"""

from __future__ import annotations

import json
import os
import statistics
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from benchmarks.families import FAMILIES, Family, Run, grid_runs, selection_runs, setting_label, smoke_design
from benchmarks.protocol import (
    TIMING,
    check_configs,
    method_factors,
    per_run_seconds,
    run_grids,
    run_selection,
    timing_runs,
)
from benchmarks.records import RAW, load_records, run_config_defaults
from benchmarks.reporting import print_section
from benchmarks.reporting.choosing import render_choosing
from benchmarks.reporting.figures import draw
from benchmarks.reporting.freshness import stale_now
from benchmarks.reporting.grids import figures_grids, render_grids
from benchmarks.running import Bench, Progress, Todo, parser, run_all, split


def check_methods(design: dict[str, Family]) -> None:
    """Every row's method exists in the code that runs (e.g. FedBN is a later addition)."""
    from task.methods import METHODS

    missing = sorted({r.config["method"] for f in design.values() for r in f.rows if r.config["method"] not in METHODS})
    if missing:
        raise SystemExit(
            f"method(s) {missing} are not in this code's task.methods (allowed: {sorted(METHODS)}); merge them "
            f"first or leave them out with --skip {','.join(missing)}"
        )


def missing_keys(fam: Family, known: Iterable[str] | None = None) -> list[str]:
    """The run-config keys ``fam`` needs that the app's code lacks."""
    known = set(run_config_defaults() if known is None else known)
    return [k for k in fam.needs if k not in known]


def runnable(design: dict[str, Family], known: Iterable[str] | None = None) -> dict[str, Family]:
    """The families whose keys the app has (the others are printed and left out)."""
    out = {}
    for name, fam in design.items():
        lacking = missing_keys(fam, known)
        if lacking:
            print(f"{name}: left out: the app has no run-config key {', '.join(lacking)} yet")
        else:
            out[name] = fam
    return out


def restrict(design: dict[str, Family], families: list[str], methods: list[str], skip: list[str]) -> dict[str, Family]:
    unknown = [f for f in families if f not in design]
    if unknown:
        raise SystemExit(f"unknown family {unknown}; allowed: {sorted(design)}")
    names = {r.name for f in design.values() for r in f.rows}
    bad = [m for m in methods + skip if m not in names]
    if bad:
        raise SystemExit(f"unknown method row {bad}; allowed: {sorted(names)}")
    out = {}
    for name in families:
        rows = tuple(r for r in design[name].rows if (not methods or r.name in methods) and r.name not in skip)
        out[name] = replace(design[name], rows=rows)
    return out


# --------------------------------------------------------------------------- what is left to run
def make_todo(raw_dir: Path, retry_failed: bool = False, keep_stale: bool = False) -> Todo:
    """The runs left: a stale record (its method's code changed since its commit) is run again unless kept."""
    return Todo(raw_dir, retry_failed, None if keep_stale else stale_now(raw_dir))


# --------------------------------------------------------------------------- the plan and its cost
def estimate(fam: Family, raw_dir: Path, seconds_per_run: float | None = None) -> dict[str, float] | None:
    """Seconds per run of each row of ``fam`` (None: nothing to estimate from).  From ``seconds_per_run`` when given,
    else the family's timing record (FedAvg; Local from the every-client run where a cohort trains), else the mean
    wall time of the family's own recorded runs; scaled per method by :func:`method_factors`."""
    factors = method_factors(fam, raw_dir)
    timing = {r["cell"]["arm"]: r for r in load_records(TIMING, raw_dir) if r["cell"].get("family") == fam.name}
    base = seconds_per_run
    if base is None and "fedavg" in timing:
        base = per_run_seconds(timing["fedavg"], fam.rounds())
    if base is None:
        own = [fam.grid] if fam.tuned_from is not None else [fam.grid, fam.select_grid]
        walls = [float(r["wall-seconds"]) for g in own for r in load_records(g, raw_dir) if r.get("wall-seconds")]
        base = statistics.mean(walls) / (statistics.mean(factors.values()) if factors else 1.0) if walls else None
    if base is None:
        return None
    out = {r.name: base * factors.get(r.config["method"], 1.0) for r in fam.rows}
    if "local" in out and "every-client" in timing and seconds_per_run is None:
        local = per_run_seconds(timing["every-client"], fam.rounds())
        out["local"] = local if local is not None else out["local"]
    return out


def plan(
    design: dict[str, Family],
    raw_dir: Path,
    todo: Todo,
    seconds_per_run: float | None = None,
    seeds: list[int] | None = None,
) -> list[str]:
    """The plan's lines: per family, its runs per phase (what is left of them) and the estimated hours (``seeds``:
    grid seeds in place of each family's planned ones)."""
    lines, total_h = [], 0.0
    for fam in design.values():
        sel = selection_runs(fam)
        # the grid's size does not depend on the settings chosen: count it with each row's first setting
        first = {r.name: setting_label(fam.tuning.settings(r)[0]) for r in fam.rows}
        grid = [g for m in (True, False) for g in grid_runs(fam, first, seeds, m)]
        sel_left = todo.left(sel)
        grid_left = _grid_left(fam, grid, todo)
        per = estimate(fam, raw_dir, seconds_per_run)
        ext = (
            f"; an extension of one row's learning rate adds {len(fam.epochs) or 1} x its own values x "
            f"{len(fam.select_seeds)} seeds runs"
            if fam.tuned_from is None and fam.ladder
            else ""
        )
        text = (
            f"{fam.name}: {len(fam.rows)} methods, {len(fam.cells())} cells, {fam.clients} clients, {fam.rounds()} "
            f"rounds; {len(sel)} selection runs ({len(sel_left)} left{ext}), {len(grid)} grid runs "
            f"(about {len(grid_left)} left)"
        )
        if per:
            left = sum(per[r.row.name] for r in sel_left) + sum(per[r.row.name] for r in grid_left)
            whole = sum(per[r.row.name] for r in sel + grid)
            total_h += left / 3600
            text += (
                f"; about {statistics.mean(per.values()):.0f} s per run (Local {per.get('local', 0):.0f} s) -> "
                f"{left / 3600:.1f} h left of {whole / 3600:.1f} h"
            )
        else:
            text += "; no estimate: run --measure first"
        if lacking := missing_keys(fam):
            text += f" [cannot run yet: the app lacks {', '.join(lacking)}]"
        lines.append(text)
    loads = [r["machine"]["load-before"] for r in load_records(TIMING, raw_dir) if r["machine"].get("load-before")]
    at = f" (timing runs at a median 1-minute load of {statistics.median(loads):.0f})" if loads else ""
    lines.append(f"in all: about {total_h:.1f} h left on this machine's cores{at}, before extensions")
    return lines


def _grid_left(fam: Family, planned: list[Run], todo: Todo) -> list[Run]:
    """Planned grid runs without a good record at whatever setting (for the estimate only: the settings are chosen
    later); a stale record counts as left unless the todo keeps stale records."""
    done = set()
    for path in sorted((todo.raw_dir / fam.grid).glob("*.json")):
        rec = json.loads(path.read_text())
        if rec.get("error") or (todo.is_stale is not None and todo.is_stale(path)):
            continue
        done.add(json.dumps({k: v for k, v in rec["cell"].items() if k != "setting"}, sort_keys=True))
    return [
        r
        for r in planned
        if json.dumps({k: v for k, v in r.cell.items() if k != "setting"}, sort_keys=True) not in done
    ]


# --------------------------------------------------------------------------- running
def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__)
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--methods", default="", help="only these rows (default: every row of each family)")
    ap.add_argument("--skip", default="", help="leave these rows out (e.g. fedbn before it exists)")
    ap.add_argument("--seeds", default="", help="grid seeds (default: each family's planned seeds)")
    ap.add_argument("--phase", choices=("all", "select", "grid"), default="all")
    ap.add_argument("--retry-failed", action="store_true", help="rerun runs whose record says they failed")
    ap.add_argument("--keep-stale", action="store_true", help="keep records whose method's code changed since")
    ap.add_argument("--smoke", action="store_true", help="a tiny rehearsal of every family (2 methods, 2 rounds)")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and the estimated compute, run nothing")
    ap.add_argument("--measure", action="store_true", help="run the short timing runs the estimate comes from")
    ap.add_argument("--seconds-per-run", type=float, help="for --dry-run (default: measured, see --measure)")
    args = ap.parse_args(argv)
    raw_dir = Path(args.raw_dir)
    if args.smoke and raw_dir.resolve() == RAW.resolve():
        raise SystemExit("--smoke writes rehearsal records: give a scratch --raw-dir, not benchmarks/raw")
    design = smoke_design() if args.smoke else FAMILIES
    design = restrict(design, split(args.families), split(args.methods), split(args.skip))
    seeds = [int(s) for s in split(args.seeds)] or None
    todo = make_todo(raw_dir, args.retry_failed, args.keep_stale or args.smoke)

    if args.measure:
        runs = timing_runs(design)
        with Bench(TIMING, raw_dir=raw_dir, total=len(runs)) as bench:
            # a timing record of code that has changed since (or of the other engine's era) is timed again: the
            # estimate is of today's runs
            run_all(todo.left(runs), bench, raw_dir, Progress(len(runs)))
    for line in plan(design, raw_dir, todo, args.seconds_per_run, seeds):
        print(f"plan: {line}")
    if args.dry_run or args.measure:
        return
    design = runnable(design)
    check_methods(design)
    first = {f.name: {r.name: setting_label(f.tuning.settings(r)[-1]) for r in f.rows} for f in design.values()}
    check_configs([r for f in design.values() for r in selection_runs(f)])
    check_configs([r for f in design.values() for m in (True, False) for r in grid_runs(f, first[f.name], [0], m)])

    progress = Progress(0)
    with Bench("grids", raw_dir=raw_dir) as bench:
        if args.phase in ("all", "select"):
            run_selection(design, bench, todo, progress, None)
        if args.phase in ("all", "grid"):
            run_grids(design, bench, todo, progress, seeds)
    if todo.stale:
        print(f"{todo.stale} stale records were run again")
    if args.smoke:
        print_smoke(design, raw_dir)
    else:
        print_section(next(iter(design.values())).grid, raw_dir)  # the section shows every family


def print_smoke(design: dict[str, Family], raw_dir: Path) -> None:
    """The rehearsal's section of RESULTS.md and block of the choosing page as they would show it (for its smaller
    design), its figures drawn into ``raw_dir``."""
    print("\n" + render_grids(raw_dir, run_config_defaults(), design))
    print("\n" + render_choosing(raw_dir, design))
    for fig in figures_grids(raw_dir, design):
        print(f"drew {draw(fig, raw_dir)}")


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()

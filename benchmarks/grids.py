"""When does each method pay off? Grids over samples per client and heterogeneity, every method tuned alike (issue 25).

The grids, their rows, settings and seeds and the selection rule are specified in ``benchmarks/families.py``;
this script runs them through Flower.  One raw record per run goes to ``<raw-dir>/grids-<family>-select/`` and
``<raw-dir>/grids-<family>/``; a run whose record exists is skipped (the script resumes where it stopped;
``--retry-failed`` reruns failed ones).  Order: selection (seed by seed), then the middle cell of every method,
then the axes (seed by seed), so that a partial run is as useful as it can be.  ``benchmarks/reporting/grids.py``
renders the records: the script prints its section of RESULTS.md after its runs, ``python -m benchmarks.report``
puts it in RESULTS.md and draws its figures (``--smoke`` prints the rehearsal's section and draws its figures into
``--raw-dir``).

    python -m benchmarks.grids --dry-run             # the plan: runs per phase and the estimated hours
    benchmarks/run_committed.sh "grids"              # the full compute, on a committed tree (resumable)
    python -m benchmarks.grids --smoke --raw-dir /tmp/grids-smoke   # a tiny rehearsal (2 methods per family)
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

from benchmarks.families import (
    FAMILIES,
    SEEDS,
    SELECT_SEEDS,
    Family,
    Run,
    grid_runs,
    selection_runs,
    setting_label,
    smoke_design,
)
from benchmarks.records import RAW, load_records, run_config_defaults
from benchmarks.reporting import print_section
from benchmarks.reporting.figures import draw
from benchmarks.reporting.grids import FamilyRecords, figures_grids, render_grids
from benchmarks.running import Bench, Progress, parser, run_all, split, todo


def check_configs(runs: Iterable[Run]) -> None:
    """Every planned run config parses as the app will parse it (a conflict fails here, not hours later)."""
    from task.config import parse_settings

    problems: dict[str, str] = {}
    for run in runs:
        try:
            parse_settings(run.config)
        except ValueError as err:
            problems.setdefault(f"{run.family.name} / {run.row.name}", str(err))
    if problems:
        raise SystemExit("bad run configs:\n" + "\n".join(f"  {k}: {v}" for k, v in problems.items()))


def check_methods(design: dict[str, Family]) -> None:
    """Every row's method exists in the code that runs (e.g. FedBN is a later addition)."""
    from task.methods import METHODS

    missing = sorted({r.config["method"] for f in design.values() for r in f.rows if r.config["method"] not in METHODS})
    if missing:
        raise SystemExit(
            f"method(s) {missing} are not in this code's task.methods (allowed: {sorted(METHODS)}); merge them "
            f"first or leave them out with --skip {','.join(missing)}"
        )


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


def estimate(raw_dir: Path) -> float | None:
    """Mean wall seconds of the grid runs recorded so far (None without any)."""
    walls = [
        r["wall-seconds"]
        for p in Path(raw_dir).glob("grids-*/*.json")
        if (r := json.loads(p.read_text())).get("wall-seconds") and not r.get("error")
    ]
    return sum(walls) / len(walls) if walls else None


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__)
    ap.add_argument("--families", default=",".join(FAMILIES))
    ap.add_argument("--methods", default="", help="only these rows (default: every row of each family)")
    ap.add_argument("--skip", default="", help="leave these rows out (e.g. fedbn before it exists)")
    ap.add_argument("--select-seeds", default=",".join(map(str, SELECT_SEEDS)))
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    ap.add_argument("--phase", choices=("all", "select", "grid"), default="all")
    ap.add_argument("--retry-failed", action="store_true", help="rerun runs whose record says they failed")
    ap.add_argument("--smoke", action="store_true", help="a tiny rehearsal: 2 methods per family, 1 seed, 2 rounds")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and the estimated compute, run nothing")
    ap.add_argument("--seconds-per-run", type=float, help="for --dry-run (default: the mean of recorded runs)")
    args = ap.parse_args(argv)
    raw_dir = Path(args.raw_dir)
    if args.smoke and raw_dir.resolve() == RAW.resolve():
        raise SystemExit("--smoke writes rehearsal records: give a scratch --raw-dir, not benchmarks/raw")
    design = smoke_design() if args.smoke else FAMILIES
    design = restrict(design, split(args.families), split(args.methods), split(args.skip))
    select_seeds = [0] if args.smoke else [int(s) for s in split(args.select_seeds)]
    seeds = [0] if args.smoke else [int(s) for s in split(args.seeds)]

    planned_select = [r for f in design.values() for r in selection_runs(f, select_seeds)]
    # the grid's size does not depend on the settings chosen: count it with each row's first setting
    planned_grid = [
        r
        for m in (True, False)
        for f in design.values()
        for r in grid_runs(f, {w.name: setting_label(w.settings(f.lrs)[0]) for w in f.rows}, seeds, m)
    ]
    n_sel = len(todo(planned_select, raw_dir, args.retry_failed))
    recorded_grid = {
        (r.grid, json.dumps({k: v for k, v in r.cell.items() if k != "setting"}, sort_keys=True)) for r in planned_grid
    }
    n_grid_done = _grid_done(design, raw_dir, recorded_grid)
    n_grid = len(planned_grid) - n_grid_done
    per_run = args.seconds_per_run or estimate(raw_dir)
    families = ", ".join(f"{f.name}: {len(f.rows)} methods x {len(f.cells())} cells" for f in design.values())
    print(
        f"plan: {len(planned_select)} selection runs ({n_sel} to do) and {len(planned_grid)} grid runs "
        f"(about {n_grid} to do) over {families}"
    )
    if per_run:
        hours = (n_sel + n_grid) * per_run / 3600
        print(f"estimate: {per_run:.0f} s per run -> {hours:.1f} h for what is left (2 cores)")
    if args.dry_run:
        return
    check_methods(design)
    check_configs(planned_select + planned_grid)

    progress = Progress(n_sel + n_grid)
    with Bench("grids", raw_dir=raw_dir, total=n_sel + n_grid) as bench:
        if args.phase in ("all", "select"):
            run_all(todo(planned_select, raw_dir, args.retry_failed), bench, raw_dir, progress)
        if args.phase in ("all", "grid"):
            chosen_by_family = {}
            for fam in design.values():
                chosen = {}
                for name, sel in FamilyRecords.load(fam, raw_dir).selection.items():
                    if sel.chosen is None:
                        print(f"{fam.name} / {name}: no grid runs yet: {sel.reason}")
                        continue
                    chosen[name] = sel.chosen
                chosen_by_family[fam.name] = chosen
            # the middle cell at every seed first, then the axes seed by seed across the families, so that a run
            # stopped part-way leaves whole seeds of every family rather than one family's axes and nothing else
            for middle, seed_groups in ((True, [seeds]), (False, [[s] for s in seeds])):
                for group in seed_groups:
                    runs = [
                        r for fam in design.values() for r in grid_runs(fam, chosen_by_family[fam.name], group, middle)
                    ]
                    run_all(todo(runs, raw_dir, args.retry_failed), bench, raw_dir, progress)
    if args.smoke:
        print_smoke(design, raw_dir)
    else:
        print_section(next(iter(design.values())).grid, raw_dir)  # the section shows every family


def print_smoke(design: dict[str, Family], raw_dir: Path) -> None:
    """The rehearsal's section as RESULTS.md would show it (for its smaller design), its figures in ``raw_dir``."""
    print("\n" + render_grids(raw_dir, run_config_defaults(), design))
    for fig in figures_grids(raw_dir, design):
        print(f"drew {draw(fig, raw_dir)}")


def _grid_done(design: dict[str, Family], raw_dir: Path, planned: set[tuple[str, str]]) -> int:
    """Grid runs already recorded (at whatever setting: for the estimate only)."""
    n = 0
    for fam in design.values():
        for rec in load_records(fam.grid, raw_dir):
            key = json.dumps({k: v for k, v in rec["cell"].items() if k != "setting"}, sort_keys=True)
            n += (fam.grid, key) in planned
    return n


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()

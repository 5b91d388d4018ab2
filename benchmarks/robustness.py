"""How each method copes with clients that lie: methods x attacks x shares of attackers x aggregation rules x seeds.

The grid, its run settings and its order are specified in ``benchmarks/attack_grid.py``: 9 methods (FedAvg, Ditto,
FedRep, FedCAC, FedC2I, pFedLIA, CFL, IFCA, PI-FL), no attack and four attacks (scaled sign-flip, label flip,
backdoor, the method's side-channel lie) by 10 % and 30 % of the clients, four rules (mean, median, trimmed mean,
Multi-Krum), 3 seeds, on the defaults a user gets (digits, 10 clients, 10 rounds, the default model).  Every run
is a user's command with nothing but these keys set:

    flwr run . --run-config "method='X' seed=S aggregator='R' attack='A' attack-share=P save-models=false \\
               checkpoint-every=0 tensorboard=false" --federation-config "num-supernodes=10"

through Flower (a private simulation SuperLink, ``flwr run``), with ``min-nodes=10`` (every round waits for all
ten nodes).  Runs are paired: the same seed gives every cell the same data.

Before any run, every planned run config is parsed as the app parses it at start-up.  A combination the app
refuses (a side-channel lie for a method without a side channel; a rule FedC2I has no average for) is not run: one
record per refused (method, attack, rule) goes to ``<raw-dir>/robustness-refused/`` with the app's reason.  One raw
record per run goes to ``<raw-dir>/robustness/`` (``<method>__<attack>__<share>__<rule>__<seed>.json``); its summary
holds the honest clients' accuracy, the backdoor's success and whether the attackers were isolated
(``docs/robustness.md``, "What a run reports").  A run whose record exists is skipped: the script resumes where it
stopped (``--retry-failed`` reruns failed ones).  Never run two of these at once on this machine: the seconds of
one would be the other's load.

    python -m benchmarks.robustness --dry-run                  # the plan by step and the estimated hours
    benchmarks/run_committed.sh "robustness"                   # every run, resumable, on a committed tree
    benchmarks/run_committed.sh "robustness --methods fedavg,fedcac --seeds 0"   # a part of it
    python -m benchmarks.report                                # RESULTS.md, its figure, docs/robustness.md's block
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.attack_grid import (
    AGGREGATORS,
    ATTACKS,
    CLIENTS,
    GRID,
    METHODS,
    REFUSED_GRID,
    SEEDS,
    SHARES,
    STEPS,
    Cell,
    cells,
    in_order,
    step_of,
)
from benchmarks.records import load_records, record_path, write_record
from benchmarks.reporting import print_section
from benchmarks.running import Bench, Progress, command_line, parser, record_from_run, run_all, split, todo

#: where a per-run time comes from before this grid has any run: runs of the same settings (10 clients, the
#: default rounds and model) whose records keep their wall time
SIMILAR_GRIDS = ("privacy",)


@dataclass
class Run:
    """One planned run (what ``running.run_all`` runs)."""

    of: Cell
    grid: str = GRID
    clients: int = CLIENTS

    @property
    def cell(self) -> dict[str, Any]:
        return self.of.coordinates

    @property
    def config(self) -> dict[str, Any]:
        return self.of.config

    @property
    def extra(self) -> dict[str, Any]:
        return {}


def expected_failure(run: Run) -> bool:
    """An attack may break a run (a model driven to NaN stops it: the record keeps its rounds until then); a run
    without an attack that fails, five in a row, means a broken set-up."""
    return run.of.attack != "none"


def refusal(cell: Cell) -> str | None:
    """The reason the app refuses ``cell``'s run config at start-up (its ``ConfigConflict`` or ``ValueError``), or
    None when it accepts it."""
    from task.config import parse_settings

    try:
        parse_settings(cell.config)
    except ValueError as err:
        return f"{type(err).__name__}: {err}"
    return None


def split_refused(planned: list[Cell]) -> tuple[list[Cell], dict[tuple[str, str, str], str]]:
    """(the cells the app accepts, the reason of each refused (method, attack, rule)); a reason that depended on the
    share or the seed would make one record per refusal wrong, so it stops the script."""
    accepted: list[Cell] = []
    reasons: dict[tuple[str, str, str], str] = {}
    for cell in planned:
        why = refusal(cell)
        key = (cell.method, cell.attack, cell.aggregator)
        if why is None:
            if key in reasons:
                raise SystemExit(f"{key} is refused at some share or seed and not at {cell}: fix attack_grid.py")
            accepted.append(cell)
            continue
        if reasons.setdefault(key, why) != why:
            raise SystemExit(f"{key} is refused for different reasons at different shares or seeds: {why}")
    return accepted, reasons


def write_refusals(reasons: dict[tuple[str, str, str], str], raw_dir: Path) -> int:
    """One record per refused (method, attack, rule) that has none yet (the reason in ``error`` and ``refused``)."""
    n = 0
    for (method, attack, aggregator), why in reasons.items():
        cell = Cell(method, attack, SHARES[-1], aggregator, SEEDS[0])
        coords = cell.refusal_coordinates
        if record_path(REFUSED_GRID, coords, raw_dir).exists():
            continue
        rec = record_from_run(
            None,
            grid=REFUSED_GRID,
            cell=coords,
            command=command_line(),
            num_supernodes=CLIENTS,
            run_config=cell.config,
            error=why,
        )
        rec["refused"] = why
        write_record(rec, raw_dir)
        n += 1
    return n


def seconds_per_run(raw_dir: Path) -> tuple[dict[str, float], float | None, str]:
    """Mean wall seconds per run of each method and of all, from this grid's runs so far, else from grids of the
    same settings; and where they come from."""
    for grids in ((GRID,), SIMILAR_GRIDS):
        walls: dict[str, list[float]] = {}
        for grid in grids:
            for r in load_records(grid, raw_dir):
                wall = r.get("wall-seconds")  # flwr run end to end, Ray's start-up included
                if wall and not r.get("error"):
                    walls.setdefault(r["cell"]["method"], []).append(float(wall))
        if walls:
            every = [w for ws in walls.values() for w in ws]
            source = f"{len(every)} recorded runs of {', '.join(grids)}"
            return {m: sum(ws) / len(ws) for m, ws in walls.items()}, sum(every) / len(every), source
    return {}, None, "no recorded run"


def print_plan(runs: list[Run], left: list[Run], reasons: dict, raw_dir: Path, per_run: float | None) -> None:
    by_method, overall, source = seconds_per_run(raw_dir)
    if per_run is not None:
        by_method, overall, source = {}, per_run, "--seconds-per-run"

    def hours(rs: list[Run]) -> str:
        if overall is None:
            return "?"
        return f"{sum(by_method.get(r.of.method, overall) for r in rs) / 3600:.1f} h"

    refused_cells = sum(1 for c in cells() if (c.method, c.attack, c.aggregator) in reasons)
    print(
        f"plan: {len(cells())} cells of the full grid ({len(METHODS)} methods x {len(ATTACKS) - 1} attacks x "
        f"{len(SHARES)} shares + no attack, x {len(AGGREGATORS)} rules x {len(SEEDS)} seeds); "
        f"{refused_cells} refused by the app at start-up ({len(reasons)} refusal records, not run); "
        f"{len(runs)} runs selected here, {len(runs) - len(left)} recorded, {len(left)} to do"
    )
    per = ", ".join(f"{m} {s:.0f} s" for m, s in sorted(by_method.items()))
    print(f"seconds per run (wall, from {source}): " + (f"{overall:.0f} s on average" if overall else "unknown"))
    if per:
        print(f"  by method: {per}")
    steps = Counter(step_of(r.of) for r in left)
    for i, step in enumerate(STEPS):
        mine = [r for r in left if step_of(r.of) == i]
        print(f"  step {i + 1}: {step.name}: {steps.get(i, 0)} to do, about {hours(mine)}")
    print(f"  all that is left: {len(left)} runs, about {hours(left)} on this machine (2 cores, one run at a time)")


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--attacks", default=",".join(ATTACKS))
    ap.add_argument("--shares", default=",".join(map(str, SHARES)), help="shares of attacking clients")
    ap.add_argument("--aggregators", default=",".join(AGGREGATORS))
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    ap.add_argument("--retry-failed", action="store_true", help="rerun runs whose record says they failed")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and the estimated hours, run nothing")
    ap.add_argument("--seconds-per-run", type=float, help="for --dry-run (default: measured, see the output)")
    args = ap.parse_args(argv)
    raw_dir = Path(args.raw_dir)
    chosen = {
        "methods": (split(args.methods), METHODS),
        "attacks": (split(args.attacks), ATTACKS),
        "aggregators": (split(args.aggregators), AGGREGATORS),
    }
    for name, (asked, allowed) in chosen.items():
        if bad := [v for v in asked if v not in allowed]:
            raise SystemExit(f"unknown {name} {bad}; this benchmark has: {', '.join(allowed)}")
    shares = [float(s) for s in split(args.shares)]
    if bad_shares := [s for s in shares if s not in SHARES]:
        raise SystemExit(f"unknown shares {bad_shares}; this benchmark has: {', '.join(map(str, SHARES))}")
    planned = in_order(
        cells(
            split(args.methods),
            split(args.attacks),
            shares,
            split(args.aggregators),
            [int(s) for s in split(args.seeds)],
        )
    )
    accepted, reasons = split_refused(cells())  # the refusals of the whole grid: the report lists them all
    runs = [Run(c) for c in planned if c in set(accepted)]
    left = todo(runs, raw_dir, args.retry_failed)
    print_plan(runs, left, reasons, raw_dir, args.seconds_per_run)
    if args.dry_run:
        return
    print(f"recorded {write_refusals(reasons, raw_dir)} new refusals in {raw_dir / REFUSED_GRID}/")
    with Bench(GRID, raw_dir=raw_dir, total=len(left)) as bench:
        run_all(left, bench, raw_dir, Progress(len(left)), expected_failure)
    print_section(GRID, raw_dir)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()

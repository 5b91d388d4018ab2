"""How each method copes with clients that lie: methods (each on the data where its mechanism acts) x attacks x
shares of attackers x aggregation rules x seeds.

The grid is data, declared in ``benchmarks/attack_grid.py``: every method in its settings, no attack and eleven
attacks (sign-flip, noise, free-rider, label flip, backdoor, model replacement, the size lie, ALIE, min-max, min-sum,
the method's side-channel lie where it moves an honest run) by 10 % and 30 % of the clients, every rule the method
accepts (mean, median, trimmed mean, Multi-Krum, Bulyan, norm bound, FLTrust), 5 seeds, on 10 clients and the defaults
a user gets otherwise.  Every run is a user's command with nothing but these keys set, e.g.:

    flwr run . --run-config "method='X' seed=S aggregator='R' attack='A' attack-share=P save-models=false \\
               checkpoint-every=0 tensorboard=false" --federation-config "num-supernodes=10"

Here each runs on the in-process engine (``--jobs`` workers; ``--engine flwr-run`` for Flower's Ray runtime) with
``min-nodes=10`` (every round waits for all ten nodes), one raw record per run; ``--write-plan FILE`` writes the same
runs as a grid file for ``python -m server_app.sweep --grid FILE`` (results folders, no records).  Runs are paired:
the same seed gives every cell of a setting the same data.

Before any run, every planned run config is parsed as the app parses it at start-up.  A combination the app refuses
(a side-channel lie for a method without a side channel; a rule a method has no average for) is not run: one record
per refused (setting, method, attack, rule) goes to ``<raw-dir>/robustness-refused/`` with the app's reason.  One raw
record per run goes to ``<raw-dir>/robustness/``; its summary holds the honest clients' accuracy, the backdoor's
success, whether the attackers were isolated and in how many averages more clients lied than the rule assumes
(``docs/robustness.md``, "What a run reports").  A run whose record exists is skipped: the script resumes where it
stopped (``--retry-failed`` reruns failed ones).

    python -m benchmarks.robustness --dry-run                  # the plan, its size and the estimated hours
    python -m benchmarks.robustness --write-plan plan.toml     # the runs, for python -m server_app.sweep --grid
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
    ATTACKS,
    CLIENTS,
    GRID,
    KNOWING,
    METHODS,
    NO_ATTACK,
    REFUSED_GRID,
    RULES,
    SEEDS,
    SHARES,
    Cell,
    cells,
    in_order,
    sweep_grid,
)
from benchmarks.records import load_records, record_path, write_record
from benchmarks.reporting import print_section
from benchmarks.reporting.freshness import stale_now
from benchmarks.running import Bench, Progress, Todo, command_line, parser, record_from_run, run_all, split

#: where a per-run time comes from before this grid has any run: runs of the same settings (10 clients, the
#: default rounds and model) whose records keep their wall time
SIMILAR_GRIDS = ("privacy",)
#: what an attack that estimates the honest updates costs against a run without: each attacker trains once per client
#: per round besides its own training (measured on the engine: 52 s against 9 s without an attack, 10 clients, 30 %)
KNOWING_FACTOR = 5.0

RefusalKey = tuple[str, str, str, str]


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
    return run.of.attack != NO_ATTACK


def refusal(cell: Cell) -> str | None:
    """The reason the app refuses ``cell``'s run config at start-up (its ``ConfigConflict`` or ``ValueError``), or
    None when it accepts it."""
    from task.config import parse_settings

    try:
        parse_settings(cell.config)
    except ValueError as err:
        return f"{type(err).__name__}: {err}"
    return None


def refusal_key(cell: Cell) -> RefusalKey:
    return (cell.setting, cell.method, cell.attack, cell.aggregator)


def split_refused(planned: list[Cell]) -> tuple[list[Cell], dict[RefusalKey, str]]:
    """(the cells the app accepts, the reason of each refused (setting, method, attack, rule)); a reason that depended
    on the share or the seed would make one record per refusal wrong, so it stops the script."""
    accepted: list[Cell] = []
    reasons: dict[RefusalKey, str] = {}
    checked: dict[tuple[RefusalKey, float], str | None] = {}
    for cell in planned:
        key = refusal_key(cell)
        if (key, cell.share) not in checked:  # the seed changes no refusal: one parse per share
            checked[key, cell.share] = refusal(cell)
        why = checked[key, cell.share]
        if why is None:
            if key in reasons:
                raise SystemExit(f"{key} is refused at some share and not at {cell}: fix attack_grid.py")
            accepted.append(cell)
            continue
        if reasons.setdefault(key, why) != why:
            raise SystemExit(f"{key} is refused for different reasons at different shares: {why}")
    return accepted, reasons


def write_refusals(reasons: dict[RefusalKey, str], raw_dir: Path) -> int:
    """One record per refused (setting, method, attack, rule) that has none yet (the reason in ``error`` and
    ``refused``)."""
    n = 0
    for (setting, method, attack, aggregator), why in reasons.items():
        cell = Cell(setting, method, attack, SHARES[-1] if attack != NO_ATTACK else 0.0, aggregator, SEEDS[0])
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

    def seconds(r: Run) -> float:
        base = by_method.get(r.of.method, overall or 0.0)
        return base * (KNOWING_FACTOR if r.of.attack in KNOWING else 1.0)

    def hours(rs: list[Run]) -> str:
        return "?" if overall is None else f"{sum(seconds(r) for r in rs) / 3600:.1f} h"

    every = cells()
    refused_cells = sum(1 for c in every if (c.setting, c.method, c.attack, c.aggregator) in reasons)
    print(
        f"plan: {len(every)} cells of the full grid ({len(METHODS)} methods in their settings, {len(ATTACKS)} attacks "
        f"x {len(SHARES)} shares + no attack, {len(RULES)} rules, {len(SEEDS)} seeds); {refused_cells} refused by the "
        f"app at start-up ({len(reasons)} refusal records, not run); {len(every) - refused_cells} runs planned; "
        f"{len(runs)} runs selected here, {len(runs) - len(left)} recorded, {len(left)} to do"
    )
    per = ", ".join(f"{m} {s:.0f} s" for m, s in sorted(by_method.items()))
    print(f"seconds per run (wall, from {source}): " + (f"{overall:.0f} s on average" if overall else "unknown"))
    if per:
        print(f"  by method: {per}")
    print(f"  attacks that estimate the honest updates ({', '.join(KNOWING)}): counted {KNOWING_FACTOR:g} times")
    by_seed = Counter(r.of.seed for r in left)
    for seed in sorted(by_seed):
        mine = [r for r in left if r.of.seed == seed]
        print(f"  seed {seed}: {by_seed[seed]} to do, about {hours(mine)}")
    print(f"  all that is left: {len(left)} runs, about {hours(left)} of one core")


def main(argv: list[str] | None = None) -> None:
    ap = parser(__doc__)
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--attacks", default=",".join([NO_ATTACK, *ATTACKS]))
    ap.add_argument("--shares", default=",".join(map(str, SHARES)), help="shares of attacking clients")
    ap.add_argument("--aggregators", default=",".join(RULES))
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)))
    ap.add_argument("--retry-failed", action="store_true", help="rerun runs whose record says they failed")
    ap.add_argument("--keep-stale", action="store_true", help="keep records whose method's code changed since")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and the estimated hours, run nothing")
    ap.add_argument("--seconds-per-run", type=float, help="for --dry-run (default: measured, see the output)")
    ap.add_argument(
        "--write-plan", help="write the runs left to do as a grid file for python -m server_app.sweep --grid"
    )
    args = ap.parse_args(argv)
    raw_dir = Path(args.raw_dir)
    chosen = {
        "methods": (split(args.methods), tuple(METHODS)),
        "attacks": (split(args.attacks), (NO_ATTACK, *ATTACKS)),
        "aggregators": (split(args.aggregators), RULES),
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
    kept = set(accepted)
    runs = [Run(c) for c in planned if c in kept]
    # a record whose method's code changed since it ran is run again (unless --keep-stale)
    left = Todo(raw_dir, args.retry_failed, None if args.keep_stale else stale_now(raw_dir)).left(runs)
    print_plan(runs, left, reasons, raw_dir, args.seconds_per_run)
    if args.dry_run:
        return
    print(f"recorded {write_refusals(reasons, raw_dir)} new refusals in {raw_dir / REFUSED_GRID}/")
    if args.write_plan:  # the sweep runs the plan; the refusals' records are this script's
        Path(args.write_plan).write_text(sweep_grid(r.of for r in left))
        print(f"wrote {len(left)} runs to {args.write_plan}: python -m server_app.sweep --grid {args.write_plan}")
        return
    with Bench(GRID, raw_dir=raw_dir, total=len(left)) as bench:
        run_all(left, bench, raw_dir, Progress(len(left)), expected_failure)
    print_section(GRID, raw_dir)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()

"""Running the equal-tuning protocol of ``benchmarks/families.py`` on an engine: check the planned run configs, time a
family's runs, run the selection with its learning-rate extensions, then every row at its chosen setting.

The library under ``python -m benchmarks.grids`` (pflower's families) and ``python -m benchmarks.own_data`` (a
user's federation): both run the same protocol through it.  It reads the selection from the records
(``families.select``) and runs through ``running.py``; it renders nothing.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.families import Family, Run, Selection, grid_runs, select, selection_runs
from benchmarks.records import load_records, run_config_defaults
from benchmarks.running import Bench, Progress, Todo, run_all

TIMING = "grids-timing"
#: per family, the timing runs: FedAvg as planned and, where a cohort trains per round, FedAvg with every client
#: training every round (what Local costs there: it trains every client every round)
TIMING_ARMS = {"fedavg": {}, "every-client": {"fraction-train": 1.0}}


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


def selections(fam: Family, raw_dir: Path) -> dict[str, Selection]:
    """Every row's selection from the family's selection records under ``raw_dir`` (``families.select``)."""
    recs = load_records(fam.select_grid, raw_dir)
    return {row.name: select(fam, row, recs) for row in fam.rows}


def chosen_settings(fam: Family, raw_dir: Path) -> dict[str, str]:
    """The setting each row of ``fam`` chose under the current plan (rows not chosen yet left out, with a line)."""
    out = {}
    for name, sel in selections(fam, raw_dir).items():
        if sel.chosen is None:
            print(f"{fam.name} / {name}: no grid runs yet: {sel.reason}")
        else:
            out[name] = sel.chosen
    return out


def extension_runs(design: dict[str, Family], raw_dir: Path) -> list[Run]:
    """The selection runs the current choices wait for: rows whose learning rate sits at an edge of their grid."""
    out = []
    for fam in design.values():
        if fam.tuned_from is not None:
            continue
        for name, sel in selections(fam, raw_dir).items():
            if sel.pending is not None:
                out += selection_runs(fam, lrs=[sel.pending], rows=[fam.row(name)])
    return out


@dataclass(frozen=True)
class TimingRun:
    """A short run of a family's middle cell that the estimate of its runs' seconds comes from."""

    family: Family
    arm: str
    config: dict[str, Any]

    @property
    def grid(self) -> str:
        return TIMING

    @property
    def cell(self) -> dict[str, Any]:
        return {"family": self.family.name, "arm": self.arm}

    @property
    def clients(self) -> int:
        return self.family.clients

    @property
    def extra(self) -> dict[str, Any]:
        return {}


def timing_runs(design: dict[str, Family], known: Iterable[str] | None = None) -> list[TimingRun]:
    """Per family, a run of FedAvg at its middle cell for one evaluation period plus one round (at least 3 rounds),
    and the same with every client training where a cohort trains per round.  A key the app lacks is left out, and
    a partition it lacks becomes plain Dirichlet (the closest it has); the record's config says what ran."""
    known = set(run_config_defaults() if known is None else known)
    from task.data.catalogue import PARTITIONS

    out = []
    for fam in design.values():
        n, h = fam.middle
        cfg = {**fam.cell_config(n, h), "method": "fedavg", "seed": 0}
        cfg["num-server-rounds"] = max(3, int(cfg.get("eval-every", 1)) + 1)
        cfg = {k: v for k, v in cfg.items() if k in known}
        if cfg.get("partition") not in PARTITIONS:
            cfg["partition"] = "dirichlet"
        for arm, over in TIMING_ARMS.items():
            if over and float(cfg.get("fraction-train", 1.0)) >= 1.0:
                continue
            out.append(TimingRun(fam, arm, {**cfg, **over}))
    return out


def per_run_seconds(rec: dict[str, Any], rounds: int) -> float | None:
    """A run of ``rounds`` rounds, estimated from a timing record: its start-up (wall time less the rounds after the
    first) and the mean seconds of its later rounds (evaluations included in their proportion)."""
    secs = [r.get("seconds") for r in rec.get("rounds", [])]
    if rec.get("error") or not rec.get("wall-seconds") or len(secs) < 2 or None in secs:
        return None
    later = sum(secs[1:]) / (len(secs) - 1)
    start = float(rec["wall-seconds"]) - sum(secs[1:])
    return start + (rounds - 1) * later


def method_factors(fam: Family, raw_dir: Path) -> dict[str, float]:
    """Per method, its mean wall seconds per run over FedAvg's in the records of the tuned family (any procedure)."""
    tuned = fam.tuning
    walls: dict[str, list[float]] = {}
    for rec in load_records(tuned.grid, raw_dir):
        if rec.get("wall-seconds") and not rec.get("error"):
            walls.setdefault(rec["cell"]["method"], []).append(float(rec["wall-seconds"]))
    base = statistics.mean(walls["fedavg"]) if walls.get("fedavg") else None
    return {m: statistics.mean(v) / base for m, v in walls.items()} if base else {}


def run_selection(
    design: dict[str, Family], bench: Bench, todo: Todo, progress: Progress, seeds: list[int] | None
) -> None:
    runs = todo.left([r for f in design.values() for r in selection_runs(f, seeds)])
    progress.total += len(runs)
    run_all(runs, bench, todo.raw_dir, progress)
    # extensions until no choice waits for one (each round of them runs every pending row's next learning rate)
    while ext := todo.left(extension_runs(design, todo.raw_dir)):
        progress.total += len(ext)
        print(f"learning-rate extensions: {len(ext)} runs", flush=True)
        run_all(ext, bench, todo.raw_dir, progress)


def run_grids(design: dict[str, Family], bench: Bench, todo: Todo, progress: Progress, seeds: list[int] | None) -> None:
    chosen = {fam.name: chosen_settings(fam, todo.raw_dir) for fam in design.values()}
    # the middle cell at every seed first, then the axes seed by seed across the families, so that a run stopped
    # part-way leaves whole seeds of every family rather than one family's axes and nothing else
    all_seeds = sorted({s for f in design.values() for s in (seeds or f.seeds)})
    for middle, groups in ((True, [all_seeds]), (False, [[s] for s in all_seeds])):
        for group in groups:
            runs = [
                r
                for fam in design.values()
                for r in grid_runs(fam, chosen[fam.name], [s for s in group if s in (seeds or fam.seeds)], middle)
            ]
            left = todo.left(runs)
            progress.total += len(left)
            run_all(left, bench, todo.raw_dir, progress)

"""When does each method pay off? Grids over samples per client and heterogeneity, every method tuned alike (issue 25).

Two families on digits, each method of a family run at every cell of its grid:

- label skew (Dirichlet labels): local, fedavg, fedper, fedrep, lgfedavg, ditto, fedrod, fedcac, pfedlia, cfl, ifca,
  pifl, fedsoft;
- feature shift (IID labels, one visual transform per client, several clients per domain): local, fedavg, fedrep,
  ditto, fedc2i and its ablations (lambda-only, Lambda-only, Lambda-local), client2vec, moon, fedbn.

Each family's grid is two axes through one middle cell: training samples per client (``train-samples``, a cap
on each client's training split; the largest value needs ``data-copies``, stated in ``SAMPLES``) at the middle
heterogeneity, and heterogeneity (Dirichlet alpha and pathological classes per client; the number of domains) at
the middle samples per client.

Equal tuning: every method gets the same budget, ``len(LR) x 2`` settings: the learning rate (``LR``) times two
values of one key of its own (``Row.key``; methods with no key of their own tune ``local-epochs``, the E of
FedAvg).  Phase 1 (selection) runs every setting at the middle cell with ``evaluate-split='validation'``: clients
score on their validation splits and no method sees a test split.  A method's setting is the one with the best
mean validation accuracy over the selection seeds (ties: the first in grid order); it is held across the grid.
Phase 2 runs the chosen setting at every cell on the test splits, seeds ``--seeds``.  Every run shares the
family's ``base`` run config (``val-fraction`` 0.2 in selection and reporting runs alike, so that both use the
same train / validation / test split).

One raw record per run goes to ``<raw-dir>/grids-<family>-select/`` and ``<raw-dir>/grids-<family>/``; a run
whose record exists is skipped (the script resumes where it stopped; ``--retry-failed`` reruns failed ones).
Order: selection (seed by seed), then the middle cell of every method, then the axes (seed by seed), so that a
partial run is as useful as it can be.  ``benchmarks/reporting/grids.py`` renders the records: the script prints
its section of RESULTS.md after its runs, ``python benchmarks/report.py`` puts it in RESULTS.md and draws its
figures (``--smoke`` prints the rehearsal's section and draws its figures into ``--raw-dir``).

    python benchmarks/grids.py --dry-run            # the plan: runs per phase and the estimated hours
    benchmarks/run_committed.sh "grids.py"          # the full compute, on a committed tree (resumable)
    python benchmarks/grids.py --smoke --raw-dir /tmp/grids-smoke   # a tiny rehearsal (2 methods per family)
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import RAW, Bench, add_common_args, cell_name, load_records, print_report, split, write_record

#: the learning rates every method is tuned over (SGD with the default momentum 0.9; the app's default is 0.05)
LR = (0.01, 0.05)
#: selection runs every setting at one seed: the committed selection (96 runs) was made so, to keep the compute of
#: both families to a few hours on 2 cores; a second seed would double it and could change the chosen settings,
#: which would leave the grid runs made with the first choice unused
SELECT_SEEDS = (0,)
SEEDS = (0, 1, 2)
ROUNDS = 20
CLIENTS = 10
#: keys of every run of the grids: a validation split large enough to select on (about 36 samples per client at
#: 10 clients; the same split in selection and reporting runs), no model files or checkpoints (only the scores are
#: kept)
COMMON = {"val-fraction": 0.2, "save-models": False, "checkpoint-every": 0}


@dataclass(frozen=True)
class Row:
    """One line of a family's tables: a method (or an ablation of one), and the key of its own it is tuned on."""

    name: str
    config: dict[str, Any]
    key: str
    values: tuple[Any, ...]

    def settings(self, lrs: Iterable[float] = LR) -> list[dict[str, Any]]:
        """The tuning grid: every learning rate with every value of the row's key, in grid order."""
        return [{"lr": lr, self.key: v} for lr, v in itertools.product(lrs, self.values)]


def setting_label(setting: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in setting.items())


def _row(name: str, key: str = "local-epochs", values: tuple = (1, 2), **config: Any) -> Row:
    return Row(name, {"method": name, **config}, key, values)


@dataclass(frozen=True)
class Family:
    """A family of methods and its grid: two axes through the middle cell."""

    name: str
    title: str
    clients: int
    base: dict[str, Any]
    #: training samples per client -> the extra run config of that value
    samples: dict[int, dict[str, Any]]
    #: heterogeneity label -> its run config
    heterogeneity: dict[str, dict[str, Any]]
    middle: tuple[int, str]
    rows: tuple[Row, ...]
    heterogeneity_title: str = "heterogeneity"
    lrs: tuple[float, ...] = LR

    @property
    def select_grid(self) -> str:
        return f"grids-{self.name}-select"

    @property
    def grid(self) -> str:
        return f"grids-{self.name}"

    def cells(self) -> list[tuple[int, str]]:
        """The grid's cells: the middle cell, then the samples axis, then the heterogeneity axis."""
        n, h = self.middle
        out = [self.middle]
        out += [(s, h) for s in self.samples if (s, h) not in out]
        out += [(n, x) for x in self.heterogeneity if (n, x) not in out]
        return out

    def cell_config(self, samples: int, heterogeneity: str) -> dict[str, Any]:
        return {
            **COMMON,
            **self.base,
            "train-samples": samples,
            **self.samples[samples],
            **self.heterogeneity[heterogeneity],
            "min-nodes": self.clients,
        }

    def row(self, name: str) -> Row:
        return next(r for r in self.rows if r.name == name)


_C2I = {"method": "fedc2i"}
FAMILIES: dict[str, Family] = {
    "label-skew": Family(
        name="label-skew",
        title="Label skew",
        clients=CLIENTS,
        base={"partition": "dirichlet", "alpha": 0.5, "num-server-rounds": ROUNDS},
        # 10 clients x 250 training samples is more than digits' 1,797 images hold: jittered copies of the data set
        samples={25: {}, 50: {}, 100: {}, 250: {"data-copies": 3}},
        heterogeneity={
            "dirichlet-0.1": {"partition": "dirichlet", "alpha": 0.1},
            "dirichlet-0.5": {"partition": "dirichlet", "alpha": 0.5},
            "dirichlet-1.0": {"partition": "dirichlet", "alpha": 1.0},
            "pathological-2": {"partition": "pathological", "classes-per-client": 2},
        },
        middle=(50, "dirichlet-0.5"),
        rows=(
            _row("local"),
            _row("fedavg"),
            _row("fedper"),
            _row("fedrep", "head-epochs", (1, 5)),
            _row("lgfedavg"),
            _row("ditto", "ditto-lambda", (0.1, 1.0)),
            _row("fedrod"),
            _row("fedcac", "beta", (7, 15)),  # spec fedcac §3: beta about T/3 to T/2 for short runs; default 15
            _row("pfedlia", "optics-min-samples", (2, 5)),  # must not exceed the smallest true group
            # a cluster splits once its mean update norm is below eps1 (0.4) and some member's is above eps2; at the
            # middle cell the largest norm fell below 0.5 before the mean fell below 0.4, so the default 1.6 never
            # splits (CFL = FedAvg) and 0.3 lets clusters split
            _row("cfl", "cfl-eps2", (0.3, 1.6)),
            _row("ifca", "tiers", (2, 4)),
            _row("pifl", "tiers", (2, 4)),
            _row("fedsoft", "fedsoft-lambda", (0.1, 1.0)),
        ),
    ),
    "feature-shift": Family(
        name="feature-shift",
        title="Feature shift",
        clients=CLIENTS,
        base={"partition": "iid", "feature-shift": 2, "num-server-rounds": ROUNDS},
        samples={25: {}, 50: {}, 100: {}, 250: {"data-copies": 3}},
        # client i has domain i % domains: 10, 5 and 2 clients per domain
        heterogeneity={
            "domains-1": {"feature-shift": 1},
            "domains-2": {"feature-shift": 2},
            "domains-5": {"feature-shift": 5},
        },
        heterogeneity_title="domains",
        middle=(50, "domains-2"),
        rows=(
            _row("local"),
            _row("fedavg"),
            _row("fedrep", "head-epochs", (1, 5)),
            _row("ditto", "ditto-lambda", (0.1, 1.0)),
            Row("fedc2i", dict(_C2I), "gamma", (1.0, 5.0)),
            Row("lambda-only", {**_C2I, "c2i-variant": "client-level"}, "gamma", (1.0, 5.0)),
            Row("Lambda-only", {**_C2I, "c2i-variant": "class-level-averaged-extractor"}, "gamma", (1.0, 5.0)),
            Row("Lambda-local", {**_C2I, "c2i-variant": "class-level-own-extractor"}, "gamma", (1.0, 5.0)),
            _row("client2vec", "c2v-local-weight", (0.1, 1.0)),
            _row("moon", "moon-mu", (0.1, 1.0)),
            _row("fedbn"),
        ),
    ),
}


def smoke_design() -> dict[str, Family]:
    """A tiny rehearsal of the same machinery: 2 methods per family, 2 settings, 2 rounds, 4 nodes, 3 cells."""
    keep = {"label-skew": ("local", "fedavg"), "feature-shift": ("local", "fedc2i")}
    out = {}
    for name, fam in FAMILIES.items():
        n, h = fam.middle
        other = next(x for x in fam.heterogeneity if x != h)
        rows = tuple(replace(r, values=r.values[:1]) for r in fam.rows if r.name in keep[name])
        out[name] = replace(
            fam,
            clients=4,
            base={**fam.base, "num-server-rounds": 2},
            samples={25: {}, n: fam.samples[n]},
            heterogeneity={k: v for k, v in fam.heterogeneity.items() if k in (h, other)},
            rows=rows,
        )
    return out


# =========================================================================== selection (shared with the report)
@dataclass
class Selection:
    """A row's validation scores per setting and the setting chosen from them (None while it cannot be chosen)."""

    row: Row
    scores: dict[str, dict[int, float | None]] = field(default_factory=dict)  # setting -> seed -> acc (None: failed)
    seeds: list[int] = field(default_factory=list)
    chosen: str | None = None
    reason: str = ""

    def mean(self, setting: str) -> float | None:
        accs = [self.scores.get(setting, {}).get(s) for s in self.seeds]
        known = [a for a in accs if a is not None]
        return sum(known) / len(known) if accs and len(known) == len(accs) else None


def select(family: Family, row: Row, records: list[dict]) -> Selection:
    """The setting of ``row``: the best mean validation accuracy over the selection seeds found in ``records``
    (every setting must have a record for each; a failed setting cannot be chosen; ties: the first in grid order)."""
    labels = [setting_label(s) for s in row.settings(family.lrs)]
    seeds = sorted({r["cell"]["seed"] for r in records})
    sel = Selection(row, {lab: {} for lab in labels}, seeds)
    for r in records:
        lab = r["cell"].get("setting")
        if r["cell"].get("method") != row.name or lab not in sel.scores:
            continue
        ok = r.get("error") is None and (r.get("summary") or {}).get("personal-acc") is not None
        sel.scores[lab][r["cell"]["seed"]] = float(r["summary"]["personal-acc"]) if ok else None
    missing = sum(1 for lab in labels for s in seeds if s not in sel.scores[lab])
    if not seeds or missing:
        sel.reason = (
            f"selection incomplete ({len(labels) * len(seeds) - missing} of {len(labels) * max(len(seeds), 1)} runs)"
        )
        return sel
    means = [(sel.mean(lab), i, lab) for i, lab in enumerate(labels)]
    usable = [(m, -i, lab) for m, i, lab in means if m is not None]
    if not usable:
        sel.reason = "every setting failed in selection"
        return sel
    sel.chosen = max(usable)[2]
    return sel


def selections(family: Family, raw_dir: Path) -> dict[str, Selection]:
    records = load_records(family.select_grid, raw_dir)
    return {row.name: select(family, row, records) for row in family.rows}


# =========================================================================== the plan
@dataclass(frozen=True)
class Run:
    phase: str  # "select" or "grid"
    family: Family
    row: Row
    grid: str
    cell: dict[str, Any]
    config: dict[str, Any]

    def path(self, raw_dir: Path) -> Path:
        return Path(raw_dir) / self.grid / f"{cell_name(self.cell)}.json"


def selection_runs(family: Family, seeds: Iterable[int]) -> list[Run]:
    n, h = family.middle
    out = []
    for seed in seeds:  # seed by seed: a partial selection has every method at the first seed
        for row in family.rows:
            for setting in row.settings(family.lrs):
                cell = {"method": row.name, "setting": setting_label(setting), "seed": seed}
                cfg = {**family.cell_config(n, h), **row.config, **setting, "seed": seed}
                out.append(
                    Run("select", family, row, family.select_grid, cell, {**cfg, "evaluate-split": "validation"})
                )
    return out


def grid_runs(family: Family, chosen: dict[str, str], seeds: Iterable[int], middle: bool) -> list[Run]:
    """The chosen setting of every row that has one, at the middle cell (``middle``) or at the other cells."""
    cells = family.cells()[:1] if middle else family.cells()[1:]
    out = []
    for seed in seeds:
        for samples, het in cells:
            for row in family.rows:
                if row.name not in chosen:
                    continue
                setting = setting_of(family, row, chosen[row.name])
                cell = {
                    "samples": samples,
                    "heterogeneity": het,
                    "method": row.name,
                    "setting": chosen[row.name],
                    "seed": seed,
                }
                cfg = {**family.cell_config(samples, het), **row.config, **setting, "seed": seed}
                out.append(Run("grid", family, row, family.grid, cell, cfg))
    return out


def setting_of(family: Family, row: Row, label: str) -> dict[str, Any]:
    """The run config of a setting label (``lr=0.05 beta=7``) of ``row``'s grid."""
    by_label = {setting_label(s): s for s in row.settings(family.lrs)}
    if label not in by_label:
        raise ValueError(f"{row.name}: setting {label!r} is not in its grid {sorted(by_label)}")
    return by_label[label]


# =========================================================================== running
def _done(run: Run, raw_dir: Path, retry_failed: bool) -> bool:
    path = run.path(raw_dir)
    if not path.exists():
        return False
    return not (retry_failed and json.loads(path.read_text()).get("error"))


class Progress:
    def __init__(self, total: int) -> None:
        self.total, self.done, self.t0 = total, 0, time.time()
        self.walls: list[float] = []

    def line(self, wall: float) -> str:
        self.done += 1
        self.walls.append(wall)
        elapsed = time.time() - self.t0
        eta = (self.total - self.done) * (sum(self.walls) / len(self.walls))
        return f"    progress {self.done}/{self.total} runs, elapsed {_hms(elapsed)}, ETA {_hms(eta)}"


def _hms(seconds: float) -> str:
    m, s = divmod(int(seconds), 60)
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}"


#: consecutive failed runs after which the script stops (a dead SuperLink would otherwise fail every later run)
MAX_FAILURES_IN_A_ROW = 5


class Runner(Protocol):
    """What run_all needs of a bench (common.Bench): a grid to record under and a run of one cell."""

    grid: str

    def run(self, cell: dict[str, Any], cfg: dict[str, Any], clients: int) -> dict[str, Any]: ...


def run_all(runs: list[Run], bench: Runner, raw_dir: Path, progress: Progress) -> None:
    failures = 0
    for run in runs:
        bench.grid = run.grid  # one SuperLink for every grid of the script
        start = time.time()
        rec = bench.run(run.cell, run.config, run.family.clients)
        rec["wall-seconds"] = round(time.time() - start, 2)  # flwr run end to end, Ray start-up included
        write_record(rec, raw_dir)
        print(progress.line(rec["wall-seconds"]), flush=True)
        failures = failures + 1 if rec.get("error") else 0
        if failures >= MAX_FAILURES_IN_A_ROW:
            raise SystemExit(
                f"{failures} runs in a row failed (the last: {run.path(raw_dir)}); stopped. Fix the cause, then run "
                "the same command with --retry-failed"
            )


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
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
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
    add_common_args(ap)
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
    n_sel = sum(not _done(r, raw_dir, args.retry_failed) for r in planned_select)
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
            run_all([r for r in planned_select if not _done(r, raw_dir, args.retry_failed)], bench, raw_dir, progress)
        if args.phase in ("all", "grid"):
            chosen_by_family = {}
            for fam in design.values():
                chosen = {}
                for name, sel in selections(fam, raw_dir).items():
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
                    todo = [r for r in runs if not _done(r, raw_dir, args.retry_failed)]
                    run_all(todo, bench, raw_dir, progress)
    if args.smoke:
        print_smoke(design, raw_dir)
    else:
        print_report(next(iter(design.values())).grid, raw_dir)  # the section shows every family


def print_smoke(design: dict[str, Family], raw_dir: Path) -> None:
    """The rehearsal's section as RESULTS.md would show it (for its smaller design), its figures in ``raw_dir``."""
    from reporting.figures import draw
    from reporting.grids import figures_grids, render_grids
    from reporting.settings import run_config_defaults

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

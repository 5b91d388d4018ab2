"""The equal-tuning protocol on your own data, and your own choosing page.

The same protocol as pflower's grids (``benchmarks/families.py``), on the federation you describe: your data set
(``--dataset``, and ``--data-dir`` for a local copy: a ``Dataset.save_to_disk`` folder or a torchvision root, as the
run config takes them), its partition, the number of clients and the share taking part per round.  Every method is
tuned alike (the learning rate and the local epochs, plus the same number of values of at most one key of its own),
selected on the clients' validation splits over selection seeds that are not the reported ones (a learning rate chosen
at an edge of its list is extended), then run at its chosen setting on the test splits over the reported seeds.  Every
run goes through Flower's runtime on the in-process engine (``server_app.sweep``'s workers, ``--jobs``); a run whose
record exists is skipped, so running the same command again resumes.  At the end it writes your page
(``--page``) with the same generator as ``docs/choosing-a-method.md``: who wins, by how much, with 95 % intervals,
the spread over clients and who pays, and what each method costs.

Before anything runs, it times one short FedAvg run of your federation and prints the estimated compute and how to
shrink it; ``--dry-run`` stops there.  While it runs it prints a line per finished run and the progress with an ETA.

    python -m benchmarks.own_data --dataset cifar10 --data-dir ~/data/cifar10 --partition dirichlet --alpha 0.3 \\
        --clients 20 --participation 0.5 --dry-run
    python -m benchmarks.own_data --dataset cifar10 --data-dir ~/data/cifar10 --partition dirichlet --alpha 0.3 \\
        --clients 20 --participation 0.5 --methods local,fedavg,fedrep,ditto,fedcac --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from benchmarks.families import (
    EPOCHS,
    FAMILIES,
    LABEL_SKEW,
    LR,
    LR_LADDER,
    SEEDS,
    SELECT_SEEDS,
    Family,
    Row,
    grid_runs,
    selection_runs,
    setting_label,
)
from benchmarks.protocol import (
    TIMING,
    check_configs,
    chosen_settings,
    method_factors,
    per_run_seconds,
    run_grids,
    run_selection,
    timing_runs,
)
from benchmarks.records import RAW, load_records, record_path, recorded
from benchmarks.reporting.choosing import MIN_SEEDS, build_own_page, own_figure
from benchmarks.reporting.figures import draw
from benchmarks.running import Bench, Progress, Runtime, Todo, parser, run_all, split

OUT = Path("results") / "own-data"
#: the partition keys a flag sets (the rest go through --run-config)
PARTITION_KEYS = {
    "alpha": "alpha",
    "classes_per_client": "classes-per-client",
    "size_sigma": "size-sigma",
    "num_clusters": "num-clusters",
}


def run_config_values(text: str) -> dict[str, Any]:
    """``--run-config`` text read as ``flwr run`` reads it (Flower's parser): ``key=value`` pairs, TOML values."""
    if not text:
        return {}
    from flwr.common.config import parse_config_args

    try:
        return dict(parse_config_args([text]))
    except ValueError as err:  # tomli's TOMLDecodeError is a ValueError
        raise SystemExit(f"--run-config cannot be read: {err}") from None


def catalogue() -> dict[str, Row]:
    """Every method row the families tune (a method and the key of its own it is tuned on), by name."""
    out: dict[str, Row] = {}
    for fam in FAMILIES.values():
        for row in fam.rows:
            out.setdefault(row.name, row)
    return out


def heterogeneity_label(partition: str, config: dict[str, Any]) -> str:
    """The cell's name: the partition and the value that sets its skew."""
    key = {
        "dirichlet": "alpha",
        "quantity-dirichlet": "alpha",
        "pathological": "classes-per-client",
        "planted-clusters": "num-clusters",
        "planted-clusters-noisy": "num-clusters",
        "two-source": "mixture",
    }.get(partition)
    return f"{partition}-{config[key]}" if key and key in config else partition


def own_family(args: Any, extra: dict[str, Any]) -> Family:
    """The family of the user's federation: one cell (every sample a client holds, the given partition), the rows
    asked for, and the tuning and seeds asked for."""
    rows_by_name = catalogue()
    names = split(args.methods) or [r.name for r in LABEL_SKEW.rows]
    unknown = [n for n in names if n not in rows_by_name]
    if unknown:
        raise SystemExit(f"unknown method {unknown}; allowed: {sorted(rows_by_name)}")
    missing = [m for m in ("local", "fedavg") if m not in names]
    if missing:
        raise SystemExit(f"--methods must hold local and fedavg (every method is judged against both); add {missing}")
    rows = tuple(rows_by_name[n] for n in names)
    if args.no_own_keys:
        rows = tuple(replace(r, key=None, values=()) for r in rows)
    base: dict[str, Any] = {
        "dataset": args.dataset,
        "partition": args.partition,
        "num-server-rounds": args.rounds,
        "fraction-train": args.participation,
        **({"data-dir": str(Path(args.data_dir).expanduser().resolve())} if args.data_dir else {}),
        **{key: getattr(args, flag) for flag, key in PARTITION_KEYS.items() if getattr(args, flag) is not None},
        **extra,
    }
    het = heterogeneity_label(args.partition, base)
    where = f"{args.dataset}{', ' + args.data_dir if args.data_dir else ''}"
    return Family(
        name=args.name,
        title=f"Your federation: {where}",
        clients=args.clients,
        base=base,
        samples={0: {}},
        heterogeneity={het: {}},
        middle=(0, het),
        rows=rows,
        lrs=tuple(float(v) for v in split(args.lrs)),
        epochs=tuple(int(v) for v in split(args.epochs)),
        ladder=() if args.no_extend else LR_LADDER,
        select_seeds=tuple(int(v) for v in split(args.select_seeds)),
        seeds=tuple(int(v) for v in split(args.seeds)),
        question=f"{args.clients} clients, {het}, {args.participation:.0%} of them taking part per round",
    )


#: keys a timing run may change (fewer rounds; every client training for Local's cost)
TIMING_CHANGES = {"num-server-rounds", "fraction-train", "method", "seed"}


def other_federation(fam: Family, raw_dir: Path) -> str | None:
    """Why the records under ``raw_dir`` of this family's grids are not of this federation (None: they are, or there
    are none): a record is skipped when it exists, so records of another federation must not stand in for this one."""
    config = {k: v for k, v in fam.cell_config(*fam.middle).items() if k not in ("evaluate-split", "train-samples")}
    for grid in (fam.select_grid, fam.grid, TIMING):
        for rec in load_records(grid, raw_dir):
            if grid == TIMING and rec["cell"].get("family") != fam.name:
                continue
            ran = rec.get("run-config") or {}
            for key, value in config.items():
                if grid == TIMING and key in TIMING_CHANGES:
                    continue
                if key in ran and ran[key] != value:
                    return f"{grid}/ holds runs of another federation ({key}={ran[key]!r}, now {value!r})"
    return None


def planned_runs(fam: Family) -> tuple[list, list]:
    """The selection runs and the grid runs (counted with each row's first setting: the choice comes later)."""
    first = {r.name: setting_label(fam.settings(r)[0]) for r in fam.rows}
    return selection_runs(fam), grid_runs(fam, first, None, True)


def seconds_per_run(fam: Family, raw_dir: Path) -> tuple[dict[str, float], str] | None:
    """Per row, the estimated seconds of one run, and where the estimate comes from: the timing run of FedAvg
    (``TIMING``) scaled to the planned rounds; per method by its cost relative to FedAvg in this federation's own
    records when there are some, else in pflower's committed digits grids (Local: the timing run with every client
    training, where a cohort trains per round)."""
    timing = {r["cell"]["arm"]: r for r in load_records(TIMING, raw_dir) if r["cell"].get("family") == fam.name}
    if "fedavg" not in timing or (base := per_run_seconds(timing["fedavg"], fam.rounds())) is None:
        return None
    factors = method_factors(fam, raw_dir)
    source = "the runs of this federation so far"
    if not factors:
        factors = {**method_factors(FAMILIES["feature-shift"], RAW), **method_factors(LABEL_SKEW, RAW)}
        source = "pflower's committed digits grids"
    per = {r.name: base * factors.get(r.config["method"], 1.0) for r in fam.rows}
    if "every-client" in timing and (local := per_run_seconds(timing["every-client"], fam.rounds())) is not None:
        per["local"] = local
    why = (
        f"a {len(timing['fedavg'].get('rounds', []))}-round FedAvg run of this federation here, scaled to "
        f"{fam.rounds()} rounds; each method scaled by its cost against FedAvg in {source}"
    )
    return per, why


def _hours(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds < 3600 else f"{seconds / 3600:.1f} h"


def estimate_lines(fam: Family, raw_dir: Path, todo: Todo, jobs: int) -> list[str]:
    """The plan, its estimated compute, and how each option shrinks it."""
    select, grid = planned_runs(fam)
    left = todo.left(select) + todo.left(grid)
    settings = {r.name: len(fam.settings(r)) for r in fam.rows}
    per_row = {r.name: settings[r.name] * len(fam.select_seeds) + len(fam.seeds) for r in fam.rows}
    lines = [
        f"plan: {len(fam.rows)} methods, {fam.clients} clients, {fam.rounds()} rounds; selection: "
        f"{len(select)} runs (each method's settings x {len(fam.select_seeds)} selection seeds), then "
        f"{len(grid)} runs at the chosen settings ({len(fam.seeds)} seeds): {len(select) + len(grid)} runs, "
        f"{len(left)} not recorded yet"
        + (
            f"; a learning rate chosen at an edge adds {len(fam.epochs) or 1} x its own values x "
            f"{len(fam.select_seeds)} runs for that method"
            if fam.ladder
            else ""
        ),
    ]
    found = seconds_per_run(fam, raw_dir)
    if found is None:
        lines.append("estimate: none (the timing run failed; see its record)")
    else:
        per, why = found
        total = sum(per[r.row.name] for r in left)
        workers = max(1, min(jobs, len(left) or 1))
        lines.append(
            f"estimate: about {statistics.mean(per.values()):.0f} s per run ({why}): {_hours(total)} of one core, "
            f"about {_hours(total / workers)} on {workers} worker{'s' if workers > 1 else ''} (--jobs)"
        )
    per_method = ", ".join(f"{r.name} {per_row[r.name]}" for r in fam.rows)
    shrink = [
        f"--methods local,fedavg,<the methods you consider> (runs per method: {per_method})",
        f"--seeds (each reported seed is {len(fam.rows)} runs; {MIN_SEEDS} is the fewest a win is judged on)",
        f"--select-seeds (each selection seed is {sum(settings.values())} runs)",
        "--rounds (a run's time grows with its rounds)",
    ]
    if len(fam.lrs) > 1:
        shrink.append(f"--lrs (each learning rate is {len(select) // len(fam.lrs)} runs)")
    if len(fam.epochs) > 1:
        shrink.append(f"--epochs 1 (each local-epochs value is {len(select) // len(fam.epochs)} runs)")
    if any(r.key for r in fam.rows):
        shrink.append("--no-own-keys (the learning rate and the local epochs only, alike for every method)")
    if fam.ladder:
        shrink.append("--no-extend (no learning rate beyond --lrs)")
    lines.append("to shrink it: " + "; ".join(shrink))
    return lines


def arguments() -> argparse.ArgumentParser:
    ap = parser(__doc__)
    ap.set_defaults(raw_dir=str(OUT / "raw"))
    ap.add_argument("--dataset", required=True, help="a data set the run config knows (python -m task.config)")
    ap.add_argument("--data-dir", default="", help="its local copy (a save_to_disk folder or a torchvision root)")
    ap.add_argument("--partition", default="dirichlet", help="how the data is split over the clients")
    ap.add_argument("--alpha", type=float, help="Dirichlet concentration (partitions dirichlet, quantity-dirichlet)")
    ap.add_argument("--classes-per-client", type=int, help="partition pathological")
    ap.add_argument("--size-sigma", type=float, help="partition quantity-dirichlet: spread of the client sizes")
    ap.add_argument("--num-clusters", type=int, help="partitions planted-clusters*")
    ap.add_argument("--clients", type=int, required=True, help="simulated clients")
    ap.add_argument("--participation", type=float, default=1.0, help="share of the clients trained per round")
    ap.add_argument("--rounds", type=int, default=20, help="rounds of every run (default 20, as the grids)")
    ap.add_argument(
        "--run-config", default="", help="any other keys, as for flwr run: \"model='resnet8' batch-size=32\""
    )
    ap.add_argument("--methods", default="", help="the methods (default: the label-skew family's; local and fedavg)")
    ap.add_argument("--seeds", default=",".join(map(str, SEEDS)), help="the reported seeds")
    ap.add_argument("--select-seeds", default=",".join(map(str, SELECT_SEEDS)), help="seeds of the selection runs")
    ap.add_argument("--lrs", default=",".join(map(str, LR)), help="learning rates every method is tuned over")
    ap.add_argument("--epochs", default=",".join(map(str, EPOCHS)), help="local epochs every method is tuned over")
    ap.add_argument("--no-own-keys", action="store_true", help="tune no method's own key (the shared keys only)")
    ap.add_argument("--no-extend", action="store_true", help="do not extend a learning rate chosen at an edge")
    ap.add_argument("--name", default="own", help="the records' grid names: grids-<name>-select, grids-<name>")
    ap.add_argument("--page", default=str(OUT / "choosing.md"), help="your choosing page")
    ap.add_argument("--retry-failed", action="store_true", help="rerun runs whose record says they failed")
    ap.add_argument("--dry-run", action="store_true", help="time one short run, print the estimate, run nothing else")
    return ap


def main(argv: list[str] | None = None) -> None:
    given = sys.argv[1:] if argv is None else argv
    args = arguments().parse_args(given)
    raw_dir = Path(args.raw_dir)
    if raw_dir.resolve() == RAW.resolve():
        raise SystemExit("your records are yours: give --raw-dir outside benchmarks/raw (default results/own-data/raw)")
    if args.clients < 2 or not 0 < args.participation <= 1:
        raise SystemExit("--clients must be at least 2 and --participation in (0, 1]")
    if args.data_dir and not Path(args.data_dir).expanduser().exists():
        raise SystemExit(f"--data-dir {args.data_dir!r} does not exist")
    extra = run_config_values(args.run_config)
    # the page names the user's own command wherever it says how to run this family
    fam = replace(own_family(args, extra), command=shlex.join(["python", "-m", "benchmarks.own_data", *given]))
    design = {fam.name: fam}
    select, grid = planned_runs(fam)
    check_configs(select + grid)  # a bad key or value stops here, before any run
    if why := other_federation(fam, raw_dir):
        raise SystemExit(f"{raw_dir}/{why}: give another --name or --raw-dir for this federation")

    timing = [t for t in timing_runs(design) if not recorded(record_path(t.grid, t.cell, raw_dir))]
    if timing:
        print(f"timing {len(timing)} short run{'s' if len(timing) > 1 else ''} of your federation first", flush=True)
        with Bench(TIMING, raw_dir=raw_dir, total=len(timing)) as bench:
            run_all(timing, bench, raw_dir, Progress(len(timing)))
    todo = Todo(raw_dir, args.retry_failed)
    for line in estimate_lines(fam, raw_dir, todo, Runtime.jobs):
        print(line, flush=True)
    if args.dry_run:
        return
    progress = Progress(0)
    with Bench("grids", raw_dir=raw_dir) as bench:
        run_selection(design, bench, todo, progress, None)
        for name, setting in chosen_settings(fam, raw_dir).items():
            print(f"chosen on validation: {name} {setting}", flush=True)
        run_grids(design, bench, todo, progress, None)
    page = Path(args.page)
    page.parent.mkdir(parents=True, exist_ok=True)
    page.write_text(build_own_page(raw_dir, page, fam))
    figure = own_figure(raw_dir, fam)
    drawn = f" and {draw(figure, page.parent)}" if figure else ""
    print(f"wrote {page}{drawn} from the records in {raw_dir}", flush=True)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()

"""Many runs, the way a researcher runs them: ``python -m server_app.sweep [APP] [options]``.

Every run goes through Flower's simulation runtime in one process (:mod:`server_app.engine`): the same ServerApp,
ClientApp, LinkState, Grid and vce loop as ``flwr run``, without a SuperLink or a Ray cluster per run.

Input, with ``flwr run``'s syntax:

- ``--run-config "method='fedcac' seed=1"``: one run.  A value written as a TOML array is an axis:
  ``--run-config "method=['fedavg','fedcac'] seed=[0,1,2]"`` is six runs (every combination).  Each ``--run-config``
  option is one line of the grid (its axes expanded); repeat it for runs that share nothing.
- ``--federation-config "num-supernodes=10"``: the simulation's size, for every run (an array is an axis too).
- ``--grid grid.toml``: a grid as a file::

      [base]                      # every run (run-config keys)
      num-server-rounds = 20
      [axes]                      # every combination
      method = ["fedavg", "fedcac"]
      seed = [0, 1, 2]
      [federation]                # --federation-config keys, arrays are axes
      num-supernodes = 10
      [[runs]]                    # optional: further lines of the grid, each over [base], arrays expanded
      method = "pfedlia"
      warmup-rounds = [2, 5]

  ``--run-config`` / ``--federation-config`` given with ``--grid`` apply to every run of it.

Every run config is checked before anything runs (the ServerApp's own parser): a typo stops the sweep at once.

Workers: ``--jobs N`` processes (default: the cores), each running its runs one after another with its imports, data
and models loaded once; or, with ``--ray-address``, Ray tasks on an existing Ray cluster (one CPU each; results are
written where each task runs, so the cluster's nodes need a shared file system).

Output: each run writes the results folder ``flwr run`` writes (``results-dir``, default ``results/`` here), and the
sweep keeps, under ``--out`` (default ``results/sweep``), one ledger entry per run (``runs/<key>.json``: its run
config, how it ended, its folder) and its log (``logs/<key>.log``).  A run whose entry says it completed is skipped
when the sweep is run again (resuming a sweep is running the same command); a failed run is run again.  A failing run
records its error and the sweep goes on.  At the end it prints a table (the varied keys, personalized accuracy, the
spread over clients, seconds) and writes it as CSV (``--table``, default ``<out>/table.csv``).

Exit status, as ``python -m server_app.job``'s: one run exits with its own code (0 completed, 1 Flower error, 3
refused, 4 stopped after round k as asked, 5 aborted or stopped by its privacy budget: summary.json's ``outcome``);
a grid exits 0 when every run completed, else with the code of
the first run (in grid order) that did not; 2: this command's own arguments are wrong (a bad grid, a bad run config:
nothing ran); 130: interrupted (the runs that finished are recorded).
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import hashlib
import itertools
import json
import os
import resource
import sys
import time
import tomllib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from server_app.engine import APP_DIR, App, EngineError, Federation, _config_values, run_app, toml_value
from server_app.job import Exit, outcome

#: summary.json's numbers a sweep's table shows for every run
TABLE_METRICS = ("personal-acc", "personal-acc-std", "personal-acc-min", "global-acc")
#: the engine's name in records
ENGINE = "in-process"


# --------------------------------------------------------------------------- the grid
@dataclass(frozen=True)
class Spec:
    """One run of a sweep: its run-config overrides, the simulation's size, and what varies across the sweep."""

    run_config: dict[str, Any]
    num_supernodes: int
    varied: dict[str, Any] = field(default_factory=dict, compare=False)

    @property
    def key(self) -> str:
        """A stable name for this run (its overrides and size), under which the ledger keeps it."""
        text = json.dumps({"run-config": self.run_config, "num-supernodes": self.num_supernodes}, sort_keys=True)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def describe(self) -> str:
        """The run's varied keys (those it sets), or its whole run config when nothing varies."""
        shown = {k: v for k, v in (self.varied or self.run_config).items() if v is not None}
        return " ".join(f"{k}={v}" for k, v in shown.items()) or "(defaults)"


def config_text(config: Mapping[str, Any]) -> str:
    """A sweep's run config as ``--run-config`` text: arrays (axes) written as TOML arrays."""

    def value(v: Any) -> str:
        return "[" + ",".join(toml_value(x) for x in v) + "]" if isinstance(v, list) else toml_value(v)

    return " ".join(f"{k}={value(v)}" for k, v in config.items())


def expand(config: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every combination of a config whose array values are axes (in the order written, the last axis fastest)."""
    axes = {k: v for k, v in config.items() if isinstance(v, list)}
    for key, values in axes.items():
        if not values:
            raise EngineError(f"the axis {key!r} has no values")
        bad = [v for v in values if isinstance(v, (list, dict))]
        if bad:
            raise EngineError(f"the axis {key!r} holds {bad[0]!r}: an axis' values are numbers, strings or booleans")
    fixed = {k: v for k, v in config.items() if k not in axes}
    return [{**fixed, **dict(zip(axes, combo, strict=True))} for combo in itertools.product(*axes.values())]


def _lines(texts: Sequence[str], what: str) -> list[dict[str, Any]]:
    return [_config_values(text, what, axes=True) for text in texts]


def plan(
    run_configs: Sequence[str] = (),
    federation_configs: Sequence[str] = (),
    grid: Mapping[str, Any] | None = None,
) -> list[Spec]:
    """The runs of a sweep, in grid order, each once (the same overrides and size twice are one run)."""
    common = {}
    for line in _lines(federation_configs, "--federation-config"):
        common.update(line)
    if grid is None:
        lines = _lines(run_configs, "--run-config") or [{}]
        federation = common
    else:
        unknown = sorted(set(grid) - {"base", "axes", "federation", "runs"})
        if unknown:
            raise EngineError(
                f"grid table(s) {', '.join(map(repr, unknown))} unknown: use [base], [axes], [federation] and [[runs]]"
            )
        base = dict(grid.get("base", {}))
        for line in _lines(run_configs, "--run-config"):
            base.update(line)
        runs = list(grid.get("runs", [])) or [{}]
        lines = [{**base, **dict(grid.get("axes", {})), **run} for run in runs]
        federation = {**dict(grid.get("federation", {})), **common}
    sizes = expand(federation)
    specs: list[Spec] = []
    for line in lines:
        for config in expand(line):
            for fed in sizes:
                size = Federation.parse(fed).num_supernodes
                specs.append(Spec(run_config=config, num_supernodes=size))
    unique = list({spec.key: spec for spec in specs}.values())
    return _with_varied(unique)


def _with_varied(specs: list[Spec]) -> list[Spec]:
    """The specs with the keys whose values differ between them (the table's columns)."""
    keys: dict[str, None] = {}
    for spec in specs:
        keys.update(dict.fromkeys(spec.run_config))
    varied = [k for k in keys if len({json.dumps(s.run_config.get(k)) for s in specs}) > 1]
    sizes = len({s.num_supernodes for s in specs}) > 1
    return [
        Spec(
            run_config=s.run_config,
            num_supernodes=s.num_supernodes,
            varied={k: s.run_config.get(k) for k in varied} | ({"num-supernodes": s.num_supernodes} if sizes else {}),
        )
        for s in specs
    ]


def check(specs: Iterable[Spec], app: App) -> list[str]:
    """Each run config the ServerApp would refuse, with the reason (the same parser the ServerApp and every
    ClientApp run); empty when every run may start."""
    from task.config import parse_settings

    problems = []
    for spec in specs:
        try:
            parse_settings(app.fused(app.overrides(spec.run_config)))
        except (EngineError, ValueError) as err:
            problems.append(f"{spec.describe()}: {err}")
    return problems


# --------------------------------------------------------------------------- one run, in a worker
def execute(spec: Spec, app_dir: str, out: str, echo: bool = False) -> dict[str, Any]:
    """Run ``spec`` on the engine in this process; its ledger entry (also written to ``<out>/runs/<key>.json``)."""
    out_dir = Path(out)
    (out_dir / "logs").mkdir(parents=True, exist_ok=True)
    (out_dir / "runs").mkdir(parents=True, exist_ok=True)
    started = time.time()
    try:
        result = run_app(spec.run_config, {"num-supernodes": spec.num_supernodes}, app=_app(app_dir), echo=echo)
        output, error = result.output, result.error
        seconds = result.seconds
    except EngineError as err:
        output, error, seconds = f"ERROR   : {err}\n", err, 0.0
    (out_dir / "logs" / f"{spec.key}.log").write_text(output)
    from server_app.runner import results_folder_from_output

    folder = results_folder_from_output(output)
    summary = _read_json(folder / "summary.json") if folder else None
    code, said = outcome(1 if isinstance(error, EngineError) else 0, output, summary)
    entry = {
        "key": spec.key,
        "engine": ENGINE,
        "run-config": spec.run_config,
        "num-supernodes": spec.num_supernodes,
        "varied": spec.varied,
        "exit": int(code),
        "outcome": said,
        "results": str(folder) if folder else None,
        "seconds": round(seconds, 3),
        "started": started,
        "pid": os.getpid(),
        # the worker's peak memory so far (every run it ran, imports included): what one worker needs
        "peak-rss-mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "summary": {k: summary.get(k) for k in (*TABLE_METRICS, "rounds", "clients", "coverage")} if summary else None,
        "error": None if code == Exit.COMPLETED else (f"{type(error).__name__}: {error}" if error else said),
    }
    _write_json(out_dir / "runs" / f"{spec.key}.json", entry)
    return entry


_APPS: dict[str, App] = {}


def _app(app_dir: str) -> App:
    if app_dir not in _APPS:
        _APPS[app_dir] = App.load(app_dir)
    return _APPS[app_dir]


def warm_up(app_dir: str) -> None:
    """A worker's start: load the app and import what its ServerApp and ClientApp import, once."""
    from server_app import flwr_internals as fi

    app = _app(app_dir)
    fi.load_app(app.clientapp, fi.LoadClientAppError, str(app.folder))
    fi.load_app(app.serverapp, RuntimeError, str(app.folder))


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _write_json(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    tmp.replace(path)


# --------------------------------------------------------------------------- many runs
def done_entries(specs: Iterable[Spec], out: Path) -> dict[str, dict[str, Any]]:
    """The ledger entries of the runs that completed (skipped when the sweep runs again)."""
    found = {}
    for spec in specs:
        entry = _read_json(out / "runs" / f"{spec.key}.json")
        if entry and entry.get("exit") == Exit.COMPLETED and _results_exist(entry):
            found[spec.key] = entry
    return found


def _results_exist(entry: Mapping[str, Any]) -> bool:
    return bool(entry.get("results")) and (Path(entry["results"]) / "summary.json").is_file()


def run_specs(
    specs: Sequence[Spec],
    *,
    app_dir: str | Path = APP_DIR,
    out: str | Path,
    jobs: int = 1,
    ray_address: str | None = None,
    on_done: Callable[[Spec, dict[str, Any]], None] | None = None,
) -> Iterator[tuple[Spec, dict[str, Any]]]:
    """Run ``specs`` (in worker processes, or as Ray tasks) and yield each with its ledger entry as it finishes."""
    app_dir, out = str(Path(app_dir).resolve()), str(Path(out).resolve())
    if not specs:
        return
    if ray_address:
        yield from _on_ray(specs, app_dir, out, ray_address)
        return
    if jobs <= 1:
        warm_up(app_dir)
        for spec in specs:
            yield spec, execute(spec, app_dir, out)
        return
    import multiprocessing
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    # spawned workers (torch and Flower's threads do not survive a fork), each warmed up once
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=jobs, mp_context=context, initializer=warm_up, initargs=(app_dir,)) as pool:
        pending = {pool.submit(execute, spec, app_dir, out): spec for spec in specs}
        try:
            while pending:
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    spec = pending.pop(future)
                    try:
                        entry = future.result()
                    except Exception as err:  # noqa: BLE001 - a worker died (killed, out of memory): said, and on
                        entry = _lost(spec, err)
                    yield spec, entry
        except BaseException:
            for future in pending:
                future.cancel()
            for process in list(getattr(pool, "_processes", {}).values()):  # runs in flight stop with the sweep
                with contextlib.suppress(Exception):
                    process.terminate()
            raise


def _lost(spec: Spec, err: BaseException) -> dict[str, Any]:
    return {
        "key": spec.key,
        "engine": ENGINE,
        "run-config": spec.run_config,
        "num-supernodes": spec.num_supernodes,
        "varied": spec.varied,
        "exit": int(Exit.FLOWER_ERROR),
        "outcome": f"the worker running it died: {type(err).__name__}: {err}",
        "results": None,
        "seconds": None,
        "summary": None,
        "error": f"{type(err).__name__}: {err}",
    }


def _on_ray(specs: Sequence[Spec], app_dir: str, out: str, address: str) -> Iterator[tuple[Spec, dict[str, Any]]]:
    import ray

    ray.init(address=address, runtime_env={"env_vars": {"PYTHONPATH": app_dir}}, log_to_driver=False)
    try:
        remote = ray.remote(num_cpus=1)(_ray_task)
        pending = {remote.remote(spec, app_dir, out): spec for spec in specs}
        while pending:
            finished, _ = ray.wait(list(pending), num_returns=1)
            for ref in finished:
                spec = pending.pop(ref)
                try:
                    entry = ray.get(ref)
                except Exception as err:  # noqa: BLE001 - a task that Ray could not run: said, and on
                    entry = _lost(spec, err)
                yield spec, entry
    finally:
        ray.shutdown()


def _ray_task(spec: Spec, app_dir: str, out: str) -> dict[str, Any]:
    warm_up(app_dir)
    return execute(spec, app_dir, out)


# --------------------------------------------------------------------------- the table
def table_rows(specs: Sequence[Spec], entries: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per run, in grid order: the varied keys, the final numbers, seconds, how it ended."""
    rows = []
    for spec in specs:
        entry = entries.get(spec.key, {})
        summary = entry.get("summary") or {}
        coverage = summary.get("coverage")
        row: dict[str, Any] = dict(spec.varied) if spec.varied else {"run": spec.describe()}
        row.update({k: summary.get(k) for k in TABLE_METRICS})
        row["seconds"] = entry.get("seconds")
        row["outcome"] = "not run" if not entry else _short_outcome(entry)
        covered, total = (coverage.get("covered"), coverage.get("total")) if isinstance(coverage, Mapping) else (0, 0)
        if isinstance(covered, int) and isinstance(total, int) and covered < total:  # server_app/coverage.py
            row["outcome"] += f" (over {covered} of {total} clients)"
        row["results"] = entry.get("results")
        rows.append(row)
    return rows


def _short_outcome(entry: Mapping[str, Any]) -> str:
    code = Exit(int(entry.get("exit", Exit.FLOWER_ERROR)))
    if code == Exit.COMPLETED:
        return "completed"
    return f"{code.name.lower().replace('_', ' ')}: {str(entry.get('outcome', '')).split(': ', 1)[-1][:160]}"


def write_table(rows: Sequence[Mapping[str, Any]], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    columns = list(dict.fromkeys(k for row in rows for k in row))
    with path.open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns)
        writer.writeheader()
        writer.writerows(rows)


def format_table(rows: Sequence[Mapping[str, Any]]) -> str:
    columns = [c for c in dict.fromkeys(k for row in rows for k in row) if c != "results"]

    def cell(value: Any) -> str:
        if isinstance(value, float):
            return f"{value:.4f}" if abs(value) < 10 else f"{value:.1f}"
        return "" if value is None else str(value)

    cells = [[cell(row.get(c)) for c in columns] for row in rows]
    widths = [max(len(c), *(len(r[i]) for r in cells)) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    return "\n".join(line.rstrip() for line in lines)


def sweep_exit(specs: Sequence[Spec], entries: Mapping[str, Mapping[str, Any]]) -> int:
    for spec in specs:
        code = int(entries.get(spec.key, {}).get("exit", Exit.FLOWER_ERROR))
        if code != Exit.COMPLETED:
            return code
    return int(Exit.COMPLETED)


# --------------------------------------------------------------------------- the command
def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m server_app.sweep",
        description=__doc__.split("\n\n")[0],
        epilog="exit status: as python -m server_app.job (one run: its code; a grid: 0, or the code of the first run "
        "that did not complete); 2 bad arguments or grid (nothing ran); 130 interrupted",
    )
    ap.add_argument("app", nargs="?", default=".", help="the app folder, as for flwr run (default: .)")
    ap.add_argument(
        "--run-config",
        "-c",
        action="append",
        default=[],
        help="as for flwr run; arrays are axes (repeatable: each is one line of the grid)",
    )
    ap.add_argument("--federation-config", action="append", default=[], help="as for flwr run (num-supernodes=N)")
    ap.add_argument("--grid", help="a grid as a TOML file ([base], [axes], [federation], [[runs]])")
    ap.add_argument("--jobs", "-j", type=int, default=os.cpu_count() or 1, help="worker processes (default: cores)")
    ap.add_argument("--ray-address", help="run each run as a Ray task on this existing Ray cluster (e.g. auto)")
    ap.add_argument("--out", default="results/sweep", help="the sweep's ledger, logs and table (default results/sweep)")
    ap.add_argument("--table", help="the CSV table (default <out>/table.csv)")
    ap.add_argument("--dry-run", action="store_true", help="list the runs (and which are done), run nothing")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error(f"--jobs must be at least 1, got {args.jobs}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        app = App.load(args.app)
        grid = None
        if args.grid:
            with Path(args.grid).open("rb") as fh:
                grid = tomllib.load(fh)
        specs = plan(args.run_config, args.federation_config, grid)
        problems = check(specs, app)
    except (EngineError, OSError, tomllib.TOMLDecodeError) as err:
        print(f"pflower sweep: {err}", file=sys.stderr)
        return int(Exit.USAGE)
    if problems:
        shown = "\n  ".join(problems[:10]) + (f"\n  ... and {len(problems) - 10} more" if len(problems) > 10 else "")
        print(
            f"pflower sweep: {len(problems)} of {len(specs)} run configs are refused; nothing ran:\n  {shown}",
            file=sys.stderr,
        )
        return int(Exit.REFUSED) if len(specs) == 1 else int(Exit.USAGE)
    out = Path(args.out)
    done = done_entries(specs, out)
    todo = [s for s in specs if s.key not in done]
    if args.dry_run:
        for spec in specs:
            print(f"{'done' if spec.key in done else 'todo'}  {spec.key}  {spec.describe()}")
        print(f"{len(specs)} runs, {len(done)} done, {len(todo)} to run")
        return int(Exit.COMPLETED)
    if len(specs) == 1 and not args.ray_address:  # one run: as flwr run shows it, and its own exit status
        if done:
            entry = done[specs[0].key]
            print(f"pflower sweep: already completed ({entry['results']}); remove {out / 'runs'} to run it again")
            return int(Exit.COMPLETED)
        entry = execute(specs[0], str(app.folder), str(out), echo=True)
        print(f"pflower sweep: {entry['outcome']} (exit {entry['exit']})", flush=True)
        return int(entry["exit"])
    return _run_grid(args, app, specs, done, todo, out)


def _run_grid(
    args: argparse.Namespace,
    app: App,
    specs: list[Spec],
    done: dict[str, dict[str, Any]],
    todo: list[Spec],
    out: Path,
) -> int:
    from tqdm import tqdm

    entries: dict[str, Mapping[str, Any]] = dict(done)
    failures = 0
    where = f"Ray at {args.ray_address}" if args.ray_address else f"{min(args.jobs, max(len(todo), 1))} worker(s)"
    print(f"pflower sweep: {len(specs)} runs, {len(done)} already done, {len(todo)} to run on {where}", flush=True)
    bar = tqdm(total=len(specs), initial=len(done), unit="run", dynamic_ncols=True, file=sys.stderr)
    try:
        for spec, entry in run_specs(
            todo, app_dir=app.folder, out=out, jobs=min(args.jobs, len(todo)), ray_address=args.ray_address
        ):
            entries[spec.key] = entry
            if entry["exit"] != Exit.COMPLETED:
                failures += 1
                tqdm.write(f"failed: {spec.describe()}: {entry['outcome']}", file=sys.stderr)
            bar.set_postfix(failed=failures, refresh=False)
            bar.update(1)
    except KeyboardInterrupt:
        bar.close()
        print(
            f"pflower sweep: interrupted; {len(entries)} of {len(specs)} runs recorded: run the same command to go on",
            flush=True,
        )
        return int(Exit.INTERRUPTED)
    bar.close()
    rows = table_rows(specs, entries)
    table = Path(args.table) if args.table else out / "table.csv"
    write_table(rows, table)
    print(format_table(rows))
    code = sweep_exit(specs, entries)
    completed = sum(1 for s in specs if entries.get(s.key, {}).get("exit") == Exit.COMPLETED)
    print(f"pflower sweep: {completed} of {len(specs)} runs completed; table {table} (exit {code})", flush=True)
    return code


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main())

"""Running grid cells through Flower and keeping one compact raw record per run (the records layer's writer).

Every run goes through Flower, on one of two engines (``--engine``, every benchmark script takes it, with ``--jobs``):

- ``in-process`` (the default): Flower's simulation runtime in one process (``server_app/engine.py``), a batch of
  runs spread over ``--jobs`` worker processes by ``server_app.sweep`` (default: the cores);
- ``flwr-run``: ``server_app.runner.LocalSimulation`` (a private SuperLink, ``flwr run``, one run at a time), which
  ``tests/engine/test_equality.py`` holds the engine to, kept for cross-checking records against Flower's runtime.

Each record names its engine.  A run's full results folder stays under ``benchmarks/out/runs`` (gitignored); what
the tables need is copied into a small JSON record, ``benchmarks/raw/<grid>/<cell>.json`` (schema:
``benchmarks/records.py``), which is committed.
``python -m benchmarks.report`` builds ``benchmarks/RESULTS.md`` from those records only.

``python -m benchmarks.running refresh`` rebuilds the records from their run folders after a change of what a
record keeps (:func:`refresh`).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Self, TypeVar

from benchmarks.method_code import file_digests
from benchmarks.records import (
    BENCHMARKS,
    RAW,
    SCHEMA,
    digest,
    dumps_record,
    error_line,
    record_path,
    recorded,
    run_config_defaults,
    write_record,
)
from server_app.engine import Engine
from server_app.runner import LocalSimulation, RunFailed, results_folder_from_output

OUT = BENCHMARKS / "out"
#: the app's code: a run's record says whether it differed from the commit it names
APP_CODE = ("strategies", "client_app", "task", "server_app", "pyproject.toml")
# per-client columns of clients.csv that are not data (kept out of the record)
_CLIENT_SKIP = {"peak-rss-mb", "partition-id"}
# per-client columns that describe a client's data (counts, digests): they go into the data fingerprint
_DATA_COLUMN = re.compile(r"(^|-)(examples|digest|hash)$")
#: summary.json keys kept besides the fixed ones: the final spread over clients (``personal-acc-std``, ``-min``,
#: ``-p10``) and what held-out clients got (``newcomer-acc``, ``newcomer-finetuned-acc``)
SUMMARY_PREFIXES = ("personal-acc-", "global-acc-", "newcomer-")
#: consecutive failed runs after which a resumable grid stops (a dead SuperLink would otherwise fail every later run)
MAX_FAILURES_IN_A_ROW = 5
#: the engines a benchmark can run on (module docstring)
ENGINES = ("in-process", "flwr-run")


class Runtime:
    """The engine and worker count every ``Bench`` of this process uses unless told otherwise: set from a benchmark
    script's ``--engine`` / ``--jobs`` when its :func:`parser` parses the command line."""

    engine: str = "in-process"
    jobs: int = os.cpu_count() or 1


# --------------------------------------------------------------------------- what ran, where
def code_version() -> dict[str, Any]:
    """The app code a run used: a snapshot's ``.pflower-commit`` file, else the checkout's HEAD and whether the
    app's code differs from it (benchmarks/ and tests/ do not count)."""
    root = BENCHMARKS.parent
    stamp = root / ".pflower-commit"
    if stamp.exists():
        return {"commit": stamp.read_text().strip(), "dirty": False}

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=False).stdout

    try:
        head, dirty = git("rev-parse", "HEAD").strip(), git("status", "--porcelain", "--", *APP_CODE).strip()
    except OSError:
        return {"commit": None, "dirty": None}
    return {"commit": head or None, "dirty": bool(dirty)}


def _ran_files(method: Any) -> dict[str, str] | None:
    """The digests of the files ``method``'s results depend on, as they are in the code that runs (None: a method the
    registry does not know)."""
    try:
        return file_digests(str(method), BENCHMARKS.parent)
    except KeyError:
        return None


def command_line(argv: list[str] | None = None) -> str:
    """``python -m benchmarks.<script> <args>`` of the current process (what reproduces its records)."""
    argv = sys.argv if argv is None else argv
    return " ".join(["python", "-m", f"benchmarks.{Path(argv[0]).stem}", *(shlex.quote(a) for a in argv[1:])])


def _num(v: Any) -> Any:
    """csv cell -> int / float / str / None."""
    if v in ("", None):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return v
    return int(f) if f.is_integer() and abs(f) < 2**53 else f


def _round(v: Any, nd: int = 6) -> Any:
    return round(v, nd) if isinstance(v, float) else v


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text()) if path.exists() else None


def cpu_model() -> str | None:
    """The CPU's model name (Linux: /proc/cpuinfo), None where it cannot be read."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or None
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), None)


def machine(load_before: float | None = None) -> dict[str, Any]:
    import flwr
    import torch

    try:
        mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    except (ValueError, OSError):
        mem = None
    return {
        "cores": os.cpu_count(),
        "cpu": cpu_model(),
        # PyTorch's kernels for this instruction set (AVX2, AVX512, DEFAULT): floats differ from one set to another
        "cpu-capability": torch.backends.cpu.get_cpu_capability(),
        "memory-gib": None if mem is None else round(mem),
        "gpu": torch.cuda.is_available(),
        "python": platform.python_version(),
        "flwr": flwr.__version__,
        "torch": torch.__version__.split("+")[0],
        "load-before": load_before,
        "load-after": round(os.getloadavg()[0], 2),
    }


# --------------------------------------------------------------------------- one run folder -> one record
def _rounds(folder: Path) -> list[dict[str, Any]]:
    rows = []
    for r in _read_json(folder / "rounds.json") or []:
        t, e, x = r.get("train", {}), r.get("evaluate", {}), r.get("extra", {})
        comm = x.get("comm", {})
        row = {
            "round": r["round"],
            "personal-acc": e.get("personal-acc"),
            "global-acc": e.get("global-acc"),
            # under an injected attack (docs/robustness.md): the honest clients' mean, the backdoor's success
            "honest-personal-acc": e.get("honest-personal-acc"),
            "backdoor-success": e.get("backdoor-success"),
            "trained-acc": t.get("trained-acc"),
            "personal-loss": e.get("personal-loss"),
            "seconds": x.get("seconds"),
            "server-seconds": x.get("server-seconds"),
            "bytes-down": sum(v for k, v in comm.items() if k.endswith("bytes-down")),
            "bytes-up": sum(v for k, v in comm.items() if k.endswith("bytes-up")),
            "train-bytes-down": comm.get("train-bytes-down"),
            "train-bytes-up": comm.get("train-bytes-up"),
            "train-clients": t.get("num-replies"),
            "eval-clients": e.get("num-replies"),
            "train-seconds-per-client": t.get("time-train"),
            "method-seconds-per-client": t.get("time-method"),
            "server-rss-mb": x.get("server-peak-rss-mb"),
            "client-rss-mb": t.get("peak-rss-mb-max"),
            "index-seconds": x.get("index-seconds"),
            "cohort": x.get("cohort"),  # partition ids drawn this round, where the strategy logs them
        }
        rows.append({k: _round(v) for k, v in row.items() if v is not None})
    return rows


def _clients(folder: Path) -> dict[str, Any]:
    path = folder / "clients.csv"
    if not path.exists():
        return {"columns": [], "rows": []}
    with path.open(newline="") as fh:
        table = list(csv.reader(fh))
    if not table:
        return {"columns": [], "rows": []}
    keep = [i for i, c in enumerate(table[0]) if c not in _CLIENT_SKIP]
    rows = [[_round(_num(row[i])) for i in keep] for row in table[1:]]
    return {"columns": [table[0][i] for i in keep], "rows": sorted(rows, key=lambda r: (r[0] is None, r[0]))}


def _last_tier_table(folder: Path) -> list[dict] | None:
    tables = [
        r["extra"]["tier-table"]
        for r in _read_json(folder / "rounds.json") or []
        if r.get("extra", {}).get("tier-table")
    ]
    return tables[-1] if tables else None


def _artefacts(folder: Path) -> dict[str, Any]:
    art: dict[str, Any] = {}
    clu = _read_json(folder / "pfedlia_clusters.json")
    if clu:
        art["pfedlia"] = {
            "clustering": clu.get("clustering", {}),
            "assignment": clu.get("assignment", {}),
            "planted": clu.get("planted", {}),
        }
    cfl = _read_json(folder / "cfl_clusters.json")
    if cfl:
        art["cfl"] = {
            "clusters": len(set(cfl.get("assignment", {}).values())),
            "assignment": cfl.get("assignment", {}),
            "splits": len(cfl.get("splits", [])),
        }
    table = _last_tier_table(folder)
    if table:
        art["tier-table"] = table
    ledger = _read_json(folder / "pifl_ledger.json")
    if ledger and ledger.get("rounds"):
        last = ledger["rounds"][-1]
        art["pifl"] = {
            "rounds": len(ledger["rounds"]),
            "totals": sorted({e.get("total") for e in ledger["rounds"]}),
            "tiers": {
                k: {"source-a-share": t.get("source-a-share"), "members": t.get("members")}
                for k, t in last.get("tiers", {}).items()
            },
        }
    c2v = _read_json(folder / "client2vec.json")
    if c2v:
        art["client2vec"] = {
            "index-seconds": c2v.get("index-seconds"),
            "index-quality": c2v.get("index-quality"),
            "best-global-acc": c2v.get("best-global-acc"),
            "cohorts": c2v.get("cohorts"),
        }
    cac = _read_json(folder / "fedcac_communication.json")
    if cac:
        art["fedcac"] = cac
    robust = _read_json(folder / "robustness.json")
    if robust:  # what the method's mechanism and the aggregation rule did with the attackers
        art["robustness"] = {k: robust.get(k) for k in ("mechanism", "rule")}
    return art


def fingerprint(clients: dict[str, Any], rounds: list[dict], artefacts: dict[str, Any]) -> dict[str, Any]:
    cols = clients["columns"]
    data_cols = [i for i, c in enumerate(cols) if i == 0 or _DATA_COLUMN.search(c)]
    data = digest([[row[i] for i in data_cols] for row in clients["rows"]]) if clients["rows"] else None
    cohorts = None
    if all("cohort" in r for r in rounds) and rounds:
        cohorts = {str(r["round"]): sorted(r["cohort"]) for r in rounds}
    elif artefacts.get("client2vec", {}).get("cohorts"):
        cohorts = {str(k): sorted(v) for k, v in artefacts["client2vec"]["cohorts"].items()}
    if cohorts is not None:
        draws = digest(cohorts)
    elif rounds and all(r.get("train-clients") == len(clients["rows"]) for r in rounds if "train-clients" in r):
        draws = "all"
    else:
        draws = None
    return {"data": data, "data-columns": [cols[i] for i in data_cols], "draws": draws}


def record_from_run(
    folder: Path | None,
    *,
    grid: str,
    cell: dict[str, Any],
    command: str,
    num_supernodes: int,
    run_config: dict[str, Any],
    load_before: float | None = None,
    error: str | None = None,
    engine: str | None = None,
) -> dict:
    """The compact raw record of one run (see the module docstring); ``engine``: which of :data:`ENGINES` ran it."""
    folder = Path(folder) if folder else None
    config_json = (_read_json(folder / "config.json") or {}) if folder else {}
    config = config_json.get("run-config")
    # a run that failed before writing config.json: what was asked, on top of the defaults of the code that ran
    defaults = run_config_defaults()
    config = config if config is not None else {**defaults, **run_config}
    summary = (_read_json(folder / "summary.json") or {}) if folder else {}
    rounds = _rounds(folder) if folder else []
    clients = _clients(folder) if folder else {"columns": [], "rows": []}
    artefacts = _artefacts(folder) if folder else {}
    failures = (_read_json(folder / "failures.json") or []) if folder else []
    keys = (
        "rounds",
        "clients",
        "failures",
        "seconds",
        "personal-acc",
        "global-acc",
        "trained-acc",
        "personal-loss",
        "global-loss",
        "personal-perplexity",
        "global-perplexity",
        "dp-mode",
        "epsilon",
        "delta",
        "aborted",  # why the ServerApp stopped the run early (its record has ``error`` too)
        "coverage",  # how many of the clients asked the final means speak for (server_app/coverage.py)
        # under an attack or a robust rule (strategies/attack_report.py)
        "attack",
        "aggregator",
        "attackers",
        "honest-personal-acc",
        "honest-global-acc",
        "attackers-personal-acc",
        "backdoor-success",
        "attackers-isolated",
        "outside-assumption",  # the averages in which more clients lied than the rule's guarantee allows
    )
    return {
        "schema": SCHEMA,
        "grid": grid,
        "cell": cell,
        "command": command,
        "run": folder.name if folder else None,
        "num-supernodes": num_supernodes,
        "engine": engine,
        "error": error,
        "code": {**code_version(), "files": _ran_files(config.get("method"))},
        "machine": machine(load_before),
        "run-config": config,
        # the keys this run set away from the defaults of the code that ran (a later change of a default is not one)
        "overrides": sorted(k for k, v in config.items() if k not in defaults or defaults[k] != v),
        "resolved-model": (config_json.get("resolved") or {}).get("model"),
        # and the spread over clients and what newcomers got, under whatever names the code that ran gives them
        "summary": {k: summary.get(k) for k in keys}
        | {k: v for k, v in summary.items() if k.startswith(SUMMARY_PREFIXES) and not isinstance(v, dict | list)},
        "rounds": rounds,
        "clients": clients,
        "artefacts": artefacts,
        "failures": {"count": len(failures), "first": [str(f.get("reason", f))[:200] for f in failures[:3]]},
        "fingerprint": fingerprint(clients, rounds, artefacts),
    }


def measurement_record(
    grid: str, cell: dict[str, Any], measurements: dict[str, Any], command: str | None = None
) -> dict:
    """The raw record of an in-process measurement (no federated run: a timing of the method's own code)."""
    return {
        "schema": SCHEMA,
        "grid": grid,
        "cell": cell,
        "command": command or command_line(),
        "run": None,
        "error": None,
        "code": code_version(),
        "machine": machine(round(os.getloadavg()[0], 2)),
        "measurements": measurements,
    }


# --------------------------------------------------------------------------- running cells
def stopped_folder(exc: Exception) -> Path | None:
    """The results folder of a run that the ServerApp stopped early (its summary says ``aborted``: e.g. every train
    reply of a round failed), whose rounds until then the record keeps; None for any other failure."""
    folder = results_folder_from_output(exc.output) if isinstance(exc, RunFailed) else None
    if folder is None or not (folder / "summary.json").exists():
        return None
    return folder if (_read_json(folder / "summary.json") or {}).get("aborted") else None


class Bench:
    """Runs grid cells on an engine (:data:`ENGINES`) and writes one raw record per run (failed runs too)."""

    def __init__(
        self,
        grid: str,
        *,
        raw_dir: Path | str = RAW,
        command: str | None = None,
        total: int | None = None,
        timeout: float = 3600.0,
        engine: str | None = None,
        jobs: int | None = None,
    ) -> None:
        self.grid, self.raw_dir, self.total, self.timeout = grid, Path(raw_dir), total, timeout
        self.command = command or command_line()
        self.runs_dir = OUT / "runs"
        self.engine = engine or Runtime.engine
        if self.engine not in ENGINES:
            raise ValueError(f"engine {self.engine!r} is not one of {ENGINES}")
        self.jobs = max(1, jobs or Runtime.jobs)
        self.done, self.t0 = 0, time.time()
        self.sim: LocalSimulation | Engine = (
            LocalSimulation() if self.engine == "flwr-run" else Engine(workdir=OUT / "engine")
        )

    def __enter__(self) -> Self:
        if isinstance(self.sim, LocalSimulation):
            self.sim.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.sim.stop()

    def config(self, cfg: dict[str, Any], clients: int) -> dict[str, Any]:
        """``cfg`` with the bench's results folder, and ``min-nodes`` = ``clients`` unless set (every round waits
        for all of them)."""
        return {"results-dir": str(self.runs_dir), "min-nodes": clients, **cfg}

    def run(self, cell: dict[str, Any], cfg: dict[str, Any], clients: int) -> dict:
        """Run ``cfg`` on ``clients`` simulated nodes in this process (one run); write and return its record
        (``error`` set if it failed)."""
        cfg = self.config(cfg, clients)
        load = round(os.getloadavg()[0], 2)
        folder, error = None, None
        start = time.time()
        try:
            folder = Path(self.sim.run(cfg, num_supernodes=clients, timeout=self.timeout)["results"])
        except (RunFailed, OSError, ValueError) as exc:  # keep going: the record says what failed
            error = "\n".join(str(exc).splitlines()[-15:])
            folder = stopped_folder(exc)
        except Exception as exc:  # noqa: BLE001  (subprocess timeouts and the like)
            error = f"{type(exc).__name__}: {exc}"[-2000:]
        return self._record(cell, cfg, clients, folder, error, load, time.time() - start)

    def run_many(self, items: list[tuple[str, dict[str, Any], dict[str, Any], int]]) -> Iterator[dict]:
        """Run every (grid, cell, run config, clients) and yield each record as its run ends: on the in-process
        engine in ``jobs`` worker processes (``server_app.sweep``), in any order; through ``flwr run`` one after
        another."""
        if self.engine == "flwr-run" or self.jobs == 1 or len(items) <= 1:
            for grid, cell, cfg, clients in items:
                self.grid = grid
                yield self.run(cell, cfg, clients)
            return
        from server_app.sweep import Spec, run_specs

        specs = {}
        for grid, cell, cfg, clients in items:
            spec = Spec(run_config=self.config(cfg, clients), num_supernodes=clients)
            specs[spec.key] = (grid, cell, spec)
        load = round(os.getloadavg()[0], 2)
        for spec, entry in run_specs(
            [s for _, _, s in specs.values()], out=OUT / "sweep", jobs=min(self.jobs, len(specs))
        ):
            grid, cell, _ = specs[spec.key]
            self.grid = grid
            folder = Path(entry["results"]) if entry.get("results") else None
            error = None
            if entry.get("exit") != 0:
                error = f"{entry.get('outcome')}\n{_log_tail(spec.key)}"
                # a run the ServerApp stopped early keeps its rounds until then (its summary says ``aborted``)
                summary = (_read_json(folder / "summary.json") or {}) if folder else {}
                folder = folder if summary.get("aborted") else None
            yield self._record(cell, spec.run_config, spec.num_supernodes, folder, error, load, entry.get("seconds"))

    def _record(
        self,
        cell: dict[str, Any],
        cfg: dict[str, Any],
        clients: int,
        folder: Path | None,
        error: str | None,
        load: float,
        wall: float | None,
    ) -> dict:
        rec = record_from_run(
            folder,
            grid=self.grid,
            cell=cell,
            command=self.command,
            num_supernodes=clients,
            run_config=cfg,
            load_before=load,
            error=error,
            engine=self.engine,
        )
        # the run end to end: flwr run's with Ray's start-up; the engine's in its worker, without the worker's start
        rec["wall-seconds"] = None if wall is None else round(wall, 2)
        write_record(rec, self.raw_dir)
        self.done += 1
        s = rec["summary"]
        what = (
            f"FAILED: {error_line(error)}"
            if error
            else " ".join(
                f"{k} {s[k]:.4f}" for k in ("personal-acc", "global-acc", "personal-perplexity") if s.get(k) is not None
            )
        )
        print(
            f"[{self.done}/{self.total or '?'}] {self.grid} {' '.join(str(v) for v in cell.values())}: {what} "
            f"({s.get('seconds') or 0:.0f} s; {time.time() - self.t0:.0f} s total)",
            flush=True,
        )
        return rec


def _log_tail(key: str, lines: int = 15) -> str:
    path = OUT / "sweep" / "logs" / f"{key}.log"
    return "\n".join(path.read_text().splitlines()[-lines:]) if path.exists() else ""


# --------------------------------------------------------------------------- resumable grids
class Runner(Protocol):
    """What :func:`run_all` needs of a bench (:class:`Bench`): a grid to record under and a run of one cell."""

    grid: str

    def run(self, cell: dict[str, Any], cfg: dict[str, Any], clients: int) -> dict[str, Any]: ...


class Planned(Protocol):
    """One run of a resumable grid: where its record goes, what it runs, and what its record keeps besides."""

    @property
    def grid(self) -> str: ...
    @property
    def cell(self) -> dict[str, Any]: ...
    @property
    def config(self) -> dict[str, Any]: ...
    @property
    def clients(self) -> int: ...
    @property
    def extra(self) -> dict[str, Any]: ...


P = TypeVar("P", bound=Planned)


class Todo:
    """Which planned runs are left: no record, a failed one (``retry_failed``), or a stale one: ``is_stale(path)``
    says so (e.g. its method's code changed since the record's commit: ``reporting.freshness.stale_test``; None:
    a record is never stale).  ``stale`` counts the stale records found."""

    def __init__(
        self, raw_dir: Path | str, retry_failed: bool = False, is_stale: Callable[[Path], bool] | None = None
    ) -> None:
        self.raw_dir, self.retry_failed, self.is_stale = Path(raw_dir), retry_failed, is_stale
        self.stale = 0

    @property
    def keep_stale(self) -> bool:
        return self.is_stale is None

    def left(self, runs: Iterable[P]) -> list[P]:
        out = []
        for run in runs:
            path = record_path(run.grid, run.cell, self.raw_dir)
            if not recorded(path, self.retry_failed):
                out.append(run)
            elif self.is_stale is not None and self.is_stale(path):
                self.stale += 1
                out.append(run)
        return out


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


def _run_one(bench: Runner, run: Planned) -> dict[str, Any]:
    bench.grid = run.grid
    return bench.run(run.cell, run.config, run.clients)


def run_all(
    runs: Iterable[P],
    bench: Runner,
    raw_dir: Path | str,
    progress: Progress,
    expected_failure: Callable[[P], bool] = lambda run: False,
) -> None:
    """Run each planned run on the bench's engine, its record with ``extra`` and its wall time; stop after
    ``MAX_FAILURES_IN_A_ROW`` failures in a row (in the order runs end) that were not ``expected_failure``."""
    runs = list(runs)
    by_cell = {(r.grid, json.dumps(r.cell, sort_keys=True)): r for r in runs}
    failures = 0
    if isinstance(bench, Bench):
        records: Iterable[dict] = bench.run_many([(r.grid, r.cell, r.config, r.clients) for r in runs])
    else:  # any Runner: one run after another
        records = (_run_one(bench, r) for r in runs)
    for rec in records:
        run = by_cell[(rec["grid"], json.dumps(rec["cell"], sort_keys=True))]
        rec.update(run.extra)
        write_record(rec, raw_dir)
        print(progress.line(rec.get("wall-seconds") or 0.0), flush=True)
        failures = failures + 1 if rec.get("error") and not expected_failure(run) else 0
        if failures >= MAX_FAILURES_IN_A_ROW:
            raise SystemExit(
                f"{failures} runs in a row failed (the last: {record_path(run.grid, run.cell, raw_dir)}); stopped. "
                "Fix the cause, then run the same command with --retry-failed"
            )


def product(axes: dict[str, dict[str, dict]], seeds: list[int], base: dict[str, Any]) -> list[tuple[dict, dict]]:
    """Cells of a grid: every combination of the named axes (each ``{label: run-config overrides}``) and seed."""
    cells: list[tuple[dict, dict]] = [({}, dict(base))]
    for axis, values in axes.items():
        cells = [({**c, axis: label}, {**cfg, **over}) for c, cfg in cells for label, over in values.items()]
    return [({**c, "seed": s}, {**cfg, "seed": s}) for c, cfg in cells for s in seeds]


#: an axis: ``{label: run-config overrides}``, or a function of a label and the command line giving them
Axis = dict[str, dict[str, Any]] | Callable[[str, argparse.Namespace], dict[str, Any]]


def method_axis(label: str, _: argparse.Namespace) -> dict[str, Any]:
    """An axis of method names (any the app has): each label is the run's ``method``."""
    return {"method": label}


@dataclass(frozen=True)
class Declared:
    """A grid of plain axes over a base run config, as data: every combination (:func:`product`) of the axes (the cell
    keeps each label) and the seeds, over ``base`` and ``num-server-rounds``.  The command line narrows each axis
    (``--<axis>s`` or the option ``options`` names: comma-separated labels, by default every label) and sets
    ``--seeds``, ``--rounds`` and ``--clients``; ``defaults`` overrides those defaults, and ``presets`` are named
    sets of them (``--grid``), each with the ``grid`` its records go to."""

    grid: str
    axes: dict[str, Axis]
    base: dict[str, Any] = field(default_factory=dict)
    defaults: dict[str, Any] = field(default_factory=dict)
    presets: dict[str, dict[str, Any]] = field(default_factory=dict)
    options: dict[str, str] = field(default_factory=dict)

    def parser(self, doc: str | None) -> argparse.ArgumentParser:
        ap = parser(doc)
        if self.presets:
            ap.add_argument("--grid", choices=list(self.presets), default=next(iter(self.presets)))
        ap.add_argument("--seeds")
        ap.add_argument("--rounds", type=int)
        ap.add_argument("--clients", type=int)
        for axis, labels in self.axes.items():
            shown = None if callable(labels) else "from: " + ",".join(labels).replace("%", "%%")
            ap.add_argument(f"--{self.options.get(axis, axis + 's')}", help=shown)
        return ap

    def parse(self, ap: argparse.ArgumentParser, argv: list[str] | None = None) -> argparse.Namespace:
        """The command line; what it leaves unset comes from the preset, else the defaults."""
        args = ap.parse_args(argv)
        every = {self.options.get(a, a + "s"): ",".join(v) for a, v in self.axes.items() if not callable(v)}
        chosen = self.presets[args.grid] if self.presets else {}
        for key, value in {"seeds": "0,1,2", "rounds": 20, **every, **self.defaults, **chosen}.items():
            if getattr(args, key, None) is None:
                setattr(args, key, value)
        args.grid_name = chosen.get("grid", self.grid)
        return args

    def cells(self, args: argparse.Namespace, **base: Any) -> list[tuple[dict, dict]]:
        """Every (cell, run config) the command line asks for, ``base`` on top of the declared one."""
        axes = {}
        for axis, labels in self.axes.items():
            option = self.options.get(axis, axis + "s")
            chosen = split(getattr(args, option))
            if not callable(labels) and (unknown := [c for c in chosen if c not in labels]):
                raise SystemExit(f"unknown {option} {unknown}; this benchmark has: {', '.join(labels)}")
            axes[axis] = {c: labels(c, args) if callable(labels) else labels[c] for c in chosen}
        rounds = {} if args.rounds is None else {"num-server-rounds": args.rounds}
        return product(axes, [int(s) for s in split(str(args.seeds))], {**self.base, **rounds, **base})

    def run(self, args: argparse.Namespace, cells: list[tuple[dict, dict]] | None = None) -> list[dict]:
        """Run every (cell, run config) of ``cells`` (default: :meth:`cells`) once, on the engine asked for."""
        cells = self.cells(args) if cells is None else cells
        with Bench(args.grid_name, raw_dir=args.raw_dir, total=len(cells)) as bench:
            return list(bench.run_many([(args.grid_name, cell, cfg, args.clients) for cell, cfg in cells]))


class _Parser(argparse.ArgumentParser):
    """Sets :class:`Runtime` from ``--engine`` / ``--jobs`` as it parses."""

    def parse_args(self, args=None, namespace=None):
        parsed = super().parse_args(args, namespace)
        Runtime.engine, Runtime.jobs = parsed.engine, parsed.jobs
        return parsed


def parser(doc: str | None) -> argparse.ArgumentParser:
    """A benchmark script's argument parser: its docstring as the help, ``--raw-dir``, ``--engine`` and ``--jobs``."""
    ap = _Parser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--raw-dir", default=str(RAW), help="where the raw records go (default benchmarks/raw)")
    ap.add_argument(
        "--engine",
        choices=ENGINES,
        default="in-process",
        help="in-process: Flower's simulation runtime in --jobs worker processes (default); flwr-run: flwr run on a "
        "private SuperLink, one run at a time",
    )
    ap.add_argument(
        "--jobs", type=int, default=os.cpu_count() or 1, help="in-process worker processes (default: cores)"
    )
    return ap


def split(text: str) -> list[str]:
    return [t for t in text.split(",") if t]


def refresh(raw_dir: Path, runs_dir: Path) -> int:
    """Rebuild every record of ``raw_dir`` from its run folder in ``runs_dir`` (after a change of what a record
    keeps), keeping what only the original run knew: grid, cell, command, error, code and machine."""
    n = 0
    for path in sorted(Path(raw_dir).glob("*/*.json")):
        old = json.loads(path.read_text())
        if "measurements" in old:
            continue
        folder = Path(runs_dir) / old["run"] if old.get("run") else None
        if folder is not None and not folder.is_dir():
            continue
        asked = dict(old["run-config"]) if folder is None else {}
        new = record_from_run(
            folder,
            grid=old["grid"],
            cell=old["cell"],
            command=old["command"],
            num_supernodes=old["num-supernodes"],
            run_config=asked,
            error=old["error"],
        )
        new.update(code=old["code"], machine=old["machine"])
        path.write_text(dumps_record(new))
        n += 1
    return n


if __name__ == "__main__":
    ap = parser("rebuild raw records from their run folders (see refresh)")
    ap.add_argument("command", choices=["refresh"])
    ap.add_argument("--runs", default=str(OUT / "runs"))
    a = ap.parse_args()
    print(f"refreshed {refresh(Path(a.raw_dir), Path(a.runs))} records from {a.runs}")

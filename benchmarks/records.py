"""Raw records: one small JSON per run, written by the running layer and read by every table.

The bottom layer of the package: paths, the schema, writing and loading records, their digest, and the
vocabulary the tables read them with.  It imports nothing of the app or of the rest of ``benchmarks``.

A record lives in ``benchmarks/raw/<grid>/<cell>.json`` (schema ``SCHEMA``; every key is always present, ``None``
where it does not apply):

- ``grid``, ``cell`` (the grid coordinates, e.g. partition / method / seed), ``command`` (what produced it),
  ``run`` (the results folder's name), ``num-supernodes``, ``error`` (the tail of a failed run's log, or None),
  ``code`` (the commit of the app code that ran, whether it had uncommitted changes, and ``files``: a digest of each
  file the method's results depend on, as it ran: ``benchmarks/method_code.py``; older records lack it)
- ``machine``: cores, CPU model and PyTorch's CPU capability, memory, versions, and the 1-minute load
  average before and after the run
- ``run-config``: the run's full run config (``config.json``); ``overrides``: the keys it set away from the
  defaults of the code that ran; ``resolved-model``: the model ``model=auto`` resolved to
- ``summary``: the essentials of ``summary.json`` (final accuracies and losses, perplexity, clients, failures,
  seconds, ``coverage``: how many of the clients asked the final means speak for; under differential privacy the
  mode and the accountant's ``epsilon`` and ``delta`` after the last round; the final spread over clients and what
  held-out clients got, where the code that ran reports them)
- ``rounds``: per round: accuracies (personalized, global, after local training), seconds, server seconds,
  bytes down / up (all phases; and the train phase alone), clients that trained / evaluated, mean local
  training and method seconds per client, peak memory, and the cohort where the strategy logs one
- ``clients``: ``{"columns": [...], "rows": [[...], ...]}`` from ``clients.csv`` (per-client final accuracy,
  num-examples, and any further per-client count the client reports)
- ``artefacts``: what the tables need from the method's own files (pFedLIA clustering and assignment, CFL
  clusters, tier tables and tier shares, Client2Vec index seconds / quality / cohorts, FedCAC mask size)
- ``failures``: number of rejected replies and the first reasons
- ``fingerprint``: ``data`` (hash of the sorted per-client example counts and data digests) and ``draws``
  (hash of the clients drawn per round, ``"all"`` when every client trained every round, None when unknown):
  the report pairs two runs only when these agree (``reporting/pairing.py``).

An in-process measurement (no federated run) has ``measurements`` in place of the run's keys.  A grid cell is
``record["cell"]``; a *metric* is a function of a record that returns a number or None (``summary("personal-acc")``,
or a renderer's own).
"""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import numpy as np

BENCHMARKS = Path(__file__).resolve().parent
RAW = BENCHMARKS / "raw"
PYPROJECT = BENCHMARKS.parent / "pyproject.toml"
SCHEMA = 1

Rec = dict[str, Any]
TIE = 1e-9  # accuracies closer than this are equal (float noise of the mean over clients)


# --------------------------------------------------------------------------- writing and loading
def cell_name(cell: dict[str, Any]) -> str:
    """File name of a grid cell: its coordinates joined, unsafe characters replaced."""
    return "__".join(re.sub(r"[^A-Za-z0-9.+=-]+", "_", f"{v}".replace("%", "pct")) for v in cell.values())


def digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def dumps_record(record: Rec) -> str:
    """JSON with one top-level key per line and one round / client per line (small, diffable)."""
    out = []
    for key, value in record.items():
        if key == "rounds" and value:
            body = ",\n  ".join(json.dumps(r) for r in value)
            out.append(f'"{key}": [\n  {body}\n ]')
        elif key == "clients" and value.get("rows"):
            rows = ",\n   ".join(json.dumps(r) for r in value["rows"])
            out.append(f'"{key}": {{"columns": {json.dumps(value["columns"])}, "rows": [\n   {rows}\n ]}}')
        else:
            out.append(f"{json.dumps(key)}: {json.dumps(value, sort_keys=key in ('run-config', 'artefacts'))}")
    return "{\n " + ",\n ".join(out) + "\n}\n"


def record_path(grid: str, cell: dict[str, Any], raw_dir: Path | str = RAW) -> Path:
    return Path(raw_dir) / grid / f"{cell_name(cell)}.json"


def write_record(record: Rec, raw_dir: Path | str = RAW) -> Path:
    path = record_path(record["grid"], record["cell"], raw_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(dumps_record(record))
    return path


def load_records(grid: str, raw_dir: Path | str = RAW) -> list[Rec]:
    folder = Path(raw_dir) / grid
    return [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []


def recorded(path: Path, retry_failed: bool = False) -> bool:
    """Whether a run's record exists (and, with ``retry_failed``, says it did not fail): a resumed grid skips it."""
    if not path.exists():
        return False
    return not (retry_failed and json.loads(path.read_text()).get("error"))


def run_config_defaults(pyproject: Path = PYPROJECT) -> dict[str, Any]:
    """The app's default run config (``[tool.flwr.app.config]`` of pyproject.toml): what a record's overrides and a
    table's settings line are stated against."""
    return tomllib.loads(pyproject.read_text())["tool"]["flwr"]["app"]["config"]


# --------------------------------------------------------------------------- a failed run's error
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_EXCEPTION_LINE = re.compile(r"^(?:[a-z_]\w*\.)*[A-Z]\w*: \S")  # "task.options.ConfigConflict: run-config key ..."


def failure_line(error: str | None) -> str:
    """The line of a failed run's log tail that names the error (else its last line)."""
    lines = [ln for ln in (error or "").splitlines() if ln.strip()]
    named = [ln for ln in lines if re.search(r"(Error|Exception|Timeout)\b", ln)]
    return _ANSI.sub("", (named or lines or [""])[-1]).strip()


def error_line(error: str | None) -> str:
    """The line of a failed run's log tail that names its error: the last exception line of a traceback
    (``package.module.SomeConflict: ...``) when there is one, else :func:`failure_line`'s choice (which
    looks for names ending in Error / Exception / Timeout and falls back to the last line)."""
    lines = [_ANSI.sub("", ln).strip() for ln in (error or "").splitlines()]
    raised = [ln for ln in lines if _EXCEPTION_LINE.match(ln)]
    return raised[-1] if raised else failure_line(error)


# --------------------------------------------------------------------------- reading: the runs of a cell, their values
def short_coverage(rec: Rec) -> bool:
    """Whether a record's final means speak for less than its run's ``min-coverage`` of the clients asked (the
    summary's ``coverage``; records from before it have none): such a run failed, and no table ranks it."""
    covered = (rec.get("summary") or {}).get("coverage")
    return isinstance(covered, dict) and covered.get("met") is False


def ok(recs: Iterable[Rec]) -> list[Rec]:
    """The records of runs that completed with results to compare: no error, and means over enough clients."""
    return [r for r in recs if not r.get("error") and not short_coverage(r)]


def select(recs: Iterable[Rec], **coords: Any) -> list[Rec]:
    return [r for r in recs if all(r["cell"].get(k) == v for k, v in coords.items())]


def axis(recs: Iterable[Rec], name: str, order: Iterable[str] = ()) -> list[Any]:
    """The values of a grid axis present in the records, in ``order`` first, then sorted."""
    present = {r["cell"].get(name) for r in recs} - {None}
    first = [v for v in order if v in present]
    return first + sorted(present - set(first), key=str)


def values(recs: Iterable[Rec], metric: Callable[[Rec], Any]) -> list[float]:
    return [float(v) for v in (metric(r) for r in ok(recs)) if v is not None]


def mean(recs: Iterable[Rec], metric: Callable[[Rec], Any]) -> float | None:
    vals = values(recs, metric)
    return float(np.mean(vals)) if vals else None


def summary(key: str) -> Callable[[Rec], Any]:
    """The metric that reads ``key`` of a record's summary (final-round values)."""
    return lambda r: r["summary"].get(key)


PERSONAL, GLOBAL = summary("personal-acc"), summary("global-acc")


def seeds_of(recs: Iterable[Rec]) -> list[int]:
    return sorted({r["cell"]["seed"] for r in recs if "seed" in r["cell"]})


def label(cell: dict[str, Any]) -> str:
    """A row's label: its grid coordinates except the seed."""
    return " / ".join(str(v) for k, v in cell.items() if k != "seed")

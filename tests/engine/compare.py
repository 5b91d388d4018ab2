"""What two runs of the same run config must share, whichever runtime ran them: a results folder's summary.json,
rounds.json and clients.csv, and each client's saved model, with what depends on the machine or the moment set aside
(wall-clock times, memory, where a message's time went, run ids, node ids, the folder's name)."""

from __future__ import annotations

import csv
import json
import re
from pathlib import Path
from typing import Any

import numpy as np
from safetensors.numpy import load_file

#: keys whose values are measurements of the moment (seconds, memory) or names of the run, set aside at any depth
VOLATILE = re.compile(
    r"^(seconds|server-seconds|checkpoint-seconds|index-seconds|results|run-id|message-timing|started|"
    r"server-peak-rss-mb|peak-rss-mb.*|time-.*|.*-seconds(-.*)?)$"
)
#: clients.csv columns that are measurements of the moment
VOLATILE_COLUMNS = re.compile(r"^(peak-rss-mb|time-.*|.*-seconds)$")


def scrub(value: Any) -> Any:
    """``value`` without the volatile keys, at any depth."""
    if isinstance(value, dict):
        return {k: scrub(v) for k, v in value.items() if not VOLATILE.match(str(k))}
    if isinstance(value, list):
        return [scrub(v) for v in value]
    return value


def clients_table(folder: Path) -> list[dict[str, str]] | None:
    """clients.csv without its volatile columns; None where the run wrote none (under DP: no single client's value
    is published)."""
    if not (folder / "clients.csv").is_file():
        return None
    with (folder / "clients.csv").open(newline="") as fh:
        rows = list(csv.DictReader(fh))
    return [{k: v for k, v in row.items() if not VOLATILE_COLUMNS.match(k)} for row in rows]


#: the bytes the server sends: every message's config carries the run's folder (``run-key``, ``state-dir``,
#: ``model-dir``), whose name ends in the run id, so they are compared only between folders whose names are as long
BYTES_DOWN = re.compile(r"bytes-down")


def without_bytes_down(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_bytes_down(v) for k, v in value.items() if not BYTES_DOWN.search(str(k))}
    if isinstance(value, list):
        return [without_bytes_down(v) for v in value]
    return value


def results(folder: Path) -> dict[str, Any]:
    """The comparable part of a results folder."""
    return {
        "summary.json": scrub(json.loads((folder / "summary.json").read_text())),
        "rounds.json": scrub(json.loads((folder / "rounds.json").read_text())),
        "clients.csv": clients_table(folder),
    }


def models(folder: Path) -> dict[str, dict[str, np.ndarray]]:
    """Every saved client model, by file name."""
    return {p.name: load_file(str(p)) for p in sorted((folder / "models" / "clients").glob("*.safetensors"))}


def differences(a: Any, b: Any, path: str = "") -> list[str]:
    """Where two JSON-like values differ (paths), exactly: no tolerance."""
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}/{k}: only in the {'first' if k in a else 'second'}" for k in sorted(set(a) ^ set(b))]
        for k in sorted(set(a) & set(b)):
            out += differences(a[k], b[k], f"{path}/{k}")
        return out
    if isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            return [f"{path}: {len(a)} items against {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]")]
    both_nan = isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b)
    return [] if a == b or both_nan else [f"{path}: {a!r} != {b!r}"]


def assert_same_results(first: Path, second: Path, *, models_too: bool = True) -> None:
    a, b = results(first), results(second)
    if len(first.name) != len(second.name):  # run ids of different lengths: the names in every message differ
        a, b = without_bytes_down(a), without_bytes_down(b)
    found = differences(a, b)
    if models_too:
        ma, mb = models(first), models(second)
        if set(ma) != set(mb):
            found.append(f"models: {sorted(ma)} against {sorted(mb)}")
        for name in sorted(set(ma) & set(mb)):
            for key in sorted(set(ma[name]) | set(mb[name])):
                if key not in ma[name] or key not in mb[name] or not np.array_equal(ma[name][key], mb[name][key]):
                    found.append(f"models/{name}/{key} differs")
    assert not found, f"{first} and {second} differ in {len(found)} places:\n" + "\n".join(found[:40])

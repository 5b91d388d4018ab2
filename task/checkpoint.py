"""Checkpoints: a strategy's declared state as one JSON tree plus one safetensors file, written atomically.

:func:`to_tree` turns plain data (dicts with int or str keys, lists, tuples, sets, numpy arrays and scalars,
``random.Random`` / numpy ``Generator`` states) into JSON plus a flat dict of arrays; :func:`from_tree`
rebuilds it.  Objects are refused both ways: what a method saves is what its ``state()`` declares, in plain
values, and its ``restore()`` rebuilds its objects from them, so loading never creates an object the file names.

A checkpoint folder holds ``round-NNNN/`` folders (``state.json``, ``arrays.safetensors``) and a ``LATEST``
file naming the newest complete one.  Each folder is written under a temporary name and renamed, then
``LATEST`` is replaced: a crash at any moment leaves the previous checkpoint intact.  ``state.json`` carries
the format version and the arrays file's SHA-256, so a truncated or foreign file is refused with a reason.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from task.params import contiguous

#: 2: the strategy's declared state (``state()``: a "base" and a "method" part); 1 (refused) held its attributes
FORMAT_VERSION = 2


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message says what is wrong."""


# ---------------------------------------------------------------------------------------------- the tree codec
class _Encoder:
    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def array(self, a: np.ndarray) -> dict:
        key = f"a{len(self.arrays)}"
        self.arrays[key] = contiguous(a)
        return {"$array": key}

    def __call__(self, obj: Any) -> Any:
        if isinstance(obj, np.generic):  # before float: np.float64 is a float too
            return {"$scalar": obj.dtype.str, "v": self(obj.item())}
        if obj is None or isinstance(obj, (bool, str)):
            return obj
        if isinstance(obj, (int, float)):
            return obj if not isinstance(obj, float) or np.isfinite(obj) else {"$float": repr(obj)}
        if isinstance(obj, np.ndarray):
            if obj.dtype == object:
                raise TypeError("object arrays cannot be checkpointed")
            return self.array(obj)
        if isinstance(obj, random.Random):
            return {"$random": self(obj.getstate())}
        if isinstance(obj, np.random.Generator):
            return {"$generator": self(obj.bit_generator.state)}
        if isinstance(obj, dict):
            if all(isinstance(k, str) for k in obj):
                return {"$dict": [[k, self(v)] for k, v in obj.items()]}
            return {"$dict": [[self(k), self(v)] for k, v in obj.items()]}
        if isinstance(obj, list):
            return [self(v) for v in obj]
        if isinstance(obj, tuple):
            return {"$tuple": [self(v) for v in obj]}
        if isinstance(obj, (set, frozenset)):
            return {"$set": [self(v) for v in sorted(obj, key=repr)], "frozen": isinstance(obj, frozenset)}
        cls = type(obj)
        raise TypeError(
            f"cannot checkpoint a {cls.__module__}.{cls.__qualname__}: a state() holds plain values (numbers, "
            "strings, lists, dicts, numpy arrays, random generators), and restore() rebuilds objects from them"
        )


def to_tree(obj: Any) -> tuple[Any, dict[str, np.ndarray]]:
    """(JSON-able tree, arrays) of the plain data ``obj``."""
    enc = _Encoder()
    return enc(obj), enc.arrays


def from_tree(tree: Any, arrays: dict[str, np.ndarray]) -> Any:
    """Rebuild what :func:`to_tree` encoded."""

    def dec(t: Any) -> Any:
        if isinstance(t, list):
            return [dec(v) for v in t]
        if not isinstance(t, dict):
            return t
        if "$array" in t:
            if t["$array"] not in arrays:
                raise CheckpointError(f"array {t['$array']} is missing from the arrays file")
            return np.array(arrays[t["$array"]])
        if "$float" in t:
            return float(t["$float"])
        if "$scalar" in t:
            return np.dtype(t["$scalar"]).type(dec(t["v"]))
        if "$random" in t:
            r = random.Random()
            r.setstate(_tuples(dec(t["$random"])))
            return r
        if "$generator" in t:
            state = dec(t["$generator"])
            g = np.random.Generator(getattr(np.random, state["bit_generator"])())
            g.bit_generator.state = state
            return g
        if "$dict" in t:
            return {dec(k): dec(v) for k, v in t["$dict"]}
        if "$tuple" in t:
            return tuple(dec(v) for v in t["$tuple"])
        if "$set" in t:
            items = [dec(v) for v in t["$set"]]
            return frozenset(items) if t.get("frozen") else set(items)
        raise CheckpointError(f"unknown node in the checkpoint tree: {sorted(t)[:3]}")

    return dec(tree)


def _tuples(x: Any) -> Any:
    return tuple(_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x


# ---------------------------------------------------------------------------------------------- files
def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def save_checkpoint(
    folder: str | Path, server_round: int, tree: Any, arrays: dict[str, np.ndarray], meta: dict[str, Any], keep: int = 2
) -> Path:
    """Write round ``server_round``'s checkpoint under ``folder`` atomically and keep the newest ``keep``."""
    from safetensors.numpy import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    name = f"round-{server_round:05d}"
    tmp = folder / f".{name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_file({k: contiguous(v) for k, v in arrays.items()}, str(tmp / "arrays.safetensors"))
    doc = {
        "format-version": FORMAT_VERSION,
        "round": server_round,
        "meta": meta,
        "state": tree,
        "arrays-sha256": _sha256(tmp / "arrays.safetensors"),
    }
    (tmp / "state.json").write_text(json.dumps(doc))
    final = folder / name
    shutil.rmtree(final, ignore_errors=True)
    tmp.replace(final)
    latest_tmp = folder / f".LATEST.tmp-{os.getpid()}"
    latest_tmp.write_text(name)
    latest_tmp.replace(folder / "LATEST")
    rounds = sorted(p for p in folder.glob("round-*") if p.is_dir())
    for old in rounds[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load_checkpoint(folder: str | Path) -> tuple[int, Any, dict[str, Any]]:
    """(round, decoded state tree, meta) of the newest complete checkpoint in ``folder``; raises
    :class:`CheckpointError` naming the problem when it is missing, truncated or from a newer format."""
    from safetensors.numpy import load_file

    folder = Path(folder)
    latest = folder / "LATEST"
    if not latest.is_file():
        raise CheckpointError(f"no checkpoint in {folder} (no LATEST file): nothing to resume from")
    current = folder / latest.read_text().strip()
    doc_path, arr_path = current / "state.json", current / "arrays.safetensors"
    if not doc_path.is_file() or not arr_path.is_file():
        raise CheckpointError(f"checkpoint {current} is incomplete (state.json or arrays.safetensors missing)")
    try:
        doc = json.loads(doc_path.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"checkpoint {doc_path} is not valid JSON (truncated?): {err}") from err
    version = doc.get("format-version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {current} has format version {version!r}; this pflower reads version "
            f"{FORMAT_VERSION} (a newer pflower wrote it)"
        )
    if version < FORMAT_VERSION:
        raise CheckpointError(
            f"checkpoint {current} has format version {version}, written by an older pflower that saved the "
            f"strategy's attributes; this pflower reads version {FORMAT_VERSION} (each method's declared state) "
            "and cannot resume it: finish the run with the pflower that started it, or start it again"
        )
    if _sha256(arr_path) != doc.get("arrays-sha256"):
        raise CheckpointError(f"checkpoint {arr_path} does not match its recorded SHA-256 (truncated or replaced)")
    try:
        arrays = load_file(str(arr_path))
    except Exception as err:
        raise CheckpointError(f"checkpoint {arr_path} cannot be read: {err}") from err
    return int(doc["round"]), from_tree(doc["state"], arrays), doc.get("meta", {})

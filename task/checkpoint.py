"""Checkpoints: a strategy's whole state as one JSON tree plus one safetensors file, written atomically.

:func:`to_tree` turns an object graph (dicts with int or str keys, lists, tuples, sets, numpy arrays and
scalars, ``random.Random`` / numpy ``Generator`` states, torch modules, dataclasses and the project's own
classes) into JSON plus a flat dict of arrays; :func:`from_tree` rebuilds it.  Loading never runs code from
the file: objects of the project's own classes (``strategies.*``, ``task.*``) are re-created without calling
their constructor and get their saved attributes back; anything else is refused.

A checkpoint folder holds ``round-NNNN/`` folders (``state.json``, ``arrays.safetensors``) and a ``LATEST``
file naming the newest complete one.  Each folder is written under a temporary name and renamed, then
``LATEST`` is replaced: a crash at any moment leaves the previous checkpoint intact.  ``state.json`` carries
the format version and the arrays file's SHA-256, so a truncated or foreign file is refused with a reason.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import json
import os
import random
import shutil
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from task.params import contiguous

FORMAT_VERSION = 1
ALLOWED_PACKAGES = ("strategies.", "task.", "server_app.")


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message says what is wrong."""


# ---------------------------------------------------------------------------------------------- the tree codec
class _Encoder:
    def __init__(self, skip: Iterable[str] = ()) -> None:
        self.arrays: dict[str, np.ndarray] = {}
        self.skip = set(skip)

    def array(self, a: np.ndarray) -> dict:
        key = f"a{len(self.arrays)}"
        self.arrays[key] = contiguous(a)
        return {"$array": key}

    def __call__(self, obj: Any) -> Any:  # noqa: C901 - one case per kind of value
        import torch

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
        if isinstance(obj, torch.Tensor):
            return {"$tensor": self.array(obj.detach().cpu().numpy())}
        if isinstance(obj, torch.nn.Module):
            return {"$module": {k: self(v) for k, v in obj.state_dict().items()}}
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
        path = f"{cls.__module__}:{cls.__qualname__}"
        if not path.startswith(ALLOWED_PACKAGES):
            raise TypeError(f"cannot checkpoint a {path} (only the project's own classes)")
        fields = (
            {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj)}
            if dataclasses.is_dataclass(obj)
            else vars(obj)
        )
        return {"$object": path, "fields": {k: self(v) for k, v in fields.items() if k not in self.skip}}


def to_tree(obj: Any, skip: Iterable[str] = ()) -> tuple[Any, dict[str, np.ndarray]]:
    """(JSON-able tree, arrays) of ``obj``; attributes named in ``skip`` are left out of every object."""
    enc = _Encoder(skip)
    return enc(obj), enc.arrays


def _resolve(path: str) -> type:
    if not path.startswith(ALLOWED_PACKAGES):
        raise CheckpointError(f"checkpoint names a class outside the project: {path}")
    module, _, name = path.partition(":")
    obj: Any = importlib.import_module(module)
    for part in name.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, type):
        raise CheckpointError(f"{path} is not a class")
    return obj


def from_tree(tree: Any, arrays: dict[str, np.ndarray]) -> Any:
    """Rebuild what :func:`to_tree` encoded (torch modules come back as their state dicts)."""
    import torch

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
        if "$tensor" in t:
            return torch.from_numpy(np.array(dec(t["$tensor"])))
        if "$module" in t:
            return {"$module": {k: torch.as_tensor(dec(v)) for k, v in t["$module"].items()}}
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
        if "$object" in t:
            cls = _resolve(t["$object"])
            obj = cls.__new__(cls)
            for k, v in t["fields"].items():
                object.__setattr__(obj, k, dec(v))
            return obj
        raise CheckpointError(f"unknown node in the checkpoint tree: {sorted(t)[:3]}")

    return dec(tree)


def _tuples(x: Any) -> Any:
    return tuple(_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x


def restore_into(target: Any, saved: dict[str, Any]) -> None:
    """Put saved attributes back into a freshly built object: torch modules load their state dicts in place,
    everything else is assigned."""
    import torch

    for name, value in saved.items():
        current = getattr(target, name, None)
        if isinstance(current, torch.nn.Module) and isinstance(value, dict) and "$module" in value:
            current.load_state_dict(value["$module"])
        else:
            setattr(target, name, value)


# ---------------------------------------------------------------------------------------------- files
def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
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
    os.replace(tmp, final)
    latest_tmp = folder / f".LATEST.tmp-{os.getpid()}"
    latest_tmp.write_text(name)
    os.replace(latest_tmp, folder / "LATEST")
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
            f"checkpoint {current} has format version {version!r}; this pflower reads versions up "
            f"to {FORMAT_VERSION} (a newer pflower wrote it)"
        )
    if _sha256(arr_path) != doc.get("arrays-sha256"):
        raise CheckpointError(f"checkpoint {arr_path} does not match its recorded SHA-256 (truncated or replaced)")
    try:
        arrays = load_file(str(arr_path))
    except Exception as err:
        raise CheckpointError(f"checkpoint {arr_path} cannot be read: {err}") from err
    return int(doc["round"]), from_tree(doc["state"], arrays), doc.get("meta", {})

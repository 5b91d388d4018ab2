"""Saved models: one safetensors file of weights and a small JSON manifest next to it.

A personalized model (the model a client uses for its own predictions, as its method defines it) or a
server-side model (global, cluster, tier) is saved as ``<name>.safetensors`` + ``<name>.json``.  The
manifest names the method, the round, the model architecture and its input shape, the client, the client's
last personalized accuracy and the run config, so :func:`load_model` can rebuild the network without the
run.  :func:`predict_file` evaluates or predicts on a data file in the deployed-node format (``.npz`` with
``x``, optionally ``y`` and held-out ``x_test`` / ``y_test``), on its held-out arrays where it has them;
``python -m task.predict`` is the command around it.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from task.params import contiguous

MANIFEST_VERSION = 1


def _atomic_write(path: Path, write) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        write(tmp_name)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)


def save_model(path: str | Path, state: Mapping[str, Any], manifest: Mapping[str, Any]) -> Path:
    """Write ``path``.safetensors (the state, numpy or torch values) and ``path``.json (the manifest + shapes)."""
    from safetensors.numpy import save_file

    base = Path(path)
    arrays = {
        k: contiguous(v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v))
        for k, v in state.items()
    }
    doc = {"manifest-version": MANIFEST_VERSION, **manifest, "shapes": {k: list(a.shape) for k, a in arrays.items()}}
    _atomic_write(base.with_suffix(".safetensors"), lambda tmp: save_file(arrays, tmp))
    _atomic_write(base.with_suffix(".json"), lambda tmp: Path(tmp).write_text(json.dumps(doc, indent=1)))
    return base.with_suffix(".safetensors")


def read_manifest(path: str | Path) -> dict[str, Any]:
    base = Path(path)
    base = base.with_suffix("") if base.suffix in (".safetensors", ".json") else base
    manifest = base.with_suffix(".json")
    if not manifest.is_file() or not base.with_suffix(".safetensors").is_file():
        raise ValueError(f"no saved model at {base} (expected {base.name}.safetensors and {base.name}.json)")
    doc = json.loads(manifest.read_text())
    if doc.get("manifest-version", 0) > MANIFEST_VERSION:
        raise ValueError(f"{manifest} was written by a newer pflower (manifest version {doc['manifest-version']})")
    return doc


def load_model(path: str | Path) -> tuple[torch.nn.Module, dict[str, Any]]:
    """(network in eval mode, manifest) of a saved model; the architecture comes from the manifest."""
    from safetensors.numpy import load_file

    from task.models import build_model
    from task.params import load_record

    doc = read_manifest(path)
    base = Path(path)
    base = base.with_suffix("") if base.suffix in (".safetensors", ".json") else base
    m = doc["model"]
    net = build_model(m["name"], m["in-channels"], m["image-size"], m["num-classes"])
    load_record(net, load_file(str(base.with_suffix(".safetensors"))), strict_keys=True)
    return net.eval(), doc


def model_manifest(settings, **extra: Any) -> dict[str, Any]:
    """The manifest fields every saved model of a run shares (method, architecture, data set, run config)."""
    return {
        "method": settings.method,
        "dataset": settings.data.dataset,
        "model": {
            "name": settings.model,
            "in-channels": settings.in_channels,
            "image-size": settings.image_size,
            "num-classes": settings.num_classes,
        },
        "run-config": dict(settings.raw),
        **extra,
    }


@torch.no_grad()
def predict(model: torch.nn.Module, x: np.ndarray, batch_size: int = 512) -> np.ndarray:
    """Predicted labels of ``x`` (class of the largest logit)."""
    device = next(model.parameters()).device
    out = []
    for start in range(0, len(x), batch_size):
        logits = model(torch.as_tensor(x[start : start + batch_size], dtype=torch.float32, device=device))
        out.append(logits.argmax(1).cpu().numpy())
    return np.concatenate(out) if out else np.zeros(0, np.int64)


def predict_file(model_path: str | Path, data_path: str | Path, split: str = "auto") -> dict[str, Any]:
    """Load a saved model and run it on an ``.npz`` data file in a deployed node's format (``x``, optional ``y``,
    optional held-out ``x_test`` / ``y_test``): the predictions, which arrays they are of, and the accuracy when
    labels are there.  ``split``: ``'auto'`` scores the held-out arrays where the file has them (a node's data
    file holds the data its model trained on in ``x`` / ``y``) and else ``x`` / ``y``; ``'test'`` / ``'train'``
    ask for one of them."""
    from task.data.files import SPLITS, read_node_file

    model, doc = load_model(model_path)
    m = doc["model"]
    x, y, used = read_node_file(data_path, doc["dataset"], labels_required=False, split=split)
    if tuple(x.shape[1:]) != (
        (m["in-channels"], m["image-size"], m["image-size"]) if m["image-size"] else (m["in-channels"],)
    ):
        raise ValueError(f"{data_path}: inputs of shape {x.shape[1:]} do not fit the model's {m}")
    labels = predict(model, x)
    xs, ys = SPLITS[used]
    out: dict[str, Any] = {
        "model": str(model_path),
        "data": str(data_path),
        "arrays": f"{xs}/{ys}" if y is not None else xs,
        "held-out": used == "test",
        "samples": len(x),
        "predictions": labels,
    }
    if y is not None:
        out["accuracy"] = float((labels == y).mean()) if len(y) else None
    return out

"""A deployed node's own data file (node config ``data-path``): the ``.npz`` format, its checks, and the export
of a partition into that format."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch

from task.data.catalogue import dataset_info
from task.data.clients import (
    ClientData,
    DataSettings,
    load_client_data,
    stratified_split,
    subsample_rng,
    training_subsample,
)


def _read_npz(file: Path, where: str) -> dict[str, np.ndarray]:
    if not file.is_file():
        raise ValueError(f"{where}: no such file (expected an .npz with arrays 'x' and 'y')")
    try:
        with np.load(file, allow_pickle=False) as z:
            return {k: z[k] for k in z.files}
    except Exception as exc:  # a zip or npy error: say what the file should be
        raise ValueError(f"{where}: not a readable .npz file ({exc}); expected arrays 'x' and 'y'") from exc


def checked_arrays(
    x: np.ndarray, y: np.ndarray | None, name: str, dataset: str, where: str
) -> tuple[np.ndarray, np.ndarray | None]:
    """``x`` (float32 in the data set's sample shape; uint8 scaled to [0, 1]) and ``y`` (int64 labels in range),
    or ValueError saying what is wrong and what is allowed."""
    info = dataset_info(dataset)
    shape = (info.in_channels, info.image_size, info.image_size) if info.image_size > 0 else (info.in_channels,)
    if x.ndim != len(shape) + 1 or tuple(x.shape[1:]) != shape:
        raise ValueError(
            f"{where}: '{name}' has shape {x.shape}; dataset {dataset!r} needs (N, {', '.join(map(str, shape))})"
        )
    if y is not None:
        if y.shape != (len(x),) or not np.issubdtype(y.dtype, np.integer):
            raise ValueError(
                f"{where}: labels for '{name}' must be integers of shape ({len(x)},), got {y.dtype} {y.shape}"
            )
        if len(y) and (y.min() < 0 or y.max() >= info.num_classes):
            raise ValueError(
                f"{where}: labels of '{name}' must be in [0, {info.num_classes}), got [{y.min()}, {y.max()}]"
            )
        y = y.astype(np.int64)
    if x.dtype == np.uint8:
        x = x.astype(np.float32) / 255.0
    elif not np.issubdtype(x.dtype, np.floating):
        raise ValueError(f"{where}: '{name}' must be float or uint8, got {x.dtype}")
    if not np.isfinite(x).all():
        raise ValueError(f"{where}: '{name}' contains NaN or infinite values")
    return np.ascontiguousarray(x, dtype=np.float32), y


#: the arrays of a data file: its held-out split and its training split (train + validation)
SPLITS = {"test": ("x_test", "y_test"), "train": ("x", "y")}


def read_node_file(
    path: str | Path, dataset: str, labels_required: bool = True, split: str = "train"
) -> tuple[np.ndarray, np.ndarray | None, str]:
    """(x, y, split) of a data file in the deployed-node format (``y`` None when absent and not required): its
    training arrays ``x`` / ``y`` (``split='train'``), its held-out ``x_test`` / ``y_test`` (``'test'``), or the
    held-out ones where the file has them and else the training ones (``'auto'``); ``split`` says which it read."""
    if dataset == "dialects":
        raise ValueError(f"{path}: the 'dialects' text task has no file format; use a vision or vector dataset")
    if split not in (*SPLITS, "auto"):
        raise ValueError(f"split {split!r}: allowed are {[*SPLITS, 'auto']}")
    where = f"data file {str(path)!r}"
    arrays = _read_npz(Path(path).expanduser(), where)
    if split == "auto":
        split = "test" if SPLITS["test"][0] in arrays else "train"
    xs, ys = SPLITS[split]
    if xs not in arrays or (labels_required and ys not in arrays):
        needs = f"'{xs}'" + (f" and '{ys}'" if labels_required else "")
        raise ValueError(f"{where}: has arrays {sorted(arrays)}; needs {needs}")
    x, y = checked_arrays(arrays[xs], arrays.get(ys), xs, dataset, where)
    return x, y, split


@functools.lru_cache(maxsize=8)
def load_local_file(path: str, settings: DataSettings, partition_id: int) -> ClientData:
    """A deployed node's own data from an ``.npz`` file (node config ``data-path``), split like a partition.

    The file holds ``x`` (samples in the run's dataset shape: ``(N, C, H, W)`` for images, ``(N, D)`` for vector
    data; float, or uint8 scaled to [0, 1]) and integer labels ``y`` in ``[0, num_classes)``.  Optional
    ``x_test`` / ``y_test`` are used as the test split as they are; otherwise ``test-fraction`` of the data is
    held out.  ``val-fraction`` is taken from the training data, stratified and seeded by (seed, partition-id).
    """
    info = dataset_info(settings.dataset)
    where = f"node config 'data-path' {path!r}"
    if settings.dataset == "dialects":
        raise ValueError(f"{where}: the 'dialects' text task has no file format; use a vision or vector dataset")
    file = Path(path).expanduser()
    arrays = _read_npz(file, where)
    missing = [k for k in ("x", "y") if k not in arrays]
    if missing or (("x_test" in arrays) != ("y_test" in arrays)):
        raise ValueError(
            f"{where}: has arrays {sorted(arrays)}; needs 'x' and 'y' (and optionally both 'x_test' and 'y_test')"
        )

    def checked(x: np.ndarray, y: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
        x, labels = checked_arrays(x, y, name, settings.dataset, where)
        assert labels is not None  # labels in, labels out
        return x, labels

    x, y = checked(arrays["x"], arrays["y"], "x")
    if len(y) < 2:
        raise ValueError(f"{where}: has {len(y)} samples; a client needs at least 2")
    rng = np.random.default_rng([settings.seed, partition_id])
    if "x_test" in arrays:
        x_te, y_te = checked(arrays["x_test"], arrays["y_test"], "x_test")
        tr, va, _ = stratified_split(y, 0.0, settings.val_fraction, rng)
    else:
        tr, va, te = stratified_split(y, settings.test_fraction, settings.val_fraction, rng)
        x_te, y_te = x[te], y[te]
    tr = tr[training_subsample(y[tr], settings.train_samples, subsample_rng(settings, partition_id))]

    def t(a):
        return torch.from_numpy(np.ascontiguousarray(a))

    meta = {"partition-id": partition_id, "data-path": str(file)}
    return ClientData(t(x[tr]), t(y[tr]), t(x[va]), t(y[va]), t(x_te), t(y_te), info.num_classes, "local", meta)


def export_client_file(settings: DataSettings, partition_id: int, num_partitions: int, path: str | Path) -> Path:
    """Write partition ``partition_id`` as a node's ``data-path`` file (train+val as x/y, test as x_test/y_test)."""
    d = load_client_data(settings, partition_id, num_partitions)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(
        out,
        x=torch.cat([d.x_train, d.x_val]).numpy(),
        y=torch.cat([d.y_train, d.y_val]).numpy(),
        x_test=d.x_test.numpy(),
        y_test=d.y_test.numpy(),
    )
    return out

"""Whole data sets in memory: the embedded digits, the synthetic concept shift, MNIST-1D generated offline, and real
data sets from a local copy (a ``Dataset.save_to_disk`` folder or a torchvision root) or the Hugging Face hub.  Heavy
libraries (``datasets``, ``torchvision``, ``sklearn``, ``mnist1d``) are imported only by the loader that needs them."""

from __future__ import annotations

import functools
import random
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from task.data.catalogue import MNIST1D_SAMPLES, DatasetInfo, dataset_info, synth_concept

# Fixed seed of the pixel noise added by ``noise-std`` (fedcac.md §8: "its own fixed seed"), so the
# noisy data set is the same whatever the run's seed.
NOISE_SEED = 7_777


@dataclass
class Centralized:
    """A whole data set in memory: images ``x`` (N, C, H, W) float32 in [0, 1], labels ``y`` (N,) int64.

    With ``copies`` > 1 (run-config ``data-copies``) the first :attr:`originals` samples are the data set and the
    rest are jittered copies of them in blocks: sample ``i + j * originals`` is copy ``j`` of original ``i``.
    Partitions and held-out splits are made of originals only; a copy goes only where its original trains
    (:meth:`with_copies`), so no training split holds a near copy of any client's validation or test image."""

    x: np.ndarray
    y: np.ndarray
    info: DatasetInfo
    source: np.ndarray | None = None  # concept-shift data: which source labelled each sample
    copies: int = 1

    @property
    def originals(self) -> int:
        """How many samples are the data set's own (the rest are their jittered copies)."""
        return len(self.y) // self.copies

    def with_copies(self, indices: np.ndarray) -> np.ndarray:
        """``indices`` of originals followed by their copies, block by block (``indices`` alone without copies)."""
        indices = np.asarray(indices, dtype=np.int64)
        if len(indices) and (indices.min() < 0 or indices.max() >= self.originals):
            raise ValueError(f"only originals have copies: indices must be in [0, {self.originals})")
        return np.concatenate([indices + j * self.originals for j in range(self.copies)])


def _images_to_array(images: list, channels: int) -> np.ndarray:
    arr = np.stack([np.asarray(img, dtype=np.float32) for img in images])
    arr = arr[:, None] if arr.ndim == 3 else arr.transpose(0, 3, 1, 2)  # (N, H, W) grey or (N, H, W, C)
    if arr.shape[1] != channels:
        arr = arr.mean(axis=1, keepdims=True) if channels == 1 else np.repeat(arr[:, :1], channels, axis=1)
    return arr / 255.0 if arr.max() > 1.0 else arr


def _load_hf_dataset(info: DatasetInfo, data_dir: str) -> tuple[np.ndarray, np.ndarray]:
    import datasets

    if data_dir:
        ds = datasets.load_from_disk(data_dir)
    else:
        if info.hf_id is None:
            raise ValueError(
                f"dataset {info.name!r} has no Hugging Face id; set run-config 'data-dir' to a local copy "
                "(a Dataset.save_to_disk folder or a torchvision root)"
            )
        ds = datasets.load_dataset(info.hf_id, info.hf_config) if info.hf_config else datasets.load_dataset(info.hf_id)
    if isinstance(ds, datasets.DatasetDict):  # pool all splits: clients get their own train/val/test
        ds = datasets.concatenate_datasets([ds[s] for s in ds])
    image_col = info.image_column if info.image_column in ds.column_names else "image"
    label_col = info.label_column if info.label_column in ds.column_names else "label"
    for col in (image_col, label_col):
        if col not in ds.column_names:
            raise ValueError(f"local copy of {info.name!r} has no column {col!r}; found {ds.column_names}")
    x = _images_to_array(ds[image_col], info.in_channels)
    y = np.asarray(ds[label_col], dtype=np.int64)
    return x, y


def _hf_labels(info: DatasetInfo, data_dir: str) -> np.ndarray:
    """The label column of a ``save_to_disk`` folder, its splits pooled in :func:`_load_hf_dataset`'s order, without
    decoding a single image."""
    import datasets

    ds = datasets.load_from_disk(data_dir)
    splits = [ds[s] for s in ds] if isinstance(ds, datasets.DatasetDict) else [ds]
    label_col = info.label_column if info.label_column in splits[0].column_names else "label"
    if label_col not in splits[0].column_names:
        raise ValueError(f"local copy of {info.name!r} has no column {label_col!r}; found {splits[0].column_names}")
    return np.concatenate([np.asarray(s[label_col], dtype=np.int64) for s in splits])


def _load_torchvision(info: DatasetInfo, root: str) -> tuple[np.ndarray, np.ndarray]:
    import torchvision

    if info.torchvision_name is None:
        raise ValueError(f"data set {info.name!r} has no torchvision source")
    cls = getattr(torchvision.datasets, info.torchvision_name)
    xs, ys = [], []
    kwargs = dict(info.torchvision_kwargs)
    for split in (
        ({"split": "train"}, {"split": "test"}) if info.name == "svhn" else ({"train": True}, {"train": False})
    ):
        ds = cls(root=root, download=False, **kwargs, **split)
        xs.append(_images_to_array([ds[i][0] for i in range(len(ds))], info.in_channels))
        ys.append(np.asarray([int(ds[i][1]) for i in range(len(ds))], dtype=np.int64))
    return np.concatenate(xs), np.concatenate(ys)


#: the data sets made here, without a download or a local copy
OFFLINE = ("digits", "synth-concept", "mnist1d")
#: numpy's and Python's global generators are the process's: one MNIST-1D generation at a time swaps them
_GLOBAL_RNG = threading.Lock()


def make_mnist1d(num_samples: int = MNIST1D_SAMPLES) -> tuple[np.ndarray, np.ndarray]:
    """MNIST-1D (Greydanus & Kobak, "Scaling down deep learning with MNIST-1D", ICML 2024), made offline by the
    ``mnist1d`` package's ``make_dataset`` at its published settings (its templates, transforms and seed 42):
    ``num_samples // 10`` signals of each digit, each 40 points long, standardised over the whole set.  The package's
    two splits are pooled (every client gets its own train / validation / test split).  Returns (x (N, 40) float32,
    y (N,) int64), the same for the same ``num_samples`` in any process.

    ``make_dataset`` seeds and draws from numpy's and Python's global generators: their states are saved and put
    back, so generating the data set changes no other draw of the process."""
    if num_samples < 10 or num_samples % 10:
        raise ValueError(f"mnist1d-samples must be a positive multiple of 10 (10 digits), got {num_samples}")
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples = num_samples
    with _GLOBAL_RNG:
        numpy_state, python_state = np.random.get_state(), random.getstate()  # noqa: NPY002 - the package's globals
        try:
            made = make_dataset(args)
        finally:
            np.random.set_state(numpy_state)  # noqa: NPY002
            random.setstate(python_state)
    x = np.concatenate([made["x"], made["x_test"]]).astype(np.float32)
    y = np.concatenate([made["y"], made["y_test"]]).astype(np.int64)
    return x, y


@functools.lru_cache(maxsize=4)
def load_centralized(
    name: str, data_dir: str = "", noise_std: float = 0.0, copies: int = 1, samples: int = MNIST1D_SAMPLES
) -> Centralized:
    """Load data set ``name`` whole (cached per process); ``samples``: how many signals MNIST-1D makes.

    ``noise_std`` > 0 adds fixed Gaussian pixel noise (its own seed): clean digits are too easy to tell
    methods apart (fedcac.md §8 uses 0.7).  ``copies`` > 1 appends jittered copies of the data (each
    shifted by up to one pixel, with light noise; fixed seed) that enlarge the clients' training splits only
    (:class:`Centralized`: a copy trains where its original trains, and never stands in a held-out split).
    """
    info = dataset_info(name)
    if noise_std < 0:
        raise ValueError(f"noise-std must be >= 0, got {noise_std}")
    if copies < 1:
        raise ValueError(f"data-copies must be >= 1, got {copies}")
    if copies > 1 and info.image_size == 0:
        more = " (MNIST-1D makes as many samples as asked: mnist1d-samples)" if name == "mnist1d" else ""
        raise ValueError(
            f"data-copies={copies} makes shifted copies of images, but dataset {name!r} has vectors; use "
            f"data-copies=1{more}"
        )
    if name == "synth-concept":
        x, y, source = synth_concept()
        return Centralized(x, y, info, source)
    if name == "mnist1d":
        x, y = make_mnist1d(samples)
    elif name == "digits":
        from sklearn.datasets import load_digits

        d = load_digits()
        x = (d.images.astype(np.float32) / 16.0)[:, None]
        y = d.target.astype(np.int64)
    elif data_dir and not Path(data_dir).exists():
        raise ValueError(f"data-dir {data_dir!r} does not exist (dataset {name!r})")
    elif (
        data_dir
        and not (Path(data_dir) / "dataset_dict.json").exists()
        and not (Path(data_dir) / "dataset_info.json").exists()
    ):
        if info.torchvision_name is None:
            raise ValueError(f"data-dir {data_dir!r} is not a Hugging Face save_to_disk folder")
        x, y = _load_torchvision(info, data_dir)
    else:
        x, y = _load_hf_dataset(info, data_dir)
    if copies > 1:
        rng = np.random.default_rng(NOISE_SEED + 2)
        extra = []
        for _ in range(copies - 1):
            dy, dx = rng.integers(-1, 2, size=2)
            jitter = np.roll(x, shift=(int(dy), int(dx)), axis=(2, 3))
            extra.append((jitter + rng.normal(0.0, 0.05, size=x.shape)).astype(np.float32))
        x, y = np.concatenate([x, *extra]), np.tile(y, copies)
    if noise_std > 0:
        rng = np.random.default_rng(NOISE_SEED)
        x = (x + rng.normal(0.0, noise_std, size=x.shape)).astype(np.float32)
    return Centralized(np.ascontiguousarray(x, dtype=np.float32), y, info, copies=copies)


def _readable_copy(data_dir: str) -> bool:
    return bool(data_dir) and (
        (Path(data_dir) / "dataset_dict.json").exists() or (Path(data_dir) / "dataset_info.json").exists()
    )


def labels_known(name: str, data_dir: str = "") -> bool:
    """Whether this process can read data set ``name``'s labels without a download: the embedded sets, and a local
    copy (``data-dir``) that exists here.  A data set from the Hugging Face hub is known to the clients only."""
    return name in OFFLINE or (bool(data_dir) and Path(data_dir).exists())


@functools.lru_cache(maxsize=4)
def load_labels(name: str, data_dir: str = "", copies: int = 1, samples: int = MNIST1D_SAMPLES) -> Centralized:
    """Data set ``name`` as a partition sees it: the labels (and PI-FL's sources) in :func:`load_centralized`'s order,
    with ``copies``, and samples without features (``x`` of shape (N, 0)); ``samples``: MNIST-1D's size.  A
    ``save_to_disk`` folder is read for its label column only; the sets made here and a torchvision root are loaded
    whole."""
    if name not in OFFLINE and _readable_copy(data_dir):
        y = _hf_labels(dataset_info(name), data_dir)
        return Centralized(
            np.zeros((len(y) * copies, 0), np.float32), np.tile(y, copies), dataset_info(name), None, copies
        )
    whole = load_centralized(name, data_dir, 0.0, copies, samples)
    return Centralized(np.zeros((len(whole.y), 0), np.float32), whole.y, whole.info, whole.source, whole.copies)

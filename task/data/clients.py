"""One client's data: the run's data settings, the client's train / validation / test splits, and the on-disk
cache that lets a fresh ClientApp process load them without rebuilding the partition.

In deployment every message starts a new ``flwr-clientapp`` process; building a partition imports
``datasets`` and ``flwr-datasets`` and reads the whole data set.  :func:`load_client_data` keeps each
client's splits in a small ``.npz`` under ``cache_dir`` (keyed by the data settings, the partition and the
source code of the data modules), so later processes only read that file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import os
import tempfile
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from task.data.catalogue import (
    DATASETS,
    DOMAINS,
    MIN_CLIENT_SAMPLES,
    MIXTURES,
    MNIST1D_SAMPLES,
    PARTITIONS,
    NoShare,
    dataset_info,
)
from task.data.domains import apply_domain, domain_of
from task.options import OptionSet, option


@dataclass(frozen=True)
class DataSettings(OptionSet):
    """Everything that decides a client's data (hashable: it keys the per-process cache); each field is a run-config
    key."""

    dataset: str = option("dataset", "digits", "the data set", choices=tuple(DATASETS))
    partition: str = option("partition", "dirichlet", "how the data is split over clients", choices=PARTITIONS)
    alpha: float = option(
        "alpha", 0.5, "Dirichlet concentration of labels (partitions 'dirichlet', 'quantity-dirichlet')", minimum=1e-9
    )
    size_sigma: float = option(
        "size-sigma",
        1.0,
        "quantity skew (partition 'quantity-dirichlet'): client sizes in proportion to lognormal(0, size-sigma) "
        f"draws, at least {MIN_CLIENT_SAMPLES} samples each (0: equal sizes)",
        minimum=0.0,
    )
    classes_per_client: int = option("classes-per-client", 2, "labels per client (partition 'pathological')", minimum=1)
    num_clusters: int = option("num-clusters", 5, "planted groups (partition 'planted-clusters*'; dialects)", minimum=1)
    mixture: str = option("mixture", "10:90", "two-source mixture (partition 'two-source')", choices=MIXTURES)
    feature_shift: int = option(
        "feature-shift",
        0,
        "feature-shift domains, one transform per client (0 = none)",
        minimum=0,
        maximum=len(DOMAINS),
    )
    test_fraction: float = option("test-fraction", 0.2, "each client's held-out test share", minimum=0.0, maximum=0.89)
    val_fraction: float = option("val-fraction", 0.1, "each client's validation share", minimum=0.0, maximum=0.89)
    noise_std: float = option("noise-std", 0.0, "fixed Gaussian pixel noise on the data", minimum=0.0)
    data_copies: int = option(
        "data-copies",
        1,
        "jittered copies of every training image (a copy trains where its original trains; held-out splits and "
        "the number of clients a data set fits are unchanged)",
        minimum=1,
    )
    train_samples: int = option(
        "train-samples",
        0,
        "cap on each client's training examples: a seeded subsample, stratified by label (0 = all); "
        "validation and test splits unchanged",
        minimum=0,
    )
    mnist1d_samples: int = option(
        "mnist1d-samples",
        MNIST1D_SAMPLES,
        "dataset 'mnist1d': how many signals to generate (a multiple of 10, as many of each digit), shared out over "
        "the clients",
        minimum=10,
    )
    data_dir: str = option("data-dir", "", "local copy of a real data set (empty: the Hugging Face hub)")
    seed: int = option("seed", 0, "seed of partitions, initial model and sampling", minimum=0)
    dialect_mix: float = option(
        "dialect-mix", 0.5, "dialects: share of dialect-specific transitions", minimum=0.0, maximum=1.0
    )
    dialect_sequences: int = option("dialect-sequences", 120, "dialects: lines per client", minimum=4)
    lm_pretrained: str = option("lm-pretrained", "", "dialects: a local GPT-2 folder (save_pretrained layout)")

    def __post_init__(self) -> None:
        dataset_info(self.dataset)
        if self.dataset == "dialects" and self.partition not in ("planted-clusters", "iid"):
            raise ValueError(
                f"dataset 'dialects' takes partition 'planted-clusters' (client i speaks dialect "
                f"i % num-clusters) or 'iid' (every client mixes all dialects), got {self.partition!r}"
            )
        if self.partition not in PARTITIONS:
            raise ValueError(
                f"unknown partition {self.partition!r} (run-config key 'partition'); allowed: {list(PARTITIONS)}"
            )
        if self.partition in ("dirichlet", "quantity-dirichlet") and not self.alpha > 0:
            raise ValueError(f"alpha must be > 0 for partition {self.partition!r}, got {self.alpha}")
        if not self.size_sigma >= 0:
            raise ValueError(f"size-sigma must be >= 0, got {self.size_sigma}")
        if self.partition == "two-source" and self.mixture not in MIXTURES:
            raise ValueError(f"unknown mixture {self.mixture!r} (run-config key 'mixture'); allowed: {list(MIXTURES)}")
        if not 0.0 <= self.test_fraction < 1.0 or not 0.0 <= self.val_fraction < 1.0:
            raise ValueError("test-fraction and val-fraction must be in [0, 1)")
        if self.test_fraction + self.val_fraction >= 0.9:
            raise ValueError("test-fraction + val-fraction must leave at least 10% for training")
        if self.train_samples < 0:
            raise ValueError(f"train-samples must be 0 (all) or a positive cap, got {self.train_samples}")
        if self.dataset == "mnist1d" and (self.mnist1d_samples < 10 or self.mnist1d_samples % 10):
            raise ValueError(
                f"mnist1d-samples must be a positive multiple of 10 (10 digits), got {self.mnist1d_samples}"
            )
        if not 0 <= self.feature_shift <= len(DOMAINS):
            raise ValueError(f"feature-shift must be 0 (off) or 1..{len(DOMAINS)} domains, got {self.feature_shift}")


@dataclass
class ClientData:
    """One client's splits as tensors (on CPU), and what describes them."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    domain: str = "original"
    meta: dict = field(default_factory=dict)
    #: goal data a method may fit choices on before testing (PI-FL's mixture weights); two-source partitions:
    #: half of the client's goal set, the other half being the test split every method is scored on
    x_calib: torch.Tensor | None = None
    y_calib: torch.Tensor | None = None

    def __post_init__(self) -> None:
        # One memory layout, whatever the source: a tensor built from a numpy array can carry any stride on a
        # dimension of size 1 (digits' single channel: (64, 1, 8, 1)), the same tensor loaded from the disk cache
        # has (64, 64, 8, 1), and PyTorch picks its convolution and BatchNorm kernels by layout, so a run whose
        # clients built their splits ended with other weights than the same run on cached splits.
        for name in _SPLITS:
            t = getattr(self, name)
            if t is not None and t.stride() != _row_major_strides(t.shape):
                setattr(self, name, t.clone(memory_format=torch.contiguous_format))

    @property
    def num_train(self) -> int:
        return len(self.y_train)

    def label_histogram(self) -> np.ndarray:
        return np.bincount(self.y_train.numpy(), minlength=self.num_classes)

    def scored_on_validation(self) -> ClientData:
        """The same client with its validation split in place of its test split, and the test split dropped: what
        a setting-selection run uses (run-config ``evaluate-split='validation'``), so that no code path of any
        method can reach the test split."""
        return dataclasses.replace(self, x_test=self.x_val, y_test=self.y_val)


def _row_major_strides(shape: torch.Size) -> tuple[int, ...]:
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def stratified_split(
    labels: np.ndarray, test_fraction: float, val_fraction: float, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Split positions 0..n-1 into (train, val, test) with every class in the same proportions.

    Each class contributes ``round(fraction * count)`` to test and val; the training split keeps at
    least one sample of the client's data.
    """
    train, val, test = [], [], []
    for c in np.unique(labels):
        idx = rng.permutation(np.flatnonzero(labels == c))
        n_test = round(test_fraction * len(idx))
        n_val = round(val_fraction * len(idx))
        if n_test + n_val >= len(idx) and len(idx) > 0:  # keep one for training
            n_val = max(0, len(idx) - 1 - n_test)
            n_test = min(n_test, len(idx) - 1)
        test.append(idx[:n_test])
        val.append(idx[n_test : n_test + n_val])
        train.append(idx[n_test + n_val :])

    def cat(parts):
        return np.sort(np.concatenate(parts)).astype(np.int64) if parts else np.zeros(0, np.int64)

    return cat(train), cat(val), cat(test)


def training_subsample(labels: np.ndarray, n: int, rng: np.random.Generator) -> np.ndarray:
    """Positions (sorted) of ``n`` of the training samples with ``labels``, stratified by label.

    The samples are put in an order in which every prefix holds each label within one sample of its share (the
    order of Tijdeman's "chairman assignment", 1980: at step t take, among the labels at least 1 - c behind their
    share t * p, the one whose next turn is due first, (taken + c) / p, with c = 1 - 1 / (2 (k - 1)) for k labels;
    every label then stays within 1 - 1 / (2 (k - 1)) of its share), a seeded random sample of that label each
    time; the subsample is the first ``n``.  So the subsample of 25 is part of the subsample of 50 (a
    samples-per-client axis changes only how much data a client has).  ``n`` = 0 or ``n`` >= len(labels): every
    position.
    """
    labels = np.asarray(labels)
    if n <= 0 or n >= len(labels):
        return np.arange(len(labels), dtype=np.int64)
    classes, counts = np.unique(labels, return_counts=True)
    queues = [rng.permutation(np.flatnonzero(labels == c)) for c in classes]
    if len(classes) == 1:
        return np.sort(queues[0][:n])
    order = rng.permutation(len(classes))  # ties between labels due at the same time: a seeded order
    share = counts[order] / counts.sum()
    c = 1.0 - 1.0 / (2 * (len(classes) - 1))
    taken = np.zeros(len(classes), dtype=np.int64)
    chosen = []
    for step in range(1, n + 1):
        due = np.where(share * step - taken >= 1.0 - c - 1e-12, (taken + c) / share, np.inf)
        k = int(np.argmin(due))
        chosen.append(queues[order[k]][taken[k]])
        taken[k] += 1
    return np.sort(np.asarray(chosen, dtype=np.int64))


def subsample_rng(settings: DataSettings, partition_id: int) -> np.random.Generator:
    """The training cap's own random stream: the validation and test splits do not depend on ``train-samples``."""
    return np.random.default_rng([settings.seed, partition_id, 1])


def partition_indices(settings: DataSettings, partition_id: int, num_partitions: int) -> np.ndarray:
    """Indices (into the centralised data set) of client ``partition_id``'s data."""
    from task.data.partitioners import partitioner_for

    part, _ = partitioner_for(settings, num_partitions)
    return np.asarray(part.load_partition(partition_id)["idx"], dtype=np.int64)


# ---------------------------------------------------------------------------------------------- the disk cache
_SPLITS = ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test", "x_calib", "y_calib")


@functools.lru_cache(maxsize=1)
def _code_version() -> str:
    """Hash of the modules that decide a client's data: a change to any of them invalidates the cache."""
    here = Path(__file__).resolve().parent
    h = hashlib.sha256()
    for f in sorted([*here.glob("*.py"), here.parent / "text.py"]):
        h.update(f.name.encode() + f.read_bytes())
    return h.hexdigest()[:16]


def cache_root() -> Path:
    """``$PFLOWER_CACHE_DIR`` (default ``~/.cache/pflower``): where this machine keeps what a run can rebuild."""
    return Path(os.environ.get("PFLOWER_CACHE_DIR", "~/.cache/pflower")).expanduser()


def default_cache_dir() -> Path:
    """Where clients keep their splits: ``$PFLOWER_CACHE_DIR/partitions`` (default ``~/.cache/pflower``)."""
    return cache_root() / "partitions"


def cache_file(settings: DataSettings, partition_id: int, num_partitions: int, cache_dir: str | Path) -> Path:
    key = hashlib.sha256(f"{settings!r}|{partition_id}/{num_partitions}|{_code_version()}".encode()).hexdigest()
    return Path(cache_dir).expanduser() / f"{settings.dataset}-{partition_id}-of-{num_partitions}-{key[:20]}.npz"


def _save(data: ClientData, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    arrays = {k: getattr(data, k).numpy() for k in _SPLITS if getattr(data, k) is not None}
    info = json.dumps({"num_classes": data.num_classes, "domain": data.domain, "meta": data.meta})
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, suffix=".tmp.npz")
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        np.savez(tmp_name, info=np.frombuffer(info.encode(), dtype=np.uint8), **arrays)
        tmp.replace(path)  # atomic: another process never sees half a file
    finally:
        tmp.unlink(missing_ok=True)


def _load(path: Path) -> ClientData | None:
    try:
        with np.load(path, allow_pickle=False) as z:
            info = json.loads(z["info"].tobytes().decode())
            splits = {k: torch.from_numpy(z[k]) for k in _SPLITS[:6]}  # a file without one is damaged
            calib = {k: torch.from_numpy(z[k]) if k in z.files else None for k in _SPLITS[6:]}
    # a damaged cache file (not a zip, truncated, splits or header missing) is rebuilt, never trusted
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    return ClientData(
        **splits,
        num_classes=info["num_classes"],
        domain=info["domain"],
        meta=info["meta"],
        x_calib=calib["x_calib"],
        y_calib=calib["y_calib"],
    )


# ---------------------------------------------------------------------------------------------- a client's splits
@functools.lru_cache(maxsize=64)
def load_client_data(
    settings: DataSettings, partition_id: int, num_partitions: int, cache_dir: str | None = None
) -> ClientData:
    """Client ``partition_id``'s train / validation / test splits (cached per process, and on disk under
    ``cache_dir`` when given).

    Splits are stratified by label and seeded by (seed, partition_id).  With a two-source partition the
    test split is the client's goal mixture from a separate pool.  With ``feature_shift`` the client's
    domain transform is applied to all of its splits.
    """
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id {partition_id} out of range for num-partitions={num_partitions}")
    path = cache_file(settings, partition_id, num_partitions, cache_dir) if cache_dir else None
    if path is not None and path.is_file() and (cached := _load(path)) is not None:
        return cached
    data = _build_client_data(settings, partition_id, num_partitions)
    if path is not None:
        with contextlib.suppress(OSError):  # a read-only or full disk only costs the cache
            _save(data, path)
    return data


@dataclass(frozen=True)
class SplitIndices:
    """Where a client's splits come from: indices into the run's whole data set (:class:`Centralized`), the
    training split with the jittered copies of its originals (``data-copies``), the held-out ones originals only."""

    train: np.ndarray
    val: np.ndarray
    test: np.ndarray
    calib: np.ndarray | None = None


def split_indices(settings: DataSettings, partition_id: int, num_partitions: int) -> SplitIndices:
    """Client ``partition_id``'s train / validation / test (and calibration) indices into the whole data set.

    The partitioner shares out originals; the client's originals are split (stratified by label, seeded by
    (seed, partition id)), and only then does the training split take the copies of its own originals, so a copy
    never stands in, or beside, a held-out split (the training cap ``train-samples`` picks from originals and
    copies alike).  With a two-source partition the test split is half of the client's goal mixture from a
    separate pool, the other half its calibration split."""
    from task.data.partitioners import partitioner_for

    part, data = partitioner_for(settings, num_partitions)
    idx = np.asarray(part.load_partition(partition_id)["idx"], dtype=np.int64)
    return splits_of(settings, part, data, partition_id, num_partitions, idx)


def splits_of(
    settings: DataSettings, part: Any, data: Any, partition_id: int, num_partitions: int, idx: np.ndarray
) -> SplitIndices:
    """:func:`split_indices` of client ``partition_id`` whose share of the partition ``part`` (over ``data``, a
    :class:`~task.data.sources.Centralized`) is ``idx``: the one place a client's splits are made, for the client
    itself and for the check of every client before a run (:mod:`task.data.capacity`)."""
    from task.data.partitioners import TwoSourcePartitioner

    if len(idx) < 2:
        raise NoShare(
            f"partition {partition_id} of {num_partitions} got {len(idx)} samples; use fewer clients or a larger alpha",
            "some client would get fewer than 2 samples",
        )
    rng = np.random.default_rng([settings.seed, partition_id])
    labels = data.y[idx]
    calib = None
    if isinstance(part, TwoSourcePartitioner):
        tr, va, _ = stratified_split(labels, 0.0, settings.val_fraction, rng)
        goal = part.goal_indices(partition_id)
        # half of the goal set (by source) for calibration, the other half held out: every method is scored on
        # the same held-out half, PI-FL fits its mixture weights on the calibration half only
        src = part.source_of_labels(data.y, data.info.num_classes)[goal]
        calib_pos, _, test_pos = stratified_split(src, 0.5, 0.0, rng)
        calib, test = goal[calib_pos], goal[test_pos]
    else:
        tr, va, te = stratified_split(labels, settings.test_fraction, settings.val_fraction, rng)
        test = idx[te]
    train = data.with_copies(idx[tr])
    train = train[training_subsample(data.y[train], settings.train_samples, subsample_rng(settings, partition_id))]
    return SplitIndices(train, idx[va], test, calib)


def _build_client_data(settings: DataSettings, partition_id: int, num_partitions: int) -> ClientData:
    if settings.dataset == "dialects":
        return _dialect_client(settings, partition_id, num_partitions)
    from task.data.partitioners import PlantedClusterPartitioner, TwoSourcePartitioner, partitioner_for

    part, data = partitioner_for(settings, num_partitions)
    where = split_indices(settings, partition_id, num_partitions)
    domain = domain_of(partition_id, settings.feature_shift) if settings.feature_shift else "original"

    def tensors(sel: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        x = apply_domain(data.x[sel], domain, seed=partition_id)
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)), torch.from_numpy(data.y[sel])

    x_tr, y_tr = tensors(where.train)
    x_va, y_va = tensors(where.val)
    x_te, y_te = tensors(where.test)
    x_ca, y_ca = tensors(where.calib) if where.calib is not None else (None, None)
    meta: dict[str, int | float] = {"num-partitions": num_partitions, "partition-id": partition_id}
    if isinstance(part, PlantedClusterPartitioner):
        meta["planted-cluster"] = part.cluster_of(partition_id)
    if isinstance(part, TwoSourcePartitioner):
        meta["source-a-share"] = float(part.shares[partition_id])
    return ClientData(x_tr, y_tr, x_va, y_va, x_te, y_te, data.info.num_classes, domain, meta, x_ca, y_ca)


def _dialect_client(settings: DataSettings, partition_id: int, num_partitions: int) -> ClientData:
    """One client of the synthetic-dialect next-word task: x = tokens[:-1], y = tokens[1:] per line."""
    from task.text import MAX_DIALECTS, client_tokens, vocab_size

    if not 1 <= settings.num_clusters <= MAX_DIALECTS:
        raise ValueError(
            f"num-clusters (the number of dialects) must be in 1..{MAX_DIALECTS}, got {settings.num_clusters}"
        )
    tokens, dialect = client_tokens(
        partition_id,
        settings.num_clusters,
        settings.dialect_sequences,
        settings.dialect_mix,
        settings.seed,
        settings.lm_pretrained,
        iid=settings.partition == "iid",
    )
    rng = np.random.default_rng([settings.seed, partition_id])
    order = rng.permutation(len(tokens))
    n_test = round(settings.test_fraction * len(tokens))
    n_val = round(settings.val_fraction * len(tokens))
    train = order[n_test + n_val :]
    train = train[
        training_subsample(np.zeros(len(train)), settings.train_samples, subsample_rng(settings, partition_id))
    ]
    parts = train, order[n_test : n_test + n_val], order[:n_test]
    t = torch.from_numpy(tokens)
    (x_tr, y_tr), (x_va, y_va), (x_te, y_te) = ((t[np.sort(p), :-1], t[np.sort(p), 1:]) for p in parts)
    meta = {"num-partitions": num_partitions, "partition-id": partition_id, "dialect": dialect}
    if dialect >= 0:
        meta["planted-cluster"] = dialect
    return ClientData(x_tr, y_tr, x_va, y_va, x_te, y_te, vocab_size(settings.lm_pretrained), "original", meta)

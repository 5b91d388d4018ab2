"""Data sets, partitioners and per-client splits.

Everything is offline by default: the embedded data set is scikit-learn's bundled handwritten digits
(1,797 real 8x8 images).  Real data sets go through Hugging Face ``datasets`` (or torchvision) and also
read a local copy (``data-dir``: a folder written by ``Dataset.save_to_disk`` or a torchvision root).

Label-skew partitioners reuse flwr-datasets (IID, Dirichlet, pathological); what it lacks (planted
clusters as in pFedLIA, two-source mixtures as in PI-FL) is written here in its ``Partitioner``
interface.  Partitioners work on a light index table (columns ``idx`` and ``label``) so that images stay
in one numpy array.  Feature-shift domains (one visual transform per client) are applied on top of any
label partition.
"""

from __future__ import annotations

import functools
import logging
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from datasets import Dataset
from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner, PathologicalPartitioner, Partitioner

log = logging.getLogger(__name__)

# Fixed seed of the pixel noise added by ``noise-std`` (spec fedcac §8: "its own fixed seed"), so the
# noisy data set is the same whatever the run's seed.
NOISE_SEED = 7_777


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    in_channels: int
    image_size: int  # 0 = vector data of dimension in_channels
    num_classes: int
    hf_id: str | None = None
    hf_config: str | None = None
    image_column: str = "image"
    label_column: str = "label"
    torchvision_name: str | None = None
    torchvision_kwargs: tuple = ()


DATASETS: dict[str, DatasetInfo] = {
    "digits": DatasetInfo("digits", 1, 8, 10),
    "mnist": DatasetInfo("mnist", 1, 28, 10, "ylecun/mnist", torchvision_name="MNIST"),
    "fashion-mnist": DatasetInfo(
        "fashion-mnist", 1, 28, 10, "zalando-datasets/fashion_mnist", torchvision_name="FashionMNIST"
    ),
    "cifar10": DatasetInfo("cifar10", 3, 32, 10, "uoft-cs/cifar10", image_column="img", torchvision_name="CIFAR10"),
    "cifar100": DatasetInfo(
        "cifar100", 3, 32, 100, "uoft-cs/cifar100", image_column="img", label_column="fine_label",
        torchvision_name="CIFAR100",
    ),
    "emnist": DatasetInfo(
        "emnist", 1, 28, 62, None, torchvision_name="EMNIST", torchvision_kwargs=(("split", "byclass"),)
    ),
    "svhn": DatasetInfo("svhn", 3, 32, 10, "ufldl-stanford/svhn", "cropped_digits", torchvision_name="SVHN"),
    "usps": DatasetInfo("usps", 1, 16, 10, "flwrlabs/usps", torchvision_name="USPS"),
    "synth-concept": DatasetInfo("synth-concept", 10, 0, 2),
    # next-word prediction on synthetic dialects (task/text.py): in_channels = sequence length,
    # num_classes = vocabulary size of the built-in tokenizer (a pretrained tokenizer changes it)
    "dialects": DatasetInfo("dialects", 16, 0, 247),
}
SYNTH_CONCEPT_SIZE = 6000


def synth_concept(num_samples: int = SYNTH_CONCEPT_SIZE, dim: int = 10, classes: int = 2, sources: int = 2,
                  seed: int = 4_242) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """PI-FL spec §4 "SynthConcept": x ~ N(0, I) in R^dim, source s labels it ``argmax(x W_s + eps)`` with
    W_s entries N(0, 10) and eps ~ N(0, 1): the sources share the input distribution but conflict on
    labels.  Returns (x, y, source); every sample's source is fixed (half A, half B)."""
    rng = np.random.default_rng(seed)
    weights = rng.normal(0.0, np.sqrt(10.0), size=(sources, dim, classes))
    x = rng.normal(size=(num_samples, dim)).astype(np.float32)
    source = np.arange(num_samples) % sources
    logits = np.einsum("nd,ndc->nc", x, weights[source]) + rng.normal(size=(num_samples, classes))
    return x, logits.argmax(1).astype(np.int64), source.astype(np.int64)

PARTITIONS = ("iid", "dirichlet", "pathological", "planted-clusters", "planted-clusters-noisy", "two-source")
MIXTURES = ("10:90", "30:70", "linear", "random")
DOMAINS = ("original", "inverted", "rotated", "noisy", "shifted", "thickened", "blurred")


# --------------------------------------------------------------------------------------------------
# Centralised data sets
# --------------------------------------------------------------------------------------------------
@dataclass
class Centralized:
    """A whole data set in memory: images ``x`` (N, C, H, W) float32 in [0, 1], labels ``y`` (N,) int64."""

    x: np.ndarray
    y: np.ndarray
    info: DatasetInfo
    source: np.ndarray | None = None  # concept-shift data: which source labelled each sample


def dataset_info(name: str) -> DatasetInfo:
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r} (run-config key 'dataset'); allowed: {sorted(DATASETS)}")
    return DATASETS[name]


def _images_to_array(images: list, channels: int) -> np.ndarray:
    arr = np.stack([np.asarray(img, dtype=np.float32) for img in images])
    if arr.ndim == 3:  # (N, H, W) grey
        arr = arr[:, None]
    else:  # (N, H, W, C)
        arr = arr.transpose(0, 3, 1, 2)
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


def _load_torchvision(info: DatasetInfo, root: str) -> tuple[np.ndarray, np.ndarray]:
    import torchvision

    cls = getattr(torchvision.datasets, info.torchvision_name)
    xs, ys = [], []
    kwargs = dict(info.torchvision_kwargs)
    for split in ({"split": "train"}, {"split": "test"}) if info.name == "svhn" else ({"train": True}, {"train": False}):
        ds = cls(root=root, download=False, **kwargs, **split)
        xs.append(_images_to_array([ds[i][0] for i in range(len(ds))], info.in_channels))
        ys.append(np.asarray([int(ds[i][1]) for i in range(len(ds))], dtype=np.int64))
    return np.concatenate(xs), np.concatenate(ys)


@functools.lru_cache(maxsize=4)
def load_centralized(name: str, data_dir: str = "", noise_std: float = 0.0, copies: int = 1) -> Centralized:
    """Load data set ``name`` whole (cached per process).

    ``noise_std`` > 0 adds fixed Gaussian pixel noise (its own seed): clean digits are too easy to tell
    methods apart (spec fedcac §8 uses 0.7).  ``copies`` > 1 appends jittered copies of the data (each
    shifted by up to one pixel, with light noise; fixed seed), so that many clients (scale runs with
    1,000 clients) still get a few samples each from the small embedded data set.
    """
    info = dataset_info(name)
    if noise_std < 0:
        raise ValueError(f"noise-std must be >= 0, got {noise_std}")
    if copies < 1:
        raise ValueError(f"data-copies must be >= 1, got {copies}")
    if name == "synth-concept":
        x, y, source = synth_concept()
        return Centralized(x, y, info, source)
    if name == "digits":
        from sklearn.datasets import load_digits

        d = load_digits()
        x = (d.images.astype(np.float32) / 16.0)[:, None]
        y = d.target.astype(np.int64)
    elif data_dir and not Path(data_dir).exists():
        raise ValueError(f"data-dir {data_dir!r} does not exist (dataset {name!r})")
    elif data_dir and not (Path(data_dir) / "dataset_dict.json").exists() and not (
        Path(data_dir) / "dataset_info.json"
    ).exists():
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
    return Centralized(np.ascontiguousarray(x, dtype=np.float32), y, info)


# --------------------------------------------------------------------------------------------------
# Partitioners (flwr-datasets interface)
# --------------------------------------------------------------------------------------------------
def index_table(labels: np.ndarray) -> Dataset:
    """The light table partitioners work on: one row per sample, columns ``idx`` and ``label``."""
    return Dataset.from_dict({"idx": np.arange(len(labels)), "label": labels.astype(np.int64)})


class _IndexPartitioner(Partitioner):
    """Partitioner that computes all partitions as index arrays once, on first use."""

    def __init__(self, num_partitions: int, seed: int) -> None:
        super().__init__()
        if num_partitions < 1:
            raise ValueError(f"num-partitions must be >= 1, got {num_partitions}")
        self._num_partitions = num_partitions
        self._seed = seed
        self._indices: list[np.ndarray] | None = None

    @property
    def num_partitions(self) -> int:
        return self._num_partitions

    def _compute(self) -> list[np.ndarray]:  # pragma: no cover - abstract
        raise NotImplementedError

    def partition_indices(self) -> list[np.ndarray]:
        if self._indices is None:
            self._indices = self._compute()
        return self._indices

    def load_partition(self, partition_id: int) -> Dataset:
        if not 0 <= partition_id < self._num_partitions:
            raise ValueError(f"partition-id {partition_id} out of range [0, {self._num_partitions})")
        return self.dataset.select(self.partition_indices()[partition_id].tolist())


class PlantedClusterPartitioner(_IndexPartitioner):
    """pFedLIA's planted clusters (spec pfedlia §4): every label belongs to exactly one of ``num_clusters``.

    Client ``i`` is in cluster ``i % num_clusters``.  Each label's samples are cut into equal, disjoint
    shards, one for each client of its cluster.  ``noisy=True``: each client with probability 0.5 also
    borrows one random label from outside its cluster; extra labels are drawn first and each label is then
    cut into ``owners + borrowers`` equal shards (spec's decision), so shards stay equal and disjoint.
    """

    def __init__(self, num_partitions: int, num_clusters: int = 5, noisy: bool = False, seed: int = 0) -> None:
        super().__init__(num_partitions, seed)
        if num_clusters < 1 or num_clusters > num_partitions:
            raise ValueError(
                f"num-clusters must be in [1, num-partitions={num_partitions}], got {num_clusters}"
            )
        self.num_clusters = num_clusters
        self.noisy = noisy
        self.extra_labels: dict[int, int] = {}

    def cluster_of(self, partition_id: int) -> int:
        return partition_id % self.num_clusters

    def ground_truth(self) -> np.ndarray:
        """The planted cluster of every client (for the Oracle baseline and the ARI)."""
        return np.arange(self._num_partitions) % self.num_clusters

    def labels_of_cluster(self, cluster: int, num_classes: int) -> np.ndarray:
        return np.array_split(np.arange(num_classes), self.num_clusters)[cluster]

    def _compute(self) -> list[np.ndarray]:
        labels = np.asarray(self.dataset["label"])
        classes = np.unique(labels)
        num_classes = int(classes.max()) + 1
        if num_classes < self.num_clusters:
            raise ValueError(f"num-clusters={self.num_clusters} exceeds the number of labels {num_classes}")
        rng = np.random.default_rng(self._seed)
        holders: dict[int, list[int]] = {int(c): [] for c in range(num_classes)}
        for pid in range(self._num_partitions):
            for c in self.labels_of_cluster(self.cluster_of(pid), num_classes):
                holders[int(c)].append(pid)
        if self.noisy:
            for pid in range(self._num_partitions):
                if rng.random() < 0.5:
                    own = set(self.labels_of_cluster(self.cluster_of(pid), num_classes).tolist())
                    extra = int(rng.choice([c for c in range(num_classes) if c not in own]))
                    self.extra_labels[pid] = extra
                    holders[extra].append(pid)
        parts: list[list[np.ndarray]] = [[] for _ in range(self._num_partitions)]
        for c, pids in holders.items():
            if not pids:
                continue
            idx = rng.permutation(np.flatnonzero(labels == c))
            if len(idx) < len(pids):
                raise ValueError(f"label {c} has {len(idx)} samples for {len(pids)} clients: too many clients")
            shard = len(idx) // len(pids)
            for k, pid in enumerate(pids):
                parts[pid].append(idx[k * shard : (k + 1) * shard])
        return [np.sort(np.concatenate(p)) for p in parts]


def source_shares(mixture: str, num_partitions: int, seed: int) -> np.ndarray:
    """Share ``p_i`` of source A in client ``i``'s training data (spec pifl §4).

    ``10:90``: 0.9 for the first half of the clients, 0.1 for the second; ``30:70``: 0.7 / 0.3;
    ``linear``: (i + 0.5) / N; ``random``: Uniform(0, 1) (seeded).
    """
    n = num_partitions
    if mixture == "10:90":
        return np.where(np.arange(n) < n // 2, 0.9, 0.1)
    if mixture == "30:70":
        return np.where(np.arange(n) < n // 2, 0.7, 0.3)
    if mixture == "linear":
        return (np.arange(n) + 0.5) / n
    if mixture == "random":
        return np.random.default_rng(seed).uniform(0.0, 1.0, size=n)
    raise ValueError(f"unknown mixture {mixture!r} (run-config key 'mixture'); allowed: {list(MIXTURES)}")


class TwoSourcePartitioner(_IndexPartitioner):
    """PI-FL's two-source mixtures (spec pifl §4) over label-defined sources.

    Source A is the first half of the labels, source B the second (the spec's resolution for CIFAR-10:
    classes 0-4 vs 5-9).  The data set is first cut into a training pool and a goal pool
    (``goal_fraction``); client ``i`` trains on a mixture with share ``p_i`` of A and is tested on its
    "goal" mixture ``q_i`` = ``1 - p_i`` (``goal='inverted'``, images) or ``p_i`` (``goal='same'``).
    Every client gets the same number of training samples, the largest that keeps the training partitions
    disjoint.  Goal data is only ever evaluated on, never trained on: each client's goal set holds
    ``goal_size`` samples (fewer where the pool cannot supply its mixture) drawn from the whole goal pool, so
    goal sets of different clients may share samples, and each is large enough that an accuracy difference
    between methods is many samples, not a handful (spec pifl §4 leaves the test-set size open).
    """

    def __init__(
        self, num_partitions: int, mixture: str = "10:90", goal: str = "inverted", goal_fraction: float = 0.25,
        seed: int = 0, goal_size: int = 200,
    ) -> None:
        super().__init__(num_partitions, seed)
        if goal not in ("inverted", "same"):
            raise ValueError(f"goal must be 'inverted' or 'same', got {goal!r}")
        if not 0.0 < goal_fraction < 1.0:
            raise ValueError(f"goal-fraction must be in (0, 1), got {goal_fraction}")
        self.shares = source_shares(mixture, num_partitions, seed)
        self.goal_shares = 1.0 - self.shares if goal == "inverted" else self.shares
        self.goal_fraction = goal_fraction
        self.goal_size = int(goal_size)
        self._goal_indices: list[np.ndarray] | None = None

    sources: np.ndarray | None = None  # set for concept-shift data, where the source is not the label

    def source_of_labels(self, labels: np.ndarray, num_classes: int) -> np.ndarray:
        """0 for source A, 1 for source B: the first / second half of the labels, or the data's own sources."""
        if self.sources is not None:
            return self.sources
        return (labels >= (num_classes + 1) // 2).astype(np.int64)

    @staticmethod
    def _allocate(pools: list[np.ndarray], shares_a: np.ndarray) -> list[np.ndarray]:
        demand_a, demand_b = shares_a.sum(), (1.0 - shares_a).sum()
        per_client = int(min(len(pools[0]) / max(demand_a, 1e-9), len(pools[1]) / max(demand_b, 1e-9)))
        if per_client < 2:
            raise ValueError(
                f"too many clients ({len(shares_a)}) for the data set: fewer than 2 samples each"
            )
        out, pos = [], [0, 0]
        for p in shares_a:
            n_a = int(round(p * per_client))
            counts = (n_a, per_client - n_a)
            part = []
            for s in (0, 1):
                part.append(pools[s][pos[s] : pos[s] + counts[s]])
                pos[s] += counts[s]
            out.append(np.sort(np.concatenate(part)))
        return out

    def _compute(self) -> list[np.ndarray]:
        labels = np.asarray(self.dataset["label"])
        num_classes = int(labels.max()) + 1
        rng = np.random.default_rng(self._seed)
        perm = rng.permutation(len(labels))
        n_goal = int(len(labels) * self.goal_fraction)
        goal_pool, train_pool = perm[:n_goal], perm[n_goal:]
        src = self.source_of_labels(labels, num_classes)
        train = self._allocate([train_pool[src[train_pool] == s] for s in (0, 1)], self.shares)
        self._goal_indices = self._goal_sets([np.sort(goal_pool[src[goal_pool] == s]) for s in (0, 1)])
        return train

    def _goal_sets(self, pools: list[np.ndarray]) -> list[np.ndarray]:
        """Client i's goal set: ``goal_size`` samples with share ``q_i`` of source A, drawn (seeded by the
        client) from the whole goal pool; capped so that every client's mixture can be met."""
        q = self.goal_shares
        size = self.goal_size
        if q.max() > 0:
            size = min(size, int(len(pools[0]) / q.max()))
        if (1 - q).max() > 0:
            size = min(size, int(len(pools[1]) / (1 - q).max()))
        if size < 2:
            raise ValueError("the goal pool is too small for the clients' goal mixtures")
        out = []
        for i, share in enumerate(q):
            rng = np.random.default_rng([self._seed, i, 7_919])
            n_a = int(round(share * size))
            out.append(np.sort(np.concatenate([rng.choice(pools[0], n_a, replace=False),
                                               rng.choice(pools[1], size - n_a, replace=False)])))
        return out

    def load_goal_partition(self, partition_id: int) -> Dataset:
        """Client ``partition_id``'s test ("goal") data, drawn from the goal pool with mixture ``q_i``."""
        self.partition_indices()
        assert self._goal_indices is not None
        return self.dataset.select(self._goal_indices[partition_id].tolist())


def build_partitioner(
    partition: str, num_partitions: int, *, alpha: float = 0.5, classes_per_client: int = 2,
    num_clusters: int = 5, mixture: str = "10:90", seed: int = 0, goal: str = "inverted",
) -> Partitioner:
    """The partitioner named by run-config ``partition`` with its parameters (validated)."""
    if num_partitions < 1:
        raise ValueError(f"num-partitions must be >= 1, got {num_partitions}")
    if partition == "iid":
        return IidPartitioner(num_partitions)
    if partition == "dirichlet":
        if not alpha > 0:
            raise ValueError(f"alpha must be > 0 for partition 'dirichlet', got {alpha}")
        return _SeededDirichlet(num_partitions, alpha, seed)
    if partition == "pathological":
        if classes_per_client < 1:
            raise ValueError(f"classes-per-client must be >= 1, got {classes_per_client}")
        return PathologicalPartitioner(
            num_partitions, partition_by="label", num_classes_per_partition=classes_per_client,
            class_assignment_mode="first-deterministic", seed=seed,
        )
    if partition in ("planted-clusters", "planted-clusters-noisy"):
        return PlantedClusterPartitioner(
            num_partitions, num_clusters, noisy=partition.endswith("noisy"), seed=seed
        )
    if partition == "two-source":
        return TwoSourcePartitioner(num_partitions, mixture, goal=goal, seed=seed)
    raise ValueError(f"unknown partition {partition!r} (run-config key 'partition'); allowed: {list(PARTITIONS)}")


class _SeededDirichlet(DirichletPartitioner):
    """flwr-datasets' Dirichlet partitioner with a minimum size that scales down for many small clients."""

    def __init__(self, num_partitions: int, alpha: float, seed: int) -> None:
        self._min_size_wanted = 10
        super().__init__(
            num_partitions, partition_by="label", alpha=alpha, min_partition_size=0, self_balancing=False,
            shuffle=True, seed=seed,
        )

    @Partitioner.dataset.setter  # type: ignore[attr-defined]
    def dataset(self, value: Dataset) -> None:
        Partitioner.dataset.fset(self, value)  # type: ignore[attr-defined]
        per_client = len(value) // self._num_partitions
        self._min_partition_size = max(2, min(self._min_size_wanted, per_client // 8))

    def _determine_partition_id_to_indices_if_needed(self) -> None:
        """As flwr-datasets does, but halve the minimum size when 10 draws cannot meet it (strong skew,
        e.g. alpha 0.1 over 40 clients of the digits set), down to 1 sample, instead of failing the run."""
        while True:
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", UserWarning)
                    return super()._determine_partition_id_to_indices_if_needed()
            except ValueError as err:
                if "max number of attempts" not in str(err) or self._min_partition_size <= 1:
                    raise
                self._min_partition_size //= 2
                log.info("Dirichlet partition: lowering the minimum client size to %d", self._min_partition_size)


# --------------------------------------------------------------------------------------------------
# Feature-shift domains
# --------------------------------------------------------------------------------------------------
def apply_domain(x: np.ndarray, domain: str, seed: int = 0) -> np.ndarray:
    """One visual transform of a batch of images (N, C, H, W) in [0, 1], standing in for Digit-5 domains."""
    if domain == "original":
        return x
    if domain == "inverted":
        return 1.0 - x
    if domain == "rotated":
        return np.ascontiguousarray(np.rot90(x, k=1, axes=(2, 3)))
    if domain == "noisy":
        return (x + np.random.default_rng(NOISE_SEED + 1 + seed).normal(0, 0.3, x.shape)).astype(np.float32)
    if domain == "shifted":
        return np.roll(x, shift=(1, 1), axis=(2, 3))
    if domain == "thickened":
        t = torch.from_numpy(np.ascontiguousarray(x))
        return torch.nn.functional.max_pool2d(t, 3, stride=1, padding=1).numpy()
    if domain == "blurred":
        t = torch.from_numpy(np.ascontiguousarray(x))
        return torch.nn.functional.avg_pool2d(t, 3, stride=1, padding=1, count_include_pad=False).numpy()
    raise ValueError(f"unknown domain {domain!r}; allowed: {list(DOMAINS)}")


def domain_of(partition_id: int, num_domains: int) -> str:
    if not 1 <= num_domains <= len(DOMAINS):
        raise ValueError(f"feature-shift must be between 1 and {len(DOMAINS)} domains, got {num_domains}")
    return DOMAINS[partition_id % num_domains]


# --------------------------------------------------------------------------------------------------
# Per-client data
# --------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class DataSettings:
    """Everything that decides a client's data (hashable: it keys the per-process cache)."""

    dataset: str = "digits"
    partition: str = "dirichlet"
    alpha: float = 0.5
    classes_per_client: int = 2
    num_clusters: int = 5
    mixture: str = "10:90"
    feature_shift: int = 0  # number of domains, 0 = none
    test_fraction: float = 0.2
    val_fraction: float = 0.1
    noise_std: float = 0.0
    data_copies: int = 1
    data_dir: str = ""
    seed: int = 0
    dialect_mix: float = 0.5
    dialect_sequences: int = 120
    lm_pretrained: str = ""

    def __post_init__(self) -> None:
        dataset_info(self.dataset)
        if self.dataset == "dialects" and self.partition not in ("planted-clusters", "iid"):
            raise ValueError(f"dataset 'dialects' takes partition 'planted-clusters' (client i speaks dialect "
                             f"i % num-clusters) or 'iid' (every client mixes all dialects), got {self.partition!r}")
        if self.partition not in PARTITIONS:
            raise ValueError(
                f"unknown partition {self.partition!r} (run-config key 'partition'); allowed: {list(PARTITIONS)}"
            )
        if self.partition == "dirichlet" and not self.alpha > 0:
            raise ValueError(f"alpha must be > 0 for partition 'dirichlet', got {self.alpha}")
        if self.partition == "two-source" and self.mixture not in MIXTURES:
            raise ValueError(f"unknown mixture {self.mixture!r} (run-config key 'mixture'); allowed: {list(MIXTURES)}")
        if not 0.0 <= self.test_fraction < 1.0 or not 0.0 <= self.val_fraction < 1.0:
            raise ValueError("test-fraction and val-fraction must be in [0, 1)")
        if self.test_fraction + self.val_fraction >= 0.9:
            raise ValueError("test-fraction + val-fraction must leave at least 10% for training")
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

    @property
    def num_train(self) -> int:
        return len(self.y_train)

    def label_histogram(self) -> np.ndarray:
        return np.bincount(self.y_train.numpy(), minlength=self.num_classes)


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
        n_test = int(round(test_fraction * len(idx)))
        n_val = int(round(val_fraction * len(idx)))
        if n_test + n_val >= len(idx) and len(idx) > 0:  # keep one for training
            n_val = max(0, len(idx) - 1 - n_test)
            n_test = min(n_test, len(idx) - 1)
        test.append(idx[:n_test])
        val.append(idx[n_test : n_test + n_val])
        train.append(idx[n_test + n_val :])
    cat = lambda parts: np.sort(np.concatenate(parts)).astype(np.int64) if parts else np.zeros(0, np.int64)  # noqa: E731
    return cat(train), cat(val), cat(test)


@functools.lru_cache(maxsize=8)
def _partitioner(settings: DataSettings, num_partitions: int) -> tuple[Partitioner, Centralized]:
    data = load_centralized(settings.dataset, settings.data_dir, settings.noise_std, settings.data_copies)
    if len(data.y) < 2 * num_partitions:
        raise ValueError(
            f"num-partitions={num_partitions} is too many for dataset {settings.dataset!r} with {len(data.y)} "
            f"samples: every client needs at least 2 (use at most {len(data.y) // 2} clients)"
        )
    part = build_partitioner(
        settings.partition, num_partitions, alpha=settings.alpha, classes_per_client=settings.classes_per_client,
        num_clusters=settings.num_clusters, mixture=settings.mixture, seed=settings.seed,
        goal="same" if data.source is not None else "inverted",  # spec pifl §4: synthetic goal = training mix
    )
    if isinstance(part, TwoSourcePartitioner) and data.source is not None:
        part.sources = data.source
    part.dataset = index_table(data.y)
    return part, data


def partition_indices(settings: DataSettings, partition_id: int, num_partitions: int) -> np.ndarray:
    """Indices (into the centralised data set) of client ``partition_id``'s data."""
    part, _ = _partitioner(settings, num_partitions)
    return np.asarray(part.load_partition(partition_id)["idx"], dtype=np.int64)


@functools.lru_cache(maxsize=64)
def load_client_data(settings: DataSettings, partition_id: int, num_partitions: int) -> ClientData:
    """Client ``partition_id``'s train / validation / test splits (cached per process).

    Splits are stratified by label and seeded by (seed, partition_id).  With a two-source partition the
    test split is the client's goal mixture from a separate pool.  With ``feature_shift`` the client's
    domain transform is applied to all of its splits.
    """
    if not 0 <= partition_id < num_partitions:
        raise ValueError(f"partition-id {partition_id} out of range for num-partitions={num_partitions}")
    if settings.dataset == "dialects":
        return _dialect_client(settings, partition_id, num_partitions)
    part, data = _partitioner(settings, num_partitions)
    idx = np.asarray(part.load_partition(partition_id)["idx"], dtype=np.int64)
    if len(idx) < 2:
        raise ValueError(
            f"partition {partition_id} of {num_partitions} got {len(idx)} samples; use fewer clients or a "
            "larger alpha"
        )
    rng = np.random.default_rng([settings.seed, partition_id])
    labels = data.y[idx]
    calib_idx = None
    if isinstance(part, TwoSourcePartitioner):
        tr, va, _ = stratified_split(labels, 0.0, settings.val_fraction, rng)
        goal = np.asarray(part.load_goal_partition(partition_id)["idx"], dtype=np.int64)
        # half of the goal set (by source) for calibration, the other half held out: every method is scored on
        # the same held-out half, PI-FL fits its mixture weights on the calibration half only
        src = part.source_of_labels(data.y, data.info.num_classes)[goal]
        calib_pos, _, test_pos = stratified_split(src, 0.5, 0.0, rng)
        calib_idx, test_idx = goal[calib_pos], goal[test_pos]
    else:
        tr, va, te = stratified_split(labels, settings.test_fraction, settings.val_fraction, rng)
        test_idx = idx[te]
    domain = domain_of(partition_id, settings.feature_shift) if settings.feature_shift else "original"

    def tensors(sel: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
        x = apply_domain(data.x[sel], domain, seed=partition_id)
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)), torch.from_numpy(data.y[sel])

    x_tr, y_tr = tensors(idx[tr])
    x_va, y_va = tensors(idx[va])
    x_te, y_te = tensors(test_idx)
    x_ca, y_ca = tensors(calib_idx) if calib_idx is not None else (None, None)
    meta = {"num-partitions": num_partitions, "partition-id": partition_id}
    if isinstance(part, PlantedClusterPartitioner):
        meta["planted-cluster"] = part.cluster_of(partition_id)
    if isinstance(part, TwoSourcePartitioner):
        meta["source-a-share"] = float(part.shares[partition_id])
    return ClientData(x_tr, y_tr, x_va, y_va, x_te, y_te, data.info.num_classes, domain, meta, x_ca, y_ca)


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
    if not file.is_file():
        raise ValueError(f"{where}: no such file (expected an .npz with arrays 'x' and 'y')")
    try:
        with np.load(file, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
    except Exception as exc:  # a zip or npy error: say what the file should be
        raise ValueError(f"{where}: not a readable .npz file ({exc}); expected arrays 'x' and 'y'") from exc
    missing = [k for k in ("x", "y") if k not in arrays]
    if missing or (("x_test" in arrays) != ("y_test" in arrays)):
        raise ValueError(f"{where}: has arrays {sorted(arrays)}; needs 'x' and 'y' (and optionally both "
                         "'x_test' and 'y_test')")
    shape = (info.in_channels, info.image_size, info.image_size) if info.image_size > 0 else (info.in_channels,)

    def checked(x: np.ndarray, y: np.ndarray, name: str) -> tuple[np.ndarray, np.ndarray]:
        if x.ndim != len(shape) + 1 or tuple(x.shape[1:]) != shape:
            raise ValueError(f"{where}: '{name}' has shape {x.shape}; dataset {settings.dataset!r} needs (N, "
                             f"{', '.join(map(str, shape))})")
        if y.shape != (len(x),) or not np.issubdtype(y.dtype, np.integer):
            raise ValueError(f"{where}: labels for '{name}' must be integers of shape ({len(x)},), got "
                             f"{y.dtype} {y.shape}")
        if len(y) and (y.min() < 0 or y.max() >= info.num_classes):
            raise ValueError(f"{where}: labels of '{name}' must be in [0, {info.num_classes}), got "
                             f"[{y.min()}, {y.max()}]")
        if x.dtype == np.uint8:
            x = x.astype(np.float32) / 255.0
        elif not np.issubdtype(x.dtype, np.floating):
            raise ValueError(f"{where}: '{name}' must be float or uint8, got {x.dtype}")
        if not np.isfinite(x).all():
            raise ValueError(f"{where}: '{name}' contains NaN or infinite values")
        return np.ascontiguousarray(x, dtype=np.float32), y.astype(np.int64)

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
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a))  # noqa: E731
    meta = {"partition-id": partition_id, "data-path": str(file)}
    return ClientData(t(x[tr]), t(y[tr]), t(x[va]), t(y[va]), t(x_te), t(y_te), info.num_classes, "local", meta)


def export_client_file(settings: DataSettings, partition_id: int, num_partitions: int, path: str | Path) -> Path:
    """Write partition ``partition_id`` as a node's ``data-path`` file (train+val as x/y, test as x_test/y_test)."""
    d = load_client_data(settings, partition_id, num_partitions)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.savez(out, x=torch.cat([d.x_train, d.x_val]).numpy(), y=torch.cat([d.y_train, d.y_val]).numpy(),
             x_test=d.x_test.numpy(), y_test=d.y_test.numpy())
    return out


def _dialect_client(settings: DataSettings, partition_id: int, num_partitions: int) -> ClientData:
    """One client of the synthetic-dialect next-word task: x = tokens[:-1], y = tokens[1:] per line."""
    from task.text import MAX_DIALECTS, client_tokens, vocab_size

    if not 1 <= settings.num_clusters <= MAX_DIALECTS:
        raise ValueError(f"num-clusters (the number of dialects) must be in 1..{MAX_DIALECTS}, got {settings.num_clusters}")
    tokens, dialect = client_tokens(partition_id, settings.num_clusters, settings.dialect_sequences,
                                    settings.dialect_mix, settings.seed, settings.lm_pretrained,
                                    iid=settings.partition == "iid")
    rng = np.random.default_rng([settings.seed, partition_id])
    order = rng.permutation(len(tokens))
    n_test = int(round(settings.test_fraction * len(tokens)))
    n_val = int(round(settings.val_fraction * len(tokens)))
    parts = order[n_test + n_val:], order[n_test:n_test + n_val], order[:n_test]
    t = torch.from_numpy(tokens)
    (x_tr, y_tr), (x_va, y_va), (x_te, y_te) = ((t[np.sort(p), :-1], t[np.sort(p), 1:]) for p in parts)
    meta = {"num-partitions": num_partitions, "partition-id": partition_id, "dialect": dialect}
    if dialect >= 0:
        meta["planted-cluster"] = dialect
    return ClientData(x_tr, y_tr, x_va, y_va, x_te, y_te, vocab_size(settings.lm_pretrained), "original", meta)

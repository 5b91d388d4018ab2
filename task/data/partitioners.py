"""Partitioners in flwr-datasets' ``Partitioner`` interface: flwr-datasets' own (IID, Dirichlet, pathological, and its
inner Dirichlet over unequal client sizes for quantity skew crossed with label skew) and the ones it lacks (planted
clusters as in pFedLIA, two-source mixtures as in PI-FL).  They work on a
light index table (columns ``idx`` and ``label``) so that images stay in one numpy array.

This module imports ``datasets`` and ``flwr_datasets``; a client only loads it when its partition is not
in the on-disk cache (see :mod:`task.data.clients`).
"""

from __future__ import annotations

import functools
import logging
import warnings

import numpy as np
from datasets import Dataset
from flwr_datasets.partitioner import (
    DirichletPartitioner,
    IidPartitioner,
    InnerDirichletPartitioner,
    Partitioner,
    PathologicalPartitioner,
)

from task.data.catalogue import MIN_CLIENT_SAMPLES, MIXTURES, PARTITIONS, NoShare
from task.data.sources import Centralized, load_centralized

log = logging.getLogger("flwr.pflower")


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
    """pFedLIA's planted clusters (pfedlia.md §4): every label belongs to exactly one of ``num_clusters``.

    Client ``i`` is in cluster ``i % num_clusters``.  Each label's samples are cut into equal, disjoint
    shards, one for each client of its cluster.  ``noisy=True``: each client with probability 0.5 also
    borrows one random label from outside its cluster; extra labels are drawn first and each label is then
    cut into ``owners + borrowers`` equal shards (pfedlia.md §4), so shards stay equal and disjoint.
    """

    def __init__(self, num_partitions: int, num_clusters: int = 5, noisy: bool = False, seed: int = 0) -> None:
        super().__init__(num_partitions, seed)
        if num_clusters < 1 or num_clusters > num_partitions:
            raise ValueError(f"num-clusters must be in [1, num-partitions={num_partitions}], got {num_clusters}")
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
    """Share ``p_i`` of source A in client ``i``'s training data (pifl.md §4).

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
    """PI-FL's two-source mixtures (pifl.md §4) over label-defined sources.

    Source A is the first half of the labels, source B the second (pifl.md §4's resolution for CIFAR-10:
    classes 0-4 vs 5-9).  The data set is first cut into a training pool and a goal pool
    (``goal_fraction``); client ``i`` trains on a mixture with share ``p_i`` of A and is tested on its
    "goal" mixture ``q_i`` = ``1 - p_i`` (``goal='inverted'``, images) or ``p_i`` (``goal='same'``).
    Every client gets the same number of training samples, the largest that keeps the training partitions
    disjoint.  Goal data is only ever evaluated on, never trained on: each client's goal set holds
    ``goal_size`` samples (fewer where the pool cannot supply its mixture) drawn from the whole goal pool, so
    goal sets of different clients may share samples, and each is large enough that an accuracy difference
    between methods is many samples, not a handful (pifl.md §4 leaves the test-set size open).
    """

    def __init__(
        self,
        num_partitions: int,
        mixture: str = "10:90",
        goal: str = "inverted",
        goal_fraction: float = 0.25,
        seed: int = 0,
        goal_size: int = 200,
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
            raise ValueError(f"too many clients ({len(shares_a)}) for the data set: fewer than 2 samples each")
        out, pos = [], [0, 0]
        for p in shares_a:
            n_a = round(p * per_client)
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
            n_a = round(share * size)
            out.append(
                np.sort(
                    np.concatenate(
                        [rng.choice(pools[0], n_a, replace=False), rng.choice(pools[1], size - n_a, replace=False)]
                    )
                )
            )
        return out

    def goal_indices(self, partition_id: int) -> np.ndarray:
        """Client ``partition_id``'s goal set: indices into the data set (:meth:`load_goal_partition`'s ``idx``)."""
        self.partition_indices()
        assert self._goal_indices is not None
        return np.asarray(self._goal_indices[partition_id], dtype=np.int64)

    def load_goal_partition(self, partition_id: int) -> Dataset:
        """Client ``partition_id``'s test ("goal") data, drawn from the goal pool with mixture ``q_i``."""
        self.partition_indices()
        assert self._goal_indices is not None
        return self.dataset.select(self._goal_indices[partition_id].tolist())


def quantity_sizes(
    total: int, num_partitions: int, sigma: float, seed: int, minimum: int = MIN_CLIENT_SAMPLES
) -> np.ndarray:
    """Unequal client sizes summing to ``total``: every client gets ``minimum`` samples, and the rest is shared in
    proportion to seeded lognormal(0, ``sigma``) draws (largest remainders round it; ``sigma`` 0: equal sizes).

    Raises ValueError when ``total`` cannot give every client ``minimum`` samples."""
    if num_partitions < 1:
        raise ValueError(f"num-partitions must be >= 1, got {num_partitions}")
    if not sigma >= 0:
        raise ValueError(f"size-sigma must be >= 0, got {sigma}")
    if total < minimum * num_partitions:
        raise ValueError(
            f"partition 'quantity-dirichlet' gives every client at least {minimum} samples: {num_partitions} clients "
            f"need {minimum * num_partitions}, the data set has {total}; use at most {total // minimum} clients"
        )
    weights = np.random.default_rng([seed, 7_411]).lognormal(0.0, sigma, size=num_partitions)
    share = (total - minimum * num_partitions) * weights / weights.sum()
    sizes = np.floor(share).astype(np.int64)
    left = total - minimum * num_partitions - int(sizes.sum())
    sizes[np.argsort(sizes - share, kind="stable")[:left]] += 1  # the largest remainders first
    return sizes + minimum


class QuantityDirichletPartitioner(InnerDirichletPartitioner):
    """Quantity skew crossed with label skew: client sizes from :func:`quantity_sizes` (lognormal(0, ``sigma``),
    at least :data:`MIN_CLIENT_SAMPLES` each), labels Dirichlet(``alpha``) within each client, filled by
    flwr-datasets' inner Dirichlet partitioner (Acar et al., FedDyn); the sizes are drawn once the data set is
    known."""

    def __init__(self, num_partitions: int, alpha: float, sigma: float, seed: int) -> None:
        if not alpha > 0:
            raise ValueError(f"alpha must be > 0 for partition 'quantity-dirichlet', got {alpha}")
        if not sigma >= 0:
            raise ValueError(f"size-sigma must be >= 0, got {sigma}")
        # the sizes are drawn when the data set is set (below); flwr-datasets shuffles each partition with the seed
        super().__init__([0] * num_partitions, partition_by="label", alpha=float(alpha), seed=seed)
        self.sigma, self.size_seed = sigma, seed

    @Partitioner.dataset.setter
    def dataset(self, value: Dataset) -> None:
        Partitioner.dataset.fset(self, value)
        self._partition_sizes = quantity_sizes(len(value), self._num_partitions, self.sigma, self.size_seed)

    @property
    def partition_sizes(self) -> np.ndarray:
        """Every client's number of samples (known once the data set is set)."""
        return np.asarray(self._partition_sizes)


def build_partitioner(
    partition: str,
    num_partitions: int,
    *,
    alpha: float = 0.5,
    classes_per_client: int = 2,
    num_clusters: int = 5,
    mixture: str = "10:90",
    seed: int = 0,
    goal: str = "inverted",
    size_sigma: float = 1.0,
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
    if partition == "quantity-dirichlet":
        return QuantityDirichletPartitioner(num_partitions, alpha, size_sigma, seed)
    if partition == "pathological":
        if classes_per_client < 1:
            raise ValueError(f"classes-per-client must be >= 1, got {classes_per_client}")
        return PathologicalPartitioner(
            num_partitions,
            partition_by="label",
            num_classes_per_partition=classes_per_client,
            class_assignment_mode="first-deterministic",
            seed=seed,
        )
    if partition in ("planted-clusters", "planted-clusters-noisy"):
        return PlantedClusterPartitioner(num_partitions, num_clusters, noisy=partition.endswith("noisy"), seed=seed)
    if partition == "two-source":
        return TwoSourcePartitioner(num_partitions, mixture, goal=goal, seed=seed)
    raise ValueError(f"unknown partition {partition!r} (run-config key 'partition'); allowed: {list(PARTITIONS)}")


class _SeededDirichlet(DirichletPartitioner):
    """flwr-datasets' Dirichlet partitioner with a minimum size that scales down for many small clients."""

    def __init__(self, num_partitions: int, alpha: float, seed: int) -> None:
        self._min_size_wanted = 10
        self.alpha = alpha
        super().__init__(
            num_partitions,
            partition_by="label",
            alpha=alpha,
            min_partition_size=0,
            self_balancing=False,
            shuffle=True,
            seed=seed,
        )

    @Partitioner.dataset.setter
    def dataset(self, value: Dataset) -> None:
        Partitioner.dataset.fset(self, value)
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
                if "max number of attempts" not in str(err):
                    raise
                if self._min_partition_size <= 1:
                    reason = "every draw of flwr-datasets' Dirichlet partitioner left some client without a sample"
                    raise NoShare(
                        f"partition 'dirichlet' (alpha={self.alpha:g}) cannot be drawn over {self._num_partitions} "
                        f"clients of {len(self.dataset)} samples: {reason}; use fewer clients or a larger alpha",
                        reason,
                    ) from None
                self._min_partition_size //= 2
                log.info("Dirichlet partition: lowering the minimum client size to %d", self._min_partition_size)


@functools.lru_cache(maxsize=8)
def partitioner_for(settings, num_partitions: int) -> tuple[Partitioner, Centralized]:
    """The run's partitioner over ``num_partitions`` clients and the whole data set whose originals it partitions
    (cached)."""
    data = load_centralized(
        settings.dataset, settings.data_dir, settings.noise_std, settings.data_copies, settings.mnist1d_samples
    )
    return draw_partition(settings, num_partitions, data), data


def draw_partition(settings, num_partitions: int, data: Centralized) -> Partitioner:
    """The run's partitioner over ``num_partitions`` clients, set on ``data``'s originals (only their labels, and
    PI-FL's sources, decide it: :func:`task.data.sources.load_labels` is enough).  Raises ValueError when the data
    cannot give every client a share."""
    if data.originals < 2 * num_partitions:
        copies = (
            " (data-copies only enlarges training splits, it adds no samples to partition)" if data.copies > 1 else ""
        )
        raise NoShare(
            f"num-partitions={num_partitions} is too many for dataset {settings.dataset!r} with {data.originals} "
            f"samples: every client needs at least 2 (use at most {data.originals // 2} clients){copies}",
            f"every client needs at least 2 samples{copies}",
        )
    part = build_partitioner(
        settings.partition,
        num_partitions,
        alpha=settings.alpha,
        classes_per_client=settings.classes_per_client,
        num_clusters=settings.num_clusters,
        mixture=settings.mixture,
        seed=settings.seed,
        size_sigma=settings.size_sigma,
        goal="same" if data.source is not None else "inverted",  # pifl.md §4: synthetic goal = training mix
    )
    if isinstance(part, TwoSourcePartitioner) and data.source is not None:
        part.sources = data.source
    part.dataset = index_table(data.y[: data.originals])  # copies follow their originals (Centralized.with_copies)
    return part


def partition_members(part: Partitioner) -> list[np.ndarray]:
    """Every client's ``idx`` (into the data set), as ``part.load_partition(i)["idx"]`` gives them one client at a time,
    without building a ``Dataset`` for each (milliseconds per client, seconds for a check over hundreds of them).

    Where the partition is held as index arrays it is read from them: ours (:class:`_IndexPartitioner`), flwr-datasets'
    drawn ones (Dirichlet, inner Dirichlet, pathological: their ``_partition_id_to_indices`` after the draw, rows of the
    index table, whose ``idx`` is the row) and the IID one (``Dataset.shard(contiguous=True)``: consecutive blocks, the
    first ``len % n`` one longer).  tests/data/test_capacity.py pins each against ``load_partition``."""
    n = part.num_partitions
    if isinstance(part, _IndexPartitioner):
        return [np.asarray(i, dtype=np.int64) for i in part.partition_indices()]
    if isinstance(part, IidPartitioner):
        return [b.astype(np.int64) for b in np.array_split(np.arange(len(part.dataset)), n)]
    part.load_partition(0)  # draws the partition
    drawn = getattr(part, "_partition_id_to_indices", None)
    if isinstance(drawn, dict) and len(drawn) == n:
        return [np.asarray(drawn[i], dtype=np.int64) for i in range(n)]
    return [np.asarray(part.load_partition(i)["idx"], dtype=np.int64) for i in range(n)]

"""How many clients a run's data can serve, known before round 1.

A client whose share of the data leaves it no training example, or no example in the split it is scored on (the test
split; the validation split under ``evaluate-split='validation'``), has nothing to report: each of its evaluations is
rejected, and the run's means would speak for the few others.  A partition that cannot be drawn at all at that size
(flwr-datasets' Dirichlet partitioner finding no draw that gives every client a sample) fails on every client.

:func:`capacity_problem` finds both before anything runs: it draws the partition as the clients will (the same code,
the same seed, from the data set's labels alone) and splits every client's share with the code each client splits its
own with (:func:`task.data.clients.splits_of`).  When some client would be left without an example it says how many
and why, and how many clients the data can serve (the largest client count below the one asked for whose every
client gets both splits, found by bisection and checked), and, where one does, the smallest larger held-out fraction
that serves them all.  The ServerApp runs it in simulation, where every node is a partition of the run's data set
(node config ``num-partitions`` = the node count), and ``python -m server_app.job`` before it starts the simulation
(``num-supernodes``); in deployment a client that finds its own split empty refuses with the same reason
(``client_app.base``), since only it knows its node config.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from task.data.clients import ClientData, DataSettings, _code_version, cache_root, splits_of, stratified_split
from task.data.sources import labels_known, load_labels

#: the split a client is scored on under each ``evaluate-split``, and the run-config key of its share
SCORED = {"test": ("test", "test-fraction"), "validation": ("validation", "val-fraction")}
#: the held-out fractions a hint may suggest (test-fraction + val-fraction must stay below 0.9: task.data.clients)
FRACTION_STEP = 0.05


@dataclass(frozen=True)
class Served:
    """What ``clients`` clients would get: why the partition cannot be drawn (None: it can), and how many clients
    would have no training example and no example in the scored split."""

    clients: int
    undrawable: str | None = None
    no_train: int = 0
    no_scored: int = 0

    @property
    def ok(self) -> bool:
        return self.undrawable is None and not self.no_train and not self.no_scored


def knowable(settings: DataSettings) -> bool:
    """Whether this process can check ``settings`` (it can read the data set's labels without a download; the
    dialects task has no partition to draw: its lines per client are checked with the run config)."""
    return settings.dataset != "dialects" and labels_known(settings.dataset, settings.data_dir)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Without the partitioners' notes (a Dirichlet draw lowering its minimum size): a check draws many partitions."""
    logger = logging.getLogger("flwr.pflower")
    level = logger.level
    logger.setLevel(logging.WARNING)
    try:
        yield
    finally:
        logger.setLevel(level)


def serve(settings: DataSettings, clients: int, scored: str = "test") -> Served:
    """What each of ``clients`` clients' splits would hold (raises ValueError where the data set cannot be read)."""
    from task.data.partitioners import draw_partition, partition_members

    data = load_labels(settings.dataset, settings.data_dir, settings.data_copies, settings.mnist1d_samples)
    try:
        with _quiet():
            part = draw_partition(settings, clients, data)
            members = partition_members(part)
    except ValueError as err:  # too many clients for the samples, a draw that leaves a client empty, ...
        return Served(clients, undrawable=getattr(err, "reason", str(err)))
    no_train = no_scored = 0
    for pid, idx in enumerate(members):
        try:
            where = splits_of(settings, part, data, pid, clients, idx)
        except ValueError as err:  # a share of fewer than 2 samples
            return Served(clients, undrawable=str(err))
        held_out = where.val if scored == "validation" else where.test
        no_train += len(where.train) == 0
        no_scored += len(held_out) == 0
    return Served(clients, None, no_train, no_scored)


def most_clients(settings: DataSettings, below: int, scored: str = "test") -> int:
    """The largest client count under ``below`` whose every client gets a training and a scored example (bisection
    over the counts, each one it returns checked; 0 when not even one client can be served)."""
    if not serve(settings, 1, scored).ok:
        return 0
    good, bad = 1, below
    while bad - good > 1:
        mid = (good + bad) // 2
        good, bad = (mid, bad) if serve(settings, mid, scored).ok else (good, mid)
    return good


def _with_fraction(settings: DataSettings, key: str, value: float) -> DataSettings:
    if key == "test-fraction":
        return dataclasses.replace(settings, test_fraction=value)
    return dataclasses.replace(settings, val_fraction=value)


def larger_fraction(settings: DataSettings, clients: int, scored: str = "test") -> float | None:
    """The smallest held-out fraction of the scored split (a multiple of 0.05 above the run's, leaving 10 % for
    training) that gives each of ``clients`` clients a scored example and draws the same partition; None where none
    does."""
    _, key = SCORED[scored]
    now = settings.test_fraction if key == "test-fraction" else settings.val_fraction
    other = settings.val_fraction if key == "test-fraction" else settings.test_fraction
    steps = [round(k * FRACTION_STEP, 2) for k in range(1, 20)]
    options = [f for f in steps if f > now + 1e-9 and f + other < 0.9 - 1e-9]
    if not options or not serve(_with_fraction(settings, key, options[-1]), clients, scored).ok:
        return None
    good, bad = len(options) - 1, -1  # options[good] serves, options[bad] does not (-1: none tried yet)
    while good - bad > 1:
        mid = (good + bad) // 2
        good, bad = (
            (mid, bad) if serve(_with_fraction(settings, key, options[mid]), clients, scored).ok else (good, mid)
        )
    return options[good]


def _what(settings: DataSettings, samples: int) -> str:
    params = {
        "dirichlet": f" (alpha={settings.alpha:g})",
        "quantity-dirichlet": f" (alpha={settings.alpha:g}, size-sigma={settings.size_sigma:g})",
        "pathological": f" (classes-per-client={settings.classes_per_client})",
        "two-source": f" (mixture {settings.mixture!r})",
    }.get(settings.partition, "")
    return f"dataset {settings.dataset!r} ({samples:,} samples) with partition {settings.partition!r}{params}"


def _verdict(settings: DataSettings, clients: int, scored: str) -> Path | None:
    """Where a passed check of an embedded data set is remembered (``$PFLOWER_CACHE_DIR/capacity``), keyed like a
    client's cached splits by the settings and the data code: a later run of the same settings skips the check, and
    with it the import of ``datasets`` and flwr-datasets (seconds) before its first round."""
    if settings.dataset not in ("digits", "synth-concept"):  # a local copy may change under the same settings
        return None
    key = hashlib.sha256(f"{settings!r}|{clients}|{scored}|{_code_version()}".encode()).hexdigest()
    return cache_root() / "capacity" / f"{settings.dataset}-{clients}-{key[:20]}.ok"


def min_samples_for(split_fraction: float, other_fraction: float, limit: int = 1000) -> int | None:
    """The fewest samples of one label a client needs for one of them to be held out in a split of ``split_fraction``
    (the other held-out split taking ``other_fraction``), by the splitting code itself; None above ``limit``."""
    for n in range(1, limit + 1):
        _, _, held = stratified_split(np.zeros(n, np.int64), split_fraction, other_fraction, np.random.default_rng(0))
        if len(held):
            return n
    return None


@functools.lru_cache(maxsize=16)
def capacity_problem(settings: DataSettings, clients: int, scored: str = "test") -> str | None:
    """Why ``clients`` clients cannot all be served by ``settings``' data, what serves them, or None when every client
    gets a training example and an example in its ``scored`` split (see the module docstring)."""
    verdict = _verdict(settings, clients, scored)
    if verdict is not None and verdict.is_file():
        return None
    at = serve(settings, clients, scored)
    if at.ok:
        if verdict is not None:
            with contextlib.suppress(OSError):  # a read-only cache only costs the next run the check
                verdict.parent.mkdir(parents=True, exist_ok=True)
                verdict.touch()
        return None
    split, key = SCORED[scored]
    fraction = settings.test_fraction if key == "test-fraction" else settings.val_fraction
    samples = load_labels(settings.dataset, settings.data_dir, settings.data_copies, settings.mnist1d_samples).originals
    if at.undrawable is not None:
        why = at.undrawable
    else:
        lacks = []
        if at.no_scored:
            other = settings.val_fraction if key == "test-fraction" else settings.test_fraction
            need = min_samples_for(fraction, other) if settings.partition != "two-source" else None
            how = f": a client needs {need} samples of one label for one" if need else ""
            held = f"holds out round({fraction:g} x n) of a client's n samples of each label{how}" if fraction else ""
            lacks.append(
                f"{at.no_scored} of the {clients} clients would get no {split} example"
                + (f" ({key}={fraction:g} {held})" if held else f" ({key}=0 holds none out)")
            )
        if at.no_train:
            lacks.append(f"{at.no_train} of the {clients} clients would get no training example")
        why = "; ".join(lacks)
    most = most_clients(settings, clients, scored)
    fixes = []
    if most:
        fixes.append(f"use at most {most} clients (num-supernodes in simulation, num-partitions on the SuperNodes)")
    if at.undrawable is None and at.no_scored and (larger := larger_fraction(settings, clients, scored)) is not None:
        fixes.append(f"hold out more of each client's data: {key}={larger:g} gives every client a {split} example")
    served = f"It can serve at most {most} clients" if most else "It cannot serve even one client"
    advice = "; or ".join(fixes) if fixes else f"change {key} or the partition"
    return f"{clients} clients are too many for {_what(settings, samples)}: {why}. {served}: {advice}"


def run_refusal(settings: DataSettings, clients: int, scored: str = "test") -> str | None:
    """:func:`capacity_problem` where this process can check it (None where it cannot, or the data set cannot be
    read: the error that brought the caller here then speaks for itself)."""
    if clients < 1 or not knowable(settings):
        return None
    try:
        return capacity_problem(settings, clients, scored)
    except ValueError:
        return None


def client_refusal(
    data: ClientData, settings: DataSettings, partition_id: int, clients: int, scored: str
) -> str | None:
    """Why a client with ``data`` (its splits, the scored one in place of the test split) cannot take part: None when
    it has a training example and one to be scored on.  Where the client holds a partition of the run's data set
    (``clients`` = its node config's ``num-partitions``) the reason is the run's (:func:`run_refusal`): the same words
    on every client, which the server's reply gate reads as one reason; a node with its own data file (``clients`` 0)
    says what its own splits lack."""
    split, key = SCORED[scored]
    if data.num_train and len(data.y_test):
        return None
    if (whole := run_refusal(settings, clients, scored)) is not None:
        return whole
    lacks = "training example" if not data.num_train else f"{split} example"
    return (
        f"client {partition_id} has no {lacks} ({data.num_train} training, {len(data.y_test)} {split} examples): "
        f"give it more data{'' if not data.num_train else f', or a larger {key}'}"
    )

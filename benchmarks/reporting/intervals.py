"""Paired differences with a 95 % interval: a bootstrap over seeds and the clients within them.

Two methods run at the same cell and seed train and score the same clients (same data: ``pairing.py``).  Their
difference on a seed is the mean over clients of the per-client difference (arm minus reference, paired by client
id, from the records' ``clients``), and the difference over seeds is the mean of those, which is the difference of
the two methods' personalized accuracies (a mean over clients, averaged over seeds).

The interval is a two-level percentile bootstrap (:func:`bootstrap`): each of :data:`RESAMPLES` resamples draws the
seeds with replacement (the outer level), and within each drawn seed its clients with replacement; the statistic
is the mean over the drawn seeds of the mean over the drawn clients.  The 2.5th and 97.5th percentiles of the
resampled statistics bound the interval.  The generator is seeded (:data:`BOOTSTRAP_SEED`), so the interval of the
same records is the same every time.  A method *beats* a reference where the interval's lower end is above zero,
and loses to it where the upper end is below zero; otherwise the records cannot tell them apart.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from benchmarks.records import TIE, Rec, ok

from .pairing import pairing_problem

RESAMPLES = 2000
BOOTSTRAP_SEED = 20_250
LEVEL = 0.95


@dataclass
class Interval:
    """A paired difference (``point``) with its bootstrap interval ``[lo, hi]``, or why there is none."""

    point: float = float("nan")
    lo: float = float("nan")
    hi: float = float("nan")
    seeds: list[int] = field(default_factory=list)
    clients: int = 0  # (seed, client) pairs the difference rests on
    reason: str | None = None
    other_test: bool = False  # the arm was scored on another part of each test split (same training data)

    @property
    def ok(self) -> bool:
        return self.reason is None

    @property
    def above(self) -> bool:
        """The interval lies above zero: the arm beats the reference on these records."""
        return self.ok and self.lo > TIE

    @property
    def below(self) -> bool:
        return self.ok and self.hi < -TIE

    def text(self, scale: float = 100, nd: int = 1) -> str:
        """``+1.2 [+0.3, +2.1]`` (points), or ``no interval (why)``."""
        if not self.ok:
            return f"no interval ({self.reason})"
        return f"{self.point * scale:+.{nd}f} [{self.lo * scale:+.{nd}f}, {self.hi * scale:+.{nd}f}]"

    def verdict(self) -> str:
        return "better" if self.above else "worse" if self.below else "not told apart"


def bootstrap(
    diffs: Sequence[Sequence[float]],
    resamples: int = RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    level: float = LEVEL,
) -> tuple[float, float, float]:
    """(point, lo, hi) of the mean over seeds of the mean over clients of ``diffs[seed][client]``: the two-level
    percentile bootstrap of the module docstring.  A function of its arguments alone (the generator is seeded), so
    the same differences asked again (RESULTS.md and the choosing page judge the same pairs) are computed once per
    process."""
    groups = tuple(tuple(float(v) for v in d) for d in diffs if len(d))
    if not groups:
        raise ValueError("no differences to bootstrap")
    return _bootstrap(groups, resamples, seed, level)


@functools.lru_cache(maxsize=4096)
def _bootstrap(
    diffs: tuple[tuple[float, ...], ...], resamples: int, seed: int, level: float
) -> tuple[float, float, float]:
    groups = [np.asarray(d, dtype=float) for d in diffs]
    point = float(np.mean([g.mean() for g in groups]))
    rng = np.random.default_rng(seed)
    n_seeds = len(groups)
    picked = rng.integers(0, n_seeds, size=(resamples, n_seeds))  # the outer level: which seeds
    stats = np.zeros(resamples)
    for k, g in enumerate(groups):
        # an independent client resample for every slot a seed may fill, so a seed drawn twice is resampled twice
        means = g[rng.integers(0, len(g), size=(resamples, n_seeds, len(g)))].mean(axis=2)
        stats += np.where(picked == k, means, 0.0).sum(axis=1)
    stats /= n_seeds
    tail = (1 - level) / 2
    lo, hi = np.quantile(stats, [tail, 1 - tail])
    return point, float(lo), float(hi)


def per_client(rec: Rec, column: str = "personal-acc") -> dict[Any, float]:
    """Client id -> its value of ``column`` in a record's ``clients`` (clients without one left out)."""
    cols = rec["clients"]["columns"]
    if column not in cols:
        return {}
    i = cols.index(column)
    return {row[0]: float(row[i]) for row in rec["clients"]["rows"] if row[i] is not None}


def paired_interval(
    arm: list[Rec],
    ref: list[Rec],
    column: str = "personal-acc",
    ref_column: str | None = None,
    test_may_differ: bool = False,
    draws: bool = False,
    resamples: int = RESAMPLES,
) -> Interval:
    """The interval of ``arm - ref`` over the seeds both ran (paired by seed and by client id); refused where a pair
    of runs does not share its data (``pairing.pairing_problem``) or its clients."""
    ref_column = ref_column or column
    by_seed = {r["cell"]["seed"]: r for r in ok(ref)}
    diffs, seeds, other_test = [], [], False
    for a in sorted(ok(arm), key=lambda r: r["cell"]["seed"]):
        seed = a["cell"]["seed"]
        b = by_seed.get(seed)
        if b is None:
            continue
        problem = pairing_problem(a, b, draws)
        if problem and test_may_differ and pairing_problem(a, b, draws, training_only=True) is None:
            problem, other_test = None, True
        if problem:
            return Interval(reason=f"seed {seed}: {problem}")
        va, vb = per_client(a, column), per_client(b, ref_column)
        if not va or not vb:
            return Interval(reason=f"seed {seed}: a run has no per-client {column}")
        if set(va) != set(vb):
            return Interval(reason=f"seed {seed}: the runs scored other clients")
        diffs.append([va[c] - vb[c] for c in sorted(va)])
        seeds.append(seed)
    if not diffs:
        return Interval(reason="no seed run by both")
    point, lo, hi = bootstrap(diffs, resamples)
    return Interval(point, lo, hi, seeds, sum(len(d) for d in diffs), None, other_test)


def seed_interval(values: Sequence[float], resamples: int = RESAMPLES) -> tuple[float, float, float]:
    """(point, lo, hi) of per-seed differences alone (no per-client values: one level)."""
    return bootstrap([[v] for v in values], resamples)


def interval_cell(iv: Interval | None) -> str:
    """A table cell: the difference in points with its interval, bold where it excludes zero; "—" without one."""
    if iv is None:
        return "—"
    if not iv.ok:
        return iv.text()
    text = iv.text() + (" †" if iv.other_test else "")
    return f"**{text}**" if iv.above or iv.below else text


def method_line(
    rule: Callable[[Interval], bool], intervals: dict[str, Interval], names: Callable[[str], str] = str
) -> list[str]:
    """The names (and intervals) of the references for which ``rule`` holds."""
    return [f"{names(n)} ({iv.text()})" for n, iv in intervals.items() if iv.ok and rule(iv)]


def describe() -> str:
    """The interval's definition, for the text above a table (numbers from this module's constants)."""
    return (
        f"Δ is the paired difference in points (per client, same seed and client id; mean over clients, then over "
        f"seeds) with its {LEVEL * 100:.0f} % interval in brackets: a two-level bootstrap ({RESAMPLES:,} resamples, "
        f"generator seed {BOOTSTRAP_SEED}) that draws the seeds with replacement and, within each, the clients with "
        "replacement. Bold: the interval excludes zero."
    )

"""Fairness: how a method's accuracy spreads over the clients, and how many clients it leaves worse than Local.

From the records' per-client accuracies (``clients``), per run: the standard deviation over clients (population),
the worst client and the 10th percentile (numpy's linear interpolation), each averaged over the seeds; and the share
of clients whose personalized model scores below their Local model, paired by seed and client id with the Local run
of the same cell (same data), over every (seed, client) pair.  A method that raises the mean by hurting a fifth of
the clients shows it here.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from benchmarks.records import TIE, Rec, ok

from .intervals import per_client
from .pairing import pairing_problem


@dataclass
class Spread:
    std: float
    worst: float
    p10: float
    runs: int


def spread(recs: list[Rec], column: str = "personal-acc") -> Spread | None:
    """Mean over the runs of the spread of ``column`` over clients (None without per-client values)."""
    rows = []
    for r in ok(recs):
        vals = np.array(list(per_client(r, column).values()))
        if len(vals):
            rows.append((vals.std(), vals.min(), np.percentile(vals, 10)))
    if not rows:
        return None
    std, worst, p10 = (float(np.mean(c)) for c in zip(*rows, strict=True))
    return Spread(std, worst, p10, len(rows))


@dataclass
class Worse:
    """Clients below their Local model: ``worse`` of ``pairs`` (seed, client) pairs, or why it cannot be said."""

    worse: int = 0
    pairs: int = 0
    reason: str | None = None

    @property
    def share(self) -> float | None:
        return self.worse / self.pairs if self.pairs and self.reason is None else None

    def text(self) -> str:
        if self.reason:
            return f"— ({self.reason})"
        share = self.share
        return "—" if share is None else f"{share:.0%} ({self.worse} of {self.pairs})"


def worse_than_local(arm: list[Rec], local: list[Rec], test_may_differ: bool = False) -> Worse:
    """The (seed, client) pairs where ``arm``'s personalized accuracy is below Local's (by more than float noise)."""
    by_seed = {r["cell"]["seed"]: r for r in ok(local)}
    out = Worse()
    for a in ok(arm):
        b = by_seed.get(a["cell"]["seed"])
        if b is None:
            continue
        problem = pairing_problem(a, b, False)
        if problem and not (test_may_differ and pairing_problem(a, b, False, training_only=True) is None):
            return Worse(reason=f"seed {a['cell']['seed']}: {problem}")
        va, vb = per_client(a), per_client(b)
        shared = set(va) & set(vb)
        out.pairs += len(shared)
        out.worse += sum(1 for c in shared if va[c] < vb[c] - TIE)
    if not out.pairs:
        out.reason = "no Local run to pair with"
    return out


def spread_cells(recs: list[Rec]) -> list[str]:
    """``[std, worst, p10]`` as table cells (accuracies), "—" without per-client values."""
    s = spread(recs)
    return ["—"] * 3 if s is None else [f"{s.std:.3f}", f"{s.worst:.3f}", f"{s.p10:.3f}"]


HEADER = ["std over clients", "worst client", "10th percentile", "clients worse than Local"]
DEFINITION = (
    "Spread over clients, per run then averaged over its seeds: the standard deviation of the clients' personalized "
    "accuracies, the worst client's, the 10th percentile; clients worse than Local: the share of (seed, client) pairs "
    "whose personalized model scores below that client's Local model on the same seed."
)

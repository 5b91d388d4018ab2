"""Paired differences: arm minus reference on the same seed, only when the two runs share their data.

Two runs pair when their records' data fingerprints agree (the same clients with the same examples; see
``benchmarks/running.py``'s ``fingerprint``) and, where a comparison claims it, their client draws agree too.
Otherwise the table says why there is no paired difference instead of printing one.  A table may accept runs
that share their training data but were scored on other parts of their test splits (``test_may_differ``: PI-FL
scores on the half of each test split it does not fit its mixture on); such a pair is marked (``other_test``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from benchmarks.records import TIE, Rec, digest, mean, ok

from .text import mean_range, pts


@dataclass
class Paired:
    """Per-seed differences ``arm - ref``, or why the runs could not be paired."""

    deltas: list[float]
    reason: str | None = None
    other_test: bool = False  # some pair shares its training data only: the arm was scored on another test split

    @property
    def ok(self) -> bool:
        return self.reason is None and bool(self.deltas)

    @property
    def mean(self) -> float:
        return float(np.mean(self.deltas))

    @property
    def std(self) -> float:
        return float(np.std(self.deltas))

    @property
    def wins(self) -> int:
        return int(sum(d > TIE for d in self.deltas))

    def text(self, nd: int = 4) -> str:
        if not self.ok:
            return f"no paired Δ ({self.reason})"
        return f"{self.mean:+.{nd}f}" + (f" ± {self.std:.{nd}f}" if len(self.deltas) > 1 else " (one seed)")

    def wins_text(self) -> str:
        return f"{self.wins}/{len(self.deltas)}" if self.ok else "—"


def delta_cell(p: Paired | None) -> str:
    """The paired difference in points, ``mean (min to max)``; "—" without a comparison or without runs."""
    if p is None or (not p.ok and not p.deltas and p.reason == "no runs to pair"):
        return "—"
    return mean_range(p.deltas, 1, 100, "+") if p.ok else f"no paired Δ ({p.reason})"


#: the methods a personalized method has to beat: each client on its own, and one global model
REFERENCES = ("local", "fedavg")
#: per-client columns that count the examples a client is scored on, not trained on
TEST_COLUMNS = ("test-examples", "eval-examples", "goal-examples")


def same_data_on_shared_columns(a: Rec, b: Rec, training_only: bool = False) -> bool:
    """Records written by code that reports more per-client data columns (e.g. ``test-examples``) fingerprint
    more columns: two such runs hold the same data when their rows agree on the data columns both record
    (``training_only``: on those that are not counts of test examples, whatever the fingerprints say)."""
    ca, cb = a["fingerprint"].get("data-columns") or [], b["fingerprint"].get("data-columns") or []
    shared = [c for c in ca if c in cb and not (training_only and c in TEST_COLUMNS)]
    if (ca == cb and not training_only) or len(shared) < 2:  # the client id alone says nothing about the data
        return False

    def rows(rec: Rec) -> list[list[Any]]:
        cols = rec["clients"]["columns"]
        return [[row[cols.index(c)] for c in shared] for row in rec["clients"]["rows"]]

    return digest(rows(a)) == digest(rows(b))


def _clients_without_data(rec: Rec) -> list[Any]:
    """Clients whose data columns the record lacks (a client whose every reply the gate rejected has no size)."""
    cols = rec["clients"]["columns"]
    data = [cols.index(c) for c in rec["fingerprint"].get("data-columns") or [] if c in cols and c != "client"]
    return [row[0] for row in rec["clients"]["rows"] if any(row[i] is None for i in data)]


def pairing_problem(a: Rec, b: Rec, draws: bool, training_only: bool = False) -> str | None:
    """Why runs ``a`` and ``b`` are not a pair (None when they are): same data (``training_only``: the same
    training data, test splits aside), and same draws if ``draws``."""
    fa, fb = a.get("fingerprint", {}), b.get("fingerprint", {})
    if not fa.get("data") or not fb.get("data"):
        return "a run has no data fingerprint"
    if training_only and not same_data_on_shared_columns(a, b, training_only):
        return "the runs' training data differ"
    if not training_only and fa["data"] != fb["data"] and not same_data_on_shared_columns(a, b):
        if unrecorded := [rec for rec in (a, b) if _clients_without_data(rec)]:
            n = max(len(_clients_without_data(rec)) for rec in unrecorded)
            return f"a run does not know the data of {n} client{'s' if n > 1 else ''} (their replies were rejected)"
        return "the runs' data differ (data fingerprints disagree)"
    if draws:
        if fa.get("draws") is None or fb.get("draws") is None:
            return "the clients drawn per round are not recorded"
        if fa["draws"] != fb["draws"]:
            return "the runs drew different clients (draw fingerprints disagree)"
    return None


def paired(
    arm: list[Rec],
    ref: list[Rec],
    metric: Callable[[Rec], Any],
    ref_metric: Callable[[Rec], Any] | None = None,
    draws: bool = False,
    test_may_differ: bool = False,
) -> Paired:
    """Seed-paired differences of ``metric(arm) - ref_metric(ref)``; refused unless every pair shares data (and draws;
    with ``test_may_differ``, a pair that shares its training data only is accepted and marked ``other_test``)."""
    ref_metric = ref_metric or metric
    by_seed = {r["cell"]["seed"]: r for r in ok(ref)}
    deltas, other_test = [], False
    for a in sorted(ok(arm), key=lambda r: r["cell"]["seed"]):
        b = by_seed.get(a["cell"]["seed"])
        if b is None:
            return Paired([], f"no reference run for seed {a['cell']['seed']}")
        problem = pairing_problem(a, b, draws)
        if problem and test_may_differ and pairing_problem(a, b, draws, training_only=True) is None:
            problem, other_test = None, True
        if problem:
            return Paired([], f"seed {a['cell']['seed']}: {problem}")
        va, vb = metric(a), ref_metric(b)
        if va is None or vb is None:
            return Paired([], f"seed {a['cell']['seed']}: a value is missing")
        deltas.append(float(va) - float(vb))
    return Paired(deltas, None if deltas else "no runs to pair", other_test)


def versus_many(
    arms: list[tuple[str, list[Rec]]],
    ref_name: str,
    ref: list[Rec],
    metric: Callable[[Rec], Any],
    ref_metric: Callable[[Rec], Any] | None = None,
) -> str:
    """ "A (x, +d points, better in k of n seeds) and B (...) beat REF (y); C (...) does not"."""
    ref_metric = ref_metric or metric
    b = mean(ref, ref_metric)
    if b is None:
        return f"{ref_name}: no result"
    groups: dict[str, list[str]] = {"beat": [], "tie with": [], "do not beat": []}
    for name, arm in arms:
        a = mean(arm, metric)
        if a is None:
            continue
        p = paired(arm, ref, metric, ref_metric)
        seeds = (
            f", better in {p.wins} of {len(p.deltas)} seeds"
            if p.ok and len(p.deltas) > 1
            else ""
            if p.ok
            else f"; {p.text()}"
        )
        groups["beat" if a > b + TIE else "tie with" if abs(a - b) <= TIE else "do not beat"].append(
            f"{name} ({a:.3f}, {pts(a - b)}{seeds})"
        )
    parts = []
    for verb, names in groups.items():
        if names:
            single = {"beat": "beats", "tie with": "ties with", "do not beat": "does not beat"}[verb]
            parts.append(
                f"{' and '.join(names) if len(names) < 3 else ', '.join(names[:-1]) + ' and ' + names[-1]} "
                f"{single if len(names) == 1 else verb}"
            )
    if not parts:
        return f"{ref_name}: no result"
    return "; ".join([parts[0] + f" {ref_name} ({b:.3f})"] + [p + " it" for p in parts[1:]])


def versus(
    name: str,
    arm: list[Rec],
    ref_name: str,
    ref: list[Rec],
    metric: Callable[[Rec], Any],
    ref_metric: Callable[[Rec], Any] | None = None,
) -> str:
    """ "A (x) beats B (y): +d points, wins k/n seeds (paired)" or "does not beat", from the records."""
    ref_metric = ref_metric or metric
    a, b = mean(arm, metric), mean(ref, ref_metric)
    if a is None or b is None:
        return f"{name} vs {ref_name}: no result"
    verb = "beats" if a > b + TIE else ("ties with" if abs(a - b) <= TIE else "does not beat")
    p = paired(arm, ref, metric, ref_metric)
    seeds = (
        f", better in {p.wins} of {len(p.deltas)} seeds (paired)"
        if p.ok and len(p.deltas) > 1
        else ""
        if p.ok
        else f"; {p.text()}"
    )
    return f"{name} ({a:.3f}) {verb} {ref_name} ({b:.3f}): {pts(a - b)}{seeds}"

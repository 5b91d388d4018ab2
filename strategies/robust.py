"""Robust aggregation rules (the run config's ``aggregator``, task/robust.py): pure numpy on the models a method
averages, no Flower strategy.  docs/robustness.md explains each rule and how it composes with a method.

Every rule works on the models flattened into rows (one per client, float64), as the papers define them, and uses
Flower's own helpers: the median and the trimmed mean coordinate by coordinate (``aggregate_median``, FedTrimmedAvg's
``trim_mean``), Multi-Krum (Blanchard et al., NeurIPS 2017) on the squared L2 distances between whole models
(MultiKrum's ``select_multikrum``, which takes and returns RecordDicts: the rows travel in them and come back as the
indices a run reports).  Norm bounding (Sun et al., 2019, "Can you really backdoor federated learning?") clips each
update's L2 norm; Flower has it only inside its DP wrappers, so it is written here.  Integer arrays (BatchNorm's
``num_batches_tracked``) count in no distance or norm; they follow the same rule as the floating arrays where it is
coordinate-wise, and the method's weighted mean of the models the rule kept otherwise, rounded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict
from flwr.server.strategy.aggregate import aggregate_median
from flwr.serverapp.strategy.fedtrimmedavg import trim_mean
from flwr.serverapp.strategy.multikrum import select_multikrum

from task.config import Settings
from task.params import weighted_average
from task.robust import RobustOptions


@dataclass
class Outcome:
    """What a rule did with the ``n`` models of one average: the rows Multi-Krum kept, the rows whose update
    norm-bound clipped and every update's norm (norm-bound), by row index."""

    rule: str
    n: int
    selected: list[int] | None = None
    clipped: list[int] | None = None
    norms: list[float] = field(default_factory=list)


def _weights(n: int, weights: Sequence[float] | np.ndarray | None) -> np.ndarray:
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != (n,) or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"need {n} non-negative weights with a positive sum, got {np.asarray(weights).tolist()}")
    return w / w.sum()


def coordinate_median(rows: np.ndarray) -> np.ndarray:
    """The coordinate-wise median of the rows (Flower's ``aggregate_median``; the mean of the two middle values for
    an even count)."""
    return np.asarray(aggregate_median([([row], 1) for row in rows])[0])


def trimmed_mean(rows: np.ndarray, fraction: float) -> np.ndarray:
    """Per coordinate, the mean of the values left after cutting ``int(fraction * n)`` at each end (Flower's
    FedTrimmedAvg ``trim_mean``, after scipy's)."""
    return np.asarray(trim_mean(np.asarray(rows), fraction))


def multi_krum(rows: np.ndarray, byzantine: int, select: int) -> list[int]:
    """Multi-Krum's choice (Flower's ``select_multikrum``): the ``select`` rows with the lowest Krum scores, each the
    sum of the squared distances to the row's ``n - f - 2`` nearest others (at least one).  Returns row indices,
    sorted."""
    contents = [RecordDict({"arrays": ArrayRecord({"model": Array(np.ascontiguousarray(row))})}) for row in rows]
    chosen = select_multikrum(contents, num_malicious_nodes=byzantine, num_nodes_to_select=select)
    index = {id(c): i for i, c in enumerate(contents)}
    return sorted(index[id(c)] for c in chosen)


def bounded_updates(rows: np.ndarray, reference: np.ndarray, bound: float) -> tuple[np.ndarray, np.ndarray]:
    """(each row's update ``row - reference`` scaled to L2 norm at most ``bound``, every update's norm)."""
    deltas = np.asarray(rows, dtype=np.float64) - np.asarray(reference, dtype=np.float64)[None, :]
    norms = np.sqrt(np.einsum("ij,ij->i", deltas, deltas))
    scale = np.ones_like(norms)
    over = norms > bound
    scale[over] = bound / norms[over]
    return deltas * scale[:, None], norms


def aggregate_rows(
    rows: np.ndarray,
    weights: Sequence[float] | np.ndarray | None,
    options: RobustOptions,
    reference: np.ndarray | None = None,
) -> tuple[np.ndarray, Outcome]:
    """The rule ``options.aggregator`` over the rows (n x d), with the method's ``weights`` (None: uniform) where the
    rule has weights, and ``reference`` (the model the server sent) for norm-bound."""
    rows = np.asarray(rows, dtype=np.float64)
    n, rule = len(rows), options.aggregator
    if n == 0:
        raise ValueError("an aggregate needs at least one model")
    w = _weights(n, weights)
    outcome = Outcome(rule, n)
    if rule == "mean":
        return w @ rows, outcome
    if rule == "median":
        return coordinate_median(rows), outcome
    if rule == "trimmed-mean":
        return trimmed_mean(rows, options.trim_fraction), outcome
    if rule == "multi-krum":
        outcome.selected = multi_krum(rows, options.byzantine(n), options.selected(n))
        kept = outcome.selected
        return (w[kept] / w[kept].sum()) @ rows[kept], outcome
    if rule == "norm-bound":
        if reference is None:
            raise ValueError("norm-bound needs the model the server sent (the reference of the updates)")
        deltas, norms = bounded_updates(rows, reference, options.norm_bound)
        outcome.norms = [float(x) for x in norms]
        outcome.clipped = [int(i) for i in np.flatnonzero(norms > options.norm_bound)]
        return np.asarray(reference, dtype=np.float64) + w @ deltas, outcome
    raise ValueError(f"unknown aggregator {rule!r}")


def _integer_rule(values: np.ndarray, w: np.ndarray, options: RobustOptions, outcome: Outcome) -> np.ndarray:
    """An integer array's aggregate (``values``: n x ...) under the rule of the floating arrays."""
    values = values.astype(np.float64)
    if options.aggregator == "median":
        return np.median(values, axis=0)
    if options.aggregator == "trimmed-mean":
        return trimmed_mean(values, options.trim_fraction)
    kept = outcome.selected if outcome.selected is not None else list(range(len(values)))
    return np.tensordot(w[kept] / w[kept].sum(), values[kept], axes=1)


def aggregate_states(
    states: Sequence[Mapping[str, np.ndarray]],
    weights: Sequence[float] | np.ndarray | None,
    options: RobustOptions,
    reference: Mapping[str, np.ndarray] | None = None,
) -> tuple[dict[str, np.ndarray], Outcome]:
    """:func:`aggregate_rows` on models given as state dicts with the same keys (each array keeps its dtype and
    shape; integer arrays see the module docstring)."""
    if not states:
        raise ValueError("an aggregate needs at least one model")
    keys = list(states[0])
    floating = [k for k in keys if np.issubdtype(np.asarray(states[0][k]).dtype, np.floating)]
    rows = np.stack(
        [
            np.concatenate([np.asarray(s[k], dtype=np.float64).ravel() for k in floating] or [np.zeros(0)])
            for s in states
        ]
    )
    ref = None
    if reference is not None:
        ref = np.concatenate([np.asarray(reference[k], dtype=np.float64).ravel() for k in floating] or [np.zeros(0)])
    flat, outcome = aggregate_rows(rows, weights, options, ref)
    out: dict[str, np.ndarray] = {}
    pos = 0
    w = _weights(len(states), weights)
    for k in keys:
        like = np.asarray(states[0][k])
        if k in floating:
            out[k] = flat[pos : pos + like.size].reshape(like.shape).astype(like.dtype)
            pos += like.size
        else:
            stacked = np.stack([np.asarray(s[k]) for s in states])
            out[k] = np.rint(_integer_rule(stacked, w, options, outcome)).astype(like.dtype)
    return out, outcome


def bounded_model(
    model: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray], bound: float
) -> tuple[dict[str, np.ndarray], float]:
    """One model kept within L2 distance ``bound`` of ``reference`` over its floating arrays (integer arrays as they
    are): ``reference + clip(model - reference, bound)``, and the distance it had."""
    floating = [k for k in model if np.issubdtype(np.asarray(model[k]).dtype, np.floating)]
    row = np.concatenate([np.asarray(model[k], dtype=np.float64).ravel() for k in floating] or [np.zeros(0)])
    ref = np.concatenate([np.asarray(reference[k], dtype=np.float64).ravel() for k in floating] or [np.zeros(0)])
    delta, norms = bounded_updates(row[None, :], ref, bound)
    flat = ref + delta[0]
    out = {k: np.array(v) for k, v in model.items()}
    pos = 0
    for k in floating:
        like = np.asarray(model[k])
        out[k] = flat[pos : pos + like.size].reshape(like.shape).astype(like.dtype)
        pos += like.size
    return out, float(norms[0])


class RobustAveraging:
    """The run's aggregation rule wherever a method averages client models (docs/robustness.md), mixed into the
    strategy's services (:class:`strategies.services.StrategyServices`); what the rule did goes into the history."""

    settings: Settings
    history: list[Any]

    def average_models(
        self,
        models: Sequence[Mapping[str, np.ndarray]],
        weights: Sequence[float] | np.ndarray,
        clients: Sequence[int],
        reference: Mapping[str, np.ndarray] | None = None,
        group: str = "global",
    ) -> dict[str, np.ndarray]:
        """The average of ``models`` (of ``clients``, one each) that a method builds: its own ``weights``' mean under
        ``aggregator='mean'``, else the run's robust rule (:mod:`strategies.robust`), with ``reference`` the model the
        server sent them (norm-bound's reference).  What the rule did goes into the round's ``robust`` entry as
        ``group``."""
        if self.settings.robust.aggregator == "mean":
            return weighted_average(list(models), weights)
        out, outcome = aggregate_states(models, weights, self.settings.robust, reference)
        self._note_rule(group, clients, outcome)
        return out

    def average_rows(
        self,
        rows: np.ndarray,
        weights: np.ndarray | None,
        clients: list[int],
        reference: np.ndarray | None = None,
        group: str = "global",
    ) -> np.ndarray:
        """:meth:`average_models` on models flattened into the rows of a matrix (``weights`` None: uniform)."""
        out, outcome = aggregate_rows(rows, weights, self.settings.robust, reference)
        if outcome.rule != "mean":
            self._note_rule(group, clients, outcome)
        return out

    def bound_model(
        self, model: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray], client: int, group: str = "client"
    ) -> dict[str, np.ndarray]:
        """``model`` as a method keeps it: unchanged, or under ``aggregator='norm-bound'`` within that L2 distance of
        ``reference`` (FedC2I's forwarded models)."""
        if self.settings.robust.aggregator != "norm-bound":
            return {k: np.array(v) for k, v in model.items()}
        bound = self.settings.robust.norm_bound
        out, norm = bounded_model(model, reference, bound)
        self._note_rule(group, [client], Outcome("norm-bound", 1, clipped=[0] if norm > bound else [], norms=[norm]))
        return out

    def _note_rule(self, group: str, clients: Sequence[int], outcome: Outcome) -> None:
        """What the rule did with one average, by client id, into the round's ``robust`` history entry."""
        if not self.history:
            return
        entry: dict[str, Any] = {"group": group, "rule": outcome.rule, "clients": [int(c) for c in clients]}
        if outcome.selected is not None:
            entry["selected"] = [int(clients[i]) for i in outcome.selected]
        if outcome.clipped is not None:
            entry["clipped"] = [int(clients[i]) for i in outcome.clipped]
            entry["update-norms"] = [round(x, 6) for x in outcome.norms]
        self.history[-1].extra.setdefault("robust", []).append(entry)

"""Robust aggregation rules (the run config's ``aggregator``, task/robust.py): pure numpy on the models a method
averages, no Flower strategy.  docs/robustness.md explains each rule and how it composes with a method.

Every rule works on the models flattened into rows (one per client, float64), as the papers define them, and uses
Flower's own helpers where Flower has one: the median and the trimmed mean coordinate by coordinate
(``aggregate_median``, FedTrimmedAvg's ``trim_mean``), Multi-Krum (Blanchard et al., NeurIPS 2017) on the squared L2
distances between whole models (MultiKrum's ``select_multikrum``, which takes and returns RecordDicts: the rows travel
in them and come back as the indices a run reports), Bulyan (El Mhamdi et al., ICML 2018) as its paper defines it,
``n - 2f`` models chosen one at a time by Krum (``select_multikrum`` asked for one, over the models not yet chosen),
then per coordinate the mean of the ``n - 4f`` chosen values closest to their median (Flower's Bulyan
``aggregate_n_closest_weights``).  Norm bounding (Sun et al., 2019, "Can you really backdoor federated learning?")
clips each update's L2 norm, to a fixed bound or to a multiple of the median norm of the average's updates (FLAME,
Nguyen et al., USENIX Security 2022); FLTrust (Cao et al., NDSS 2021) weights each update by the cosine between it and
the server's own update on a small root data set, floored at 0, after scaling it to that update's norm.  Flower has
neither outside its DP wrappers, so they are written here.

Where a rule keeps the method's weights (Multi-Krum among the models it keeps, norm-bound), no client holds more than
``weight-cap / m`` of an average of ``m`` models (:func:`capped_weights`): the weights are the method's, but a size is
self-reported.  Integer arrays (BatchNorm's ``num_batches_tracked``) count in no distance or norm; they follow the
same rule as the floating arrays where it is coordinate-wise (median, trimmed mean), and otherwise the weighted mean
of the models the rule kept, rounded.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from flwr.app import Array, ArrayRecord, RecordDict
from flwr.server.strategy.aggregate import aggregate_median
from flwr.serverapp.strategy.bulyan import aggregate_n_closest_weights
from flwr.serverapp.strategy.fedtrimmedavg import trim_mean
from flwr.serverapp.strategy.multikrum import select_multikrum

from task.attacks import attacking
from task.config import Settings
from task.params import weighted_average
from task.robust import RobustOptions


@dataclass
class Outcome:
    """What a rule did with the ``n`` models of one average, by row index: the rows Multi-Krum or Bulyan kept, the rows
    whose update norm-bound clipped, every update's norm and the bound (norm-bound), every update's trust score
    (FLTrust), how many liars the rule's guarantee allows among the ``n`` (None: it states no number), and the weights
    the average used where the rule has weights."""

    rule: str
    n: int
    selected: list[int] | None = None
    clipped: list[int] | None = None
    norms: list[float] = field(default_factory=list)
    bound: float | None = None
    trust: list[float] | None = None
    tolerated: int | None = None
    weights: list[float] | None = None


def _weights(n: int, weights: Sequence[float] | np.ndarray | None) -> np.ndarray:
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    if w.shape != (n,) or (w < 0).any() or w.sum() <= 0 or not np.isfinite(w).all():
        raise ValueError(f"need {n} non-negative weights with a positive sum, got {np.asarray(weights).tolist()}")
    return w / w.sum()


def capped_weights(weights: Sequence[float] | np.ndarray, cap: float) -> np.ndarray:
    """The weights normalised to sum 1 with none above ``cap / m``, ``m`` the number of positive weights:
    ``min(t * w, cap / m)`` with the scale ``t`` that makes them sum to 1, so the weights below the limit keep their
    proportions.  ``cap`` 1 gives every positive weight ``1 / m``, 0 leaves the weights as they are (normalised); a cap
    in (0, 1) cannot be met."""
    w = _weights(len(weights), weights)
    if cap == 0:
        return w
    if cap < 1:
        raise ValueError(f"a weight cap must be 0 or at least 1, got {cap}")
    positive = int(np.count_nonzero(w))
    limit = cap / positive
    order = np.argsort(-w, kind="stable")[:positive]
    out = np.zeros(len(w))
    for k in range(positive + 1):  # k: how many of the largest weights are held at the limit
        rest = w[order[k:]]
        scale = (1.0 - k * limit) / rest.sum() if k < positive else 0.0
        if k == positive or rest[0] * scale <= limit * (1 + 1e-12):
            out[order[:k]] = limit
            out[order[k:]] = rest * scale
            break
    return out / out.sum()


def coordinate_median(rows: np.ndarray) -> np.ndarray:
    """The coordinate-wise median of the rows (Flower's ``aggregate_median``; the mean of the two middle values for
    an even count)."""
    return np.asarray(aggregate_median([([row], 1) for row in rows])[0])


def trimmed_mean(rows: np.ndarray, cut: int) -> np.ndarray:
    """Per coordinate, the mean of the values left after cutting ``cut`` at each end (Flower's FedTrimmedAvg
    ``trim_mean``, after scipy's, which cuts ``int(proportion * n)``: the proportion asked for is ``(cut + 0.25) / n``,
    so that rounding cannot cut one fewer)."""
    n = len(rows)
    if not 0 <= 2 * cut < n:
        raise ValueError(f"a trimmed mean of {n} values cannot cut {cut} at each end")
    return np.asarray(trim_mean(np.asarray(rows), (cut + 0.25) / n))


def _as_contents(rows: np.ndarray) -> list[RecordDict]:
    return [RecordDict({"arrays": ArrayRecord({"model": Array(np.ascontiguousarray(row))})}) for row in rows]


def multi_krum(rows: np.ndarray, byzantine: int, select: int) -> list[int]:
    """Multi-Krum's choice (Flower's ``select_multikrum``): the ``select`` rows with the lowest Krum scores, each the
    sum of the squared distances to the row's ``n - f - 2`` nearest others (at least one).  Returns row indices,
    sorted."""
    contents = _as_contents(rows)
    chosen = select_multikrum(contents, num_malicious_nodes=byzantine, num_nodes_to_select=select)
    index = {id(c): i for i, c in enumerate(contents)}
    return sorted(index[id(c)] for c in chosen)


def krum_order(rows: np.ndarray, byzantine: int) -> list[int]:
    """Every row's index, from the lowest Krum score to the highest (Flower's ``select_multikrum`` asked for all)."""
    contents = _as_contents(rows)
    index = {id(c): i for i, c in enumerate(contents)}
    return [
        index[id(c)] for c in select_multikrum(contents, num_malicious_nodes=byzantine, num_nodes_to_select=len(rows))
    ]


def bulyan(rows: np.ndarray, byzantine: int) -> tuple[np.ndarray, list[int]]:
    """Bulyan (El Mhamdi et al. 2018, Alg. 1 with Krum): ``theta = n - 2f`` rows chosen one at a time, each the Krum
    choice (``select_multikrum`` asked for one row, with ``f``) among the rows not chosen yet; then, per coordinate,
    the mean of the ``beta = theta - 2f`` chosen values closest to the chosen values' median.  Needs ``n >= 4f + 3``.
    Returns (the aggregate, the chosen row indices, sorted)."""
    n = len(rows)
    if n < 4 * byzantine + 3 and byzantine > 0:
        raise ValueError(f"Bulyan needs n >= 4f + 3 models: {n} models cannot tolerate f={byzantine}")
    contents = _as_contents(rows)
    index = {id(c): i for i, c in enumerate(contents)}
    left, chosen = list(contents), []
    for _ in range(n - 2 * byzantine):
        (best,) = select_multikrum(left, num_malicious_nodes=byzantine, num_nodes_to_select=1)
        chosen.append(index[id(best)])
        left = [c for c in left if c is not best]
    picked = [[rows[i]] for i in chosen]
    median = [np.median(np.stack([p[0] for p in picked]), axis=0)]
    (out,) = aggregate_n_closest_weights(median, picked, len(chosen) - 2 * byzantine)
    return np.asarray(out), sorted(chosen)


def bounded_updates(rows: np.ndarray, reference: np.ndarray, bound: float) -> tuple[np.ndarray, np.ndarray]:
    """(each row's update ``row - reference`` scaled to L2 norm at most ``bound``, every update's norm)."""
    deltas = np.asarray(rows, dtype=np.float64) - np.asarray(reference, dtype=np.float64)[None, :]
    norms = np.sqrt(np.einsum("ij,ij->i", deltas, deltas))
    scale = np.ones_like(norms)
    over = norms > bound
    scale[over] = bound / norms[over]
    return deltas * scale[:, None], norms


def norm_bound_of(norms: np.ndarray, options: RobustOptions) -> float:
    """The bound of one average: ``norm-bound``, or with 0 ``norm-bound-multiple`` times the median of its updates'
    norms."""
    return float(options.norm_bound or options.norm_bound_multiple * np.median(norms))


def fltrust(rows: np.ndarray, reference: np.ndarray, server_update: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """FLTrust (Cao et al. 2021, Alg. 1 lines 8-12): every update ``g_i = row - reference`` gets the trust score
    ``max(0, cos(g_i, g_0))`` against the server's update ``g_0``, is scaled to the norm of ``g_0``, and the aggregate
    is ``reference`` plus the trust-weighted mean of the scaled updates (``reference`` itself when no update has a
    positive score).  An update of norm 0 has no direction and scores 0.  Returns (the aggregate, the trust scores)."""
    reference = np.asarray(reference, dtype=np.float64)
    g0 = np.asarray(server_update, dtype=np.float64)
    deltas = np.asarray(rows, dtype=np.float64) - reference[None, :]
    norms = np.sqrt(np.einsum("ij,ij->i", deltas, deltas))
    norm0 = float(np.sqrt(g0 @ g0))
    trust = np.zeros(len(rows))
    live = norms > 0
    if norm0 > 0:
        trust[live] = np.maximum(0.0, (deltas[live] @ g0) / (norms[live] * norm0))
    if trust.sum() <= 0:
        return reference.copy(), trust
    scaled = deltas[live] * (norm0 / norms[live])[:, None]
    return reference + (trust[live] @ scaled) / trust.sum(), trust


def aggregate_rows(
    rows: np.ndarray,
    weights: Sequence[float] | np.ndarray | None,
    options: RobustOptions,
    reference: np.ndarray | None = None,
    server_update: np.ndarray | None = None,
) -> tuple[np.ndarray, Outcome]:
    """The rule ``options.aggregator`` over the rows (n x d), with the method's ``weights`` (None: uniform) where the
    rule has weights (capped by ``weight-cap``), ``reference`` (the model the server sent) for norm-bound and FLTrust,
    and ``server_update`` (the server's own update on its root data set, as a row) for FLTrust."""
    rows = np.asarray(rows, dtype=np.float64)
    n, rule = len(rows), options.aggregator
    if n == 0:
        raise ValueError("an aggregate needs at least one model")
    w = _weights(n, weights)
    outcome = Outcome(rule, n, tolerated=options.tolerated(n))
    if rule == "mean":
        outcome.weights = w.tolist()
        return w @ rows, outcome
    if rule == "median":
        return coordinate_median(rows), outcome
    if rule == "trimmed-mean":
        return trimmed_mean(rows, options.trimmed(n)), outcome
    if rule == "multi-krum":
        kept = multi_krum(rows, options.byzantine(n), options.selected(n))
        kept_weights = capped_weights(w[kept], options.weight_cap)
        outcome.selected, outcome.weights = kept, kept_weights.tolist()
        return kept_weights @ rows[kept], outcome
    if rule == "bulyan":
        out, outcome.selected = bulyan(rows, options.bulyan_byzantine(n))
        return out, outcome
    if rule not in ("norm-bound", "fltrust"):
        raise ValueError(f"unknown aggregator {rule!r}")
    if reference is None:
        raise ValueError(f"{rule} needs the model the server sent (the reference of the updates)")
    if rule == "norm-bound":
        norms = bounded_updates(rows, reference, np.inf)[1]
        bound = norm_bound_of(norms, options)
        deltas, _ = bounded_updates(rows, reference, bound)
        capped = capped_weights(w, options.weight_cap)
        outcome.norms, outcome.bound, outcome.weights = [float(x) for x in norms], bound, capped.tolist()
        outcome.clipped = [int(i) for i in np.flatnonzero(norms > bound)]
        return np.asarray(reference, dtype=np.float64) + capped @ deltas, outcome
    if server_update is None:
        raise ValueError("fltrust needs the server's own update on its root data set")
    out, trust = fltrust(rows, reference, server_update)
    outcome.trust = [float(t) for t in trust]
    return out, outcome


def _integer_rule(
    values: np.ndarray, options: RobustOptions, outcome: Outcome, reference: np.ndarray | None
) -> np.ndarray:
    """An integer array's aggregate (``values``: n x ...) under the rule of the floating arrays."""
    values = values.astype(np.float64)
    rule = options.aggregator
    if rule == "median":
        return np.median(values, axis=0)
    if rule == "trimmed-mean":
        return trimmed_mean(values.reshape(len(values), -1), options.trimmed(len(values))).reshape(values.shape[1:])
    if rule == "fltrust":
        trust = np.asarray(outcome.trust)
        if trust.sum() > 0:
            return np.tensordot(trust / trust.sum(), values, axes=1)
        return reference.astype(np.float64) if reference is not None else values.mean(axis=0)
    kept = outcome.selected if outcome.selected is not None else list(range(len(values)))
    w = np.asarray(outcome.weights) if outcome.weights is not None else np.full(len(kept), 1.0 / len(kept))
    return np.tensordot(w, values[kept], axes=1)


def flat(state: Mapping[str, np.ndarray], keys: Sequence[str]) -> np.ndarray:
    """The arrays ``keys`` of a model, flattened into one float64 row (in that order)."""
    return np.concatenate([np.asarray(state[k], dtype=np.float64).ravel() for k in keys] or [np.zeros(0)])


def floating_keys(state: Mapping[str, np.ndarray]) -> list[str]:
    return [k for k in state if np.issubdtype(np.asarray(state[k]).dtype, np.floating)]


def aggregate_states(
    states: Sequence[Mapping[str, np.ndarray]],
    weights: Sequence[float] | np.ndarray | None,
    options: RobustOptions,
    reference: Mapping[str, np.ndarray] | None = None,
    server_model: Mapping[str, np.ndarray] | None = None,
) -> tuple[dict[str, np.ndarray], Outcome]:
    """:func:`aggregate_rows` on models given as state dicts with the same keys (each array keeps its dtype and
    shape; integer arrays see the module docstring); ``server_model`` is FLTrust's model trained on the root data
    set from ``reference``."""
    if not states:
        raise ValueError("an aggregate needs at least one model")
    keys = list(states[0])
    floating = floating_keys(states[0])
    rows = np.stack([flat(s, floating) for s in states])
    ref = flat(reference, floating) if reference is not None else None
    update = flat(server_model, floating) - ref if server_model is not None and ref is not None else None
    out_flat, outcome = aggregate_rows(rows, weights, options, ref, update)
    out: dict[str, np.ndarray] = {}
    pos = 0
    for k in keys:
        like = np.asarray(states[0][k])
        if k in floating:
            out[k] = out_flat[pos : pos + like.size].reshape(like.shape).astype(like.dtype)
            pos += like.size
        else:
            stacked = np.stack([np.asarray(s[k]) for s in states])
            own = np.asarray(reference[k]) if reference is not None and k in reference else None
            out[k] = np.rint(_integer_rule(stacked, options, outcome, own)).astype(like.dtype)
    return out, outcome


def bounded_model(
    model: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray], bound: float
) -> tuple[dict[str, np.ndarray], float]:
    """One model kept within L2 distance ``bound`` of ``reference`` over its floating arrays (integer arrays as they
    are): ``reference + clip(model - reference, bound)``, and the distance it had."""
    floating = floating_keys(model)
    row, ref = flat(model, floating), flat(reference, floating)
    delta, norms = bounded_updates(row[None, :], ref, bound)
    flat_out = ref + delta[0]
    out = {k: np.array(v) for k, v in model.items()}
    pos = 0
    for k in floating:
        like = np.asarray(model[k])
        out[k] = flat_out[pos : pos + like.size].reshape(like.shape).astype(like.dtype)
        pos += like.size
    return out, float(norms[0])


def distance(model: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> float:
    """The L2 distance between two models over the floating arrays."""
    floating = floating_keys(model)
    return float(np.linalg.norm(flat(model, floating) - flat(reference, floating)))


def peers_kept(models: Sequence[Mapping[str, np.ndarray]], options: RobustOptions) -> tuple[list[int], Outcome]:
    """FedC2I under ``multi-krum``: which of the ``k`` models one client receives (its own first) it mixes: its own,
    and the ``k - 1 - f`` others with the lowest Krum scores among all ``k`` (``f`` of the ``k``; ``krum-select``, when
    set, is how many it mixes in all).  Returns (the kept indices, sorted, 0 first; the rule's outcome)."""
    k = len(models)
    outcome = Outcome("multi-krum", k, tolerated=options.tolerated(k))
    if k == 1:
        outcome.selected = [0]
        return [0], outcome
    floating = floating_keys(models[0])
    rows = np.stack([flat(m, floating) for m in models])
    wanted = min(k, options.krum_select) if options.krum_select else k - options.byzantine(k)
    others = [i for i in krum_order(rows, options.byzantine(k)) if i != 0]
    kept = sorted([0, *others[: max(0, wanted - 1)]])
    outcome.selected = kept
    return kept, outcome


class RootUpdate:
    """FLTrust's server side: the root data set (``fltrust-root`` or drawn from the embedded data set, see
    :func:`root_data`) and the server's own update on it, trained from a model as a client trains (the run's
    optimizer, learning rate, batch size and local epochs)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._data: tuple[Any, Any] | None = None
        self._model: Any = None
        self._initial: dict[str, Any] = {}

    def data(self, num_partitions: int) -> tuple[Any, Any]:
        if self._data is None:
            self._data = root_data(self.settings, num_partitions)
        return self._data

    def trained(self, start: Mapping[str, np.ndarray], num_partitions: int, server_round: int) -> dict[str, np.ndarray]:
        """The model ``start`` after local training on the root data set (seeded by the run and the round)."""
        from task.models import build_model
        from task.params import load_record
        from task.train import train

        s = self.settings
        if self._model is None:
            self._model = build_model(s.model, s.in_channels, s.image_size, s.num_classes, seed=s.seed)
            self._initial = {k: v.detach().clone() for k, v in self._model.state_dict().items()}
        model = self._model
        model.load_state_dict(self._initial)  # arrays ``start`` lacks (none for a whole model) start fresh
        load_record(model, {k: np.asarray(v) for k, v in start.items()})  # names an array the model does not have
        x, y = self.data(num_partitions)
        train(
            model,
            x,
            y,
            epochs=s.local_epochs,
            batch_size=s.batch_size,
            lr=s.lr,
            momentum=s.momentum,
            weight_decay=s.weight_decay,
            seed=s.seed * 1_000_003 + server_round * 7_919 + 41,
            optimizer=s.optimizer,
        )
        state = model.state_dict()
        return {k: state[k].detach().cpu().numpy().astype(np.asarray(start[k]).dtype) for k in start}


def root_data(settings: Settings, num_partitions: int) -> tuple[Any, Any]:
    """FLTrust's root data set as tensors (x, y): the operator's ``fltrust-root`` file (arrays ``x`` and ``y``), or
    ``fltrust-root-size`` examples drawn (seeded by the run) from the originals of the embedded data set that lie in
    some client's training split, never in a validation or test split, so no score a client reports is on an example
    the server trained on.  Cao et al. draw the root set from the clients' training data in the same way; in a
    deployment the operator collects it (``fltrust-root``)."""
    import torch

    path = settings.robust.fltrust_root
    if path:
        try:
            with np.load(path, allow_pickle=False) as z:
                x, y = np.asarray(z["x"], dtype=np.float32), np.asarray(z["y"], dtype=np.int64)
        except (OSError, KeyError, ValueError) as err:
            raise ValueError(f"fltrust-root={path!r} must be an .npz file with arrays 'x' and 'y': {err}") from err
        if len(x) != len(y) or len(y) == 0:
            raise ValueError(f"fltrust-root={path!r} holds {len(x)} inputs and {len(y)} labels; it needs as many")
        return torch.from_numpy(x), torch.from_numpy(y)
    from task.data.clients import split_indices
    from task.data.partitioners import partitioner_for

    _, data = partitioner_for(settings.data, num_partitions)
    trains = [split_indices(settings.data, p, num_partitions).train for p in range(num_partitions)]
    pool = np.unique(np.concatenate(trains))
    pool = pool[pool < data.originals]
    rng = np.random.default_rng([int(settings.seed), 41])
    idx = np.sort(rng.choice(pool, size=min(settings.robust.fltrust_root_size, len(pool)), replace=False))
    return torch.from_numpy(np.ascontiguousarray(data.x[idx], dtype=np.float32)), torch.from_numpy(data.y[idx])


class RobustAveraging:
    """The run's aggregation rule wherever a method averages client models (docs/robustness.md): the strategy's part
    ``self.robust``.  What the rule did goes into the round in progress of ``history`` (the strategy's list of rounds,
    the same object); ``client_of`` (node id -> client id, the reply gate's) tells FLTrust how many partitions there
    are."""

    def __init__(self, settings: Settings, history: list[Any], client_of: Mapping[int, int]) -> None:
        self.settings = settings
        self.history = history
        self.client_of = client_of
        #: FLTrust's server side: its root data set and model, built when first used
        self.root = RootUpdate(settings)

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
        server sent them (the reference of norm-bound and FLTrust).  What the rule did goes into the round's
        ``robust`` entry as ``group``."""
        if self.settings.robust.aggregator == "mean":
            return weighted_average(list(models), weights)
        server_model = self._server_model(reference) if self.settings.robust.aggregator == "fltrust" else None
        out, outcome = aggregate_states(models, weights, self.settings.robust, reference, server_model)
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
        """:meth:`average_models` on models flattened into the rows of a matrix (``weights`` None: uniform); not for
        FLTrust, whose server trains a model (methods that average rows refuse it)."""
        out, outcome = aggregate_rows(rows, weights, self.settings.robust, reference)
        if outcome.rule != "mean":
            self._note_rule(group, clients, outcome)
        return out

    def bound_models(
        self, models: Mapping[int, Mapping[str, np.ndarray]], references: Mapping[int, Mapping[str, np.ndarray]]
    ) -> dict[int, dict[str, np.ndarray]]:
        """Each client's ``model`` as a method keeps it: unchanged, or under ``aggregator='norm-bound'`` within the
        bound of its own ``references[client]`` (FedC2I's forwarded models); the bound is ``norm-bound``, or with 0 the
        multiple of the median of this round's distances."""
        if self.settings.robust.aggregator != "norm-bound":
            return {c: {k: np.array(v) for k, v in m.items()} for c, m in models.items()}
        norms = {c: distance(m, references[c]) for c, m in models.items()}
        bound = norm_bound_of(np.array(list(norms.values())), self.settings.robust)
        out = {c: bounded_model(m, references[c], bound)[0] for c, m in models.items()}
        for c in models:
            outcome = Outcome("norm-bound", 1, clipped=[0] if norms[c] > bound else [], norms=[norms[c]], bound=bound)
            self._note_rule(f"client {c}", [c], outcome)
        return out

    def choose_peers(self, models: Sequence[Mapping[str, np.ndarray]], clients: Sequence[int], group: str) -> list[int]:
        """FedC2I under ``multi-krum``: which of the models one client receives (its own first) it mixes
        (:func:`peers_kept`), as client ids; every one under any other rule."""
        if self.settings.robust.aggregator != "multi-krum":
            return list(clients)
        kept, outcome = peers_kept(models, self.settings.robust)
        self._note_rule(group, clients, outcome)
        return [clients[i] for i in kept]

    def _server_model(self, reference: Mapping[str, np.ndarray] | None) -> dict[str, np.ndarray]:
        """FLTrust: the server's model trained on its root data set from ``reference``."""
        if reference is None:
            raise ValueError("fltrust needs the model the server sent (the reference of the updates)")
        known = set(self.client_of.values())
        server_round = self.history[-1].server_round if self.history else 0
        return self.root.trained(reference, max(known, default=0) + 1, server_round)

    def _note_rule(self, group: str, clients: Sequence[int], outcome: Outcome) -> None:
        """What the rule did with one average, by client id, into the round's ``robust`` history entry; under an
        injected attack also how many of the ``clients`` lie this round, and whether that is more than the rule's
        guarantee allows (``outside-assumption``)."""
        if not self.history:
            return
        entry: dict[str, Any] = {"group": group, "rule": outcome.rule, "clients": [int(c) for c in clients]}
        if outcome.selected is not None:
            entry["selected"] = [int(clients[i]) for i in outcome.selected]
        if outcome.clipped is not None:
            entry["clipped"] = [int(clients[i]) for i in outcome.clipped]
            entry["update-norms"] = [round(x, 6) for x in outcome.norms]
            entry["bound"] = round(float(outcome.bound), 6) if outcome.bound is not None else None
        if outcome.trust is not None:
            entry["trust"] = [round(x, 6) for x in outcome.trust]
        if outcome.weights is not None and outcome.rule != "mean":
            entry["weights"] = [round(x, 6) for x in outcome.weights]
        attacks = self.settings.attacks
        if attacks.active:
            server_round = self.history[-1].server_round
            liars = sum(attacking(attacks, int(c), server_round) for c in clients)
            entry["liars"] = liars
            if outcome.tolerated is not None:
                entry["tolerated"] = outcome.tolerated
                entry["outside-assumption"] = liars > outcome.tolerated
        self.history[-1].extra.setdefault("robust", []).append(entry)

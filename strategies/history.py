"""The run's history: one :class:`~strategies.outcome.RoundLog` per round (``rounds.json`` / ``rounds.csv``), the
round's metric means over the replies, what the server spent on it, and the lines logged about it."""

from __future__ import annotations

import resource
import time
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

import numpy as np

from strategies.outcome import RoundLog

#: the train metrics averaged over a round's replies (``time-*`` and ``peak-rss-mb`` also as their maximum)
TRAIN_MEANS = ("train-loss", "train-acc", "trained-acc", "time-train", "time-method")
TRAIN_MAXIMA = ("time-train", "time-method", "peak-rss-mb")
#: the evaluation metrics averaged over a round's replies, plainly and weighted by training examples, and spread
#: over the clients that replied (:func:`spread_metrics`)
EVALUATION_MEANS = ("personal-acc", "personal-loss", "global-acc", "global-loss")


class Measured(Protocol):
    """A reply as the means read it (:class:`strategies.replies.Reply`)."""

    num_examples: int
    metrics: dict[str, Any]


def mean_metrics(updates: Sequence[Measured], keys: Iterable[str], weighted: bool = False) -> dict[str, float]:
    """The mean of each of ``keys`` over the replies that carry it (weighted by training examples)."""
    out = {}
    for key in keys:
        values = [(float(u.metrics[key]), u.num_examples) for u in updates if key in u.metrics]
        if values:
            v, w = np.array(values).T
            out[key] = float(np.average(v, weights=w)) if weighted and w.sum() > 0 else float(v.mean())
    return out


def spread_metrics(updates: Sequence[Measured], keys: Iterable[str]) -> dict[str, float]:
    """How unequal the clients are in each of ``keys`` (over the replies that carry it): ``-std`` (over clients),
    the worst client (``-min`` of an accuracy, ``-max`` of a loss) and the bound of the worst tenth of clients
    (``-p10`` of an accuracy, ``-p90`` of a loss; numpy's linear percentile)."""
    out = {}
    for key in keys:
        values = np.array([float(u.metrics[key]) for u in updates if key in u.metrics])
        if values.size:
            loss = key.endswith("-loss")
            out[f"{key}-std"] = float(values.std())
            out[f"{key}-max" if loss else f"{key}-min"] = float(values.max() if loss else values.min())
            out[f"{key}-p90" if loss else f"{key}-p10"] = float(np.percentile(values, 90 if loss else 10))
    return out


def train_metrics(updates: Sequence[Measured], asked: int | None = None, private: bool = False) -> dict[str, float]:
    """A round's train means, the maxima of its timings and memory, its number of valid replies and of the nodes
    asked for one (``num-asked``, where known): how many clients the means speak for, of how many.  Under DP
    (``private``) the means only: a maximum is one client's value, and the counts say how many clients were in the
    round, which Poisson sampling does not release (docs/privacy.md, "What a DP run publishes")."""
    metrics = mean_metrics(updates, TRAIN_MEANS)
    if private:
        return metrics
    for key in TRAIN_MAXIMA:
        values = [float(u.metrics[key]) for u in updates if key in u.metrics]
        if values:
            metrics[f"{key}-max"] = max(values)
    metrics["num-replies"] = len(updates)
    if asked is not None:
        metrics["num-asked"] = asked
    return metrics


def evaluation_metrics(
    updates: Sequence[Measured], asked: int | None = None, private: bool = False, counted: bool = True
) -> dict[str, float]:
    """A round's evaluation means, plain and ``-weighted``, their spread over clients, its number of valid replies
    and of the nodes asked for one (``num-asked``, where known).  Under DP (``private``) the plain means only (the
    spread's extremes are single clients' values, the weights their un-noised sizes), with the counts unless
    ``counted`` is False."""
    metrics = mean_metrics(updates, EVALUATION_MEANS)
    if not private:
        metrics.update({f"{k}-weighted": v for k, v in mean_metrics(updates, EVALUATION_MEANS, weighted=True).items()})
        metrics.update(spread_metrics(updates, EVALUATION_MEANS))
    if counted:
        metrics["num-replies"] = len(updates)
        if asked is not None:
            metrics["num-asked"] = asked
    return metrics


def over(metrics: dict[str, float]) -> str:
    """`` over k of N clients`` when a round's means speak for fewer clients than were asked (``num-replies`` <
    ``num-asked``), else ""."""
    replied, asked = metrics.get("num-replies"), metrics.get("num-asked")
    if replied is None or asked is None or replied >= asked:
        return ""
    return f" over {int(replied)} of {int(asked)} clients"


def accuracies(metrics: dict[str, float]) -> str:
    """``personal-acc 0.9, global-acc 0.8`` for the accuracies ``metrics`` has ("" when none), and over how many of
    the clients asked when that is fewer than all (:func:`over`)."""
    said = ", ".join(f"{k} {metrics[k]:.4f}" for k in ("personal-acc", "global-acc") if k in metrics)
    return said + over(metrics) if said else ""


def progress_line(
    name: str, server_round: int, last_round: int, rounds_run: int, started: float, metrics: dict[str, float], how: str
) -> str:
    """The line logged after a round: its accuracies (or ``how`` it was evaluated when it has none), seconds per
    round over the ``rounds_run`` rounds this process ran since ``started`` (monotonic), and the time left."""
    per_round = (time.monotonic() - started) / max(rounds_run, 1)
    eta = per_round * (last_round - server_round)
    return (
        f"[{name}] round {server_round}/{last_round} done: {accuracies(metrics) or how} | "
        f"{per_round:.1f} s/round, ETA {eta:.0f} s"
    )


def record_evaluation(
    rounds: Sequence[RoundLog],
    client_eval: dict[int, dict[str, float]],
    server_round: int,
    updates: Sequence[Any],
    asked: int | None = None,
    private: bool = False,
    counted: bool = True,
) -> dict[str, float]:
    """Round ``server_round``'s evaluation replies (:class:`strategies.replies.Reply`; ``asked``: the nodes asked for
    one): each client's last numeric metrics into ``client_eval`` (client id -> metrics; under DP, ``private``, the
    client id only: no single client's value is kept), the round's :func:`evaluation_metrics` into its
    :class:`RoundLog`, which it returns."""
    for u in updates:
        client_eval[u.client] = (
            {} if private else {k: float(v) for k, v in u.metrics.items() if isinstance(v, (int, float))}
        )
    metrics = evaluation_metrics(updates, asked, private, counted)
    next(r for r in rounds if r.server_round == server_round).evaluate = metrics
    return metrics


def late_evaluation_line(name: str, server_round: int, metrics: dict[str, float]) -> str:
    """The line logged when round ``server_round``'s evaluation came with the next round's train replies."""
    evaluated = accuracies(metrics) or "no evaluation replies"
    return f"[{name}] round {server_round} evaluated (with round {server_round + 1}'s train replies): {evaluated}"


def add_seconds(rounds: Sequence[RoundLog], seconds: float, key: str = "server-seconds") -> None:
    """Add ``seconds`` to the round in progress's ``key`` (default: ``server-seconds``, the server's own work);
    nothing before the first round."""
    if rounds:
        extra = rounds[-1].extra
        extra[key] = extra.get(key, 0.0) + seconds


def note_timing(rounds: Sequence[RoundLog], phase: str, timing: dict[str, float] | None) -> None:
    """Where the time of ``phase``'s messages went (:mod:`strategies.message_timing`), into the round in
    progress's ``message-timing`` (nothing when no reply carried stamps, or before the first round)."""
    if timing and rounds:
        rounds[-1].extra.setdefault("message-timing", {})[phase] = timing


def close_round(entry: RoundLog, comm: dict[str, int], seconds: float) -> None:
    """A round's last entries: its bytes per phase and direction (``comm``), its wall-clock ``seconds`` and the
    server's peak resident memory so far."""
    entry.extra["comm"] = comm
    entry.extra["seconds"] = seconds
    entry.extra["server-peak-rss-mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0

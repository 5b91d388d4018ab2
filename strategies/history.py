"""The run's history: one :class:`RoundLog` per round (``rounds.json`` / ``rounds.csv``), the round's metric
means over the replies, and the progress line logged after every round."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np

#: the train metrics averaged over a round's replies (``time-*`` and ``peak-rss-mb`` also as their maximum)
TRAIN_MEANS = ("train-loss", "train-acc", "trained-acc", "time-train", "time-method")
TRAIN_MAXIMA = ("time-train", "time-method", "peak-rss-mb")
#: the evaluation metrics averaged over a round's replies, plainly and weighted by training examples
EVALUATION_MEANS = ("personal-acc", "personal-loss", "global-acc", "global-loss")


@dataclass
class RoundLog:
    """One round: the train and evaluate means, and anything else the round recorded (``extra``)."""

    server_round: int
    train: dict[str, float] = field(default_factory=dict)
    evaluate: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


class Measured(Protocol):
    """A reply as the means read it (:class:`strategies.gate.Reply`)."""

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


def train_metrics(updates: Sequence[Measured]) -> dict[str, float]:
    """A round's train means, the maxima of its timings and memory, and its number of valid replies."""
    metrics = mean_metrics(updates, TRAIN_MEANS)
    for key in TRAIN_MAXIMA:
        values = [float(u.metrics[key]) for u in updates if key in u.metrics]
        if values:
            metrics[f"{key}-max"] = max(values)
    metrics["num-replies"] = len(updates)
    return metrics


def evaluation_metrics(updates: Sequence[Measured]) -> dict[str, float]:
    """A round's evaluation means, plain and ``-weighted``, and its number of valid replies."""
    metrics = mean_metrics(updates, EVALUATION_MEANS)
    metrics.update({f"{k}-weighted": v for k, v in mean_metrics(updates, EVALUATION_MEANS, weighted=True).items()})
    metrics["num-replies"] = len(updates)
    return metrics


def accuracies(metrics: dict[str, float]) -> str:
    """``personal-acc 0.9 , global-acc 0.8`` for the accuracies ``metrics`` has ("" when none)."""
    return ", ".join(f"{k} {metrics[k]:.4f}" for k in ("personal-acc", "global-acc") if k in metrics)


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

"""What a run produced, as plain values: one :class:`RoundLog` per round and, at the end, a :class:`RunResults` the
strategy hands the results writer (``PersonalizedStrategy.results()``; server_app/results.py writes it and knows
nothing of the strategy).  Nothing here imports the strategy or its parts."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: the evaluation metric honest clients add under ``attack='backdoor'`` (strategies/attack_report.py)
BACKDOOR = "backdoor-success"
#: the numbers of a newcomer's reply the run's summary reports (means over the held-out clients)
NEWCOMER_METRICS = ("newcomer-acc", "newcomer-finetuned-acc", "newcomer-loss", "newcomer-finetuned-loss")


@dataclass
class RoundLog:
    """One round: the train and evaluate means, and anything else the round recorded (``extra``)."""

    server_round: int
    train: dict[str, float] = field(default_factory=dict)
    evaluate: dict[str, float] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class PrivacySpent:
    """Under differential privacy: the (epsilon, delta) of every release made (delta is the run's ``dp-delta``), the
    neighbouring relation it holds for, the accountant that gave it, the noise multiplier, and how a central round
    draws its clients (None under local DP)."""

    epsilon: float
    neighbours: str
    accountant: str
    noise_multiplier: float | None
    sampling: str | None = None


def _no_artifacts(folder: Path) -> None:
    """A method without files of its own writes none."""


@dataclass
class RunResults:
    """Everything the results folder shows of a run: the rounds (``history``), each trained client's last evaluation
    (``client_eval``; under DP its id with no value), the rejected replies and silent nodes (``failures``), each
    held-out client's newcomer scores and their means, the robustness record (``robustness``: empty without an attack
    or a robust rule), a clustering method's ``(clusters at the end, what a single cluster meant)``, the privacy
    spent (None without DP), and the method's own files (``write_artifacts(folder)``)."""

    history: list[RoundLog]
    client_eval: dict[int, dict[str, float]] = field(default_factory=dict)
    failures: list[dict[str, Any]] = field(default_factory=list)
    newcomers: dict[int, dict[str, float]] = field(default_factory=dict)
    newcomer_means: dict[str, float] = field(default_factory=dict)
    robustness: dict[str, Any] = field(default_factory=dict)
    clustering: tuple[int, str] | None = None
    privacy: PrivacySpent | None = None
    write_artifacts: Callable[[Path], None] = _no_artifacts

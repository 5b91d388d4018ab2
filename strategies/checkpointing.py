"""What a checkpoint holds of a strategy and how it comes back: :class:`Checkpoint`, the strategy's part
``self.checkpoint``.  It assembles the base's state (each part's ``state()``) and the method's ``state()`` as plain
data, hands it to :mod:`strategies.persistence` (files only) after each round, and takes it back on resume."""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from strategies.gate import ReplyGate
from strategies.newcomers import Holdout
from strategies.outcome import RoundLog
from strategies.persistence import after_round, stop_if_asked
from strategies.privacy import ServerPrivacy
from strategies.schedule import EvaluationSchedule
from task.config import Settings


class Checkpointed(Protocol):
    """What a checkpoint reads and restores of a strategy (:class:`strategies.base.PersonalizedStrategy`)."""

    settings: Settings
    history: list[RoundLog]
    client_eval: dict[int, dict[str, float]]
    rng: random.Random
    privacy: ServerPrivacy
    gate: ReplyGate
    schedule: EvaluationSchedule
    holdout: Holdout
    results_dir: Path | None
    rounds_done: int
    identify_everyone: bool
    global_state: dict[str, np.ndarray]

    def state(self) -> dict[str, Any]: ...
    def restore(self, state: Mapping[str, Any]) -> None: ...
    def server_models(self) -> dict[str, dict[str, np.ndarray]]: ...


class Checkpoint:
    """``state`` / ``resume`` / ``after_round`` of a strategy's checkpoint."""

    def __init__(self, strategy: Checkpointed) -> None:
        self.strategy = strategy

    def state(self) -> dict[str, Any]:
        """What a checkpoint holds, as plain data: the base's part (history, each client's last evaluation, the
        cohort generator's state (none under DP), the global model, and each part's own ``state()``) and the
        method's."""
        s = self.strategy
        base: dict[str, Any] = {"history": [asdict(r) for r in s.history], "client-eval": s.client_eval}
        # under DP the cohorts come from the operating system's CSPRNG, which has no state to keep
        rng = None if isinstance(s.rng, random.SystemRandom) else s.rng.getstate()
        base |= {"rng": rng, "global": s.global_state, "dp": s.privacy.state()}
        return {"base": base | s.gate.state() | s.schedule.state() | s.holdout.state(), "method": s.state()}

    def resume(self, saved: Mapping[str, Any], rounds_done: int) -> None:
        """Take back :meth:`state` (into a strategy freshly built from the same settings) to continue after round
        ``rounds_done``; node ids change between runs, so every node is asked who it is before the next round."""
        s, base = self.strategy, saved["base"]
        s.history[:] = [RoundLog(**r) for r in base["history"]]  # the same list: the parts share it
        s.client_eval = dict(base["client-eval"])
        rng = base["rng"]  # the generator's state; a checkpoint of an older format holds the generator itself
        if rng is not None and not isinstance(s.rng, random.SystemRandom):
            s.rng.setstate(rng if isinstance(rng, tuple) else rng.getstate())
        s.global_state = base["global"]
        s.gate.restore(base)
        s.schedule.restore(base)
        s.holdout.restore(base)
        if "dp" in base:  # a checkpoint from before it existed: the settings' noise multiplier and clip bound
            s.privacy.restore(base["dp"], rounds_done)
        s.restore(saved["method"])
        s.rounds_done, s.identify_everyone = rounds_done, True

    def after_round(self, server_round: int) -> None:
        """The server's models and the checkpoint when due (its seconds into the history), then ``stop-after``."""
        s = self.strategy
        models = s.server_models if s.schedule.saves_models(server_round) else None
        last = s.schedule.last_round
        seconds = after_round(s.results_dir, s.settings, server_round, last, models, self.state)
        if seconds is not None:
            s.history[-1].extra["checkpoint-seconds"] = seconds
        stop_if_asked(s.settings, server_round, last, s.results_dir)

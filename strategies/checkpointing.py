"""What a checkpoint holds of a strategy and how it comes back (:class:`Checkpointing`, a part of
``PersonalizedStrategy``): the base assembles its own state with the method's ``state()`` as plain data, hands it to
:mod:`strategies.persistence` (files only) after each round, and takes it back on resume."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from strategies.gate import ReplyGate
from strategies.newcomers import Holdout
from strategies.outcome import RoundLog
from strategies.persistence import after_round, stop_if_asked
from strategies.privacy import ServerPrivacy
from strategies.schedule import EvaluationSchedule
from task.config import Settings


class Checkpointing:
    """``checkpoint_state`` / ``resume`` / ``after_round`` of ``PersonalizedStrategy``."""

    settings: Settings
    history: list[RoundLog]
    client_eval: dict[int, dict[str, float]]
    rng: random.Random
    dp: ServerPrivacy
    gate: ReplyGate
    schedule: EvaluationSchedule
    holdout: Holdout
    results_dir: Path | None
    rounds_done: int
    identify_everyone: bool
    global_state: dict[str, np.ndarray]
    state: Callable[[], dict[str, Any]]
    restore: Callable[[Mapping[str, Any]], None]
    server_models: Callable[[], dict[str, dict[str, np.ndarray]]]

    def checkpoint_state(self) -> dict[str, Any]:
        """What a checkpoint holds, as plain data: the base's part (history, each client's last evaluation, the
        cohort generator's state (none under DP), the global model, and each part's own ``state()``) and the
        method's."""
        base: dict[str, Any] = {"history": [asdict(r) for r in self.history], "client-eval": self.client_eval}
        # under DP the cohorts come from the operating system's CSPRNG, which has no state to keep
        rng = None if isinstance(self.rng, random.SystemRandom) else self.rng.getstate()
        base |= {"rng": rng, "global": self.global_state, "dp": self.dp.state()}
        return {"base": base | self.gate.state() | self.schedule.state() | self.holdout.state(), "method": self.state()}

    def resume(self, saved: Mapping[str, Any], rounds_done: int) -> None:
        """Take back :meth:`checkpoint_state` (this strategy freshly built from the same settings) to continue after
        round ``rounds_done``; node ids change between runs, so every node is asked who it is before the next round."""
        base = saved["base"]
        self.history[:] = [RoundLog(**r) for r in base["history"]]  # the same list: the parts share it
        self.client_eval = dict(base["client-eval"])
        rng = base["rng"]  # the generator's state; a checkpoint of an older format holds the generator itself
        if rng is not None and not isinstance(self.rng, random.SystemRandom):
            self.rng.setstate(rng if isinstance(rng, tuple) else rng.getstate())
        self.global_state = base["global"]
        self.gate.restore(base)
        self.schedule.restore(base)
        self.holdout.restore(base)
        if "dp" in base:  # a checkpoint from before it existed: the settings' noise multiplier and clip bound
            self.dp.restore(base["dp"], rounds_done)
        self.restore(saved["method"])
        self.rounds_done, self.identify_everyone = rounds_done, True

    def after_round(self, server_round: int) -> None:
        """The server's models and the checkpoint when due (its seconds into the history), then ``stop-after``."""
        models = self.server_models if self.schedule.saves_models(server_round) else None
        last = self.schedule.last_round
        seconds = after_round(self.results_dir, self.settings, server_round, last, models, self.checkpoint_state)
        if seconds is not None:
            self.history[-1].extra["checkpoint-seconds"] = seconds
        stop_if_asked(self.settings, server_round, last, self.results_dir)

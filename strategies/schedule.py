"""The evaluation schedule: which rounds are evaluated, on which message an evaluation rides, when models are saved.

Every ``eval-every`` rounds and always in the last one, each evaluated client scores its personalized model
(and the global model, where the method has one).  Where every client trains in every round and is
evaluated (``fraction-train`` and ``fraction-evaluate`` 1) and the method allows it
(``evaluate_in_train``), round r's evaluation is **fused** into round r + 1's train messages: each client
evaluates the model it starts round r + 1 from (round r's result, before local training) in the same message
as its local update, so a round costs one message per client instead of two.  The last round always has an
evaluate phase of its own.  A method that trains only some clients per round, or settles something after
evaluation (PI-FL, FedSoft), keeps an evaluate phase in every evaluated round.

Models are saved (``save-models``) after the last round, every ``save-every`` rounds, and with ``save-best``
after every evaluated round (each client keeps only its best); a client saves its personalized model when the
message that evaluates it says ``save-model``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from task.config import Settings


class EvaluationSchedule:
    """When rounds are evaluated and models saved, and the evaluation waiting for the next train messages."""

    def __init__(self, settings: Settings, evaluate_in_train: bool) -> None:
        #: the run's last round (``num-server-rounds``; the strategy's ``start`` may set it)
        self.last_round = settings.num_rounds
        self.every = settings.eval_every
        self.fusable = evaluate_in_train and settings.fraction_train >= 1.0 and settings.fraction_evaluate >= 1.0
        self.save_models, self.save_every, self.save_best = (
            settings.save_models,
            settings.save_every,
            settings.save_best,
        )
        #: a round whose evaluation rides on the next round's train messages (0: none); part of the run's state
        self.pending = 0
        #: the round evaluated by the train replies of the round in progress (0: none)
        self.fused = 0

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps of the schedule: the evaluation waiting for the next round's train messages."""
        return {"pending-evaluation": self.pending}

    def restore(self, state: Mapping[str, Any]) -> None:
        self.pending = int(state["pending-evaluation"])

    def evaluates(self, server_round: int) -> bool:
        """Round ``server_round`` is evaluated: every ``eval-every`` rounds and always in the last one."""
        return server_round % self.every == 0 or server_round == self.last_round

    def rides_on_next_train(self, server_round: int) -> bool:
        """Round ``server_round``'s evaluation rides on round ``server_round + 1``'s train messages."""
        return self.fusable and server_round < self.last_round and self.evaluates(server_round)

    def has_evaluate_phase(self, server_round: int) -> bool:
        """Round ``server_round`` sends evaluate messages of its own."""
        return self.evaluates(server_round) and not self.rides_on_next_train(server_round)

    def how_evaluated(self, server_round: int) -> str:
        """What the progress line says of round ``server_round`` when it has no accuracies to show."""
        if self.rides_on_next_train(server_round):
            return "evaluated with the next round's train messages"
        return "no evaluation replies" if self.evaluates(server_round) else "not evaluated this round"

    def saves_models(self, server_round: int) -> bool:
        """Models are saved after ``server_round``."""
        return self.save_models and (
            server_round == self.last_round
            or bool(self.save_every and server_round % self.save_every == 0)
            or (self.save_best and self.evaluates(server_round))
        )

    def start_round(self) -> int:
        """A round's train messages are about to be built: the evaluation waiting for them (0: none)."""
        self.fused, self.pending = self.pending, 0
        return self.fused

    def defer(self, server_round: int) -> None:
        """Round ``server_round``'s evaluation waits for the next round's train messages."""
        self.pending = server_round

    def config(self, server_round: int, phase: str) -> dict[str, Any]:
        """What a message of ``phase`` in ``server_round`` says about evaluating and saving: ``evaluate`` and
        ``evaluate-round`` on a train message that carries the previous round's evaluation, ``save-model`` and
        ``save-best`` on a message whose evaluation is of a round after which models are saved."""
        cfg: dict[str, Any] = {}
        evaluated = self.fused if phase == "train" else (server_round if phase == "evaluate" else 0)
        if phase == "train" and self.fused:
            cfg["evaluate"] = True
            cfg["evaluate-round"] = self.fused
        if evaluated and self.saves_models(evaluated):
            cfg["save-model"] = True
            cfg["save-best"] = self.save_best
        return cfg

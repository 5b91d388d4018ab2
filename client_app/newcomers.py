"""A client that never took part in training (run-config ``holdout-clients``): what the method gives it and how
it scores (:class:`NewcomerScores`, a part of ``ClientMethod``; the server's side is strategies/newcomers.py)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from flwr.app import RecordDict
from torch import nn

from task.train import evaluate


class NewcomerScores:
    """The ``query.newcomer`` answer of ``ClientMethod``: :meth:`newcomer_model` is the hook a method overrides."""

    personal_model: Callable[[RecordDict], nn.Module]
    test_split: Callable[[], tuple[torch.Tensor, torch.Tensor]]
    fit: Callable[..., dict[str, float]]

    def newcomer_model(self, content: RecordDict) -> nn.Module:
        """The model this method gives a client that never took part in training, from the ``query.newcomer``
        message the server sends every held-out client after the last round (strategies/newcomers.py).  Default: the
        personalized model built from the message as an evaluation builds it, which for a client with no state of
        its own is the global model, or its own choice among the cluster or tier models the message brings."""
        return self.personal_model(content)

    def newcomer_evaluation(self, content: RecordDict) -> dict[str, float | int]:
        """``newcomer-acc`` (and loss): the model :meth:`newcomer_model` gives on this client's test split;
        ``newcomer-finetuned-acc`` (and loss): the same model after ``local-epochs`` of the run's local training on
        this client's training split (every parameter, the run's optimiser), as a newcomer would adapt it.  Nothing
        is kept: a held-out client never trains for the federation."""
        x, y = self.test_split()
        model = self.newcomer_model(content)
        loss, acc = evaluate(model, x, y)
        self.fit(model)
        tuned_loss, tuned_acc = evaluate(model, x, y)
        return {
            "newcomer-acc": acc,
            "newcomer-loss": loss,
            "newcomer-finetuned-acc": tuned_acc,
            "newcomer-finetuned-loss": tuned_loss,
            "test-examples": len(y),
        }

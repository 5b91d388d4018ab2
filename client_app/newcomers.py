"""A client that never took part in training (run-config ``holdout-clients``): how the model a method gives it
(``ClientMethod.newcomer_model``) scores, :func:`newcomer_scores` (the server's side is strategies/newcomers.py)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from task.train import evaluate


def newcomer_scores(
    model: nn.Module, x: torch.Tensor, y: torch.Tensor, fine_tune: Callable[[nn.Module], object]
) -> dict[str, float | int]:
    """``newcomer-acc`` (and loss): ``model`` on this client's test split ``(x, y)``; ``newcomer-finetuned-acc`` (and
    loss): the same model after ``fine_tune`` (the base passes its ``fit``: ``local-epochs`` of the run's local
    training on this client's training split, every parameter, the run's optimiser), as a newcomer would adapt it.
    Nothing is kept: a held-out client never trains for the federation."""
    loss, acc = evaluate(model, x, y)
    fine_tune(model)
    tuned_loss, tuned_acc = evaluate(model, x, y)
    return {
        "newcomer-acc": acc,
        "newcomer-loss": loss,
        "newcomer-finetuned-acc": tuned_acc,
        "newcomer-finetuned-loss": tuned_loss,
        "test-examples": len(y),
    }

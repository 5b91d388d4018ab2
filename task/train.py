"""The one training loop and the evaluation loop every method uses.

A method adds what is its own through small hooks instead of re-writing the loop:
``extra_loss(model, x, y, logits) -> tensor`` (FedProx's proximal term, Ditto's regulariser,
Client2Vec's index loss), ``loss_fn(logits, y)`` (FedRoD's balanced softmax), ``params`` (which
parameters the optimiser updates: FedRep's head-then-body phases) and ``forward`` (a model call other
than ``model(x)``, e.g. FedRoD's generic + personal heads).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping

import torch
from torch import nn
from torch.func import functional_call, vmap

ExtraLoss = Callable[[nn.Module, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def resolve_device(device: str) -> torch.device:
    """``auto`` -> CUDA when available, else CPU; otherwise the named torch device."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        return torch.device(device)
    except RuntimeError as err:
        raise ValueError(
            f"invalid device {device!r} (run-config / node-config key 'device'); use auto, cpu, cuda, cuda:N"
        ) from err


def batches(n: int, batch_size: int, generator: torch.Generator | None, shuffle: bool = True) -> Iterable[torch.Tensor]:
    order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
    for start in range(0, n, batch_size):
        yield order[start : start + batch_size]


def train(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    epochs: int = 1,
    batch_size: int = 20,
    lr: float = 0.05,
    momentum: float = 0.9,
    weight_decay: float = 0.0,
    seed: int = 0,
    params: Iterable[nn.Parameter] | None = None,
    extra_loss: ExtraLoss | None = None,
    loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None = None,
    forward: Callable[[torch.Tensor], torch.Tensor] | None = None,
    max_steps: int | None = None,
    optimizer: str = "sgd",
) -> dict[str, float]:
    """Mini-batch SGD with momentum (or Adam) on ``(x, y)`` for ``epochs`` (at most ``max_steps`` optimiser steps
    in all, when given); returns mean loss, accuracy, steps.

    Tensors are moved to the model's device batch by batch, so the data can stay on the CPU.
    """
    if epochs < 0 or batch_size < 1:
        raise ValueError(f"local-epochs must be >= 0 and batch-size >= 1, got {epochs} and {batch_size}")
    device = next(model.parameters()).device
    trainable = [p for p in (model.parameters() if params is None else params) if p.requires_grad]
    if not trainable or epochs == 0 or len(y) == 0:
        return {"train-loss": 0.0, "train-acc": 0.0, "steps": 0}
    if optimizer == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(trainable, lr=lr, momentum=momentum, weight_decay=weight_decay)
    elif optimizer == "adam":  # a fresh optimizer every call (fedc2i.md §6.19)
        opt = torch.optim.Adam(trainable, lr=lr, weight_decay=weight_decay)
    else:
        raise ValueError(f"unknown optimizer {optimizer!r} (run-config key 'optimizer'); allowed: ['sgd', 'adam']")
    criterion = loss_fn or nn.functional.cross_entropy
    call = forward or model
    gen = torch.Generator().manual_seed(seed)
    model.train()
    total_loss, correct, seen, steps = 0.0, 0, 0, 0
    for _ in range(epochs):
        if max_steps is not None and steps >= max_steps:
            break  # max_steps caps the steps of the whole call, not of each epoch
        for idx in batches(len(y), batch_size, gen):
            xb, yb = x[idx].to(device, non_blocking=True), y[idx].to(device, non_blocking=True)
            if len(yb) < 2 and any(isinstance(m, nn.modules.batchnorm._BatchNorm) for m in model.modules()):
                continue  # BatchNorm cannot train on a batch of one
            opt.zero_grad(set_to_none=True)
            logits = call(xb)
            loss = criterion(logits, yb)
            if extra_loss is not None:
                loss = loss + extra_loss(model, xb, yb, logits)
            loss.backward()
            opt.step()
            total_loss += float(loss.detach()) * yb.numel()  # per target (token, for sequence targets)
            correct += int((logits.detach().argmax(1) == yb).sum())
            seen += yb.numel()
            steps += 1
            if max_steps is not None and steps >= max_steps:
                break
    return {"train-loss": total_loss / max(seen, 1), "train-acc": correct / max(seen, 1), "steps": steps}


@torch.no_grad()
def evaluate(
    model: nn.Module,
    x: torch.Tensor,
    y: torch.Tensor,
    *,
    batch_size: int = 512,
    forward: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of ``model`` on ``(x, y)`` in eval mode; (0, 0) on empty data."""
    if len(y) == 0:
        return 0.0, 0.0
    device = next(model.parameters()).device
    call = forward or model
    model.eval()
    total, correct = 0.0, 0
    for idx in batches(len(y), batch_size, None, shuffle=False):
        xb, yb = x[idx].to(device), y[idx].to(device)
        logits = call(xb)
        total += float(nn.functional.cross_entropy(logits, yb, reduction="sum"))
        correct += int((logits.argmax(1) == yb).sum())
    return total / y.numel(), correct / y.numel()  # per target: tokens for next-word prediction


@torch.no_grad()
def norm_statistics(model: nn.Module, x: torch.Tensor, batch_size: int = 512) -> int:
    """Recompute the running mean and variance of every BatchNorm layer of ``model`` from ``x`` alone (the layers'
    statistics reset, then their cumulative average over the batches: momentum None), the model's weights unchanged
    and every other layer in eval mode while it runs; the model's train / eval mode is kept.  The statistics of a
    client's own data: where a method keeps them on the client, where a newcomer has none yet, and under
    differential privacy, where a client scores a model with them instead of ones it received.  A batch of one is
    skipped (BatchNorm has no variance of it).  Returns the layers recomputed (0: none, or fewer than two samples,
    and the model is left as it is)."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    if not norms or len(x) < 2:
        return 0
    device = next(model.parameters()).device
    momenta, training = [m.momentum for m in norms], model.training
    model.eval()
    for m in norms:
        m.reset_running_stats()
        m.momentum = None  # a cumulative average, not an exponential one
        m.train()
    try:
        for idx in batches(len(x), batch_size, None, shuffle=False):
            if len(idx) >= 2:
                model(x[idx].to(device))
    finally:
        for m, momentum in zip(norms, momenta, strict=True):
            m.momentum = momentum
        model.train(training)
    return len(norms)


def batched_losses(
    model: nn.Module, stacked_state: Mapping[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor
) -> torch.Tensor:
    """Mean cross-entropy on ``(x, y)`` of each of the M states in ``stacked_state`` (leading dim M).

    States hold every parameter and buffer of ``model`` (eval mode: BatchNorm uses each candidate's own
    running statistics).  One vmapped functional call, no Python loop over candidates.
    """
    model.eval()

    def loss_of(state: dict[str, torch.Tensor]) -> torch.Tensor:
        return nn.functional.cross_entropy(functional_call(model, state, (x,)), y)

    with torch.no_grad():
        return vmap(loss_of)(dict(stacked_state))


def proximal_term(reference: dict[str, torch.Tensor], mu: float) -> ExtraLoss:
    """``mu/2 * ||w - w_ref||^2`` over the parameters named in ``reference`` (FedProx; Ditto's regulariser)."""

    def term(model: nn.Module, x: torch.Tensor, y: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        loss = torch.zeros((), device=logits.device)
        for name, p in model.named_parameters():
            if name in reference:
                loss = loss + (p - reference[name]).pow(2).sum()
        return 0.5 * mu * loss

    return term

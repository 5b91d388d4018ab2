"""FedC2I client-side math (fedc2i.md §2.2): leave-one-out losses, influence vector and matrix, mixing.

Pure torch, no Flower.  The M leave-one-out models are never built one by one: their states are
``(S - w_i) / (M - 1)`` computed for all i at once from the sum, and the M candidates are evaluated on the
influence batch in one batched call (``torch.func.functional_call`` under ``torch.func.vmap``).  The
class-level test needs one feature pass and M*C cheap logit edits, done as one tensor.

See docs/methods/fedc2i.md; its last section says where each section number cited here is explained.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from task.train import batched_losses


def leave_one_out(stacked: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Eq. 4 / Eq. 7 for every i at once: ``(S - w_i) / (M - 1)`` with ``S`` the sum over the M models.

    ``stacked[name]`` has a leading dimension M (M >= 2).
    """
    out = {}
    for name, w in stacked.items():
        m = w.shape[0]
        if m < 2:
            raise ValueError("leave-one-out needs at least two models")
        out[name] = (w.sum(0, keepdim=True) - w) / (m - 1)
    return out


def sharpened_weights(losses: torch.Tensor, gamma: float, dim: int = 0) -> torch.Tensor:
    """Eqs. 5 / 9: ``l_i^gamma / sum_j l_j^gamma`` computed as ``softmax(gamma * log l)`` (overflow-free).

    A larger leave-one-out loss means model i matters more.  gamma = 0 gives uniform weights.
    """
    if gamma < 0:
        raise ValueError(f"run-config key 'gamma' must be >= 0, got {gamma}")
    return torch.softmax(gamma * torch.log(losses.clamp_min(1e-12)), dim=dim)


def influence_vector(
    model: nn.Module,
    stacked: Mapping[str, torch.Tensor],
    own_head: Mapping[str, torch.Tensor],
    x: torch.Tensor,
    y: torch.Tensor,
    gamma: float,
    head_keys: list[str],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 5: client-level influence ``lambda_m`` (length M) and the leave-one-out losses ``l_m^{-i}``.

    Candidate i is the leave-one-out average of the M feature extractors with the client's own classifier.
    """
    loo = leave_one_out({k: v for k, v in stacked.items() if k not in head_keys and v.is_floating_point()})
    m = next(iter(stacked.values())).shape[0]
    candidates = dict(loo)
    for k, v in stacked.items():
        if k in head_keys:
            candidates[k] = own_head[k].unsqueeze(0).expand(m, *own_head[k].shape)
        elif not v.is_floating_point():  # integer buffers (BN's num_batches_tracked): not averaged
            candidates[k] = v
    losses = batched_losses(model, candidates, x, y)
    return sharpened_weights(losses, gamma), losses


def influence_matrix(
    features: torch.Tensor,
    y: torch.Tensor,
    own_weight: torch.Tensor,
    own_bias: torch.Tensor,
    weights: torch.Tensor,
    biases: torch.Tensor,
    gamma: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eqs. 7-9: class-level influence ``Lambda_m`` (M x C, each column sums to 1) and its losses.

    ``features`` (B x d) come from the extractor theta* (the client's own, fedc2i.md §6.7); ``weights`` (M x C x d)
    and ``biases`` (M x C) are the M classifiers.  Loss (i, c): the client's logits with column c replaced by
    the leave-one-out class-c row of i (bias moves with its row, fedc2i.md §6.8).
    """
    m, c, _ = weights.shape
    loo_w = (weights.sum(0, keepdim=True) - weights) / (m - 1)  # M x C x d
    loo_b = (biases.sum(0, keepdim=True) - biases) / (m - 1)  # M x C
    base = features @ own_weight.T + own_bias  # B x C
    replaced = torch.einsum("bd,mcd->mcb", features, loo_w) + loo_b[:, :, None]  # M x C x B: new column c
    logits = base.expand(m, c, *base.shape).clone()  # M x C x B x C
    idx = torch.arange(c)
    logits[:, idx, :, idx] = replaced.permute(1, 0, 2)  # put column c of candidate (i, c)
    target = y.expand(m, c, len(y))
    losses = nn.functional.cross_entropy(logits.reshape(-1, c), target.reshape(-1), reduction="none")
    losses = losses.view(m, c, len(y)).mean(-1)
    return sharpened_weights(losses, gamma, dim=0), losses


def mix_states(stacked: Mapping[str, torch.Tensor], weights: torch.Tensor, keys: list[str]) -> dict[str, torch.Tensor]:
    """Eq. 6: ``sum_i weights_i * w_i`` for the float tensors in ``keys``."""
    out = {}
    for k in keys:
        w = stacked[k]
        out[k] = torch.tensordot(weights.to(w.dtype), w, dims=1) if w.is_floating_point() else w[0]
    return out


def mix_classifier(
    weights: torch.Tensor, biases: torch.Tensor, influence: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Eq. 10 corrected (fedc2i.md §6.3): row c = ``sum_i Lambda[i, c] * phi_{i,c}`` (the printed form, with the
    client's own row phi_{m,c}, is a no-op because each column of Lambda sums to 1)."""
    return torch.einsum("mc,mcd->cd", influence, weights), torch.einsum("mc,mc->c", influence, biases)

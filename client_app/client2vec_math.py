"""Client-side losses of Client2Vec case study (iii) (client2vec.md §2.8); MOON's loss is in client_app/baselines.py.

Case study (iii) adds two training-only modules to the local model: a projection P (features -> index
width) and a projection classifier h_P.  The loss is CE + w (L_orth + L_dist), with
L_orth = mean over the batch of the mean (``c2v-orth-mean-over-clients``, default) or sum over k of
|cos(P z, beta_k^f)| (all M clients' feature indices) and L_dist = KL(softmax(h(z)) || softmax(h_P(P z))) with
the main head as a detached teacher; by default (``c2v-dist-detach``) L_dist sees the features detached, so it
trains P and h_P only and the backbone is shaped by CE and L_orth.  Evaluation uses the main head only, so P
and h_P never change the model's predictions.

See docs/methods/client2vec.md; its last section says where each section number cited here is explained.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from task.methods.client2vec import C2VAux


def orth_loss(
    z_p: torch.Tensor, beta_f: torch.Tensor, normalize: bool = True, mean_over_clients: bool = False
) -> torch.Tensor:
    """Mean over the batch of sum_k |z_P . beta_k| (cosines when ``normalize``); divided by M if asked."""
    if normalize:
        z_p, beta_f = F.normalize(z_p, dim=1), F.normalize(beta_f, dim=1)
    per_sample = (z_p @ beta_f.T).abs()
    per_sample = per_sample.mean(1) if mean_over_clients else per_sample.sum(1)
    return per_sample.mean()


def distill_loss(logits: torch.Tensor, proj_logits: torch.Tensor) -> torch.Tensor:
    """KL(softmax(h(z)) || softmax(h_P(z_P))), teacher ``logits`` detached, averaged over the batch."""
    return F.kl_div(F.log_softmax(proj_logits, dim=1), F.softmax(logits.detach(), dim=1), reduction="batchmean")


def local_regulariser(
    z: torch.Tensor,
    logits: torch.Tensor,
    aux: C2VAux,
    beta_f: torch.Tensor,
    *,
    normalize: bool = True,
    mean_over_clients: bool = True,
    detach_distill: bool = True,
) -> torch.Tensor:
    """Eq. 4's case-study (iii) terms: L_orth(P z, B_f) + L_dist(h(z), h_P(P z)).

    With ``detach_distill`` the distillation's student is h_P(P z.detach()): it carries z's information into
    z_P (the paper's stated aim of L_dist) by training P and h_P, without pulling the backbone towards what
    a projection classifier predicts; the orthogonality term reaches the backbone either way.
    """
    z_p = aux.proj(z)
    student = aux.head(aux.proj(z.detach())) if detach_distill else aux.head(z_p)
    return orth_loss(z_p, beta_f, normalize, mean_over_clients) + distill_loss(logits, student)

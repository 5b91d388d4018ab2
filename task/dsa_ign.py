"""DSA-IGN, Client2Vec's index generation network, its four losses and the client index (client2vec.md §2.2-2.5).

The network splits a CLIP image embedding D (N, 512) into a label-aligned data encoding Z and a sample
feature index U: I = [D, D] is cut into 32 tokens of width 32, passed through a 3-layer transformer
encoder, and the output's first half is Z, its second half U; a linear 1024 -> 512 projection
reconstructs D from [Z, U].  The paper has no positional embedding, which makes tokens k and k + 16
identical and therefore Z == U exactly in eval mode; a learnable positional embedding (``pos_emb``) fixes
it (client2vec.md §2.3 / A3), and can be switched off to demonstrate the collapse.

Everything here is plain torch with no Flower dependency, used by the server (Global mode training) and
by the clients (Federated mode training and the index itself).

See docs/methods/client2vec.md; its last section says where each section number cited here is explained.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

log = logging.getLogger("flwr.pflower")

ORTH_MODES = ("cos", "literal", "diag")


@dataclass(frozen=True)
class IGNConfig:
    dim: int = 512
    token: int = 32
    layers: int = 3
    heads: int = 8
    ff: int = 2048
    dropout: float = 0.1
    pos_emb: bool = True

    def __post_init__(self) -> None:
        if (2 * self.dim) % self.token or self.token % self.heads:
            raise ValueError(
                f"DSA-IGN needs 2*dim divisible by the token width and token width by heads; "
                f"got dim {self.dim}, token {self.token}, heads {self.heads}"
            )


class DSAIGN(nn.Module):
    """Decomposition block (transformer encoder on 2*dim/token tokens) + linear projection back to ``dim``."""

    def __init__(self, cfg: IGNConfig = IGNConfig()) -> None:
        super().__init__()
        self.cfg = cfg
        self.n_tokens = 2 * cfg.dim // cfg.token
        layer = nn.TransformerEncoderLayer(cfg.token, cfg.heads, cfg.ff, cfg.dropout, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, cfg.layers, enable_nested_tensor=False)
        self.pos = nn.Parameter(torch.randn(1, self.n_tokens, cfg.token) * 0.02) if cfg.pos_emb else None
        self.proj = nn.Linear(2 * cfg.dim, cfg.dim)

    def forward(self, d: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(Z, U, D~) for a batch of embeddings ``d`` (N, dim)."""
        n = d.shape[0]
        tokens = torch.cat([d, d], dim=1).reshape(n, self.n_tokens, self.cfg.token)
        if self.pos is not None:
            tokens = tokens + self.pos
        out = self.encoder(tokens).reshape(n, 2 * self.cfg.dim)
        return out[:, : self.cfg.dim], out[:, self.cfg.dim :], self.proj(out)


# ---------------------------------------------------------------------------------------------- losses
def loss_div(u: torch.Tensor) -> torch.Tensor:
    """(1/B) sum_j log sum_{k != j} exp(cos(u_j, u_k)); 1 + log(B-1) for equal rows, log(B-1) for orthogonal."""
    if u.shape[0] < 2:
        return u.sum() * 0.0
    un = F.normalize(u, dim=1)
    sim = un @ un.T
    sim = sim.masked_fill(torch.eye(len(u), dtype=torch.bool, device=u.device), float("-inf"))
    return torch.logsumexp(sim, dim=1).mean()


def loss_sim(z: torch.Tensor, label_emb: torch.Tensor) -> torch.Tensor:
    """Mean of 1 - cos(z_j, L_j): 0 when parallel, 1 orthogonal, 2 opposite."""
    return (1.0 - F.cosine_similarity(z, label_emb, dim=1)).mean()


def loss_orth(z: torch.Tensor, u: torch.Tensor, mode: str = "cos") -> torch.Tensor:
    """Entrywise L1 of Z U^T: ``cos`` mean |cos(z_j, u_k)| over all B^2 pairs (default), ``literal`` sum of
    |z_j . u_k| on raw vectors, ``diag`` mean |cos(z_j, u_j)|."""
    if mode == "cos":
        return (F.normalize(z, dim=1) @ F.normalize(u, dim=1).T).abs().mean()
    if mode == "literal":
        return (z @ u.T).abs().sum()
    if mode == "diag":
        return F.cosine_similarity(z, u, dim=1).abs().mean()
    raise ValueError(
        f"unknown orthogonality mode {mode!r} (run-config key 'c2v-orth-mode'); allowed: {list(ORTH_MODES)}"
    )


def loss_recon(d_hat: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(d_hat, d)


def total_loss(
    net: DSAIGN, d: torch.Tensor, label_emb: torch.Tensor, orth_mode: str = "cos"
) -> tuple[torch.Tensor, dict[str, float]]:
    z, u, d_hat = net(d)
    parts = {
        "div": loss_div(u),
        "sim": loss_sim(z, label_emb),
        "orth": loss_orth(z, u, orth_mode),
        "recon": loss_recon(d_hat, d),
    }
    total = parts["div"] + parts["sim"] + parts["orth"] + parts["recon"]
    return total, {k: float(v.detach()) for k, v in parts.items()}


def train_dsa_ign(
    net: DSAIGN,
    D: np.ndarray,
    L: np.ndarray,
    *,
    epochs: int,
    batch_size: int = 128,
    lr: float = 1e-3,
    seed: int = 0,
    orth_mode: str = "cos",
    progress: Callable[[int, dict[str, float]], None] | None = None,
) -> list[dict[str, float]]:
    """Adam on the summed DSA-IGN loss for ``epochs`` passes over (D, L); returns the per-epoch mean losses."""
    if len(D) != len(L) or len(D) == 0:
        raise ValueError(f"DSA-IGN needs as many label embeddings as image embeddings (>0), got {len(D)} and {len(L)}")
    d, lab = torch.as_tensor(D, dtype=torch.float32), torch.as_tensor(L, dtype=torch.float32)
    opt = torch.optim.Adam(net.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(seed)
    history = []
    net.train()
    for epoch in range(epochs):
        sums: dict[str, float] = {}
        steps = 0
        for idx in torch.randperm(len(d), generator=gen).split(batch_size):
            if len(idx) < 2:
                continue
            loss, parts = total_loss(net, d[idx], lab[idx], orth_mode)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            parts["total"] = float(loss.detach())
            for k, v in parts.items():
                sums[k] = sums.get(k, 0.0) + v
            steps += 1
        history.append({k: v / max(steps, 1) for k, v in sums.items()})
        if progress is not None:
            progress(epoch + 1, history[-1])
    net.eval()
    return history


@torch.no_grad()
def client_index(net: DSAIGN, D: np.ndarray, L: np.ndarray, batch_size: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """(beta_f, beta_l): the mean sample feature index U over all samples (eval mode) and the mean label
    embedding; beta_l is therefore sum_c pi_c T_c for the client's label histogram pi."""
    if len(D) == 0:
        raise ValueError("a client index needs at least one training sample")
    net.eval()
    d = torch.as_tensor(D, dtype=torch.float32)
    total = torch.zeros(net.cfg.dim, dtype=torch.float64)
    for start in range(0, len(d), batch_size):
        _, u, _ = net(d[start : start + batch_size])
        total += u.double().sum(0)
    beta_f = (total / len(d)).float().numpy()
    beta_l = np.asarray(L, dtype=np.float64).mean(0).astype(np.float32)
    return beta_f, beta_l


@contextlib.contextmanager
def torch_threads(n: int) -> Iterator[None]:
    """Run the block with ``n`` torch threads (0: leave torch's setting), then restore the previous count.

    DSA-IGN is a small network (batches of 128 x 32 tokens of width 32): two threads on a shared 2-core machine
    burnt 9-10x the CPU time of one per step and were 5-10x slower in wall time (docs/methods/client2vec.md).
    """
    before = torch.get_num_threads()
    if n > 0 and n != before:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        if torch.get_num_threads() != before:
            torch.set_num_threads(before)


def build_ign(cfg: IGNConfig, seed: int) -> DSAIGN:
    torch.manual_seed(seed)
    return DSAIGN(cfg)

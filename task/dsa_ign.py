"""DSA-IGN, Client2Vec's index generation network, its four losses and the client index (spec §2.2-2.5).

The network splits a CLIP image embedding D (N, 512) into a label-aligned data encoding Z and a sample
feature index U: I = [D, D] is cut into 32 tokens of width 32, passed through a 3-layer transformer
encoder, and the output's first half is Z, its second half U; a linear 1024 -> 512 projection
reconstructs D from [Z, U].  The paper has no positional embedding, which makes tokens k and k + 16
identical and therefore Z == U exactly in eval mode; a learnable positional embedding (``pos_emb``) fixes
it (spec §2.3 / A3), and can be switched off to demonstrate the collapse.

Everything here is plain torch with no Flower dependency, used by the server (Global mode training) and
by the clients (Federated mode training and the index itself).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

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
            raise ValueError(f"DSA-IGN needs 2*dim divisible by the token width and token width by heads; "
                             f"got dim {self.dim}, token {self.token}, heads {self.heads}")


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
        return out[:, : self.cfg.dim], out[:, self.cfg.dim:], self.proj(out)


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
    raise ValueError(f"unknown orthogonality mode {mode!r} (run-config key 'c2v-orth-mode'); allowed: {list(ORTH_MODES)}")


def loss_recon(d_hat: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    return F.mse_loss(d_hat, d)


def total_loss(net: DSAIGN, d: torch.Tensor, label_emb: torch.Tensor, orth_mode: str = "cos") -> tuple[torch.Tensor, dict[str, float]]:
    z, u, d_hat = net(d)
    parts = {"div": loss_div(u), "sim": loss_sim(z, label_emb), "orth": loss_orth(z, u, orth_mode),
             "recon": loss_recon(d_hat, d)}
    total = parts["div"] + parts["sim"] + parts["orth"] + parts["recon"]
    return total, {k: float(v.detach()) for k, v in parts.items()}


def train_dsa_ign(net: DSAIGN, D: np.ndarray, L: np.ndarray, *, epochs: int, batch_size: int = 128,
                  lr: float = 1e-3, seed: int = 0, orth_mode: str = "cos",
                  progress: Callable[[int, dict[str, float]], None] | None = None) -> list[dict[str, float]]:
    """Adam on the summed DSA-IGN loss for ``epochs`` passes over (D, L); returns the per-epoch mean losses."""
    if len(D) != len(L) or len(D) == 0:
        raise ValueError(f"DSA-IGN needs as many label embeddings as image embeddings (>0), got {len(D)} and {len(L)}")
    d, l = torch.as_tensor(D, dtype=torch.float32), torch.as_tensor(L, dtype=torch.float32)
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
            loss, parts = total_loss(net, d[idx], l[idx], orth_mode)
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
        _, u, _ = net(d[start:start + batch_size])
        total += u.double().sum(0)
    beta_f = (total / len(d)).float().numpy()
    beta_l = np.asarray(L, dtype=np.float64).mean(0).astype(np.float32)
    return beta_f, beta_l


def build_ign(cfg: IGNConfig, seed: int) -> DSAIGN:
    torch.manual_seed(seed)
    return DSAIGN(cfg)


# ---------------------------------------------------------------------------------------------- options
BASES = ("fedavg", "fedprox", "moon")
IGN_MODES = ("global", "federated")


@dataclass(frozen=True)
class C2VOptions:
    """Client2Vec's run-config keys (``c2v-*``), parsed and checked once; used by server and clients."""

    base: str
    sampling: bool
    aggregation: bool
    local: bool
    encoder: str
    clip_model: str
    clip_weights: str
    normalize: bool
    cache_dir: str
    ign_mode: str
    ign_epochs: int
    ign_local_epochs: int
    ign_fraction: float
    ign_upload: int
    ign_batch: int
    ign_lr: float
    orth_mode: str
    ign: IGNConfig
    tau: float
    gamma: float
    lambda1: float
    local_weight: float
    orth_normalize: bool
    orth_mean_over_clients: bool


def _flag(settings, key: str, default: bool) -> bool:
    value = settings.get(key, default)
    if isinstance(value, bool):
        return value
    if str(value).lower() in ("true", "1", "yes"):
        return True
    if str(value).lower() in ("false", "0", "no"):
        return False
    raise ValueError(f"run-config key {key!r} must be true or false, got {value!r}")


def _choice(settings, key: str, default: str, allowed) -> str:
    value = str(settings.get(key, default))
    if value not in allowed:
        raise ValueError(f"run-config key {key!r} is {value!r}; allowed: {list(allowed)}")
    return value


def _number(settings, key: str, default, kind, minimum=None, maximum=None):
    raw = settings.get(key, default)
    try:
        value = kind(raw)
    except (TypeError, ValueError) as err:
        raise ValueError(f"run-config key {key!r} must be {kind.__name__}, got {raw!r}") from err
    if (minimum is not None and value < minimum) or (maximum is not None and value > maximum):
        raise ValueError(f"run-config key {key!r} must be in [{minimum}, {maximum}], got {value}")
    return value


def c2v_options(settings) -> C2VOptions:
    return C2VOptions(
        base=_choice(settings, "c2v-base", "fedavg", BASES),
        sampling=_flag(settings, "c2v-sampling", True),
        aggregation=_flag(settings, "c2v-aggregation", True),
        local=_flag(settings, "c2v-local", True),
        encoder=_choice(settings, "c2v-encoder", "open-clip", ("open-clip", "synthetic")),
        clip_model=str(settings.get("c2v-clip-model", "pflower-tiny")),
        clip_weights=str(settings.get("c2v-clip-weights", "random")),
        normalize=_flag(settings, "c2v-normalize", True),
        cache_dir=str(settings.get("c2v-cache-dir", "")),
        ign_mode=_choice(settings, "c2v-ign-mode", "global", IGN_MODES),
        ign_epochs=_number(settings, "c2v-ign-epochs", 10, int, 0),
        ign_local_epochs=_number(settings, "c2v-ign-local-epochs", 10, int, 1),
        ign_fraction=_number(settings, "c2v-ign-fraction", 0.1, float, 0.0, 1.0),
        ign_upload=_number(settings, "c2v-ign-upload", 128, int, 2),
        ign_batch=_number(settings, "c2v-ign-batch", 128, int, 2),
        ign_lr=_number(settings, "c2v-ign-lr", 1e-3, float, 0.0),
        orth_mode=_choice(settings, "c2v-orth-mode", "cos", ORTH_MODES),
        ign=IGNConfig(ff=_number(settings, "c2v-ign-ff", 256, int, 1),
                      dropout=_number(settings, "c2v-ign-dropout", 0.0, float, 0.0, 1.0),
                      pos_emb=_flag(settings, "c2v-pos-emb", True)),
        tau=_number(settings, "c2v-tau", 1.0, float, 1e-9),
        gamma=_number(settings, "c2v-gamma", 0.5, float, 0.0, 1.0),
        lambda1=_number(settings, "c2v-lambda1", 1.0, float, 1e-9),
        local_weight=_number(settings, "c2v-local-weight", 1.0, float, 0.0),
        orth_normalize=_flag(settings, "c2v-orth-normalize", True),
        orth_mean_over_clients=_flag(settings, "c2v-orth-mean-over-clients", False),
    )

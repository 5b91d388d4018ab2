"""Client2Vec's options and what server and clients share of case study (iii): the training-only projection P
and classifier h_P that travel with the model under ``c2v.*`` keys (docs/methods/client2vec.md)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from task.dsa_ign import ORTH_MODES, IGNConfig
from task.methods.baselines import FedProxOptions, MoonOptions
from task.options import option

BASES = ("fedavg", "fedprox", "moon")
AUX_PREFIX = "c2v."


@dataclass(frozen=True)
class Client2VecOptions(FedProxOptions, MoonOptions):
    """Client2Vec's run-config keys (``c2v-*``), plus the base algorithm's (FedProx's mu, MOON's mu and T)."""

    base: str = option("c2v-base", "fedavg", "base algorithm under the case studies", choices=BASES)
    sampling: bool = option("c2v-sampling", True, "(i) index-aware client sampling (Eq. 1)")
    aggregation: bool = option("c2v-aggregation", True, "(ii) index-aware aggregation weights (Eq. 3)")
    local: bool = option("c2v-local", True, "(iii) the local orthogonality + distillation loss")
    encoder: str = option(
        "c2v-encoder", "open-clip", "image/text encoder of the index", choices=("open-clip", "synthetic")
    )
    clip_model: str = option("c2v-clip-model", "pflower-tiny", "open_clip architecture name")
    clip_weights: str = option(
        "c2v-clip-weights", "random", "random, a checkpoint file, or a pretrained tag in the local cache"
    )
    normalize: bool = option("c2v-normalize", True, "L2-normalise the CLIP embeddings")
    cache_dir: str = option("c2v-cache-dir", "", "embedding cache folder (empty: ~/.cache/pflower/clip-embeddings)")
    ign_mode: str = option(
        "c2v-ign-mode",
        "global",
        "DSA-IGN trained on the server (global) or by FedAvg (federated)",
        choices=("global", "federated"),
    )
    ign_epochs: int = option("c2v-ign-epochs", 5, "DSA-IGN epochs (global) or rounds (federated); paper 500", minimum=0)
    ign_local_epochs: int = option("c2v-ign-local-epochs", 10, "federated DSA-IGN: local epochs per round", minimum=1)
    ign_fraction: float = option(
        "c2v-ign-fraction", 0.1, "federated DSA-IGN: share of nodes per round", minimum=0.0, maximum=1.0
    )
    ign_upload: int = option("c2v-ign-upload", 128, "global DSA-IGN: embedding pairs each client uploads", minimum=2)
    ign_batch: int = option("c2v-ign-batch", 128, "DSA-IGN batch size", minimum=2)
    ign_lr: float = option("c2v-ign-lr", 0.001, "DSA-IGN Adam learning rate", minimum=0.0)
    ign_ff: int = option("c2v-ign-ff", 256, "DSA-IGN feed-forward width (paper 2048)", minimum=1)
    ign_threads: int = option(
        "c2v-ign-threads", 1, "torch threads of the server's DSA-IGN training (0: torch's default)", minimum=0
    )
    ign_dropout: float = option("c2v-ign-dropout", 0.0, "DSA-IGN dropout", minimum=0.0, maximum=1.0)
    pos_emb: bool = option("c2v-pos-emb", True, "learnable positional embedding (false: the paper's, where Z == U)")
    orth_mode: str = option("c2v-orth-mode", "cos", "DSA-IGN orthogonality loss", choices=ORTH_MODES)
    tau: float = option("c2v-tau", 1.0, "Eq. 1 sampling temperature", minimum=1e-9)
    gamma: float = option("c2v-gamma", 0.5, "decay of the history term H", minimum=0.0, maximum=1.0)
    lambda1: float = option("c2v-lambda1", 1.0, "Eq. 3 temperature of the aggregation weights", minimum=1e-9)
    local_weight: float = option("c2v-local-weight", 1.0, "(iii) weight of the local loss", minimum=0.0)
    orth_normalize: bool = option("c2v-orth-normalize", True, "(iii) cosines instead of raw dot products")
    orth_mean_over_clients: bool = option(
        "c2v-orth-mean-over-clients", True, "(iii) mean, not sum, over clients (false: grows with the clients)"
    )
    dist_detach: bool = option(
        "c2v-dist-detach", True, "(iii) L_dist trains P and h_P only (false: its gradient also reaches the features)"
    )

    def conflicts(self, settings) -> list[str]:
        """The client index needs image samples with one class label each (CLIP embeddings, label prompts)."""
        if not self.enabled:
            return []  # every case study off: the plain base algorithm, no index
        if settings.data.dataset == "dialects":
            return [
                (
                    "Client2Vec's client index pairs every training sample with the prompt of its one class label, "
                    "and dataset 'dialects' labels every token (next-word prediction); use an image data set, or "
                    "c2v-sampling=false c2v-aggregation=false c2v-local=false for the plain base algorithm"
                )
            ]
        if settings.image_size == 0 and self.encoder == "open-clip":
            return [
                (
                    f"c2v-encoder='open-clip' encodes images, but dataset {settings.data.dataset!r} has vectors; use "
                    f"c2v-encoder='synthetic' (a fixed random projection) or an image data set"
                )
            ]
        return []

    @property
    def ign(self) -> IGNConfig:
        return IGNConfig(ff=self.ign_ff, dropout=self.ign_dropout, pos_emb=self.pos_emb)

    @property
    def enabled(self) -> bool:
        """With every case study off this is the plain base algorithm: no index phase at all."""
        return self.sampling or self.aggregation or self.local


class C2VAux(nn.Module):
    """P (feature_dim -> index_dim, no bias) and h_P (index_dim -> classes)."""

    def __init__(self, feature_dim: int, index_dim: int, num_classes: int) -> None:
        super().__init__()
        self.proj = nn.Linear(feature_dim, index_dim, bias=False)
        self.head = nn.Linear(index_dim, num_classes)

    def state_with_prefix(self) -> dict[str, torch.Tensor]:
        return {AUX_PREFIX + k: v for k, v in self.state_dict().items()}


def build_aux(feature_dim: int, index_dim: int, num_classes: int, seed: int) -> C2VAux:
    torch.manual_seed(seed + 424_242)
    return C2VAux(feature_dim, index_dim, num_classes)

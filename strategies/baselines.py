"""Server side of the baselines the papers compare against: Local, FedAvg, FedProx, FedPer, FedRep, FedRoD, Ditto.

They differ on the server only in which part of the model is shared; the rest of each method (proximal
term, head/body phases, personal heads, Ditto's personal model) happens on the client
(``client_app/baselines.py``).
"""

from __future__ import annotations

from flwr.app import RecordDict

from strategies.api import PersonalizedStrategy


class FedAvgStrategy(PersonalizedStrategy):
    """FedAvg (McMahan et al.): the whole model, example-weighted average; BN statistics averaged too."""


class FedProxStrategy(FedAvgStrategy):
    """FedProx (Li et al.): FedAvg on the server; clients add ``proximal-mu``/2 ||w - w_global||^2."""


class MoonStrategy(FedAvgStrategy):
    """MOON (Li et al.): FedAvg on the server; clients add the model-contrastive loss."""


class LocalStrategy(PersonalizedStrategy):
    """Local / Separate training: nothing is shared, each client trains and keeps its own model."""

    has_global_model = False

    def shared_keys(self) -> list[str]:
        return []

    def payload(self, node_id: int, server_round: int, phase: str) -> RecordDict:
        return RecordDict()


class FedPerStrategy(PersonalizedStrategy):
    """FedPer (Arivazhagan et al.): the feature extractor is averaged, the classifier stays on the client."""

    has_global_model = False

    def shared_keys(self) -> list[str]:
        return self.model_info.body_keys


class FedRepStrategy(FedPerStrategy):
    """FedRep (Collins et al.): as FedPer on the server; clients train head then body."""


class FedRoDStrategy(PersonalizedStrategy):
    """FedRoD (Chen & Chao): body + generic head averaged; each client keeps a personal head."""


class DittoStrategy(PersonalizedStrategy):
    """Ditto (Li et al.): FedAvg on the global model; each client keeps a regularised personal model."""

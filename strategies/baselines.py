"""Server side of the baselines the papers compare against: Local, FedAvg, FedProx, FedPer, FedRep, FedRoD, Ditto.

They differ on the server only in which part of the model is shared; the rest of each method (proximal
term, head/body phases, personal heads, Ditto's personal model) happens on the client
(``client_app/baselines.py``).
"""

from __future__ import annotations

from flwr.app import RecordDict

from strategies.base import PersonalizedStrategy


class FedAvgStrategy(PersonalizedStrategy):
    """FedAvg (McMahan et al.): the whole model, example-weighted average; BN statistics averaged too."""

    name = "fedavg"


class FedProxStrategy(FedAvgStrategy):
    """FedProx (Li et al.): FedAvg on the server; clients add ``proximal-mu``/2 ||w - w_global||^2."""

    name = "fedprox"


class MoonStrategy(FedAvgStrategy):
    """MOON (Li et al.): FedAvg on the server; clients add the model-contrastive loss."""

    name = "moon"


class LocalStrategy(PersonalizedStrategy):
    """Local / Separate training: nothing is shared, each client trains and keeps its own model."""

    name = "local"
    has_global_model = False

    def shared_keys(self) -> list[str]:
        return []

    def train_payload(self, node_id: int, server_round: int) -> RecordDict:
        return RecordDict()


class FedPerStrategy(PersonalizedStrategy):
    """FedPer (Arivazhagan et al.): the feature extractor is averaged, the classifier stays on the client."""

    name = "fedper"
    has_global_model = False

    def shared_keys(self) -> list[str]:
        return list(self.body_keys)


class FedRepStrategy(FedPerStrategy):
    """FedRep (Collins et al.): as FedPer on the server; clients train head then body."""

    name = "fedrep"


class FedRoDStrategy(PersonalizedStrategy):
    """FedRoD (Chen & Chao): body + generic head averaged; each client keeps a personal head."""

    name = "fedrod"


class DittoStrategy(PersonalizedStrategy):
    """Ditto (Li et al.): FedAvg on the global model; each client keeps a regularised personal model."""

    name = "ditto"

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
    """Local / Separate training: nothing is shared, each client trains and keeps its own model, in every round.

    A client that trains alone needs no server to draw it: with ``fraction-train`` < 1 (a federation that hears
    from only part of its clients per round) every client still trains in every round, as a local-only client
    would, so Local is the reference a federated method must beat at equal local work, not a client that idles
    while unsampled."""

    has_global_model = False

    def shared_keys(self) -> list[str]:
        return []

    def wants_client_ids(self, server_round: int, nodes: list[int]) -> bool:
        return False  # every node trains: whose it is does not change the cohort

    def sample(self, server_round: int, nodes: list[int]) -> list[int]:
        return self.by_client(nodes)

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

"""Which server strategy and which client code implement each ``method`` of the run config.

Entries are import paths ("module:Class") so that choosing one method never imports the others.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass


@dataclass(frozen=True)
class MethodSpec:
    strategy: str
    client: str
    queries: tuple[str, ...] = ()
    description: str = ""


METHODS: dict[str, MethodSpec] = {
    "local": MethodSpec("strategies.baselines:LocalStrategy", "client_app.baselines:LocalClient",
                        description="each client trains alone"),
    "fedavg": MethodSpec("strategies.baselines:FedAvgStrategy", "client_app.baselines:FedAvgClient",
                         description="one global model"),
    "fedprox": MethodSpec("strategies.baselines:FedProxStrategy", "client_app.baselines:FedProxClient",
                          description="FedAvg with a proximal term (proximal-mu)"),
    "fedper": MethodSpec("strategies.baselines:FedPerStrategy", "client_app.baselines:FedPerClient",
                         description="shared body, personal head"),
    "fedrep": MethodSpec("strategies.baselines:FedRepStrategy", "client_app.baselines:FedRepClient",
                         description="shared body, personal head trained first (head-epochs)"),
    "fedrod": MethodSpec("strategies.baselines:FedRoDStrategy", "client_app.baselines:FedRoDClient",
                         description="balanced-softmax generic model + personal head"),
    "ditto": MethodSpec("strategies.baselines:DittoStrategy", "client_app.baselines:DittoClient",
                        description="global model + regularised personal model (ditto-lambda)"),
    # --- fedcac ---
    "fedcac": MethodSpec("strategies.fedcac:FedCACStrategy", "client_app.fedcac:FedCACClient",
                         description="critical-parameter masks, mask-overlap collaborators (tau, beta)"),
    # --- fedc2i ---
    "fedc2i": MethodSpec("strategies.fedc2i:FedC2IStrategy", "client_app.fedc2i:FedC2IClient",
                         description="leave-one-out influence, per-client mixing of all models (gamma, c2i-peers)"),
    # --- pfedlia ---
    "pfedlia": MethodSpec("strategies.pfedlia:PFedLIAStrategy", "client_app.pfedlia:PFedLIAClient",
                          queries=("lazy", "lia"),
                          description="lazy-influence clustering after a FedAvg warm-up (lia-mode central|p2p)"),
    "cfl": MethodSpec("strategies.cfl:CFLStrategy", "client_app.baselines:ClusterModelClient",
                      description="clustered FL (Sattler et al.): bipartition on update cosine similarity"),
    "oracle": MethodSpec("strategies.pfedlia:OracleStrategy", "client_app.pfedlia:PFedLIAClient",
                         description="per-cluster FedAvg on the planted groups after the same warm-up"),
    # --- pifl ---
    "pifl": MethodSpec("strategies.pifl:PIFLStrategy", "client_app.pifl:PIFLClient", queries=("bid",),
                       description="tiers, token auctions and one-shot personalization (tiers, slot-price)"),
    "ifca": MethodSpec("strategies.ifca:IFCAStrategy", "client_app.ifca:IFCAClient",
                       description="IFCA: K cluster models, each client takes the one with the lowest loss (tiers)"),
    "pifl-ni": MethodSpec("strategies.pifl:PIFLNoIncentiveStrategy", "client_app.pifl:PIFLClient", queries=("bid",),
                          description="PI-FL without incentive: random bids"),
    "fedsoft": MethodSpec("strategies.fedsoft:FedSoftStrategy", "client_app.fedsoft:FedSoftClient",
                          queries=("fedsoft_u",),
                          description="FedSoft: soft clustering, proximal updates towards the centres (tiers, fedsoft-*)"),
    # --- client2vec ---
    "client2vec": MethodSpec("strategies.client2vec:Client2VecStrategy", "client_app.client2vec:Client2VecClient",
                             queries=("c2v_embed", "c2v_ign", "c2v_index"),
                             description="CLIP client index; index-aware sampling, aggregation, local loss (c2v-*)"),
    "moon": MethodSpec("strategies.baselines:MoonStrategy", "client_app.client2vec:MoonClient",
                       description="MOON: FedAvg + model-contrastive loss (moon-mu, moon-temperature)"),
}


def load_object(path: str):
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def method_spec(method: str) -> MethodSpec:
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r} (run-config key 'method'); allowed: {sorted(METHODS)}")
    return METHODS[method]


def all_queries() -> set[str]:
    """Every ``query.<name>`` a ClientApp answers: ``identify`` (all methods) and each method's own."""
    return {"identify"} | {q for spec in METHODS.values() for q in spec.queries}

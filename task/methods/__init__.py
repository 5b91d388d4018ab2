"""The method registry, and what the server and client halves of each method share.

``METHODS`` maps every value of the run-config key ``method`` to its strategy (server), its client code,
its option set (:mod:`task.options`), the ``query.*`` phases its clients answer, option values it fixes and
settings it cannot run with (``conflicts``, for a method without options of its own).
Entries name the strategy and the client by import path, so choosing one method imports neither the other
methods nor, on the client, any server code.  This package imports nothing of the app: ``strategies/`` and
``client_app/`` both import it, never each other.

To add a method: see docs/adding-a-method.md.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from task.methods import fedbn
from task.methods.baselines import DittoOptions, FedProxOptions, FedRepOptions, MoonOptions, NoOptions
from task.methods.client2vec import Client2VecOptions
from task.methods.fedc2i import FedC2IOptions
from task.methods.fedcac import FedCACOptions
from task.methods.pfedlia import CFLOptions, PFedLIAOptions, oracle_conflicts
from task.methods.pifl import FedSoftOptions, PIFLOptions, TierOptions
from task.options import OptionSet


@dataclass(frozen=True)
class MethodSpec:
    strategy: str  # "module:Class" of the strategy (server side)
    client: str  # "module:Class" of the client side
    options: type[OptionSet] = NoOptions
    queries: tuple[str, ...] = ()
    description: str = ""
    fixed: Mapping[str, Any] = field(default_factory=dict)  # option values this method fixes
    #: settings -> why they cannot work with this method (none: []); checked at start-up with the options'
    #: own ``conflicts``, so a method without options of its own needs no options class to refuse a model
    conflicts: Callable[[Any], list[str]] | None = None


def _m(module: str, strategy: str, client_module: str, client: str, **kw: Any) -> MethodSpec:
    return MethodSpec(f"strategies.{module}:{strategy}", f"client_app.{client_module}:{client}", **kw)


METHODS: dict[str, MethodSpec] = {
    "local": _m("baselines", "LocalStrategy", "baselines", "LocalClient", description="each client trains alone"),
    "fedavg": _m("baselines", "FedAvgStrategy", "baselines", "FedAvgClient", description="one global model"),
    "fedprox": _m(
        "baselines",
        "FedProxStrategy",
        "baselines",
        "FedProxClient",
        options=FedProxOptions,
        description="FedAvg with a proximal term (proximal-mu)",
    ),
    "fedper": _m("baselines", "FedPerStrategy", "baselines", "FedPerClient", description="shared body, personal head"),
    "fedrep": _m(
        "baselines",
        "FedRepStrategy",
        "baselines",
        "FedRepClient",
        options=FedRepOptions,
        description="shared body, personal head trained first (head-epochs)",
    ),
    "lgfedavg": _m(
        "lgfedavg",
        "LGFedAvgStrategy",
        "lgfedavg",
        "LGFedAvgClient",
        description="LG-FedAvg: local body (representation), shared head (FedPer's mirror)",
    ),
    "fedbn": _m(
        "fedbn",
        "FedBNStrategy",
        "fedbn",
        "FedBNClient",
        conflicts=fedbn.conflicts,
        description="FedBN: local normalisation layers (BatchNorm and statistics), FedAvg of everything else",
    ),
    "fedrod": _m(
        "baselines",
        "FedRoDStrategy",
        "baselines",
        "FedRoDClient",
        description="balanced-softmax generic model + personal head",
    ),
    "ditto": _m(
        "baselines",
        "DittoStrategy",
        "baselines",
        "DittoClient",
        options=DittoOptions,
        description="global model + regularised personal model (ditto-lambda)",
    ),
    "moon": _m(
        "baselines",
        "MoonStrategy",
        "baselines",
        "MoonClient",
        options=MoonOptions,
        description="MOON: FedAvg + model-contrastive loss (moon-mu, moon-temperature)",
    ),
    "fedcac": _m(
        "fedcac",
        "FedCACStrategy",
        "fedcac",
        "FedCACClient",
        options=FedCACOptions,
        description="critical-parameter masks, mask-overlap collaborators (tau, beta)",
    ),
    "fedc2i": _m(
        "fedc2i",
        "FedC2IStrategy",
        "fedc2i",
        "FedC2IClient",
        options=FedC2IOptions,
        description="leave-one-out influence, per-client mixing of all models (gamma, c2i-peers)",
    ),
    "pfedlia": _m(
        "pfedlia",
        "PFedLIAStrategy",
        "pfedlia",
        "PFedLIAClient",
        options=PFedLIAOptions,
        queries=("lazy", "lia"),
        description="lazy-influence clustering after a FedAvg warm-up (lia-mode central|p2p)",
    ),
    "oracle": _m(
        "pfedlia",
        "OracleStrategy",
        "pfedlia",
        "PFedLIAClient",
        options=PFedLIAOptions,
        conflicts=oracle_conflicts,
        description="per-cluster FedAvg on the planted groups after the same warm-up",
    ),
    "cfl": _m(
        "cfl",
        "CFLStrategy",
        "baselines",
        "ClusterModelClient",
        options=CFLOptions,
        description="clustered FL (Sattler et al.): bipartition on update cosine similarity",
    ),
    "pifl": _m(
        "pifl",
        "PIFLStrategy",
        "pifl",
        "PIFLClient",
        options=PIFLOptions,
        queries=("bid",),
        description="tiers, token auctions and one-shot personalization (tiers, slot-price)",
    ),
    "pifl-ni": _m(
        "pifl",
        "PIFLStrategy",
        "pifl",
        "PIFLClient",
        options=PIFLOptions,
        queries=("bid",),
        fixed={"pifl-incentive": False},
        description="PI-FL without incentive: random bids",
    ),
    "ifca": _m(
        "ifca",
        "IFCAStrategy",
        "ifca",
        "IFCAClient",
        options=TierOptions,
        description="IFCA: K cluster models, each client takes the one with the lowest loss (tiers)",
    ),
    "fedsoft": _m(
        "fedsoft",
        "FedSoftStrategy",
        "fedsoft",
        "FedSoftClient",
        options=FedSoftOptions,
        queries=("fedsoft_u",),
        description="FedSoft: soft clustering, proximal updates towards the centres (tiers, fedsoft-*)",
    ),
    "client2vec": _m(
        "client2vec",
        "Client2VecStrategy",
        "client2vec",
        "Client2VecClient",
        options=Client2VecOptions,
        queries=("c2v_embed", "c2v_ign", "c2v_index"),
        description="CLIP client index; index-aware sampling, aggregation, local loss (c2v-*)",
    ),
}

#: every option set (for the check of pyproject.toml's keys)
OPTION_SETS: tuple[type[OptionSet], ...] = tuple(dict.fromkeys(spec.options for spec in METHODS.values()))


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

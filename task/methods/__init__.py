"""The method registry, and what the server and client halves of each method share.

``METHODS`` maps every value of the run-config key ``method`` to its strategy (server), its client code,
its option set (:mod:`task.options`), the ``query.*`` phases its clients answer, option values it fixes,
settings it cannot run with (``conflicts``, for a method without options of its own) and the writer of its
artefacts.  Entries name the strategy, the client and the writer by import path, so choosing one method imports
neither the other methods nor, on the client, any server code.  This package imports nothing of the app:
``strategies/`` and ``client_app/`` both import it, never each other.

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
from task.privacy import CENTRAL, PrivacySupport


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
    #: the differential-privacy modes it supports (run-config ``dp-mode``) and why not the others (docs/privacy.md)
    privacy: PrivacySupport = field(default_factory=PrivacySupport)
    #: "module:function" that writes the method's artefacts (JSON, PNG) into a run's results folder, called with the
    #: strategy and the folder at the end of the run (None: the method writes none)
    artifacts: str | None = None


def _m(
    module: str, strategy: str, client_module: str, client: str, artifacts: str | None = None, **kw: Any
) -> MethodSpec:
    """An entry: ``strategies.<module>:<strategy>``, ``client_app.<client_module>:<client>`` and, with
    ``artifacts``, ``strategies.<artifacts>:write_artifacts``."""
    writer = f"strategies.{artifacts}:write_artifacts" if artifacts else None
    return MethodSpec(f"strategies.{module}:{strategy}", f"client_app.{client_module}:{client}", artifacts=writer, **kw)


METHODS: dict[str, MethodSpec] = {
    "local": _m(
        "baselines",
        "LocalStrategy",
        "baselines",
        "LocalClient",
        description="each client trains alone",
        privacy=PrivacySupport(
            why_not="no model leaves a client, so there is nothing for differential privacy to protect"
        ),
    ),
    "fedavg": _m(
        "baselines", "FedAvgStrategy", "baselines", "FedAvgClient", description="one global model", privacy=CENTRAL
    ),
    "fedprox": _m(
        "baselines",
        "FedProxStrategy",
        "baselines",
        "FedProxClient",
        options=FedProxOptions,
        description="FedAvg with a proximal term (proximal-mu)",
        privacy=CENTRAL,
    ),
    "fedper": _m(
        "baselines",
        "FedPerStrategy",
        "baselines",
        "FedPerClient",
        description="shared body, personal head",
        privacy=CENTRAL,
    ),
    "fedrep": _m(
        "baselines",
        "FedRepStrategy",
        "baselines",
        "FedRepClient",
        options=FedRepOptions,
        description="shared body, personal head trained first (head-epochs)",
        privacy=CENTRAL,
    ),
    "lgfedavg": _m(
        "lgfedavg",
        "LGFedAvgStrategy",
        "lgfedavg",
        "LGFedAvgClient",
        description="LG-FedAvg: local body (representation), shared head (FedPer's mirror)",
        privacy=CENTRAL,
    ),
    "fedbn": _m(
        "fedbn",
        "FedBNStrategy",
        "fedbn",
        "FedBNClient",
        conflicts=fedbn.conflicts,
        description="FedBN: local normalisation layers (BatchNorm and statistics), FedAvg of everything else",
        privacy=CENTRAL,
    ),
    "fedrod": _m(
        "baselines",
        "FedRoDStrategy",
        "baselines",
        "FedRoDClient",
        description="balanced-softmax generic model + personal head",
        privacy=CENTRAL,
    ),
    "ditto": _m(
        "baselines",
        "DittoStrategy",
        "baselines",
        "DittoClient",
        options=DittoOptions,
        description="global model + regularised personal model (ditto-lambda)",
        privacy=CENTRAL,
    ),
    "moon": _m(
        "baselines",
        "MoonStrategy",
        "baselines",
        "MoonClient",
        options=MoonOptions,
        description="MOON: FedAvg + model-contrastive loss (moon-mu, moon-temperature)",
        privacy=CENTRAL,
    ),
    "fedcac": _m(
        "fedcac",
        "FedCACStrategy",
        "fedcac",
        "FedCACClient",
        artifacts="fedcac_artifacts",
        options=FedCACOptions,
        description="critical-parameter masks, mask-overlap collaborators (tau, beta)",
        privacy=PrivacySupport(
            why_not=(
                "its clients send critical-parameter masks and the server picks each client's collaborators by their "
                "overlap; neither is noised"
            )
        ),
    ),
    "fedc2i": _m(
        "fedc2i",
        "FedC2IStrategy",
        "fedc2i",
        "FedC2IClient",
        artifacts="fedc2i_artifacts",
        options=FedC2IOptions,
        description="leave-one-out influence, per-client mixing of all models (gamma, c2i-peers)",
        privacy=PrivacySupport(
            ("local",),
            why_not=(
                "the server never averages: it forwards every client's own model to the other clients, so there is no "
                "mean for central noise to hide a client in; only local DP (dp-mode='local', noise added on the "
                "client before its model leaves) protects it"
            ),
        ),
    ),
    "pfedlia": _m(
        "pfedlia",
        "PFedLIAStrategy",
        "pfedlia",
        "PFedLIAClient",
        artifacts="pfedlia_artifacts",
        options=PFedLIAOptions,
        queries=("lazy", "lia"),
        description="lazy-influence clustering after a FedAvg warm-up (lia-mode central|p2p)",
        privacy=PrivacySupport(
            ("local",),
            why_not=(
                "its clustering round shows every client's lazily trained model to all peers, which no server-side "
                "noise can hide, and the server clusters on un-noised lazy-influence rows, so which clients a cluster "
                "model averages depends on its peers' data without noise; only local DP (dp-mode='local', every model "
                "noised on the client before it leaves) protects the models"
            ),
            query_releases=1,  # the lazy model of the clustering round
        ),
    ),
    "oracle": _m(
        "pfedlia",
        "OracleStrategy",
        "pfedlia",
        "PFedLIAClient",
        artifacts="pfedlia_artifacts",
        options=PFedLIAOptions,
        conflicts=oracle_conflicts,
        description="per-cluster FedAvg on the planted groups after the same warm-up",
        privacy=PrivacySupport(
            ("local",),
            why_not=(
                "a simulation baseline that averages each planted group's models: the clients report the planted "
                "group of their data, un-noised, and the server groups them by it; only local DP (dp-mode='local', "
                "as pFedLIA's train replies) protects the models"
            ),
        ),
    ),
    "cfl": _m(
        "cfl",
        "CFLStrategy",
        "baselines",
        "ClusterModelClient",
        artifacts="cfl_artifacts",
        options=CFLOptions,
        description="clustered FL (Sattler et al.): bipartition on update cosine similarity",
        privacy=PrivacySupport(why_not="the server splits clusters on the clients' un-noised individual updates"),
    ),
    "pifl": _m(
        "pifl",
        "PIFLStrategy",
        "pifl",
        "PIFLClient",
        artifacts="pifl_artifacts",
        options=PIFLOptions,
        queries=("bid",),
        description="tiers, token auctions and one-shot personalization (tiers, slot-price)",
        privacy=PrivacySupport(
            why_not="clients send un-noised bids and per-tier accuracies, and the server scores each winner's update"
        ),
    ),
    "pifl-ni": _m(
        "pifl",
        "PIFLStrategy",
        "pifl",
        "PIFLClient",
        artifacts="pifl_artifacts",
        options=PIFLOptions,
        queries=("bid",),
        fixed={"pifl-incentive": False},
        description="PI-FL without incentive: random bids",
        privacy=PrivacySupport(
            why_not="clients send un-noised per-tier accuracies, and the server scores each winner's update"
        ),
    ),
    "ifca": _m(
        "ifca",
        "IFCAStrategy",
        "ifca",
        "IFCAClient",
        artifacts="ifca_artifacts",
        options=TierOptions,
        description="IFCA: K cluster models, each client takes the one with the lowest loss (tiers)",
        privacy=PrivacySupport(why_not="each client reports, un-noised, which cluster model fits its data best"),
    ),
    "fedsoft": _m(
        "fedsoft",
        "FedSoftStrategy",
        "fedsoft",
        "FedSoftClient",
        artifacts="fedsoft_artifacts",
        options=FedSoftOptions,
        queries=("fedsoft_u",),
        description="FedSoft: soft clustering, proximal updates towards the centres (tiers, fedsoft-*)",
        privacy=PrivacySupport(
            why_not="each client reports its soft cluster membership, un-noised, and the server samples clients by it"
        ),
    ),
    "client2vec": _m(
        "client2vec",
        "Client2VecStrategy",
        "client2vec",
        "Client2VecClient",
        artifacts="client2vec_artifacts",
        options=Client2VecOptions,
        queries=("c2v_embed", "c2v_ign", "c2v_index"),
        description="CLIP client index; index-aware sampling, aggregation, local loss (c2v-*)",
        privacy=PrivacySupport(
            why_not="clients upload CLIP embeddings of their training images and their client index, un-noised"
        ),
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


#: the query a held-out client (run-config ``holdout-clients``) gets after the last round: it scores what the method
#: gives a client that never trained, before and after fine-tuning it (strategies/newcomers.py)
NEWCOMER = "newcomer"


def all_queries() -> set[str]:
    """Every ``query.<name>`` a ClientApp answers: ``identify`` and ``newcomer`` (all methods) and each method's
    own."""
    return {"identify", NEWCOMER} | {q for spec in METHODS.values() for q in spec.queries}

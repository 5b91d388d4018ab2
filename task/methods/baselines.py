"""Options of the baselines the papers compare against (FedProx, FedRep, Ditto, MOON)."""

from __future__ import annotations

from dataclasses import dataclass

from task.options import OptionSet, option


@dataclass(frozen=True)
class NoOptions(OptionSet):
    """Local, FedAvg, FedPer, FedRoD: nothing of their own."""


@dataclass(frozen=True)
class FedProxOptions(OptionSet):
    proximal_mu: float = option(
        "proximal-mu", 0.01, "FedProx: weight mu of the proximal term mu/2 ||w - w_global||^2", minimum=0.0
    )


@dataclass(frozen=True)
class FedRepOptions(OptionSet):
    head_epochs: int = option(
        "head-epochs", 1, "FedRep: epochs on the head (body frozen) before the body epochs", minimum=0
    )


@dataclass(frozen=True)
class DittoOptions(OptionSet):
    ditto_lambda: float = option(
        "ditto-lambda", 0.1, "Ditto: weight lambda of lambda/2 ||v - w_global||^2 on the personal model", minimum=0.0
    )
    ditto_epochs: int = option("ditto-epochs", 1, "Ditto: epochs on the personal model per round", minimum=0)


@dataclass(frozen=True)
class MoonOptions(OptionSet):
    moon_mu: float = option("moon-mu", 1.0, "MOON: weight of the model-contrastive loss", minimum=0.0)
    moon_temperature: float = option("moon-temperature", 0.5, "MOON: temperature of the contrastive loss", minimum=1e-9)

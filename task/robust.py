"""Robust aggregation as run-config keys: which rule replaces the (weighted) mean wherever a method averages client
models, its parameters, and which method cannot use which rule, and why (docs/robustness.md).

The rules (the math is :mod:`strategies.robust`):

- ``mean`` (default): each method's own average, unchanged (FedAvg's example weights, Client2Vec's index weights, ...);
- ``median``: the coordinate-wise median of the models (no weights);
- ``trimmed-mean``: per coordinate, the mean after cutting ``int(trim-fraction * n)`` values at each end (no weights);
- ``multi-krum``: the ``krum-select`` models with the lowest Krum scores (each model's summed squared distance to its
  ``n - f - 2`` nearest others, ``f = floor(krum-byzantine * n)``), averaged with the method's own weights;
- ``norm-bound``: every update (model minus the model the server sent) clipped to L2 norm ``norm-bound``, then the
  method's own weighted average.

Composition with differential privacy: under ``dp-mode='central'`` only ``mean`` is allowed (the server's noise is
calibrated to the sensitivity of the unweighted mean of clipped updates, ``dp-clip / m``; a median or a selection of
updates moves by more when one client's data changes, so the epsilon reported would be wrong, and central DP already
bounds every update's norm by ``dp-clip``, which is ``norm-bound``'s defence).  Under ``dp-mode='local'`` every rule is
a post-processing of the clients' noised releases and costs no privacy.

This module is the run config's half (``task/`` imports nothing of the app); the refusals are checked at start-up
with every other conflict (:func:`robust_conflicts`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from task.options import OptionSet, option

AGGREGATORS = ("mean", "median", "trimmed-mean", "multi-krum", "norm-bound")
#: every rule that is not the method's own mean
ROBUST_RULES = AGGREGATORS[1:]


@dataclass(frozen=True)
class RobustOptions(OptionSet):
    """The keys of the aggregation rule (every run; docs/robustness.md)."""

    aggregator: str = option(
        "aggregator",
        "mean",
        "how the server averages client models: the method's own mean, or a rule robust to lying clients "
        "(docs/robustness.md)",
        choices=AGGREGATORS,
    )
    trim_fraction: float = option(
        "trim-fraction",
        0.2,
        "trimmed-mean: share of the values cut at each end of every coordinate (int(share * n) of n)",
        minimum=0.0,
        maximum=0.49,
    )
    krum_byzantine: float = option(
        "krum-byzantine",
        0.3,
        "multi-krum: share of each averaged set assumed to lie (f = floor(share * n) of n)",
        minimum=0.0,
        maximum=0.49,
    )
    krum_select: int = option(
        "krum-select", 0, "multi-krum: how many models are averaged (0: n - f, all the rule trusts)", minimum=0
    )
    norm_bound: float = option(
        "norm-bound",
        5.0,
        "norm-bound: L2 bound on each client's update, the change from the model the server sent (rounds.json "
        "lists the updates' norms)",
        minimum=1e-12,
    )

    def byzantine(self, n: int) -> int:
        """f, the number of the ``n`` models Multi-Krum assumes lie: ``floor(krum-byzantine * n)``."""
        return math.floor(self.krum_byzantine * n + 1e-9)

    def selected(self, n: int) -> int:
        """How many of ``n`` models Multi-Krum averages: ``krum-select`` (at most n), or n - f when 0."""
        return min(n, self.krum_select) if self.krum_select else n - self.byzantine(n)


#: why a method averages nothing the rules could replace
_NOTHING_AVERAGED = "no model leaves a client (each trains alone), so there is no average to replace"
_FORWARDS = (
    "its server averages nothing: it forwards every client's latest model to the others, and each client mixes them "
    "with the weights it measures (leave-one-out influence, FedC2I's own defence); a coordinate-wise or selecting rule "
    "has no average to replace.  norm-bound applies: each forwarded model is kept within the bound of the client's "
    "previous one"
)
_FEDCAC_START = (
    "every FedCAC client starts its round from its own mix of the global and its customized model (by its own critical "
    "mask), so the models averaged have no common model the server sent to measure an update against; use median, "
    "trimmed-mean or multi-krum, which need none"
)
_FEDSOFT_START = (
    "FedSoft's clients train their own models (from their previous one, pulled towards a mix of the centres), so the "
    "models averaged into a centre did not start from a model the server sent; use median, trimmed-mean or multi-krum"
)
_P2P_START = (
    "with lia-mode='p2p' every client's beneficial-set model averages peers that each trained their own set's model, "
    "so the models averaged did not start from one model; use median, trimmed-mean or multi-krum, or lia-mode='central'"
)
_C2V_WEIGHTS = (
    "Client2Vec's index-aware aggregation (c2v-aggregation, case study ii) weights each client by its index; {rule} "
    "has no weights and would silently switch it off; use multi-krum or norm-bound (both keep the weights), or "
    "c2v-aggregation=false"
)
_CENTRAL_DP = (
    "under dp-mode='central' the server's noise is calibrated to the unweighted mean of the clipped updates (one "
    "client moves it by at most dp-clip / m); {rule} can move by more when one client's data changes, so the epsilon "
    "reported would not hold{more}; use aggregator='mean' (central DP already bounds every update by dp-clip), or "
    "dp-mode='local', under which every rule is a post-processing of noised releases"
)

#: method -> {rule: why it cannot apply}, whatever the other settings (docs/robustness.md's table)
REFUSED: dict[str, dict[str, str]] = {
    "local": dict.fromkeys(ROBUST_RULES, _NOTHING_AVERAGED),
    "fedc2i": dict.fromkeys(("median", "trimmed-mean", "multi-krum"), _FORWARDS),
    "fedcac": {"norm-bound": _FEDCAC_START},
    "fedsoft": {"norm-bound": _FEDSOFT_START},
}


def refusal(method: str, rule: str, settings: Any) -> str | None:
    """Why ``method`` with these ``settings`` cannot use aggregator ``rule`` (None: it can)."""
    if rule == "mean":
        return None
    if rule in REFUSED.get(method, {}):
        return REFUSED[method][rule]
    options = getattr(settings, "options", None)
    if method == "pfedlia" and rule == "norm-bound" and getattr(options, "mode", "") == "p2p":
        return _P2P_START
    if method == "client2vec" and rule in ("median", "trimmed-mean") and getattr(options, "aggregation", False):
        return _C2V_WEIGHTS.format(rule=rule)
    if getattr(settings, "dp_mode", "off") == "central":
        more = " (and it clips again at its own bound, which dp-clip already is)" if rule == "norm-bound" else ""
        return _CENTRAL_DP.format(rule=rule, more=more)
    return None


def robust_conflicts(method: str, robust: RobustOptions, settings: Any) -> list[str]:
    """Start-up check: the run's aggregator cannot apply to its method, and why (empty: it can)."""
    why = refusal(method, robust.aggregator, settings)
    if why is None:
        return []
    return [f"aggregator={robust.aggregator!r} cannot be used with method {method!r}: {why} (docs/robustness.md)"]

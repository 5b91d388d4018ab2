"""Robust aggregation as run-config keys: which rule replaces the (weighted) mean wherever a method averages client
models, its parameters, what each rule assumes, and which method cannot use which rule, and why (docs/robustness.md).

The rules (the math is :mod:`strategies.robust`):

- ``mean`` (default): each method's own average, unchanged (FedAvg's example weights, Client2Vec's index weights, ...);
- ``median``: the coordinate-wise median of the models (no weights);
- ``trimmed-mean``: per coordinate, the mean after cutting ``c`` values at each end, ``c = int(trim-fraction * n)``,
  or, with ``trim-fraction`` 0 (default), the ``f`` liars ``byzantine-share`` assumes (no weights);
- ``multi-krum``: the ``krum-select`` models with the lowest Krum scores (each model's summed squared distance to its
  ``n - f - 2`` nearest others), averaged with weights capped by ``weight-cap`` (Blanchard et al. 2017);
- ``bulyan``: ``n - 2f`` models chosen one at a time by Krum, then per coordinate the mean of the ``n - 4f`` values
  closest to their median (El Mhamdi et al. 2018; it needs ``n >= 4f + 3``, so ``f`` is lowered to what ``n`` allows);
- ``norm-bound``: every update (model minus the model the server sent) clipped to L2 norm ``norm-bound``, or with
  ``norm-bound`` 0 (default) to ``norm-bound-multiple`` times the median norm of the average's updates, then the
  weighted average with weights capped by ``weight-cap`` (Sun et al. 2019; the median bound as in FLAME);
- ``fltrust``: every update weighted by its trust score (its cosine with the server's own update on a small root data
  set, floored at 0) after scaling it to the norm of the server's update (Cao et al. 2021).

``f``, the number of liars a rule assumes in an average of ``n`` models, is ``floor(byzantine-share * n)``: a share,
so that one setting works for a cluster of 3 as for a cohort of 30 (a small set may assume no liar at all).

Size weights are self-reported (``num-examples``, up to 2^31 - 1): ``weight-cap`` 1 (default) averages what the rule
keeps uniformly, as the papers do; a cap ``c > 1`` lets no client hold more than ``c / m`` of an average of ``m``
models; 0 keeps the method's weights as they are.

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

AGGREGATORS = ("mean", "median", "trimmed-mean", "multi-krum", "bulyan", "norm-bound", "fltrust")
#: every rule that is not the method's own mean
ROBUST_RULES = AGGREGATORS[1:]
#: the rules that measure an update against the model the server sent (they need one common model to start from)
NEEDS_REFERENCE = ("norm-bound", "fltrust")
#: the rules that average without the method's weights (median, trimmed mean, Bulyan) or with weights of their own
#: (FLTrust's trust scores)
DROPS_WEIGHTS = ("median", "trimmed-mean", "bulyan", "fltrust")
#: the rules whose average is weighted by the method's weights under ``weight-cap``
KEEPS_WEIGHTS = ("multi-krum", "norm-bound")
#: what a train reply may claim as its number of examples (Flower's count limit): the size lie's largest claim
LARGEST_SIZE = 2**31 - 1


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
    byzantine_share: float = option(
        "byzantine-share",
        0.3,
        "share of every averaged set the rules assume may lie: f = floor(share * n) of n (trimmed-mean cuts f at each "
        "end unless trim-fraction is set; multi-krum and bulyan assume f)",
        minimum=0.0,
        maximum=0.49,
    )
    trim_fraction: float = option(
        "trim-fraction",
        0.0,
        "trimmed-mean: share of the values cut at each end of every coordinate (int(share * n) of n); 0: the f liars "
        "byzantine-share assumes",
        minimum=0.0,
        maximum=0.49,
    )
    krum_select: int = option(
        "krum-select", 0, "multi-krum: how many models are averaged (0: n - f, all the rule trusts)", minimum=0
    )
    norm_bound: float = option(
        "norm-bound",
        0.0,
        "norm-bound: L2 bound on each client's update, the change from the model the server sent; 0: "
        "norm-bound-multiple times the median norm of the updates of each average (rounds.json lists the norms)",
        minimum=0.0,
    )
    norm_bound_multiple: float = option(
        "norm-bound-multiple",
        1.0,
        "norm-bound with norm-bound=0: each average's bound as a multiple of the median norm of its updates",
        minimum=1e-6,
    )
    weight_cap: float = option(
        "weight-cap",
        1.0,
        "multi-krum and norm-bound: no client holds more than weight-cap / m of an average of m models (1: uniform, "
        "as the papers average; 0: the method's own weights, self-reported sizes included, uncapped)",
        minimum=0.0,
    )
    fltrust_root_size: int = option(
        "fltrust-root-size",
        100,
        "fltrust: examples in the server's root data set (drawn from the embedded data set, never from a client's "
        "validation or test split)",
        minimum=1,
    )
    fltrust_root: str = option(
        "fltrust-root",
        "",
        "fltrust: an .npz file with arrays x and y on the server's machine, the operator's root data set (empty: "
        "drawn from the embedded data set, as in simulation)",
    )

    def byzantine(self, n: int) -> int:
        """f, the number of the ``n`` models the rules assume lie: ``floor(byzantine-share * n)``."""
        return math.floor(self.byzantine_share * n + 1e-9)

    def trimmed(self, n: int) -> int:
        """How many of ``n`` values the trimmed mean cuts at each end: ``int(trim-fraction * n)``, or f when 0."""
        return int(self.trim_fraction * n) if self.trim_fraction else self.byzantine(n)

    def selected(self, n: int) -> int:
        """How many of ``n`` models Multi-Krum averages: ``krum-select`` (at most n), or n - f when 0."""
        return min(n, self.krum_select) if self.krum_select else n - self.byzantine(n)

    def bulyan_byzantine(self, n: int) -> int:
        """The f Bulyan runs with on ``n`` models: the assumed f, lowered to the largest its ``n >= 4f + 3`` allows."""
        return max(0, min(self.byzantine(n), (n - 3) // 4))

    def tolerated(self, n: int) -> int | None:
        """How many liars among ``n`` models the rule's guarantee allows (None: the rule states no such number).

        median: fewer than half; trimmed mean: as many as it cuts; Multi-Krum: f where ``n >= 2f + 3``, else none;
        Bulyan: the f it runs with; norm-bound with the median bound: fewer than half (the median norm is then an
        honest one); a fixed norm bound and FLTrust bound no number of liars (the first bounds each one's pull, the
        second trusts its root data set)."""
        rule = self.aggregator
        if rule == "median":
            return (n - 1) // 2
        if rule == "trimmed-mean":
            return self.trimmed(n)
        if rule == "multi-krum":
            f = self.byzantine(n)
            return f if n >= 2 * f + 3 else 0
        if rule == "bulyan":
            return self.bulyan_byzantine(n)
        if rule == "norm-bound" and not self.norm_bound:
            return (n - 1) // 2
        return None


#: why a method averages nothing the rules could replace
_NOTHING_AVERAGED = "no model leaves a client (each trains alone), so there is no average to replace"
_FORWARDS = (
    "its server averages nothing: it forwards every client's latest model to the others, and each client mixes them "
    "with the weights it measures (leave-one-out influence, FedC2I's own weighting); {rule} would replace that mix.  "
    "multi-krum chooses which peers each client mixes (its own model always kept), norm-bound keeps each forwarded "
    "model within the bound of the client's previous one"
)
_FEDCAC_START = (
    "every FedCAC client starts its round from its own mix of the global and its customized model (by its own critical "
    "mask), so the models averaged have no common model the server sent to measure an update against; use median, "
    "trimmed-mean, multi-krum or bulyan, which need none"
)
_FEDSOFT_START = (
    "FedSoft's clients train their own models (from their previous one, pulled towards a mix of the centres), so the "
    "models averaged into a centre did not start from a model the server sent; use median, trimmed-mean, multi-krum "
    "or bulyan"
)
_P2P_START = (
    "with lia-mode='p2p' every client's beneficial-set model averages peers that each trained their own set's model, "
    "so the models averaged did not start from one model; use median, trimmed-mean, multi-krum or bulyan, or "
    "lia-mode='central'"
)
_PART_OF_A_MODEL = (
    "the server averages only part of the model ({part}), so it has no whole model to train on its root data set; use "
    "median, trimmed-mean, multi-krum, bulyan or norm-bound"
)
_C2V_FLTRUST = (
    "Client2Vec's server also averages its DSA-IGN (global mode), which the root data set cannot train, and its "
    "index-aware aggregation weights each client by its index; use multi-krum or norm-bound"
)
_C2V_WEIGHTS = (
    "Client2Vec's index-aware aggregation (c2v-aggregation, case study ii) weights each client by its index; {rule} "
    "would silently switch it off; use multi-krum or norm-bound with weight-cap=0 (the index weights, uncapped) or a "
    "cap above 1, or c2v-aggregation=false"
)
_CENTRAL_DP = (
    "under dp-mode='central' the server's noise is calibrated to the unweighted mean of the clipped updates (one "
    "client moves it by at most dp-clip / m); {rule} can move by more when one client's data changes, so the epsilon "
    "reported would not hold{more}; use aggregator='mean' (central DP already bounds every update by dp-clip), or "
    "dp-mode='local', under which every rule is a post-processing of noised releases"
)
_PARTS = {"fedper": "the body", "fedrep": "the body", "lgfedavg": "the head", "fedbn": "all but the normalisation"}

#: method -> {rule: why it cannot apply}, whatever the other settings (docs/robustness.md's table)
REFUSED: dict[str, dict[str, str]] = {
    "local": dict.fromkeys(ROBUST_RULES, _NOTHING_AVERAGED),
    "fedc2i": {rule: _FORWARDS.format(rule=rule) for rule in ("median", "trimmed-mean", "bulyan", "fltrust")},
    "fedcac": dict.fromkeys(NEEDS_REFERENCE, _FEDCAC_START),
    "fedsoft": dict.fromkeys(NEEDS_REFERENCE, _FEDSOFT_START),
    **{method: {"fltrust": _PART_OF_A_MODEL.format(part=part)} for method, part in _PARTS.items()},
    "client2vec": {"fltrust": _C2V_FLTRUST},
}


def refusal(method: str, rule: str, settings: Any) -> str | None:
    """Why ``method`` with these ``settings`` cannot use aggregator ``rule`` (None: it can)."""
    if rule == "mean":
        return None
    if rule in REFUSED.get(method, {}):
        return REFUSED[method][rule]
    options = getattr(settings, "options", None)
    if method == "pfedlia" and rule in NEEDS_REFERENCE and getattr(options, "mode", "") == "p2p":
        return _P2P_START
    if method == "client2vec" and getattr(options, "aggregation", False):
        robust = getattr(settings, "robust", None)
        uniform = rule in KEEPS_WEIGHTS and robust is not None and robust.weight_cap == 1
        if rule in DROPS_WEIGHTS or uniform:
            return _C2V_WEIGHTS.format(rule=rule + (" with weight-cap=1 (uniform)" if uniform else ""))
    if getattr(settings, "dp_mode", "off") == "central":
        more = " (and it clips again at its own bound, which dp-clip already is)" if rule == "norm-bound" else ""
        return _CENTRAL_DP.format(rule=rule, more=more)
    return None


def robust_conflicts(method: str, robust: RobustOptions, settings: Any) -> list[str]:
    """Start-up check: the run's aggregator cannot apply to its method, and why (empty: it can)."""
    out = []
    if 0 < robust.weight_cap < 1:
        out.append(
            f"weight-cap={robust.weight_cap:g} is impossible: an average of m models cannot give every one less than "
            "1 / m; use 1 (uniform), a cap above 1, or 0 (the method's own weights)"
        )
    why = refusal(method, robust.aggregator, settings)
    if why is not None:
        out.append(
            f"aggregator={robust.aggregator!r} cannot be used with method {method!r}: {why} (docs/robustness.md)"
        )
    return out

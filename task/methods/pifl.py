"""PI-FL's, IFCA's and FedSoft's options, and the PI-FL math both sides use: the client's bid rule and its
one-shot mixture weights (docs/methods/pifl.md)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from task.options import OptionSet, option

#: 1 token in the integer ledger
MICRO = 10**6


@dataclass(frozen=True)
class TierOptions(OptionSet):
    tiers: int = option("tiers", 2, "number of tier (PI-FL), cluster (IFCA) or centre (FedSoft) models", minimum=1)


@dataclass(frozen=True)
class PIFLOptions(TierOptions):
    slots_performance: int = option(
        "slots-performance", 4, "slots per tier for the best bidders by Shapley score", minimum=0
    )
    slots_random: int = option("slots-random", 1, "slots per tier drawn at random from the other bidders", minimum=0)
    max_bids: int = option(
        "max-bids", 1, "tiers a client may bid for per round (this version: 1)", minimum=1, maximum=1
    )
    bid_threshold: float = option(
        "bid-threshold",
        0.9,
        "a client bids for every tier at least this accurate on its validation split (and always for its best)",
        minimum=0.0,
        maximum=1.0,
    )
    initial_tokens: float = option("initial-tokens", 100.0, "tokens every client starts with", minimum=0.0)
    slot_price: float = option("slot-price", 1.0, "tokens a winning bidder pays for a slot", minimum=1e-6)
    max_refund: float = option(
        "max-refund", 1.0, "largest share of a tier's pool refunded when it did not improve", minimum=0.0, maximum=1.0
    )
    full_use_gain: float = option(
        "full-use-gain", 0.1, "relative accuracy gain at which nothing is refunded", minimum=1e-6, maximum=1.0
    )
    incentive: bool = option(
        "pifl-incentive", True, "bids follow the clients' tier accuracies (false: random bids, PI-FL(NI))"
    )
    server_set_size: int = option(
        "server-set-size", 500, "samples of the server's IID set for Shapley scores", minimum=1
    )
    personal: str = option(
        "pifl-personal",
        "mixture",
        "each client's personalized model: the Eq. 4 mixture of the tier models (the paper's), or, with 'choose', "
        "whichever of the mixture and its single most accurate tier scores higher on its calibration split",
        choices=("mixture", "choose"),
    )

    def conflicts(self, settings) -> list[str]:
        problems = []
        if self.slots_performance + self.slots_random < 1:
            problems.append("slots-performance + slots-random must be >= 1: a tier with no slot never trains")
        if self.tiers > settings.min_nodes:
            problems.append(
                f"tiers={self.tiers} is more than min-nodes={settings.min_nodes}: the first round's random tiering "
                f"could leave a tier without a client; use tiers <= min-nodes"
            )
        if settings.data.dataset == "dialects":
            problems.append(
                "PI-FL's profiler scores every update on a server-side sample of the data set, and dataset "
                "'dialects' has none (each client generates its own text); use an image data set or "
                "'synth-concept'"
            )
        return problems

    def client_conflicts(self, clients: int) -> list[str]:
        """With every available client fitting in one tier's slots, every bidder always wins: no auction."""
        slots = self.slots_performance + self.slots_random
        if slots >= clients:
            return [
                (
                    f"slots-performance + slots-random = {slots} is not less than the {clients} connected clients: "
                    "every bidder would win every round and the auction would decide nothing; use fewer slots or more "
                    "clients"
                )
            ]
        return []


@dataclass(frozen=True)
class FedSoftOptions(TierOptions):
    clients_per_cluster: int = option(
        "fedsoft-clients-per-cluster", 5, "FedSoft: clients drawn per centre and round", minimum=1
    )
    estimate_every: int = option(
        "fedsoft-estimate-every", 2, "FedSoft: rounds between importance-weight estimates", minimum=1
    )
    lam: float = option("fedsoft-lambda", 0.1, "FedSoft: weight of the proximal term towards the centres", minimum=0.0)


def bid_policy(
    accuracies: list[float], balance: int, price: int, threshold: float = 0.9, max_bids: int = 1
) -> list[int]:
    """Alg. 1 lines 5-6 as pifl.md §2.2 resolves them: {k : a_k >= T_h} ∪ {argmax a}, the best ``max_bids``;
    no bid when the balance cannot pay the price."""
    if balance < price or not accuracies:
        return []
    acc = np.asarray(accuracies, float)
    chosen = set(np.flatnonzero(acc >= threshold).tolist()) | {int(np.argmax(acc))}
    return sorted(sorted(chosen, key=lambda k: (-acc[k], k))[:max_bids])


def personal_weights(accuracies: list[float], mixture_accuracy: float | None = None) -> np.ndarray:
    """The weights of a client's personalized model over the tier models.

    ``mixture_accuracy`` None: the Eq. 4 mixture (:func:`mixture_weights`).  Otherwise (``pifl-personal='choose'``)
    the client compares, on the same calibration data the ``accuracies`` were measured on, the mixture's accuracy
    with its single most accurate tier's (the lowest index among equals): one-hot weights on that tier when it
    scores strictly higher, else the mixture.
    """
    weights = mixture_weights(accuracies)
    if mixture_accuracy is None:
        return weights
    best = int(np.argmax(np.asarray(accuracies, float)))
    if accuracies[best] > mixture_accuracy:
        return np.eye(len(accuracies))[best]
    return weights


def mixture_weights(accuracies: list[float]) -> np.ndarray:
    """Eq. 4 weights normalised over tiers (pifl.md §2.2): a_k / sum a; uniform when every a_k is 0."""
    acc = np.clip(np.asarray(accuracies, float), 0.0, None)
    return acc / acc.sum() if acc.sum() > 0 else np.full(len(acc), 1.0 / len(acc))

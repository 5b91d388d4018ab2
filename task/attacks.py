"""Poisoning attacks a run can inject (run-config ``attack``): who attacks, from which round, and the data-side
changes both halves of the app must agree on (the backdoor trigger, the flipped labels).

Which clients attack is a function of the run config and the partition id alone (:func:`is_attacker`), so the
ClientApp in simulation, every SuperNode of a deployment and the server (which reports the honest clients'
accuracy and what the method did with the attackers) agree without a message saying so.  The attackers are spread
evenly over the partition ids: partition ``p`` attacks when ``round_half_up((p + 1) * share)`` exceeds
``round_half_up(p * share)``, so that the first ``N`` partitions hold ``round_half_up(N * share)`` attackers for every
``N`` (10 clients at share 0.3: partitions 1, 4 and 8).

The kinds (docs/robustness.md says exactly what each changes; client_app/attacks.py applies them):

- ``label-flip``: the attacker trains on its data with every label ``y`` replaced by ``C - 1 - y``;
- ``sign-flip``: its train reply's model is ``r - attack-scale * (w - r)``, its update flipped and scaled (model
  replacement), ``r`` the model it received and ``w`` the one it trained;
- ``noise``: its train reply's model is ``r + N(0, attack-noise^2)``, an update of pure noise;
- ``backdoor``: half of its training examples carry a trigger (a bright square in the images' bottom-right corner,
  or the last features of a vector set high) and the label ``backdoor-target``; every client reports how often its
  model sends triggered test inputs of other classes to the target (``backdoor-success``);
- ``free-rider``: its train reply's model is ``r``, the model it received, untrained;
- ``side-channel``: it trains honestly but lies in the method's side channel (:data:`SIDE_CHANNELS`);
- ``alie``, ``min-max``, ``min-sum``: attacks that know the honest updates (:data:`KNOWING_ATTACKS`): the attacker
  estimates them by training, from the model it received, on every client's training split (the strongest attacker,
  who knows every client's data; client_app/attack_math.py crafts the update), and sends the received model plus the
  crafted update: ALIE (Baruch et al. 2019) and the AGR-agnostic min-max and min-sum (Shejwalkar and Houmansadr 2021);
- ``model-replacement``: the backdoor boosted (Bagdasaryan et al. 2020): it trains on its backdoored data, then sends
  ``r + attack-scale * (w - r)``, so that, averaged with weight ``1 / attack-scale``, its model replaces the average.

Whatever the kind, ``attack-num-examples`` > 0 is the size lie: the attacker's train replies claim that many training
examples (up to 2^31 - 1, the largest count a reply may carry), which weighs its model wherever a method weighs by size.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from task.options import OptionSet, option

ATTACKS = (
    "none",
    "label-flip",
    "sign-flip",
    "noise",
    "backdoor",
    "free-rider",
    "side-channel",
    "alie",
    "min-max",
    "min-sum",
    "model-replacement",
)
#: the kinds that craft their model from an estimate of the honest updates (client_app/attack_math.py)
KNOWING_ATTACKS = ("alie", "min-max", "min-sum")
#: the kinds that change the model a train reply carries
MODEL_ATTACKS = ("sign-flip", "noise", "free-rider", *KNOWING_ATTACKS, "model-replacement")
#: the kinds that change the attacker's training data
DATA_ATTACKS = ("label-flip", "backdoor", "model-replacement")
#: the kinds that plant the backdoor trigger (every client then reports ``backdoor-success``)
BACKDOOR_ATTACKS = ("backdoor", "model-replacement")
#: the largest count a reply may carry (Flower's and the reply checks' limit): the size lie's largest claim
LARGEST_COUNT = 2**31 - 1
#: the share of an attacker's training examples that carry the backdoor trigger
POISONED_SHARE = 0.5
#: a tag in the seeds of the attacks' random draws, so they repeat no other random stream of the run
ATTACK_STREAM = 38
#: the trigger's value: images are scaled to [0, 1], so 1 is the brightest pixel; vector features are standardised,
#: so 3 is three standard deviations out
IMAGE_TRIGGER, VECTOR_TRIGGER = 1.0, 3.0

#: method -> the lie its side channel carries under ``attack='side-channel'`` (client_app/attacks.py)
SIDE_CHANNELS: dict[str, str] = {
    "fedcac": "an all-ones critical mask (it claims every parameter is critical, so every client overlaps it fully)",
    "pifl": "a bid in every round it can pay for the tier whose model fits its data worst (so that its updates land "
    "among clients unlike it), and every tier accuracy reported as 1 (in bids and evaluations, which set the tiers' "
    "utility and refunds)",
    "pifl-ni": "bids for a tier in every round it can pay and every tier accuracy reported as 1 (evaluations set the "
    "tiers' utility and refunds)",
    "pfedlia": "an inflated influence row (every peer's lazy model scored attack-scale times the row's largest "
    "magnitude; peer-to-peer: every peer named beneficial)",
    "fedsoft": "a forged importance vector: all weight on the centre that fits its data worst",
    "client2vec": "a forged index: both halves replaced by a uniform vector of the same norm",
    "ifca": "the cluster whose model fits its data worst claimed as its choice, while its model is the one it trained "
    "from the cluster model that fits it best",
}
#: method -> why it has no side channel a lie could use (docs/robustness.md; the side-channel attack is refused)
NO_SIDE_CHANNEL: dict[str, str] = {
    "fedc2i": "its influence vector is only recorded by the server (no client's computation reads another's), and "
    "each client measures its peers' influence itself",
    "cfl": "its clusters are split by the updates themselves, which the model attacks change",
}


@dataclass(frozen=True)
class AttackOptions(OptionSet):
    """The keys of an injected attack (every run; docs/robustness.md)."""

    attack: str = option(
        "attack",
        "none",
        "poisoning attack some clients run (docs/robustness.md; none: every client honest)",
        choices=ATTACKS,
    )
    attack_share: float = option(
        "attack-share",
        0.3,
        "share of the clients that attack, spread evenly over the partition ids (round(N * share) of N)",
        minimum=0.0,
        maximum=1.0,
    )
    attack_start: int = option("attack-start", 1, "the first round in which the attackers attack", minimum=1)
    attack_scale: float = option(
        "attack-scale",
        10.0,
        "sign-flip: the factor of the flipped update; model-replacement: of the backdoored update (the number of "
        "clients averaged replaces the average); side-channel (pFedLIA): of the inflated influence row",
        minimum=0.0,
    )
    attack_noise: float = option("attack-noise", 1.0, "noise: the standard deviation of the noise update", minimum=0.0)
    backdoor_target: int = option(
        "backdoor-target", 0, "backdoor, model-replacement: the class triggered inputs are relabelled to", minimum=0
    )
    attack_num_examples: int = option(
        "attack-num-examples",
        0,
        "the size lie: the number of training examples an attacker's train replies claim (0: its true number)",
        minimum=0,
        maximum=LARGEST_COUNT,
    )

    @property
    def active(self) -> bool:
        return self.attack != "none"


def _round_half_up(x: float) -> int:
    return math.floor(x + 0.5 + 1e-9)


def is_attacker(partition_id: int, share: float) -> bool:
    """Whether partition ``partition_id`` attacks at ``share`` (see the module docstring: spread evenly)."""
    return _round_half_up((partition_id + 1) * share) > _round_half_up(partition_id * share)


def attackers(options: AttackOptions, clients: Any) -> list[int]:
    """The attackers among ``clients`` (partition ids), sorted; none without an attack."""
    if not options.active:
        return []
    return sorted(int(c) for c in clients if is_attacker(int(c), options.attack_share))


def attacking(options: AttackOptions, partition_id: int, server_round: int) -> bool:
    """Whether partition ``partition_id`` runs the run's attack in ``server_round``."""
    return options.active and server_round >= options.attack_start and is_attacker(partition_id, options.attack_share)


def attack_rng(seed: int, partition_id: int, server_round: int) -> np.random.Generator:
    """The attacker's random draws of one round (the noise update): seeded by the run, the partition and the round."""
    return np.random.default_rng([int(seed), int(partition_id), int(server_round), ATTACK_STREAM])


# ---------------------------------------------------------------------------------------------- the data side
def flipped_labels(y: torch.Tensor, num_classes: int) -> torch.Tensor:
    """Label flipping: ``C - 1 - y``."""
    return (num_classes - 1) - y


def with_trigger(x: torch.Tensor) -> torch.Tensor:
    """``x`` (a batch) with the backdoor trigger: images (N, C, H, W) get a square of side ``max(2, H // 8)`` in the
    bottom-right corner set to :data:`IMAGE_TRIGGER` in every channel; vectors (N, D) their last ``max(1, D // 8)``
    features set to :data:`VECTOR_TRIGGER`.  A copy; ``x`` is unchanged."""
    out = x.clone()
    if out.ndim == 4:
        side = max(2, out.shape[-2] // 8)
        out[..., -side:, -side:] = IMAGE_TRIGGER
    elif out.ndim == 2:
        out[:, -max(1, out.shape[1] // 8) :] = VECTOR_TRIGGER
    else:
        raise ValueError(
            f"the backdoor trigger needs images (N, C, H, W) or vectors (N, D), got shape {tuple(x.shape)}"
        )
    return out


def poisoned_rows(n: int, seed: int, partition_id: int) -> np.ndarray:
    """Which of an attacker's ``n`` training examples carry the backdoor (``POISONED_SHARE`` of them, fixed per
    run and partition), sorted."""
    rng = np.random.default_rng([int(seed), int(partition_id), ATTACK_STREAM])
    return np.sort(rng.choice(n, size=int(n * POISONED_SHARE), replace=False))


def poisoned_data(data: Any, options: AttackOptions, num_classes: int, seed: int, partition_id: int) -> Any:
    """An attacker's :class:`~task.data.ClientData` under a data attack: its training split relabelled (label-flip)
    or half of it triggered and relabelled to the target (backdoor).  Validation and test splits are unchanged."""
    if options.attack == "label-flip":
        return dataclasses.replace(data, y_train=flipped_labels(data.y_train, num_classes))
    if options.attack in BACKDOOR_ATTACKS:
        rows = torch.from_numpy(poisoned_rows(len(data.y_train), seed, partition_id))
        x, y = data.x_train.clone(), data.y_train.clone()
        x[rows] = with_trigger(x[rows])
        y[rows] = options.backdoor_target
        return dataclasses.replace(data, x_train=x, y_train=y)
    return data


def backdoor_inputs(x: torch.Tensor, y: torch.Tensor, target: int) -> torch.Tensor:
    """The triggered test inputs the backdoor's success is measured on: every input whose label is not the target."""
    return with_trigger(x[y != target])


# ---------------------------------------------------------------------------------------------- start-up checks
def attack_conflicts(options: AttackOptions, method: str, settings: Any) -> list[str]:
    """Why this attack cannot run with this method and data (empty: it can); checked at start-up."""
    if not options.active:
        return []
    out = []
    kind = options.attack
    if kind in MODEL_ATTACKS and method == "local":
        out.append(f"attack={kind!r} changes the model a train reply carries, but method 'local' sends none")
    if kind == "side-channel" and method not in SIDE_CHANNELS:
        why = f" ({NO_SIDE_CHANNEL[method]})" if method in NO_SIDE_CHANNEL else ""
        out.append(
            f"attack='side-channel' lies in a method's side channel, which method {method!r} has none of here{why}; "
            f"the methods with one: {sorted(SIDE_CHANNELS)}"
        )
    if kind == "side-channel" and method == "client2vec" and not getattr(settings.options, "enabled", True):
        out.append(
            "attack='side-channel' forges Client2Vec's client index, but with every case study off "
            "(c2v-sampling, c2v-aggregation, c2v-local all false) no index is collected"
        )
    if kind in DATA_ATTACKS and settings.data.dataset == "dialects":
        out.append(
            f"attack={kind!r} changes class labels, but dataset 'dialects' is next-word prediction (every token is a "
            "label); use an image or vector data set"
        )
    if kind in BACKDOOR_ATTACKS and options.backdoor_target >= settings.num_classes:
        out.append(
            f"backdoor-target={options.backdoor_target} is not a class of dataset {settings.data.dataset!r} "
            f"(classes 0..{settings.num_classes - 1})"
        )
    if options.attack_start > settings.num_rounds:
        out.append(
            f"attack-start={options.attack_start} is after the last round (num-server-rounds={settings.num_rounds}): "
            "no round would be attacked"
        )
    return out


def backdoor_metrics(
    options: AttackOptions, model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor
) -> dict[str, float]:
    """Under a backdoor (``backdoor``, ``model-replacement``) a client's ``backdoor-success``: the share of its
    triggered test inputs of other classes that ``model`` (its personalized model) sends to ``backdoor-target``; nothing
    when it has no such input."""
    if options.attack not in BACKDOOR_ATTACKS:
        return {}
    triggered = backdoor_inputs(x, y, options.backdoor_target)
    if len(triggered) == 0:
        return {}
    from task.train import evaluate

    _, success = evaluate(model, triggered, torch.full((len(triggered),), options.backdoor_target, dtype=y.dtype))
    return {"backdoor-success": float(success)}

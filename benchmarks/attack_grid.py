"""The specification of the robustness grid (``python -m benchmarks.robustness`` runs it; ``reporting/robustness.py``
renders it): which methods, attacks, shares of attackers, aggregation rules and seeds, the run settings, and the
order in which the runs are made.

The grid is every combination of

- a method (``METHODS``): FedAvg and two personalized baselines that keep part of the model home (Ditto, FedRep),
  the methods that choose whom to trust (FedCAC's collaborators, FedC2I's influence weights, pFedLIA's and CFL's
  clusters, IFCA's chosen cluster, PI-FL's tiers);
- an attack (``ATTACKS``, docs/robustness.md): none, scaled sign-flip (model replacement), label flip, backdoor, and
  the method's own side-channel lie;
- a share of attacking clients (``SHARES``: 10 % and 30 %; none for the run without an attack);
- an aggregation rule (``AGGREGATORS``): the mean, the coordinate-wise median, the trimmed mean, Multi-Krum;
- a seed (``SEEDS``): the same seed gives the same data to every cell, so two cells pair seed by seed.

A combination the app refuses at start-up (a side-channel lie for a method without a side channel; a rule FedC2I
has no average for) is not run: the script records the refusal once per method, attack and rule, with the reason
the app gives.

Run settings (``COMMON``, ``CLIENTS``): the defaults a user gets (digits, Dirichlet labels alpha 0.5, the default
model, 10 rounds, every client in every round) on 10 simulated clients; the attack's own keys at their defaults
(``attack-start`` 1, ``attack-scale`` 10, ``backdoor-target`` 0) and so the rules' (``trim-fraction`` 0.2,
``krum-byzantine`` 0.3); no model files, checkpoints or TensorBoard files (only the scores are kept).

The order (``STEPS``) makes a partial run as useful as it can be: first the headline (no attack and sign-flip by 30 %
of the clients, under the mean and Multi-Krum, seeds 0 and 1), then the median, the third seed, the trimmed mean,
the other attacks by 30 % of the clients, and last everything by 10 %.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

GRID = "robustness"
#: one record per refused (method, attack, aggregator): a refusal depends on neither the share nor the seed
REFUSED_GRID = "robustness-refused"
CLIENTS = 10
METHODS = ("fedavg", "ditto", "fedrep", "fedcac", "fedc2i", "pfedlia", "cfl", "ifca", "pifl")
NO_ATTACK = "none"
ATTACKS = (NO_ATTACK, "sign-flip", "label-flip", "backdoor", "side-channel")
SHARES = (0.1, 0.3)
AGGREGATORS = ("mean", "median", "trimmed-mean", "multi-krum")
SEEDS = (0, 1, 2)
#: every run: no model files, checkpoints or TensorBoard event files (the record keeps the scores)
COMMON: dict[str, Any] = {"save-models": False, "checkpoint-every": 0, "tensorboard": False}


@dataclass(frozen=True)
class Cell:
    """One combination of the grid (``share`` is 0 for the run without an attack)."""

    method: str
    attack: str
    share: float
    aggregator: str
    seed: int

    @property
    def coordinates(self) -> dict[str, Any]:
        """The record's ``cell``."""
        return {
            "method": self.method,
            "attack": self.attack,
            "attackers": self.share,
            "aggregator": self.aggregator,
            "seed": self.seed,
        }

    @property
    def refusal_coordinates(self) -> dict[str, Any]:
        """The ``cell`` of the record that says the app refused this combination."""
        return {"method": self.method, "attack": self.attack, "aggregator": self.aggregator}

    @property
    def config(self) -> dict[str, Any]:
        """The run config: the method, the seed, the rule and the attack, and ``COMMON``."""
        cfg: dict[str, Any] = {"method": self.method, "seed": self.seed, **COMMON}
        if self.aggregator != "mean":
            cfg["aggregator"] = self.aggregator
        if self.attack != NO_ATTACK:
            cfg |= {"attack": self.attack, "attack-share": self.share}
        return cfg


def attack_shares(attacks: Iterable[str] = ATTACKS, shares: Iterable[float] = SHARES) -> list[tuple[str, float]]:
    """The (attack, share) pairs: the run without an attack once (share 0), every attack at every share."""
    shares = tuple(shares)
    return [(a, 0.0) for a in attacks if a == NO_ATTACK] + [(a, s) for a in attacks if a != NO_ATTACK for s in shares]


def cells(
    methods: Iterable[str] = METHODS,
    attacks: Iterable[str] = ATTACKS,
    shares: Iterable[float] = SHARES,
    aggregators: Iterable[str] = AGGREGATORS,
    seeds: Iterable[int] = SEEDS,
) -> list[Cell]:
    """Every combination, in table order (method, attack, share, rule, seed)."""
    return [
        Cell(m, a, s, g, seed)
        for m, (a, s), g, seed in itertools.product(
            methods, attack_shares(attacks, shares), tuple(aggregators), tuple(seeds)
        )
    ]


@dataclass(frozen=True)
class Step:
    """A block of the order: these (attack, share) pairs under these rules at these seeds."""

    name: str
    attacks: tuple[tuple[str, float], ...]
    aggregators: tuple[str, ...]
    seeds: tuple[int, ...]

    def covers(self, cell: Cell) -> bool:
        return (
            (cell.attack, cell.share) in self.attacks
            and cell.aggregator in self.aggregators
            and cell.seed in self.seeds
        )


_HEADLINE = ((NO_ATTACK, 0.0), ("sign-flip", 0.3))
#: the order of the runs: a step's runs seed by seed, every method within a seed
STEPS = (
    Step("no attack and sign-flip by 30 %, mean and Multi-Krum, seeds 0-1", _HEADLINE, ("mean", "multi-krum"), (0, 1)),
    Step("the same under the median", _HEADLINE, ("median",), (0, 1)),
    Step("the same at seed 2", _HEADLINE, ("mean", "multi-krum", "median"), (2,)),
    Step("the same under the trimmed mean", _HEADLINE, ("trimmed-mean",), SEEDS),
    Step(
        "label flip, backdoor and side-channel lies by 30 %",
        (("label-flip", 0.3), ("backdoor", 0.3), ("side-channel", 0.3)),
        AGGREGATORS,
        SEEDS,
    ),
    Step("every attack by 10 %", tuple((a, 0.1) for a in ATTACKS if a != NO_ATTACK), AGGREGATORS, SEEDS),
)


def step_of(cell: Cell) -> int:
    """The index of the first step that covers ``cell`` (``len(STEPS)``: none does; such a cell runs last)."""
    return next((i for i, step in enumerate(STEPS) if step.covers(cell)), len(STEPS))


def in_order(chosen: Iterable[Cell]) -> list[Cell]:
    """``chosen`` in the order of the steps: step, then seed, then table order (method, attack, share, rule)."""
    chosen = list(chosen)
    position = {c: i for i, c in enumerate(cells())}
    return sorted(chosen, key=lambda c: (step_of(c), c.seed, position.get(c, len(position))))

"""The robustness grid as data: every run config it runs, with the cell each run fills (``python -m
benchmarks.robustness`` runs them, or writes them for ``python -m server_app.sweep``; ``reporting/robustness.py``
renders the records).

The grid is every combination of

- a method and the data it is measured on (``METHODS``, ``SETTINGS``): each method where its own mechanism acts, so
  that its rows are its own and not FedAvg's.  FedAvg and two personalized baselines that keep part of the model
  home (Ditto, FedRep), FedCAC, FedC2I, IFCA and PI-FL on the defaults a user gets (digits, Dirichlet labels alpha 0.5:
  ``label-skew``); pFedLIA and CFL on two planted groups of label sets (``planted-clusters``), where they form clusters,
  with FedAvg beside them;
- an attack (``ATTACKS``: its run-config keys) by 10 % and by 30 % of the clients (``SHARES``), or none; the
  side-channel lie only for the methods with a side channel that reaches other clients, and where an honest run's
  outcome depends on that channel (``SIDE_CHANNEL_SETTINGS``);
- every aggregation rule the method accepts (``RULES``; the app refuses the others at start-up, with its reason: the
  script records the refusal, it does not run it);
- a seed (``SEEDS``): the same seed gives every cell of a setting the same data, so cells pair seed by seed.

The run without an attack is ``attack='backdoor'`` at ``attack-share`` 0: no client attacks, so it trains exactly as
``attack='none'`` does (tests/robust pin it), and every client reports how often the trigger sends its inputs to the
target although no backdoor was planted: the baseline the backdoors' success is compared with.

Run settings: the defaults a user gets otherwise (10 clients, 10 rounds, the default model, every client in every
round), the attacks' and rules' keys at their defaults (``attack-start`` 1, ``attack-scale`` 10, ``backdoor-target``
0; ``byzantine-share`` 0.3, so the rules assume up to 30 % liars in every average and the no-attack run is shared by
the 10 % and the 30 % attacks; ``weight-cap`` 1; the median norm bound); no model files, checkpoints or TensorBoard
files (only the scores are kept).

The order (:func:`in_order`) makes a partial run as useful as it can be: seed by seed, so that every cell has a first
seed before any has a second, and within a seed the runs without an attack first, then the attacks by 30 %, then by
10 %.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

GRID = "robustness"
#: one record per refused (setting, method, attack, aggregator): a refusal depends on neither the share nor the seed
REFUSED_GRID = "robustness-refused"
CLIENTS = 10
SEEDS = (0, 1, 2, 3, 4)
SHARES = (0.1, 0.3)
NO_ATTACK = "none"
#: the size lie's claim: the largest count a reply may carry
LARGEST_COUNT = 2**31 - 1
#: every run: no model files, checkpoints or TensorBoard event files (the record keeps the scores)
COMMON: dict[str, Any] = {"save-models": False, "checkpoint-every": 0, "tensorboard": False}
#: the run without an attack (see the module docstring): no attacker, the backdoor's baseline measured
BASELINE: dict[str, Any] = {"attack": "backdoor", "attack-share": 0.0}


@dataclass(frozen=True)
class Setting:
    """Data a method is measured on: run-config keys, and what it is in words."""

    keys: tuple[tuple[str, Any], ...]
    what: str

    @property
    def config(self) -> dict[str, Any]:
        return dict(self.keys)


SETTINGS: dict[str, Setting] = {
    "label-skew": Setting((), "digits, labels split by Dirichlet alpha 0.5 (the defaults)"),
    "planted-clusters": Setting(
        (("partition", "planted-clusters"), ("num-clusters", 2)),
        "digits, two planted groups of clients with their own labels",
    ),
    "pathological": Setting((("partition", "pathological"),), "digits, two labels per client"),
}

#: attack -> its run-config keys (besides its share).  ``size-lie``: a backdoor whose attackers claim the largest
#: training size a reply may carry
ATTACKS: dict[str, dict[str, Any]] = {
    "sign-flip": {"attack": "sign-flip"},
    "noise": {"attack": "noise"},
    "free-rider": {"attack": "free-rider"},
    "label-flip": {"attack": "label-flip"},
    "backdoor": {"attack": "backdoor"},
    "model-replacement": {"attack": "model-replacement"},
    "size-lie": {"attack": "backdoor", "attack-num-examples": LARGEST_COUNT},
    "alie": {"attack": "alie"},
    "min-max": {"attack": "min-max"},
    "min-sum": {"attack": "min-sum"},
    "side-channel": {"attack": "side-channel"},
}
#: the attacks whose success is the backdoor's (their cells report ``backdoor-success``)
BACKDOORS = ("backdoor", "model-replacement", "size-lie")
#: the attacks that estimate the honest updates (each attacker trains once per client and round besides its own)
KNOWING = ("alie", "min-max", "min-sum")

#: threat -> the attacks that carry it, for the recommendations (reporting/robustness.py)
THREATS: dict[str, tuple[str, ...]] = {
    "send crafted updates": ("sign-flip", "noise", "model-replacement", "alie", "min-max", "min-sum"),
    "train on poisoned data": ("label-flip", "backdoor"),
    "plant a backdoor": ("backdoor", "model-replacement", "size-lie"),
    "lie about their size": ("size-lie",),
    "free-ride": ("free-rider",),
    "lie in a side channel": ("side-channel",),
}

RULES = ("mean", "median", "trimmed-mean", "multi-krum", "bulyan", "norm-bound", "fltrust")

#: method -> the settings it is measured in, with the method's own keys there
METHODS: dict[str, tuple[tuple[str, tuple[tuple[str, Any], ...]], ...]] = {
    "fedavg": (("label-skew", ()), ("planted-clusters", ())),
    "ditto": (("label-skew", ()),),
    "fedrep": (("label-skew", ()),),
    "fedcac": (("label-skew", ()),),
    "fedc2i": (("label-skew", ()),),
    "ifca": (("label-skew", ()),),
    "pifl": (("label-skew", ()),),
    # OPTICS needs min-samples below the planted groups' 5 members to find them (the default 5 finds one cluster)
    "pfedlia": (("planted-clusters", (("optics-min-samples", 3),)),),
    # Sattler's thresholds never split here; read off the default model's logged norms on this data (mean update norm
    # 1.5, largest 3.4 at round 5), these split the two planted groups at round 5
    "cfl": (("planted-clusters", (("cfl-eps1", 1.7), ("cfl-eps2", 3.0))),),
}
#: method -> the setting where its side-channel lie moves an honest run (small experiments, docs/robustness.md): the
#: side-channel cells run there (with the runs without an attack they pair with)
SIDE_CHANNEL_SETTINGS: dict[str, str] = {
    "fedcac": "pathological",
    "pfedlia": "planted-clusters",
    "pifl": "label-skew",
    "ifca": "planted-clusters",
}


@dataclass(frozen=True)
class Cell:
    """One run of the grid (``share`` is 0 for the run without an attack)."""

    setting: str
    method: str
    attack: str
    share: float
    aggregator: str
    seed: int

    @property
    def coordinates(self) -> dict[str, Any]:
        """The record's ``cell``."""
        return {
            "setting": self.setting,
            "method": self.method,
            "attack": self.attack,
            "attackers": self.share,
            "aggregator": self.aggregator,
            "seed": self.seed,
        }

    @property
    def refusal_coordinates(self) -> dict[str, Any]:
        """The ``cell`` of the record that says the app refused this combination."""
        return {"setting": self.setting, "method": self.method, "attack": self.attack, "aggregator": self.aggregator}

    @property
    def config(self) -> dict[str, Any]:
        """The run config: the method, the seed, the setting's and the method's keys, the rule, the attack."""
        cfg: dict[str, Any] = {"method": self.method, "seed": self.seed}
        cfg |= SETTINGS[self.setting].config | method_keys(self.method, self.setting)
        if self.aggregator != "mean":
            cfg["aggregator"] = self.aggregator
        cfg |= BASELINE if self.attack == NO_ATTACK else {**ATTACKS[self.attack], "attack-share": self.share}
        return cfg | COMMON


def method_keys(method: str, setting: str) -> dict[str, Any]:
    """The method's own keys in ``setting`` (none where it is measured only for its side channel)."""
    return next((dict(keys) for name, keys in METHODS[method] if name == setting), {})


def attack_shares(attacks: Iterable[str], shares: Iterable[float] = SHARES) -> list[tuple[str, float]]:
    """The (attack, share) pairs: the run without an attack once (share 0), every attack at every share."""
    shares = tuple(shares)
    attacks = tuple(attacks)
    return [(a, 0.0) for a in attacks if a == NO_ATTACK] + [(a, s) for a in attacks if a != NO_ATTACK for s in shares]


def blocks() -> list[tuple[str, str, tuple[str, ...]]]:
    """(setting, method, attacks) of the grid: every method in its settings under every attack but the side-channel
    lie, and the side-channel lie (with the runs without an attack) where it moves an honest run."""
    out = []
    for method, settings in METHODS.items():
        for setting, _ in settings:
            attacks = [NO_ATTACK, *(a for a in ATTACKS if a != "side-channel")]
            if SIDE_CHANNEL_SETTINGS.get(method) == setting:
                attacks.append("side-channel")
            out.append((setting, method, tuple(attacks)))
        side = SIDE_CHANNEL_SETTINGS.get(method)
        if side is not None and side not in {s for s, _ in settings}:
            out.append((side, method, (NO_ATTACK, "side-channel")))
    return out


def cells(
    methods: Iterable[str] | None = None,
    attacks: Iterable[str] | None = None,
    shares: Iterable[float] = SHARES,
    rules: Iterable[str] = RULES,
    seeds: Iterable[int] = SEEDS,
) -> list[Cell]:
    """Every planned cell (refused ones included; the script sets those apart), in table order: setting, method,
    attack, share, rule, seed."""
    wanted_methods = set(methods) if methods is not None else set(METHODS)
    wanted_attacks = set(attacks) if attacks is not None else {NO_ATTACK, *ATTACKS}
    out = []
    for setting, method, block in blocks():
        if method not in wanted_methods:
            continue
        chosen = [a for a in block if a in wanted_attacks]
        for (attack, share), rule, seed in itertools.product(attack_shares(chosen, shares), tuple(rules), tuple(seeds)):
            out.append(Cell(setting, method, attack, share, rule, seed))
    return out


def in_order(chosen: Iterable[Cell]) -> list[Cell]:
    """``chosen`` in the order of the module docstring: seed; no attack, then 30 %, then 10 %; then table order."""
    chosen = list(chosen)
    position = {c: i for i, c in enumerate(cells())}

    def share_rank(c: Cell) -> int:
        return 0 if c.attack == NO_ATTACK else 1 if c.share >= max(SHARES) else 2

    return sorted(chosen, key=lambda c: (c.seed, share_rank(c), position.get(c, len(position))))


def _toml(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))


def sweep_grid(chosen: Iterable[Cell]) -> str:
    """The cells as a grid file for ``python -m server_app.sweep --grid``: every round waits for all the clients
    (``min-nodes``, as the benchmark runs them), the simulation's size, and one ``[[runs]]`` line per run, in order."""
    lines = [
        "# the robustness grid's runs (benchmarks/attack_grid.py): python -m server_app.sweep --grid <this file>",
        "[base]",
        f"min-nodes = {CLIENTS}",
        "[federation]",
        f"num-supernodes = {CLIENTS}",
    ]
    for cell in chosen:
        lines.append("[[runs]]")
        lines += [f"{key} = {_toml(value)}" for key, value in cell.config.items()]
    return "\n".join(lines) + "\n"


def describe(attack: str) -> str:
    """An attack's keys in words (for the page)."""
    keys: Mapping[str, Any] = BASELINE if attack == NO_ATTACK else ATTACKS[attack]
    return ", ".join(f"{k}={v!r}" for k, v in keys.items())

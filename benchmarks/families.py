"""The specification of the equal-tuning grids (``python -m benchmarks.grids`` runs them; ``reporting/grids.py`` and
``reporting/choosing.py`` read them): the families, their rows and settings, the seeds, the selection rule and
the plan of runs.

Two families on digits, each method of a family run at every cell of its grid:

- label skew (Dirichlet labels): local, fedavg, fedper, fedrep, lgfedavg, ditto, fedrod, fedcac, pfedlia, cfl, ifca,
  pifl, fedsoft;
- feature shift (IID labels, one visual transform per client, several clients per domain): local, fedavg, fedrep,
  ditto, fedc2i and its ablations (lambda-only, Lambda-only, Lambda-local), client2vec, moon, fedbn.

Each family's grid is two axes through one middle cell: training samples per client (``train-samples``, a cap
on each client's training split; the largest value needs ``data-copies``, stated in ``samples``) at the middle
heterogeneity, and heterogeneity (Dirichlet alpha and pathological classes per client; the number of domains) at
the middle samples per client.

Equal tuning: every method gets the same budget, ``len(LR) x 2`` settings: the learning rate (``LR``) times two
values of one key of its own (``Row.key``; methods with no key of their own tune ``local-epochs``, the E of
FedAvg).  Phase 1 (selection) runs every setting at the middle cell with ``evaluate-split='validation'``: clients
score on their validation splits and no method sees a test split.  A method's setting is the one with the best
mean validation accuracy over the selection seeds (ties: the first in grid order, :func:`select`); it is held
across the grid.  Phase 2 runs the chosen setting at every cell on the test splits.  Every run shares the
family's ``base`` run config (``val-fraction`` 0.2 in selection and reporting runs alike, so that both use the
same train / validation / test split).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

#: the learning rates every method is tuned over (SGD with the default momentum 0.9; the app's default is 0.05)
LR = (0.01, 0.05)
#: selection runs every setting at one seed: the committed selection (96 runs) was made so, to keep the compute of
#: both families to a few hours on 2 cores; a second seed would double it and could change the chosen settings,
#: which would leave the grid runs made with the first choice unused
SELECT_SEEDS = (0,)
SEEDS = (0, 1, 2)
ROUNDS = 20
CLIENTS = 10
#: keys of every run of the grids: a validation split large enough to select on (about 36 samples per client at
#: 10 clients; the same split in selection and reporting runs), no model files or checkpoints (only the scores are
#: kept)
COMMON = {"val-fraction": 0.2, "save-models": False, "checkpoint-every": 0}


@dataclass(frozen=True)
class Row:
    """One line of a family's tables: a method (or an ablation of one), and the key of its own it is tuned on."""

    name: str
    config: dict[str, Any]
    key: str
    values: tuple[Any, ...]

    def settings(self, lrs: Iterable[float] = LR) -> list[dict[str, Any]]:
        """The tuning grid: every learning rate with every value of the row's key, in grid order."""
        return [{"lr": lr, self.key: v} for lr, v in itertools.product(lrs, self.values)]


def setting_label(setting: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in setting.items())


def _row(name: str, key: str = "local-epochs", values: tuple = (1, 2), **config: Any) -> Row:
    return Row(name, {"method": name, **config}, key, values)


@dataclass(frozen=True)
class Family:
    """A family of methods and its grid: two axes through the middle cell."""

    name: str
    title: str
    clients: int
    base: dict[str, Any]
    #: training samples per client -> the extra run config of that value
    samples: dict[int, dict[str, Any]]
    #: heterogeneity label -> its run config
    heterogeneity: dict[str, dict[str, Any]]
    middle: tuple[int, str]
    rows: tuple[Row, ...]
    heterogeneity_title: str = "heterogeneity"
    lrs: tuple[float, ...] = LR

    @property
    def select_grid(self) -> str:
        return f"grids-{self.name}-select"

    @property
    def grid(self) -> str:
        return f"grids-{self.name}"

    def cells(self) -> list[tuple[int, str]]:
        """The grid's cells: the middle cell, then the samples axis, then the heterogeneity axis."""
        n, h = self.middle
        out = [self.middle]
        out += [(s, h) for s in self.samples if (s, h) not in out]
        out += [(n, x) for x in self.heterogeneity if (n, x) not in out]
        return out

    def cell_config(self, samples: int, heterogeneity: str) -> dict[str, Any]:
        return {
            **COMMON,
            **self.base,
            "train-samples": samples,
            **self.samples[samples],
            **self.heterogeneity[heterogeneity],
            "min-nodes": self.clients,
        }

    def row(self, name: str) -> Row:
        return next(r for r in self.rows if r.name == name)


_C2I = {"method": "fedc2i"}
FAMILIES: dict[str, Family] = {
    "label-skew": Family(
        name="label-skew",
        title="Label skew",
        clients=CLIENTS,
        base={"partition": "dirichlet", "alpha": 0.5, "num-server-rounds": ROUNDS},
        # 10 clients x 250 training samples is more than digits' 1,797 images hold: jittered copies of the data set
        samples={25: {}, 50: {}, 100: {}, 250: {"data-copies": 3}},
        heterogeneity={
            "dirichlet-0.1": {"partition": "dirichlet", "alpha": 0.1},
            "dirichlet-0.5": {"partition": "dirichlet", "alpha": 0.5},
            "dirichlet-1.0": {"partition": "dirichlet", "alpha": 1.0},
            "pathological-2": {"partition": "pathological", "classes-per-client": 2},
        },
        middle=(50, "dirichlet-0.5"),
        rows=(
            _row("local"),
            _row("fedavg"),
            _row("fedper"),
            _row("fedrep", "head-epochs", (1, 5)),
            _row("lgfedavg"),
            _row("ditto", "ditto-lambda", (0.1, 1.0)),
            _row("fedrod"),
            _row("fedcac", "beta", (7, 15)),  # spec fedcac §3: beta about T/3 to T/2 for short runs; default 15
            _row("pfedlia", "optics-min-samples", (2, 5)),  # must not exceed the smallest true group
            # a cluster splits once its mean update norm is below eps1 (0.4) and some member's is above eps2; at the
            # middle cell the largest norm fell below 0.5 before the mean fell below 0.4, so the default 1.6 never
            # splits (CFL = FedAvg) and 0.3 lets clusters split
            _row("cfl", "cfl-eps2", (0.3, 1.6)),
            _row("ifca", "tiers", (2, 4)),
            _row("pifl", "tiers", (2, 4)),
            _row("fedsoft", "fedsoft-lambda", (0.1, 1.0)),
        ),
    ),
    "feature-shift": Family(
        name="feature-shift",
        title="Feature shift",
        clients=CLIENTS,
        base={"partition": "iid", "feature-shift": 2, "num-server-rounds": ROUNDS},
        samples={25: {}, 50: {}, 100: {}, 250: {"data-copies": 3}},
        # client i has domain i % domains: 10, 5 and 2 clients per domain
        heterogeneity={
            "domains-1": {"feature-shift": 1},
            "domains-2": {"feature-shift": 2},
            "domains-5": {"feature-shift": 5},
        },
        heterogeneity_title="domains",
        middle=(50, "domains-2"),
        rows=(
            _row("local"),
            _row("fedavg"),
            _row("fedrep", "head-epochs", (1, 5)),
            _row("ditto", "ditto-lambda", (0.1, 1.0)),
            Row("fedc2i", dict(_C2I), "gamma", (1.0, 5.0)),
            Row("lambda-only", {**_C2I, "c2i-variant": "client-level"}, "gamma", (1.0, 5.0)),
            Row("Lambda-only", {**_C2I, "c2i-variant": "class-level-averaged-extractor"}, "gamma", (1.0, 5.0)),
            Row("Lambda-local", {**_C2I, "c2i-variant": "class-level-own-extractor"}, "gamma", (1.0, 5.0)),
            _row("client2vec", "c2v-local-weight", (0.1, 1.0)),
            _row("moon", "moon-mu", (0.1, 1.0)),
            _row("fedbn"),
        ),
    ),
}


def smoke_design() -> dict[str, Family]:
    """A tiny rehearsal of the same machinery: 2 methods per family, 2 settings, 2 rounds, 4 nodes, 3 cells."""
    keep = {"label-skew": ("local", "fedavg"), "feature-shift": ("local", "fedc2i")}
    out = {}
    for name, fam in FAMILIES.items():
        n, h = fam.middle
        other = next(x for x in fam.heterogeneity if x != h)
        rows = tuple(replace(r, values=r.values[:1]) for r in fam.rows if r.name in keep[name])
        out[name] = replace(
            fam,
            clients=4,
            base={**fam.base, "num-server-rounds": 2},
            samples={25: {}, n: fam.samples[n]},
            heterogeneity={k: v for k, v in fam.heterogeneity.items() if k in (h, other)},
            rows=rows,
        )
    return out


@dataclass
class Selection:
    """A row's validation scores per setting and the setting chosen from them (None while it cannot be chosen)."""

    row: Row
    scores: dict[str, dict[int, float | None]] = field(default_factory=dict)  # setting -> seed -> acc (None: failed)
    seeds: list[int] = field(default_factory=list)
    chosen: str | None = None
    reason: str = ""

    def mean(self, setting: str) -> float | None:
        accs = [self.scores.get(setting, {}).get(s) for s in self.seeds]
        known = [a for a in accs if a is not None]
        return sum(known) / len(known) if accs and len(known) == len(accs) else None


def select(family: Family, row: Row, records: list[dict]) -> Selection:
    """The setting of ``row``: the best mean validation accuracy over the selection seeds found in ``records``
    (every setting must have a record for each; a failed setting cannot be chosen; ties: the first in grid order)."""
    labels = [setting_label(s) for s in row.settings(family.lrs)]
    seeds = sorted({r["cell"]["seed"] for r in records})
    sel = Selection(row, {lab: {} for lab in labels}, seeds)
    for r in records:
        lab = r["cell"].get("setting")
        if r["cell"].get("method") != row.name or lab not in sel.scores:
            continue
        ok = r.get("error") is None and (r.get("summary") or {}).get("personal-acc") is not None
        sel.scores[lab][r["cell"]["seed"]] = float(r["summary"]["personal-acc"]) if ok else None
    missing = sum(1 for lab in labels for s in seeds if s not in sel.scores[lab])
    if not seeds or missing:
        sel.reason = (
            f"selection incomplete ({len(labels) * len(seeds) - missing} of {len(labels) * max(len(seeds), 1)} runs)"
        )
        return sel
    means = [(sel.mean(lab), i, lab) for i, lab in enumerate(labels)]
    usable = [(m, -i, lab) for m, i, lab in means if m is not None]
    if not usable:
        sel.reason = "every setting failed in selection"
        return sel
    sel.chosen = max(usable)[2]
    return sel


@dataclass(frozen=True)
class Run:
    """One planned run of a family (what ``running.run_all`` runs): a selection run (``grid`` is the family's
    ``select_grid``) or a grid run."""

    family: Family
    row: Row
    grid: str
    cell: dict[str, Any]
    config: dict[str, Any]

    @property
    def clients(self) -> int:
        return self.family.clients

    @property
    def extra(self) -> dict[str, Any]:
        return {}


def selection_runs(family: Family, seeds: Iterable[int]) -> list[Run]:
    n, h = family.middle
    out = []
    for seed in seeds:  # seed by seed: a partial selection has every method at the first seed
        for row in family.rows:
            for setting in row.settings(family.lrs):
                cell = {"method": row.name, "setting": setting_label(setting), "seed": seed}
                cfg = {**family.cell_config(n, h), **row.config, **setting, "seed": seed}
                out.append(Run(family, row, family.select_grid, cell, {**cfg, "evaluate-split": "validation"}))
    return out


def grid_runs(family: Family, chosen: dict[str, str], seeds: Iterable[int], middle: bool) -> list[Run]:
    """The chosen setting of every row that has one, at the middle cell (``middle``) or at the other cells."""
    cells = family.cells()[:1] if middle else family.cells()[1:]
    out = []
    for seed in seeds:
        for samples, het in cells:
            for row in family.rows:
                if row.name not in chosen:
                    continue
                setting = setting_of(family, row, chosen[row.name])
                cell = {
                    "samples": samples,
                    "heterogeneity": het,
                    "method": row.name,
                    "setting": chosen[row.name],
                    "seed": seed,
                }
                cfg = {**family.cell_config(samples, het), **row.config, **setting, "seed": seed}
                out.append(Run(family, row, family.grid, cell, cfg))
    return out


def setting_of(family: Family, row: Row, label: str) -> dict[str, Any]:
    """The run config of a setting label (``lr=0.05 beta=7``) of ``row``'s grid."""
    by_label = {setting_label(s): s for s in row.settings(family.lrs)}
    if label not in by_label:
        raise ValueError(f"{row.name}: setting {label!r} is not in its grid {sorted(by_label)}")
    return by_label[label]

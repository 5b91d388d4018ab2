"""The specification of the equal-tuning grids (``python -m benchmarks.grids`` runs them; ``reporting/grids.py`` and
``reporting/choosing.py`` read them): the families, their rows and settings, the seeds, the selection rule and
the plan of runs.

Two tuned families on digits, each method of a family run at every cell of its grid:

- label skew (Dirichlet labels): local, fedavg, fedper, fedrep, lgfedavg, ditto, fedrod, fedcac, pfedlia, cfl, ifca,
  pifl, fedsoft;
- feature shift (IID labels, one visual transform per client, several clients per domain): local, fedavg, fedrep,
  ditto, fedc2i and its ablations (lambda-only, Lambda-only, Lambda-local), client2vec, moon, fedbn.

Each tuned family's grid is two axes through one middle cell: training samples per client (``train-samples``, a cap
on each client's training split; the largest value needs ``data-copies``, stated in ``samples``) at the middle
heterogeneity, and heterogeneity (Dirichlet alpha and pathological classes per client; the number of domains) at
the middle samples per client.

Three families of the federations users run take their settings from a tuned family (``tuned_from``) and are not
tuned again: many clients with a tenth of them taking part per round and unequal sizes, one domain per client, and
held-out clients (newcomers that never trained).

A second data set away from the ceiling, MNIST-1D (``dataset='mnist1d'``, its 1-D CNN): the label-skew family with the
same rows, cells and tuning, tuned again on it, and the 100-client family with the settings chosen there.

Equal tuning: every method gets the same shared keys, the learning rate (``LR``) and the local epochs (``EPOCHS``),
plus ``OWN_VALUES`` values of at most one key of its own (``Row.key``; the values are the app's default and one value
fixed by a rule written down with the row before any run, never after looking at results).  A learning rate
chosen at an edge of the grid is extended: the next value of ``LR_LADDER`` beyond that edge is run (every local-epochs
and own-key value, every selection seed) and the choice is made again, until it is inside the grid or the ladder
ends (:func:`select`).  Phase 1 (selection) runs every setting at the middle cell with
``evaluate-split='validation'``: clients score on their validation splits and no method sees a test split; the
selection seeds (``SELECT_SEEDS``) are not the grid's seeds, so the grid's partitions are not the ones tuned on.  A
method's setting is the one with the best mean validation accuracy over the selection seeds (ties: the first in grid
order); it is held across the grid.  Phase 2 runs the chosen setting at every cell on the test splits.  Every run
shares the family's ``base`` run config (``val-fraction`` 0.2 in selection and reporting runs alike, so that both use
the same train / validation / test split).

``PREVIOUS`` keeps the procedure the records made before this one ran (two learning rates, the local epochs tuned
only by methods without a key of their own, one selection seed): the report shows those records under it, marked as
superseded, until the current plan has records.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from task.data.catalogue import DOMAINS

#: the learning rates every method is tuned over first (SGD with the default momentum 0.9; the app's default 0.05 in
#: the middle)
LR = (0.01, 0.05, 0.1)
#: the values a learning-rate grid is extended with when its choice sits at an edge, fixed before any run
LR_LADDER = (0.001, 0.002, 0.005, 0.01, 0.05, 0.1, 0.2, 0.5)
#: the local epochs every method is tuned over (FedAvg's E; Local's epochs per round)
EPOCHS = (1, 2)
#: values of a method's own key: the same number for every method that has one
OWN_VALUES = 2
#: selection seeds: at least two, and not the grid's seeds
SELECT_SEEDS = (100, 101)
SEEDS = (0, 1, 2, 3, 4)
ROUNDS = 20
CLIENTS = 10
#: keys of every run of the grids: a validation split large enough to select on (about 36 samples per client at
#: 10 clients; the same split in selection and reporting runs), no model files or checkpoints (only the scores are
#: kept)
COMMON = {"val-fraction": 0.2, "save-models": False, "checkpoint-every": 0}


@dataclass(frozen=True)
class Row:
    """One line of a family's tables: a method (or an ablation of one), and the key of its own it is tuned on (None:
    it has none).  ``rule`` says how the key's values were fixed before any run."""

    name: str
    config: dict[str, Any]
    key: str | None = None
    values: tuple[Any, ...] = ()
    rule: str = ""

    def settings(self, lrs: Iterable[float], epochs: Iterable[int] = EPOCHS) -> list[dict[str, Any]]:
        """The tuning grid: every learning rate with every local-epochs value (none when ``epochs`` is empty) and every
        value of the row's key, in grid order."""
        axes: list[tuple[str, tuple[Any, ...]]] = [("lr", tuple(lrs))]
        if tuple(epochs):
            axes.append(("local-epochs", tuple(epochs)))
        if self.key is not None:
            axes.append((self.key, self.values))
        return [
            dict(zip([k for k, _ in axes], combo, strict=True)) for combo in itertools.product(*(v for _, v in axes))
        ]


def setting_label(setting: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in setting.items())


def _row(name: str, key: str | None = None, values: tuple = (), rule: str = "", **config: Any) -> Row:
    return Row(name, {"method": name, **config}, key, values, rule)


@dataclass(frozen=True)
class Family:
    """A family of methods and its grid: two axes through the middle cell."""

    name: str
    title: str
    clients: int
    base: dict[str, Any]
    #: training samples per client (0: all a client holds) -> the extra run config of that value
    samples: dict[int, dict[str, Any]]
    #: heterogeneity label -> its run config
    heterogeneity: dict[str, dict[str, Any]]
    middle: tuple[int, str]
    rows: tuple[Row, ...]
    heterogeneity_title: str = "heterogeneity"
    lrs: tuple[float, ...] = LR
    epochs: tuple[int, ...] = EPOCHS
    ladder: tuple[float, ...] = LR_LADDER
    select_seeds: tuple[int, ...] = SELECT_SEEDS
    seeds: tuple[int, ...] = SEEDS
    #: the tuned family whose selection gives this family's settings (None: it is tuned itself)
    tuned_from: Family | None = None
    #: run-config keys the family needs from the app (a family whose keys the code lacks cannot run yet)
    needs: tuple[str, ...] = ()
    #: who the family answers, in words (the choosing page's question)
    question: str = ""
    #: a superseded procedure (``PREVIOUS``): why its records are not the current plan's
    superseded: str = ""
    #: the command that runs this family, as a page names it (empty: ``benchmarks.grids --families <name>``)
    command: str = ""

    @property
    def select_grid(self) -> str:
        return self.tuned_from.select_grid if self.tuned_from else f"grids-{self.name}-select"

    @property
    def grid(self) -> str:
        return f"grids-{self.name}"

    @property
    def tuning(self) -> Family:
        """The family whose selection runs choose this family's settings (itself when it is tuned)."""
        return self.tuned_from or self

    def settings(self, row: Row, lrs: Iterable[float] | None = None) -> list[dict[str, Any]]:
        return row.settings(self.lrs if lrs is None else lrs, self.epochs)

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

    def rounds(self) -> int:
        return int(self.base.get("num-server-rounds", ROUNDS))

    def extension(self, lrs: Iterable[float], chosen_lr: float) -> float | None:
        """The learning rate to try next when ``chosen_lr`` sits at an edge of ``lrs``: the ladder's next value beyond
        that edge (None: inside the grid, or the ladder ends there)."""
        lrs = sorted(lrs)
        if chosen_lr == lrs[-1]:
            above = [v for v in self.ladder if v > lrs[-1]]
            return above[0] if above else None
        if chosen_lr == lrs[0] and len(lrs) > 1:
            below = [v for v in self.ladder if v < lrs[0]]
            return below[-1] if below else None
        return None


def samples_name(samples: int) -> str:
    """A samples value as the tables name it (0: a client's whole training split)."""
    return "all" if samples == 0 else str(samples)


_C2I = {"method": "fedc2i"}
#: how every own key's two values were fixed, before any run of the current plan
DEFAULT_AND = "the app's default and"
LABEL_SKEW = Family(
    name="label-skew",
    title="Label skew",
    clients=CLIENTS,
    base={"partition": "dirichlet", "alpha": 0.5, "num-server-rounds": ROUNDS},
    # 10 clients x 250 training samples is more than digits' 1,797 images hold: copies of the data set
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
        _row("fedrep", "head-epochs", (1, 5), f"{DEFAULT_AND} FedRep's paper's head epochs (5)"),
        _row("lgfedavg"),
        _row("ditto", "ditto-lambda", (0.1, 1.0), f"{DEFAULT_AND} ten times it"),
        _row("fedrod"),
        _row(
            "fedcac", "beta", (7, 15), f"{DEFAULT_AND} about a third of the rounds (FedCAC's guidance for short runs)"
        ),
        _row("pfedlia", "optics-min-samples", (2, 5), f"{DEFAULT_AND} OPTICS's smallest cluster (2)"),
        # the split rule needs the largest update norm above eps2 once the mean is below eps1 (0.4): Sattler's default
        # 1.6, and eps2 = eps1, the lowest value that keeps the two thresholds ordered; fixed by that rule, not by
        # looking at any run's norms
        _row("cfl", "cfl-eps2", (0.4, 1.6), f"{DEFAULT_AND} cfl-eps1's value (the lowest that keeps eps2 >= eps1)"),
        _row("ifca", "tiers", (2, 4), f"{DEFAULT_AND} twice as many clusters"),
        _row("pifl", "tiers", (2, 4), f"{DEFAULT_AND} twice as many tiers"),
        _row("fedsoft", "fedsoft-lambda", (0.1, 1.0), f"{DEFAULT_AND} ten times it"),
    ),
    question="20 hospitals with about 200 images each and strong label skew",
)
FEATURE_SHIFT = Family(
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
        _row("fedrep", "head-epochs", (1, 5), f"{DEFAULT_AND} FedRep's paper's head epochs (5)"),
        _row("ditto", "ditto-lambda", (0.1, 1.0), f"{DEFAULT_AND} ten times it"),
        # FedC2I and its ablations tune the models a client mixes (itself and k - 1 drawn peers); gamma, tuned before,
        # gave the same validation accuracy at both of its values in three of the four rows.  In a probe at the middle
        # cell c2i-peers moved FedC2I's validation accuracy; Lambda-local (the client's own extractor with
        # class-level head mixing) moved with none of its keys (gamma, influence-batch-size, c2i-peers), so it tunes
        # none.  The selection table checks again, on the selection runs, that every own key moved something.
        *(
            Row(name, {**_C2I, **variant}, "c2i-peers", (0, 4), f"{DEFAULT_AND} itself with three peers (4)")
            for name, variant in (
                ("fedc2i", {}),
                ("lambda-only", {"c2i-variant": "client-level"}),
                ("Lambda-only", {"c2i-variant": "class-level-averaged-extractor"}),
            )
        ),
        Row("Lambda-local", {**_C2I, "c2i-variant": "class-level-own-extractor"}),
        _row("client2vec", "c2v-local-weight", (0.1, 1.0), f"{DEFAULT_AND} a tenth of it"),
        _row("moon", "moon-mu", (0.1, 1.0), f"{DEFAULT_AND} a tenth of it"),
        _row("fedbn"),
    ),
    question="sites that share a few kinds of scanner (several sites per kind)",
)
#: 100 clients whose sizes differ, a tenth of them per round: the federation of phones
MANY_CLIENTS = Family(
    name="many-clients",
    title="100 clients, 10 % per round, unequal sizes",
    clients=100,
    # 100 clients x about 50 samples: copies of the data set; a client is scored every tenth round (and the last)
    base={
        "partition": "quantity-dirichlet",
        "alpha": 0.5,
        "num-server-rounds": 100,
        "fraction-train": 0.1,
        "eval-every": 10,
        "data-copies": 3,
    },
    samples={0: {}},
    heterogeneity={"equal-sizes": {"size-sigma": 0.0}, "lognormal-sizes": {"size-sigma": 1.0}},
    heterogeneity_title="client sizes",
    middle=(0, "lognormal-sizes"),
    rows=tuple(r for r in LABEL_SKEW.rows if r.name not in ("pifl", "fedsoft")),
    seeds=(0, 1, 2),
    tuned_from=LABEL_SKEW,
    needs=("size-sigma",),
    question="100 phones with about 50 samples each, 10 % taking part per round",
)
#: as many domains as there are transforms, one per client: every client its own scanner
DOMAIN_PER_CLIENT = Family(
    name="domain-per-client",
    title="One domain per client",
    clients=len(DOMAINS),
    base={"partition": "iid", "feature-shift": len(DOMAINS), "num-server-rounds": ROUNDS},
    samples={50: {}, 0: {}},
    heterogeneity={f"domains-{len(DOMAINS)}": {"feature-shift": len(DOMAINS)}},
    heterogeneity_title="domains",
    middle=(0, f"domains-{len(DOMAINS)}"),
    rows=FEATURE_SHIFT.rows,
    tuned_from=FEATURE_SHIFT,
    question="8 sites whose scanners differ (a domain per site)",
)
#: clients that never train: what each method gives a newcomer
NEWCOMERS = Family(
    name="newcomers",
    title="Newcomers: held-out clients",
    clients=20,
    base={"partition": "dirichlet", "alpha": 0.5, "num-server-rounds": ROUNDS, "holdout-clients": 5},
    samples={50: {}},
    heterogeneity={"dirichlet-0.5": {"partition": "dirichlet", "alpha": 0.5}},
    middle=(50, "dirichlet-0.5"),
    rows=LABEL_SKEW.rows,
    seeds=(0, 1, 2),
    tuned_from=LABEL_SKEW,
    needs=("holdout-clients",),
    question="a client that joins after training",
)
#: MNIST-1D's size in the label-skew family: at Dirichlet(0.5) over 10 clients the smallest client's test split still
#: holds about a hundred signals (the app's default, 10,000, leaves some clients forty); the training cap is the grid's
MNIST1D_GRID_SAMPLES = 20_000
#: the label-skew family on a data set away from the ceiling: on digits Local and FedAvg sit near 0.98, on MNIST-1D
#: (Greydanus & Kobak, ICML 2024) its 1-D CNN reaches about 0.94 with 4,000 signals, a linear model about 0.32.  The
#: same rows, cells and tuning as on digits, tuned again on MNIST-1D (a setting chosen on digits says nothing here);
#: MNIST-1D makes as many signals as asked, so the largest training cap needs no copies of the data set
MNIST1D_LABEL_SKEW = replace(
    LABEL_SKEW,
    name="mnist1d-label-skew",
    title="Label skew on MNIST-1D",
    base={**LABEL_SKEW.base, "dataset": "mnist1d", "mnist1d-samples": MNIST1D_GRID_SAMPLES},
    samples={n: {} for n in LABEL_SKEW.samples},
    needs=("mnist1d-samples",),
    question="",
)
#: the 100-client federation on MNIST-1D: the app's default 10,000 signals shared out as on digits (about 100 a
#: client, 60 of them for training), the settings chosen in MNIST-1D's label-skew selection
MNIST1D_MANY_CLIENTS = replace(
    MANY_CLIENTS,
    name="mnist1d-many-clients",
    title="100 clients on MNIST-1D, 10 % per round, unequal sizes",
    base={k: v for k, v in MANY_CLIENTS.base.items() if k != "data-copies"} | {"dataset": "mnist1d"},
    tuned_from=MNIST1D_LABEL_SKEW,
    needs=("size-sigma", "mnist1d-samples"),
    question="",
)
FAMILIES: dict[str, Family] = {
    f.name: f
    for f in (
        LABEL_SKEW,
        FEATURE_SHIFT,
        MANY_CLIENTS,
        DOMAIN_PER_CLIENT,
        NEWCOMERS,
        MNIST1D_LABEL_SKEW,
        MNIST1D_MANY_CLIENTS,
    )
}


def _previous_rows(fam: Family, keys: dict[str, tuple[str, tuple]]) -> tuple[Row, ...]:
    """``fam``'s rows as the previous procedure tuned them: ``keys[name]`` (key, values), else the local epochs."""
    out = []
    for r in fam.rows:
        key, values = keys.get(r.name, ("local-epochs", (1, 2)))
        out.append(replace(r, key=key, values=values, rule=""))
    return tuple(out)


_PREVIOUS_WHY = (
    "two learning rates (0.01, 0.05); the local epochs tuned only by the methods without a key of their own; one "
    "selection seed, also a grid seed; CFL's thresholds picked after looking at update norms"
)
#: the procedure of the records made before the current plan (see the module docstring): the report shows them under
#: it, marked superseded
PREVIOUS: dict[str, Family] = {
    "label-skew": replace(
        LABEL_SKEW,
        rows=_previous_rows(
            LABEL_SKEW,
            {
                "fedrep": ("head-epochs", (1, 5)),
                "ditto": ("ditto-lambda", (0.1, 1.0)),
                "fedcac": ("beta", (7, 15)),
                "pfedlia": ("optics-min-samples", (2, 5)),
                "cfl": ("cfl-eps2", (0.3, 1.6)),
                "ifca": ("tiers", (2, 4)),
                "pifl": ("tiers", (2, 4)),
                "fedsoft": ("fedsoft-lambda", (0.1, 1.0)),
            },
        ),
        lrs=(0.01, 0.05),
        epochs=(),
        ladder=(),
        select_seeds=(0,),
        seeds=(0, 1, 2),
        superseded=_PREVIOUS_WHY,
    ),
    "feature-shift": replace(
        FEATURE_SHIFT,
        rows=_previous_rows(
            FEATURE_SHIFT,
            {
                "fedrep": ("head-epochs", (1, 5)),
                "ditto": ("ditto-lambda", (0.1, 1.0)),
                **dict.fromkeys(("fedc2i", "lambda-only", "Lambda-only", "Lambda-local"), ("gamma", (1.0, 5.0))),
                "client2vec": ("c2v-local-weight", (0.1, 1.0)),
                "moon": ("moon-mu", (0.1, 1.0)),
            },
        ),
        lrs=(0.01, 0.05),
        epochs=(),
        ladder=(),
        select_seeds=(0,),
        seeds=(0, 1, 2),
        superseded=_PREVIOUS_WHY,
    ),
}


def smoke_design() -> dict[str, Family]:
    """A tiny rehearsal of the same machinery, every family of :data:`FAMILIES`: 2 methods per tuned family, 2
    learning rates and one local-epochs value (the choice sits at an edge, so an extension runs), 2 selection seeds,
    2 grid seeds, 2 rounds, 4 nodes (8 where a family needs more: a cohort, held-out clients; one domain per client
    keeps its domains), 2 cells."""
    keep = {
        "label-skew": ("local", "fedavg"),
        "feature-shift": ("local", "fedc2i"),
        "mnist1d-label-skew": ("local", "fedavg"),
    }
    small = {"mnist1d-samples": 2000}  # a rehearsal generates a smaller MNIST-1D
    out: dict[str, Family] = {}
    for name, names in keep.items():
        fam = FAMILIES[name]
        n, h = fam.middle
        other = next(x for x in fam.heterogeneity if x != h)
        out[name] = replace(
            fam,
            clients=4,
            base={**fam.base, "num-server-rounds": 2, **{k: v for k, v in small.items() if k in fam.base}},
            samples={25: {}, n: fam.samples[n]},
            heterogeneity={k: v for k, v in fam.heterogeneity.items() if k in (h, other)},
            rows=tuple(replace(r, values=r.values[:1]) for r in fam.rows if r.name in names),
            lrs=(0.01, 0.05),
            epochs=(1,),
            ladder=(0.01, 0.05, 0.1),
            seeds=(0, 1),
        )
    for name, fam in FAMILIES.items():
        if fam.tuned_from is None:
            continue
        source = out[fam.tuned_from.name]
        base = {**fam.base, "num-server-rounds": 2, "eval-every": 1}
        if base.get("dataset") == "mnist1d":
            base.update(small)
        if "holdout-clients" in base:
            base["holdout-clients"] = 2
        if "fraction-train" in base:
            base["fraction-train"] = 0.25
        out[name] = replace(
            fam,
            clients=fam.clients if "feature-shift" in fam.base else min(fam.clients, 8),
            base=base,
            samples=dict(list(fam.samples.items())[:2]),
            rows=source.rows,
            tuned_from=source,
            seeds=(0, 1),
        )
    return out


@dataclass
class Selection:
    """A row's validation scores per setting and the setting chosen from them (None while it cannot be chosen).

    ``lrs`` are the learning rates the choice was made over (the family's, and the extensions that ran); ``pending``
    is the extension the choice waits for (its runs are missing); ``edge`` says that the choice sits at an edge of
    the ladder, which cannot be extended further."""

    row: Row
    scores: dict[str, dict[int, float | None]] = field(default_factory=dict)  # setting -> seed -> acc (None: failed)
    seeds: list[int] = field(default_factory=list)
    chosen: str | None = None
    reason: str = ""
    lrs: list[float] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)  # the settings the choice was made over, in grid order
    pending: float | None = None
    edge: bool = False

    def mean(self, setting: str) -> float | None:
        accs = [self.scores.get(setting, {}).get(s) for s in self.seeds]
        known = [a for a in accs if a is not None]
        return sum(known) / len(known) if accs and len(known) == len(accs) else None

    @property
    def budget(self) -> int:
        """Settings tried (each at every selection seed)."""
        return len(self.labels)

    def key_moved(self, settings: list[dict[str, Any]]) -> bool | None:
        """Whether the row's own key changed the validation accuracy at some learning rate and local epochs (None:
        the row has no key of its own, or no such pair has every value scored)."""
        key = self.row.key
        if key is None:
            return None
        groups: dict[tuple, list[float]] = {}
        for s in settings:
            m = self.mean(setting_label(s))
            if m is not None:
                groups.setdefault(tuple((k, v) for k, v in s.items() if k != key), []).append(m)
        spans = [max(v) - min(v) for v in groups.values() if len(v) == len(self.row.values)]
        return None if not spans else any(d > 1e-9 for d in spans)


def _score(sel: Selection, row: Row, records: list[dict]) -> None:
    for r in records:
        lab = r["cell"].get("setting")
        if r["cell"].get("method") != row.name or r["cell"].get("seed") not in sel.seeds:
            continue
        ok = r.get("error") is None and (r.get("summary") or {}).get("personal-acc") is not None
        sel.scores.setdefault(lab, {})[r["cell"]["seed"]] = float(r["summary"]["personal-acc"]) if ok else None


def _complete(sel: Selection, labels: list[str]) -> int:
    """How many (setting, seed) runs of ``labels`` are missing."""
    return sum(1 for lab in labels for s in sel.seeds if s not in sel.scores.get(lab, {}))


def select(family: Family, row: Row, records: list[dict]) -> Selection:
    """The setting of ``row``: the best mean validation accuracy over the family's selection seeds (every setting must
    have a record for each; a failed setting cannot be chosen; ties: the first in grid order), with the learning rate
    extended along the ladder while the choice sits at an edge (:meth:`Family.extension`)."""
    family = family.tuning
    sel = Selection(row, seeds=list(family.select_seeds))
    _score(sel, row, records)
    lrs = list(family.lrs)
    while True:
        labels = [setting_label(s) for s in family.settings(row, sorted(lrs))]
        sel.lrs, sel.labels = sorted(lrs), labels
        missing = _complete(sel, labels)
        if missing:
            done = len(labels) * len(sel.seeds) - missing
            sel.reason = f"selection incomplete ({done} of {len(labels) * len(sel.seeds)} runs)"
            sel.chosen = None
            return sel
        usable = [(m, -i, lab) for i, lab in enumerate(labels) if (m := sel.mean(lab)) is not None]
        if not usable:
            sel.reason, sel.chosen = "every setting failed in selection", None
            return sel
        sel.chosen = max(usable)[2]
        chosen_lr = float(sel.chosen.split()[0].removeprefix("lr="))
        nxt = family.extension(lrs, chosen_lr)
        sel.edge = nxt is None and len(lrs) > 1 and chosen_lr in (min(lrs), max(lrs))
        if nxt is None:
            sel.reason = ""
            return sel
        extra = [setting_label(s) for s in family.settings(row, [nxt])]
        if _complete(sel, extra):
            sel.pending = nxt
            sel.reason = f"its best learning rate {chosen_lr:g} sits at the grid's edge: lr={nxt:g} is to run next"
            sel.chosen = None
            return sel
        lrs.append(nxt)


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


def selection_runs(
    family: Family,
    seeds: Iterable[int] | None = None,
    lrs: Iterable[float] | None = None,
    rows: Iterable[Row] | None = None,
) -> list[Run]:
    """The selection runs of a tuned family at its middle cell (``lrs``: only these learning rates, e.g. an
    extension; ``rows``: only these rows)."""
    if family.tuned_from is not None:
        return []
    n, h = family.middle
    out = []
    for seed in family.select_seeds if seeds is None else seeds:  # seed by seed: every method at the first seed first
        for row in family.rows if rows is None else rows:
            for setting in family.settings(row, lrs):
                cell = {"method": row.name, "setting": setting_label(setting), "seed": seed}
                cfg = {**family.cell_config(n, h), **row.config, **setting, "seed": seed}
                out.append(Run(family, row, family.select_grid, cell, {**cfg, "evaluate-split": "validation"}))
    return out


def grid_runs(family: Family, chosen: dict[str, str], seeds: Iterable[int] | None, middle: bool) -> list[Run]:
    """The chosen setting of every row that has one, at the middle cell (``middle``) or at the other cells."""
    cells = family.cells()[:1] if middle else family.cells()[1:]
    out = []
    for seed in family.seeds if seeds is None else seeds:
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
    """The run config of a setting label (``lr=0.05 local-epochs=1 beta=7``) of ``row``'s grid (learning rates of the
    ladder included: an extension's setting is one of the grid's)."""
    tuning = family.tuning
    by_label = {setting_label(s): s for s in tuning.settings(row, sorted({*tuning.lrs, *tuning.ladder}))}
    if label not in by_label:
        raise ValueError(f"{row.name}: setting {label!r} is not in its grid {sorted(by_label)}")
    return by_label[label]

"""The tables and figures of ``benchmarks/grids.py`` (grids ``grids-<family>-select`` and ``grids-<family>``).

Per family: the procedure, every method's tuning budget and choice (the selection table: the settings tried, the
learning rates with their extensions, the chosen setting and whether the method's own key moved validation
accuracy at all), a samples and a heterogeneity overview, two figures (test accuracy; the paired differences to
Local and to FedAvg with their 95 % intervals) and one table per cell: test accuracy over seeds, the paired
difference to Local and to FedAvg with its interval (``intervals.py``), the spread over clients and the share of
clients worse than Local (``fairness.py``), the failed replies, and the size of the test sets.  Families that take
their settings from another's selection (``tuned_from``) say so; the newcomers family adds what each method gives a
client that never trained.  A cell without records says "not run"; a method whose selection is not complete says
so; a failed run shows the line of its error; records of a setting that is not (or no longer) the chosen one are
counted and left out.  Records made under a superseded procedure (``families.PREVIOUS``) are shown under it, marked,
until the current plan has records.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.families import (
    FAMILIES,
    PREVIOUS,
    Family,
    Selection,
    grid_runs,
    samples_name,
    select,
    selection_runs,
    setting_label,
)
from benchmarks.records import PERSONAL, Rec, load_records, mean, ok, seeds_of

from . import fairness, float_noise
from .figures import Figure, Line, Panel, seed_line
from .float_noise import Noise
from .intervals import Interval, describe, interval_cell, paired_interval
from .pairing import REFERENCES
from .settings import header
from .text import accuracy_cell, md_table, num, plural

COMMAND = 'benchmarks/run_committed.sh "grids{}"'  # on a committed tree; {}: the arguments of the grids script
#: methods whose clients use their validation split themselves (client_app/): pFedLIA scores peers' lazy models on
#: it, IFCA picks its cluster by the loss on it, PI-FL bids by the tiers' accuracy on it
USES_VALIDATION = ("pfedlia", "ifca", "pifl")
USES_VALIDATION_WHY = "pFedLIA's lazy influence, IFCA's cluster choice, PI-FL's bids"
#: run-config keys that are grid coordinates or the tuned setting: the tables and the procedure state them
COORDINATES = {"seed", "method", "lr", "local-epochs", "train-samples", "data-copies", "evaluate-split", "min-nodes"}
#: markers of a figure's methods (each method also has its own colour)
MARKERS = "osD^v<>ph*Xd"
#: what a newcomer's accuracy is called in a record's summary: the model it receives, and that model fine-tuned on its
#: own training split
NEWCOMER_KEYS = {"newcomer-acc": "as received", "newcomer-finetuned-acc": "fine-tuned on its own data"}


@dataclass
class FamilyRecords:
    """A family's records: the selection runs, the setting each row chose from them, the grid runs.

    ``family`` is the design the records are read under: the current plan, or the superseded procedure
    (``families.PREVIOUS``) while only its records exist; ``plan`` is the current plan either way."""

    family: Family
    selection: dict[str, Selection]
    select_recs: list[Rec]
    grid_recs: list[Rec]
    plan: Family | None = None
    #: the float noise its wins are judged against (``float_noise.py``: the family's own context, else its tuning
    #: family's), and the context it comes from ("": not measured)
    noise: Noise | None = None
    noise_context: str = ""
    _intervals: dict[tuple, Interval] = field(default_factory=dict, repr=False)

    @classmethod
    def read(cls, family: Family, raw: Path) -> FamilyRecords:
        select_recs = load_records(family.select_grid, raw)
        chosen = {row.name: select(family, row, select_recs) for row in family.rows}
        return cls(family, chosen, select_recs, load_records(family.grid, raw), family)

    @classmethod
    def load(cls, family: Family, raw: Path) -> FamilyRecords:
        """The records of ``family``, under the superseded procedure when only its records exist, with its float
        noise."""
        fr = cls.read(family, raw)
        old = PREVIOUS.get(family.name)
        current = [r for r in fr.select_recs if r["cell"].get("seed") in family.tuning.select_seeds]
        if not (old is None or family.tuned_from is not None or current or not fr.select_recs):
            fr = cls.read(old, raw)
            fr.plan = family
        measured = float_noise.load(raw)
        for context in (family.name, family.tuning.name):
            if context in measured:
                fr.noise, fr.noise_context = measured[context], context
                break
        return fr

    @property
    def superseded(self) -> bool:
        return bool(self.family.superseded)

    def cell(self, row: str, samples: int, het: str) -> list[Rec]:
        """The runs of ``row`` at a cell, at its chosen setting (none while no setting is chosen)."""
        sel = self.selection.get(row)  # a row the family does not have (e.g. no FedAvg in a rehearsal) has no runs
        chosen = sel.chosen if sel else None
        want = {"method": row, "samples": samples, "heterogeneity": het, "setting": chosen}
        return [r for r in self.grid_recs if chosen and all(r["cell"].get(k) == v for k, v in want.items())]

    def stale(self) -> list[Rec]:
        """Grid records of a setting that is not (or no longer) the row's chosen one."""
        return [
            r
            for r in self.grid_recs
            if r["cell"].get("method") in self.selection
            and r["cell"].get("setting") != self.selection[r["cell"]["method"]].chosen
        ]

    def axis(self, name: str) -> list[tuple[int, str]]:
        """The cells of one axis through the middle cell: ``samples`` or ``heterogeneity``."""
        n, h = self.family.middle
        return (
            [(s, h) for s in self.family.samples] if name == "samples" else [(n, x) for x in self.family.heterogeneity]
        )

    def interval(self, row: str, cell: tuple[int, str], ref: str) -> Interval | None:
        """``row`` minus ``ref`` at ``cell``, paired by seed and client, with its interval (None: no runs of either)."""
        key = (row, cell, ref)
        if key not in self._intervals:
            arm, base = self.cell(row, *cell), self.cell(ref, *cell)
            if not ok(arm) or not ok(base):
                return None
            self._intervals[key] = paired_interval(arm, base, test_may_differ=True)
        return self._intervals[key]


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds < 3600 else f"{seconds / 3600:.1f} h"


def wall(recs: list[Rec]) -> float:
    """Seconds of ``flwr run``, end to end (Flower's start-up included), summed over the runs."""
    return sum(float(r.get("wall-seconds") or 0.0) for r in recs)


def _without_coordinates(recs: list[Rec], family: Family) -> list[Rec]:
    """The records with the run-config keys the tables and the procedure state left out (for the settings line)."""
    drop = (
        COORDINATES
        | {row.key for row in family.rows if row.key}
        | {k for h in family.heterogeneity.values() for k in h}
    )
    drop |= {k for row in family.rows for k in row.config}
    return [{**r, "run-config": {k: v for k, v in r["run-config"].items() if k not in drop}} for r in recs]


def _nums(values: Any) -> str:
    return ", ".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)


def _count(values: list[int], word: str) -> str:
    return plural(values[0], word) if len(values) == 1 else f"{'-'.join(map(str, values))} {word}s"


def budget_text(fam: Family) -> str:
    """Every method's tuning budget under ``fam``'s procedure, in words (numbers from the family)."""
    own = sorted({len(r.values) for r in fam.rows if r.key})
    bare = sorted({len(fam.settings(r)) for r in fam.rows if r.key is None})
    keyed = sorted({len(fam.settings(r)) for r in fam.rows if r.key is not None})
    shared = f"the learning rate ({_nums(fam.lrs)})"
    if fam.epochs:
        shared += f" and the local epochs ({_nums(fam.epochs)})"
    text = f"Every method is tuned over {shared}"
    if own:
        text += f", times {' or '.join(map(str, own))} values of one key of its own"
        if not fam.epochs and any(r.key == "local-epochs" for r in fam.rows):
            text += " (the local epochs for a method without one)"
        text += f": {_count(keyed, 'setting')}" + (
            f", {_count(bare, 'setting')} for a method without one" if bare else ""
        )
    if fam.ladder:
        text += (
            f"; a learning rate chosen at an edge of the grid is extended to the next value of "
            f"{_nums(fam.ladder)} beyond it, and the choice made again, until it is inside the grid or the list ends"
        )
    return text + "."


def procedure(fr: FamilyRecords, d: dict[str, Any]) -> str:
    fam, sel_recs, grid_recs = fr.family, fr.select_recs, fr.grid_recs
    n_mid, h_mid = fam.tuning.middle
    lines = []
    if fr.superseded:
        plan = fr.plan or fam
        lines.append(
            f"**These records ran a superseded procedure** ({fam.superseded}). The current plan "
            f"(`python -m benchmarks.grids --dry-run`) has no records yet; until it has, the tables below are read "
            "under the procedure the records ran, and no claim of the choosing page rests on equal tuning."
            + (f" The current plan: {budget_text(plan)}" if plan is not fam else "")
        )
    if fam.tuned_from is not None:
        lines.append(
            f"Not tuned again: every method runs the setting it chose in the {fam.tuned_from.title.lower()} family's "
            f"selection ({budget_text(fam.tuned_from)[0].lower()}{budget_text(fam.tuned_from)[1:-1]}); a method not "
            "selected there does not run here."
        )
    else:
        lines += [
            budget_text(fam),
            (
                f"Selection: every setting at the middle cell ({samples_name(n_mid)} training samples per client, "
                f"{h_mid}), scored on the clients' validation splits (`evaluate-split=validation`: each client holds "
                "its validation split in place of its test split, which no method sees), selection seeds "
                f"{', '.join(map(str, seeds_of(sel_recs))) or 'none yet'} (planned "
                f"{', '.join(map(str, fam.select_seeds))}); a method's setting is the one with the best mean "
                "validation accuracy over them (ties: the first in grid order), held across the grid."
            ),
        ]
    lines.append(
        "Grid: the chosen setting at every cell on the test splits, seeds "
        f"{', '.join(map(str, seeds_of(grid_recs))) or 'none yet'} (planned {', '.join(map(str, fam.seeds))}); "
        "`min-nodes` is the number of clients (every round waits for all of them)"
        + (
            "; the samples axis caps each client's training split (`train-samples`, a seeded subsample stratified by "
            "label; validation and test splits unchanged)"
            if len(fam.samples) > 1
            else ""
        )
        + "".join(
            f"; at {samples_name(n)} samples per client with `data-copies={cfg['data-copies']}` "
            f"({_help('data-copies')})"
            for n, cfg in fam.samples.items()
            if cfg.get("data-copies", 1) > 1
        )
        + (
            f"; every run has `data-copies={fam.base['data-copies']}` ({_help('data-copies')})"
            if fam.base.get("data-copies", 1) > 1
            else ""
        )
        + "."
    )
    inner = [row.name for row in fam.rows if row.config["method"] in USES_VALIDATION]
    if inner and fam.tuned_from is None:
        lines.append(
            f"{', '.join(inner)} also use the validation split inside the method ({USES_VALIDATION_WHY}): their "
            "validation scores are measured on data the method itself used (optimistic as numbers; they only rank "
            "the method's own settings); their test splits stay unseen."
        )
    lines.append(
        "Cell tables: test accuracy is the mean (min-max) over seeds. "
        + describe()
        + " Δ compares each method with Local and with FedAvg at their own chosen settings in the same cell; a pair "
        "needs equal data fingerprints († : the same training data, but the method is scored on another part of each "
        "test split, e.g. PI-FL on the half it does not fit its mixture on). "
        + fairness.DEFINITION
        + " Failed replies: replies the server rejected, summed over the runs."
    )
    runs = sel_recs + grid_recs
    failed = sum(1 for r in runs if r.get("error"))
    compute = (
        f"Compute: {plural(len(sel_recs), 'selection run')} ({_duration(wall(sel_recs))}) and "
        if fam.tuned_from is None
        else "Compute: "
    )
    lines.append(
        compute + f"{plural(len(grid_recs), 'grid run')} ({_duration(wall(grid_recs))}), "
        f"{_duration(wall(runs if fam.tuned_from is None else grid_recs))} of wall time in all (each `flwr run` end to "
        f"end, Flower's start-up included); {failed} failed."
    )
    if runs:
        lines.append(header(_without_coordinates(runs, fam), [], d))
    return "\n\n".join(lines)


def _help(key: str) -> str:
    """The app's own line of help for a run-config key (what it does is stated by the code, not retyped here)."""
    from task.config import Settings

    opt = Settings.declared().get(key)
    return f"the app's help for it: {opt.help}" if opt else f"see the run-config key `{key}`"


def selection_table(fr: FamilyRecords) -> str:
    fam = fr.family
    rows = []
    for row in fam.rows:
        sel = fr.selection[row.name]
        settings = fam.settings(row, sel.lrs)
        scores = []
        for s in settings:
            lab = setting_label(s)
            got, m = sel.scores.get(lab, {}), sel.mean(lab)
            txt = (
                f"{lab}: {m:.3f}"
                if m is not None
                else f"{lab}: failed"
                if any(v is None for v in got.values())
                else f"{lab}: {len(got)} of {len(sel.seeds)} seeds"
                if got
                else f"{lab}: not run"
            )
            scores.append(f"**{txt}**" if lab == sel.chosen else txt)
        moved = sel.key_moved(settings)
        own = "—" if row.key is None else f"`{row.key}` {_nums(row.values)}" + (f" ({row.rule})" if row.rule else "")
        best = f"`{sel.chosen}` ({sel.mean(sel.chosen):.3f})" if sel.chosen else sel.reason
        if sel.edge:
            best += (
                " (the learning rate at the end of the list: not extended further)"
                if fam.ladder
                else " (the learning rate at the grid's edge: this procedure extended no grid)"
            )
        rows.append(
            [
                row.name,
                own,
                str(sel.budget),
                _nums(sel.lrs),
                best,
                "—" if moved is None else "yes" if moved else "**no**",
                "<br>".join(scores),
            ]
        )
    intro = (
        f"Validation accuracy (mean over {plural(len(fam.select_seeds), 'selection seed')}) of every setting at the "
        "middle cell; the chosen setting in bold. *Own key moved it*: whether some learning rate and local epochs "
        "gave different validation accuracy at the own key's values (a key that moves nothing tunes nothing)."
    )
    head = ["method", "own key (values; how fixed)", "settings", "learning rates", "chosen (val acc)"]
    return intro + "\n\n" + md_table([*head, "own key moved it", "every setting"], rows)


def test_sizes(recs: list[Rec]) -> str:
    """How many examples the clients trained and were tested on in these runs (per seed and per client)."""

    def column(rec: Rec, name: str) -> list[float]:
        cols = rec["clients"]["columns"]
        if name not in cols:
            return []
        return [float(row[cols.index(name)]) for row in rec["clients"]["rows"] if row[cols.index(name)] is not None]

    runs = [r for r in ok(recs) if column(r, "num-examples")]
    if not runs:
        return ""
    train = [v for r in runs for v in column(r, "num-examples")]
    out = f"Clients trained on {np.mean(train):.1f} examples on average (min {min(train):.0f}, max {max(train):.0f})"
    per_seed = [sum(column(r, "test-examples")) for r in runs if column(r, "test-examples")]
    if per_seed:
        tests = [v for r in runs for v in column(r, "test-examples")]
        out += (
            f"; the test sets hold {min(per_seed):.0f}-{max(per_seed):.0f} examples per seed over "
            f"{plural(len(column(runs[0], 'test-examples')), 'client')} ({min(tests):.0f}-{max(tests):.0f} per client)"
        )
    return out + " in these runs."


def failed_replies(recs: list[Rec]) -> str:
    counts = [int((r.get("failures") or {}).get("count") or 0) for r in recs]
    return str(sum(counts)) if recs else "—"


def cell_table(fr: FamilyRecords, samples: int, het: str) -> str:
    cells = {row.name: fr.cell(row.name, samples, het) for row in fr.family.rows}
    rows = []
    for row in fr.family.rows:
        sel, recs = fr.selection[row.name], cells[row.name]
        if sel.chosen is None:
            rows.append([row.name, "—", f"not run: {sel.reason}", *[""] * 7])
            continue
        vs = []
        for ref in REFERENCES:
            if row.name == ref:
                vs.append("")
            elif not ok(cells.get(ref, [])):
                vs.append(f"{ref} not run")
            else:
                vs.append(interval_cell(fr.interval(row.name, (samples, het), ref)))
        worse = "" if row.name == "local" else fairness.worse_than_local(recs, cells.get("local", []), True).text()
        rows.append(
            [
                row.name,
                f"`{sel.chosen}`",
                accuracy_cell(recs) if recs else "not run",
                *vs,
                *fairness.spread_cells(recs),
                worse,
                failed_replies(recs),
            ]
        )
    # the clients' data as the references saw it (every method trains on the same splits; PI-FL tests on half)
    seen = next((cells[n] for n in REFERENCES if ok(cells.get(n, []))), [r for rs in cells.values() for r in rs])
    head = test_sizes(seen)
    table = md_table(
        [
            "method",
            "setting",
            f"test acc ({plural(len(seeds_of(fr.grid_recs)), 'seed')})",
            "Δ vs Local (points) [95 %]",
            "Δ vs FedAvg (points) [95 %]",
            *fairness.HEADER,
            "failed replies",
        ],
        rows,
    )
    return (head + "\n\n" if head else "") + table


def newcomer_table(fr: FamilyRecords, samples: int, het: str) -> str:
    """What each method gives a client that never trained: the model it receives, and that model fine-tuned."""
    rows = []
    for row in fr.family.rows:
        recs = ok(fr.cell(row.name, samples, het))
        if not recs:
            continue
        cells = []
        for key in NEWCOMER_KEYS:
            vals = [float(r["summary"][key]) for r in recs if (r["summary"] or {}).get(key) is not None]
            cells.append(
                f"{np.mean(vals):.3f} ({min(vals):.3f}-{max(vals):.3f})" if vals else "not reported by this code"
            )
        rows.append([row.name, *cells])
    if not rows:
        return "*No newcomer runs yet.*"
    return (
        "Held-out clients never train; at the end each is scored with the model its method gives a newcomer (mean "
        "over the held-out clients, then min-max over seeds), as received and after fine-tuning on its own training "
        "split.\n\n" + md_table(["method", *(f"newcomer acc, {v}" for v in NEWCOMER_KEYS.values())], rows)
    )


def overview(fr: FamilyRecords, axis: str) -> str:
    """Mean test accuracy of every method along one axis (the chosen settings; '—' where not run)."""
    points = fr.axis(axis)
    names = [f"{samples_name(s)} samples" for s, _ in points] if axis == "samples" else [x for _, x in points]
    rows = [[row.name, *(num(mean(fr.cell(row.name, s, x), PERSONAL), 3) for s, x in points)] for row in fr.family.rows]
    return md_table(["method", *names], rows)


def _style(i: int, joined: bool = True) -> str:
    return MARKERS[i % len(MARKERS)] + ("-" if joined else "")


def figure(fr: FamilyRecords) -> Figure | None:
    """Test accuracy against samples per client (a line per method: mean over seeds, bars = min-max) and against
    heterogeneity (markers only: its cells are categories, not a scale); None before any grid run has a result."""
    fam = fr.family
    n, h = fam.middle
    panels = []
    for axis, title, xlabel in (
        ("samples", f"against samples per client ({h})", "training samples per client (cap)"),
        (
            "heterogeneity",
            f"against {fam.heterogeneity_title} ({samples_name(n)} samples per client)",
            fam.heterogeneity_title,
        ),
    ):
        points = fr.axis(axis)
        if len(points) < 2:
            continue
        lines = []

        def at_point(r: Rec, points: list = points) -> dict[float, float]:
            return {points.index((r["cell"]["samples"], r["cell"]["heterogeneity"])): PERSONAL(r)}

        joined = axis == "samples"
        for i, row in enumerate(fam.rows):
            line = seed_line(
                row.name, [r for s, x in points for r in fr.cell(row.name, s, x)], at_point, _style(i, joined)
            )
            if line:
                lines.append(line)
        names = [samples_name(s) for s, _ in points] if axis == "samples" else [x for _, x in points]
        panels.append(Panel(title, lines, xlabel, "test accuracy", names, bars=True, joined=joined))
    if not any(p.lines for p in panels):
        return None
    per_point: dict[tuple, set] = {}
    for r in fr.grid_recs:
        c = r["cell"]
        per_point.setdefault((c["method"], c["samples"], c["heterogeneity"]), set()).add(c["seed"])
    counts = sorted({len(v) for v in per_point.values()})
    # a partial grid has more seeds at some points (the middle cell first) than at others: say so
    seeds = plural(counts[0], "seed") if len(counts) == 1 else f"{counts[0]}-{counts[-1]} seeds per point"
    title = f"{fam.title}: each method at its selected setting (mean over {seeds}, bars = min-max)"
    order = [r.name for r in fam.rows]
    return Figure(f"grids-{fam.name}.png", title, panels, columns=2, panel_size=(4.8, 3.4), distinct=True, order=order)


def axis_cells(fr: FamilyRecords) -> list[tuple[int, str]]:
    """The samples axis in order, then the other cells of the heterogeneity axis in order."""
    samples = fr.axis("samples")
    return samples + [c for c in fr.axis("heterogeneity") if c not in samples]


def margins_figure(fr: FamilyRecords) -> Figure | None:
    """Every method's paired difference to Local and to FedAvg at every cell, in points, with its 95 % interval; the
    cells as categories on the x axis (one panel per reference); None before any difference can be computed."""
    fam = fr.family
    cells = axis_cells(fr)
    names = [f"{samples_name(s)}, {h}" for s, h in cells]
    panels = []
    for ref in REFERENCES:
        lines = []
        for i, row in enumerate(fam.rows):
            if row.name == ref:
                continue
            xs, ys, lo, hi = [], [], [], []
            for j, cell in enumerate(cells):
                iv = fr.interval(row.name, cell, ref)
                if iv is not None and iv.ok:
                    xs.append(float(j))
                    ys.append(iv.point * 100)
                    lo.append(iv.lo * 100)
                    hi.append(iv.hi * 100)
            if xs:
                lines.append(Line(row.name, xs, ys, lo, hi, _style(i, joined=False)))
        if lines:
            panels.append(
                Panel(
                    f"minus {ref}",
                    lines,
                    "cell (samples per client, heterogeneity)",
                    "Δ test accuracy (points)",
                    names,
                    bars=True,
                    joined=False,
                    zero=True,
                    dodge=0.75,
                )
            )
    if not panels:
        return None
    title = f"{fam.title}: paired difference to Local and to FedAvg (points, 95 % intervals)"
    size = (max(7.5, 1.6 * len(cells)), 3.6)
    order = [r.name for r in fam.rows]
    return Figure(
        f"grids-{fam.name}-margins.png", title, panels, columns=1, panel_size=size, distinct=True, order=order
    )


def render_family(fr: FamilyRecords, d: dict[str, Any]) -> str:
    fam = fr.family
    if not fr.grid_recs and (fam.tuned_from is not None or not fr.select_recs):
        command = fam.command or COMMAND.format(f" --families {fam.name}")
        plan = f"{plural(fam.clients, 'client')}, {fam.rounds()} rounds, cells " + "; ".join(
            f"{samples_name(s)} samples, {h}" for s, h in fam.cells()
        )
        needs = f" It needs the run-config key(s) {', '.join(f'`{k}`' for k in fam.needs)}." if fam.needs else ""
        return f"### {fam.title}\n\n*Not run yet ({plan}): run `{command}`, then `python -m benchmarks.report`.*{needs}"
    parts = [f"### {fam.title}", procedure(fr, d)]
    if fam.tuned_from is None:
        parts += ["#### Selection", selection_table(fr)]
    stale = fr.stale()
    if stale:
        parts.append(
            f"{plural(len(stale), 'grid record')} ran a setting that is not the method's chosen one (an earlier "
            f"selection, or none is chosen yet) and {'is' if len(stale) == 1 else 'are'} not shown."
        )
    n, h = fam.middle
    if len(fam.samples) > 1:
        parts += [f"#### Against training samples per client ({h})", overview(fr, "samples")]
    if len(fam.heterogeneity) > 1:
        parts += [
            f"#### Against {fam.heterogeneity_title} ({samples_name(n)} training samples per client)",
            overview(fr, "heterogeneity"),
        ]
    for fig in (figure(fr), margins_figure(fr)):
        if fig:
            parts.append(f"![{fig.title}]({fig.file})")
    for samples, het in fam.cells():
        middle = " (middle cell: selection ran here)" if (samples, het) == fam.middle and fam.tuned_from is None else ""
        parts += [
            f"#### {samples_name(samples)} training samples per client, {het}{middle}",
            cell_table(fr, samples, het),
        ]
        if "holdout-clients" in fam.base:
            parts.append(newcomer_table(fr, samples, het))
    return "\n\n".join(parts)


def _intro(design: dict[str, Family]) -> str:
    fams = "; ".join(f"{f.title[0].lower()}{f.title[1:]}: {', '.join(r.name for r in f.rows)}" for f in design.values())
    return (
        f"When does each method pay off? Families on digits unless named ({fams}); each tuned family runs every "
        "method at every cell of two axes through a middle cell (training samples per client, and heterogeneity), "
        "every method tuned alike; the others run the federations users run with the settings chosen there."
    )


def _plan(design: dict[str, Family]) -> str:
    """How many runs the grids of ``design`` take with the planned seeds (before extensions)."""
    n_select = sum(len(selection_runs(f)) for f in design.values())
    # the grid's size does not depend on the settings chosen: count it with each row's first setting
    n_grid = sum(
        len(grid_runs(f, {r.name: setting_label(f.tuning.settings(r)[0]) for r in f.rows}, None, middle))
        for f in design.values()
        for middle in (True, False)
    )
    return (
        f"{n_select} selection runs (before extensions) and {n_grid} grid runs (`python -m benchmarks.grids "
        "--dry-run` prints the plan with an estimate of the hours)"
    )


def render_grids(raw: Path, d: dict[str, Any], design: dict[str, Family] | None = None) -> str:
    """The section of RESULTS.md: every family of ``design`` (default: the grids of benchmarks/grids.py)."""
    design = design or FAMILIES
    frs = [FamilyRecords.load(f, Path(raw)) for f in design.values()]
    if not any(fr.select_recs or fr.grid_recs for fr in frs):
        return (
            f"{_intro(design)}\n\n*The grids have not been run yet: run `{COMMAND.format('')}`, {_plan(design)}; "
            "it resumes where it stopped (a run whose record exists is skipped). Then `python -m benchmarks.report`.*"
        )
    return "\n\n".join([_intro(design), *(render_family(fr, d) for fr in frs)])


def figures_grids(raw: Path, design: dict[str, Family] | None = None) -> list[Figure]:
    """Two figures per family with a grid run that has a result: accuracy, and the paired differences."""
    out = []
    for f in (design or FAMILIES).values():
        fr = FamilyRecords.load(f, Path(raw))
        out += [fig for fig in (figure(fr), margins_figure(fr)) if fig is not None]
    return out

"""The tables and figures of ``benchmarks/grids.py`` (grids ``grids-<family>-select`` and ``grids-<family>``).

Per family (label skew, feature shift): the procedure and the compute it took, the selection table (every
setting's validation accuracy, the chosen one in bold), a samples and a heterogeneity overview, one figure
(accuracy against samples per client and against heterogeneity, one line per method with its seed spread) and one
table per cell (test accuracy over seeds, the paired difference to Local and to FedAvg with the seeds won).  A cell
without records says "not run"; a method whose selection is not complete says so; a failed run shows the line of
its error; records of a setting that is not (or no longer) the chosen one are counted and left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks.families import (
    FAMILIES,
    SEEDS,
    SELECT_SEEDS,
    Family,
    Selection,
    grid_runs,
    select,
    selection_runs,
    setting_label,
)
from benchmarks.records import PERSONAL, Rec, load_records, mean, ok, seeds_of

from .figures import Figure, Panel, seed_line
from .pairing import REFERENCES, delta_cell, paired
from .settings import header
from .text import accuracy_cell, md_table, num, plural

COMMAND = 'benchmarks/run_committed.sh "grids{}"'  # on a committed tree; {}: the arguments of the grids script
#: methods whose clients use their validation split themselves (client_app/): pFedLIA scores peers' lazy models on
#: it, IFCA picks its cluster by the loss on it, PI-FL bids by the tiers' accuracy on it
USES_VALIDATION = ("pfedlia", "ifca", "pifl")
USES_VALIDATION_WHY = "pFedLIA's lazy influence, IFCA's cluster choice, PI-FL's bids"
#: run-config keys that are grid coordinates or the tuned setting: the tables and the procedure state them
COORDINATES = {"seed", "method", "lr", "train-samples", "data-copies", "evaluate-split", "min-nodes"}
#: markers of a figure's methods (ten colours cycle: the next ten methods are dashed, each marker moved on by one)
MARKERS = "osD^v<>ph*"


@dataclass
class FamilyRecords:
    """A family's records: the selection runs, the setting each row chose from them, the grid runs."""

    family: Family
    selection: dict[str, Selection]
    select_recs: list[Rec]
    grid_recs: list[Rec]

    @classmethod
    def load(cls, family: Family, raw: Path) -> FamilyRecords:
        select_recs = load_records(family.select_grid, raw)
        chosen = {row.name: select(family, row, select_recs) for row in family.rows}
        return cls(family, chosen, select_recs, load_records(family.grid, raw))

    def cell(self, row: str, samples: int, het: str) -> list[Rec]:
        """The runs of ``row`` at a cell, at its chosen setting (none while no setting is chosen)."""
        chosen = self.selection[row].chosen
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


def _duration(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds < 3600 else f"{seconds / 3600:.1f} h"


def _wall(recs: list[Rec]) -> float:
    """Seconds of ``flwr run``, end to end (Flower's start-up included), summed over the runs."""
    return sum(float(r.get("wall-seconds") or 0.0) for r in recs)


def _without_coordinates(recs: list[Rec], family: Family) -> list[Rec]:
    """The records with the run-config keys the tables and the procedure state left out (for the settings line)."""
    drop = COORDINATES | {row.key for row in family.rows} | {k for h in family.heterogeneity.values() for k in h}
    drop |= {k for row in family.rows for k in row.config}
    return [{**r, "run-config": {k: v for k, v in r["run-config"].items() if k not in drop}} for r in recs]


def procedure(fr: FamilyRecords, d: dict[str, Any]) -> str:
    fam, sel_recs, grid_recs = fr.family, fr.select_recs, fr.grid_recs
    n_mid, h_mid = fam.middle
    n_settings = sorted({len(row.settings(fam.lrs)) for row in fam.rows})
    n_values = sorted({len(row.values) for row in fam.rows})
    no_key = [row.name for row in fam.rows if row.key == "local-epochs"]
    one = len(no_key) == 1
    lines = [
        f"Every method is tuned alike: {' or '.join(map(str, n_settings))} settings each, the learning rate "
        f"({', '.join(map(str, fam.lrs))}) times {' or '.join(map(str, n_values))} value(s) of one key of its own"
        + (
            f"; {', '.join(no_key)} {'has' if one else 'have'} none and {'tunes' if one else 'tune'} "
            "`local-epochs` (FedAvg's E) instead"
            if no_key
            else ""
        )
        + ".",
        (
            f"Selection: every setting at the middle cell ({n_mid} training samples per client, {h_mid}), scored on "
            "the clients' validation splits (`evaluate-split=validation`: each client holds its validation split in "
            "place of its test split, which no method sees), seeds "
            f"{', '.join(map(str, seeds_of(sel_recs))) or 'none yet'}; a method's setting is the one with the best "
            "mean validation accuracy (ties: the first in grid order), held across the grid."
        ),
        "Grid: the chosen setting at every cell on the test splits, seeds "
        f"{', '.join(map(str, seeds_of(grid_recs))) or 'none yet'}; `min-nodes` is the number of clients (every "
        "round waits for all of them); the samples axis caps each client's training split (`train-samples`, a "
        "seeded subsample stratified by label; validation and test splits unchanged)"
        + "".join(
            f"; at {n} samples per client with `data-copies={cfg['data-copies']}` (jittered copies of the data set, "
            "so a test image may have a near copy in some training split)"
            for n, cfg in fam.samples.items()
            if cfg.get("data-copies", 1) > 1
        )
        + ".",
    ]
    inner = [row.name for row in fam.rows if row.config["method"] in USES_VALIDATION]
    if inner:
        lines.append(
            f"{', '.join(inner)} also use the validation split inside the method ({USES_VALIDATION_WHY}): their "
            "validation scores are measured on data the method itself used (optimistic as numbers; they only rank "
            "the method's own settings); their test splits stay unseen."
        )
    lines.append(
        "Cell tables: test accuracy is the mean (min-max) over seeds; Δ is the seed-paired difference to Local and to "
        "FedAvg at their own chosen settings in the same cell (points, mean and min to max over seeds) with the "
        "seeds the method wins; a pair needs equal data fingerprints († : the same training data, but the method is "
        "scored on another part of each test split, e.g. PI-FL on the half it does not fit its mixture on)."
    )
    runs = sel_recs + grid_recs
    failed = sum(1 for r in runs if r.get("error"))
    lines.append(
        f"Compute: {plural(len(sel_recs), 'selection run')} ({_duration(_wall(sel_recs))}) and "
        f"{plural(len(grid_recs), 'grid run')} ({_duration(_wall(grid_recs))}), {_duration(_wall(runs))} of wall time "
        f"in all (each `flwr run` end to end, Flower's start-up included); {failed} failed."
    )
    lines.append(header(_without_coordinates(runs, fam), [], d))
    return "\n\n".join(lines)


def selection_table(fr: FamilyRecords) -> str:
    width = max((len(row.settings(fr.family.lrs)) for row in fr.family.rows), default=0)
    rows = []
    for row in fr.family.rows:
        sel = fr.selection[row.name]
        cells = []
        for s in row.settings(fr.family.lrs):
            lab = setting_label(s)
            got = sel.scores.get(lab, {})
            m = sel.mean(lab)
            if not got:
                txt = f"{lab}: not run"
            elif m is not None:
                txt = f"{lab}: {m:.3f}"
            elif any(v is None for v in got.values()):
                txt = f"{lab}: failed"
            else:
                txt = f"{lab}: {len(got)} of {len(sel.seeds)} seeds"
            cells.append(f"**{txt}**" if lab == sel.chosen else txt)
        cells += [""] * (width - len(cells))
        rows.append([row.name, f"`{row.key}`", *cells, sel.chosen or sel.reason])
    intro = (
        f"Validation accuracy (mean over {plural(len(seeds_of(fr.select_recs)), 'seed')}) of every setting at the "
        "middle cell; the chosen setting in bold."
    )
    return intro + "\n\n" + md_table(["method", "own key", *[f"setting {i + 1}" for i in range(width)], "chosen"], rows)


def _data_line(recs: list[Rec]) -> str:
    """How many examples the clients trained and were tested on in these runs."""

    def column(name: str) -> list[float]:
        out = []
        for r in ok(recs):
            cols = r["clients"]["columns"]
            if name in cols:
                out += [
                    float(row[cols.index(name)]) for row in r["clients"]["rows"] if row[cols.index(name)] is not None
                ]
        return out

    train, test = column("num-examples"), column("test-examples")
    if not train:
        return ""
    out = f"Clients trained on {sum(train) / len(train):.1f} examples on average"
    out += f" (min {min(train):.0f}, max {max(train):.0f})"
    return out + (f" and were tested on {sum(test) / len(test):.1f} on average" if test else "") + " in these runs."


def cell_table(fr: FamilyRecords, samples: int, het: str) -> str:
    cells = {row.name: fr.cell(row.name, samples, het) for row in fr.family.rows}
    refs = {name: cells.get(name, []) for name in REFERENCES}
    rows = []
    for row in fr.family.rows:
        sel, recs = fr.selection[row.name], cells[row.name]
        if sel.chosen is None:
            rows.append([row.name, "—", f"not run: {sel.reason}", "", "", "", ""])
            continue
        vs = []
        for ref_name, ref in refs.items():
            if row.name == ref_name:
                vs += ["", ""]
            elif not ref:
                vs += [f"{ref_name} not run", "—"]
            else:
                p = paired(recs, ref, PERSONAL, test_may_differ=True)
                vs += [delta_cell(p) + (" †" if p.ok and p.other_test else ""), p.wins_text()]
        rows.append([row.name, f"`{sel.chosen}`", accuracy_cell(recs) if recs else "not run", *vs])
    # the clients' data as the references saw it (every method trains on the same splits; PI-FL tests on half)
    seen = next((refs[n] for n in REFERENCES if ok(refs[n])), [r for rs in cells.values() for r in rs])
    head = _data_line(seen)
    table = md_table(
        [
            "method",
            "setting",
            f"test acc ({plural(len(seeds_of(fr.grid_recs)), 'seed')})",
            "Δ vs Local (points)",
            "wins vs Local",
            "Δ vs FedAvg (points)",
            "wins vs FedAvg",
        ],
        rows,
    )
    return (head + "\n\n" if head else "") + table


def overview(fr: FamilyRecords, axis: str) -> str:
    """Mean test accuracy of every method along one axis (the chosen settings; '—' where not run)."""
    points = fr.axis(axis)
    names = [f"{s} samples" for s, _ in points] if axis == "samples" else [x for _, x in points]
    rows = [[row.name, *(num(mean(fr.cell(row.name, s, x), PERSONAL), 3) for s, x in points)] for row in fr.family.rows]
    return md_table(["method", *names], rows)


def figure(fr: FamilyRecords) -> Figure | None:
    """Test accuracy against samples per client and against heterogeneity: a line per method (mean over seeds, bars
    = min-max) through the cells it ran at its chosen setting; None before any grid run has a result."""
    fam = fr.family
    n, h = fam.middle
    panels = []
    for axis, title, xlabel in (
        ("samples", f"against samples per client ({h})", "training samples per client (cap)"),
        ("heterogeneity", f"against {fam.heterogeneity_title} ({n} samples per client)", fam.heterogeneity_title),
    ):
        points = fr.axis(axis)
        lines = []

        def at_point(r: Rec, points: list = points) -> dict[float, float]:
            return {points.index((r["cell"]["samples"], r["cell"]["heterogeneity"])): PERSONAL(r)}

        for i, row in enumerate(fam.rows):
            line = seed_line(
                row.name,
                [r for s, x in points for r in fr.cell(row.name, s, x)],
                at_point,
                MARKERS[(i + i // len(MARKERS)) % len(MARKERS)] + ("-" if i < len(MARKERS) else "--"),
            )
            if line:
                lines.append(line)
        names = [str(s) for s, _ in points] if axis == "samples" else [x for _, x in points]
        panels.append(Panel(title, lines, xlabel, "test accuracy", names, bars=True))
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
    return Figure(f"grids-{fam.name}.png", title, panels, columns=2, panel_size=(4.8, 3.4))


def render_family(fr: FamilyRecords, d: dict[str, Any]) -> str:
    fam = fr.family
    if not fr.select_recs and not fr.grid_recs:
        command = COMMAND.format(f" --families {fam.name}")
        return f"### {fam.title}\n\n*Not run yet: run `{command}`, then `python -m benchmarks.report`.*"
    parts = [f"### {fam.title}", procedure(fr, d), "#### Selection", selection_table(fr)]
    stale = fr.stale()
    if stale:
        parts.append(
            f"{plural(len(stale), 'grid record')} ran a setting that is not the method's chosen one (an earlier "
            f"selection, or none is chosen yet) and {'is' if len(stale) == 1 else 'are'} not shown."
        )
    n, h = fam.middle
    fig = figure(fr)
    parts += [
        f"#### Against training samples per client ({h})",
        overview(fr, "samples"),
        f"#### Against {fam.heterogeneity_title} ({n} training samples per client)",
        overview(fr, "heterogeneity"),
    ]
    if fig:
        parts.append(f"![{fig.title}]({fig.file})")
    for samples, het in fam.cells():
        middle = " (middle cell: selection ran here)" if (samples, het) == fam.middle else ""
        parts += [f"#### {samples} training samples per client, {het}{middle}", cell_table(fr, samples, het)]
    return "\n\n".join(parts)


def _intro(design: dict[str, Family]) -> str:
    fams = "; ".join(f"{f.title.lower()}: {', '.join(r.name for r in f.rows)}" for f in design.values())
    return (
        f"When does each method pay off? Two families on digits ({fams}), each method run at every cell of two axes "
        "through a middle cell (training samples per client, and heterogeneity), every method tuned alike."
    )


def _plan(design: dict[str, Family]) -> str:
    """How many runs the grids of ``design`` take with the script's default seeds."""
    n_select = sum(len(selection_runs(f, SELECT_SEEDS)) for f in design.values())
    # the grid's size does not depend on the settings chosen: count it with each row's first setting
    n_grid = sum(
        len(grid_runs(f, {r.name: setting_label(r.settings(f.lrs)[0]) for r in f.rows}, SEEDS, middle))
        for f in design.values()
        for middle in (True, False)
    )
    return (
        f"{n_select} selection runs and {n_grid} grid runs (`python -m benchmarks.grids --dry-run` prints the plan "
        "with an estimate of the hours)"
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
    """One figure per family with a grid run that has a result."""
    figs = [figure(FamilyRecords.load(f, Path(raw))) for f in (design or FAMILIES).values()]
    return [f for f in figs if f is not None]

"""Tables and plots of the equal-tuning grids (``benchmarks/grids.py``), from their raw records only.

``render(raw_dir)`` gives the Markdown: per family the procedure and the compute it took, the selection table
(every setting's validation accuracy, the chosen one marked), a samples and a heterogeneity overview, and one
table per cell (mean test accuracy over seeds, its spread, the paired difference to Local and to FedAvg with wins
out of the seeds, the setting used).  ``plots(raw_dir, out_dir)`` draws the two pictures per family: accuracy
against training samples per client and against heterogeneity, one line per method, bars = seed spread.
A cell without records says "not run"; a method whose selection is not complete says so; a failed run shows the
line of its error; records of a setting that is no longer the chosen one are counted and left out.

    python benchmarks/grids_report.py [--raw-dir benchmarks/raw] [--plots-dir benchmarks] [--out FILE]
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import grids
from common import RAW, load_records
from report import Paired, error_line, machine_note, md_table, pairing_problem, plural

Rec = dict[str, Any]
REFERENCES = ("local", "fedavg")
#: methods whose clients use their validation split themselves (client_app/): pFedLIA scores peers' lazy models on
#: it, IFCA picks its cluster by the loss on it, PI-FL bids by the tiers' accuracy on it
USES_VALIDATION = ("pfedlia", "ifca", "pifl")
USES_VALIDATION_WHY = "pFedLIA's lazy influence, IFCA's cluster choice, PI-FL's bids"
#: keys that are grid coordinates or the tuned setting, not shared settings of a family
_COORDINATES = {"seed", "method", "lr", "train-samples", "data-copies", "evaluate-split", "results-dir", "min-nodes"}


# =========================================================================== what the records hold
def acc(rec: Rec) -> float | None:
    """The run's final personalized accuracy (mean over clients), None for a failed run."""
    if rec.get("error"):
        return None
    v = (rec.get("summary") or {}).get("personal-acc")
    return None if v is None else float(v)


def client_column(rec: Rec, name: str) -> list[float]:
    cols = rec.get("clients", {}).get("columns", [])
    if name not in cols:
        return []
    i = cols.index(name)
    return [float(row[i]) for row in rec["clients"]["rows"] if row[i] is not None]


@dataclass
class Cell:
    """The records of one method at one cell, at its chosen setting."""

    recs: list[Rec]

    @property
    def accs(self) -> list[float]:
        return [a for a in map(acc, self.recs) if a is not None]

    @property
    def failed(self) -> list[Rec]:
        return [r for r in self.recs if r.get("error") or acc(r) is None]

    def text(self) -> str:
        if not self.recs:
            return "not run"
        if not self.accs:
            return f"failed: {error_line(self.failed[0].get('error')) or 'no accuracy recorded'}"
        a = self.accs
        out = f"{np.mean(a):.3f}" + (f" ± {np.std(a):.3f}" if len(a) > 1 else "") + f" (n={len(a)})"
        return out + (f", {len(self.failed)} failed" if self.failed else "")


def pair_on_training_data(a: Rec, b: Rec) -> bool:
    """Same clients with the same training examples (the test split may differ: PI-FL scores on half of it)."""
    cols = ("client", "num-examples")

    def rows(rec: Rec) -> list[tuple]:
        c = rec["clients"]["columns"]
        if not all(k in c for k in cols):
            return []
        return sorted(tuple(row[c.index(k)] for k in cols) for row in rec["clients"]["rows"])

    ra = rows(a)
    return bool(ra) and ra == rows(b)


def paired_delta(arm: list[Rec], ref: list[Rec]) -> tuple[Paired, bool]:
    """Per-seed ``arm - ref`` when every pair shares its data; the flag says the test splits differ (same training
    data, e.g. PI-FL scored on half of each test split): such a difference is shown, marked."""
    by_seed = {r["cell"]["seed"]: r for r in ref if acc(r) is not None}
    deltas, other_test = [], False
    for a in sorted((r for r in arm if acc(r) is not None), key=lambda r: r["cell"]["seed"]):
        b = by_seed.get(a["cell"]["seed"])
        if b is None:
            return Paired([], f"no reference run for seed {a['cell']['seed']}"), False
        problem = pairing_problem(a, b, draws=False)
        if problem and pair_on_training_data(a, b):
            other_test, problem = True, None
        if problem:
            return Paired([], f"seed {a['cell']['seed']}: {problem}"), False
        deltas.append(acc(a) - acc(b))  # type: ignore[operator]
    return Paired(deltas, None if deltas else "no runs to pair"), other_test


def delta_text(arm: list[Rec], ref: list[Rec], ref_name: str) -> str:
    if not ref:
        return f"{ref_name} not run"
    if not [r for r in arm if acc(r) is not None]:
        return "—"
    p, other_test = paired_delta(arm, ref)
    if not p.ok:
        return f"no paired Δ ({p.reason})"
    spread = f" ± {p.std * 100:.1f}" if len(p.deltas) > 1 else ""
    return f"{p.mean * 100:+.1f}{spread} pts, wins {p.wins}/{len(p.deltas)}" + (" †" if other_test else "")


# =========================================================================== one family
@dataclass
class FamilyRecords:
    family: grids.Family
    selection: dict[str, grids.Selection]
    select_recs: list[Rec]
    grid_recs: list[Rec]

    @classmethod
    def load(cls, family: grids.Family, raw: Path) -> FamilyRecords:
        select_recs = load_records(family.select_grid, raw)
        sel = {row.name: grids.select(family, row, select_recs) for row in family.rows}
        return cls(family, sel, select_recs, load_records(family.grid, raw))

    def cell(self, row: str, samples: int, het: str) -> Cell:
        chosen = self.selection[row].chosen
        return Cell(
            [
                r
                for r in self.grid_recs
                if r["cell"].get("method") == row
                and r["cell"].get("samples") == samples
                and r["cell"].get("heterogeneity") == het
                and r["cell"].get("setting") == chosen
            ]
        )

    def stale(self) -> list[Rec]:
        """Grid records of a setting that is not (or no longer) the row's chosen one."""
        return [
            r
            for r in self.grid_recs
            if r["cell"].get("method") in self.selection
            and r["cell"].get("setting") != self.selection[r["cell"]["method"]].chosen
        ]


def _hours(recs: Iterable[Rec]) -> float:
    return sum(float(r.get("wall-seconds") or 0.0) for r in recs) / 3600


def _shared_settings(recs: list[Rec], family: grids.Family) -> str:
    """The run-config keys every run of the family set away from the defaults, with their values."""
    if not recs:
        return ""
    tuned = {row.key for row in family.rows} | set(_COORDINATES)
    tuned |= {k for h in family.heterogeneity.values() for k in h}
    keys = set.intersection(*(set(r.get("overrides") or []) for r in recs)) - tuned
    values = {k: {repr(r["run-config"].get(k)) for r in recs} for k in keys}
    same = sorted(f"`{k}={next(iter(v))}`" for k, v in values.items() if len(v) == 1)
    return ", ".join(same)


def procedure(fr: FamilyRecords) -> str:
    fam, sel_recs, grid_recs = fr.family, fr.select_recs, fr.grid_recs
    n_mid, h_mid = fam.middle
    sel_seeds = sorted({r["cell"]["seed"] for r in sel_recs})
    grid_seeds = sorted({r["cell"]["seed"] for r in grid_recs})
    n_settings = sorted({len(row.settings(fam.lrs)) for row in fam.rows})
    clients = sorted({r.get("num-supernodes") for r in sel_recs + grid_recs} - {None})
    no_key = [row.name for row in fam.rows if row.key == "local-epochs"]
    n_values = sorted({len(row.values) for row in fam.rows})
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
            f"Selection: every setting at the middle cell ({n_mid} training samples per client, {h_mid}), scored "
            "on the clients' validation splits (`evaluate-split=validation`: each client holds its validation split "
            f"in place of its test split, which no method sees), seeds {sel_seeds or 'none yet'}; a method's setting "
            "is the one with the best mean validation accuracy (ties: the first in grid order), held across the grid."
        ),
        f"Grid: the chosen setting at every cell on the test splits, seeds {grid_seeds or 'none yet'}; "
        f"{'/'.join(map(str, clients)) or '—'} simulated clients; the samples axis caps each client's training "
        "split (`train-samples`, a seeded subsample stratified by label; validation and test splits unchanged)"
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
    shared = _shared_settings(sel_recs + grid_recs, fam)
    if shared:
        lines.append(f"Every run also sets {shared}; everything else is the app's default.")
    lines.append(
        "Δ columns: the seed-paired difference of test accuracy (percentage points, mean ± std over seeds) to Local "
        "and to FedAvg at their own chosen settings in the same cell, and the seeds the method wins; a pair needs "
        "equal data fingerprints († : same training data, but the method is scored on another part of each test "
        "split, e.g. PI-FL on the half it does not fit its mixture on)."
    )
    sel_h, grid_h = _hours(sel_recs), _hours(grid_recs)
    failed = sum(1 for r in sel_recs + grid_recs if r.get("error"))
    lines.append(
        f"Compute: {plural(len(sel_recs), 'selection run')} ({sel_h:.1f} h) and {plural(len(grid_recs), 'grid run')} "
        f"({grid_h:.1f} h) of "
        f"wall time, Flower's start-up included; {failed} failed. " + machine_note(sel_recs + grid_recs)
    )
    return "\n\n".join(lines)


def selection_table(fr: FamilyRecords) -> str:
    width = max((len(row.settings(fr.family.lrs)) for row in fr.family.rows), default=0)
    rows = []
    for row in fr.family.rows:
        sel = fr.selection[row.name]
        cells = []
        for s in row.settings(fr.family.lrs):
            lab = grids.setting_label(s)
            got = sel.scores.get(lab, {})
            if not got:
                cells.append(f"{lab}: not run")
                continue
            m = sel.mean(lab)
            if m is None:
                done = [v for v in got.values() if v is not None]
                txt = f"{lab}: " + ("failed" if len(done) < len(got) else f"{len(got)} of {len(sel.seeds)} seeds")
            else:
                txt = f"{lab}: {m:.3f}"
            cells.append(f"**{txt}**" if lab == sel.chosen else txt)
        cells += [""] * (width - len(cells))
        rows.append([row.name, f"`{row.key}`", *cells, sel.chosen or sel.reason])
    seeds = sorted({r["cell"]["seed"] for r in fr.select_recs})
    intro = (
        f"Validation accuracy (mean over {len(seeds)} seed{'s' if len(seeds) != 1 else ''}) of every setting at "
        "the middle cell; the chosen setting in bold."
    )
    return intro + "\n\n" + md_table(["method", "own key", *[f"setting {i + 1}" for i in range(width)], "chosen"], rows)


def _cell_title(fam: grids.Family, samples: int, het: str) -> str:
    mid = " (middle cell: selection ran here)" if (samples, het) == fam.middle else ""
    return f"{samples} training samples per client, {het}{mid}"


def _data_line(recs: list[Rec]) -> str:
    ok = [r for r in recs if acc(r) is not None]
    if not ok:
        return ""
    train = [v for r in ok for v in client_column(r, "num-examples")]
    test = [v for r in ok for v in client_column(r, "test-examples")]
    out = f"Clients trained on {np.mean(train):.1f} examples on average (min {min(train):.0f}, max {max(train):.0f})"
    if test:
        out += f" and were tested on {np.mean(test):.1f} on average"
    return out + " in these runs."


def cell_table(fr: FamilyRecords, samples: int, het: str) -> str:
    fam = fr.family
    cells = {row.name: fr.cell(row.name, samples, het) for row in fam.rows}
    refs = {name: cells[name].recs if name in cells else [] for name in REFERENCES}
    rows = []
    for row in fam.rows:
        sel = fr.selection[row.name]
        c = cells[row.name]
        if sel.chosen is None:
            rows.append([row.name, "—", f"not run: {sel.reason}", "", ""])
            continue
        d = [delta_text(c.recs, refs[ref], ref) if row.name != ref else "" for ref in REFERENCES]
        rows.append([row.name, f"`{sel.chosen}`", c.text(), *d])
    # the clients' data as the references saw it (every method trains on the same splits; PI-FL tests on half)
    ref_recs = next((cells[n].recs for n in REFERENCES if n in cells and cells[n].accs), None)
    head = _data_line(ref_recs if ref_recs is not None else [r for c in cells.values() for r in c.recs])
    table = md_table(["method", "setting", "test acc (mean ± std over seeds)", "Δ vs Local", "Δ vs FedAvg"], rows)
    return (head + "\n\n" if head else "") + table


def overview(fr: FamilyRecords, axis: str) -> str:
    """Mean test accuracy of every method along one axis (the chosen settings; '—' where not run)."""
    fam = fr.family
    n, h = fam.middle
    points = [(s, h) for s in fam.samples] if axis == "samples" else [(n, x) for x in fam.heterogeneity]
    header = [f"{s} samples" for s, _ in points] if axis == "samples" else [x for _, x in points]
    rows = []
    for row in fam.rows:
        vals = []
        for s, x in points:
            a = fr.cell(row.name, s, x).accs
            vals.append(f"{np.mean(a):.3f}" if a else "—")
        rows.append([row.name, *vals])
    return md_table(["method", *header], rows)


def render_family(fr: FamilyRecords, level: int = 3, plots_prefix: str = "") -> str:
    fam = fr.family
    hx = "#" * level
    parts = [f"{hx} {fam.title}", procedure(fr), f"{hx}# Selection", selection_table(fr)]
    stale = fr.stale()
    if stale:
        parts.append(
            f"{len(stale)} grid record(s) ran a setting that is not the method's chosen one (an earlier selection, "
            "or none is chosen yet) and are not shown."
        )
    n, h = fam.middle
    parts += [
        f"{hx}# Against training samples per client ({h})",
        overview(fr, "samples"),
        f"![{fam.title}: accuracy against samples per client]({plots_prefix}grids-{fam.name}-samples.png)",
        f"{hx}# Against {fam.heterogeneity_title} ({n} training samples per client)",
        overview(fr, "heterogeneity"),
        f"![{fam.title}: accuracy against {fam.heterogeneity_title}]({plots_prefix}grids-{fam.name}-heterogeneity.png)",
    ]
    for samples, het in fam.cells():
        parts += [f"{hx}# {_cell_title(fam, samples, het)}", cell_table(fr, samples, het)]
    return "\n\n".join(parts)


def render(raw_dir: Path | str = RAW, design: dict[str, grids.Family] | None = None, level: int = 3) -> str:
    """The Markdown of every family of ``design`` (default: the grids of benchmarks/grids.py)."""
    design = design or grids.FAMILIES
    return "\n\n".join(render_family(FamilyRecords.load(f, Path(raw_dir)), level) for f in design.values()) + "\n"


# =========================================================================== pictures
def plots(
    raw_dir: Path | str = RAW, out_dir: Path | str = HERE, design: dict[str, grids.Family] | None = None
) -> list[Path]:
    """Two PNGs per family in ``out_dir``: accuracy against samples per client and against heterogeneity."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    design = design or grids.FAMILIES
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for fam in design.values():
        fr = FamilyRecords.load(fam, Path(raw_dir))
        n, h = fam.middle
        for axis in ("samples", "heterogeneity"):
            points = [(s, h) for s in fam.samples] if axis == "samples" else [(n, x) for x in fam.heterogeneity]
            xs = list(range(len(points)))
            fig, ax = plt.subplots(figsize=(8, 4.8))
            colors = plt.get_cmap("tab20")
            for i, row in enumerate(fam.rows):
                means, spreads, at = [], [], []
                for x, (s, het) in zip(xs, points):
                    a = fr.cell(row.name, s, het).accs
                    if a:
                        at.append(x)
                        means.append(float(np.mean(a)))
                        spreads.append(float(np.std(a)))
                if not at:
                    continue
                offset = (i - len(fam.rows) / 2) * 0.012  # keep the error bars of close lines apart
                ax.errorbar(
                    [x + offset for x in at],
                    means,
                    yerr=spreads,
                    label=row.name,
                    color=colors((2 * i) % 20 + (2 * i) // 20),  # dark shades first, then the light ones
                    linestyle="-" if i < 10 else "--",
                    marker="osD^v<>ph*"[i % 10],
                    capsize=3,
                    linewidth=1.3,
                    markersize=4,
                )
            ax.set_xticks(xs)
            if axis == "samples":
                ax.set_xticklabels([str(s) for s, _ in points])
                ax.set_xlabel(f"training samples per client (cap; {h})")
            else:
                ax.set_xticklabels([x for _, x in points])
                ax.set_xlabel(f"{fam.heterogeneity_title} ({n} training samples per client)")
            ax.set_ylabel("test accuracy (mean over seeds, bars: std)")
            ax.set_title(f"{fam.title}: every method at its selected setting")
            ax.grid(alpha=0.3)
            if ax.lines:
                ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)
            else:
                ax.text(0.5, 0.5, "not run yet", ha="center", va="center", transform=ax.transAxes)
            fig.tight_layout()
            path = out_dir / f"grids-{fam.name}-{axis}.png"
            fig.savefig(path, dpi=110)
            plt.close(fig)
            written.append(path)
    return written


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--raw-dir", default=str(RAW))
    ap.add_argument("--plots-dir", default=str(HERE), help="where the PNGs go (default: beside RESULTS.md)")
    ap.add_argument("--out", help="write the Markdown here (default: print it)")
    ap.add_argument("--smoke", action="store_true", help="render the --smoke rehearsal's design")
    args = ap.parse_args(argv)
    design = grids.smoke_design() if args.smoke else None
    text = render(args.raw_dir, design)
    for p in plots(args.raw_dir, args.plots_dir, design):
        print(f"wrote {p}", file=sys.stderr)
    if args.out:
        Path(args.out).write_text(text)
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        print(text)


if __name__ == "__main__":
    main()

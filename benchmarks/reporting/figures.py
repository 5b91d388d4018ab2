"""Figures beside RESULTS.md: line plots with a seed spread, drawn from data computed from the raw records.

A renderer computes a :class:`Figure` (panels of :class:`Line` s: x, the mean over seeds, and its min-max band)
from its records; ``python -m benchmarks.report`` draws it to ``benchmarks/<file>`` with matplotlib (Agg) and
stores a digest of the plotted data in the PNG's text chunk ``pflower-data``.  A check compares that digest with
the data the records give now, so a stale or hand-made figure is caught without comparing pixels (which differ
between matplotlib versions).  The same data types serve any "accuracy against X, one line per method" plot.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.records import Rec, digest, ok

DIGEST_KEY = "pflower-data"


@dataclass
class Line:
    """One line: mean ``y`` at each ``x`` with its band ``lo``-``hi`` (min and max over seeds)."""

    label: str
    x: list[float]
    y: list[float]
    lo: list[float]
    hi: list[float]
    style: str = "-"  # matplotlib line style ("-", "--", ":")
    reference: bool = False  # drawn thin and grey (a baseline repeated in every panel)


@dataclass
class Panel:
    title: str
    lines: list[Line]
    xlabel: str = ""
    ylabel: str = ""
    xticks: list[str] = field(default_factory=list)  # names of the x positions 0, 1, ... (a categorical axis)
    bars: bool = False  # the seed spread as error bars, the lines dodged a little (many lines), not as bands
    joined: bool = True  # False: markers only, no line between x positions (categories that are not a scale)
    zero: bool = False  # a rule at y = 0 (differences)
    dodge: float = 0.24  # with ``bars``: the width over which the lines at one x are spread


@dataclass
class BrokenAxisPanel(Panel):
    """A panel whose x positions are named at ``xtick_at`` (``xticks`` gives the names), with the points beyond
    ``break_at`` set apart: a dashed rule at the break, and each line's last point before it joined to its points
    beyond it by a dotted segment only (e.g. epsilon on a log axis, and infinity, no privacy, beyond it)."""

    xtick_at: list[float] = field(default_factory=list)
    break_at: float | None = None


@dataclass
class Figure:
    """A figure saved as ``file`` beside RESULTS.md (referenced from it as ``![...](file)``)."""

    file: str
    title: str
    panels: list[Panel] = field(default_factory=list)
    columns: int = 4
    panel_size: tuple[float, float] = (3.2, 2.6)  # inches
    distinct: bool = False  # every label its own colour (up to 20, matplotlib's tab20), the same in every panel
    order: list[str] = field(default_factory=list)  # with ``distinct``: labels in colour order (the same in figures)

    def digest(self) -> str:
        """Digest of everything the figure shows (values rounded to 6 decimals, as the records are)."""
        return digest(_rounded(asdict(self)))


def _rounded(obj: Any) -> Any:
    if isinstance(obj, float):
        return round(obj, 6)
    if isinstance(obj, dict):
        return {k: _rounded(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_rounded(v) for v in obj]
    return obj


def seed_line(
    label: str, recs: Iterable[Rec], points: Callable[[Rec], dict[float, float]], style: str = "-", **kw: Any
) -> Line | None:
    """The mean and min-max over the runs ``recs`` (failed runs left out) of ``points(rec)`` (x -> y), at every x
    some run has; None when no run has a point."""
    per_x: dict[float, list[float]] = {}
    for r in ok(recs):
        for x, y in points(r).items():
            if y is not None:
                per_x.setdefault(x, []).append(float(y))
    if not per_x:
        return None
    xs = sorted(per_x)
    return Line(
        label,
        xs,
        [float(np.mean(per_x[x])) for x in xs],
        [min(per_x[x]) for x in xs],
        [max(per_x[x]) for x in xs],
        style,
        **kw,
    )


def per_round(key: str) -> Callable[[Rec], dict[float, float]]:
    """Points of a record's per-round metric ``key`` (rounds without it left out)."""
    return lambda r: {x["round"]: x[key] for x in r.get("rounds", []) if x.get(key) is not None}


def draw(fig: Figure, folder: Path) -> Path:
    """Draw ``fig`` to ``folder / fig.file`` (PNG, with the data digest in its text chunk)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    cols = min(fig.columns, max(1, len(fig.panels)))
    rows = max(1, math.ceil(len(fig.panels) / cols))
    width, height = fig.panel_size
    canvas, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), sharey=True, squeeze=False)
    colour = _palette(fig)
    for ax, panel in zip(axes.flat, fig.panels, strict=False):
        if panel.zero:
            ax.axhline(0.0, color="0.3", linewidth=0.8)
        for i, line in enumerate(panel.lines):
            kw = {"color": colour[line.label]} if line.label in colour else {}
            if line.reference:
                ax.plot(line.x, line.y, line.style, color="0.55", linewidth=1.0, label=line.label)
                continue
            if panel.bars:  # dodged so that the bars of close lines stay apart
                n = len(panel.lines)
                x = [v + (panel.dodge * (i / (n - 1) - 0.5) if n > 1 else 0.0) for v in line.x]
                err = [
                    [y - lo for y, lo in zip(line.y, line.lo, strict=True)],
                    [hi - y for y, hi in zip(line.y, line.hi, strict=True)],
                ]
                brk = panel.break_at if isinstance(panel, BrokenAxisPanel) else None
                if brk is None:
                    fmt = line.style if panel.joined else line.style.rstrip("-:.")
                    ax.errorbar(
                        x, line.y, err, fmt=fmt or "o", linewidth=1.3, markersize=4, capsize=2, label=line.label, **kw
                    )
                    continue
                _broken_errorbars(ax, line, x, err, brk)
                continue
            (drawn,) = ax.plot(line.x, line.y, line.style, linewidth=1.6, label=line.label, **kw)
            if line.lo != line.hi:
                ax.fill_between(line.x, line.lo, line.hi, color=drawn.get_color(), alpha=0.2, linewidth=0)
        if isinstance(panel, BrokenAxisPanel) and panel.break_at is not None:
            ax.axvline(panel.break_at, color="0.6", linestyle="--", linewidth=0.8)
        if panel.xticks:
            at = panel.xtick_at if isinstance(panel, BrokenAxisPanel) and panel.xtick_at else range(len(panel.xticks))
            ax.set_xticks(list(at), panel.xticks)
            if not isinstance(panel, BrokenAxisPanel):  # categories: a margin of about half a step on each side
                ax.set_xlim(-0.6, len(panel.xticks) - 0.4)
        else:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.set_title(panel.title, fontsize=9)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    for ax in axes.flat[len(fig.panels) :]:
        ax.set_visible(False)
    panel_of = {id(ax): panel for ax, panel in zip(axes.flat, fig.panels, strict=False)}
    for col in range(cols):  # the lowest panel of each column names the x axis
        shown = [ax for ax in axes[:, col] if ax.get_visible()]
        if shown and fig.panels:
            shown[-1].set_xlabel(panel_of[id(shown[-1])].xlabel, fontsize=8)
    for ax in axes[:, 0]:
        ax.set_ylabel(fig.panels[0].ylabel if fig.panels else "", fontsize=8)
    legend: dict[str, Any] = {}  # one legend for the figure: the same label has the same style in every panel
    for ax in axes.flat:
        for handle, text in zip(*ax.get_legend_handles_labels(), strict=True):
            legend.setdefault(text, handle)
    inch = 1 / canvas.get_figheight()  # figure coordinates of one inch from the top: title, legend, then panels
    ncol = max(1, min(len(legend), int(canvas.get_figwidth() / 1.4)))  # about 1.4 inches per legend entry
    legend_rows = max(1, math.ceil(len(legend) / ncol))
    canvas.suptitle(fig.title, fontsize=10, y=1 - 0.08 * inch, va="top")
    canvas.legend(
        list(legend.values()),
        list(legend),
        loc="upper center",
        ncol=ncol,
        fontsize=8,
        frameon=False,
        bbox_to_anchor=(0.5, 1 - 0.3 * inch),
    )
    canvas.tight_layout(rect=(0, 0, 1, 1 - (0.5 + 0.17 * (legend_rows - 1)) * inch))
    path = Path(folder) / fig.file
    canvas.savefig(path, dpi=90, metadata={DIGEST_KEY: fig.digest(), "Software": None})
    plt.close(canvas)
    return path


def _palette(fig: Figure) -> dict[str, Any]:
    """Label -> colour for a figure whose labels must each have their own (``Figure.distinct``)."""
    if not fig.distinct:
        return {}
    import matplotlib

    labels = list(
        dict.fromkeys([*fig.order, *(line.label for p in fig.panels for line in p.lines if not line.reference)])
    )
    if len(labels) <= 10:
        cmap, order = matplotlib.colormaps["tab10"], list(range(10))
    else:  # tab20's strong colours first, then their light partners
        cmap, order = matplotlib.colormaps["tab20"], [*range(0, 20, 2), *range(1, 20, 2)]
    return {label: cmap(order[i % len(order)]) for i, label in enumerate(labels)}


def _broken_errorbars(ax: Any, line: Line, x: list[float], err: list[list[float]], brk: float) -> None:
    """``line`` as error bars, its points before ``brk`` joined by its style, those beyond it by a dotted segment."""
    parts = [[j for j, v in enumerate(line.x) if v < brk], [j for j, v in enumerate(line.x) if v >= brk]]
    color = None
    for n, part in enumerate(p for p in parts if p):
        drawn = ax.errorbar(
            [x[j] for j in part],
            [line.y[j] for j in part],
            [[err[0][j] for j in part], [err[1][j] for j in part]],
            fmt=line.style,
            color=color,
            linewidth=1.3,
            markersize=4,
            capsize=2,
            label=line.label if n == 0 else None,
        )
        color = drawn[0].get_color()
    if parts[0] and parts[1]:
        a, b = parts[0][-1], parts[1][0]
        ax.plot([x[a], x[b]], [line.y[a], line.y[b]], ":", color=color, linewidth=1.0)


def stored_digest(path: Path) -> str | None:
    """The data digest a PNG drawn by :func:`draw` carries (None if the file or the chunk is missing)."""
    if not Path(path).exists():
        return None
    from PIL import Image, PngImagePlugin

    with Image.open(path) as img:
        return img.text.get(DIGEST_KEY) if isinstance(img, PngImagePlugin.PngImageFile) else None

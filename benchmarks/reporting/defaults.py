"""The table and learning curves of ``benchmarks/defaults.py`` (grid ``defaults``: every method at its defaults).

The "useful" criterion (a method at its defaults must train a useful model out of the box), applied to the
means over seeds: a method is flagged when its personalized accuracy is more than 5 points below Local's, or
more than 2 points below the better of Local's and FedAvg's.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.records import (
    GLOBAL,
    PERSONAL,
    TIE,
    Rec,
    axis,
    error_line,
    load_records,
    mean,
    ok,
    seeds_of,
    select,
    summary,
    values,
)

from .figures import Figure, Line, Panel, per_round, seed_line
from .pairing import REFERENCES, delta_cell, paired
from .pfedlia import clusters_found
from .settings import header
from .text import accuracy_cell, bullets, md_table, mean_range, missing, plural, pts, value_range

GRID = "defaults"
COMMAND = "python -m benchmarks.defaults"
CURVES = "defaults_learning_curves.png"
BELOW_LOCAL = 0.05  # useful: no method more than 5 points below Local
BELOW_BEST = 0.02  # useful: a method more than 2 points below the better of Local and FedAvg needs its reason
SECONDS = summary("seconds")


def name(method: str) -> str:
    """A method as the user types it (the ``method`` value)."""
    return f"`{method}`"


def order(recs: list[Rec]) -> list[str]:
    """Local and FedAvg first, then the methods by mean personalized accuracy (best first), failed ones last."""
    rest = [m for m in axis(recs, "method") if m not in REFERENCES]
    by_acc = sorted(rest, key=lambda m: -(mean(select(recs, method=m), PERSONAL) or -1.0))
    return [m for m in REFERENCES if select(recs, method=m)] + by_acc


def verdict(acc: float | None, local: float | None, fedavg: float | None) -> tuple[str, str]:
    """(kind, text) of the "useful" criterion for a method's mean accuracy: kind is "useful", "below-local",
    "gap", "failed" or "unknown" (no Local / FedAvg to compare with)."""
    if acc is None:
        return "failed", "no result"
    if local is None or fedavg is None:
        return "unknown", "— (needs Local and FedAvg)"
    best, best_name = (local, "Local") if local >= fedavg else (fedavg, "FedAvg")
    if acc < local - BELOW_LOCAL - TIE:
        return "below-local", f"**no**: {pts(acc - local)} vs Local (more than {BELOW_LOCAL * 100:g} points below)"
    if acc < best - BELOW_BEST - TIE:
        return "gap", f"**gap**: {pts(acc - best)} vs {best_name}, the better of Local and FedAvg"
    return "useful", "yes"


def _claims(recs: list[Rec], methods: list[str], kinds: dict[str, str]) -> list[str]:
    out = []
    groups: dict[str, list[str]] = {}
    for m in methods:
        groups.setdefault(kinds[m], []).append(name(m))
    useful = groups.get("useful", [])
    out.append(
        f"Useful by the criterion above: {len(useful)} of {plural(len(methods), 'method')}"
        + (
            f" (flagged: {', '.join(groups.get('below-local', []) + groups.get('gap', []))})"
            if groups.get("below-local") or groups.get("gap")
            else ""
        )
        + "."
    )
    if groups.get("below-local"):
        out.append(f"More than {BELOW_LOCAL * 100:g} points below Local: {', '.join(groups['below-local'])}.")
    if groups.get("gap"):
        out.append(
            f"More than {BELOW_BEST * 100:g} points below the better of Local and FedAvg (but within "
            f"{BELOW_LOCAL * 100:g} points of Local): {', '.join(groups['gap'])}."
        )
    for m in methods:
        failed = [r for r in select(recs, method=m) if r.get("error")]
        if failed:
            out.append(
                f"{name(m)} failed in {len(failed)} of {plural(len(select(recs, method=m)), 'run')}: "
                f"{error_line(failed[0]['error'])}."
            )
    fedavg = select(recs, method="fedavg")
    for m in methods:
        if m == "fedavg" or not ok(select(recs, method=m)):
            continue
        p = paired(select(recs, method=m), fedavg, PERSONAL)
        if p.ok and all(abs(d) <= TIE for d in p.deltas):
            out.append(f"{name(m)} has FedAvg's accuracy in every seed (paired difference 0).")
        found = [f for f in map(clusters_found, ok(select(recs, method=m))) if f is not None]
        if found:
            ones = sum(f == 1 for f in found)
            out.append(
                f"{name(m)} ended with {value_range(found)} {'cluster' if max(found) == 1 else 'clusters'}"
                + (f" (one cluster, i.e. a single model, in {ones} of {plural(len(found), 'seed')})" if ones else "")
                + "."
            )
    secs = values(recs, SECONDS)
    if secs:
        slow = max(methods, key=lambda m: mean(select(recs, method=m), SECONDS) or 0.0)
        out.append(
            f"Seconds per run (ServerApp time, shared machine): median over all runs "
            f"{float(np.median(secs)):.0f} s; slowest method {name(slow)} "
            f"({mean(select(recs, method=slow), SECONDS):.0f} s per run)."
        )
    return out


def render_defaults(raw: Path, d: dict[str, Any]) -> str:
    recs = load_records(GRID, raw)
    intro = (
        "Every `method` value run with the defaults a user gets from `flwr run . --run-config \"method='X'\"` "
        "on the README's 10 simulated nodes (`num-supernodes=10 client-resources-num-cpus=1`): the default "
        "data, model, optimizer and rounds; only `seed` varies (seed 0 is the default; the same seed gives every "
        "method the same partition, so differences are paired by seed) and `min-nodes=10` makes every round wait "
        "for all ten nodes. Personalized accuracy: each client's model on its own test split, mean over "
        "clients, last round; global: the method's global model where it has one. Spreads are min-max over "
        "seeds. Δ: the method minus Local (or FedAvg) on the same seed, in points, paired only when the two "
        "runs' data fingerprints agree. Useful: not more than "
        f"{BELOW_LOCAL * 100:g} points below Local, and not more than {BELOW_BEST * 100:g} points below the "
        "better of Local and FedAvg (a flagged gap needs its measured reason in the method's docs page)."
    )
    if not recs:
        return intro + "\n\n" + missing(COMMAND)
    methods = order(recs)
    local, fedavg = select(recs, method="local"), select(recs, method="fedavg")
    local_acc, fedavg_acc = mean(local, PERSONAL), mean(fedavg, PERSONAL)
    rows, kinds = [], {}
    for m in methods:
        sel = select(recs, method=m)
        kind, text = verdict(mean(sel, PERSONAL), local_acc, fedavg_acc)
        kinds[m] = kind
        vs = [
            paired(sel, ref, PERSONAL) if m != ref_m and ref else None
            for ref_m, ref in (("local", local), ("fedavg", fedavg))
        ]
        rows.append(
            [
                name(m),
                accuracy_cell(sel),
                mean_range(values(sel, GLOBAL)),
                delta_cell(vs[0]),
                "—" if vs[0] is None else vs[0].wins_text(),
                delta_cell(vs[1]),
                "—" if vs[1] is None else vs[1].wins_text(),
                mean_range(values(sel, SECONDS), 0),
                text if kind != "failed" else "failed",
            ]
        )
    table = md_table(
        [
            "method",
            f"personalized acc ({plural(len(seeds_of(recs)), 'seed')})",
            "global-model acc",
            "Δ vs Local (points)",
            "wins vs Local",
            "Δ vs FedAvg (points)",
            "wins vs FedAvg",
            "ServerApp s per run (shared machine)",
            "useful?",
        ],
        rows,
    )
    curves = (
        f"![Learning curves: personalized accuracy per round, every method at its defaults]({CURVES})\n\n"
        "Learning curves (`" + CURVES + "`): personalized accuracy per round, mean over seeds with the min-max band; "
        "dashed: the global model where the method has one; grey: Local (solid) and FedAvg (dashed) for reference."
    )
    return "\n\n".join([intro, header(recs, [], d), table, bullets(_claims(recs, methods, kinds)), curves])


def figures_defaults(raw: Path) -> list[Figure]:
    """Learning curves: one panel per method that ran (failed runs left out), Local and FedAvg as references."""
    recs = load_records(GRID, raw)
    methods = [m for m in order(recs) if ok(select(recs, method=m))]
    if not methods:
        return []
    refs = {
        m: seed_line(f"{m} (reference)", select(recs, method=m), per_round("personal-acc"), style, reference=True)
        for m, style in (("local", "-"), ("fedavg", "--"))
    }
    panels = []
    for m in methods:
        sel = select(recs, method=m)
        lines: list[Line] = []
        personal = seed_line("personalized", sel, per_round("personal-acc"))
        glob = seed_line("global model", sel, per_round("global-acc"), "--")
        lines += [x for x in (personal, glob if glob and personal and glob.y != personal.y else None) if x]
        lines += [ref for r, ref in refs.items() if ref is not None and r != m]
        panels.append(Panel(m, lines, "round", "accuracy"))
    n = len(seeds_of(recs))
    title = f"Every method at its defaults: accuracy per round (mean over {plural(n, 'seed')}, band = min-max)"
    return [Figure(CURVES, title, panels)]

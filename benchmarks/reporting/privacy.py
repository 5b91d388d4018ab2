"""The table and figure of ``benchmarks/privacy.py`` (grid ``privacy``): personalized accuracy against epsilon.

Rows: every method at every target epsilon (1, 4, 16 and infinity, the run without DP), with the DP mode, the
noise multiplier the search found, the epsilon the runs' accountant reached, the accuracy over seeds and the
seed-paired difference to the method's own accuracy without DP.  A method that refused DP at start-up in every
run (FedCAC) gets one row with the refusal, as the run reported it.
"""

from __future__ import annotations

import math
import re
from pathlib import Path
from typing import Any

from benchmarks.records import PERSONAL, Rec, axis, error_line, load_records, mean, ok, select, summary, values

from .figures import BrokenAxisPanel, Figure, Line, seed_line
from .pairing import delta_cell, paired
from .settings import header
from .text import NAMES, bullets, md_table, mean_range, missing, plural, pts, value_range

GRID = "privacy"
COMMAND = "python -m benchmarks.privacy"
FIGURE = "privacy_epsilon.png"
METHODS = ("fedavg", "ditto", "fedc2i", "fedcac")  # the methods, in the table's order
REFERENCE = "local"  # no model leaves a client: a privacy-free reference (it refuses every DP mode)
INF = "inf"
EPSILON = summary("epsilon")
NAMES = {**NAMES, "fedc2i": "FedC2I"}
PRIVACY_DOC = "../docs/privacy.md"


def epsilons(recs: list[Rec]) -> list[str]:
    """The epsilon labels of the records, finite ones ascending, infinity last."""
    present = {r["cell"]["epsilon"] for r in recs}
    return sorted(present - {INF}, key=float) + ([INF] if INF in present else [])


def methods(recs: list[Rec]) -> list[str]:
    return list(axis(recs, "method", (*METHODS, REFERENCE)))


def name(method: str) -> str:
    return NAMES.get(method, method)


def _eps(label: str) -> str:
    return "∞" if label == INF else label


def mode_of(recs: list[Rec]) -> str:
    modes = sorted({(r.get("dp-target") or {}).get("mode") or r["run-config"].get("dp-mode", "off") for r in recs})
    return " / ".join(modes) if modes else "—"


def refused(sel: list[Rec]) -> str | None:
    """The error line every run of ``sel`` stopped with, when they all stopped with the same one (else None)."""
    lines = {error_line(r["error"]) for r in sel}
    return next(iter(lines)) if sel and all(r.get("error") for r in sel) and len(lines) == 1 else None


def _multiplier(sel: list[Rec]) -> str:
    vals = sorted({r["run-config"].get("dp-noise-multiplier") for r in sel if r["run-config"].get("dp-mode") != "off"})
    return " / ".join(f"{v:g}" for v in vals) if vals else "—"


def _reached(sel: list[Rec]) -> str:
    eps, deltas = values(sel, EPSILON), values(sel, summary("delta"))
    if not eps:
        return "—"
    lo, hi = f"{min(eps):.3g}", f"{max(eps):.3g}"
    return (lo if lo == hi else f"{lo}-{hi}") + "".join(f" (δ {d:g})" for d in sorted(set(deltas)))


def _rows(recs: list[Rec]) -> tuple[list[list[Any]], list[str]]:
    rows, notes = [], []
    for m in methods(recs):
        mine = select(recs, method=m)
        base = select(mine, epsilon=INF)
        finite = [e for e in epsilons(mine) if e != INF]
        why = refused([r for r in mine if r["cell"]["epsilon"] != INF])
        if finite and why:  # every DP run stopped at start-up with the same reason: one row says so
            rows.append(
                [
                    name(m),
                    mode_of([r for r in mine if r["cell"]["epsilon"] != INF]) + " (asked)",
                    ", ".join(finite),
                    "—",
                    "—",
                    "—",
                    "refused at start-up: " + why.replace("|", "\\|"),
                    "—",
                ]
            )
            finite = []
            notes.append(f"{name(m)} refused every DP run at start-up ({plural(len(mine) - len(base), 'run')}).")
        for e in [*finite, *([INF] if base else [])]:
            sel = select(mine, epsilon=e)
            acc, failed = values(sel, PERSONAL), [r for r in sel if r.get("error")]
            cell = mean_range(acc) if acc else "—"
            if failed:
                cell += f" ({len(failed)} of {plural(len(sel), 'run')} failed: {error_line(failed[0]['error'])})"
            gap = "—" if e == INF or not base else delta_cell(paired(sel, base, PERSONAL))
            rows.append(
                [
                    name(m),
                    mode_of(sel),
                    _eps(e),
                    _multiplier(sel),
                    _reached(sel) if e != INF else "∞ (no DP)",
                    str(len(ok(sel))),
                    cell.replace("|", "\\|"),
                    gap,
                ]
            )
    return rows, notes


def _claims(recs: list[Rec]) -> list[str]:
    out = []
    for m in methods(recs):
        mine = select(recs, method=m)
        base = mean(select(mine, epsilon=INF), PERSONAL)
        at = {e: a for e in epsilons(mine) if e != INF and (a := mean(select(mine, epsilon=e), PERSONAL)) is not None}
        if base is None or not at:
            continue
        parts = ", ".join(f"{pts(a - base)} at ε={e}" for e, a in at.items())
        out.append(f"{name(m)} (without DP {base:.4f}): {parts} (means over seeds).")
    local = mean(select(recs, method=REFERENCE, epsilon=INF), PERSONAL)
    if local is not None:
        for e in [e for e in epsilons(recs) if e != INF]:
            above = [
                name(m)
                for m in methods(recs)
                if m != REFERENCE and (a := mean(select(recs, method=m, epsilon=e), PERSONAL)) is not None and a > local
            ]
            out.append(
                f"At ε={e}, above Local ({local:.4f}, no model leaves a client): "
                + (", ".join(above) if above else "none")
                + "."
            )
    for m in methods(recs):
        for e in epsilons(recs):
            sel = ok(select(recs, method=m, epsilon=e))
            rejected = [r for r in sel if (r.get("failures") or {}).get("count")]
            if not rejected:
                continue
            n = sum(r["failures"]["count"] for r in rejected)
            evaluated = [r["rounds"][-1].get("eval-clients") for r in sel if r.get("rounds")]
            evaluated = [c for c in evaluated if c is not None]
            reason = re.sub(r"got [-+0-9.e]+", "got ...", rejected[0]["failures"]["first"][0])
            out.append(
                f"{name(m)} at ε={_eps(e)}: the server's reply gate rejected {n} {'reply' if n == 1 else 'replies'} in "
                f"{len(rejected)} of {plural(len(sel), 'run')} (e.g. {reason}); its accuracy is the mean over the "
                f"clients evaluated in the last round: {value_range(evaluated)} of "
                f"{' / '.join(str(c) for c in sorted({r['num-supernodes'] for r in sel}))}."
            )
    noise = _noise(recs)
    if noise:
        out.append(
            "Noise std added to every coordinate of a release (weights, biases and BatchNorm statistics), against "
            "the clip bound `dp-clip` on the norm of a client's whole update: " + "; ".join(noise) + "."
        )
    targets = [r for r in ok(recs) if (r.get("dp-target") or {}).get("epsilon") is not None]
    over = [r for r in targets if (r["summary"].get("epsilon") or math.inf) > r["dp-target"]["epsilon"] * (1 + 1e-9)]
    if targets:
        reached = [r["summary"]["epsilon"] / r["dp-target"]["epsilon"] for r in targets if r["summary"].get("epsilon")]
        out.append(
            f"The accountant's epsilon after the last round is at most the target in {len(targets) - len(over)} of "
            f"{plural(len(targets), 'DP run')}"
            + (f" ({min(reached):.2%}-{max(reached):.2%} of it)" if reached else "")
            + "."
        )
    return out


def _noise(recs: list[Rec]) -> list[str]:
    """Per DP mode, the noise std per coordinate at each target: central sigma*C/m on the mean of the m clients'
    updates, local sigma*C on each client's release (task/privacy.py)."""
    out = []
    for mode in ("central", "local"):
        at: dict[str, set[str]] = {}
        clip: set[float] = set()
        for r in recs:
            cfg = r["run-config"]
            if cfg.get("dp-mode") != mode or not cfg.get("dp-noise-multiplier") or cfg.get("dp-clip") is None:
                continue
            m = r["num-supernodes"] if mode == "central" else 1
            std = cfg["dp-noise-multiplier"] * cfg["dp-clip"] / m
            at.setdefault(r["cell"]["epsilon"], set()).add(f"{std:.3g}")
            clip.add(cfg["dp-clip"])
        if at:
            how = (
                "on the mean of the round's updates: dp-noise-multiplier x dp-clip / clients"
                if mode == "central"
                else "on each release: dp-noise-multiplier x dp-clip"
            )
            values_ = ", ".join(
                f"{' / '.join(sorted(v))} at ε={e}" for e, v in sorted(at.items(), key=lambda x: float(x[0]))
            )
            out.append(f"{mode} ({how}, dp-clip={' / '.join(f'{c:g}' for c in sorted(clip))}): {values_}")
    return out


def setting(recs: list[Rec], d: dict[str, Any]) -> str:
    """The data and run size the records share (from their run configs, else the defaults ``d``)."""

    def one(key: str) -> str:
        vals = sorted({str(r["run-config"].get(key, d.get(key))) for r in recs if r.get("run-config")})
        vals = vals or [str(d.get(key))]
        return " / ".join(vals)

    clients = " / ".join(str(n) for n in sorted({r["num-supernodes"] for r in recs})) or "—"
    return (
        f"{one('dataset')}, {one('partition')} (alpha {one('alpha')}), {clients} clients, "
        f"{one('num-server-rounds')} rounds"
    )


def render_privacy(raw: Path, d: dict[str, Any]) -> str:
    recs = load_records(GRID, raw)
    intro = (
        "Personalized accuracy against the client-level privacy budget ε on the default partition "
        f"({setting(recs, d)}), every method at the defaults a user gets from `flwr run . --run-config "
        "\"method='X'\"` with only the DP keys set: `dp-mode` (FedAvg and Ditto `central`, FedC2I `local`: the "
        "mode each supports) and `dp-noise-multiplier`; `dp-clip` and `dp-delta` are the defaults. No method is "
        "tuned, for DP or otherwise (the same tuning budget for every method: none); `min-nodes` set to the number "
        "of nodes makes every round wait for all of them, as in the defaults table. For each target ε the noise "
        "multiplier is the one the runs' own accountant (`task/privacy.py`) needs to reach it at these settings "
        "(bisection, rounded up: the ε reached is at most the target); ∞ is the run without DP. FedCAC supports "
        "no DP mode: its DP runs were asked for all the same, and its row shows the refusal the run stopped with. "
        "Local (no model leaves a client, so it needs no DP and refuses it) is the reference without any "
        "release.\n\n"
        "**Central and local ε are not the same guarantee** "
        f"([docs/privacy.md]({PRIVACY_DOC}#differential-privacy)). Central (FedAvg, Ditto) needs a trusted server: "
        "the server adds the noise once, to the unweighted mean of the clipped updates, and still sees each "
        "clipped update; the guarantee holds against everyone who sees only the noised averages (other clients "
        "and readers of the results), for one client's data added or removed. Ditto's personal model is not "
        "released. Local (FedC2I): each client noises the model it releases, so the guarantee holds against every "
        "peer and any coalition of peers, and against the server for the models, for any other data set of the "
        "client; it does not cover FedC2I's influence vector and metrics, which the server receives un-noised "
        f"([Local DP in FedC2I]({PRIVACY_DOC}#local-dp-in-fedc2i)). The same ε thus protects against more "
        "observers under local DP, and costs more noise there.\n\n"
        "Columns: the multiplier of the run config; ε reached: the accountant's ε after the last round, from the "
        "runs' `summary.json`; accuracy: each client's model on its own test split, mean over clients, last round, "
        "mean (min-max) over seeds; Δ: the method at this ε minus the same method without DP on the same seed, in "
        "points (mean, min to max over seeds)."
    )
    if not recs:
        return intro + "\n\n" + missing(COMMAND)
    rows, notes = _rows(recs)
    table = md_table(
        [
            "method",
            "DP mode",
            "target ε",
            "dp-noise-multiplier",
            "ε reached (δ)",
            "seeds",
            "personalized acc",
            "Δ vs its own no-DP acc (points)",
        ],
        rows,
    )
    figure = (
        f"![Personalized accuracy against epsilon, one line per method]({FIGURE})\n\n"
        f"`{FIGURE}`: personalized accuracy against ε (log scale), mean over seeds with min-max bars; ∞ (no DP) "
        "is set apart beyond the dashed rule; grey: Local."
    )
    # the DP keys vary by row and are the table's columns: the settings line names them once
    shown = ("dp-mode", "dp-noise-multiplier")
    plain = [{**r, "run-config": {k: v for k, v in r["run-config"].items() if k not in shown}} for r in recs]
    lines = header(plain, [], d).split("\n")
    dp = "`dp-mode` and `dp-noise-multiplier` differ from the defaults as the table's columns say."
    lines.insert(1 + any(line.startswith("Settings that differ") for line in lines), dp)
    return "\n\n".join([intro, "\n".join(lines), table, bullets([*notes, *_claims(recs)]), figure])


def figures_privacy(raw: Path) -> list[Figure]:
    """Accuracy against epsilon: x = log2(epsilon), infinity two steps beyond the largest target."""
    recs = load_records(GRID, raw)
    if not ok(recs):
        return []
    finite = [e for e in epsilons(recs) if e != INF]
    top = max((math.log2(float(e)) for e in finite), default=0.0)
    at_inf = top + 2.0

    def x(label: str) -> float:
        return at_inf if label == INF else math.log2(float(label))

    def points(r: Rec) -> dict[float, float]:
        return {x(r["cell"]["epsilon"]): r["summary"].get("personal-acc")}

    lines: list[Line] = []
    for m in methods(recs):
        if m == REFERENCE:
            continue
        line = seed_line(name(m), select(recs, method=m), points, "o-")
        if line is not None:
            lines.append(line)
    local = seed_line("Local (no release)", select(recs, method=REFERENCE, epsilon=INF), points, "-", reference=True)
    if local is not None:
        xs = [x(e) for e in finite] + [at_inf]
        lines.append(Line(local.label, xs, local.y * len(xs), local.lo * len(xs), local.hi * len(xs), "-", True))
    labels = [*finite, INF]
    panel = BrokenAxisPanel(
        setting(recs, {}),
        lines,
        "ε (log scale; ∞: no DP)",
        "personalized accuracy",
        xticks=[_eps(e) for e in labels],
        bars=True,
        xtick_at=[x(e) for e in labels],
        break_at=(top + at_inf) / 2,
    )
    counts = sorted({len(ok(select(recs, method=m, epsilon=e))) for m in methods(recs) for e in epsilons(recs)} - {0})
    n = f"{counts[0]}-{counts[-1]} seeds" if counts[0] != counts[-1] else plural(counts[0], "seed")
    title = f"Personalized accuracy against ε ({n} per point, bars: min-max)"
    return [Figure(FIGURE, title, [panel], columns=1, panel_size=(6.4, 3.6))]

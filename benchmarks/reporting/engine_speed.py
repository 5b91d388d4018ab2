"""The table of ``benchmarks/engine_speed.py`` (grids ``engine-fresh``, ``engine-second``, ``engine-grid``,
``engine-scale``): each measurement beside its reference from the same invocation, its goal, and the gap where the
goal is missed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.records import load_records

from .settings import machine_note
from .text import md_table, missing

GRIDS = ("engine-fresh", "engine-second", "engine-grid", "engine-scale")
COMMAND = "python -m benchmarks.engine_speed fresh second grid scale"


def _verdict(met: bool, gap: str) -> str:
    return "met" if met else f"missed: {gap}"


def _shortfall(engine: float, reference: float, goal: float) -> str:
    """How far a ratio goal was missed, in the engine's seconds: what it took beyond ``reference / goal``."""
    return f"{engine - reference / goal:.2f} s over the {goal:g}x time ({reference / goal:.2f} s)"


def _rows(recs: dict[str, list[dict[str, Any]]]) -> list[list[str]]:
    rows = []
    for r in recs.get("engine-fresh", []):
        m = r["measurements"]
        rows.append(
            [
                "the default job in a fresh process, against `flwr run` with a warm SuperLink",
                f"{m['engine-median']:.1f} s",
                f"{m['flwr-run-median']:.1f} s",
                f"{m['ratio']:.2f}x faster",
                f"at least {m['goal']:.0f}x",
                _verdict(m["ratio"] >= m["goal"], _shortfall(m["engine-median"], m["flwr-run-median"], m["goal"])),
            ]
        )
    for r in recs.get("engine-second", []):
        m = r["measurements"]
        second = m["run-seconds"][1]
        fresh = [x["measurements"]["flwr-run-median"] for x in recs.get("engine-fresh", [])]
        ref = f"{fresh[0]:.1f} s (`flwr run`, above)" if fresh else "—"
        ratio = f"{fresh[0] / second:.1f}x faster" if fresh else "—"
        rows.append(
            [
                "the default job as the second run in the same worker (third in brackets)",
                f"{second:.2f} s ({m['run-seconds'][2]:.2f} s)",
                ref,
                ratio,
                f"at most {m['goal-seconds']:.0f} s",
                _verdict(second <= m["goal-seconds"], f"{second - m['goal-seconds']:.2f} s over"),
            ]
        )
    for r in recs.get("engine-grid", []):
        m = r["measurements"]
        rows.append(
            [
                f"a {m['runs']}-run grid with `--jobs {m['jobs']}`, against the same runs through `flwr run`",
                f"{m['engine-seconds']:.0f} s",
                f"{m['flwr-run-seconds']:.0f} s",
                f"{m['ratio']:.2f}x faster",
                f"at least {m['goal']:.0f}x",
                _verdict(m["ratio"] >= m["goal"], _shortfall(m["engine-seconds"], m["flwr-run-seconds"], m["goal"])),
            ]
        )
        peak = max(m["worker-peak-rss-mb"])
        rows.append(
            [
                "peak memory per worker (the grid above)",
                " / ".join(f"{v:,.0f} MB" for v in m["worker-peak-rss-mb"]),
                "—",
                "—",
                f"at most {m['memory-goal-mb']:,.0f} MB",
                _verdict(peak <= m["memory-goal-mb"], f"{peak - m['memory-goal-mb']:,.0f} MB over"),
            ]
        )
    for r in recs.get("engine-scale", []):
        m = r["measurements"]
        engine = m["engine"]["median-after-first"]
        flwr = (m.get("flwr-run") or {}).get("median-after-first")
        cfg = m["run-config"]
        rows.append(
            [
                (
                    f"{m['clients']:,} clients, FedAvg on {cfg['dataset']}, {cfg['fraction-train']:.0%} per round: "
                    "seconds a round (median after the first)"
                ),
                f"{engine:.2f} s",
                "—" if flwr is None else f"{flwr:.2f} s",
                "—" if flwr is None else f"{flwr / engine:.1f}x faster",
                f"at most {m['goal-seconds']:.0f} s",
                _verdict(engine <= m["goal-seconds"], f"{engine - m['goal-seconds']:.2f} s over"),
            ]
        )
    return rows


def render_engine_speed(raw: Path, d: dict[str, Any]) -> str:
    recs = {g: load_records(g, raw) for g in GRIDS}
    if not any(recs.values()):
        return missing(COMMAND)
    intro = (
        "The engine (`python -m server_app.sweep`: Flower's simulation runtime in one process, clients one at a time "
        "per worker) against `flwr run` (a SuperLink, a simulation process and a Ray cluster per run, clients in "
        "parallel). Each measurement and its reference come from the same invocation on the same machine; seconds "
        "are wall-clock seconds of whole commands or of the rounds the ServerApp records."
    )
    table = md_table(["measurement", "engine", "`flwr run`", "ratio", "goal", ""], _rows(recs))
    every = [r for g in GRIDS for r in recs[g]]
    return "\n\n".join(x for x in (intro, f"Command: `{COMMAND}`.", table, machine_note(every)) if x)

"""The table of ``benchmarks/fedc2i_speed.py`` (grid ``fedc2i-speed``: in-process timings)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.records import load_records

from .settings import header
from .text import bullets, md_table, missing


def render_fedc2i_speed(raw: Path, d: dict[str, Any]) -> str:
    recs = load_records("fedc2i-speed", raw)
    intro = (
        "The client's influence phase of one round (leave-one-out losses from the sum, one vmapped evaluation of "
        "the M candidates, the class-level matrix, mixing) against one round of local training (2 epochs of "
        "Adam, batch 32), on one thread as a simulated client runs, median of the repeats; and the bytes a client "
        "downloads per round with all M models and with `c2i-peers=5`. Not a federated run: the method's own "
        "code timed in-process."
    )
    if not recs:
        return intro + "\n\n" + missing("python -m benchmarks.fedc2i_speed")
    rows, claims = [], []
    for r in sorted(recs, key=lambda r: (r["cell"]["model"], -r["cell"]["train-samples"], r["cell"]["M"])):
        m, c = r["measurements"], r["cell"]
        rows.append(
            [
                c["model"],
                c["train-samples"],
                c["M"],
                f"{m['influence-s']:.3f}",
                f"{m['local-training-s']:.3f}",
                f"{m['influence-s'] / m['local-training-s']:.2f}",
                f"{m['download-all-bytes'] / 1e6:.2f} MB",
                f"{m['download-k5-bytes'] / 1e6:.2f} MB",
            ]
        )
    for n in sorted({r["cell"]["train-samples"] for r in recs}, reverse=True):
        sel = [r for r in recs if r["cell"]["train-samples"] == n]
        top = max(sel, key=lambda r: r["cell"]["M"])["measurements"]
        claims.append(
            f"{n} training samples: at the largest M the influence phase is "
            f"{top['influence-s'] / top['local-training-s']:.2f}x the local training."
        )
    return "\n\n".join(
        [
            intro,
            header(recs, [], d),
            md_table(
                [
                    "model",
                    "training samples",
                    "M",
                    "influence phase (s, shared machine)",
                    "local training (s)",
                    "ratio",
                    "download per client per round, all M",
                    "with `c2i-peers=5`",
                ],
                rows,
            ),
            bullets(claims),
        ]
    )

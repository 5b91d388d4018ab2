"""The tables of ``benchmarks/scale.py``.

Grids ``scale-floor``, ``scale-overhead``, ``scale-scale`` and ``scale-kernels``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.records import Rec, axis, error_line, load_records, ok, select

from .settings import header
from .text import md_table, missing, num


def round_split(rec: Rec) -> dict[str, float | None]:
    """Median per-round split of a run: rounds after the first, training-only rounds when there are any."""
    workers = rec["machine"]["cores"] or 1
    later = rec["rounds"][1:] or rec["rounds"]
    later = [r for r in later if not r.get("eval-clients")] or later
    rows = []
    for r in later:
        n = max(1, int(r.get("train-clients", 0)))
        w = min(workers, n)
        floor = r.get("train-seconds-per-client", 0.0) * n / w
        method = r.get("method-seconds-per-client", 0.0) * n / w
        seconds, server = r.get("seconds") or 0.0, r.get("server-seconds", 0.0)
        rows.append(
            {
                "seconds": seconds,
                "local-train": floor,
                "method-client": method,
                "server": server,
                "rest": seconds - floor - method - server,
                "ratio": seconds / floor if floor > 0 else None,
                "kb-down": r.get("bytes-down", 0) / n / 1e3,
                "kb-up": r.get("bytes-up", 0) / n / 1e3,
                "server-mb": r.get("server-rss-mb"),
                "client-mb": r.get("client-rss-mb"),
                "train-per-client": r.get("train-seconds-per-client"),
            }
        )
    keys = rows[0].keys() if rows else []
    return {
        k: (float(np.median([x[k] for x in rows if x[k] is not None])) if any(x[k] is not None for x in rows) else None)
        for k in keys
    }


SPLIT_HEADER = [
    "method",
    "clients",
    "s / round",
    "local training (floor)",
    "method client work",
    "server",
    "rest (Flower, dispatch)",
    "round / floor",
    "KB down / client",
    "KB up / client",
    "server peak MB",
    "client peak MB",
]


def _split_rows(recs: list[Rec], order: list[str]) -> list[list[Any]]:
    rows = []
    for n in sorted({r["cell"]["clients"] for r in recs}):
        for m in axis(recs, "method", order):
            for r in select(recs, method=m, clients=n):
                if r.get("error"):
                    rows.append([m, n, f"failed: {error_line(r['error'])}"] + ["—"] * 9)
                    continue
                s = round_split(r)
                rows.append(
                    [
                        m,
                        n,
                        num(s["seconds"], 2),
                        num(s["local-train"], 2),
                        num(s["method-client"], 2),
                        num(s["server"], 2),
                        num(s["rest"], 2),
                        num(s["ratio"], 2),
                        num(s["kb-down"], 1),
                        num(s["kb-up"], 1),
                        num(s["server-mb"], 0),
                        num(s["client-mb"], 0),
                    ]
                )
    return rows


SCALE_METHODS = [
    "local",
    "fedavg",
    "fedprox",
    "fedper",
    "fedrep",
    "fedrod",
    "ditto",
    "fedcac",
    "fedc2i",
    "pfedlia",
    "cfl",
    "pifl",
    "ifca",
    "fedsoft",
    "client2vec",
    "moon",
]
FLOOR_TARGET = 1.5  # target: a round within 1.5x of its pure local training


def render_scale(raw: Path, d: dict[str, Any]) -> str:
    intro = (
        "Seconds per round through Flower's simulation runtime, split into the clients' local training (the "
        "floor: the sum of the clients' training seconds over the workers, one client per core), the clients' "
        "method-specific work, the server's strategy time and the rest (Flower messaging, Ray dispatch, "
        "serialisation). Medians over the rounds after the first (process start-up) without an evaluation "
        "phase. KB per client = all bytes of a round, every phase, over the clients that trained. Ratios are "
        "measured against the floor of the same run; absolute seconds depend on the machine's load."
    )
    parts = [intro]
    floor = load_records("scale-floor", raw)
    parts.append("### Flower's overhead against pure local training (the floor)")
    if floor:
        parts += [header(floor, [], d), md_table(SPLIT_HEADER, _split_rows(floor, ["fedavg"]))]
        for r in ok(floor):
            s = round_split(r)
            if s["ratio"] is not None:
                parts.append(
                    f"- One client's local training takes {s['train-per-client']:.2f} s; the round is "
                    f"{s['ratio']:.2f}x its floor ({'within' if s['ratio'] <= FLOOR_TARGET else 'above'} the "
                    f"{FLOOR_TARGET}x target)."
                )
    else:
        parts.append(missing("python -m benchmarks.scale floor"))
    over = load_records("scale-overhead", raw)
    parts.append("### Every method: split of a round, bytes, memory")
    if over:
        parts += [header(over, [], d), md_table(SPLIT_HEADER, _split_rows(over, SCALE_METHODS))]
        ratios = [(r["cell"]["method"], r["cell"]["clients"], round_split(r)["ratio"]) for r in ok(over)]
        known = [(a, b, ratio) for a, b, ratio in ratios if ratio is not None]
        if known:
            lo, hi = min(known, key=lambda x: x[2]), max(known, key=lambda x: x[2])
            parts.append(
                f"- Round / floor ranges from {lo[2]:.2f} ({lo[0]}, {lo[1]} clients) to {hi[2]:.2f} "
                f"({hi[0]}, {hi[1]} clients) on this deliberately tiny workload."
            )
    else:
        parts.append(missing("python -m benchmarks.scale overhead"))
    scale = load_records("scale-scale", raw)
    parts.append("### Scaling to 1,000 clients")
    if scale:
        parts += [header(scale, [], d), md_table(SPLIT_HEADER, _split_rows(scale, ["fedavg", "fedcac", "fedc2i"]))]
        sizes = sorted({r["cell"]["clients"] for r in scale})
        rows = []
        for m in axis(scale, "method", ["fedavg", "fedcac", "fedc2i"]):
            per = {
                n: round_split(r)["seconds"] / n * 1000 for n in sizes for r in ok(select(scale, method=m, clients=n))
            }
            rows.append([m] + [num(per.get(n), 1) for n in sizes])
        parts.append(md_table(["method"] + [f"ms per client per round: {n} clients" for n in sizes], rows))
    else:
        parts.append(missing("python -m benchmarks.scale scale"))
    kernels = load_records("scale-kernels", raw)
    parts.append("### Server kernels that are quadratic in clients (in-process, one thread)")
    if kernels:
        parts += [
            header(kernels, [], d),
            md_table(
                ["server kernel", "clients", "seconds (best of the repeats, shared machine)"],
                [
                    [
                        r["cell"]["kernel"]
                        + (
                            f" ({r['measurements']['parameters']:,} parameters)"
                            if "FedCAC" in r["cell"]["kernel"]
                            else ""
                        ),
                        r["cell"]["clients"],
                        f"{r['measurements']['seconds']:.2f}",
                    ]
                    for r in kernels
                ],
            ),
        ]
    else:
        parts.append(missing("python -m benchmarks.scale kernels"))
    return "\n\n".join(parts)

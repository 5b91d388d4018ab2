"""Shared by the benchmark scripts: run a grid of (partition, method, seed) through Flower and print a table."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from server_app.runner import LocalSimulation  # noqa: E402


def run_grid(partitions: dict[str, dict], methods: dict[str, dict], seeds: list[int], base: dict[str, Any],
             clients: int, out: Path, metric_keys: tuple[str, ...] = ("personal-acc", "global-acc")) -> list[dict]:
    """Run every combination once through ``flwr run`` and return one row per run (also written to ``out``)."""
    rows, t0 = [], time.time()
    # keep the run folders: LocalSimulation deletes its own temp dir on exit, and callers read artefacts later
    base = {"results-dir": str(out.parent.resolve() / "runs"), **base}
    total = len(partitions) * len(methods) * len(seeds)
    with LocalSimulation() as sim:
        for part, pcfg in partitions.items():
            for label, mcfg in methods.items():
                for seed in seeds:
                    cfg = {**base, **pcfg, **mcfg, "seed": seed, "min-nodes": clients}
                    s = sim.run(cfg, num_supernodes=clients)
                    rows.append({"partition": part, "method": label, "seed": seed,
                                 **{k: s.get(k) for k in (*metric_keys, "seconds", "results")}})
                    accs = " ".join(f"{k} {s.get(k):.4f}" for k in metric_keys if s.get(k) is not None)
                    print(f"[{len(rows)}/{total}] {part:14s} {label:12s} seed {seed}: {accs} "
                          f"({s['seconds']:.0f} s; {time.time() - t0:.0f} s total)", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1))
    return rows


def fmt(values: list) -> str:
    vals = [v for v in values if v is not None]
    return "—" if not vals else f"{np.mean(vals):.4f} ± {np.std(vals):.4f}"


def print_table(rows: list[dict], partitions: list[str], methods: list[str], keys: tuple[str, ...] = ("personal-acc", "global-acc")) -> None:
    print("| partition | method | " + " | ".join(keys) + " |")
    print("|---|---|" + "---|" * len(keys))
    for part in partitions:
        for method in methods:
            sel = [r for r in rows if r["partition"] == part and r["method"] == method]
            print(f"| {part} | {method} | " + " | ".join(fmt([r.get(k) for r in sel]) for k in keys) + " |")

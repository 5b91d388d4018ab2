"""The tables of ``benchmarks/speed.py`` (grids ``speed-sim``, ``speed-deploy``, ``speed-compose``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.records import load_records

from .settings import header, machine_note
from .text import bullets, md_table, missing, num


def _med(xs: list[float] | None) -> float | None:
    return float(np.median(xs)) if xs else None


def _median(xs: list[float]) -> float:
    """The median of measurements that are there (a ValueError names an empty list)."""
    if not xs:
        raise ValueError("median of no measurements")
    return float(np.median(xs))


#: figures for a single-process research library's rounds were once quoted from outside the repository;
#: no record says which library, version or command produced them, so the report does not make that comparison
NO_LIBRARY_COMPARISON = (
    "No comparison with the median round of a single-process research library is made here: figures for one "
    "on this setting were measured outside pflower, and which library, which version and which command produced "
    "them is recorded nowhere in the repository, so that comparison cannot be reproduced or checked from a raw "
    "record."
)
SIM_TARGET, DEPLOY_TARGET = 1.1, 3.0


def noop_payload(sim: list[dict]) -> str:
    """What the no-op app's messages carried, from its records."""
    kinds = sorted(
        {
            (r["measurements"].get("payload-arrays"), r["measurements"].get("payload-floats"))
            for r in sim
            if r["cell"].get("app") == "noop"
        },
        key=str,
    )
    said = "; ".join(
        f"{a} array{'s' if a != 1 else ''} of {f:,} floats in all" if a and f else "a payload its record does not state"
        for a, f in kinds
    )
    return (
        f"the no-op app's messages carry {said} each way (the arrays of the cnn's state, as pflower's FedAvg "
        "messages do; Flower serialises each array of a record on its own, so the count matters)."
    )


def render_speed(raw: Path, d: dict[str, Any]) -> str:
    intro = (
        "How close a round comes to what Flower's runtime allows: pflower against a no-op Flower app "
        "(`benchmarks/noop_app`, a ClientApp that replies at once) with the same nodes and messages, and on the "
        "deployment runtime against the time a fresh ClientApp process needs to import torch and flwr. "
        "A round sends one message per client: the evaluation of round r rides on round r + 1's "
        "train message, and only the last round has an evaluate phase. Seconds per round are the server's "
        "(rounds.json); a round's compute is the clients' handler time summed over its messages, over the "
        "clients that run at a time."
    )
    parts = [intro]
    sim = load_records("speed-sim", raw)
    parts.append("### Simulation: pflower against a no-op Flower app")
    if sim:
        m0: dict[str, Any] = next((r["measurements"] for r in sim if "run-config" in r["measurements"]), {})
        cfg = m0.get("run-config", {})
        shown = {k: v for k, v in cfg.items() if k not in ("method", "results-dir", "min-nodes")}
        parts.append(
            header(sim, [], d).split("\n")[0]
            + "\n"
            + "Setting: "
            + ", ".join(f"`{k}={v}`" for k, v in shown.items())
            + "; `client-resources-num-cpus=1` (two clients at a time on 2 cores); "
            + noop_payload(sim)
            + "\n"
            + machine_note(sim)
        )
        rows, claims = [], []
        for n in sorted({r["cell"]["clients"] for r in sim}):
            noop = next((r["measurements"] for r in sim if r["cell"] == {"clients": n, "app": "noop"}), None)
            noop_med = _med(noop["round-seconds"]) if noop else None
            if noop:
                rows.append(
                    [
                        n,
                        "no-op Flower app",
                        num(noop_med, 3),
                        num(float(np.mean(noop["round-seconds"])), 3),
                        num(noop["round-seconds"][0], 2),
                        "—",
                        "—",
                        f"{noop['wall-seconds']:.1f}",
                        "—",
                    ]
                )
            for r in sorted(
                (r for r in sim if r["cell"]["clients"] == n and r["cell"]["app"] != "noop"),
                key=lambda r: r["cell"]["app"],
            ):
                m = r["measurements"]
                if "error" in m:
                    rows.append([n, r["cell"]["app"], "failed", "", "", "", "", "", ""])
                    continue
                med, compute = _med(m["round-seconds"]), _med(m["compute-seconds"])
                ratio = None
                if med is not None and compute is not None and noop_med is not None:
                    ratio = med / (noop_med + compute)
                rows.append(
                    [
                        n,
                        r["cell"]["app"],
                        num(med, 3),
                        num(float(np.mean(m["round-seconds"])), 3),
                        num(m["round-seconds"][0], 2),
                        num(compute, 3),
                        num(ratio, 2),
                        f"{m['wall-seconds']:.1f}",
                        num(m.get("personal-acc"), 4),
                    ]
                )
                if ratio is not None:
                    claims.append(
                        f"{n} clients, {r['cell']['app']}: a round is {ratio:.2f}x the no-op round plus its "
                        f"compute ({'within' if ratio <= SIM_TARGET else 'above'} the {SIM_TARGET}x target)"
                    )
        parts.append(
            md_table(
                [
                    "clients",
                    "app",
                    "median s/round",
                    "mean s/round",
                    "round 1 s",
                    "compute s/round",
                    "ratio",
                    "whole run s",
                    "personal acc",
                ],
                rows,
            )
        )
        parts.append(bullets([*claims, NO_LIBRARY_COMPARISON]))
    else:
        parts.append(missing("python -m benchmarks.speed sim"))
    dep = load_records("speed-deploy", raw)
    parts.append("### Loopback deployment: seconds per round and where a message's time goes")
    if dep:
        ref = next((r["measurements"]["seconds"] for r in dep if r["cell"].get("what") == "import-torch-flwr"), None)
        parts.append(
            header(dep, [], d).split("\n")[0] + "\n" + "`python -m deploy.local_cluster --nodes N "
            "--rounds 4` defaults (FedAvg, digits, Dirichlet 0.5, TLS, node authentication, direct topology); "
            "a fresh `flwr-clientapp` process per message. Breakdown: medians over the train messages of "
            "rounds 2 and later (round 1 pays the FAB download); on one machine the client's and server's "
            "clocks agree, so the split is exact.\n" + machine_note(dep)
        )
        comps = ["dispatch", "start-up", "imports", "setup", "work", "return", "total"]
        rows, claims, dispatch = [], [], {}
        for r in sorted(
            (r for r in dep if "nodes" in r["cell"]),
            key=lambda r: (r["cell"]["nodes"], -r["cell"]["task-poll-interval"]),
        ):
            m = r["measurements"]
            if not m.get("round-seconds"):
                rows.append([r["cell"]["nodes"], r["cell"]["task-poll-interval"], "failed"] + [""] * (len(comps) + 1))
                continue
            later = [t.get("train", {}) for t in m["message-timing"][1:]]
            # rounds after the first without an evaluate phase (the last round has one: two messages per node)
            plain = [
                x for x, t in list(zip(m["round-seconds"], m["message-timing"], strict=True))[1:] if "evaluate" not in t
            ]
            med = _median(plain or m["round-seconds"])
            dispatch[(r["cell"]["nodes"], r["cell"]["task-poll-interval"])] = _med(
                [t["dispatch"] for t in later if "dispatch" in t]
            )
            rows.append(
                [r["cell"]["nodes"], f"{r['cell']['task-poll-interval']:g}", num(med, 1), num(m["round-seconds"][0], 1)]
                + [num(_med([t[c] for t in later if c in t]), 2) for c in comps]
            )
            if ref and r["cell"]["nodes"] == 2 and r["cell"]["task-poll-interval"] < 1:
                x = med / _median(ref)
                claims.append(
                    f"2 nodes: a deployed round (median of the rounds after the first without an evaluate "
                    f"phase) takes {med:.1f} s = {x:.1f}x "
                    f'`python -c "import torch, flwr"` ({_median(ref):.2f} s in the same run; target '
                    f"{DEPLOY_TARGET:g}x: {'met' if x <= DEPLOY_TARGET else 'not met'})"
                )
                legs = [_med([t[c] for t in later if c in t]) for c in ("dispatch", "start-up", "return")]
                known = [v for v in legs if v is not None]
                if len(known) == len(legs):
                    flower = sum(known)
                    claims.append(
                        f"2 nodes: Flower's own legs of a message (dispatch + start-up of the fresh "
                        f"`flwr-clientapp` process + return) take {flower:.2f} s = "
                        f"{flower / _median(ref):.1f}x the import time, before any of pflower's imports or "
                        f"work: flwr 1.41 starts a process per message, its SuperNode sleeps a fixed 3 s "
                        f"after an empty pull and polls for a finished reply every 0.5 s (neither is "
                        f"configurable)"
                    )
        fast, slow = dispatch.get((2, 0.1)), dispatch.get((2, 1.0))
        if fast is not None and slow is not None:
            claims.append(
                f"2 nodes: a message's dispatch (push to the ClientApp process's start) takes {fast:.2f} s "
                f"with a 0.1 s task poll against {slow:.2f} s with Flower's default 1 s"
            )
        parts.append(
            md_table(["nodes", "task poll s", "median s/round", "round 1 s"] + [f"{c} s" for c in comps], rows)
        )
        parts.append(bullets(claims))
    else:
        parts.append(missing("python -m benchmarks.speed deploy"))
    comp = load_records("speed-compose", raw)
    parts.append("### The docker-compose demo")
    if comp:
        m = comp[-1]["measurements"]
        parts.append(header(comp, [], d).split("\n")[0] + "\n" + machine_note(comp))
        parts.append(
            md_table(
                ["images", "exit", "start to end of round 1 s", "s per later round", "whole demo s"],
                [
                    [
                        m.get("base-image", "not recorded"),
                        m["exit"],
                        num(m.get("to-first-round-end"), 1),
                        ", ".join(f"{x:.1f}" for x in m.get("round-seconds") or []) or "—",
                        f"{m['wall-seconds']:.0f}",
                    ]
                ],
            )
        )
    else:
        parts.append(missing("python -m benchmarks.speed compose"))
    return "\n\n".join(parts)

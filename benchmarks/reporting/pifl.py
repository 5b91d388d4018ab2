"""The table of ``benchmarks/pifl.py`` (grid ``pifl``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.records import PERSONAL, Rec, axis, error_line, load_records, mean, ok, select

from .pairing import paired, versus, versus_many
from .settings import Paper, header, key, n_clients, n_seeds
from .text import NAMES, bullets, md_table, mean_std, missing, plural, pts

PIFL_PAPER = [
    Paper("clients", "100", n_clients, "pifl §3"),
    Paper("tiers", "2", key("tiers"), "pifl §3"),
    Paper("rounds", "300 (synthetic) / 500 (CIFAR-10)", key("num-server-rounds"), "pifl §3"),
    Paper("lr", "0.01", key("lr"), "pifl §3"),
    Paper("batch size", "128", key("batch-size"), "pifl §3"),
    Paper("local epochs", "not stated (5 in the code)", key("local-epochs"), "pifl §3"),
    Paper(
        "slots per tier (performance / random)",
        "4 / 1",
        lambda recs: key("slots-performance")(recs) + " / " + key("slots-random")(recs),
        "pifl §3 (code)",
    ),
    Paper("server IID set", "2000 (code)", key("server-set-size"), "pifl §3"),
    Paper("seeds", "3", n_seeds, "pifl §3 (spec default)"),
    Paper(
        "data",
        "FedSoft's synthetic set, CIFAR-10, EMNIST",
        key(
            "dataset",
            lambda v: "SynthConcept (spec §4)" if v == "synth-concept" else "digits (8x8)" if v == "digits" else str(v),
        ),
        "pifl §4",
    ),
]
PIFL_METHODS = ["fedavg", "ifca", "fedsoft", "pifl", "pifl-ni"]


def tier_shares(rec: Rec) -> list[float]:
    tiers = (rec.get("artefacts", {}).get("pifl") or {}).get("tiers", {})
    return sorted(t["source-a-share"] for t in tiers.values() if t.get("source-a-share") is not None)


def goal_examples(rec: Rec) -> list[float]:
    cols = rec["clients"]["columns"]
    name = next((c for c in cols if c in ("goal-examples", "test-examples", "eval-examples")), None)
    return [row[cols.index(name)] for row in rec["clients"]["rows"]] if name else []


def render_pifl(raw: Path, d: dict[str, Any]) -> str:
    recs = load_records("pifl", raw)
    intro = (
        "PI-FL against FedAvg, IFCA, FedSoft and PI-FL(NI) (random bids) on two-source data: synthetic concept "
        "shift (spec §4: sources A and B label the same inputs differently) and digits two-source mixtures "
        "(source A = labels 0-4, source B = labels 5-9). Personalized accuracy (`personal-acc`) = each client's "
        "model on its goal data (PI-FL and PI-FL(NI): the one-shot mixture of tier models; IFCA: the chosen "
        "cluster model; FedSoft: the client's centre mixture; FedAvg: the global model), mean ± std over seeds; "
        "Δ vs FedAvg = the same client data, paired by seed. Tier source-A shares = the tier members' mean share "
        "of source A at the last round; the last column is the paper's Tables 1-2: each tier (cluster) model's "
        "accuracy on the source-A and source-B holdouts, tiers ordered by their A accuracy, mean over seeds."
    )
    if not recs:
        return intro + "\n\n" + missing("python -m benchmarks.pifl")
    rows, beats, empty, settings = (
        [],
        [],
        [],
        axis(
            recs,
            "partition",
            ["synth-10:90", "synth-30:70", "digits-10:90", "digits-30:70", "digits-linear", "digits-random"],
        ),
    )
    for part in settings:
        ref = select(recs, partition=part, method="fedavg")
        for m in axis(recs, "method", PIFL_METHODS):
            sel = select(recs, partition=part, method=m)
            if not sel:  # this method did not run on this mixture
                continue
            p = paired(sel, ref, PERSONAL) if m != "fedavg" else None
            if m == "pifl" and p is not None:
                beats.append((part, p, mean(sel, PERSONAL), mean(ref, PERSONAL)))
            shares = [tier_shares(r) for r in ok(sel) if tier_shares(r)]
            if shares and len({len(s) for s in shares}) == 1:
                share = " / ".join(f"{v:.2f}" for v in np.mean(np.array(shares), axis=0))
            elif shares:  # a tier had no members at the last round in some seeds: per seed, empty tiers left out
                share = "per seed: " + "; ".join(" / ".join(f"{v:.2f}" for v in s) for s in shares)
                tiers = [len((r["artefacts"].get("pifl") or {}).get("tiers", {})) for r in ok(sel)]
                empty.append(
                    f"{part}: a {NAMES.get(m, m)} tier had no members at the last round in "
                    f"{sum(len(s) < t for s, t in zip(shares, tiers, strict=True))} of {plural(len(shares), 'seed')}."
                )
            else:
                share = "—"
            tables = [
                sorted(r["artefacts"]["tier-table"], key=lambda t: -t["A"])
                for r in ok(sel)
                if r.get("artefacts", {}).get("tier-table")
            ]
            table = "—"
            if tables and len({len(t) for t in tables}) == 1:
                avg = [{k: np.mean([t[i][k] for t in tables]) for k in ("A", "B")} for i in range(len(tables[0]))]
                table = "; ".join(f"θ{i}: {t['A']:.3f} / {t['B']:.3f}" for i, t in enumerate(avg))
            goal = [g for r in ok(sel) for g in goal_examples(r)]
            rows.append(
                [
                    part,
                    m,
                    mean_std(sel, PERSONAL),
                    "—" if p is None else p.text(),
                    "—" if p is None else p.wins_text(),
                    f"{np.median(goal):g}" if goal else "not recorded",
                    share,
                    table,
                ]
            )
    claims = []
    if beats:
        won = [b for b in beats if b[2] is not None and b[3] is not None and b[2] > b[3]]
        claims.append(
            f"PI-FL's mean beats FedAvg's in {len(won)} of {len(beats)} settings"
            + (f" ({', '.join(b[0] for b in won)})" if won else "")
            + "."
        )
        for part, p, _a, _b in beats:
            if p.ok:
                spread = (
                    f"mean {pts(p.mean)}, std {p.std * 100:.1f} points; "
                    if len(p.deltas) > 1
                    else "one seed, no spread; "
                )
                claims.append(
                    f"{part}: PI-FL minus FedAvg per seed "
                    + " / ".join(f"{x:+.4f}" for x in p.deltas)
                    + f" ({spread}PI-FL better in {p.wins} of {plural(len(p.deltas), 'seed')})."
                )
            else:
                claims.append(f"{part}: {p.text()}.")
    for part in settings:
        ni, pi = select(recs, partition=part, method="pifl-ni"), select(recs, partition=part, method="pifl")
        others = [
            (NAMES[m], select(recs, partition=part, method=m))
            for m in ("ifca", "fedsoft")
            if ok(select(recs, partition=part, method=m))
        ]
        if others and ok(pi):  # PI-FL against the clustered baselines, not only against FedAvg
            claims.append(f"{part}: " + versus_many(others, "PI-FL", pi, PERSONAL) + ".")
        if ok(ni) and ok(pi):
            claims.append(f"{part}: " + versus("PI-FL(NI)", ni, "PI-FL", pi, PERSONAL) + ".")
        for m in axis(recs, "method", PIFL_METHODS):
            sel = select(recs, partition=part, method=m)
            failed = [r for r in sel if r.get("error")]
            if failed:
                claims.append(
                    f"{part}: {NAMES.get(m, m)} failed in {len(failed)} of {plural(len(sel), 'run')}: "
                    f"{error_line(failed[0]['error'])}."
                )
    claims += empty
    if not any(goal_examples(r) for r in ok(recs)):
        claims.append(
            "The size of each client's goal set is not in the records (clients.csv has no per-client "
            "goal-example count), so how many samples a difference rests on cannot be checked here."
        )
    conserved = [r for r in ok(recs) if (r.get("artefacts", {}).get("pifl") or {}).get("totals")]
    if conserved:
        const = sum(len(r["artefacts"]["pifl"]["totals"]) == 1 for r in conserved)
        claims.append(
            f"Token supply constant over all rounds in {const} of {len(conserved)} PI-FL / PI-FL(NI) runs "
            "(conservation is also asserted in every round)."
        )
    return "\n\n".join(
        [
            intro,
            header(recs, PIFL_PAPER, d),
            md_table(
                [
                    "data / mixture",
                    "method",
                    "personalized acc",
                    "Δ vs FedAvg, paired (mean ± std)",
                    "wins vs FedAvg",
                    "goal samples per client (median)",
                    "tier source-A shares (last round)",
                    "tier accuracy on A / B holdouts",
                ],
                rows,
            ),
            bullets(claims),
        ]
    )

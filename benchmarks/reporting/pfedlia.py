"""The tables of ``benchmarks/pfedlia.py`` (grids ``pfedlia``: planted clusters; ``pfedlia-dialects``: next-word
prediction)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.records import (
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

from .pairing import paired, versus
from .settings import Paper, fixed, header, key, n_clients, n_seeds, percent, trained_model
from .text import NAMES, bullets, md_table, mean_std, missing, span, value_range

PFEDLIA_PAPER = [
    Paper("clients", "100", n_clients, "pfedlia §3"),
    Paper("participation per round", "10 %", key("fraction-train", percent), "pfedlia §3"),
    Paper("warm-up rounds", "20", key("warmup-rounds"), "pfedlia §3"),
    Paper("lazy epochs", "20", key("lazy-epochs"), "pfedlia §3"),
    Paper("OPTICS min_samples", "5", key("optics-min-samples"), "pfedlia §3"),
    Paper(
        "train / validation split",
        "3:1 (no test split named)",
        lambda recs: (
            key("val-fraction", lambda v: f"validation {percent(v)}")(recs)
            + ", "
            + key("test-fraction", lambda v: f"test {percent(v)}")(recs)
        ),
        "pfedlia §3, §4",
    ),
    Paper("seeds", "4", n_seeds, "pfedlia §3"),
    Paper("model", "ResNet18 / GPT-2, pretrained", trained_model, "pfedlia §3, §4"),
    Paper(
        "data",
        "FashionMNIST / CIFAR-10 / CIFAR-100; OSCAR Nordic text",
        key("dataset", lambda v: "digits (8x8)" if v == "digits" else "synthetic dialects" if v == "dialects" else v),
        "pfedlia §4",
    ),
    Paper("rounds", "not given (100 inferred from FL-Bench)", key("num-server-rounds"), "pfedlia §3"),
    Paper("local epochs", "not given (5 inferred)", key("local-epochs"), "pfedlia §3"),
    Paper("batch size", "not given (32 inferred)", key("batch-size"), "pfedlia §3"),
]
DIALECTS_PAPER = [
    Paper(
        "model",
        "GPT-2 small (124M), pretrained",
        key("model", lambda v: f"{v} (a GPT-2 config, randomly initialised)"),
        "pfedlia §3, §4",
    ),
    Paper("data", "OSCAR text in Norwegian, Swedish, Danish", fixed("three synthetic dialects"), "pfedlia §4"),
    Paper("warm-up rounds", "20", key("warmup-rounds"), "pfedlia §3"),
    Paper("lazy epochs", "20", key("lazy-epochs"), "pfedlia §3"),
    Paper("participation per round", "10 %", key("fraction-train", percent), "pfedlia §3"),
    Paper("seeds", "4", n_seeds, "pfedlia §3"),
]
PFEDLIA_METHODS = ["local", "fedavg", "cfl", "cfl-tuned", "oracle", "pfedlia-central", "pfedlia-p2p"]


def ari(rec: Rec) -> tuple[float | None, bool]:
    """(ARI of the clustering against the planted groups, whether over every client).  The server learns a
    client's planted group from its training replies, so with sampling some may be unknown at the clustering
    round: the ARI is then computed here over the clients known at the end of the run."""
    art = rec.get("artefacts", {}).get("pfedlia")
    if not art:
        return None, True
    if art["clustering"].get("ari") is not None:
        return float(art["clustering"]["ari"]), True
    known = [c for c in art["assignment"] if c in art["planted"]]
    if len(known) < 2:
        return None, False
    from sklearn.metrics import adjusted_rand_score

    value = adjusted_rand_score([art["planted"][c] for c in known], [art["assignment"][c] for c in known])
    return float(value), len(known) == len(art["assignment"])


def clusters_found(rec: Rec) -> int | None:
    art = rec.get("artefacts", {})
    if "pfedlia" in art:
        return art["pfedlia"]["clustering"].get("clusters")
    if "cfl" in art:
        return art["cfl"]["clusters"]
    return None


def clustering_round(rec: Rec) -> int | None:
    return rec.get("artefacts", {}).get("pfedlia", {}).get("clustering", {}).get("round")


def normal_rounds(rec: Rec) -> list[dict]:
    """Rounds other than round 1 (which pays for process start-up) and the clustering round."""
    return [r for r in rec["rounds"] if r["round"] not in (1, clustering_round(rec)) and r.get("train-clients")]


def normal_round_mb(rec: Rec) -> float | None:
    rounds = normal_rounds(rec)
    return (
        float(np.median([r.get("train-bytes-down", 0) / r["train-clients"] for r in rounds])) / 1e6 if rounds else None
    )


def normal_round_seconds(rec: Rec) -> float | None:
    rounds = [r for r in normal_rounds(rec) if r.get("seconds") is not None]
    return float(np.median([r["seconds"] for r in rounds])) if rounds else None


def clu(name: str) -> Callable[[Rec], Any]:
    return lambda r: r.get("artefacts", {}).get("pfedlia", {}).get("clustering", {}).get(name)


def _pfedlia_rows(recs: list[Rec], key_metric: str) -> tuple[list[list[Any]], list[str]]:
    rows, notes = [], []
    for part_ in axis(recs, "participation", ["full", "10%"]):
        for part in axis(recs, "partition", ["pathological", "noisy", "dialects"]):
            for m in axis(recs, "method", PFEDLIA_METHODS):
                sel = select(recs, participation=part_, partition=part, method=m)
                if not sel:
                    continue
                aris = [ari(r) for r in ok(sel)]
                a = [v for v, _ in aris if v is not None]
                partial = any(not full for v, full in aris if v is not None)
                ari_text = (
                    "—"
                    if not a
                    else (f"{np.mean(a):.4f} ± {np.std(a):.4f}" if len(a) > 1 else f"{a[0]:.4f}")
                    + (" *" if partial else "")
                )
                cost = "—"
                down, secs = mean(sel, clu("bytes-down-per-client")), mean(sel, clu("seconds"))
                if m != "oracle" and down is not None and secs is not None:
                    cost = f"{down / 1e6:.2f} MB, {secs:.1f} s"
                normal = "—"
                normal_mb, normal_secs = mean(sel, normal_round_mb), mean(sel, normal_round_seconds)
                if values(sel, clustering_round) and normal_mb is not None and normal_secs is not None:
                    normal = f"{normal_mb:.2f} MB, {normal_secs:.1f} s"
                metric = [mean_std(sel, PERSONAL)]
                if key_metric == "perplexity":
                    metric.append(mean_std(sel, summary("personal-perplexity"), 2))
                rows.append(
                    [
                        part_,
                        part,
                        NAMES.get(m, m),
                        *metric,
                        ari_text,
                        value_range([clusters_found(r) for r in ok(sel)]),
                        cost,
                        normal,
                    ]
                )
                if partial:
                    notes.append(part_)
    return rows, notes


def _pfedlia_claims(recs: list[Rec]) -> list[str]:
    out = []
    for part_ in axis(recs, "participation", ["full", "10%"]):
        for part in axis(recs, "partition", ["pathological", "noisy", "dialects"]):
            row = select(recs, participation=part_, partition=part)

            def sel(m: str, row: list[Rec] = row) -> list[Rec]:
                return select(row, method=m)

            row_seeds = seeds_of(row)
            where = f"{part}, {part_} participation" + (f" (seed {row_seeds[0]} only)" if len(row_seeds) == 1 else "")
            lines = []
            for m in ("pfedlia-central", "pfedlia-p2p"):
                aris = [v for v, _ in map(ari, ok(sel(m))) if v is not None]
                if aris:
                    lines.append(
                        f"{NAMES[m]} ARI per seed "
                        + " / ".join(f"{v:.2f}" for v in aris)
                        + f" (>= 0.9 in {sum(v >= 0.9 for v in aris)} of {len(aris)})"
                    )
            main = next((m for m in ("pfedlia-central", "pfedlia-p2p") if ok(sel(m))), None)
            if main:
                lines.extend(
                    versus(NAMES[main], sel(main), NAMES[ref], sel(ref), PERSONAL)
                    for ref in ("oracle", "fedavg", "local", "cfl-tuned")
                    if ok(sel(ref))
                )
            cfl = ok(sel("cfl"))
            if cfl:
                found = [clusters_found(r) for r in cfl]
                same = paired(sel("cfl"), sel("fedavg"), PERSONAL)
                if all(f == 1 for f in found):
                    lines.append(
                        "CFL with Sattler's thresholds never splits (1 cluster in every seed)"
                        + (
                            ", so it is FedAvg exactly (same accuracy in every seed)"
                            if same.ok and all(abs(d) <= TIE for d in same.deltas)
                            else ""
                        )
                    )
                else:
                    lines.append(f"CFL with Sattler's thresholds finds {value_range(found)} clusters")
            failed = [r for m in PFEDLIA_METHODS for r in sel(m) if r.get("error")]
            for m in sorted({r["cell"]["method"] for r in failed}):
                fails = [r for r in failed if r["cell"]["method"] == m]
                lines.append(
                    f"{NAMES.get(m, m)} failed in {len(fails)} of {len(sel(m))} runs: {error_line(fails[0]['error'])}"
                )
            if main:
                ratio = [r for r in ok(sel(main)) if normal_round_mb(r) and clu("bytes-down-per-client")(r)]
                if ratio:
                    down = [clu("bytes-down-per-client")(r) / 1e6 / normal_round_mb(r) for r in ratio]
                    secs = [clu("seconds")(r) / normal_round_seconds(r) for r in ratio if normal_round_seconds(r)]
                    lines.append(
                        f"the clustering round downloads {np.mean(down):.0f}x a normal round's bytes per client"
                        + (f" and takes {span(secs, 1, 'x')} its seconds" if secs else "")
                    )
            if lines:
                out.append(f"{where}: " + "; ".join(lines) + ".")
    return out


def render_pfedlia(raw: Path, d: dict[str, Any]) -> str:
    recs = load_records("pfedlia", raw)
    intro = (
        "pFedLIA central (OPTICS on the server) and peer-to-peer against Local, FedAvg, CFL and the Oracle (the "
        "planted groups) on planted clusters of digits (spec pfedlia §8). Planted groups: 5 clusters x 2 labels "
        '("pathological"); "noisy" adds, for about half of the clients, one shard of a label from another '
        'cluster (spec §6). Two participation settings: every client trains in every round ("full"), and 10 % '
        'of the clients drawn per round as in the paper ("10%"; the clustering round still asks every client). '
        "Personalized accuracy = each client's assigned model on its own test split at the last round, mean ± "
        "std over seeds. ARI = adjusted Rand index of the clustering against the planted groups. Costs are "
        "per client, seconds measured on a shared machine; a normal round is the median of the rounds other "
        "than round 1 and the clustering round."
    )
    if not recs:
        return intro + "\n\n" + missing("python -m benchmarks.pfedlia --grid planted")
    rows, notes = _pfedlia_rows(recs, "acc")
    table = md_table(
        [
            "participation",
            "partition",
            "method",
            "personalized acc",
            "ARI",
            "clusters found",
            "clustering round: MB down, s (shared machine)",
            "normal round: MB down, s (shared machine)",
        ],
        rows,
    )
    foot = (
        (
            "\n\n\\* ARI over the clients whose planted group the server knows at the end of the run: it learns a "
            "client's group from its training replies, and with client sampling some clients had not trained by the "
            "clustering round."
        )
        if notes
        else ""
    )
    return "\n\n".join([intro, header(recs, PFEDLIA_PAPER, d), table + foot, bullets(_pfedlia_claims(recs))])


def render_dialects(raw: Path, d: dict[str, Any]) -> str:
    recs = load_records("pfedlia-dialects", raw)
    intro = (
        "Next-word prediction on three synthetic dialects (client i speaks dialect i mod 3; the dialects share "
        "most of their vocabulary), a causal LM from a transformers GPT-2 config (randomly initialised), a "
        "word-level tokenizer built offline. Per-token accuracy and perplexity (lower is better) on each "
        "client's test lines at the last round."
    )
    if not recs:
        return intro + "\n\n" + missing("python -m benchmarks.pfedlia --grid dialects")
    rows, _ = _pfedlia_rows(recs, "perplexity")
    table = md_table(
        [
            "participation",
            "partition",
            "method",
            "next-word accuracy",
            "perplexity",
            "ARI",
            "clusters found",
            "clustering round: MB down, s (shared machine)",
            "normal round: MB down, s (shared machine)",
        ],
        rows,
    )
    claims = []
    ppl = summary("personal-perplexity")
    for m in ("pfedlia-p2p", "pfedlia-central"):
        sel = select(recs, method=m)
        if ok(sel):
            aris = [v for v, _ in map(ari, ok(sel)) if v is not None]
            if aris:
                claims.append(f"{NAMES[m]} ARI per seed " + " / ".join(f"{v:.2f}" for v in aris))
            for ref in ("fedavg", "oracle", "local"):
                if ok(select(recs, method=ref)):
                    a, b = mean(sel, ppl), mean(select(recs, method=ref), ppl)
                    if a is None or b is None:
                        continue
                    claims.append(
                        f"perplexity {NAMES[m]} {a:.2f} vs {NAMES[ref]} {b:.2f} ({'lower' if a < b else 'not lower'})"
                    )
    return "\n\n".join([intro, header(recs, DIALECTS_PAPER, d), table, bullets(claims)])

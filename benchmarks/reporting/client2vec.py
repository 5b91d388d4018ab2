"""The tables of ``benchmarks/client2vec.py`` (grid ``client2vec``)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.records import Rec, axis, load_records, mean, select, values

from .pairing import paired
from .settings import Paper, fixed, header, key, n_clients, n_seeds, percent, trained_model
from .text import bullets, md_table, mean_std, missing, num, pts, value_range

C2V_PAPER = [
    Paper("clients", "100 (CIFAR-10) / 60 (DomainNet)", n_clients, "client2vec §4"),
    Paper("participation", "10 %", key("fraction-train", percent), "client2vec §3"),
    Paper("rounds", "100", key("num-server-rounds"), "client2vec §3"),
    Paper("local epochs", "5", key("local-epochs"), "client2vec §3"),
    Paper("lr", "0.01", key("lr"), "client2vec §3"),
    Paper("weight decay", "5e-05", key("weight-decay"), "client2vec §3"),
    Paper("CLIP encoder", "ViT-B-32, openai weights", key("c2v-encoder"), "client2vec §3"),
    Paper("DSA-IGN epochs", "500", key("c2v-ign-epochs"), "client2vec §3"),
    Paper("DSA-IGN FF width", "2048", key("c2v-ign-ff"), "client2vec §3"),
    Paper("tau (sampling, Global mode)", "1.0", key("c2v-tau"), "client2vec §3"),
    Paper("gamma (aggregation)", "0.5", key("c2v-gamma"), "client2vec §3"),
    Paper("w (local loss, Global mode)", "5.0", key("c2v-local-weight"), "client2vec §3"),
    Paper("seeds", "3", n_seeds, "client2vec §3"),
    Paper(
        "data",
        "CIFAR-10 (Dirichlet 0.1), DomainNet (6 domains), Shakespeare",
        fixed("digits (8x8), feature-shift domains x Dirichlet label skew"),
        "client2vec §4",
    ),
    Paper("model", "ResNet18 / MobileNetV2", trained_model, "client2vec §4"),
]
C2V_ARMS = ["FedAvg", "+i", "+ii", "+iii", "+i+ii+iii", "FedAvg-cnn", "FedBN-cnn"]
#: the arm each arm is paired with (FedBN runs on the cnn: its reference is FedAvg on the cnn); others: FedAvg
C2V_REFERENCE = {"FedAvg-cnn": "FedAvg-cnn", "FedBN-cnn": "FedAvg-cnn"}
C2V_BLOCK_GAP_TARGET = 0.5  # spec client2vec §8: acceptance threshold of the index's domain block gap


def c2v_accs(rec: Rec) -> list[float]:
    """The global model's accuracy per round; for a method without one (FedBN), the personalized models'."""
    key = "global-acc" if any(r.get("global-acc") is not None for r in rec["rounds"]) else "personal-acc"
    return [r[key] for r in rec["rounds"] if r.get(key) is not None]


def c2v_best(rec: Rec) -> float | None:
    return max(c2v_accs(rec)) if c2v_accs(rec) else None


def c2v_last(rec: Rec) -> float | None:
    return c2v_accs(rec)[-1] if c2v_accs(rec) else None


def c2v_round_seconds(rec: Rec) -> float | None:
    secs = [r["seconds"] for r in rec["rounds"][1:] if r.get("seconds")]
    return float(np.median(secs)) if secs else None


def c2v_art(name: str) -> Callable[[Rec], Any]:
    def get(rec: Rec) -> Any:
        art = rec.get("artefacts", {}).get("client2vec") or {}
        return (art.get("index-quality") or {}).get(name) if name == "beta-f-block-gap" else art.get(name)

    return get


def render_client2vec(raw: Path, d: dict[str, Any]) -> str:
    recs = load_records("client2vec", raw)
    intro = (
        "FedAvg with and without each Client2Vec case study ((i) index-aware sampling, (ii) aggregation weights, "
        "(iii) the local loss) and all three, on digits with feature-shift domains crossed with Dirichlet label "
        "skew. Accuracy: the global model on each client's own test split, unweighted mean, best and last round. "
        "Paired: arm minus FedAvg on the same seed; printed only when the two runs share their data, and, for "
        "arms without (i), drew the same clients in every round. β_f gap: mean cosine of the index's feature "
        "half within a domain minus across domains."
    )
    if not recs:
        return intro + "\n\n" + missing("python -m benchmarks.client2vec")
    if any(select(recs, arm=a) for a in set(C2V_REFERENCE.values()) | set(C2V_REFERENCE)):
        intro += (
            " FedBN (local normalisation layers) needs a model with normalisation layers, which the MLP lacks: "
            "FedBN-cnn and its reference FedAvg-cnn (plain FedAvg, no index) run the `cnn` instead, FedBN-cnn is "
            "paired with FedAvg-cnn, and FedBN's accuracy is its personalized models' (it has no global model)."
        )
    parts = [intro, header(recs, C2V_PAPER, d)]
    for setting in axis(recs, "setting", ["4dom-a0.1", "4dom-a100", "1dom-a0.1"]):
        sel = select(recs, setting=setting)
        rows, claims = [], []
        for arm in axis(sel, "arm", C2V_ARMS):
            a = select(sel, arm=arm)
            ref_arm = C2V_REFERENCE.get(arm, "FedAvg")
            ref = select(sel, arm=ref_arm)
            draws = not any(r["run-config"].get("c2v-sampling") for r in a)
            p = paired(a, ref, c2v_best, draws=draws) if arm != ref_arm and ref else None
            gaps = values(a, c2v_art("beta-f-block-gap"))
            rows.append(
                [
                    setting,
                    arm,
                    mean_std(a, c2v_best),
                    mean_std(a, c2v_last),
                    "—" if p is None else p.text(),
                    "—" if p is None else p.wins_text(),
                    num(mean(a, c2v_art("index-seconds")), 1),
                    num(mean(a, c2v_round_seconds), 2),
                    num(float(np.mean(gaps)) if gaps else None, 2),
                ]
            )
            if p is not None:
                claims.append(
                    f"{arm}: "
                    + (
                        "paired Δ (best round) per seed "
                        + " / ".join(f"{x:+.4f}" for x in p.deltas)
                        + f"; better than {ref_arm} in {p.wins} of {len(p.deltas)} seeds"
                        if p.ok
                        else p.text()
                    )
                    + "."
                )
                a_mean, ref_mean = mean(a, c2v_best), mean(ref, c2v_best)
                if not p.ok and a_mean is not None and ref_mean is not None:  # the means, without a pairing claim
                    claims[-1] = claims[-1][:-1] + (
                        f"; unpaired, its mean best-round accuracy is {pts(a_mean - ref_mean)} "
                        f"against {ref_arm}'s ({a_mean:.3f} vs {ref_mean:.3f})."
                    )
        gaps = values(sel, c2v_art("beta-f-block-gap"))
        if gaps:
            claims.append(
                f"Index block gap: {value_range([round(g, 2) for g in gaps])} over the index arms' runs (the spec's "
                f"acceptance threshold is {C2V_BLOCK_GAP_TARGET}; "
                f"{'met' if min(gaps) >= C2V_BLOCK_GAP_TARGET else 'not met'} in every run)."
            )
        parts += [
            md_table(
                [
                    "setting",
                    "arm",
                    "best-round acc",
                    "last-round acc",
                    "paired Δ best (mean ± std)",
                    "wins",
                    "index phase s (shared machine)",
                    "s / round (shared machine)",
                    "β_f gap",
                ],
                rows,
            ),
            bullets(claims),
        ]
    return "\n\n".join(parts)

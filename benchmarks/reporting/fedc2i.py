"""The table of ``benchmarks/fedc2i.py`` (grid ``fedc2i``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from benchmarks.records import GLOBAL, PERSONAL, axis, load_records, mean, ok, select, summary

from .pairing import paired, versus
from .settings import Paper, fixed, header, key, n_clients, n_seeds, percent, trained_model
from .text import NAMES, bullets, md_table, mean_std, missing

FEDC2I_PAPER = [
    Paper("clients", "5", n_clients, "fedc2i §3"),
    Paper("optimizer", "adam", key("optimizer"), "fedc2i §3"),
    Paper("lr", "0.001", key("lr"), "fedc2i §3"),
    Paper("local epochs", "2", key("local-epochs"), "fedc2i §3"),
    Paper("batch size", "32", key("batch-size"), "fedc2i §3"),
    Paper("rounds", "20", key("num-server-rounds"), "fedc2i §3"),
    Paper("participation", "100 %", key("fraction-train", percent), "fedc2i §3"),
    Paper("seeds", "3", n_seeds, "fedc2i §3"),
    Paper(
        "data",
        "Digit-5 (MNIST, SVHN, USPS, SynthDigits, MNIST-M), 1,000 training images per client",
        fixed("digits (8x8), 5 hand-made feature-shift domains, about 250 training images per client"),
        "fedc2i §4.1",
    ),
    Paper("model", 'CIFAR-style CNN 64-64-384-192 ("LeNet")', trained_model, "fedc2i §4.2"),
]
FEDC2I_METHODS = [
    "local",
    "fedavg",
    "fedprox",
    "fedrep",
    "fedrod",
    "fedc2i",
    "lambda-only",
    "Lambda-only",
    "fedavg-cnn",
    "fedbn",
]
#: rows on another model than the grid's c2i-small (FedBN needs normalisation layers): compared with each other only
FEDC2I_CNN_ROWS = ("fedavg-cnn", "fedbn")


def render_fedc2i(raw: Path, d: dict[str, Any]) -> str:
    recs = load_records("fedc2i", raw)
    intro = (
        "FedC2I and its ablations against the baselines on feature-shift digits: IID labels, 5 clients, each with "
        "its own domain (original, inverted, rotated, noisy, shifted). `personal-acc` is each client's own model "
        "on its own test split; for FedAvg, FedProx and FedRoD `trained-acc` is the model right after local "
        "training (the protocol FedC2I is evaluated with). lambda-only: client-level influence only; "
        "Lambda-only: class-level matrix with a plain-average extractor."
    )
    if not recs:
        return intro + "\n\n" + missing("python -m benchmarks.fedc2i")
    if any(select(recs, method=m) for m in FEDC2I_CNN_ROWS):
        intro += (
            " FedBN keeps the normalisation layers on the clients and c2i-small has none: fedbn and its reference "
            "fedavg-cnn (FedAvg) run the `cnn` (BatchNorm after each convolution) instead, so FedBN is compared "
            "with fedavg-cnn only."
        )
    rows = [
        [
            m,
            mean_std(select(recs, method=m), PERSONAL),
            mean_std(select(recs, method=m), summary("trained-acc")),
            mean_std(select(recs, method=m), GLOBAL),
        ]
        for m in axis(recs, "method", FEDC2I_METHODS)
    ]
    fed = [
        m
        for m in axis(recs, "method", FEDC2I_METHODS)
        if m != "local" and m not in FEDC2I_CNN_ROWS and ok(select(recs, method=m))
    ]
    fed_means = {m: score for m in fed if (score := mean(select(recs, method=m), PERSONAL)) is not None}
    best = max(fed_means, key=fed_means.__getitem__, default=None)
    claims = []
    if best:
        claims.append(f"Best federated method by personal-acc: {best}.")
        if ok(select(recs, method="local")):  # the federated methods' best against training alone
            claims.append(
                "Best federated method against Local: "
                + versus(best, select(recs, method=best), "Local", select(recs, method="local"), PERSONAL)
                + "."
            )
    full = select(recs, method="fedc2i")
    claims.extend(
        versus("FedC2I", full, NAMES[ref], select(recs, method=ref), PERSONAL) + "."
        for ref in ("local", "fedrep", "fedavg")
        if ok(full) and ok(select(recs, method=ref))
    )
    if ok(full) and ok(select(recs, method="fedavg")):
        claims.append(
            versus(
                "FedC2I",
                full,
                "FedAvg after local training",
                select(recs, method="fedavg"),
                PERSONAL,
                summary("trained-acc"),
            )
            + "."
        )
    fedbn, fedavg_cnn = select(recs, method="fedbn"), select(recs, method="fedavg-cnn")
    if ok(fedbn) and ok(fedavg_cnn):
        claims.append(versus("FedBN", fedbn, "FedAvg on the same cnn", fedavg_cnn, PERSONAL) + ".")
        claims.append(
            versus(
                "FedBN",
                fedbn,
                "FedAvg on the same cnn after local training",
                fedavg_cnn,
                PERSONAL,
                summary("trained-acc"),
            )
            + "."
        )
    for v in ("lambda-only", "Lambda-only"):
        if ok(select(recs, method=v)) and ok(full):
            p = paired(select(recs, method=v), full, PERSONAL)
            claims.append(
                f"{v} minus full FedC2I, paired by seed: {p.text()}"
                + (f", higher in {p.wins} of {len(p.deltas)} seeds" if p.ok else "")
                + "."
            )
    return "\n\n".join(
        [
            intro,
            header(recs, FEDC2I_PAPER, d),
            md_table(["method", "personal-acc", "trained-acc (after local training)", "global-model acc"], rows),
            bullets(claims),
        ]
    )

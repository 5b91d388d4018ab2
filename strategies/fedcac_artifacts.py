"""FedCAC's artefacts (docs/methods/fedcac.md, "Artefacts"): the per-round threshold, overlap and collaborators
(``fedcac_rounds.json``), the mask's cost against the model's (``fedcac_communication.json``) and the kept overlap
matrices (``fedcac_overlap.json`` / ``.png``, ``fedcac_collaborators.png``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from strategies.fedcac import FedCACStrategy
from strategies.plots import integer_ticks, pyplot, save


def write_artifacts(strategy: FedCACStrategy, folder: Path) -> None:
    plt = pyplot()
    per_round = [
        {"round": r.server_round, **r.extra.get("fedcac", {})}
        for r in strategy.history
        if isinstance(r.extra.get("fedcac"), dict)
    ]
    (folder / "fedcac_rounds.json").write_text(json.dumps(per_round, indent=1))
    n_params = sum(int(np.prod(s)) for s in strategy.param_shapes.values())
    (folder / "fedcac_communication.json").write_text(
        json.dumps(
            {
                "parameters": n_params,
                "float32-model-bytes": 4 * n_params,
                "packed-mask-bytes": strategy.max_mask_bytes or None,
                "mask-to-model-ratio": (strategy.max_mask_bytes / (4 * n_params)) if strategy.max_mask_bytes else None,
            },
            indent=1,
        )
    )
    if not strategy.overlaps:
        return
    chosen = sorted(strategy.overlaps)
    (folder / "fedcac_overlap.json").write_text(json.dumps({r: strategy.overlaps[r] for r in chosen}))
    fig, axes = plt.subplots(1, len(chosen), figsize=(4.2 * len(chosen), 3.8), squeeze=False)
    for ax, r in zip(axes[0], chosen, strict=True):
        entry = strategy.overlaps[r]
        order = np.argsort(entry["partition-ids"])
        mat = np.array(entry["overlap"])[np.ix_(order, order)]
        im = ax.imshow(mat, vmin=0, vmax=1, cmap="viridis")
        ax.set_title(f"mask overlap, round {r}")
        ax.set_xlabel("client")
        integer_ticks(ax, y=True)
        ax.set_ylabel("client")
        fig.colorbar(im, ax=ax, fraction=0.046)
    save(plt, fig, folder / "fedcac_overlap.png")
    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = [d["round"] for d in per_round]
    ax.plot(xs, [d["collaborators-mean"] for d in per_round], marker="o", label="mean |C_i|")
    ax2 = ax.twinx()
    ax2.plot(xs, [d["threshold"] for d in per_round], color="tab:red", ls="--", label="threshold")
    ax2.plot(xs, [d["overlap-mean"] for d in per_round], color="tab:gray", ls=":", label="mean overlap")
    ax.axvline(strategy.beta, color="k", lw=0.8)
    ax.set_xlabel("round")
    integer_ticks(ax)
    ax.set_ylabel("collaborators per client")
    ax2.set_ylabel("overlap")
    fig.legend(loc="upper right", fontsize=8)
    save(plt, fig, folder / "fedcac_collaborators.png")

"""FedC2I's artefacts (docs/methods/fedc2i.md, "Artefacts"): every round's influence vectors
(``fedc2i_influence.json``) and three of them as heatmaps (``fedc2i_influence.png``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from strategies.fedc2i import FedC2IStrategy
from strategies.plots import integer_ticks, pyplot, save


def write_artifacts(strategy: FedC2IStrategy, folder: Path) -> None:
    plt = pyplot()
    (folder / "fedc2i_influence.json").write_text(
        json.dumps(
            {
                str(r): {str(p): {str(q): w for q, w in row.items()} for p, row in rows.items()}
                for r, rows in strategy.influence.items()
            },
            indent=1,
        )
    )
    rounds = [r for r in sorted(strategy.influence) if strategy.influence[r]]
    if not rounds:
        return
    chosen = sorted({rounds[0], rounds[len(rounds) // 2], rounds[-1]})
    clients = sorted({p for r in rounds for p in strategy.influence[r]})
    fig, axes = plt.subplots(1, len(chosen), figsize=(4.2 * len(chosen), 3.8), squeeze=False)
    for ax, r in zip(axes[0], chosen, strict=True):
        mat = np.full((len(clients), len(clients)), np.nan)
        for i, p in enumerate(clients):
            for j, q in enumerate(clients):
                mat[i, j] = strategy.influence[r].get(p, {}).get(q, np.nan)
        im = ax.imshow(mat, vmin=0, vmax=1, cmap="magma")
        ax.set_title(f"influence vector, round {r}")
        ax.set_xlabel("peer client i")
        integer_ticks(ax, y=True)
        ax.set_ylabel("client m")
        if len(clients) <= 20:
            ax.set_xticks(range(len(clients)), clients)
            ax.set_yticks(range(len(clients)), clients)
        fig.colorbar(im, ax=ax, fraction=0.046)
    save(plt, fig, folder / "fedc2i_influence.png")

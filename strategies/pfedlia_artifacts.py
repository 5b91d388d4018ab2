"""pFedLIA's and the Oracle's artefacts (docs/methods/pfedlia.md, "Artefacts"): the clustering
(``pfedlia_clusters.json``) and the lazy-influence matrix (``pfedlia_influence.json``, a heatmap ordered by cluster
in ``pfedlia_influence.png``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from strategies.pfedlia import PFedLIAStrategy
from strategies.plots import integer_ticks, pyplot, save


def write_artifacts(strategy: PFedLIAStrategy, folder: Path) -> None:
    plt = pyplot()
    out = {
        "clustering": strategy.clustering,
        "assignment": {str(c): int(label) for c, label in sorted(strategy.assignment.items())},
        "planted": {str(c): p for c, p in sorted(strategy.planted.items())},
    }
    if strategy.sets:
        out["beneficial-sets"] = {str(c): list(s) for c, s in sorted(strategy.sets.items())}
    (folder / "pfedlia_clusters.json").write_text(json.dumps(out, indent=1))
    if strategy.matrix is None or strategy.matrix.size == 0:
        return
    (folder / "pfedlia_influence.json").write_text(
        json.dumps(
            {
                "rows (scoring client)": list(strategy.matrix_clients),
                "columns (lazy model of client)": list(strategy.lazy_clients),
                "matrix": strategy.matrix.tolist(),
            }
        )
    )
    order = sorted(
        range(len(strategy.matrix_clients)),
        key=lambda i: (strategy.assignment.get(strategy.matrix_clients[i], -1), strategy.matrix_clients[i]),
    )
    cols = [strategy.lazy_clients.index(strategy.matrix_clients[i]) for i in order]
    mat = strategy.matrix[np.ix_(order, cols)]
    lim = np.abs(mat).max() or 1.0
    fig, ax = plt.subplots(figsize=(6, 5))
    im = ax.imshow(mat, cmap="RdBu", vmin=-lim, vmax=lim)
    labels = [strategy.assignment.get(strategy.matrix_clients[i], -1) for i in order]
    for k in range(1, len(labels)):
        if labels[k] != labels[k - 1]:
            ax.axhline(k - 0.5, color="k", lw=0.6)
            ax.axvline(k - 0.5, color="k", lw=0.6)
    ax.set_title(
        f"lazy influence (rows: scoring client), ordered by cluster; ARI {strategy.clustering.get('ari', 'n/a')}"
    )
    ax.set_xlabel("lazy model of client")
    integer_ticks(ax, y=True)
    ax.set_ylabel("client")
    fig.colorbar(im, ax=ax, fraction=0.046)
    save(plt, fig, folder / "pfedlia_influence.png")

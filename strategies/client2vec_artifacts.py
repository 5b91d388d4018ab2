"""Client2Vec's artefacts (docs/methods/client2vec.md, "Artefacts"): the client index (``client2vec_index.npz``),
the run's index, sampling and aggregation record (``client2vec.json``) and the pairwise index similarity
(``client2vec_similarity.png``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from strategies.client2vec import Client2VecStrategy
from strategies.plots import integer_ticks, pyplot, save


def write_artifacts(strategy: Client2VecStrategy, folder: Path) -> None:
    if strategy.c2v is None:
        return
    order = sorted(
        range(strategy.c2v.size),
        key=lambda r: (strategy.domain_of(strategy.index_clients[r]), strategy.index_clients[r]),
    )
    pids = [strategy.index_clients[r] for r in order]
    np.savez(
        folder / "client2vec_index.npz",
        partition_id=np.array(pids),
        domain=np.array([strategy.domain_of(p) for p in pids]),
        beta_f=strategy.c2v.beta_f[order],
        beta_l=strategy.c2v.beta_l[order],
        num_examples=strategy.c2v.n[order],
    )
    best = max((r.evaluate.get("global-acc", -1.0) for r in strategy.history), default=-1.0)
    (folder / "client2vec.json").write_text(
        json.dumps(
            {
                "options": {k: (v if not hasattr(v, "__dict__") else vars(v)) for k, v in vars(strategy.opts).items()},
                "index-seconds": strategy.index_seconds,
                "index-quality": strategy.index_quality(),
                "best-global-acc": best if best >= 0 else None,
                "dsa-ign-losses": strategy.ign_history,
                "cohorts": strategy.cohorts,
                "aggregation-weights": strategy.agg_weights,
            },
            indent=1,
            default=str,
        )
    )
    plt = pyplot()
    doms = [strategy.domain_of(p) for p in pids]
    fig, axes = plt.subplots(1, 2, figsize=(11, 5))
    for ax, sim, title in (
        (axes[0], strategy.c2v.sim_f, "feature half cos(beta_f)"),
        (axes[1], strategy.c2v.sim_l, "label half cos(beta_l)"),
    ):
        im = ax.imshow(sim[np.ix_(order, order)], cmap="RdBu_r", vmin=-1, vmax=1)
        for k in range(1, len(doms)):
            if doms[k] != doms[k - 1]:
                ax.axhline(k - 0.5, color="k", lw=0.6)
                ax.axvline(k - 0.5, color="k", lw=0.6)
        ax.set_title(title)
        ax.set_xlabel("client (ordered by domain)")
        integer_ticks(ax, y=True)
        fig.colorbar(im, ax=ax, fraction=0.046)
    q = strategy.index_quality()
    gap = f"; same - cross domain beta_f cos {q['beta-f-block-gap']:.2f}" if "beta-f-block-gap" in q else ""
    fig.suptitle(f"Client2Vec pairwise index similarity ({strategy.c2v.size} clients{gap})")
    save(plt, fig, folder / "client2vec_similarity.png")

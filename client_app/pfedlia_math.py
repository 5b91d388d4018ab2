"""pFedLIA client-side math (pfedlia.md §2.4, §2.5): the lazy-influence row and 2-means beneficial peers.

See docs/methods/pfedlia.md; its last section says where each section number cited here is explained."""

from __future__ import annotations

import numpy as np
import torch
from sklearn.cluster import KMeans


def lazy_influence_row(
    loss_warmup: torch.Tensor | float, losses_lazy: torch.Tensor | np.ndarray, num_val: int, reduction: str = "sum"
) -> np.ndarray:
    """Eq. 1 (with theta_j read as the lazy model): ``I(i, j) = sum_{z in val_i} L(z, theta_0) - L(z, theta_j)``.

    ``loss_warmup`` and ``losses_lazy`` (one per peer j) are mean validation losses; ``sum`` multiplies by
    the number of validation samples as the paper's sum does, ``mean`` keeps the mean (pfedlia.md §6.5).
    Positive: peer j's data moves the model in a direction that helps this client.
    """
    if reduction not in ("sum", "mean"):
        raise ValueError(f"run-config key 'lia-reduction' must be 'sum' or 'mean', got {reduction!r}")
    diff = (torch.as_tensor(loss_warmup) - torch.as_tensor(losses_lazy)).detach().cpu().numpy().astype(np.float64)
    return diff * (num_val if reduction == "sum" else 1.0)


def beneficial_peers(row: np.ndarray, self_index: int, seed: int = 0, require_positive: bool = False) -> np.ndarray:
    """Peer-to-peer pFedLIA: 2-means on the row without the client itself; the cluster with the larger
    centroid is "beneficial"; the client is always included (pfedlia.md §2.5).  A constant row (both centroids
    equal) means every peer is beneficial.  Returns the sorted indices of S_i."""
    row = np.asarray(row, dtype=np.float64)
    others = np.array([j for j in range(len(row)) if j != self_index], dtype=np.int64)
    if len(others) == 0:
        return np.array([self_index])
    values = row[others]
    if len(others) == 1 or np.ptp(values) <= 1e-12 * max(1.0, np.abs(values).max()):
        chosen = others
    else:
        km = KMeans(n_clusters=2, n_init=10, random_state=seed).fit(values.reshape(-1, 1))
        centers = km.cluster_centers_.ravel()
        chosen = others if abs(centers[0] - centers[1]) <= 1e-12 else others[km.labels_ == int(np.argmax(centers))]
    if require_positive:
        chosen = chosen[row[chosen] > 0]
    return np.sort(np.concatenate([chosen, [self_index]]))

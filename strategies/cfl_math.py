"""Clustered FL (Sattler et al., 2020) server math: cosine similarity of updates, the optimal bipartition and
the split criterion.  Pure numpy / scikit-learn, no Flower."""

from __future__ import annotations

import numpy as np
from sklearn.cluster import AgglomerativeClustering


def cosine_similarity_matrix(updates: np.ndarray) -> np.ndarray:
    """Pairwise cosine similarity of the rows of ``updates`` (N x n flattened weight updates)."""
    u = np.asarray(updates, dtype=np.float64)
    norms = np.maximum(np.linalg.norm(u, axis=1, keepdims=True), 1e-12)
    v = u / norms
    return np.clip(v @ v.T, -1.0, 1.0)


def optimal_bipartition(similarity: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Split clients into two groups minimising the largest cross-group similarity (complete linkage on
    the distance 1 - similarity); returns the two index arrays."""
    n = len(similarity)
    if n < 2:
        raise ValueError("a bipartition needs at least two clients")
    labels = (
        AgglomerativeClustering(n_clusters=2, metric="precomputed", linkage="complete")
        .fit(1.0 - np.asarray(similarity))
        .labels_
    )
    return np.flatnonzero(labels == 0), np.flatnonzero(labels == 1)


def should_split(updates: np.ndarray, eps1: float, eps2: float) -> tuple[bool, float, float]:
    """Sattler's criterion: the cluster is near a stationary point of the joint objective (norm of the mean
    update < eps1) while some client is still far from its own (max update norm > eps2)."""
    u = np.asarray(updates, dtype=np.float64)
    mean_norm = float(np.linalg.norm(u.mean(0)))
    max_norm = float(np.linalg.norm(u, axis=1).max())
    return (mean_norm < eps1 and max_norm > eps2 and len(u) > 2), mean_norm, max_norm

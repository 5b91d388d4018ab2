"""pFedLIA server-side math (pfedlia.md §2.5, §2.6): OPTICS clustering of the lazy-influence matrix,
noise reassignment, late joiners, the adjusted Rand index.  Pure numpy / scikit-learn, no Flower.

See docs/methods/pfedlia.md; its last section says where each section number cited here is explained."""

from __future__ import annotations

import numpy as np
from sklearn.cluster import OPTICS
from sklearn.metrics import adjusted_rand_score

NOISE_MODES = ("nearest", "singleton")
SCORE_MODES = ("raw", "sign")


def cluster_features(matrix: np.ndarray, score: str = "raw", standardize: bool = False) -> np.ndarray:
    """Feature vector of client i = row i of the influence matrix (diagonal included; pfedlia.md §2.5), optionally
    turned into "votes" (``sign``: 1[I_ij > 0]) and/or standardised per row."""
    if score not in SCORE_MODES:
        raise ValueError(f"run-config key 'lia-score' must be one of {list(SCORE_MODES)}, got {score!r}")
    x = np.asarray(matrix, dtype=np.float64)
    if score == "sign":
        x = (x > 0).astype(np.float64)
    if standardize:
        x = (x - x.mean(1, keepdims=True)) / np.maximum(x.std(1, keepdims=True), 1e-12)
    return x


def reassign_noise(features: np.ndarray, labels: np.ndarray, mode: str = "nearest") -> np.ndarray:
    """OPTICS labels noise points -1: give each the cluster of its nearest non-noise point (``nearest``) or a
    cluster of its own (``singleton``).  With no cluster at all, everyone forms one cluster."""
    if mode not in NOISE_MODES:
        raise ValueError(f"run-config key 'lia-noise' must be one of {list(NOISE_MODES)}, got {mode!r}")
    labels = np.asarray(labels).copy()
    noise = labels < 0
    if not noise.any():
        return labels
    if noise.all():
        return np.zeros_like(labels)
    if mode == "singleton":
        labels[noise] = labels.max() + 1 + np.arange(noise.sum())
        return labels
    members = np.flatnonzero(~noise)
    dist = np.linalg.norm(features[noise][:, None, :] - features[members][None, :, :], axis=-1)
    labels[noise] = labels[members[dist.argmin(1)]]
    return labels


def cluster_influence(
    matrix: np.ndarray,
    min_samples: int = 5,
    xi: float = 0.05,
    noise: str = "nearest",
    score: str = "raw",
    standardize: bool = False,
) -> np.ndarray:
    """Central pFedLIA: OPTICS on the rows of the N x N lazy-influence matrix, noise reassigned; labels 0..K-1.

    ``min_samples`` must not exceed the smallest true cluster (pfedlia.md §2.5) and is capped at N.
    """
    x = cluster_features(matrix, score, standardize)
    n = len(x)
    if n < 2:
        return np.zeros(n, dtype=np.int64)
    labels = OPTICS(min_samples=max(2, min(int(min_samples), n)), xi=xi).fit(x).labels_
    labels = reassign_noise(x, labels, noise)
    _, dense = np.unique(labels, return_inverse=True)
    return dense.astype(np.int64)


def assign_late_joiner(row: np.ndarray, labels: np.ndarray) -> int:
    """pfedlia.md §2.8 late joiners: the cluster whose members' lazy models score highest on average in the
    newcomer's row (row over the existing clients, in the order of ``labels``)."""
    row, labels = np.asarray(row, float), np.asarray(labels)
    clusters = np.unique(labels)
    return int(clusters[np.argmax([row[labels == c].mean() for c in clusters])])


def groups_from_sets(sets: dict[int, frozenset[int]]) -> dict[int, int]:
    """Peer-to-peer: identical beneficial sets share one model (pfedlia.md §2.6); a label per distinct set."""
    ids: dict[frozenset[int], int] = {}
    return {node: ids.setdefault(s, len(ids)) for node, s in sorted(sets.items())}


def adjusted_rand(truth, labels) -> float:
    return float(adjusted_rand_score(np.asarray(truth), np.asarray(labels)))

"""FedCAC server-side math (fedcac.md §2.5-§2.7): mask overlap, rising threshold, collaborators, Eq. 9/10.

Pure numpy, no Flower, vectorised over clients: the overlap is one matrix product of the N x n mask
matrix (in chunks), the customized models are one product of the N x N collaboration matrix with the
N x n parameter matrix.

See docs/methods/fedcac.md; its last section says where each section number cited here is explained.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike


def mask_overlap(masks: np.ndarray, chunk: int = 65_536) -> np.ndarray:
    """Corrected overlap (fedcac.md §2.5): ``O_ij = 1 - ||M_i - M_j||_1 / (2 ||M_i||_1)`` = ``<M_i, M_j> / K_i``.

    The paper prints ``||M_i - M_j||_1 / (2n)``, a *mismatch*: with "O >= threshold" it would pick the
    least similar clients.  ``masks`` is N x n (bool/0-1).  ``<M_i, M_j>`` comes from float32 matrix
    products over column chunks accumulated in float64 (exact for counts below 2^24 per chunk).
    Rows with an empty mask (K_i = 0) get overlap 0; the diagonal is 1 where K_i > 0.
    """
    masks = np.asarray(masks)
    if masks.ndim != 2:
        raise ValueError(f"masks must be an N x n matrix, got shape {masks.shape}")
    n_clients, n = masks.shape
    inter = np.zeros((n_clients, n_clients), dtype=np.float64)
    for start in range(0, n, chunk):
        block = masks[:, start : start + chunk].astype(np.float32)
        inter += block @ block.T
    sizes = np.diag(inter).copy()
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(sizes[:, None] > 0, inter / np.where(sizes > 0, sizes, 1)[:, None], 0.0)


def off_diagonal(matrix: np.ndarray) -> np.ndarray:
    n = matrix.shape[0]
    return matrix[~np.eye(n, dtype=bool)]


def overlap_threshold(overlap: np.ndarray, server_round: int, beta: int) -> float:
    """Eq. 7: ``O_avg + (t / beta) (O_max - O_avg)`` over the off-diagonal entries (t >= 1)."""
    if beta < 1:
        raise ValueError(f"run-config key 'beta' must be an integer >= 1, got {beta}")
    off = off_diagonal(overlap)
    if off.size == 0:
        return float("inf")
    avg, top = float(off.mean()), float(off.max())
    return avg + (server_round / beta) * (top - avg)


def collaborators(
    overlap: np.ndarray,
    threshold: float,
    server_round: int,
    beta: int,
    strict_beta_cutoff: bool = True,
    tol: float = 1e-12,
) -> list[np.ndarray]:
    """Eq. 8: ``C_i = {j != i : O_ij >= threshold}`` (with a tolerance so the max pair counts at t = beta).

    With ``strict_beta_cutoff`` (fedcac.md §2.6) every set is empty once t > beta, also in the degenerate case
    O_max = O_avg where the threshold would otherwise never rise above the overlaps.  A pair with no common
    critical parameter (O_ij = 0) never collaborates: with tau = 0 every mask is empty, every overlap 0 and
    so is the threshold, and every C_i is empty (fedcac.md §6.8: the official code's 0/0 = NaN also gives the
    empty set there), not "everyone".
    """
    n = overlap.shape[0]
    if strict_beta_cutoff and server_round > beta:
        return [np.zeros(0, dtype=np.int64) for _ in range(n)]
    chosen = (overlap >= threshold - tol) & (overlap > 0) & ~np.eye(n, dtype=bool)
    return [np.flatnonzero(row) for row in chosen]


def collaboration_matrix(collab: list[np.ndarray]) -> np.ndarray:
    """A with ``A_ij = 1 / (|C_i| + 1)`` for ``j in C_i ∪ {i}`` (Eq. 10 as ``U = A W``)."""
    n = len(collab)
    a = np.eye(n)
    for i, c in enumerate(collab):
        a[i, c] = 1.0
    return a / a.sum(axis=1, keepdims=True)


def global_average(params: np.ndarray, weights: ArrayLike | None = None) -> np.ndarray:
    """Eq. 9: ``w_bar`` = mean of the N x n parameter matrix (uniform, or weighted by ``weights``, one number per row
    in any array-like form)."""
    if weights is None:
        return params.mean(axis=0)
    w = np.asarray(weights, dtype=np.float64)
    return (w / w.sum()) @ params


def customized_models(params: np.ndarray, collab: list[np.ndarray]) -> np.ndarray:
    """Eq. 10: ``u_i`` = mean of the models of i and its collaborators, for all i at once."""
    return (collaboration_matrix(collab) @ params.astype(np.float64)).astype(params.dtype)


def collaborator_label_similarity(collab: list[np.ndarray], label_histograms: np.ndarray) -> tuple[float, float]:
    """fedcac.md §8 diagnostic: mean cosine similarity of label histograms over collaborator pairs vs all pairs."""
    h = np.asarray(label_histograms, dtype=np.float64)
    h = h / np.maximum(np.linalg.norm(h, axis=1, keepdims=True), 1e-12)
    cos = h @ h.T
    pairs = [cos[i, j] for i, c in enumerate(collab) for j in c]
    everyone = off_diagonal(cos)
    return (float(np.mean(pairs)) if pairs else float("nan")), float(everyone.mean() if everyone.size else float("nan"))

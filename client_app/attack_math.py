"""The crafted updates of the attacks that know the honest updates (run-config ``attack`` ``alie``, ``min-max``,
``min-sum``): pure numpy on updates flattened into rows, no Flower.  client_app/attacks.py estimates the honest updates
(:func:`client_app.attacks.benign_updates`) and sends the model these functions craft; docs/robustness.md says what
each changes.

- ALIE, "A little is enough" (Baruch et al., NeurIPS 2019, Alg. 1 and its z_max): every coordinate moved ``z_max``
  standard deviations below the honest mean, where ``z_max`` is the largest z such that the normal CDF at z stays
  below ``(n - s) / n`` and ``s = floor(n / 2 + 1) - f`` honest clients are needed beside the ``f`` attackers to make a
  majority: the shift stays inside the spread a majority of the honest updates covers, so a rule that picks "the
  typical update" cannot tell it apart.
- Min-max and min-sum, AGR-agnostic (Shejwalkar and Houmansadr, NDSS 2021, Eqs. 5 and 6 with the inverse standard
  deviation as perturbation): the honest mean plus ``gamma`` times ``-sigma``, with ``gamma`` the largest that keeps the
  crafted update's largest distance to an honest update within the largest distance between two honest updates
  (min-max), or its summed squared distance to the honest updates within the largest such sum of an honest update
  (min-sum).  The paper finds ``gamma`` by a halving search (Alg. 1); both conditions are a quadratic in ``gamma``, so
  the largest ``gamma`` is computed exactly here.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np


def alie_z(n: int, f: int) -> float:
    """Baruch et al.'s ``z_max`` for ``n`` clients of which ``f`` attack: ``s = floor(n / 2 + 1) - f`` supporters are
    needed, and ``z_max = Phi^-1((n - s) / n)``; 0 where that share is at most one half (too few attackers to shift
    anything unseen), and the share capped at ``(n - 1) / n`` where the attackers need no supporter at all (``s <= 0``,
    where the definition's z is unbounded)."""
    if n < 1 or not 0 <= f <= n:
        raise ValueError(f"ALIE needs n >= 1 clients and 0 <= f <= n attackers, got n={n}, f={f}")
    s = math.floor(n / 2 + 1) - f
    share = min(max((n - s) / n, 0.5), (n - 1) / n if n > 1 else 0.5)
    return NormalDist().inv_cdf(share) if share > 0.5 else 0.0


def alie(benign: np.ndarray, n: int, f: int) -> np.ndarray:
    """ALIE's update from the honest updates ``benign`` (k x d): ``mean - z_max(n, f) * std`` per coordinate (the
    population standard deviation of the k rows)."""
    benign = np.asarray(benign, dtype=np.float64)
    return benign.mean(axis=0) - alie_z(n, f) * benign.std(axis=0)


def _largest_gamma(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> float:
    """The largest ``gamma >= 0`` with ``a_i * gamma^2 + b_i * gamma + c_i <= 0`` for every i (each ``c_i <= 0``, so
    gamma = 0 satisfies all; ``a_i >= 0``)."""
    best = math.inf
    for ai, bi, ci in zip(a, b, c, strict=True):
        if ai > 0:
            root = (-bi + math.sqrt(max(bi * bi - 4 * ai * ci, 0.0))) / (2 * ai)
        elif bi > 0:
            root = -ci / bi
        else:
            continue  # never violated for gamma >= 0
        best = min(best, max(root, 0.0))
    return 0.0 if math.isinf(best) else best


def min_max(benign: np.ndarray) -> tuple[np.ndarray, float]:
    """Min-max's update: ``mean + gamma * (-std)`` with the largest ``gamma`` such that
    ``max_i ||m - b_i|| <= max_{i,j} ||b_i - b_j||`` over the honest updates ``b``.  Returns (the update, gamma)."""
    benign = np.asarray(benign, dtype=np.float64)
    mean, p = benign.mean(axis=0), -benign.std(axis=0)
    diffs = benign[:, None, :] - benign[None, :, :]
    limit = float(np.max(np.einsum("ijk,ijk->ij", diffs, diffs)))
    to_mean = mean[None, :] - benign  # m - b_i at gamma = 0
    pp = float(p @ p)
    a = np.full(len(benign), pp)
    b = 2 * to_mean @ p
    c = np.einsum("ij,ij->i", to_mean, to_mean) - limit
    gamma = _largest_gamma(a, b, c) if pp > 0 else 0.0
    return mean + gamma * p, gamma


def min_sum(benign: np.ndarray) -> tuple[np.ndarray, float]:
    """Min-sum's update: ``mean + gamma * (-std)`` with the largest ``gamma`` such that
    ``sum_i ||m - b_i||^2 <= max_i sum_j ||b_i - b_j||^2`` over the honest updates ``b``.  Returns (the update,
    gamma)."""
    benign = np.asarray(benign, dtype=np.float64)
    mean, p = benign.mean(axis=0), -benign.std(axis=0)
    diffs = benign[:, None, :] - benign[None, :, :]
    limit = float(np.max(np.einsum("ijk,ijk->ij", diffs, diffs).sum(axis=1)))
    to_mean = mean[None, :] - benign
    pp = float(p @ p)
    a = np.array([len(benign) * pp])
    b = np.array([2 * float(to_mean.sum(axis=0) @ p)])
    c = np.array([float(np.einsum("ij,ij->", to_mean, to_mean)) - limit])
    gamma = _largest_gamma(a, b, c) if pp > 0 else 0.0
    return mean + gamma * p, gamma

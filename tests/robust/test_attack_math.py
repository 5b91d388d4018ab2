"""The crafted updates of the attacks that know the honest updates (client_app/attack_math.py) against their papers'
definitions, computed another way: ALIE's z_max from the normal CDF (Baruch et al. 2019), min-max's and min-sum's
largest gamma by searching the papers' conditions (Shejwalkar and Houmansadr 2021)."""

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from client_app.attack_math import alie, alie_z, min_max, min_sum


def normal_cdf(z: float) -> float:
    return 0.5 * (1 + math.erf(z / math.sqrt(2)))


@pytest.mark.parametrize("n,f", [(50, 24), (10, 3), (10, 2), (20, 6), (7, 3)])
def test_alies_z_is_where_the_normal_cdf_reaches_the_share_of_non_supporters(n, f):
    s = math.floor(n / 2 + 1) - f  # the honest "supporters" the attackers need for a majority
    assert normal_cdf(alie_z(n, f)) == pytest.approx((n - s) / n, abs=1e-9)


def test_alies_z_is_zero_when_too_few_attack_and_bounded_when_they_need_no_supporter():
    assert alie_z(10, 1) == 0.0 and alie_z(10, 0) == 0.0  # (n - s) / n is at most one half
    assert normal_cdf(alie_z(10, 6)) == pytest.approx(0.9)  # s <= 0: the share capped at (n - 1) / n
    with pytest.raises(ValueError, match="ALIE needs n >= 1 clients and 0 <= f <= n attackers, got n=4, f=5"):
        alie_z(4, 5)


BENIGN = (
    st.integers(2, 9)
    .flatmap(lambda k: st.tuples(st.just(k), st.integers(1, 6), st.integers(0, 2**32 - 1)))
    .map(lambda t: np.random.default_rng(t[2]).normal(size=(t[0], t[1])) * np.linspace(0.1, 3.0, t[1]))
)


@given(BENIGN, st.integers(10, 60), st.integers(1, 29))
def test_alie_moves_every_coordinate_z_standard_deviations_below_the_honest_mean(benign, n, f):
    f = min(f, n)
    z = alie_z(n, f)
    for j in range(benign.shape[1]):
        column = [float(v) for v in benign[:, j]]
        mean = math.fsum(column) / len(column)
        std = math.sqrt(math.fsum((v - mean) ** 2 for v in column) / len(column))
        assert alie(benign, n, f)[j] == pytest.approx(mean - z * std, rel=1e-9, abs=1e-12)


def _max_distance(m, benign):
    return max(float(np.sum((m - b) ** 2)) for b in benign)


def _sum_distance(m, benign):
    return sum(float(np.sum((m - b) ** 2)) for b in benign)


def _largest_by_search(holds) -> float:
    """The largest gamma >= 0 for which ``holds(gamma)`` (true at 0, an interval), by doubling then halving."""
    hi = 1.0
    while holds(hi):
        hi *= 2
        if hi > 1e12:
            return math.inf
    lo = 0.0
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if holds(mid) else (lo, mid)
    return lo


@given(BENIGN)
def test_min_max_moves_the_mean_as_far_against_the_spread_as_the_largest_honest_distance_allows(benign):
    mean, p = benign.mean(axis=0), -benign.std(axis=0)
    limit = max(float(np.sum((a - b) ** 2)) for a in benign for b in benign)
    update, gamma = min_max(benign)
    expected = _largest_by_search(lambda g: _max_distance(mean + g * p, benign) <= limit * (1 + 1e-12))
    assert gamma == pytest.approx(expected, rel=1e-6, abs=1e-9)
    assert np.allclose(update, mean + gamma * p)
    assert _max_distance(update, benign) <= limit * (1 + 1e-9) + 1e-12


@given(BENIGN)
def test_min_sum_moves_the_mean_as_far_as_the_largest_honest_sum_of_squared_distances_allows(benign):
    mean, p = benign.mean(axis=0), -benign.std(axis=0)
    limit = max(_sum_distance(b, benign) for b in benign)
    update, gamma = min_sum(benign)
    expected = _largest_by_search(lambda g: _sum_distance(mean + g * p, benign) <= limit * (1 + 1e-12))
    assert gamma == pytest.approx(expected, rel=1e-6, abs=1e-9)
    assert np.allclose(update, mean + gamma * p)


def test_identical_honest_updates_leave_nothing_to_hide_in():
    same = np.tile([1.0, -2.0], (4, 1))
    assert np.array_equal(min_max(same)[0], same[0]) and min_max(same)[1] == 0.0
    assert np.array_equal(min_sum(same)[0], same[0]) and np.array_equal(alie(same, 10, 3), same[0])

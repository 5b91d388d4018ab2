"""Paired differences with a 95 % interval (benchmarks/reporting/intervals.py) and the spread over clients
(benchmarks/reporting/fairness.py): the bootstrap over seeds and the clients within them against cases computed by
hand, its properties, the pairing by seed and client id, and the share of clients a method leaves worse than Local."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from benchmarks.reporting import fairness, intervals

from .test_grids import record


def runs(accs_by_seed: dict[int, list[float]], num_examples=None) -> list[dict]:
    """One record per seed with these per-client accuracies (clients 0, 1, ...)."""
    out = []
    for seed, accs in accs_by_seed.items():
        n = num_examples or tuple(30 + i for i in range(len(accs)))
        out.append(record("g", {"method": "m", "seed": seed}, 0.0, num_examples=n, client_accs=list(accs)))
    return out


# =========================================================================== the bootstrap
def test_one_seed_two_clients_by_hand():
    # resampling two clients: mean 0 (both the first), 0.5, or 1 (both the second), with chances 1/4, 1/2, 1/4:
    # the 2.5th percentile is 0 and the 97.5th is 1
    assert intervals.bootstrap([[0.0, 1.0]]) == (0.5, 0.0, 1.0)


def test_seeds_are_the_outer_level_by_hand():
    # clients agree within each seed: only the draw of seeds moves the mean (0.1, 0.2 or 0.3)
    assert intervals.bootstrap([[0.1, 0.1], [0.3, 0.3]]) == pytest.approx((0.2, 0.1, 0.3))


def test_a_constant_difference_has_no_width_and_the_same_records_give_the_same_interval():
    assert intervals.bootstrap([[0.02] * 5, [0.02] * 7]) == pytest.approx((0.02, 0.02, 0.02))
    diffs = [[0.1, -0.2, 0.3], [0.0, 0.05, -0.1, 0.2]]
    assert intervals.bootstrap(diffs) == intervals.bootstrap(diffs)


values = st.lists(st.floats(-1, 1, allow_nan=False), min_size=2, max_size=12)


@settings(max_examples=40, deadline=None)
@given(st.lists(values, min_size=1, max_size=4))
def test_the_interval_contains_the_point_estimate(diffs):
    point, lo, hi = intervals.bootstrap(diffs, resamples=500)
    assert lo - 1e-12 <= point <= hi + 1e-12
    assert point == pytest.approx(np.mean([np.mean(d) for d in diffs]))


@settings(max_examples=25, deadline=None)
@given(st.lists(st.floats(-1, 1, allow_nan=False), min_size=3, max_size=10).filter(lambda v: np.std(v) > 0.05))
def test_the_interval_shrinks_with_more_clients_like_these(diff):
    _, lo, hi = intervals.bootstrap([diff])
    _, lo4, hi4 = intervals.bootstrap([diff * 4])  # four times the clients, the same spread
    assert hi4 - lo4 < hi - lo


# =========================================================================== pairing by seed and client
def test_differences_pair_by_seed_and_client_id_not_by_order():
    arm = runs({0: [0.9, 0.5, 0.7], 1: [0.8, 0.8, 0.8]})
    ref = runs({1: [0.7, 0.7, 0.7], 0: [0.8, 0.4, 0.6]})
    iv = intervals.paired_interval(arm, ref)
    assert iv.ok and iv.seeds == [0, 1] and iv.clients == 6
    assert iv.point == pytest.approx(0.1) and iv.lo == pytest.approx(0.1) and iv.above  # +0.1 for every client
    # the clients of a record in another order are the same clients
    shuffled = runs({0: [0.9, 0.5, 0.7], 1: [0.8, 0.8, 0.8]})
    for r in shuffled:
        r["clients"]["rows"].reverse()
    assert intervals.paired_interval(shuffled, ref).point == pytest.approx(0.1)


def test_no_interval_between_runs_on_other_data_or_other_clients():
    arm, ref = runs({0: [0.9, 0.9]}), runs({0: [0.5, 0.5]}, num_examples=(99, 98))
    iv = intervals.paired_interval(arm, ref)
    assert not iv.ok and "data differ" in (iv.reason or "") and iv.text().startswith("no interval")
    assert intervals.interval_cell(None) == "—"
    assert not intervals.paired_interval(arm, runs({1: [0.5, 0.5]})).ok  # no seed in common


def test_an_interval_that_straddles_zero_is_neither_better_nor_worse():
    arm = runs({0: [0.9, 0.1, 0.5], 1: [0.2, 0.8, 0.5]})
    ref = runs({0: [0.5, 0.5, 0.5], 1: [0.5, 0.5, 0.5]})
    iv = intervals.paired_interval(arm, ref)
    assert iv.lo < 0 < iv.hi and not iv.above and not iv.below and iv.verdict() == "not told apart"
    assert not intervals.interval_cell(iv).startswith("**")
    worse = intervals.paired_interval(runs({0: [0.1] * 3, 1: [0.1] * 3}), ref)
    assert worse.below and intervals.interval_cell(worse).startswith("**")


# =========================================================================== the spread over clients
def test_the_spread_is_per_run_then_averaged_over_seeds():
    a = [0.2, 0.4, 0.6, 0.8, 1.0]
    b = [0.5, 0.5, 0.5, 0.5, 0.5]
    s = fairness.spread(runs({0: a, 1: b}))
    assert s is not None and s.runs == 2
    assert s.std == pytest.approx((np.std(a) + 0.0) / 2)
    assert s.worst == pytest.approx((0.2 + 0.5) / 2)
    assert s.p10 == pytest.approx((np.percentile(a, 10) + 0.5) / 2)
    assert fairness.spread([]) is None and fairness.spread_cells([]) == ["—"] * 3


def test_clients_worse_than_local_are_counted_per_seed_and_client():
    local = runs({0: [0.5, 0.5, 0.5], 1: [0.6, 0.6, 0.6]})
    # seed 0: client 2 worse; seed 1: clients 0 and 1 worse (a fifth of the clients hurt would show the same way)
    arm = runs({0: [0.9, 0.9, 0.4], 1: [0.5, 0.5, 0.9]})
    w = fairness.worse_than_local(arm, local)
    assert (w.worse, w.pairs) == (3, 6) and w.share == pytest.approx(0.5) and w.text() == "50% (3 of 6)"
    other = fairness.worse_than_local(runs({0: [0.9, 0.9]}, num_examples=(1, 2)), runs({0: [0.5, 0.5]}))
    assert other.share is None and "data differ" in other.text()
    assert fairness.worse_than_local(arm, []).text() == "— (no Local run to pair with)"

"""The aggregation rules (strategies/robust.py) against independent re-computations in plain numpy / Python, and the
properties that make them robust: with fewer lying clients than the rule tolerates, the median and the trimmed mean
stay inside the range of the honest models coordinate by coordinate, and Multi-Krum keeps no liar whose model is far
from every honest one."""

import math
import re

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from strategies.robust import (
    aggregate_rows,
    aggregate_states,
    bounded_model,
    bulyan,
    capped_weights,
    fltrust,
    multi_krum,
    peers_kept,
)
from task.robust import RobustOptions


def rule(name: str, **kw) -> RobustOptions:
    return RobustOptions(aggregator=name, **kw)


def column_median(rows: np.ndarray) -> np.ndarray:
    out = []
    for column in np.asarray(rows, dtype=np.float64).T:
        values, n = sorted(column), len(column)
        out.append(values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2)
    return np.array(out)


def column_trimmed_mean(rows: np.ndarray, cut: int) -> np.ndarray:
    n = len(rows)
    return np.array([math.fsum(sorted(c)[cut : n - cut]) / (n - 2 * cut) for c in np.asarray(rows, np.float64).T])


def krum_scores(rows: np.ndarray, f: int) -> list[float]:
    """Multi-Krum's scores by their definition: each row's squared distances to its n - f - 2 nearest others, summed."""
    n = len(rows)
    scores = []
    for i in range(n):
        dist = sorted(
            math.fsum((a - b) ** 2 for a, b in zip(rows[i], rows[j], strict=True)) for j in range(n) if j != i
        )
        scores.append(math.fsum(dist[: max(1, n - f - 2)]))
    return scores


ROWS = hnp.arrays(np.float64, st.tuples(st.integers(1, 9), st.integers(1, 6)), elements=st.floats(-1e3, 1e3))


@given(ROWS)
def test_median_is_the_middle_value_of_every_coordinate(rows):
    out, outcome = aggregate_rows(rows, None, rule("median"))
    assert np.allclose(out, column_median(rows), rtol=1e-12, atol=1e-9)
    assert outcome.rule == "median" and outcome.selected is None and outcome.clipped is None


@given(ROWS, st.floats(0.0, 0.49), st.floats(0.0, 0.49))
def test_trimmed_mean_averages_what_is_left_after_cutting_each_end(rows, fraction, share):
    """``int(trim-fraction * n)`` cut at each end, or with trim-fraction 0 the ``floor(byzantine-share * n)`` liars the
    rules assume."""
    out, _ = aggregate_rows(rows, None, rule("trimmed-mean", trim_fraction=fraction, byzantine_share=share))
    cut = int(fraction * len(rows)) if fraction else math.floor(share * len(rows) + 1e-9)
    assert np.allclose(out, column_trimmed_mean(rows, cut), rtol=1e-9, atol=1e-7)


def test_the_median_and_trimmed_mean_ignore_the_weights_the_mean_and_norm_bound_use():
    rows = np.array([[0.0], [1.0], [10.0]])
    heavy = [1, 1, 100]
    assert aggregate_rows(rows, heavy, rule("median"))[0] == pytest.approx([1.0])
    assert aggregate_rows(rows, heavy, rule("trimmed-mean", trim_fraction=0.34))[0] == pytest.approx([1.0])
    assert aggregate_rows(rows, heavy, rule("mean"))[0] == pytest.approx([1001 / 102])
    uncapped = rule("norm-bound", norm_bound=2.0, weight_cap=0)
    bounded, outcome = aggregate_rows(rows, heavy, uncapped, reference=np.zeros(1))
    assert bounded == pytest.approx([(0 + 1 + 100 * 2) / 102]) and outcome.clipped == [2]
    capped, _ = aggregate_rows(rows, heavy, rule("norm-bound", norm_bound=2.0), reference=np.zeros(1))
    assert capped == pytest.approx([(0 + 1 + 2) / 3])  # weight-cap 1 (default): every client's update counts once


@given(
    hnp.arrays(np.float64, st.tuples(st.integers(1, 8), st.integers(1, 5)), elements=st.floats(-50, 50)),
    st.data(),
)
def test_multi_krum_keeps_the_rows_with_the_lowest_krum_scores_and_averages_them_with_the_weights(rows, data):
    n = len(rows)
    share = data.draw(st.floats(0.0, 0.49))
    select = data.draw(st.integers(0, n))
    weights = np.array(data.draw(st.lists(st.integers(1, 9), min_size=n, max_size=n)), float)
    options = rule("multi-krum", byzantine_share=share, krum_select=select, weight_cap=0)
    f = math.floor(share * n + 1e-9)
    m = select or n - f
    scores = krum_scores(rows, f)
    ranked = sorted(range(n), key=lambda i: scores[i])
    if m < n:  # the kept set is defined only where the m-th and the next score differ (beyond summation order)
        assume(scores[ranked[m]] - scores[ranked[m - 1]] > 1e-6 * max(1.0, scores[ranked[m]]))
    expected = sorted(ranked[:m])
    out, outcome = aggregate_rows(rows, weights, options)
    assert outcome.selected == expected
    assert np.allclose(out, weights[expected] @ rows[expected] / weights[expected].sum())


def test_multi_krum_leaves_out_the_model_far_from_the_others():
    rows = np.array([[0.0, 0.0], [0.1, 0.0], [0.0, 0.1], [0.1, 0.1], [50.0, -50.0]])
    assert multi_krum(rows, byzantine=1, select=4) == [0, 1, 2, 3]


@given(
    hnp.arrays(np.float64, st.tuples(st.integers(1, 8), st.integers(1, 5)), elements=st.floats(-1e3, 1e3)),
    hnp.arrays(np.float64, st.integers(1, 5), elements=st.floats(-1e3, 1e3)),
    st.floats(1e-3, 1e3),
)
def test_norm_bound_clips_every_update_to_the_bound_and_averages_the_clipped_updates(rows, reference, bound):
    assume(rows.shape[1] == reference.shape[0])
    weights = np.arange(1, len(rows) + 1, dtype=float)
    options = rule("norm-bound", norm_bound=bound, weight_cap=0)
    out, outcome = aggregate_rows(rows, weights, options, reference=reference)
    clipped = []
    for row in rows:
        delta = row - reference
        norm = math.sqrt(math.fsum(delta**2))
        clipped.append(delta * (bound / norm if norm > bound else 1.0))
    expected = reference + (weights / weights.sum()) @ np.array(clipped)
    assert np.allclose(out, expected, rtol=1e-9, atol=1e-9)
    norms = [math.sqrt(math.fsum((r - reference) ** 2)) for r in rows]
    assert outcome.norms == pytest.approx(norms) and outcome.clipped == [i for i, x in enumerate(norms) if x > bound]


def exactly(message: str) -> str:
    """A ``pytest.raises`` pattern that matches the whole message and nothing else."""
    return "^" + re.escape(message) + "$"


def test_norm_bound_needs_the_model_the_server_sent():
    message = exactly("norm-bound needs the model the server sent (the reference of the updates)")
    with pytest.raises(ValueError, match=message):
        aggregate_rows(np.ones((2, 3)), None, rule("norm-bound"))
    with pytest.raises(ValueError, match=message):
        aggregate_states([{"w": np.ones(3)}, {"w": np.zeros(3)}], None, rule("norm-bound"))


def test_an_empty_aggregate_and_an_unknown_rule_are_refused_with_what_was_wrong():
    with pytest.raises(ValueError, match=exactly("an aggregate needs at least one model")):
        aggregate_rows(np.zeros((0, 3)), None, rule("median"))
    with pytest.raises(ValueError, match=exactly("an aggregate needs at least one model")):
        aggregate_states([], None, rule("median"))
    with pytest.raises(ValueError, match=exactly("unknown aggregator 'krum'")):
        aggregate_rows(np.ones((2, 3)), None, rule("krum"))


@pytest.mark.parametrize("name", ["mean", "median", "trimmed-mean", "multi-krum", "bulyan", "norm-bound"])
def test_every_rule_computes_in_float64_whatever_the_models_dtype(name):
    """float32 models (what clients send) are averaged in float64: the rows come back float64 and equal to the rule
    on the same values given as float64, and the outcome counts the models."""
    rows32 = np.array([[1.0, 3.0], [1.0000001, 3.0000002], [1.0000002, 3.0000005], [1.0000004, 2.9999998]], np.float32)
    options = rule(name, trim_fraction=0.25, byzantine_share=0.25, norm_bound=1e-7)
    reference = np.array([1.0, 3.0], np.float32)
    out, outcome = aggregate_rows(rows32, [1, 2, 3, 4], options, reference)
    expected, _ = aggregate_rows(rows32.astype(np.float64), [1, 2, 3, 4], options, reference.astype(np.float64))
    assert out.dtype == np.float64 and np.array_equal(out, expected)
    assert outcome.n == 4


def test_integer_arrays_count_in_no_distance_or_norm():
    """A counter that differs by thousands between clients neither makes an update long nor a model far."""
    states = [{"w": np.array([0.1 * i, 0.0]), "count": np.array(1000 * i, np.int64)} for i in range(4)]
    reference = {"w": np.zeros(2), "count": np.array(0, np.int64)}
    _, outcome = aggregate_states(states, None, rule("norm-bound", norm_bound=1.0), reference)
    assert outcome.norms == pytest.approx([0.0, 0.1, 0.2, 0.3]) and outcome.clipped == []
    states[0]["w"] = np.array([50.0, 50.0])
    _, outcome = aggregate_states(states, None, rule("multi-krum", byzantine_share=0.25, krum_select=3))
    assert outcome.selected == [1, 2, 3]


@pytest.mark.parametrize("name", ["mean", "median", "norm-bound"])
def test_a_model_of_integer_arrays_only_is_aggregated_by_the_rule(name):
    """No floating array at all (nothing to measure a distance on): each integer array still follows the rule."""
    states = [{"count": np.array([c, 2 * c], np.int64)} for c in (1, 3, 20)]
    reference = {"count": np.array([0, 0], np.int64)}
    out, _ = aggregate_states(states, [1, 1, 2], rule(name, weight_cap=0), reference)
    expected = [3, 6] if name == "median" else [round((1 + 3 + 40) / 4), round((2 + 6 + 80) / 4)]
    assert out["count"].dtype == np.int64 and out["count"].tolist() == expected


def test_the_median_of_integer_arrays_is_taken_element_by_element():
    states = [{"w": np.zeros(1), "counts": np.array(c, np.int64)} for c in ([1, 50], [2, 60], [90, 3])]
    out, _ = aggregate_states(states, None, rule("median"))
    assert out["counts"].tolist() == [2, 50]


def test_a_state_keeps_its_arrays_dtypes_and_shapes_and_integer_buffers_follow_the_rule():
    states: list[dict[str, np.ndarray]] = [
        {"w": np.full((2, 2), v, np.float32), "count": np.array(c, np.int64)}
        for v, c in ((0.0, 3), (1.0, 5), (9.0, 100))
    ]
    out, _ = aggregate_states(states, [1, 1, 1], rule("median"))
    assert out["w"].dtype == np.float32 and out["w"].shape == (2, 2) and np.all(out["w"] == 1.0)
    assert out["count"].dtype == np.int64 and out["count"].shape == () and int(out["count"]) == 5
    krum = rule("multi-krum", byzantine_share=0.34, krum_select=2, weight_cap=0)
    kept, outcome = aggregate_states(states, [1, 3, 1], krum)
    assert outcome.selected == [0, 1]  # the distances count the floating arrays only
    assert np.allclose(kept["w"], 0.75) and int(kept["count"]) == round((3 + 3 * 5) / 4)


def test_integer_buffers_follow_the_trimmed_mean_and_the_weighted_mean_of_every_model():
    """A counter (BatchNorm's batches seen) is averaged the way the floating arrays are: the trimmed mean cuts the
    same ends, the mean and norm bounding weigh every model by its weight (norm bounding clips floats only)."""
    counts = (3, 5, 100, 7, 9)
    states = [{"w": np.array([float(c)]), "count": np.array(c, np.int64)} for c in counts]
    trimmed, _ = aggregate_states(states, None, rule("trimmed-mean", trim_fraction=0.2))
    assert int(trimmed["count"]) == round((5 + 7 + 9) / 3) and trimmed["count"].dtype == np.int64
    weights = [1, 1, 2, 0, 0]
    mean, _ = aggregate_states(states, weights, rule("mean"))
    assert int(mean["count"]) == round((3 + 5 + 2 * 100) / 4)
    reference = {"w": np.zeros(1), "count": np.array(0, np.int64)}
    uncapped = rule("norm-bound", norm_bound=1.0, weight_cap=0)
    bounded, outcome = aggregate_states(states, weights, uncapped, reference)
    assert int(bounded["count"]) == round((3 + 5 + 2 * 100) / 4) and outcome.clipped


@pytest.mark.parametrize("weights", [[1, 1], [1, -1, 1], [0, 0, 0], [[1, 1, 1]]])
def test_weights_of_the_wrong_length_negative_or_summing_to_zero_are_refused_with_what_is_allowed(weights):
    states = [{"w": np.zeros(2)} for _ in range(3)]
    message = "need 3 non-negative weights with a positive sum, got " + str(weights)
    with pytest.raises(ValueError, match=re.escape(message)):
        aggregate_states(states, weights, rule("mean"))


def test_a_bounded_model_moves_at_most_the_bound_from_its_reference():
    reference = {"w": np.zeros(4, np.float32), "n": np.array(7)}
    model = {"w": np.array([3.0, 4.0, 0.0, 0.0], np.float32), "n": np.array(9)}
    out, norm = bounded_model(model, reference, 1.0)
    assert norm == pytest.approx(5.0) and np.allclose(out["w"], [0.6, 0.8, 0, 0]) and int(out["n"]) == 9
    same, _ = bounded_model(model, reference, 10.0)
    assert np.array_equal(same["w"], model["w"])


def test_a_model_without_floating_arrays_is_kept_as_it_is_at_distance_zero():
    """Integer arrays (counters) are never bounded: a model that holds only such arrays has moved nowhere."""
    out, norm = bounded_model({"n": np.array(9), "m": np.array([1, 2])}, {"n": np.array(7), "m": np.array([0, 0])}, 1.0)
    assert norm == 0.0 and int(out["n"]) == 9 and out["m"].tolist() == [1, 2]


# ------------------------------------------------------------------------------------------- weights, Bulyan, FLTrust
POSITIVE_WEIGHTS = st.lists(st.floats(1e-3, 2.0**31), min_size=1, max_size=9)


def capped_by_bisection(weights: list[float], cap: float) -> np.ndarray:
    """The capped weights by their definition, found another way: ``min(t * w, cap / m)`` summing to 1, with the scale
    ``t`` found by bisection (the sum grows with ``t``)."""
    w = np.array(weights, float) / math.fsum(weights)
    limit = cap / len(w)
    lo, hi = 0.0, 1.0
    while math.fsum(np.minimum(hi * w, limit)) < 1:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if math.fsum(np.minimum(mid * w, limit)) < 1 else (lo, mid)
    return np.minimum(hi * w, limit)


@given(POSITIVE_WEIGHTS, st.sampled_from([1.0, 1.5, 2.0, 4.0]))
def test_capped_weights_hold_no_client_above_the_cap_and_keep_the_proportions_below_it(weights, cap):
    got = capped_weights(weights, cap)
    assert got.sum() == pytest.approx(1.0) and got.max() <= cap / len(weights) * (1 + 1e-9)
    assert np.allclose(got, capped_by_bisection(weights, cap), rtol=1e-6, atol=1e-12)


def test_a_cap_of_one_averages_uniformly_and_zero_keeps_the_methods_weights():
    lie = [120, 130, 2**31 - 1]  # a client that claims the largest size a reply may carry
    assert np.allclose(capped_weights(lie, 1), [1 / 3] * 3)
    assert np.allclose(capped_weights(lie, 0), np.array(lie) / sum(lie))
    assert np.allclose(capped_weights([1, 1, 2, 0], 1), [1 / 3, 1 / 3, 1 / 3, 0])  # a zero weight stays out
    with pytest.raises(ValueError, match=exactly("a weight cap must be 0 or at least 1, got 0.5")):
        capped_weights(lie, 0.5)


def test_multi_krum_averages_the_models_it_keeps_uniformly_so_a_size_lie_buys_no_weight():
    rows = np.array([[0.0], [0.1], [0.2], [0.3]])
    lie = [10, 10, 10, 2**31 - 1]
    out, outcome = aggregate_rows(rows, lie, rule("multi-krum", byzantine_share=0.0))
    assert (
        outcome.selected == [0, 1, 2, 3]
        and out == pytest.approx([0.15])
        and outcome.weights == pytest.approx([0.25] * 4)
    )
    uncapped, _ = aggregate_rows(rows, lie, rule("multi-krum", byzantine_share=0.0, weight_cap=0))
    assert uncapped == pytest.approx([0.3], abs=1e-6)  # the method's weights: the liar's model is the average


@given(hnp.arrays(np.float64, st.tuples(st.integers(1, 8), st.integers(1, 4)), elements=st.floats(-100, 100)))
def test_the_default_norm_bound_is_the_median_norm_of_the_averages_updates(rows):
    reference = np.zeros(rows.shape[1])
    norms = [math.sqrt(math.fsum(r**2)) for r in rows]
    middle = sorted(norms)
    median = middle[len(norms) // 2] if len(norms) % 2 else (middle[len(norms) // 2 - 1] + middle[len(norms) // 2]) / 2
    for multiple in (1.0, 2.5):
        _, outcome = aggregate_rows(rows, None, rule("norm-bound", norm_bound_multiple=multiple), reference)
        bound = outcome.bound
        assert bound == pytest.approx(multiple * median) and outcome.norms == pytest.approx(norms)
        assert bound is not None and outcome.clipped == [i for i, x in enumerate(outcome.norms) if x > bound]


def bulyan_by_definition(rows: np.ndarray, f: int) -> list[tuple[list[int], np.ndarray]]:
    """El Mhamdi et al.'s Bulyan written from the paper: Krum picks one row at a time among those left (its score over
    the rows left), n - 2f times; per coordinate, the mean of the n - 2f - 2f picked values closest to their median.
    Krum's score ties by construction once a pick is scored on one neighbour (the nearest pair scores alike), and the
    paper lets either be picked: every (picked rows, aggregate) a tie-break can give."""
    outcomes: dict[tuple[int, ...], np.ndarray] = {}

    def pick(left: list[int], picked: list[int]) -> None:
        if len(picked) == len(rows) - 2 * f:
            key = tuple(sorted(picked))
            beta = len(picked) - 2 * f
            out = []
            for column in rows[list(key)].T:
                median = float(np.median(column))
                closest = sorted(column, key=lambda v: abs(v - median))[:beta]
                out.append(math.fsum(closest) / beta)
            outcomes[key] = np.array(out)
            return
        scores = krum_scores(rows[left], f)
        low = min(scores)
        for i, score in enumerate(scores):
            if score <= low + 1e-9 * max(1.0, abs(low)):
                pick([j for j in left if j != left[i]], [*picked, left[i]])

    pick(list(range(len(rows))), [])
    return [(list(k), v) for k, v in outcomes.items()]


@given(st.integers(0, 2), st.integers(0, 3), st.integers(0, 2**32 - 1))
def test_bulyan_is_recursive_krum_then_the_mean_of_the_values_closest_to_the_median(f, extra, seed):
    """On continuous random rows (no two distances to a median tie, almost surely)."""
    n = 4 * f + 3 + extra
    rows = np.random.default_rng(seed).normal(size=(n, 3)) * np.array([1.0, 10.0, 0.1])
    out, chosen = bulyan(rows, f)
    allowed = bulyan_by_definition(rows, f)
    assert any(chosen == picked and np.allclose(out, value, rtol=1e-9, atol=1e-9) for picked, value in allowed)


def test_bulyan_refuses_fewer_models_than_its_assumption_needs_and_the_rule_lowers_f_to_what_n_allows():
    with pytest.raises(ValueError, match=exactly("Bulyan needs n >= 4f + 3 models: 10 models cannot tolerate f=3")):
        bulyan(np.zeros((10, 2)), 3)
    options = rule("bulyan", byzantine_share=0.3)
    assert [options.bulyan_byzantine(n) for n in (3, 6, 7, 10, 11, 20)] == [0, 0, 1, 1, 2, 4]
    rows = np.array([[0.0], [0.1], [0.2], [0.15], [0.05], [0.12], [0.08], [0.11], [0.09], [90.0]])
    out, outcome = aggregate_rows(rows, None, options)  # f = floor(0.3 * 10) = 3 lowered to 1
    assert outcome.tolerated == 1 and 9 not in (outcome.selected or []) and 0.0 <= out[0] <= 0.2


def fltrust_by_definition(rows: np.ndarray, reference: np.ndarray, g0: np.ndarray) -> np.ndarray:
    total, weighted = 0.0, np.zeros_like(reference)
    n0 = math.sqrt(math.fsum(g0**2))
    for row in rows:
        g = row - reference
        ng = math.sqrt(math.fsum(g**2))
        score = max(0.0, math.fsum(g * g0) / (ng * n0)) if ng > 0 and n0 > 0 else 0.0
        total += score
        if score:
            weighted = weighted + score * g * (n0 / ng)
    return reference + weighted / total if total > 0 else reference


@given(
    hnp.arrays(np.float64, st.tuples(st.integers(1, 6), st.just(3)), elements=st.floats(-10, 10)),
    hnp.arrays(np.float64, 3, elements=st.floats(-10, 10)),
)
def test_fltrust_weights_each_update_by_its_cosine_with_the_servers_and_rescales_it(rows, g0):
    reference = np.array([1.0, -2.0, 0.5])
    out, trust = fltrust(rows, reference, g0)
    assert np.allclose(out, fltrust_by_definition(rows, reference, g0), rtol=1e-9, atol=1e-9)
    assert ((trust >= 0) & (trust <= 1 + 1e-12)).all()


def test_fltrust_gives_an_opposed_update_no_weight_and_a_boosted_one_no_more_than_unboosted():
    reference, g0 = np.zeros(2), np.array([1.0, 0.0])
    honest = np.array([[1.0, 0.2], [0.9, -0.1]])
    flipped, trust = fltrust(np.vstack([honest, -10 * honest[:1]]), reference, g0)
    assert trust[2] == 0.0 and np.allclose(flipped, fltrust(honest, reference, g0)[0])
    boosted, _ = fltrust(np.vstack([honest[:1], 100 * honest[1:]]), reference, g0)
    assert np.allclose(boosted, fltrust(honest, reference, g0)[0])  # every update is rescaled to the server's norm
    nothing, trust = fltrust(np.vstack([-honest]), reference, g0)
    assert np.array_equal(nothing, reference) and not trust.any()


def test_fltrust_needs_the_servers_update_and_the_model_it_sent():
    with pytest.raises(ValueError, match=exactly("fltrust needs the server's own update on its root data set")):
        aggregate_rows(np.ones((2, 3)), None, rule("fltrust"), reference=np.zeros(3))
    with pytest.raises(
        ValueError, match=exactly("fltrust needs the model the server sent (the reference of the updates)")
    ):
        aggregate_rows(np.ones((2, 3)), None, rule("fltrust"))


@pytest.mark.parametrize(
    "name,extra,expected",
    [
        # n:                          3  4  5  7  10  11
        ("median", {}, [1, 1, 2, 3, 4, 5]),
        ("trimmed-mean", {}, [0, 1, 1, 2, 3, 3]),  # floor(0.3 n) cut at each end
        ("trimmed-mean", {"trim_fraction": 0.1}, [0, 0, 0, 0, 1, 1]),
        ("multi-krum", {}, [0, 0, 1, 2, 3, 3]),  # f = floor(0.3 n) where n >= 2f + 3, else none
        ("bulyan", {}, [0, 0, 0, 1, 1, 2]),  # f lowered to what n >= 4f + 3 allows
        ("norm-bound", {}, [1, 1, 2, 3, 4, 5]),  # the median norm is an honest one's
        ("norm-bound", {"norm_bound": 5.0}, [None] * 6),
        ("fltrust", {}, [None] * 6),
    ],
)
def test_how_many_liars_each_rules_guarantee_allows(name, extra, expected):
    options = rule(name, byzantine_share=0.3, **extra)
    assert [options.tolerated(n) for n in (3, 4, 5, 7, 10, 11)] == expected


def test_fedc2is_client_keeps_its_own_model_and_the_peers_multi_krum_trusts():
    models = [{"w": np.array([5.0, 5.0])}] + [{"w": np.array([0.1 * i, 0.0])} for i in range(5)]
    models.append({"w": np.array([-90.0, 40.0])})  # a far peer
    kept, outcome = peers_kept(models, rule("multi-krum", byzantine_share=0.3))
    assert 0 in kept and 6 not in kept and len(kept) == 7 - 2  # f = floor(0.3 * 7) = 2 of the 7 left out
    assert outcome.selected == kept


# ---------------------------------------------------------------------------------------------- robustness properties
FINITE32 = st.floats(allow_nan=False, allow_infinity=False, width=32)
HONEST = st.floats(-1e3, 1e3, width=32)


@st.composite
def federations(draw, coordinates: int = 3):
    """(honest rows, lying rows): at least one honest client, fewer liars than half the clients, every liar's values
    any finite float32 (as a reply that passed the server's checks can carry)."""
    honest_n = draw(st.integers(1, 7))
    liars_n = draw(st.integers(0, honest_n - 1))
    honest = draw(hnp.arrays(np.float32, (honest_n, coordinates), elements=HONEST)).astype(np.float64)
    liars = draw(hnp.arrays(np.float32, (liars_n, coordinates), elements=FINITE32)).astype(np.float64)
    return honest, liars


def _within_honest_range(out, honest):
    low, high = honest.min(axis=0), honest.max(axis=0)
    return bool(np.all(out >= low - 1e-9 * np.abs(low)) and np.all(out <= high + 1e-9 * np.abs(high)))


@given(federations(), st.randoms())
def test_with_fewer_liars_than_honest_clients_the_median_stays_within_the_honest_range(federation, order):
    honest, liars = federation
    rows = [*honest, *liars]
    order.shuffle(rows)
    out, _ = aggregate_rows(np.array(rows), None, rule("median"))
    assert _within_honest_range(out, honest)


@given(federations(), st.randoms(), st.floats(0.0, 0.49))
def test_the_trimmed_mean_stays_within_the_honest_range_when_it_cuts_at_least_as_many_values_as_there_are_liars(
    federation, order, fraction
):
    honest, liars = federation
    n = len(honest) + len(liars)
    assume(int(fraction * n) >= len(liars))
    rows = [*honest, *liars]
    order.shuffle(rows)
    options = rule("trimmed-mean", trim_fraction=fraction, byzantine_share=0.0)  # fraction 0: no cut
    out, _ = aggregate_rows(np.array(rows), None, options)
    assert _within_honest_range(out, honest)


@given(st.data())
def test_multi_krum_keeps_no_liar_farther_from_every_honest_model_than_the_honest_models_are_from_each_other(data):
    """Blanchard et al.'s bound, per liar: with at most f liars among n >= 2f + 3 models, a liar's n - f - 2 nearest
    others include at least n - 2f - 1 honest models, so when its squared distance to every honest model exceeds
    (n - f - 2) / (n - 2f - 1) times the honest models' largest squared distance, its score exceeds every honest
    score and none of the (at most n - f) models kept is it."""
    f = data.draw(st.integers(0, 3), label="f")
    liars_n = data.draw(st.integers(0, f), label="liars")
    honest_n = data.draw(st.integers(2 * f + 3 - liars_n, 2 * f + 7), label="honest")
    honest = data.draw(hnp.arrays(np.float32, (honest_n, 3), elements=HONEST), label="honest rows").astype(float)
    liars = data.draw(hnp.arrays(np.float32, (liars_n, 3), elements=FINITE32), label="liar rows").astype(float)
    rows = np.concatenate([honest, liars])
    n = len(rows)
    assert n >= 2 * f + 3
    select = data.draw(st.integers(1, n - f), label="select")
    diameter = max((float(np.sum((a - b) ** 2)) for a in honest for b in honest), default=0.0)
    factor = (n - f - 2) / (n - 2 * f - 1)
    far = [
        honest_n + k
        for k, liar in enumerate(liars)
        if min(float(np.sum((liar - h) ** 2)) for h in honest) > factor * diameter * (1 + 1e-6) + 1e-6
    ]
    chosen = multi_krum(rows, byzantine=f, select=select)
    assert not set(far) & set(chosen), f"kept far liars {sorted(set(far) & set(chosen))}"

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

from strategies.robust import aggregate_rows, aggregate_states, bounded_model, multi_krum
from task.robust import RobustOptions


def rule(name: str, **kw) -> RobustOptions:
    return RobustOptions(aggregator=name, **kw)


def column_median(rows: np.ndarray) -> np.ndarray:
    out = []
    for column in np.asarray(rows, dtype=np.float64).T:
        values, n = sorted(column), len(column)
        out.append(values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2)
    return np.array(out)


def column_trimmed_mean(rows: np.ndarray, fraction: float) -> np.ndarray:
    n = len(rows)
    cut = int(fraction * n)
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


@given(ROWS, st.floats(0.0, 0.49))
def test_trimmed_mean_averages_what_is_left_after_cutting_each_end(rows, fraction):
    out, _ = aggregate_rows(rows, None, rule("trimmed-mean", trim_fraction=fraction))
    assert np.allclose(out, column_trimmed_mean(rows, fraction), rtol=1e-9, atol=1e-7)


def test_the_median_and_trimmed_mean_ignore_the_weights_the_mean_and_norm_bound_use():
    rows = np.array([[0.0], [1.0], [10.0]])
    heavy = [1, 1, 100]
    assert aggregate_rows(rows, heavy, rule("median"))[0] == pytest.approx([1.0])
    assert aggregate_rows(rows, heavy, rule("trimmed-mean", trim_fraction=0.34))[0] == pytest.approx([1.0])
    assert aggregate_rows(rows, heavy, rule("mean"))[0] == pytest.approx([1001 / 102])
    bounded, outcome = aggregate_rows(rows, heavy, rule("norm-bound", norm_bound=2.0), reference=np.zeros(1))
    assert bounded == pytest.approx([(0 + 1 + 100 * 2) / 102]) and outcome.clipped == [2]


@given(
    hnp.arrays(np.float64, st.tuples(st.integers(1, 8), st.integers(1, 5)), elements=st.floats(-50, 50)),
    st.data(),
)
def test_multi_krum_keeps_the_rows_with_the_lowest_krum_scores_and_averages_them_with_the_weights(rows, data):
    n = len(rows)
    share = data.draw(st.floats(0.0, 0.49))
    select = data.draw(st.integers(0, n))
    weights = np.array(data.draw(st.lists(st.integers(1, 9), min_size=n, max_size=n)), float)
    options = rule("multi-krum", krum_byzantine=share, krum_select=select)
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
    out, outcome = aggregate_rows(rows, weights, rule("norm-bound", norm_bound=bound), reference=reference)
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


@pytest.mark.parametrize("name", ["mean", "median", "trimmed-mean", "multi-krum", "norm-bound"])
def test_every_rule_computes_in_float64_whatever_the_models_dtype(name):
    """float32 models (what clients send) are averaged in float64: the rows come back float64 and equal to the rule
    on the same values given as float64, and the outcome counts the models."""
    rows32 = np.array([[1.0, 3.0], [1.0000001, 3.0000002], [1.0000002, 3.0000005], [1.0000004, 2.9999998]], np.float32)
    options = rule(name, trim_fraction=0.25, krum_byzantine=0.25, norm_bound=1e-7)
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
    _, outcome = aggregate_states(states, None, rule("multi-krum", krum_byzantine=0.25, krum_select=3))
    assert outcome.selected == [1, 2, 3]


@pytest.mark.parametrize("name", ["mean", "median", "norm-bound"])
def test_a_model_of_integer_arrays_only_is_aggregated_by_the_rule(name):
    """No floating array at all (nothing to measure a distance on): each integer array still follows the rule."""
    states = [{"count": np.array([c, 2 * c], np.int64)} for c in (1, 3, 20)]
    reference = {"count": np.array([0, 0], np.int64)}
    out, _ = aggregate_states(states, [1, 1, 2], rule(name), reference)
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
    kept, outcome = aggregate_states(states, [1, 3, 1], rule("multi-krum", krum_byzantine=0.34, krum_select=2))
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
    bounded, outcome = aggregate_states(states, weights, rule("norm-bound", norm_bound=1.0), reference)
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
    out, _ = aggregate_rows(np.array(rows), None, rule("trimmed-mean", trim_fraction=fraction))
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

"""What the differential-privacy mechanism must do (docs/privacy.md, task/privacy.py): every clipped update has
L2 norm at most the clip norm and keeps its direction, the noise has the declared scale (sigma·C/m on a central mean,
sigma·C on one client's local release) and is drawn once, and no noise with no clipping changes nothing."""

import math
import re

import numpy as np
import pytest
from flwr.app import RecordDict
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from client_app.privacy import clipped_reply
from strategies.privacy import central_round
from task.params import record_to_numpy, to_record
from task.privacy import (
    PrivacyConfigError,
    add_gaussian_noise,
    central_noise_std,
    clip_update,
    local_noise_std,
    local_release,
    model_delta,
    noisy_mean,
    update_norm,
)

ELEMENTS = st.floats(-1e4, 1e4, allow_nan=False, allow_infinity=False, width=32)
ARRAY = st.one_of(
    hnp.arrays(np.float32, hnp.array_shapes(min_dims=0, max_dims=3, max_side=5), elements=ELEMENTS),
    hnp.arrays(np.float64, hnp.array_shapes(min_dims=0, max_dims=3, max_side=5), elements=ELEMENTS),
)
UPDATES = st.dictionaries(st.sampled_from(["conv.weight", "conv.bias", "fc.weight", "fc.bias"]), ARRAY, min_size=1)
CLIPS = st.floats(1e-3, 1e3, allow_nan=False)


def flat(update):
    return np.concatenate([np.asarray(v, dtype=np.float64).ravel() for v in update.values()])


def sample_std_tolerance(n: int, std: float) -> float:
    """Six standard errors of a sample standard deviation of ``n`` normal draws (SE = std / sqrt(2 n))."""
    return 6 * std / math.sqrt(2 * n)


@settings(deadline=None)
@given(UPDATES)
def test_update_norm_is_the_norm_of_the_whole_update_flattened(update):
    assert update_norm(update) == pytest.approx(float(np.linalg.norm(flat(update))), rel=1e-9, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(UPDATES, CLIPS)
def test_every_clipped_update_is_within_the_clip_norm_and_keeps_its_direction(update, clip):
    clipped = clip_update(update, clip)
    assert sorted(clipped) == sorted(update)
    assert all(clipped[k].dtype == update[k].dtype and clipped[k].shape == update[k].shape for k in update)
    norm = update_norm(update)
    assert update_norm(clipped) <= clip * (1 + 1e-5)
    # one common factor min(1, C / ||Δ||) for the whole update
    scale = min(1.0, clip / norm) if norm > 0 else 1.0
    np.testing.assert_allclose(flat(clipped), scale * flat(update), rtol=1e-5, atol=1e-30)
    if norm <= clip:
        assert all(np.array_equal(clipped[k], update[k]) for k in update)


def test_an_update_above_the_bound_ends_exactly_on_it():
    update = {"a": np.full((10, 10), 3.0, np.float32), "b": np.full(4, -4.0, np.float32)}
    clipped = clip_update(update, 2.5)
    assert update_norm(clipped) == pytest.approx(2.5, rel=1e-6)


def test_integer_arrays_are_refused_by_name():
    with pytest.raises(PrivacyConfigError, match="num_batches_tracked"):
        clip_update({"w": np.ones(3, np.float32), "bn.num_batches_tracked": np.array(5)}, 1.0)


@pytest.mark.parametrize("clip", [0.0, -1.0, math.nan])
def test_a_clip_norm_that_is_not_positive_is_refused(clip):
    with pytest.raises(PrivacyConfigError, match="dp-clip"):
        clip_update({"w": np.ones(3)}, clip)


@pytest.mark.parametrize("sigma", [-0.1, math.inf, math.nan])
def test_a_negative_or_infinite_noise_multiplier_is_refused(sigma):
    with pytest.raises(PrivacyConfigError, match="dp-noise-multiplier"):
        local_noise_std(sigma, 1.0)


def test_noise_scales():
    """sigma·C/m on the mean of m clipped updates (the same as sigma·C on their sum), sigma·C on one release."""
    assert central_noise_std(2.0, 0.5, 4) == pytest.approx(2.0 * 0.5 / 4)
    assert local_noise_std(2.0, 0.5) == pytest.approx(2.0 * 0.5)
    with pytest.raises(PrivacyConfigError):
        central_noise_std(1.0, 1.0, 0)


def test_added_noise_is_centred_gaussian_of_the_declared_std():
    std, rng = 0.37, np.random.default_rng(7)
    zeros = {"a": np.zeros((300, 200), np.float64), "b": np.zeros(40_000, np.float64)}
    noise = flat(add_gaussian_noise(zeros, std, rng))
    n = noise.size
    assert abs(noise.mean()) < 6 * std / math.sqrt(n)
    assert abs(noise.std() - std) < sample_std_tolerance(n, std)
    # Gaussian, not e.g. uniform of the same variance: the fourth standardised moment of a normal is 3
    kurtosis = float(np.mean(noise**4) / noise.var() ** 2)
    assert abs(kurtosis - 3) < 6 * math.sqrt(24 / n)


def test_noise_is_drawn_from_the_given_generator():
    x = {"a": np.zeros(50)}
    same = [add_gaussian_noise(x, 1.0, np.random.default_rng(3))["a"] for _ in range(2)]
    other = add_gaussian_noise(x, 1.0, np.random.default_rng(4))["a"]
    assert np.array_equal(same[0], same[1]) and not np.array_equal(same[0], other)


def test_noisy_mean_adds_noise_of_std_sigma_clip_over_m_once():
    """m identical clipped updates: what the release adds to their mean is N(0, (sigmaC/m)²) - noise added a second
    time, per client, or scaled by the sum instead of the mean would be off by a factor sqrt(2), sqrt(m) or m."""
    m, sigma, clip = 5, 1.3, 0.8
    base = clip_update({"w": np.linspace(-1, 1, 120_000), "b": np.ones(30_000)}, clip)
    released = noisy_mean([base] * m, sigma, clip, np.random.default_rng(11))
    noise = flat(released) - flat(base)
    expected = sigma * clip / m
    assert abs(noise.mean()) < 6 * expected / math.sqrt(noise.size)
    assert abs(noise.std() - expected) < sample_std_tolerance(noise.size, expected)


def test_local_release_adds_noise_of_std_sigma_clip_to_the_clipped_change():
    sigma, clip = 0.7, 0.5
    reference = {"w": np.zeros(150_000)}
    model = {"w": np.full(150_000, 0.01)}  # change of norm ~3.9, clipped to 0.5
    released = local_release(model, reference, sigma, clip, np.random.default_rng(5))
    change = clip_update(model_delta(model, reference), clip)
    noise = released["w"] - (reference["w"] + change["w"])
    expected = sigma * clip
    assert abs(noise.mean()) < 6 * expected / math.sqrt(noise.size)
    assert abs(noise.std() - expected) < sample_std_tolerance(noise.size, expected)


@settings(max_examples=50, deadline=None)
@given(st.lists(UPDATES.filter(lambda u: len(u) >= 1), min_size=1, max_size=4))
def test_no_noise_and_no_clipping_is_the_plain_unweighted_mean(updates):
    keys = list(updates[0])
    updates = [{k: np.asarray(updates[0][k]) * (i + 1) for k in keys} for i in range(len(updates))]
    released = noisy_mean(updates, 0.0, math.inf, np.random.default_rng(0))
    for k in keys:
        expected = np.mean([np.asarray(u[k], dtype=np.float64) for u in updates], axis=0)
        np.testing.assert_allclose(released[k], expected, rtol=1e-6, atol=1e-3)


def test_no_noise_and_no_clipping_releases_the_model_itself():
    rng = np.random.default_rng(1)
    reference = {"w": rng.normal(size=(20, 10)), "b": rng.normal(size=10)}
    model = {k: v + rng.normal(scale=50, size=v.shape) for k, v in reference.items()}
    released = local_release(model, reference, 0.0, math.inf, rng)
    for k, value in model.items():
        np.testing.assert_allclose(released[k], value, rtol=1e-12, atol=1e-12)
    # a model's float32 arrays come back bit for bit in float32 (the release is not a rounding of the model:
    # peers of a run without noise and clipping see exactly what they would see without DP)
    small = {k: (v / 100).astype(np.float32) for k, v in model.items()}
    narrow = local_release(small, {k: v.astype(np.float32) for k, v in reference.items()}, 0.0, math.inf, rng)
    for k, exact in small.items():
        assert narrow[k].dtype == np.float32
        np.testing.assert_array_equal(narrow[k], exact)


def test_the_mean_weights_every_client_alike():
    a, b = {"w": np.array([0.0, 0.0])}, {"w": np.array([0.3, -0.3])}
    released = noisy_mean([a, b, b], 0.0, 10.0, np.random.default_rng(0))
    np.testing.assert_allclose(released["w"], [0.2, -0.2])


def test_updates_with_different_arrays_are_refused():
    with pytest.raises(PrivacyConfigError, match="different arrays"):
        noisy_mean([{"w": np.zeros(2)}, {"v": np.zeros(2)}], 1.0, 1.0, np.random.default_rng(0))
    with pytest.raises(PrivacyConfigError, match="at least one"):
        noisy_mean([], 1.0, 1.0, np.random.default_rng(0))


def test_a_reference_of_another_shape_is_refused():
    with pytest.raises(PrivacyConfigError, match="shape"):
        model_delta({"w": np.zeros(3)}, {"w": np.zeros(4)})
    with pytest.raises(PrivacyConfigError, match="lacks"):
        model_delta({"w": np.zeros(3)}, {})


def test_noise_without_a_clip_norm_is_refused():
    with pytest.raises(PrivacyConfigError, match="finite dp-clip"):
        central_noise_std(1.0, math.inf, 3)
    assert central_noise_std(0.0, math.inf, 3) == 0.0


def test_every_function_keeps_float32_arrays_float32():
    """Models travel as float32: a release in float64 would double the message and no longer load as sent."""
    rng = np.random.default_rng(0)
    model = {"w": rng.normal(size=(8, 4)).astype(np.float32)}
    reference = {"w": np.zeros((8, 4), np.float32)}
    assert model_delta(model, reference)["w"].dtype == np.float32
    assert add_gaussian_noise(model, 0.5, rng)["w"].dtype == np.float32
    assert noisy_mean([model, model], 1.0, 1.0, rng)["w"].dtype == np.float32
    assert local_release(model, reference, 1.0, 1.0, rng)["w"].dtype == np.float32


def test_the_mean_is_summed_in_double_precision():
    """A large update does not swallow a small one (float32 would lose the 1 next to 1e8)."""
    updates = [{"w": np.array([v], np.float32)} for v in (1e8, 1.0, -1e8)]
    released = noisy_mean(updates, 0.0, math.inf, np.random.default_rng(0))
    assert released["w"][0] == pytest.approx(1 / 3, rel=1e-6)


@pytest.mark.parametrize("std", [-1.0, math.inf, math.nan])
def test_a_noise_std_that_is_negative_or_not_finite_is_refused(std):
    with pytest.raises(PrivacyConfigError, match=r"^the noise std must be finite and >= 0, got"):
        add_gaussian_noise({"w": np.zeros(3)}, std, np.random.default_rng(0))


def test_errors_say_what_was_wrong_and_what_is_allowed():
    integer = (
        "differential privacy clips and noises floating-point arrays only; ['n'] are not (integer buffers such as "
        "BatchNorm's num_batches_tracked count the batches a client trained: keep them out of what a client sends "
        "under DP)"
    )
    with pytest.raises(PrivacyConfigError, match=f"^{re.escape(integer)}$"):
        clip_update({"n": np.array(3)}, 1.0)
    with pytest.raises(PrivacyConfigError, match=r"^w: shape \(3,\) differs from the reference's \(4,\)$"):
        model_delta({"w": np.zeros(3)}, {"w": np.zeros(4)})
    with pytest.raises(PrivacyConfigError, match=r"^the noisy average needs a denominator > 0 \(the cohort\), got 0$"):
        central_noise_std(1.0, 1.0, 0)
    with pytest.raises(
        PrivacyConfigError, match=r"^the noisy mean needs at least one client update \(or a template of its arrays\)$"
    ):
        noisy_mean([], 1.0, 1.0, np.random.default_rng(0))
    unbounded = "without a bound on the update, noise of any scale gives no guarantee"
    with pytest.raises(PrivacyConfigError, match=f"{re.escape(unbounded)}$"):
        local_noise_std(1.0, math.inf)


# ---------------------------------------------------------------------------------------------- a diverged update
def _overflowed(where: int) -> dict[str, np.ndarray]:
    """A model whose training overflowed at coordinate ``where`` of ``w`` (+inf) and ``where + 1`` of ``b`` (NaN)."""
    model = {"w": np.full(50, 0.3, np.float32), "b": np.full(10, -0.2, np.float32)}
    model["w"][where] = np.inf
    model["b"][(where + 1) % 10] = np.nan
    return model


def test_a_non_finite_update_leaves_as_the_reference_plus_noise_whatever_overflowed():
    """Clipping turns +-inf into NaN exactly where it overflowed, and noise does not hide a NaN: a release of such an
    update would show where.  It is the zero update instead, so the local release is finite and, for the same noise,
    the same whichever coordinates overflowed; the central client's clipped reply is the model it was sent."""
    reference = {"w": np.linspace(-1, 1, 50).astype(np.float32), "b": np.zeros(10, np.float32)}
    releases = [local_release(_overflowed(i), reference, 1.0, 0.5, np.random.default_rng(7)) for i in (3, 17, 41)]
    noise_only = local_release(reference, reference, 1.0, 0.5, np.random.default_rng(7))
    for release in releases:
        assert all(np.isfinite(v).all() for v in release.values())
        for k in reference:
            np.testing.assert_array_equal(release[k], noise_only[k], err_msg=k)
    sent = RecordDict({"arrays": to_record(reference)})
    for i in (3, 17):
        reply = clipped_reply(RecordDict({"arrays": to_record(_overflowed(i))}), sent, 0.5)
        for k, v in record_to_numpy(reply.array_records["arrays"]).items():
            np.testing.assert_array_equal(v, reference[k], err_msg=k)
    clipped = clip_update({"w": np.array([np.inf, 1.0]), "b": np.array([np.nan])}, 1.0)
    assert all(not v.any() for v in clipped.values())


def test_a_non_finite_update_in_a_central_round_counts_as_the_zero_update():
    """The server clips every reply again: one whose change is not finite (a client that skipped its own step)
    moves the average by nothing, wherever it overflowed."""
    state = {"w": np.zeros(40)}
    good = {"w": np.full(40, 0.01)}
    for where in (0, 33):
        bad = {"w": np.full(40, 0.01)}
        bad["w"][where] = -np.inf
        new, _ = central_round(state, [good, bad], ["w"], 1.0, 0.0, np.random.default_rng(0), denominator=2)
        np.testing.assert_allclose(new["w"], 0.01 / 2)

"""Central DP's two halves around one round (docs/privacy.md): the client's reply leaves clipped around the model
it was sent, without integer buffers; the server averages the updates unweighted, enforces the clip bound itself,
adds the noise once and reports the run's epsilon after every noised round so far."""

import math

import numpy as np
import pytest
from flwr.app import ConfigRecord, RecordDict

import task.privacy as task_privacy
from client_app.privacy import clipped_reply
from strategies.privacy import central_round
from task.params import record_to_numpy, to_record
from task.privacy import (
    PrivacyConfigError,
    Release,
    central_epsilon,
    local_epsilon,
    next_clip,
    noise_source,
    noisy_unclipped_share,
    releases_bound,
    update_noise_multiplier,
    update_norm,
)


def test_a_reply_leaves_clipped_around_the_model_the_message_brought_without_integer_buffers():
    rng = np.random.default_rng(0)
    sent = {"w": rng.normal(size=(30, 20)).astype(np.float32), "bn.num_batches_tracked": np.array(3)}
    trained = {"w": sent["w"] + 0.5, "bn.num_batches_tracked": np.array(8)}  # update of norm ~12
    message = RecordDict({"arrays": to_record(sent), "config": ConfigRecord({"server-round": 1})})
    reply = clipped_reply(RecordDict({"arrays": to_record(trained)}), message, 0.7)
    out = record_to_numpy(reply.array_records["arrays"])
    assert sorted(out) == ["w"] and out["w"].dtype == np.float32
    assert update_norm({"w": out["w"].astype(np.float64) - sent["w"]}) == pytest.approx(0.7, rel=1e-4)
    np.testing.assert_allclose(out["w"] - sent["w"], np.full_like(sent["w"], 0.7 / math.sqrt(600)), rtol=1e-3)


def test_a_small_update_leaves_as_it_is():
    sent = {"w": np.zeros(4, np.float32)}
    trained = {"w": np.array([0.1, 0.0, -0.1, 0.0], np.float32)}
    reply = clipped_reply(RecordDict({"arrays": to_record(trained)}), RecordDict({"arrays": to_record(sent)}), 1.0)
    np.testing.assert_array_equal(record_to_numpy(reply.array_records["arrays"])["w"], trained["w"])


def test_the_server_adds_noise_of_std_sigma_clip_over_m_to_the_unweighted_mean_once():
    m, n = 4, 200_000
    global_state = {"w": np.zeros(n), "count": np.array(5)}
    replies = [{"w": np.full(n, 0.001 * (i + 1))} for i in range(m)]  # norms 0.45 .. 1.8: the last two clipped
    new, released = central_round(global_state, replies, ["w"], 1.0, 0.8, np.random.default_rng(3))
    clipped = [min(1.0, 1.0 / (0.001 * (i + 1) * math.sqrt(n))) * 0.001 * (i + 1) for i in range(m)]
    noise = new["w"] - np.mean(clipped)
    expected = 0.8 * 1.0 / m
    assert abs(noise.mean()) < 6 * expected / math.sqrt(n)
    assert abs(noise.std() - expected) < 6 * expected / math.sqrt(2 * n)
    assert new["count"] == 5  # integer buffers are not released, so not updated
    assert "clients" not in released and released["noise-std"] == pytest.approx(expected)


def test_a_round_releases_only_what_is_noised_or_public_never_a_statistic_of_the_updates():
    """The round's record goes into rounds.json: the clip bound and the noise scale; no norm of an update, no
    un-noised aggregate (the largest update norm used to be there), not even how many replied."""
    state, replies = {"w": np.zeros(100)}, [{"w": np.full(100, 0.01 * (i + 1))} for i in range(3)]
    _, released = central_round(state, replies, ["w"], 1.0, 1.0, noise_source(), denominator=4.0)
    assert released == {"mode": "central", "clip": 1.0, "noise-std": pytest.approx(1.0 / 4)}
    _, adaptive = central_round(state, replies, ["w"], 1.0, 1.0, noise_source(), count_stddev=1.0)
    assert set(adaptive) - set(released) == {"unclipped-share"}  # the noised count, nothing else


def test_every_release_draws_fresh_noise_from_a_generator_seeded_by_the_operating_systems_csprng(monkeypatch):
    state, replies = {"w": np.zeros(1000)}, [{"w": np.full(1000, 0.01)}]
    a, _ = central_round(state, replies, ["w"], 1.0, 1.0, noise_source())
    b, _ = central_round(state, replies, ["w"], 1.0, 1.0, noise_source())
    assert not np.array_equal(a["w"], b["w"])  # nothing of the run config (nor the round) seeds it
    asked: list[int] = []

    def randbits(k: int) -> int:
        asked.append(k)
        return 12345

    monkeypatch.setattr(task_privacy.secrets, "randbits", randbits)
    c, _ = central_round(state, replies, ["w"], 1.0, 1.0, noise_source())
    d, _ = central_round(state, replies, ["w"], 1.0, 1.0, noise_source())
    assert asked == [128, 128] and np.array_equal(c["w"], d["w"])  # 128 bits of the CSPRNG are the whole seed


def test_no_noise_and_no_clipping_is_the_unweighted_mean():
    state = {"w": np.array([1.0, 2.0])}
    replies = [{"w": np.array([3.0, 2.0])}, {"w": np.array([1.0, 8.0])}, {"w": np.array([2.0, 5.0])}]
    new, _ = central_round(state, replies, ["w"], math.inf, 0.0, noise_source())
    np.testing.assert_allclose(new["w"], [2.0, 5.0])


def test_epsilon_composes_every_release_at_the_noise_and_sampling_it_was_made_with():
    """The accountant composes the releases as they were made, each at its own noise multiplier and rate (never one
    recomputed for all): alike releases are one event of their count, a Poisson round is its subsampled Gaussian,
    and one fixed-size round turns the run's bound into the one that holds against the coalition (replace-one)."""
    import dp_accounting

    def bound(*releases):
        return releases_bound(list(releases), 1e-5)

    three, neighbours = bound(Release(1.2, "all", 1.0, 2), Release(1.2, "all", 1.0, 1))
    assert three.epsilon == pytest.approx(central_epsilon(1.2, 3, 1e-5)) and neighbours == "add-or-remove-one"
    mixed, _ = bound(Release(1.2, "all", 1.0, 3), Release(1.0, "poisson", 0.4, 2))
    pld = dp_accounting.pld.PLDAccountant(value_discretization_interval=1e-4)
    pld.compose(dp_accounting.GaussianDpEvent(1.2), 3)
    pld.compose(dp_accounting.PoissonSampledDpEvent(0.4, dp_accounting.GaussianDpEvent(1.0)), 2)
    assert pld.get_epsilon(1e-5) - 1e-9 <= mixed.epsilon <= pld.get_epsilon(1e-5) + 5e-3
    fixed, neighbours = bound(Release(1.2, "all", 1.0, 3), Release(1.2, "fixed", 0.4, 1))
    assert neighbours == "replace-one" and fixed.accountant == "coalition"
    assert central_epsilon(1.2, 3, 1e-5) < fixed.epsilon <= local_epsilon(1.2, 4, 1e-5)
    local, neighbours = bound(Release(1.0, "local", 1.0, 2), Release(2.0, "local", 1.0, 1))
    assert neighbours == "replace-one-data-set"
    assert local_epsilon(2.0, 3, 1e-5) < local.epsilon < local_epsilon(1.0, 3, 1e-5)
    with pytest.raises(PrivacyConfigError, match=r"^local and central releases cannot be composed"):
        bound(Release(1.0, "local"), Release(1.0, "all"))


def test_the_bound_names_the_tighter_accountant_and_gives_both():
    full, _ = releases_bound([Release(1.0, "all", 1.0, 1)], 1e-5)
    assert full.accountant == "pld" and full.epsilon == full.pld < full.rdp
    poisson, _ = releases_bound([Release(1.0, "poisson", 0.1, 10)], 1e-5)
    assert poisson.accountant == "pld" and poisson.epsilon == poisson.pld < poisson.rdp


def test_a_message_without_a_model_cannot_be_clipped_against():
    reply = RecordDict({"arrays": to_record({"w": np.zeros(3, np.float32)})})
    with pytest.raises(PrivacyConfigError, match=r"^central DP clips the reply against the model the message brought"):
        clipped_reply(reply, RecordDict(), 1.0)


def test_a_float32_model_stays_float32_and_the_round_says_what_it_released():
    state = {"w": np.zeros(50, np.float32)}
    replies = [{"w": np.full(50, 0.01, np.float32)}]
    new, released = central_round(state, replies, ["w"], 1.0, 1.0, noise_source())
    assert new["w"].dtype == np.float32
    assert released["mode"] == "central"


def test_under_central_dp_the_models_buffers_stay_home():
    """BatchNorm's running statistics describe the client's inputs; under central DP they never leave (the server
    would otherwise noise a variance below zero), and the parameters are clipped as one vector without them."""
    sent: dict[str, np.ndarray] = {
        "w": np.zeros(4, np.float32),
        "bn.running_mean": np.zeros(2),
        "bn.running_var": np.ones(2),
    }
    trained: dict[str, np.ndarray] = {
        "w": np.full(4, 0.1, np.float32),
        "bn.running_mean": np.full(2, 9.0, np.float32),
        "bn.running_var": np.full(2, 4.0),
    }
    message = RecordDict({"arrays": to_record(sent)})
    home = frozenset({"bn.running_mean", "bn.running_var"})
    out = record_to_numpy(
        clipped_reply(RecordDict({"arrays": to_record(trained)}), message, 1.0, home).array_records["arrays"]
    )
    assert sorted(out) == ["w"]
    np.testing.assert_array_equal(out["w"], trained["w"])  # norm 0.2: the statistics' change did not eat the bound


def test_adaptive_clipping_splits_the_rounds_noise_between_the_update_and_the_count():
    """Andrew et al. 2021, Theorem 1: sum and count together are a Gaussian mechanism of sigma when
    z_update^-2 + (2 count_stddev)^-2 = sigma^-2."""
    z = update_noise_multiplier(1.5, 2.0)
    assert z**-2 + (2 * 2.0) ** -2 == pytest.approx(1.5**-2) and z > 1.5
    assert update_noise_multiplier(0.0, 2.0) == 0.0
    with pytest.raises(PrivacyConfigError, match=r"dp-clip-count-stddev, 0.5\) above half of the noise multiplier"):
        update_noise_multiplier(1.0, 0.5)  # 2 x 0.5 = sigma: the count would spend the whole round


def test_the_clip_bound_moves_toward_the_target_quantile_geometrically():
    assert next_clip(1.0, 0.9, 0.5, 0.2) == pytest.approx(math.exp(-0.2 * 0.4))  # too many unclipped: shrink
    assert next_clip(1.0, 0.1, 0.5, 0.2) == pytest.approx(math.exp(0.2 * 0.4))  # too many clipped: grow
    assert next_clip(2.0, 0.5, 0.5, 0.2) == 2.0


def test_an_adaptive_round_noises_the_update_with_the_multiplier_the_count_leaves():
    m, n = 5, 200_000
    sizes = (0.1, 0.2, 0.3, 2.0, 3.0)  # update norms: three below the clip bound 1
    replies = [{"w": np.full(n, s / math.sqrt(n))} for s in sizes]
    new, released = central_round({"w": np.zeros(n)}, replies, ["w"], 1.0, 1.0, noise_source(), count_stddev=2.0)
    expected_std = update_noise_multiplier(1.0, 2.0) * 1.0 / m
    assert released["noise-std"] == pytest.approx(expected_std) and expected_std > 1.0 / m
    noise = new["w"] - np.mean([min(s, 1.0) / math.sqrt(n) for s in sizes])
    assert abs(noise.std() - expected_std) < 6 * expected_std / math.sqrt(2 * n)
    assert released["unclipped-share"] != pytest.approx(3 / 5, abs=1e-9)  # the count is noised


def test_the_unclipped_share_is_the_noised_count_of_updates_within_the_bound_over_the_cohort():
    rng = np.random.default_rng(0)
    assert noisy_unclipped_share([0.5, 1.0, 1.5, 3.0], 1.0, 0.0, rng) == 0.5  # a norm equal to the bound is unclipped
    shares = [noisy_unclipped_share([0.5, 2.0], 1.0, 0.3, rng) for _ in range(20_000)]
    assert np.mean(shares) == pytest.approx(0.5, abs=0.01) and np.std(shares) == pytest.approx(0.15, rel=0.05)
    with pytest.raises(
        PrivacyConfigError, match=r"^the unclipped share needs at least one update \(or a denominator > 0\)$"
    ):
        noisy_unclipped_share([], 1.0, 0.3, rng)


def test_under_poisson_sampling_the_average_is_over_the_expected_cohort_and_an_empty_round_is_noise():
    """Poisson sampling's fixed denominator q N (McMahan et al. 2018): the release does not depend on how many
    clients were drawn, and a round nobody was drawn into still moves the model by noise of the same scale."""
    n = 200_000
    state = {"w": np.zeros(n, np.float32)}
    replies = [{"w": np.full(n, 0.5 / math.sqrt(n), np.float32)} for _ in range(3)]
    new, released = central_round(state, replies, ["w"], 1.0, 1.0, noise_source(), denominator=2.5)
    assert released["noise-std"] == pytest.approx(1.0 / 2.5)
    assert float(np.mean(new["w"])) == pytest.approx(3 * 0.5 / math.sqrt(n) / 2.5, abs=6 * 0.4 / math.sqrt(n))
    empty, released = central_round(state, [], ["w"], 1.0, 1.0, noise_source(), denominator=2.5)
    assert released["noise-std"] == pytest.approx(0.4) and float(np.std(empty["w"])) == pytest.approx(0.4, rel=0.01)

"""Central DP's two halves around one round (docs/privacy.md): the client's reply leaves clipped around the model
it was sent, without integer buffers; the server averages the updates unweighted, enforces the clip bound itself,
adds the noise once and reports the run's epsilon after every noised round so far."""

import math
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import ConfigRecord, RecordDict

from client_app.privacy import clipped_reply
from strategies.history import RoundLog
from strategies.privacy import account, central_round, noise_secret
from task.params import record_to_numpy, to_record
from task.privacy import PrivacyConfigError, central_epsilon, local_epsilon, update_norm

#: a fixed server secret, so that a test's noise repeats
SECRET = "0123456789abcdef0123456789abcdef"


def settings(**kw):
    return SimpleNamespace(**{"dp_clip": 1.0, "dp_noise_multiplier": 1.0, "dp_delta": 1e-5, "seed": 0, **kw})


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
    s = settings(dp_clip=1.0, dp_noise_multiplier=0.8)
    new, released = central_round(global_state, replies, ["w"], s, server_round=3, secret=SECRET)
    clipped = [min(1.0, 1.0 / (0.001 * (i + 1) * math.sqrt(n))) * 0.001 * (i + 1) for i in range(m)]
    noise = new["w"] - np.mean(clipped)
    expected = 0.8 * 1.0 / m
    assert abs(noise.mean()) < 6 * expected / math.sqrt(n)
    assert abs(noise.std() - expected) < 6 * expected / math.sqrt(2 * n)
    assert new["count"] == 5  # integer buffers are not released, so not updated
    assert released["clients"] == m and released["noise-std"] == pytest.approx(expected)
    assert released["largest-update-norm"] == pytest.approx(0.004 * math.sqrt(n))


def test_the_same_round_under_the_same_secret_draws_the_same_noise_and_another_round_or_secret_other_noise():
    state, replies = {"w": np.zeros(1000)}, [{"w": np.full(1000, 0.01)}]
    a, _ = central_round(state, replies, ["w"], settings(), 2, SECRET)
    b, _ = central_round(state, replies, ["w"], settings(), 2, SECRET)
    c, _ = central_round(state, replies, ["w"], settings(), 3, SECRET)
    d, _ = central_round(state, replies, ["w"], settings(), 2, noise_secret())
    assert np.array_equal(a["w"], b["w"]) and not np.array_equal(a["w"], c["w"])
    assert not np.array_equal(a["w"], d["w"])


def test_the_servers_secret_is_a_hex_string_of_at_least_128_bits():
    secret = noise_secret()
    assert len(secret) >= 32 and int(secret, 16) >= 0


def test_the_noise_cannot_be_regenerated_from_the_run_config():
    # every client receives the run config (its seed among it): two servers with the same settings must not draw
    # the same noise, or a client could subtract it from the released mean
    state, replies = {"w": np.zeros(1000)}, [{"w": np.full(1000, 0.01)}]
    a, _ = central_round(state, replies, ["w"], settings(seed=7), 1, noise_secret())
    b, _ = central_round(state, replies, ["w"], settings(seed=7), 1, noise_secret())
    assert not np.array_equal(a["w"], b["w"])


def test_no_noise_and_no_clipping_is_the_unweighted_mean():
    state = {"w": np.array([1.0, 2.0])}
    replies = [{"w": np.array([3.0, 2.0])}, {"w": np.array([1.0, 8.0])}, {"w": np.array([2.0, 5.0])}]
    new, _ = central_round(state, replies, ["w"], settings(dp_clip=0.0, dp_noise_multiplier=0.0), 1, SECRET)
    np.testing.assert_allclose(new["w"], [2.0, 5.0])


def test_epsilon_counts_every_noised_round_at_the_highest_sampling_rate():
    s = settings(dp_noise_multiplier=1.2)
    history = []
    for r, (population, cohort) in enumerate([(10, 10), (10, 10), (10, 10)], start=1):
        history.append(RoundLog(r))
        history[-1].extra["dp"] = account(history, {}, s, population, cohort)
    assert [h.extra["dp"]["noised-rounds"] for h in history] == [1, 2, 3]
    assert history[-1].extra["dp"]["epsilon"] == pytest.approx(central_epsilon(1.2, 3, 1e-5, 10, 10))
    assert history[-1].extra["dp"]["neighbours"] == "add-or-remove-one"
    history.append(RoundLog(4))  # a round without a release (no valid replies) is not counted
    history.append(RoundLog(5))
    sampled = account(history, {}, s, population=10, cohort=4)
    assert sampled["noised-rounds"] == 4 and sampled["neighbours"] == "replace-one"
    # once a cohort was drawn, every round counts as replace-one at the worst rate (here: every client)
    assert sampled["epsilon"] == pytest.approx(local_epsilon(1.2, 4, 1e-5))
    later = [RoundLog(1), RoundLog(2)]
    later[0].extra["dp"] = account(later[:1], {}, s, 10, 4)
    assert account(later, {}, s, 10, 2)["epsilon"] == pytest.approx(central_epsilon(1.2, 2, 1e-5, 10, 4))


def test_noised_running_variances_are_projected_back_to_zero_or_more():
    state = {"bn.running_var": np.full(5000, 0.05), "w": np.zeros(5000)}
    replies = [{"bn.running_var": np.full(5000, 0.05), "w": np.zeros(5000)}]
    new, _ = central_round(state, replies, ["bn.running_var", "w"], settings(), 1, SECRET, variances=["bn.running_var"])
    assert new["bn.running_var"].min() == 0.0 and (new["bn.running_var"] > 0.05).any()  # noisy, never negative
    assert new["w"].min() < 0  # other arrays keep their noise as drawn


def test_a_message_without_a_model_cannot_be_clipped_against():
    reply = RecordDict({"arrays": to_record({"w": np.zeros(3, np.float32)})})
    with pytest.raises(PrivacyConfigError, match=r"^central DP clips the reply against the model the message brought"):
        clipped_reply(reply, RecordDict(), 1.0)


def test_a_float32_model_stays_float32_and_the_round_says_what_it_released():
    state = {"w": np.zeros(50, np.float32), "bn.running_var": np.ones(50, np.float32)}
    replies = [{"w": np.full(50, 0.01, np.float32), "bn.running_var": np.ones(50, np.float32)}]
    new, released = central_round(state, replies, ["w", "bn.running_var"], settings(), 1, SECRET, ["bn.running_var"])
    assert new["w"].dtype == np.float32 and new["bn.running_var"].dtype == np.float32
    assert released["mode"] == "central"
    assert account([RoundLog(1)], released, settings(dp_delta=1e-6), 4, 4)["delta"] == 1e-6


def test_the_worst_sampling_rate_is_the_highest_share_of_clients_not_the_largest_cohort():
    s = settings()
    history = [RoundLog(1), RoundLog(2)]
    history[0].extra["dp"] = account(history[:1], {}, s, population=20, cohort=5)  # a quarter of 20
    now = account(history, {}, s, population=10, cohort=4)  # 40 % of 10: the worse rate
    assert now["epsilon"] == pytest.approx(central_epsilon(1.0, 2, 1e-5, 10, 4))

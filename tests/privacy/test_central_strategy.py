"""Central DP in the base strategy's round (``strategies.privacy.central_aggregate``, called by the default
``aggregate``): the new global model is the noised, clipped, unweighted mean of exactly the round's valid train
replies around the model the server sent; integer buffers and BatchNorm's running statistics never leave; the round
reports the epsilon of every release made, each as it was drawn (Poisson sampling by default, or a fixed-size
cohort)."""

import numpy as np
import pytest

from strategies.base import PersonalizedStrategy
from strategies.privacy import central_round
from task.config import parse_settings
from task.params import record_to_numpy
from task.privacy import central_epsilon, noise_source
from tests.strategy_harness import build_as, drive

NODES = {101: 0, 102: 1, 103: 2, 104: 3}


def run_round(cfg):
    base = {"method": "fedavg", "dp-mode": "central", "fraction-train": 0.5, "dp-sampling": "fixed", "min-nodes": 4}
    settings = parse_settings({**base, **cfg})
    strategy = build_as(PersonalizedStrategy, settings)
    sent: dict[int, dict[str, np.ndarray]] = {}
    before = {k: v.copy() for k, v in strategy.global_state.items()}

    def answer(server_round, node, phase, content):
        if phase == "train" and server_round == 2:
            sent[node] = record_to_numpy(content.array_records["arrays"])

    drive(strategy, NODES, [2], answer)
    return settings, strategy, before, [sent[n] for n in sorted(sent)]


def test_a_central_dp_round_releases_the_clipped_unweighted_mean_of_the_valid_replies_and_its_epsilon():
    _, strategy, before, replies = run_round({"dp-noise-multiplier": 0.0, "dp-clip": 0.5})
    keys = strategy.released_keys()
    assert keys and not any(k.endswith(("num_batches_tracked", "running_mean", "running_var")) for k in keys)
    assert len(replies) == 2  # half of the four nodes trained
    expected, released = central_round(before, replies, keys, 0.5, 0.0, noise_source(), denominator=2)
    assert sorted(strategy.global_state) == sorted(expected)
    for k, v in expected.items():
        np.testing.assert_allclose(strategy.global_state[k], v, rtol=1e-6, atol=1e-7, err_msg=k)
    for k in strategy.model_info.buffer_keys:  # statistics of the clients' inputs stay home: the server's never move
        np.testing.assert_array_equal(strategy.global_state[k], before[k], err_msg=k)
    dp = strategy.history[-1].extra["dp"]
    assert {k: dp[k] for k in released} == released and dp["epsilon"] == float("inf")  # no noise: no guarantee
    assert (dp["population"], dp["cohort"], dp["rate"], dp["sampling"]) == (4, 2, 0.5, "fixed")
    assert dp["neighbours"] == "replace-one" and dp["noised-rounds"] == 1


def test_the_noise_on_the_mean_has_std_sigma_clip_over_m():
    _, strategy, before, replies = run_round({"dp-noise-multiplier": 3.0, "dp-clip": 0.5})
    keys = strategy.released_keys()
    mean, _ = central_round(before, replies, keys, 0.5, 0.0, noise_source())
    noise = np.concatenate([(strategy.global_state[k] - mean[k]).ravel() for k in keys])
    assert noise.std() == pytest.approx(3.0 * 0.5 / 2, rel=0.03) and abs(noise.mean()) < 0.03
    dp = strategy.history[-1].extra["dp"]
    assert dp["noise-std"] == pytest.approx(0.75) and dp["noise-multiplier"] == 3.0
    assert dp["epsilon"] == pytest.approx(central_epsilon(3.0, 1, 1e-5, 0.5, "fixed"))


def test_under_poisson_sampling_each_client_is_drawn_alone_and_the_mean_is_over_the_expected_cohort():
    """The default under central DP: every client in a round with probability fraction-train, independently (the
    cohort's size varies, and may be 0), the noised sum over q N = 2 whatever it was, accounted by PLD."""
    settings = parse_settings({"method": "fedavg", "dp-mode": "central", "fraction-train": 0.5, "min-nodes": 4})
    strategy = build_as(PersonalizedStrategy, settings)
    drawn: list[list[int]] = []

    def answer(server_round, node, phase, content):
        if phase == "train":
            drawn[-1].append(node)

    for r in range(1, 41):
        drawn.append([])
        drive(strategy, NODES, [r], answer)
    sizes = [len(d) for d in drawn]
    assert min(sizes) < 2 < max(sizes)  # 40 rounds of Binomial(4, 0.5): the size varies (all equal: p < 1e-10)
    dp = [r.extra["dp"] for r in strategy.history]
    assert len(dp) == 40 and all(d["noise-std"] == pytest.approx(1.0 / 2) for d in dp)  # also an empty round
    assert all(d["sampling"] == "poisson" and d["rate"] == 0.5 and "cohort" not in d for d in dp)
    assert dp[-1]["accountant"] == "pld" and dp[-1]["neighbours"] == "add-or-remove-one"
    assert dp[-1]["epsilon"] == pytest.approx(central_epsilon(1.0, 40, 1e-5, 0.5, "poisson"))


def test_without_dp_the_default_aggregate_is_the_example_weighted_mean():
    settings = parse_settings({"method": "fedavg", "min-nodes": 4, "seed": 3})
    strategy = build_as(PersonalizedStrategy, settings)
    sent: dict[int, tuple[dict[str, np.ndarray], int]] = {}

    def answer(server_round, node, phase, content):
        if phase == "train":
            sent[node] = (record_to_numpy(content.array_records["arrays"]), int(content["metrics"]["num-examples"]))

    drive(strategy, NODES, [1], answer)
    total = sum(n for _, n in sent.values())
    for k, v in strategy.global_state.items():
        if np.issubdtype(v.dtype, np.floating):
            mean = sum(arrays[k].astype(np.float64) * n for arrays, n in sent.values()) / total
            np.testing.assert_allclose(v, mean, rtol=1e-5, atol=1e-6, err_msg=k)
    assert "dp" not in strategy.history[-1].extra


def test_a_run_without_dp_does_no_dp_accounting(tmp_path, monkeypatch):
    """dp-mode off: no epsilon is computed before a round (the accountant costs time every round); with central DP
    the budget is accounted before round 1 leaves."""
    from strategies import privacy
    from tests.strategy_harness import strategy

    for mode in ("off", "central"):
        calls: list = []

        def releases_bound(*args, calls=calls, **kwargs):
            calls.append(args)
            return privacy.Bound(0.0, "none", 0.0, 0.0), "add-or-remove-one"

        monkeypatch.setattr(privacy, "releases_bound", releases_bound)
        s = strategy("fedavg", **{"dp-mode": mode})
        s.results_dir = tmp_path / mode
        drive(s, {1: 0, 2: 1, 3: 2, 4: 3}, 1)
        assert bool(calls) is (mode == "central"), mode


def test_a_journaled_round_is_released_again_only_against_the_model_it_was_taken_against(tmp_path, caplog):
    """A resumed run that repeats a journaled round releases the journaled model again (and says so); if the model
    the round starts from is not the one the release was taken against, the run stops rather than release a second
    noisy view of the round."""
    import logging

    from strategies.exchange import RunAborted
    from strategies.privacy import central_aggregate

    strategy = build_as(
        PersonalizedStrategy, parse_settings({"method": "fedavg", "dp-mode": "central", "min-nodes": 4})
    )
    strategy.results_dir = tmp_path
    start = {k: v.copy() for k, v in strategy.global_state.items()}
    drive(strategy, NODES, 1)
    released = {k: v.copy() for k, v in strategy.global_state.items()}

    strategy.global_state = {k: v.copy() for k, v in start.items()}  # resumed from the checkpoint before round 1
    with caplog.at_level(logging.INFO):
        central_aggregate(strategy, 1, [])
    said = "[dp] round 1: released again as journaled before the resume (the new replies are unused)"
    assert said in [r.getMessage() for r in caplog.records]
    for k, v in released.items():
        np.testing.assert_array_equal(strategy.global_state[k], v)

    strategy.global_state = {k: v + 1 for k, v in start.items()}  # another model than the release's
    with pytest.raises(RunAborted) as stopped:
        central_aggregate(strategy, 1, [])
    assert str(stopped.value) == (
        f"round 1's release in {tmp_path / 'checkpoints' / 'dp-journal'} was taken against another model than the "
        "checkpoint this run resumed from: releasing a new one would show two noisy views of the round"
    )

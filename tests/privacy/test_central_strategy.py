"""Central DP in the base strategy's round (``strategies.privacy.central_aggregate``, called by the default
``aggregate``): the new global model is the noised, clipped, unweighted mean of exactly the round's valid train
replies around the model the server sent, with the server's own secret, the round's number and the model's
running variances kept non-negative; integer buffers never leave; the round reports the epsilon of its own
population and cohort."""

import numpy as np

from strategies.base import PersonalizedStrategy
from strategies.history import RoundLog
from strategies.privacy import account, central_round
from task.config import parse_settings
from task.params import record_to_numpy
from tests.strategy_harness import build_as, drive

NODES = {101: 0, 102: 1, 103: 2, 104: 3}


def test_a_central_dp_round_releases_the_noised_mean_of_the_valid_replies_and_its_epsilon():
    cfg = {"method": "fedavg", "dp-mode": "central", "dp-noise-multiplier": 5.0, "dp-clip": 1.0}
    settings = parse_settings({**cfg, "fraction-train": 0.5, "min-nodes": 4, "seed": 3})
    strategy = build_as(PersonalizedStrategy, settings)
    sent: dict[int, dict[str, np.ndarray]] = {}
    before = {k: v.copy() for k, v in strategy.global_state.items()}

    def answer(server_round, node, phase, content):
        if phase == "train" and server_round == 2:
            sent[node] = record_to_numpy(content.array_records["arrays"])

    drive(strategy, NODES, [2], answer)
    keys = strategy.released_keys()
    assert keys and not any(k.endswith("num_batches_tracked") for k in keys)  # integer buffers stay home
    assert len(sent) == 2  # half of the four nodes trained
    variances = [k for k in keys if k.endswith("running_var")]
    assert variances
    expected, released = central_round(
        before, [sent[n] for n in sorted(sent)], keys, settings, 2, strategy.noise_secret, variances
    )
    assert sorted(strategy.global_state) == sorted(expected)
    for k, v in expected.items():
        np.testing.assert_array_equal(strategy.global_state[k], v, err_msg=k)
    assert min(float(strategy.global_state[k].min()) for k in variances) == 0.0  # noise this large went below 0
    dp = strategy.history[-1].extra["dp"]
    assert dp == account([RoundLog(2)], released, settings, population=4, cohort=2)
    assert dp["population"] == 4 and dp["cohort"] == 2 and dp["epsilon"] > 0


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

"""Central differential privacy end to end through Flower (docs/privacy.md): FedAvg with the defaults a user gets
plus ``dp-mode='central'`` releases clipped updates and reports (epsilon, delta) round by round and in the summary;
no noise and no clipping is the run without DP; a method without a guarantee refuses DP at start-up."""

import math
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from server_app.runner import RunFailed
from task.privacy import central_epsilon
from tests.privacy.dp_run import reported_dp, same_accuracy_every_round

pytestmark = pytest.mark.slow


def test_fedavg_with_the_defaults_and_central_dp(simulation):
    summary = simulation.run({"method": "fedavg", "dp-mode": "central", "num-server-rounds": 2, "min-nodes": 4})
    expected = [central_epsilon(1.0, r, 1e-5, population=4, cohort=4) for r in (1, 2)]
    dp = reported_dp(summary, "central", "add-or-remove-one", expected)
    assert [d["noised-rounds"] for d in dp] == [1, 2]
    for d in dp:  # every client clipped its update to dp-clip = 1 before it left; noise sigma C / m on the mean
        assert d["clients"] == 4 and d["largest-update-norm"] <= 1.0 + 1e-5
        assert d["noise-std"] == pytest.approx(1.0 * 1.0 / 4)


def test_no_noise_and_no_clipping_is_the_run_without_dp(simulation):
    """Equal client sizes (``train-samples`` caps every client at 60 examples), so FedAvg's example weights are
    the unweighted mean central DP takes; then the two runs must train the same models."""
    base = {"method": "fedavg", "num-server-rounds": 2, "min-nodes": 4, "partition": "iid", "train-samples": 60}
    plain = simulation.run(base)
    private = simulation.run({**base, "dp-mode": "central", "dp-clip": 0.0, "dp-noise-multiplier": 0.0})
    assert private["epsilon"] == math.inf  # no noise: no guarantee, and the summary says so
    models = [load_file(str(Path(s["results"]) / "models" / "server" / "global.safetensors")) for s in (plain, private)]
    floating = [k for k, v in models[0].items() if np.issubdtype(v.dtype, np.floating)]
    assert len(floating) >= 10
    for k in floating:
        np.testing.assert_allclose(models[1][k], models[0][k], rtol=1e-4, atol=1e-5, err_msg=k)
    same_accuracy_every_round(plain, private)


def test_a_method_without_a_guarantee_refuses_dp_at_start_up(simulation):
    with pytest.raises(RunFailed) as err:
        simulation.run({"method": "fedcac", "dp-mode": "central", "num-server-rounds": 1})
    assert "dp-mode='central' is not available for method 'fedcac'" in err.value.output
    assert "masks" in err.value.output

"""Central differential privacy end to end through Flower (docs/privacy.md): FedAvg with the defaults a user gets
plus ``dp-mode='central'`` releases clipped updates and reports (epsilon, delta) round by round and in the summary;
no noise and no clipping is the run without DP; a method without a guarantee refuses DP at start-up."""

import math
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from server_app.runner import RunFailed, summary_line
from task.checkpoint import load_checkpoint
from task.privacy import calibrate_central, central_epsilon
from tests.privacy.dp_run import reported_dp, same_accuracy_every_round

pytestmark = pytest.mark.slow


def test_fedavg_with_the_defaults_and_central_dp(engine):
    summary = engine.run({"method": "fedavg", "dp-mode": "central", "num-server-rounds": 2, "min-nodes": 4})
    expected = [central_epsilon(1.0, r, 1e-5) for r in (1, 2)]
    dp = reported_dp(summary, "central", "add-or-remove-one", expected)
    assert [d["noised-rounds"] for d in dp] == [1, 2]
    for d in dp:  # noise sigma C / m on the mean; the tighter accountant (PLD, no sampling) is named
        assert d["cohort"] == 4 and d["clip"] == 1.0 and d["noise-std"] == pytest.approx(1.0 * 1.0 / 4)
        assert d["accountant"] == "pld" and d["epsilon-pld"] < d["epsilon-rdp"]
    assert summary["dp-accountant"] == "pld" and "by the PLD accountant" in summary["log"]


def test_no_noise_and_no_clipping_is_the_run_without_dp(engine):
    """Equal client sizes (``train-samples`` caps every client at 60 examples), so FedAvg's example weights are
    the unweighted mean central DP takes; then the two runs must train the same models.  A model without BatchNorm:
    under central DP its running statistics stay on the clients (test_central_dp_keeps_every_normalisation...)."""
    base = {"method": "fedavg", "num-server-rounds": 2, "min-nodes": 4, "partition": "iid", "train-samples": 60}
    base["model"] = "lenet"
    plain = engine.run(base)
    private = engine.run({**base, "dp-mode": "central", "dp-clip": 0.0, "dp-noise-multiplier": 0.0})
    assert private["epsilon"] == math.inf  # no noise: no guarantee, and the summary says so
    models = [load_file(str(Path(s["results"]) / "models" / "server" / "global.safetensors")) for s in (plain, private)]
    floating = [k for k, v in models[0].items() if np.issubdtype(v.dtype, np.floating)]
    assert len(floating) >= 10
    for k in floating:
        np.testing.assert_allclose(models[1][k], models[0][k], rtol=1e-4, atol=1e-5, err_msg=k)
    same_accuracy_every_round(plain, private)


def test_a_method_without_a_guarantee_refuses_dp_at_start_up(engine):
    with pytest.raises(RunFailed) as err:
        engine.run({"method": "fedcac", "dp-mode": "central", "num-server-rounds": 1})
    assert "dp-mode='central' is not available for method 'fedcac'" in err.value.output
    assert "masks" in err.value.output


@pytest.mark.parametrize("nodes", [2, 10])
def test_central_dp_on_the_default_model_keeps_every_normalisation_statistic_valid(engine, nodes):
    """The default cnn has BatchNorm.  Noise on its running variances used to leave them at zero or below (a loss
    of 8e5 after one round on two nodes, NaN in conv.4.running_var by round 10): under central DP they never leave
    the clients, and each client recomputes them on its own data before scoring a model."""
    summary = engine.run(
        {"method": "fedavg", "dp-mode": "central", "num-server-rounds": 2, "min-nodes": nodes, "train-samples": 60},
        num_supernodes=nodes,
    )
    assert summary["rounds"] == 2 and summary["clients"] == nodes and summary["failures"] == 0
    assert math.isfinite(summary["personal-loss"])  # finite; large, with this much noise on 2 nodes
    folder = Path(summary["results"]) / "models"
    server = load_file(str(folder / "server" / "global.safetensors"))
    variances = [k for k in server if k.endswith("running_var")]
    assert variances
    for k in variances:  # never noised, never averaged: the server's copy is the initial model's
        np.testing.assert_array_equal(server[k], np.ones_like(server[k]), err_msg=k)
    clients = sorted((folder / "clients").glob("client-*.safetensors"))
    assert len(clients) == nodes
    for path in clients:  # every client's model was scored (and saved) with statistics of its own data
        model = load_file(str(path))
        assert all(np.isfinite(v).all() for v in model.values() if np.issubdtype(v.dtype, np.floating))
        assert all((model[k] > 0).all() and not np.array_equal(model[k], server[k]) for k in variances), path.name


def test_a_target_epsilon_is_reached_in_the_planned_rounds_and_a_maximum_stops_the_run_cleanly(engine):
    target = engine.run(
        {"method": "fedavg", "dp-mode": "central", "dp-target-epsilon": 8.0, "num-server-rounds": 2, "min-nodes": 4}
    )
    assert 7.99 <= target["epsilon"] <= 8.0 and target["dp-noise-multiplier"] == pytest.approx(
        calibrate_central(8.0, 1e-5, 2)
    )
    maximum = (central_epsilon(1.0, 1, 1e-5) + central_epsilon(1.0, 2, 1e-5)) / 2
    stopped = engine.run(
        {"method": "fedavg", "dp-mode": "central", "dp-max-epsilon": maximum, "num-server-rounds": 3, "min-nodes": 4}
    )
    assert stopped["rounds"] == 1 and stopped["epsilon"] <= maximum
    assert stopped["stopped"].startswith("round 2 would take epsilon to")
    assert f"STOPPED: {stopped['stopped']}" in str(summary_line(stopped["log"]))
    assert load_checkpoint(Path(stopped["results"]) / "checkpoints")[0] == 1  # the last complete round's

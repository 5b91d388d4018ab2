"""BatchNorm under differential privacy (docs/privacy.md, "BatchNorm"): a client never scores a model with
normalisation statistics it received (central DP: they never leave a client; local DP: they arrive noised, and
noise made variances zero or negative before): it recomputes them on its own training split.  Without DP the
statistics the model brought are used as they are."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, RecordDict
from torch import nn

from client_app.privacy import buffers
from task.params import state_to_numpy, to_record
from task.train import evaluate, norm_statistics
from tests.client_kit import users_client


def test_the_statistics_are_the_mean_and_unbiased_variance_of_the_data_and_nothing_else_moves():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(3, 4), nn.BatchNorm1d(4), nn.Dropout(0.5), nn.Linear(4, 2))
    x = torch.randn(50, 3) * 3 + 1
    weights = {k: v.clone() for k, v in model.state_dict().items() if "running" not in k and "num_batches" not in k}
    assert norm_statistics(model, x, batch_size=64) == 1  # in train mode: dropout is off while it runs
    hidden = model[0](x).detach()
    torch.testing.assert_close(model[1].running_mean, hidden.mean(0))
    torch.testing.assert_close(model[1].running_var, hidden.var(0, unbiased=True))
    assert model[1].momentum == 0.1 and model.training and model[2].training  # the mode kept
    for k, v in weights.items():
        torch.testing.assert_close(model.state_dict()[k], v)


def test_several_batches_average_the_batches_statistics():
    model = nn.Sequential(nn.BatchNorm1d(2))
    x = torch.cat([torch.zeros(4, 2), torch.full((4, 2), 2.0)])
    norm_statistics(model, x, batch_size=4)
    torch.testing.assert_close(model[0].running_mean, torch.full((2,), 1.0))  # (0 + 2) / 2
    torch.testing.assert_close(model[0].running_var, torch.zeros(2))  # each batch is constant


def test_a_model_without_batchnorm_or_data_is_left_as_it_is():
    assert norm_statistics(nn.Sequential(nn.Linear(2, 2)), torch.zeros(3, 2)) == 0
    bn = nn.Sequential(nn.BatchNorm1d(2))
    assert norm_statistics(bn, torch.zeros(0, 2)) == 0
    assert norm_statistics(bn, torch.ones(1, 2)) == 0  # one sample has no variance
    torch.testing.assert_close(bn[0].running_var, torch.ones(2))


def message_with_broken_statistics(client):
    """The global model as the server sends it, its running variances zero (what noise used to leave)."""
    model = client.reset_model()
    state = state_to_numpy(model.state_dict())
    for k in state:
        if k.endswith("running_var"):
            state[k] = np.zeros_like(state[k])
    return RecordDict({"arrays": to_record(state), "config": ConfigRecord({"server-round": 2})})


@pytest.mark.parametrize(
    "method,mode,noise",
    [("fedavg", "central", 1.0), ("fedavg", "central", 0.0), ("pfedlia", "local", 1.0), ("fedrod", "central", 1.0)],
)
def test_under_dp_a_client_scores_models_with_statistics_of_its_own_data(method, mode, noise):
    """The personalized model, and a global model of the method's own (FedRoD's), both scored on this client's
    statistics."""
    client = users_client(method, **{"dp-mode": mode, "dp-noise-multiplier": noise})
    content = message_with_broken_statistics(client)
    client.begin(content)
    metrics = client.evaluation(content)
    model = client.personal_model(content)
    norm_statistics(model, client.data.x_train)
    expected_loss, expected_acc = evaluate(model, client.data.x_test, client.data.y_test)
    assert metrics["personal-loss"] == pytest.approx(expected_loss) and metrics["personal-acc"] == expected_acc
    assert math.isfinite(metrics["personal-loss"]) and metrics["personal-loss"] < 100
    glob = client.global_model(content, client.personal_model(content))
    if method == "fedrod":  # a global model of its own, scored the same way
        assert isinstance(glob, nn.Module)
        norm_statistics(glob, client.data.x_train)
        expected_loss, expected_acc = evaluate(glob, client.data.x_test, client.data.y_test)
        assert metrics["global-loss"] == pytest.approx(expected_loss) and metrics["global-acc"] == expected_acc


@pytest.mark.parametrize("cfg", [{}, {"dp-mode": "local", "dp-noise-multiplier": 0.0}])
def test_without_dp_or_without_noise_the_statistics_the_model_brought_are_used(cfg):
    method = "pfedlia" if cfg else "fedavg"
    client = users_client(method, **cfg)
    content = message_with_broken_statistics(client)
    client.begin(content)
    metrics = client.evaluation(content)
    loss, _ = evaluate(client.personal_model(content), client.data.x_test, client.data.y_test)
    assert metrics["personal-loss"] == pytest.approx(loss)


def test_the_buffers_that_stay_home_under_central_dp_are_the_models_statistics_and_counters():
    client = users_client("fedavg", None, **{"dp-mode": "central"})
    model = client.reset_model()
    expected = {name for name, _ in model.named_buffers()}
    assert buffers(client.settings) == expected and any(k.endswith("running_var") for k in expected)

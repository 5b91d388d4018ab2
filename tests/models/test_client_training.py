"""A client trains with the run's settings: the optimizer, its momentum and weight decay, the learning rate, the batch
size and the epochs a user sets all reach the training loop; each round shuffles its batches anew, and a round that
runs again (a resumed run) repeats exactly; the peak memory a client reports is in megabytes."""

import os
from pathlib import Path

import numpy as np
import pytest
from flwr.app import ConfigRecord, RecordDict

from client_app.base import ClientMethod
from server_app.app import build_strategy
from strategies.base import PersonalizedStrategy
from task.config import parse_settings
from task.models import build_model
from task.params import load_record, record_to_numpy
from task.train import train
from tests.client_kit import users_client

#: one batch per epoch (larger than any partition), so the result does not depend on how the batches are shuffled
WHOLE = 1_000_000

SETTINGS: dict[str, dict[str, bool | float | int | str]] = {
    # what `flwr run . --run-config "method='fedavg'"` gives (the cnn with BatchNorm, SGD with momentum 0.9) but
    # three epochs of whole-partition batches, so momentum acts from the second step on
    "user defaults": {"local-epochs": 3, "batch-size": WHOLE},
    "sgd without momentum, with weight decay": {
        "model": "mlp",
        "momentum": 0.0,
        "weight-decay": 0.05,
        "lr": 0.2,
        "local-epochs": 3,
        "batch-size": WHOLE,
    },
    "adam with weight decay": {
        "model": "mlp",
        "optimizer": "adam",
        "lr": 0.01,
        "weight-decay": 0.01,
        "local-epochs": 2,
        "batch-size": WHOLE,
    },
}


def node(**cfg) -> tuple[PersonalizedStrategy, ClientMethod]:
    """A FedAvg strategy and the client of partition 0 for the run config ``cfg``."""
    return build_strategy(parse_settings({"method": "fedavg", **cfg})), users_client("fedavg", **cfg)


def train_message(strategy: PersonalizedStrategy, rnd: int) -> RecordDict:
    """Round ``rnd``'s train message: the strategy's initial global model."""
    content = strategy.payload(1, rnd, "train")
    content["config"] = ConfigRecord({"server-round": rnd})
    return content


def train_reply(strategy, c, rnd: int) -> dict[str, np.ndarray]:
    """The model partition 0 sends back for round ``rnd``, starting from the strategy's initial global model."""
    content = train_message(strategy, rnd)
    c.begin(content)
    return record_to_numpy(c.train(content).array_records["arrays"])


@pytest.mark.parametrize("name", SETTINGS)
def test_a_client_trains_with_the_runs_optimizer_settings(name):
    strategy, c = node(**SETTINGS[name])
    sent = train_reply(strategy, c, 1)
    s = parse_settings({"method": "fedavg", **SETTINGS[name]})
    expected = build_model(s.model, s.in_channels, s.image_size, s.num_classes)
    load_record(expected, strategy.payload(1, 1, "train").array_records["arrays"])
    train(
        expected,
        c.data.x_train,
        c.data.y_train,
        epochs=s.local_epochs,
        batch_size=s.batch_size,
        lr=s.lr,
        momentum=s.momentum,
        weight_decay=s.weight_decay,
        optimizer=s.optimizer,
    )
    want = {k: v.detach().numpy() for k, v in expected.state_dict().items()}
    assert sorted(sent) == sorted(want)
    for k, value in want.items():
        np.testing.assert_allclose(sent[k], value, rtol=1e-4, atol=1e-5, err_msg=k)
    initial = record_to_numpy(strategy.payload(1, 1, "train").array_records["arrays"])
    assert any(not np.allclose(sent[k], initial[k]) for k in sent)  # it did train


def test_each_round_shuffles_its_batches_anew_and_a_round_run_again_repeats_exactly():
    """The user's defaults (mini-batches of 20): the same start, the same data, another round's batches."""
    strategy, c = node()
    first = train_reply(strategy, c, 1)
    again = train_reply(strategy, node()[1], 1)
    second = train_reply(strategy, c, 2)
    assert all(np.array_equal(first[k], again[k]) for k in first)
    assert any(not np.allclose(first[k], second[k]) for k in first if first[k].dtype.kind == "f")


def _status_mb(field: str) -> float:
    with Path("/proc/self/status").open() as f:  # kB
        return next(int(line.split()[1]) for line in f if line.startswith(f"{field}:")) / 1024


def test_the_peak_memory_a_client_reports_is_in_megabytes():
    """This process is the client: the peak it reports is at least its resident set before the round (within 1 %:
    the kernel updates its counters lazily) and at most the machine's memory.  (Not the process's own high-water
    mark: a peak can be inherited from the process this one was started from.)"""
    strategy, c = node()
    content = train_message(strategy, 1)
    c.begin(content)
    before = _status_mb("VmRSS")
    peak = c.train(content).metric_records["metrics"]["peak-rss-mb"]
    assert isinstance(peak, float)
    machine = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**20
    assert 0.99 * before <= peak <= machine

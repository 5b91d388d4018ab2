"""MNIST-1D (Greydanus & Kobak, ICML 2024): generated offline by the ``mnist1d`` package, of any size, the same from
the same size, the process's global random generators left as they were; the run-config keys that reach it; every
partitioner on it; and its default model, a small 1-D CNN, far above a linear model on it."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from task.config import parse_settings
from task.data import DataSettings, load_centralized, load_client_data
from task.data.catalogue import MNIST1D_SAMPLES
from task.data.sources import make_mnist1d
from task.models import build_model
from task.options import ConfigConflict
from task.train import evaluate, train

SMALL = 1000


@pytest.fixture(scope="module")
def small():
    return load_centralized("mnist1d", samples=SMALL)


def test_signals_of_40_points_as_many_of_each_digit_as_asked(small):
    assert small.x.shape == (SMALL, 40) and small.x.dtype == np.float32
    assert small.y.dtype == np.int64 and np.bincount(small.y).tolist() == [SMALL // 10] * 10
    assert abs(float(small.x.mean())) < 0.05 and abs(float(small.x.std()) - 1.0) < 0.05  # standardised
    assert len(np.unique(small.x, axis=0)) == SMALL  # every signal drawn anew, no copies
    assert small.info.in_channels == 40 and small.info.image_size == 0 and small.info.num_classes == 10


def test_the_same_size_gives_the_same_signals_and_another_size_other_ones(small):
    again_x, again_y = make_mnist1d(SMALL)
    np.testing.assert_array_equal(again_x, small.x)
    np.testing.assert_array_equal(again_y, small.y)
    other_x, _ = make_mnist1d(SMALL + 10)
    assert other_x.shape == (SMALL + 10, 40)


def test_labels_are_shuffled_not_sorted(small):
    assert len(set(small.y[:20].tolist())) > 3


def test_generating_leaves_the_global_random_generators_as_they_were():
    """The package seeds numpy's and Python's global generators (42) and draws from them: a process that generates
    the data set between two draws gets the draws it would have got without it."""
    np.random.seed(123)  # noqa: NPY002 - the global generator is what is checked
    random.seed(123)
    expected = (np.random.rand(3).tolist(), random.random())  # noqa: NPY002
    np.random.seed(123)  # noqa: NPY002
    random.seed(123)
    make_mnist1d(20)
    assert (np.random.rand(3).tolist(), random.random()) == expected  # noqa: NPY002


def test_the_size_is_a_run_config_key_and_a_bad_size_is_refused_before_any_data():
    settings = parse_settings({"dataset": "mnist1d", "mnist1d-samples": 2000})
    assert settings.data.mnist1d_samples == 2000 and settings.model == "cnn1d"  # 'auto' picks the 1-D CNN
    assert parse_settings({"dataset": "mnist1d"}).data.mnist1d_samples == MNIST1D_SAMPLES
    assert parse_settings({"dataset": "mnist1d", "model": "mlp"}).model == "mlp"
    with pytest.raises(ValueError, match=r"mnist1d-samples must be a positive multiple of 10 \(10 digits\), got 2005"):
        parse_settings({"dataset": "mnist1d", "mnist1d-samples": 2005})
    with pytest.raises(ValueError, match=r"'mnist1d-samples' must be an integer >= 10"):
        parse_settings({"dataset": "mnist1d", "mnist1d-samples": 0})
    with pytest.raises(ConfigConflict, match=r"data-copies=2 makes shifted copies of images.*mnist1d-samples"):
        parse_settings({"dataset": "mnist1d", "data-copies": 2})
    with pytest.raises(ConfigConflict, match=r"feature-shift=2 transforms images"):
        parse_settings({"dataset": "mnist1d", "feature-shift": 2})
    with pytest.raises(ValueError, match=r"model 'cnn' needs image inputs but dataset 'mnist1d' gives vectors"):
        parse_settings({"dataset": "mnist1d", "model": "cnn"})
    with pytest.raises(ValueError, match=r"model 'cnn1d' reads vectors as a signal but dataset 'digits' gives images"):
        parse_settings({"model": "cnn1d"})


def test_the_default_size_gives_large_test_sets_at_10_clients_and_room_for_1000_clients():
    """At the default size one error moves a client's accuracy by less than a point at 10 clients (a test split of
    more than 100 signals), and 1,000 clients of unequal sizes still get the 10 samples partition
    'quantity-dirichlet' promises each."""
    from task.data.partitioners import partitioner_for

    iid = DataSettings(dataset="mnist1d", partition="iid")
    assert min(len(load_client_data(iid, i, 10).y_test) for i in range(10)) > 100
    many = DataSettings(dataset="mnist1d", partition="quantity-dirichlet", alpha=0.5, size_sigma=1.0)
    part, _ = partitioner_for(many, 1000)
    sizes = part.partition_sizes
    assert len(sizes) == 1000 and sizes.min() >= 10 and sizes.sum() == MNIST1D_SAMPLES
    last = load_client_data(many, 999, 1000)
    assert last.num_train >= 1 and last.x_train.shape[1:] == (40,)


@pytest.mark.parametrize(
    "partition,extra",
    [
        ("iid", {}),
        ("dirichlet", {"alpha": 0.3}),
        ("quantity-dirichlet", {"alpha": 0.5}),
        ("pathological", {"classes_per_client": 2}),
        ("planted-clusters", {"num_clusters": 2}),
        ("planted-clusters-noisy", {"num_clusters": 2}),
        ("two-source", {}),
    ],
)
def test_every_partition_shares_out_mnist1d(partition, extra):
    settings = DataSettings(dataset="mnist1d", partition=partition, mnist1d_samples=SMALL, seed=1, **extra)
    clients = [load_client_data(settings, i, 6) for i in range(6)]
    trained = np.concatenate([c.x_train.numpy() for c in clients])
    assert trained.shape[1:] == (40,) and len(np.unique(trained, axis=0)) == len(trained)  # disjoint training data
    for c in clients:
        assert c.num_classes == 10 and len(c.y_test) > 0 and c.x_test.shape[1:] == (40,)
        assert not set(map(bytes, c.x_test.numpy())) & set(map(bytes, c.x_train.numpy()))  # held out
    if partition == "pathological":
        assert all(len(np.unique(np.concatenate([c.y_train, c.y_val, c.y_test]))) <= 2 for c in clients)
    if partition == "iid":
        assert max(c.num_train for c in clients) - min(c.num_train for c in clients) <= 10


def test_the_1d_cnn_learns_mnist1d_far_above_a_linear_model(small):
    """MNIST-1D's point (Greydanus & Kobak): a linear model stays near a third, a small CNN learns far more (about
    94 % with 4,000 training signals).  Both trained alike on the same 800 signals, scored on the other 200."""
    x, y = torch.from_numpy(small.x), torch.from_numpy(small.y)
    scores = {}
    for name in ("softmax", "cnn1d"):
        model = build_model(name, 40, 0, 10, seed=0)
        train(model, x[:800], y[:800], epochs=15, batch_size=20, lr=0.05, seed=0)
        scores[name] = evaluate(model, x[800:], y[800:])[1]
    assert scores["softmax"] < 0.4 and scores["cnn1d"] > 0.5
    assert scores["cnn1d"] > scores["softmax"] + 0.2

"""Bad input gets a clear error naming the key and the allowed values."""

import pytest

from task.config import parse_settings
from task.data import DataSettings, load_client_data


def test_defaults_parse():
    s = parse_settings({})
    assert s.method == "fedavg" and s.model == "cnn" and s.data.dataset == "digits"


@pytest.mark.parametrize("cfg,pattern", [
    ({"method": "fedfoo"}, r"unknown method 'fedfoo' \(run-config key 'method'\); allowed: .*fedavg"),
    ({"dataset": "imagenet"}, r"unknown dataset 'imagenet' \(run-config key 'dataset'\); allowed: .*digits"),
    ({"partition": "zipf"}, r"unknown partition 'zipf' \(run-config key 'partition'\); allowed: .*dirichlet"),
    ({"model": "vgg"}, r"unknown model 'vgg' \(run-config key 'model'\); allowed"),
    ({"alpha": 0.0}, r"alpha must be > 0"),
    ({"alpha": -1.0}, r"alpha must be > 0"),
    ({"partition": "two-source", "mixture": "1:2"}, r"unknown mixture '1:2'.*allowed"),
    ({"fraction-train": 0.0}, r"'fraction-train' must be in \(0, 1\]"),
    ({"num-server-rounds": 0}, r"'num-server-rounds' must be >= 1"),
    ({"local-epochs": 1.5}, r"'local-epochs' must be an integer"),
    ({"lr": "fast"}, r"'lr' must be a number"),
    ({"fraction-evaluate": 1.5}, r"'fraction-evaluate' must be in \(0, 1\]"),
    ({"eval-every": 0}, r"'eval-every' must be >= 1"),
    ({"data-copies": 0}, r"'data-copies' must be >= 1"),
])
def test_bad_run_config(cfg, pattern):
    with pytest.raises(ValueError, match=pattern):
        parse_settings(cfg)


def test_more_clients_than_samples():
    with pytest.raises(ValueError, match=r"num-partitions=1000 is too many for dataset 'digits' with 1797 samples"):
        load_client_data(DataSettings(partition="iid"), 0, 1000)


def test_partition_id_out_of_range():
    with pytest.raises(ValueError, match="partition-id 5 out of range"):
        load_client_data(DataSettings(partition="iid"), 5, 5)


def test_missing_local_copy():
    with pytest.raises(ValueError, match="data-dir '/nonexistent/mnist' does not exist"):
        load_client_data(DataSettings(dataset="mnist", partition="iid", data_dir="/nonexistent/mnist"), 0, 2)

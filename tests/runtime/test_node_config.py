"""What a node's own config (``--node-config``) decides for the client it runs: torch's thread count (else the run's
``client-threads``), the device, and where the data comes from; a node config that names no data source is refused
with both ways to give one, each with a command line to copy; the node's cache-dir says where its splits are kept."""

import pytest
import torch
from flwr.app import Context, RecordDict

from task.config import parse_settings
from task.methods import METHODS, load_object
from tests.client_kit import users_client, users_context


def node_client(node_config: dict, **run_config):
    return users_client("fedavg", node_config, **run_config)


@pytest.fixture
def torch_threads():
    """Restores the process's thread count after the test (conftest sets 1 for the whole suite)."""
    before = torch.get_num_threads()
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize(
    "node, run, expected",
    [
        ({}, {"client-threads": 2}, 2),  # the run's setting
        ({"num-threads": 3}, {}, 3),  # the node's own wins over the run's default (1)
        ({"num-threads": 1}, {"client-threads": 3}, 1),  # ... and over the run's setting
    ],
)
def test_a_client_runs_torch_on_the_threads_its_node_or_else_the_run_asks_for(torch_threads, node, run, expected):
    torch.set_num_threads(expected + 1)  # the process starts elsewhere
    node_client(node, **run)
    assert torch.get_num_threads() == expected


@pytest.mark.parametrize("node, run", [({"num-threads": 0}, {}), ({}, {"client-threads": 0})])
def test_zero_threads_leaves_torchs_own_count(torch_threads, node, run):
    torch.set_num_threads(3)
    node_client(node, **run)
    assert torch.get_num_threads() == 3


def test_a_device_the_node_names_is_the_one_used():
    assert node_client({"device": "cpu"}).device == torch.device("cpu")
    with pytest.raises(ValueError, match="invalid device 'no-such-device'"):
        node_client({"device": "no-such-device"})


def test_a_node_config_without_a_data_source_says_both_ways_to_give_one():
    ctx = Context(run_id=1, node_id=7, node_config={"partition-id": 0}, state=RecordDict(), run_config={})
    with pytest.raises(ValueError, match="data-path") as err:
        load_object(METHODS["fedavg"].client)(ctx, parse_settings({"method": "fedavg"}))
    assert str(err.value) == (
        "node config needs 'partition-id' and either 'num-partitions' (a partition of the embedded data; set by the "
        "simulation, or --node-config \"partition-id=0 num-partitions=3\" on a SuperNode) or 'data-path' (the node's "
        "own .npz file: --node-config \"partition-id=0 data-path='/data/me.npz'\")"
    )


def test_a_client_given_no_settings_reads_them_from_the_run_config():
    run: dict[str, float | int] = {"lr": 0.25, "local-epochs": 3}
    client = load_object(METHODS["fedavg"].client)(users_context("fedavg", None, **run))
    assert client.settings == parse_settings({"method": "fedavg", **run})


def test_a_node_keeps_its_splits_where_its_cache_dir_says_or_nowhere(tmp_path, monkeypatch):
    """The node's ``cache-dir``, else ``$PFLOWER_CACHE_DIR/partitions``; ``""`` keeps nothing on disk."""
    monkeypatch.setenv("PFLOWER_CACHE_DIR", str(tmp_path / "default"))
    monkeypatch.chdir(tmp_path)

    def kept() -> list[str]:
        return sorted(str(p.parent.relative_to(tmp_path)) for p in tmp_path.rglob("*.npz"))

    node_client({"cache-dir": str(tmp_path / "node")})
    assert kept() == ["node"]
    node_client({})
    assert kept() == ["default/partitions", "node"]
    node_client({"cache-dir": ""}, seed=5)  # another run's splits, rebuilt in the process only
    assert kept() == ["default/partitions", "node"]

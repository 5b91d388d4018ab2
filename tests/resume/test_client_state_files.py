"""State a client keeps between rounds (client_app/state.py: ``client.kept.save`` / ``.load``) comes back from its
files, in a new process, with every array's shape and values: a resumed run or a restarted SuperNode continues with
the default model (BatchNorm's 0-d num_batches_tracked included)."""

from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, RecordDict

from client_app.base import ClientMethod, load_shared
from task.config import parse_settings
from task.models import build_model
from task.params import state_to_numpy


class KeepsAModel(ClientMethod):
    keeps: ClassVar[Mapping[str, str]] = {"model": "a whole model", "head": "a classifier"}


def message(config: dict[str, Any]) -> RecordDict:
    """A message's content with this config (what the ClientApp hands ``begin``)."""
    return RecordDict({"config": ConfigRecord(config)})


def node(tmp_path, run_config):
    ctx = Context(
        run_id=1,
        node_id=7,
        node_config={"partition-id": 0, "num-partitions": 4, "state-dir": str(tmp_path)},
        state=RecordDict(),
        run_config=run_config,
    )
    client = KeepsAModel(ctx, parse_settings(run_config))
    client.begin(message({"run-key": "run-1"}))
    return client


def test_state_of_the_default_model_comes_back_from_disk_in_a_fresh_node(tmp_path):
    settings = parse_settings({})  # the defaults a user gets: the cnn, with BatchNorm
    net = build_model(settings.model, settings.in_channels, settings.image_size, settings.num_classes, seed=1)
    net.train()(torch.randn(4, settings.in_channels, settings.image_size, settings.image_size))
    saved = state_to_numpy(net.state_dict())
    assert any(v.shape == () for v in saved.values())  # the case this pins
    node(tmp_path, {}).kept.save("model", saved)
    back = node(tmp_path, {}).kept.load("model")  # a new Context: only the files remain
    assert back is not None and {k: v.shape for k, v in back.items()} == {k: v.shape for k, v in saved.items()}
    for k in saved:
        np.testing.assert_array_equal(back[k], saved[k])
    fresh = build_model(settings.model, settings.in_channels, settings.image_size, settings.num_classes, seed=2)
    fresh.load_state_dict({k: torch.from_numpy(v) for k, v in back.items()})  # loads without error


def test_a_message_reads_the_state_saved_before_its_round_and_old_rounds_are_pruned(tmp_path):
    """After a crash in the middle of round r, clients have saved round r's state but the server resumes from its
    checkpoint of round r - 1: round r, run again, must start from the state saved before it."""

    def in_round(r, **run_config):
        client = node(tmp_path, run_config)
        client.begin(message({"run-key": "run-1", "server-round": r}))
        return client

    for r in (1, 2, 3):
        in_round(r).kept.save("head", {"w": np.full(2, float(r))})
    assert in_round(3).kept.load("head")["w"].tolist() == [2.0, 2.0]  # round 3 again: round 2's state
    assert in_round(4).kept.load("head")["w"].tolist() == [3.0, 3.0]
    assert in_round(9).kept.load("head")["w"].tolist() == [3.0, 3.0]  # rounds without training in between
    assert in_round(1).kept.load("head") is None  # nothing was saved before round 1
    folder = tmp_path / "run-1" / "client-0"
    assert sorted(p.name for p in folder.iterdir()) == ["head.round-00002.safetensors", "head.round-00003.safetensors"]
    for r in (4, 5, 6, 7):  # checkpoint-every 3: the server may resume up to 3 rounds back
        in_round(r, **{"checkpoint-every": 3}).kept.save("head", {"w": np.full(2, float(r))})
    assert len(list(folder.iterdir())) == 4
    assert in_round(5, **{"checkpoint-every": 3}).kept.load("head")["w"].tolist() == [4.0, 4.0]


def test_a_client_keeps_only_the_state_its_method_declares(tmp_path):
    client = node(tmp_path, {})
    for name in ("body", "mask"):
        with pytest.raises(ValueError, match=r"KeepsAModel keeps \['head', 'model'\] between rounds, not '" + name):
            client.kept.save(name, {"w": np.zeros(1)})
        with pytest.raises(ValueError, match="declare it in its 'keeps'"):
            client.kept.load(name)
    assert not (tmp_path / "run-1").exists()  # nothing was written


@pytest.mark.parametrize(
    "node_dir,suggested,run_key,where",
    [
        ("node", "server", "run-1", "node/run-1/client-0"),  # the node's own folder wins
        (None, "server", "run-1", "server/run-1/client-0"),  # else the folder the server suggests
        (None, None, "run-1", None),  # no folder: kept in the node's memory only
        ("node", "server", None, None),  # no run key: nothing on disk either
    ],
)
def test_a_client_keeps_its_state_files_where_the_node_or_else_the_server_says(
    tmp_path, monkeypatch, node_dir, suggested, run_key, where
):
    """``<state-dir>/<run-key>/client-<id>``: the node config's ``state-dir`` wins over the one the server's message
    suggests; without either, or without a run key, the state stays in the node's memory and nothing is written."""
    monkeypatch.chdir(tmp_path)
    node_config: dict[str, bool | float | int | str] = {"partition-id": 0, "num-partitions": 4}
    if node_dir:
        node_config["state-dir"] = str(tmp_path / node_dir)
    ctx = Context(run_id=1, node_id=7, node_config=node_config, state=RecordDict(), run_config={})
    client = KeepsAModel(ctx, parse_settings({}))
    config: dict[str, Any] = {"server-round": 1}
    if suggested:
        config["state-dir"] = str(tmp_path / suggested)
    if run_key:
        config["run-key"] = run_key
    client.begin(message(config))
    client.kept.save("head", {"w": np.ones(2)})
    written = sorted(str(p.parent.relative_to(tmp_path)) for p in tmp_path.rglob("*.safetensors"))
    assert written == ([where] if where else [])
    assert sorted(ctx.state.array_records) == ["head"]  # in memory in every case


def test_a_client_that_declares_nothing_kept_is_told_so_in_full():
    class KeepsNothing(ClientMethod):
        pass

    ctx = Context(
        run_id=1, node_id=7, node_config={"partition-id": 0, "num-partitions": 4}, state=RecordDict(), run_config={}
    )
    said = "KeepsNothing keeps nothing between rounds, not 'model': declare it in its 'keeps'"
    with pytest.raises(ValueError, match=r"^KeepsNothing keeps") as err:
        KeepsNothing(ctx, parse_settings({})).kept.save("model", {"w": np.zeros(1)})
    assert str(err.value) == said


@pytest.mark.parametrize("arrays", [None, {}])
def test_a_message_without_model_arrays_leaves_the_model_as_it_was(arrays):
    """A message that brings no arrays (an evaluate message of a method without a global model), or an empty record,
    loads nothing: the client's model keeps its weights."""

    model = torch.nn.Linear(3, 2)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    content = RecordDict() if arrays is None else RecordDict({"arrays": ArrayRecord()})
    load_shared(model, content)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k


def test_a_state_file_is_written_beside_its_final_name_and_renamed_into_place(tmp_path, temporary_files):
    """The file is written under a temporary name in the state folder itself and renamed over its final name: a
    rename within one folder (one file system) is atomic, so a crash leaves the earlier round's file whole."""
    node(tmp_path, {}).kept.save("model", {"w": np.ones(3, np.float32)})
    (written,) = temporary_files
    (final,) = tmp_path.rglob("*.safetensors")
    assert written.parent == final.parent and not written.exists()  # renamed within its folder, nothing left

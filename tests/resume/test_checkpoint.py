"""Checkpoint files (task/checkpoint.py): every kind of plain value comes back equal, generators continue where
they stopped, objects are refused both ways, and a broken or older checkpoint fails with its reason."""

import json
import random

import numpy as np
import pytest
import torch

from strategies.outcome import RoundLog
from task.checkpoint import FORMAT_VERSION, CheckpointError, from_tree, load_checkpoint, save_checkpoint, to_tree


def sample_state():
    rng, gen = random.Random(3), np.random.default_rng(4)
    rng.random(), gen.random(5)  # mid-stream
    return {
        "ints": {3: [1, 2], 10: (4, 5.5)},
        "set": {7, 8},
        "frozen": frozenset({"a"}),
        "nan": float("nan"),
        "array": np.arange(6, dtype=np.float32).reshape(2, 3),
        "labels": np.array([1, 2], np.int64),
        "scalar": np.float64(2.5),
        "rng": rng,
        "gen": gen,
        "nested": {"balances": {0: 93, 1: 100}, "best": {0: None, 1: 0.25}},
        "none": None,
        "flag": True,
    }


def test_a_state_tree_comes_back_equal_and_generators_continue():
    state = sample_state()
    tree, arrays = to_tree(state)
    json.dumps(tree)  # the tree itself is plain JSON
    back = from_tree(json.loads(json.dumps(tree)), arrays)
    assert back["ints"] == {3: [1, 2], 10: (4, 5.5)} and back["set"] == {7, 8} and back["frozen"] == frozenset({"a"})
    assert np.isnan(back["nan"]) and back["scalar"] == 2.5 and isinstance(back["scalar"], np.float64)
    np.testing.assert_array_equal(back["array"], state["array"])
    assert back["array"].dtype == np.float32 and back["labels"].dtype == np.int64
    assert [back["rng"].random() for _ in range(3)] == [state["rng"].random() for _ in range(3)]
    np.testing.assert_array_equal(back["gen"].random(4), state["gen"].random(4))
    assert back["nested"] == state["nested"] and back["none"] is None and back["flag"] is True


@pytest.mark.parametrize(
    "obj", [object(), RoundLog(1), torch.nn.Linear(3, 2), torch.zeros(2), np.array([object()], dtype=object)]
)
def test_objects_are_refused_both_ways(obj):
    """A state() holds plain values; restore() rebuilds its objects, so a file never names a class to create."""
    with pytest.raises(TypeError):
        to_tree({"x": obj})
    evils: list[dict] = [{"$object": "os:system", "fields": {}}, {"$module": {}}, {"$tensor": {"$array": "a0"}}]
    for evil in evils:
        with pytest.raises(CheckpointError, match="unknown node"):
            from_tree(evil, {"a0": np.zeros(1)})


def test_files_are_atomic_and_broken_ones_are_refused(tmp_path):
    tree, arrays = to_tree(sample_state())
    for r in (1, 2, 3):
        save_checkpoint(tmp_path, r, tree, arrays, {"method": "fedavg"})
    assert (tmp_path / "LATEST").read_text() == "round-00003"
    assert sorted(p.name for p in tmp_path.glob("round-*")) == ["round-00002", "round-00003"]  # keep 2
    r, state, meta = load_checkpoint(tmp_path)
    assert r == 3 and meta == {"method": "fedavg"} and state["nested"] == sample_state()["nested"]
    doc = json.loads((tmp_path / "round-00003" / "state.json").read_text())
    doc["format-version"] = FORMAT_VERSION + 1
    (tmp_path / "round-00003" / "state.json").write_text(json.dumps(doc))
    with pytest.raises(CheckpointError, match="newer pflower"):
        load_checkpoint(tmp_path)
    doc["format-version"] = FORMAT_VERSION - 1  # the attributes of a strategy (format 1) cannot be resumed
    (tmp_path / "round-00003" / "state.json").write_text(json.dumps(doc))
    with pytest.raises(
        CheckpointError, match=f"format version 1, written by an older pflower.*version {FORMAT_VERSION}"
    ):
        load_checkpoint(tmp_path)
    save_checkpoint(tmp_path, 4, tree, arrays, {})
    data = (tmp_path / "round-00004" / "arrays.safetensors").read_bytes()
    (tmp_path / "round-00004" / "arrays.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="SHA-256"):
        load_checkpoint(tmp_path)
    with pytest.raises(CheckpointError, match="no checkpoint"):
        load_checkpoint(tmp_path / "nothing-here")


def test_zero_dimensional_arrays_keep_their_shape_through_the_files(tmp_path):
    """BatchNorm's num_batches_tracked is a 0-d tensor: a checkpointed state of a model with BatchNorm (the default
    cnn) must load back into that model."""
    bn = torch.nn.BatchNorm1d(3)
    bn(torch.randn(4, 3))  # num_batches_tracked = 1
    stored = {k: v.numpy() for k, v in bn.state_dict().items()}
    tree, arrays = to_tree({"count": np.array(7, np.int64), "stored": stored})
    save_checkpoint(tmp_path, 1, tree, arrays, {})
    _, back, _ = load_checkpoint(tmp_path)
    assert back["count"].shape == () and back["count"] == 7
    assert {k: v.shape for k, v in back["stored"].items()} == {k: tuple(v.shape) for k, v in bn.state_dict().items()}
    fresh = torch.nn.BatchNorm1d(3)
    fresh.load_state_dict({k: torch.from_numpy(v) for k, v in back["stored"].items()})
    assert fresh.num_batches_tracked is not None and int(fresh.num_batches_tracked) == 1
    assert fresh.running_mean is not None and bn.running_mean is not None
    assert torch.equal(fresh.running_mean, bn.running_mean)

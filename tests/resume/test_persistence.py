"""Persistence (strategies/persistence.py): when checkpoints are written, what a resumed run must agree on, the
crash ``stop-after`` simulates, and the server's saved models."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file

from strategies.persistence import (
    RESUMABLE_CHANGES,
    SimulatedCrash,
    checkpoint_due,
    checkpoint_meta,
    read_checkpoint,
    save_server_models,
    stop_if_asked,
    write_checkpoint,
)
from task.checkpoint import CheckpointError
from task.config import parse_settings
from task.export import read_manifest

BASE = {"method": "fedc2i", "model": "mlp", "num-server-rounds": 5}


def settings(**over):
    return parse_settings({**BASE, **over})


@pytest.mark.parametrize("every,due", [(1, [1, 2, 3, 4, 5]), (2, [2, 4, 5]), (0, [])])
def test_a_checkpoint_is_due_every_checkpoint_every_rounds_and_after_the_last(every, due):
    s = settings(**{"checkpoint-every": every})
    assert [r for r in range(1, 6) if checkpoint_due(s, r, 5)] == due
    assert checkpoint_due(s, 7, 7) == bool(every)  # the last round the strategy's start was given


def test_the_meta_holds_every_key_but_the_resumable_ones_as_the_options_read_them():
    meta = checkpoint_meta(settings(**{"lr": 1, "num-server-rounds": 9}))
    assert meta["method"] == "fedc2i" and meta["model"] == "mlp" and meta["dataset"] == "digits"
    assert not set(meta["run-config"]) & RESUMABLE_CHANGES
    assert meta["run-config"]["lr"] == 1.0 and isinstance(meta["run-config"]["lr"], float)
    assert {"gamma", "c2i-variant", "seed"} <= set(meta["run-config"])  # the method's own keys too
    with pytest.warns(FutureWarning):
        old = settings(**{"c2i-variant": "Lambda-only"})
    new = settings(**{"c2i-variant": "class-level-averaged-extractor"})
    assert checkpoint_meta(old) == checkpoint_meta(new)  # a deprecated spelling is the same run


def test_a_written_checkpoint_reads_back_and_a_foreign_or_finished_one_is_refused(tmp_path):
    state = {"base": {"rng-draws": [1, 2]}, "method": {"store": {0: np.arange(3.0)}}}
    assert write_checkpoint(tmp_path, 2, state, settings()) >= 0
    done, back = read_checkpoint(tmp_path, settings(**{"resume-from": str(tmp_path)}))
    assert done == 2 and back["base"] == state["base"]
    np.testing.assert_array_equal(back["method"]["store"][0], np.arange(3.0))
    with pytest.raises(CheckpointError, match=r"run-config keys \['gamma'\] differ"):
        read_checkpoint(tmp_path, settings(gamma=1.0))
    with pytest.raises(CheckpointError, match="finished its 2 rounds"):
        read_checkpoint(tmp_path, settings(**{"num-server-rounds": 2}))
    write_checkpoint(tmp_path, 3, {"something": 1}, settings())
    with pytest.raises(CheckpointError, match="holds no strategy state"):
        read_checkpoint(tmp_path, settings())
    with pytest.raises(CheckpointError, match="no such results folder"):
        read_checkpoint(tmp_path / "missing", settings())


def test_stop_after_crashes_after_its_round_but_never_after_the_last():
    s = settings(**{"stop-after": 3})
    stop_if_asked(s, 2, 5, None)
    with pytest.raises(SimulatedCrash, match="resume-from='/runs/x'"):
        stop_if_asked(s, 3, 5, Path("/runs/x"))
    stop_if_asked(s, 3, 3, None)  # the run ends there anyway
    stop_if_asked(settings(), 3, 5, None)


def test_the_server_models_are_saved_with_their_manifest(tmp_path):
    models = {"global": {"w": np.ones((2, 2), np.float32)}, "cluster-1": {"w": np.zeros((2, 2), np.float32)}}
    save_server_models(tmp_path, settings(), 4, models)
    for name, state in models.items():
        path = tmp_path / "models" / "server" / name
        np.testing.assert_array_equal(load_file(str(path.with_suffix(".safetensors")))["w"], state["w"])
        manifest = read_manifest(path)
        assert manifest["round"] == 4 and manifest["server-model"] == name and manifest["method"] == "fedc2i"

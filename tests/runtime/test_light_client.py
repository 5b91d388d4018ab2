"""A ClientApp process pays only for what its run needs: in deployment every message starts a fresh
``flwr-clientapp`` process, so importing the app and answering a digits FedAvg message must not pull in
datasets, flwr-datasets, open_clip, transformers, tokenizers, matplotlib or scikit-learn once the node's
partition is in its on-disk cache."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch

from task.data import DataSettings, load_client_data
from task.data.clients import cache_file

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ["datasets", "flwr_datasets", "open_clip", "transformers", "tokenizers", "matplotlib", "sklearn"]

PROBE = """
import json, sys
import client_app.app
after_import = sorted(m for m in {heavy} if m in sys.modules)
from flwr.app import ConfigRecord, Context, RecordDict
from client_app.app import client_for
from server_app.app import build_strategy
ctx = Context(run_id=1, node_id=7, node_config={{"partition-id": 1, "num-partitions": 4}}, state=RecordDict(),
              run_config={{"method": "fedavg", "num-server-rounds": 2}})
method = client_for(ctx)
payload = RecordDict({{"arrays": build_strategy(method.settings).payload(7, 1, "train")["arrays"],
                      "config": ConfigRecord({{"server-round": 1}})}})
reply = method.train(payload)
print(json.dumps({{"after-import": after_import, "after-train": sorted(m for m in {heavy} if m in sys.modules),
                  "examples": dict(reply["metrics"])["num-examples"]}}))
"""


def probe(cache: Path) -> dict:
    env = {**os.environ, "PFLOWER_CACHE_DIR": str(cache)}
    code = PROBE.format(heavy=HEAVY)
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_a_digits_fedavg_message_imports_no_heavy_library_once_the_partition_is_cached(tmp_path):
    settings = DataSettings()  # the default run: digits, Dirichlet 0.5
    load_client_data(settings, 1, 4, str(tmp_path / "partitions"))  # the node's first message built it
    got = probe(tmp_path)
    assert got["after-import"] == [], got
    assert got["after-train"] == [], got
    assert got["examples"] == load_client_data(settings, 1, 4).num_train


def test_the_partition_cache_gives_the_same_splits_and_rebuilds_a_damaged_file(tmp_path):
    settings = DataSettings(partition="two-source", mixture="10:90", val_fraction=0.2)
    fresh = load_client_data.__wrapped__(settings, 3, 10, str(tmp_path))
    path = cache_file(settings, 3, 10, tmp_path)
    assert path.is_file()
    cached = load_client_data.__wrapped__(settings, 3, 10, str(tmp_path))
    for split in ("x_train", "y_train", "x_val", "y_val", "x_test", "y_test", "x_calib", "y_calib"):
        assert torch.equal(getattr(fresh, split), getattr(cached, split)), split
    assert cached.meta == fresh.meta and cached.num_classes == fresh.num_classes
    path.write_bytes(b"not an npz file")  # a damaged file is rebuilt, not trusted
    again = load_client_data.__wrapped__(settings, 3, 10, str(tmp_path))
    assert torch.equal(again.x_train, fresh.x_train) and np.load(path)["x_train"].shape == tuple(fresh.x_train.shape)
    other = cache_file(DataSettings(partition="two-source", mixture="30:70", val_fraction=0.2), 3, 10, tmp_path)
    assert other != path  # any setting that decides the data is in the key


def test_training_on_cached_splits_gives_the_same_model_as_on_freshly_built_ones(tmp_path):
    """A run is reproducible from its run config whether or not its clients' splits were cached: PyTorch picks its
    convolution and BatchNorm kernels by memory layout, so the cached and the built tensors must be laid out alike
    (they differed on the size-1 channel dimension, and the first run on a machine ended with other weights)."""
    from task.models import build_model
    from task.train import train

    settings = DataSettings()
    fresh = load_client_data.__wrapped__(settings, 1, 3, str(tmp_path))
    cached = load_client_data.__wrapped__(settings, 1, 3, str(tmp_path))
    states = []
    for data in (fresh, cached):
        model = build_model("cnn", 1, 8, 10, seed=0)  # the default model: convolutions and BatchNorm
        train(model, data.x_train, data.y_train, epochs=2, batch_size=20, lr=0.05, momentum=0.9, seed=5)
        states.append(model.state_dict())
    for k, v in states[0].items():
        assert torch.equal(v, states[1][k]), k

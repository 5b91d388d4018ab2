"""Every method on MNIST-1D through Flower's runtime (the engine, held to flwr run by tests/engine/test_equality.py):
two rounds with the default model the data set resolves to, the 1-D CNN (with its body / head split and its BatchNorm
layers), on four clients."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors.numpy import load_file

from task.methods import METHODS

pytestmark = pytest.mark.slow

#: what a method needs beyond the defaults to run two rounds on four clients
EXTRA: dict[str, dict[str, Any]] = {
    "oracle": {"partition": "planted-clusters", "num-clusters": 2, "warmup-rounds": 1},  # by the planted groups
    "pfedlia": {"warmup-rounds": 1},  # its clustering round must come within two rounds
    "cfl": {"cfl-min-rounds": 1},
    # the client index: MNIST-1D signals are no images for CLIP, the synthetic encoder (a fixed random projection)
    # takes vectors (c2v-encoder='open-clip' is refused for them at start-up)
    "client2vec": {"c2v-encoder": "synthetic"},
}
BASE = {"dataset": "mnist1d", "mnist1d-samples": 400, "num-server-rounds": 2, "min-nodes": 4}


@pytest.mark.parametrize("method", list(METHODS))
def test_two_rounds_of_every_method_on_mnist1d(engine, method):
    save = method in ("fedbn", "fedavg")
    summary = engine.run({"method": method, **BASE, **EXTRA.get(method, {}), "save-models": save}, num_supernodes=4)
    assert summary["rounds"] == 2 and summary["clients"] == 4 and summary["failures"] == 0
    assert 0.0 < summary["personal-acc"] <= 1.0
    folder = Path(summary["results"])
    config = json.loads((folder / "config.json").read_text())
    assert config["resolved"]["model"] == "cnn1d"
    if save:  # each client's model: FedAvg's the same everywhere, FedBN's the same but for its BatchNorm layers
        saved = [load_file(str(p)) for p in sorted((folder / "models" / "clients").glob("client-*.safetensors"))]
        assert len(saved) == 4 and saved[0]["conv.0.weight"].shape == (32, 1, 5)
        norm = {k for k in saved[0] if k.startswith(("conv.1.", "conv.4.", "conv.7."))}
        assert len(norm) == 15
        for other in saved[1:]:
            assert all(np.array_equal(saved[0][k], other[k]) for k in saved[0] if k not in norm)
            assert np.array_equal(saved[0]["conv.7.running_mean"], other["conv.7.running_mean"]) == (method == "fedavg")


def test_client2vec_with_its_image_encoder_is_refused_on_signals(engine):
    from server_app.runner import RunFailed

    with pytest.raises(RunFailed) as err:
        engine.run({"method": "client2vec", **BASE}, num_supernodes=2, timeout=300)
    said = "c2v-encoder='open-clip' encodes images, but dataset 'mnist1d' has vectors; use c2v-encoder='synthetic'"
    assert said in err.value.output and "[ROUND 1" not in err.value.output

"""Saved models (task/export.py, python -m task.predict): what is saved loads back as the same network, and
predicting on a node-format data file gives its accuracy; bad files say what is wrong."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from task.config import parse_settings
from task.export import load_model, model_manifest, predict, predict_file, save_model
from task.models import build_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("model", ["mlp", "cnn"])  # cnn, the default, has BatchNorm's 0-d num_batches_tracked
def test_a_saved_model_loads_back_and_predicts_a_node_file(tmp_path, model):
    settings = parse_settings({"model": model})
    net = build_model(model, settings.in_channels, settings.image_size, settings.num_classes, seed=3)
    save_model(
        tmp_path / "client-2", net.state_dict(), model_manifest(settings, round=4, client=2, **{"personal-acc": 0.5})
    )
    loaded, manifest = load_model(tmp_path / "client-2.safetensors")
    assert manifest["round"] == 4 and manifest["client"] == 2 and manifest["model"]["name"] == model
    assert manifest["shapes"] == {k: list(v.shape) for k, v in net.state_dict().items()}
    assert manifest["shapes"]["head.weight"] == list(net.head.weight.shape)
    x = np.random.default_rng(0).random((20, 1, 8, 8)).astype(np.float32)
    with torch.no_grad():
        np.testing.assert_array_equal(predict(loaded, x), net.eval()(torch.from_numpy(x)).argmax(1).numpy())
    y = predict(net, x)
    np.savez(tmp_path / "data.npz", x=x, y=y)
    assert predict_file(tmp_path / "client-2", tmp_path / "data.npz")["accuracy"] == 1.0
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "task.predict",
            str(tmp_path / "client-2.safetensors"),
            str(tmp_path / "data.npz"),
            "--out",
            str(tmp_path / "p.npy"),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["accuracy"] == 1.0 and np.load(tmp_path / "p.npy").tolist() == y.tolist()


def test_bad_model_or_data_files_say_what_is_wrong(tmp_path):
    with pytest.raises(ValueError, match="no saved model"):
        load_model(tmp_path / "missing")
    settings = parse_settings({"model": "mlp"})
    net = build_model("mlp", 1, 8, 10)
    save_model(tmp_path / "m", net.state_dict(), model_manifest(settings))
    np.savez(tmp_path / "wrong.npz", x=np.zeros((3, 1, 4, 4), np.float32))
    with pytest.raises(ValueError, match="needs \\(N, 1, 8, 8\\)"):
        predict_file(tmp_path / "m", tmp_path / "wrong.npz")
    doc = json.loads((tmp_path / "m.json").read_text())
    doc["manifest-version"] = 99
    (tmp_path / "m.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="newer pflower"):
        load_model(tmp_path / "m")

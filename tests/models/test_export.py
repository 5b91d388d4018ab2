"""Saved models (task/export.py, python -m task.predict): what is saved loads back as the same network, and
predicting on a node-format data file gives its accuracy, on the file's held-out arrays unless asked otherwise;
bad files say what is wrong."""

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import task.predict
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


def test_predict_scores_the_held_out_arrays_unless_asked_for_the_training_ones(tmp_path, capsys):
    """A node's data file holds the data its model trained on (x / y) and its held-out split (x_test / y_test, as
    deploy/export_partitions.py writes them): the accuracy that means something is the held-out one, so that is
    the default, and the output says which arrays it scored."""
    settings = parse_settings({"model": "mlp"})
    net = build_model("mlp", 1, 8, 10, seed=1).eval()
    save_model(tmp_path / "m", net.state_dict(), model_manifest(settings))
    rng = np.random.default_rng(0)
    x_train, x_test = rng.random((30, 1, 8, 8)).astype(np.float32), rng.random((12, 1, 8, 8)).astype(np.float32)
    y_test = predict(net, x_test)  # the model is right on every held-out sample ...
    y_train = (predict(net, x_train) + 1) % 10  # ... and wrong on every training sample

    def predict_command(*args: str) -> SimpleNamespace:  # python -m task.predict (its main, in this process)
        code = task.predict.main(list(args))
        out = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)

    np.savez(tmp_path / "node.npz", x=x_train, y=y_train, x_test=x_test, y_test=y_test)

    default = predict_command(
        str(tmp_path / "m.safetensors"), str(tmp_path / "node.npz"), "--out", str(tmp_path / "p.npy")
    )
    assert default.returncode == 0, default.stderr
    said = json.loads(default.stdout)
    assert said["arrays"] == "x_test/y_test" and said["held-out"] is True
    assert said["samples"] == 12 and said["accuracy"] == 1.0
    assert np.load(tmp_path / "p.npy").tolist() == y_test.tolist()  # the predictions are of the scored arrays

    train = predict_command(str(tmp_path / "m.safetensors"), str(tmp_path / "node.npz"), "--split", "train")
    said = json.loads(train.stdout)
    assert said["arrays"] == "x/y" and said["held-out"] is False and said["samples"] == 30 and said["accuracy"] == 0.0
    assert "scored x/y" in train.stderr and "as asked" in train.stderr

    # a file without held-out arrays: x / y are scored, and the output says the accuracy is not a held-out one
    np.savez(tmp_path / "own.npz", x=x_train, y=y_train)
    own = predict_command(str(tmp_path / "m.safetensors"), str(tmp_path / "own.npz"))
    assert own.returncode == 0 and json.loads(own.stdout)["arrays"] == "x/y"
    assert "has no x_test" in own.stderr and "not a held-out one" in own.stderr
    asked = predict_command(str(tmp_path / "m.safetensors"), str(tmp_path / "own.npz"), "--split", "test")
    assert asked.returncode == 2 and "needs 'x_test'" in asked.stderr and asked.stdout == ""
    # inputs without labels are predicted, with no accuracy
    np.savez(tmp_path / "unlabelled.npz", x=x_train, x_test=x_test)
    result = predict_file(tmp_path / "m", tmp_path / "unlabelled.npz")
    assert result["arrays"] == "x_test" and "accuracy" not in result and len(result["predictions"]) == 12

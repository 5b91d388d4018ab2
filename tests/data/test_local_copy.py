"""Real data sets load from a local copy (written here), the way users without internet provide them."""

import numpy as np
import pytest
from datasets import Dataset, DatasetDict, Image
from PIL import Image as PILImage

from task.data import DataSettings, load_centralized, load_client_data


def _fake_split(n, size, mode, rng, label_col="label", image_col="image"):
    imgs = [
        PILImage.fromarray(rng.integers(0, 255, (size, size) if mode == "L" else (size, size, 3), dtype=np.uint8), mode)
        for _ in range(n)
    ]
    ds = Dataset.from_dict({image_col: imgs, label_col: (np.arange(n) % 10).tolist()})
    return ds.cast_column(image_col, Image())


@pytest.mark.parametrize(
    "name,size,mode,image_col,label_col",
    [
        ("mnist", 28, "L", "image", "label"),
        ("cifar10", 32, "RGB", "img", "label"),
        ("cifar100", 32, "RGB", "img", "fine_label"),
        ("svhn", 32, "RGB", "image", "label"),
        ("usps", 16, "L", "image", "label"),
        ("fashion-mnist", 28, "L", "image", "label"),
    ],
)
def test_load_from_disk(tmp_path, name, size, mode, image_col, label_col):
    rng = np.random.default_rng(0)
    DatasetDict(
        {
            "train": _fake_split(60, size, mode, rng, label_col, image_col),
            "test": _fake_split(20, size, mode, rng, label_col, image_col),
        }
    ).save_to_disk(tmp_path / name)
    data = load_centralized(name, str(tmp_path / name))
    channels = 1 if mode == "L" else 3
    assert data.x.shape == (80, channels, size, size)
    assert data.x.max() <= 1.0 and data.y.max() == 9
    client = load_client_data(DataSettings(dataset=name, partition="iid", data_dir=str(tmp_path / name)), 1, 4)
    assert client.x_train.shape[1:] == (channels, size, size)


def test_emnist_from_disk(tmp_path):
    rng = np.random.default_rng(1)
    _fake_split(30, 28, "L", rng).save_to_disk(tmp_path / "emnist")
    data = load_centralized("emnist", str(tmp_path / "emnist"))
    assert data.x.shape == (30, 1, 28, 28)


def test_wrong_columns_are_named(tmp_path):
    Dataset.from_dict({"pixels": [[0.0]], "y": [1]}).save_to_disk(tmp_path / "bad")
    with pytest.raises(ValueError, match="has no column"):
        load_centralized("mnist", str(tmp_path / "bad"))

"""The data sets pflower knows: name, input shape, classes, where a real copy comes from; PI-FL's synthetic
concept-shift set; the partition, mixture and domain names the run config accepts."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class DatasetInfo:
    name: str
    in_channels: int
    image_size: int  # 0 = vector data of dimension in_channels
    num_classes: int
    hf_id: str | None = None
    hf_config: str | None = None
    image_column: str = "image"
    label_column: str = "label"
    torchvision_name: str | None = None
    torchvision_kwargs: tuple = ()
    #: the model run-config ``model='auto'`` picks (empty: ``cnn`` for images, ``softmax`` for vectors)
    auto_model: str = ""


DATASETS: dict[str, DatasetInfo] = {
    "digits": DatasetInfo("digits", 1, 8, 10),
    "mnist": DatasetInfo("mnist", 1, 28, 10, "ylecun/mnist", torchvision_name="MNIST"),
    "fashion-mnist": DatasetInfo(
        "fashion-mnist", 1, 28, 10, "zalando-datasets/fashion_mnist", torchvision_name="FashionMNIST"
    ),
    "cifar10": DatasetInfo("cifar10", 3, 32, 10, "uoft-cs/cifar10", image_column="img", torchvision_name="CIFAR10"),
    "cifar100": DatasetInfo(
        "cifar100",
        3,
        32,
        100,
        "uoft-cs/cifar100",
        image_column="img",
        label_column="fine_label",
        torchvision_name="CIFAR100",
    ),
    "emnist": DatasetInfo(
        "emnist", 1, 28, 62, None, torchvision_name="EMNIST", torchvision_kwargs=(("split", "byclass"),)
    ),
    "svhn": DatasetInfo("svhn", 3, 32, 10, "ufldl-stanford/svhn", "cropped_digits", torchvision_name="SVHN"),
    "usps": DatasetInfo("usps", 1, 16, 10, "flwrlabs/usps", torchvision_name="USPS"),
    "synth-concept": DatasetInfo("synth-concept", 10, 0, 2),
    # MNIST-1D (Greydanus & Kobak, ICML 2024), generated offline (task/data/sources.py): signals of 40 points
    "mnist1d": DatasetInfo("mnist1d", 40, 0, 10, auto_model="cnn1d"),
    # next-word prediction on synthetic dialects (task/text.py): in_channels = sequence length,
    # num_classes = vocabulary size of the built-in tokenizer (a pretrained tokenizer changes it)
    "dialects": DatasetInfo("dialects", 16, 0, 247, auto_model="gpt2"),
}
SYNTH_CONCEPT_SIZE = 6000
#: MNIST-1D's default size (run-config ``mnist1d-samples``): at 10 clients a client's test split (a fifth of its
#: data) holds about 200 signals, so one error moves its accuracy by half a point; 1,000 clients still get 10 each
MNIST1D_SAMPLES = 10_000


def synth_concept(
    num_samples: int = SYNTH_CONCEPT_SIZE, dim: int = 10, classes: int = 2, sources: int = 2, seed: int = 4_242
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """PI-FL's "SynthConcept" (pifl.md §4): x ~ N(0, I) in R^dim, source s labels it ``argmax(x W_s + eps)`` with
    W_s entries N(0, 10) and eps ~ N(0, 1): the sources share the input distribution but conflict on
    labels.  Returns (x, y, source); every sample's source is fixed (half A, half B)."""
    rng = np.random.default_rng(seed)
    weights = rng.normal(0.0, np.sqrt(10.0), size=(sources, dim, classes))
    x = rng.normal(size=(num_samples, dim)).astype(np.float32)
    source = np.arange(num_samples) % sources
    logits = np.einsum("nd,ndc->nc", x, weights[source]) + rng.normal(size=(num_samples, classes))
    return x, logits.argmax(1).astype(np.int64), source.astype(np.int64)


PARTITIONS = (
    "iid",
    "dirichlet",
    "quantity-dirichlet",
    "pathological",
    "planted-clusters",
    "planted-clusters-noisy",
    "two-source",
)
#: the fewest samples partition 'quantity-dirichlet' gives a client (before its train / validation / test split)
MIN_CLIENT_SAMPLES = 10
MIXTURES = ("10:90", "30:70", "linear", "random")
DOMAINS = ("original", "inverted", "rotated", "noisy", "shifted", "thickened", "blurred")


class NoShare(ValueError):
    """A partition cannot give every client a share at this number of clients; :attr:`reason` says why in a few
    words (the message adds what to do)."""

    def __init__(self, message: str, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


def dataset_info(name: str) -> DatasetInfo:
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r} (run-config key 'dataset'); allowed: {sorted(DATASETS)}")
    return DATASETS[name]

"""Models used by the methods, each split into a feature extractor ("body") and a classifier ("head").

Convention shared by every model here: the last linear layer is the attribute ``head`` and
``model.features(x)`` returns the flattened vector that ``head`` consumes.  Parameter (and buffer) names
starting with ``"head."`` are the classifier; everything else is the body.  Personalized methods split
states with :func:`head_keys` / :func:`body_keys` instead of hard-coding layer names, and find the
normalisation layers with :func:`norm_keys` (a model) or :func:`model_norm_keys` (a registry name).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

HEAD_PREFIX = "head."


class SplitModel(nn.Module):
    """Base class: ``forward(x) = head(features(x))``."""

    head: nn.Linear

    def features(self, x: torch.Tensor) -> torch.Tensor:  # pragma: no cover - abstract
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))

    @property
    def feature_dim(self) -> int:
        return self.head.in_features


def _flat_dim(body: nn.Module, in_channels: int, image_size: int) -> int:
    with torch.no_grad():
        return int(body(torch.zeros(1, in_channels, image_size, image_size)).flatten(1).shape[1])


class SmallCNN(SplitModel):
    """FedCAC's CNN for digits (fedcac.md §8): conv3x3(16, no bias)-BN-ReLU-conv3x3(32, no bias)-BN-ReLU-maxpool2-
    FC64-FC.

    38,330 parameters on 8x8 inputs.  Larger inputs are average-pooled to 4x4 after the max-pool, so the
    same architecture serves 28x28 (MNIST-like) and 32x32 images.
    """

    def __init__(self, in_channels: int, image_size: int, num_classes: int, hidden: int = 64) -> None:
        super().__init__()
        layers: list[nn.Module] = [
            nn.Conv2d(in_channels, 16, 3, padding=1, bias=False),
            nn.BatchNorm2d(16),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1, bias=False),
            nn.BatchNorm2d(32),
            nn.ReLU(),
            nn.MaxPool2d(2),
        ]
        if image_size // 2 != 4:
            layers.append(nn.AdaptiveAvgPool2d(4))
        self.conv = nn.Sequential(*layers)
        self.fc = nn.Linear(32 * 4 * 4, hidden)
        self.head = nn.Linear(hidden, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(self.conv(x).flatten(1)))


class C2ICNN(SplitModel):
    """FedC2I paper Table 7 CNN (called "LeNet" there): conv5(64)-pool-conv5(64)-pool-FC384-FC192-FC.

    Valid convolutions as in the paper for inputs >= 16 pixels (64x64 gives the paper's 64*13*13);
    smaller inputs (8x8 digits) use padding 2 so the two pooling stages still fit.
    """

    def __init__(self, in_channels: int, image_size: int, num_classes: int) -> None:
        super().__init__()
        pad = 0 if image_size >= 16 else 2
        self.conv = nn.Sequential(
            nn.Conv2d(in_channels, 64, 5, padding=pad),
            nn.ReLU(),
            nn.MaxPool2d(2, 2),
            nn.Conv2d(64, 64, 5, padding=pad),
            nn.ReLU(),
            nn.MaxPool2d(2, 2),
        )
        flat = _flat_dim(self.conv, in_channels, image_size)
        self.fc1 = nn.Linear(flat, 384)
        self.fc2 = nn.Linear(384, 192)
        self.head = nn.Linear(192, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x).flatten(1)
        return torch.relu(self.fc2(torch.relu(self.fc1(x))))


class LeNet(SplitModel):
    """LeNet-5 style: conv5(6)-pool-conv5(16)-pool-FC120-FC84-FC (padding 2 keeps it valid on 8x8)."""

    def __init__(self, in_channels: int, image_size: int, num_classes: int) -> None:
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(in_channels, 6, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(6, 16, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        flat = _flat_dim(self.conv, in_channels, image_size)
        self.fc1 = nn.Linear(flat, 120)
        self.fc2 = nn.Linear(120, 84)
        self.head = nn.Linear(84, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv(x).flatten(1)
        return torch.relu(self.fc2(torch.relu(self.fc1(x))))


class C2ISmall(SplitModel):
    """FedC2I's CPU-sized version of the Table 7 CNN (fedc2i.md §8): conv5(16)-pool-conv5(32)-pool-FC120-FC84-FC."""

    def __init__(self, in_channels: int, image_size: int, num_classes: int) -> None:
        super().__init__()
        pad = 0 if image_size >= 16 else 2
        self.conv = nn.Sequential(
            nn.Conv2d(in_channels, 16, 5, padding=pad),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 5, padding=pad),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        flat = _flat_dim(self.conv, in_channels, image_size)
        self.fc1 = nn.Linear(flat, 120)
        self.fc2 = nn.Linear(120, 84)
        self.head = nn.Linear(84, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc2(torch.relu(self.fc1(self.conv(x).flatten(1)))))


class PIFLCNN(SplitModel):
    """PI-FL's CNN (pifl.md §4): conv3(32)-conv3(64)-pool-conv3(64,pad1)-pool-dropout-FC128-dropout-FC."""

    def __init__(self, in_channels: int, image_size: int, num_classes: int) -> None:
        super().__init__()
        pad = 0 if image_size >= 16 else 1
        self.conv = nn.Sequential(
            nn.Conv2d(in_channels, 32, 3, padding=pad),
            nn.ReLU(),
            nn.Conv2d(32, 64, 3, padding=pad),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Conv2d(64, 64, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
            nn.Dropout(0.25),
        )
        flat = _flat_dim(self.conv, in_channels, image_size)
        self.fc = nn.Linear(flat, 128)
        self.dropout = nn.Dropout(0.5)
        self.head = nn.Linear(128, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(torch.relu(self.fc(self.conv(x).flatten(1))))


class _BasicBlock(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(SplitModel):
    """CIFAR-style ResNet (3x3 stem, no max-pool) for 32x32 inputs; depth from ``blocks`` per stage."""

    def __init__(self, in_channels: int, num_classes: int, blocks: list[int], widths: list[int]) -> None:
        super().__init__()
        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, widths[0], 3, 1, 1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU()
        )
        stages: list[nn.Module] = []
        cin = widths[0]
        for i, (n, w) in enumerate(zip(blocks, widths, strict=True)):
            for j in range(n):
                stages.append(_BasicBlock(cin, w, 2 if (i > 0 and j == 0) else 1))
                cin = w
        self.stages = nn.Sequential(*stages)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.head = nn.Linear(cin, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.stages(self.stem(x))).flatten(1)


class CNN1D(SplitModel):
    """A small 1-D CNN for signals (MNIST-1D's default): three convolutions of 32 channels (kernel 5 then 3, stride 2,
    no bias) each followed by BatchNorm and ReLU, FC64, FC.

    The shape of the convolutional baseline of Greydanus & Kobak (ICML 2024; about 94 % on MNIST-1D), with BatchNorm
    layers (FedBN keeps them on the clients) and a hidden layer before the head (the body / head split of every model
    here).  Takes vector inputs of ``length`` points, (N, length) or (N, 1, length); 17,450 parameters at length 40.
    """

    def __init__(self, length: int, num_classes: int, channels: int = 32, hidden: int = 64) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        cin = 1
        for kernel in (5, 3, 3):
            layers += [
                nn.Conv1d(cin, channels, kernel, stride=2, padding=kernel // 2, bias=False),
                nn.BatchNorm1d(channels),
                nn.ReLU(),
            ]
            cin = channels
        self.conv = nn.Sequential(*layers)
        with torch.no_grad():
            flat = int(self.conv(torch.zeros(1, 1, length)).flatten(1).shape[1])
        self.fc = nn.Linear(flat, hidden)
        self.head = nn.Linear(hidden, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        x = x.reshape(len(x), 1, -1)
        return torch.relu(self.fc(self.conv(x).flatten(1)))


class SoftmaxRegression(SplitModel):
    """Multinomial logistic regression: the body is the identity on the flattened input."""

    def __init__(self, input_dim: int, num_classes: int) -> None:
        super().__init__()
        self.head = nn.Linear(input_dim, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1)


class MLP(SplitModel):
    """Two hidden layers of ReLU units, for vector data (e.g. the synthetic concept-shift set)."""

    def __init__(self, input_dim: int, num_classes: int, hidden: int = 64) -> None:
        super().__init__()
        self.fc1 = nn.Linear(input_dim, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.head = nn.Linear(hidden, num_classes)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc2(torch.relu(self.fc1(x.flatten(1)))))


class CausalLM(SplitModel):
    """A GPT-2 body (transformers ``GPT2Model``) and a linear next-token head.

    ``forward`` returns logits as (batch, vocab, time), so ``cross_entropy(logits, next_tokens)`` and
    ``logits.argmax(1) == next_tokens`` work in the shared training loop unchanged.
    """

    def __init__(
        self, vocab: int, seq_len: int, width: int = 64, layers: int = 2, heads: int = 2, pretrained: str = ""
    ) -> None:
        super().__init__()
        from transformers import GPT2Config, GPT2LMHeadModel, GPT2Model

        if pretrained:
            full = GPT2LMHeadModel.from_pretrained(str(Path(pretrained).expanduser()), local_files_only=True)
            self.body = full.transformer
            self.head = nn.Linear(full.config.n_embd, full.config.vocab_size)
            with torch.no_grad():
                self.head.weight.copy_(full.lm_head.weight)
                self.head.bias.zero_()
        else:
            cfg = GPT2Config(
                vocab_size=vocab,
                n_positions=max(seq_len, 8),
                n_embd=width,
                n_layer=layers,
                n_head=heads,
                resid_pdrop=0.0,
                embd_pdrop=0.0,
                attn_pdrop=0.0,
                bos_token_id=0,
                eos_token_id=0,
            )
            cfg._attn_implementation = "eager"
            self.body = GPT2Model(cfg)
            self.head = nn.Linear(width, vocab)

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(input_ids=x.long()).last_hidden_state

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x)).permute(0, 2, 1)


def _input_dim(in_channels: int, image_size: int) -> int:
    return in_channels * image_size * image_size if image_size > 0 else in_channels


MODELS: dict[str, Callable[[int, int, int], SplitModel]] = {
    "cnn": SmallCNN,
    "c2i-cnn": C2ICNN,
    "lenet": LeNet,
    "c2i-small": C2ISmall,
    "pifl-cnn": PIFLCNN,
    "resnet8": lambda c, s, k: ResNet(c, k, [1, 1, 1], [64, 128, 256]),
    "resnet10": lambda c, s, k: ResNet(c, k, [1, 1, 1, 1], [64, 128, 256, 512]),
    "resnet18": lambda c, s, k: ResNet(c, k, [2, 2, 2, 2], [64, 128, 256, 512]),
    "softmax": lambda c, s, k: SoftmaxRegression(_input_dim(c, s), k),
    "mlp": lambda c, s, k: MLP(_input_dim(c, s), k),
    # signals (vector inputs of c points: MNIST-1D)
    "cnn1d": lambda c, s, k: CNN1D(_input_dim(c, s), k),
    # causal LM for the dialects task: c = sequence length, k = vocabulary size ("gpt2:<folder>" = pretrained)
    "gpt2": lambda c, s, k: _causal_lm(k, c),
}


def _causal_lm(vocab: int, seq_len: int, pretrained: str = "") -> SplitModel:
    return CausalLM(vocab, seq_len, pretrained=pretrained)


IMAGE_ONLY = {"cnn", "c2i-cnn", "c2i-small", "lenet", "pifl-cnn", "resnet8", "resnet10", "resnet18"}
#: models for vector inputs read as one signal (convolutions along it): not for images
SIGNAL_ONLY = {"cnn1d"}


def build_model(name: str, in_channels: int, image_size: int, num_classes: int, seed: int | None = None) -> SplitModel:
    """Build model ``name`` for inputs of ``in_channels`` x ``image_size`` x ``image_size``.

    ``image_size == 0`` means vector inputs of dimension ``in_channels``.  With ``seed`` the initial
    weights are reproducible (the server and every client build the same initial model).
    """
    if name.startswith("gpt2:"):
        if seed is not None:
            torch.manual_seed(seed)
        return _causal_lm(num_classes, in_channels, pretrained=name.split(":", 1)[1])
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r} (run-config key 'model'); allowed: {sorted(MODELS)} or 'auto'")
    if image_size == 0 and name in IMAGE_ONLY:
        raise ValueError(f"model {name!r} needs image inputs but the data set gives vectors; use 'softmax' or 'mlp'")
    if image_size > 0 and name in SIGNAL_ONLY:
        raise ValueError(f"model {name!r} reads vector inputs as a signal but the data set gives images; use 'cnn'")
    if seed is not None:
        torch.manual_seed(seed)
    return MODELS[name](in_channels, image_size, num_classes)


def head_keys(model_or_state: nn.Module | dict) -> list[str]:
    """Names (state_dict order) of the classifier's parameters and buffers."""
    state = model_or_state.state_dict() if isinstance(model_or_state, nn.Module) else model_or_state
    return [k for k in state if k.startswith(HEAD_PREFIX)]


def parameters_of(model: nn.Module, keys: list[str]) -> list[nn.Parameter]:
    """The trained parameters of ``model`` among ``keys`` (state names; buffers such as BN statistics are left out)."""
    wanted = set(keys)
    return [p for name, p in model.named_parameters() if name in wanted]


def body_keys(model_or_state: nn.Module | dict) -> list[str]:
    """Names (state_dict order) of the feature extractor's parameters and buffers (incl. BN statistics)."""
    state = model_or_state.state_dict() if isinstance(model_or_state, nn.Module) else model_or_state
    return [k for k in state if not k.startswith(HEAD_PREFIX)]


#: the layers :func:`norm_keys` counts as normalisation layers: BatchNorm and InstanceNorm (torch's ``_NormBase``:
#: affine weight and bias, running mean and variance, ``num_batches_tracked``), GroupNorm, LayerNorm and RMSNorm
#: (affine weight and bias only).  All of them rescale features per channel; FedBN keeps them on the client.
NORM_LAYERS: tuple[type[nn.Module], ...] = (nn.modules.batchnorm._NormBase, nn.GroupNorm, nn.LayerNorm, nn.RMSNorm)


def norm_keys(model: nn.Module) -> list[str]:
    """Names (state_dict order) of the parameters and buffers of ``model``'s normalisation layers
    (:data:`NORM_LAYERS`), e.g. ``conv.1.weight``, ``conv.1.running_mean``, ``conv.1.num_batches_tracked``."""
    owned = set()
    for name, module in model.named_modules(remove_duplicate=False):
        if isinstance(module, NORM_LAYERS):
            owned |= {f"{name}.{k}" if name else k for k in module.state_dict()}
    return [k for k in model.state_dict() if k in owned]


@dataclass(frozen=True)
class ModelInfo:
    """What a strategy needs to know about a model, without building one: its state keys in ``state_dict``
    order with their shapes and dtypes, which keys are trained parameters and which buffers, which belong to
    normalisation layers, the body / head split and the feature width the head consumes."""

    shapes: Mapping[str, tuple[int, ...]]
    dtypes: Mapping[str, str]
    parameter_keys: tuple[str, ...]
    norm_keys: tuple[str, ...]
    feature_dim: int

    @property
    def keys(self) -> list[str]:
        """Every state key (parameters and buffers), in ``state_dict`` order."""
        return list(self.shapes)

    @property
    def buffer_keys(self) -> list[str]:
        """The keys that are not trained parameters (BatchNorm statistics and counters)."""
        params = set(self.parameter_keys)
        return [k for k in self.shapes if k not in params]

    @property
    def head_keys(self) -> list[str]:
        return [k for k in self.shapes if k.startswith(HEAD_PREFIX)]

    @property
    def body_keys(self) -> list[str]:
        return [k for k in self.shapes if not k.startswith(HEAD_PREFIX)]


def describe(model: SplitModel) -> ModelInfo:
    """The :class:`ModelInfo` of a built model (on any device, torch's ``meta`` device included)."""
    state = model.state_dict()
    return ModelInfo(
        shapes={k: tuple(v.shape) for k, v in state.items()},
        dtypes={k: str(v.dtype).removeprefix("torch.") for k, v in state.items()},
        parameter_keys=tuple(name for name, _ in model.named_parameters()),
        norm_keys=tuple(norm_keys(model)),
        feature_dim=model.feature_dim,
    )


@functools.lru_cache(maxsize=32)
def model_info(name: str, in_channels: int, image_size: int, num_classes: int) -> ModelInfo:
    """The :class:`ModelInfo` of model ``name`` as :func:`build_model` builds it for these inputs, learnt without
    making its weights: the architecture is instantiated on torch's ``meta`` device (no memory, no random draws,
    no pretrained weights read)."""
    with torch.device("meta"):
        if name.startswith("gpt2:"):  # the pretrained model's architecture, from its folder's config
            from transformers import GPT2Config

            cfg = GPT2Config.from_pretrained(str(Path(name.split(":", 1)[1]).expanduser()), local_files_only=True)
            model: SplitModel = CausalLM(cfg.vocab_size, in_channels, cfg.n_embd, cfg.n_layer, cfg.n_head)
        else:
            model = build_model(name, in_channels, image_size, num_classes)
    return describe(model)


def model_norm_keys(name: str, in_channels: int, image_size: int, num_classes: int) -> tuple[str, ...]:
    """:func:`norm_keys` of model ``name`` for these inputs (:func:`model_info`)."""
    return model_info(name, in_channels, image_size, num_classes).norm_keys


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())

"""Every model: output shape, the body/head split by parameter names, its normalisation layers, and seeded
construction."""

import pytest
import torch
from torch import nn

from task.models import (
    MODELS,
    body_keys,
    build_model,
    count_parameters,
    head_keys,
    model_norm_keys,
    norm_keys,
)

CASES = {
    "cnn": (1, 8),
    "c2i-cnn": (3, 64),
    "c2i-small": (1, 8),
    "lenet": (1, 8),
    "pifl-cnn": (3, 32),
    "resnet8": (3, 32),
    "resnet10": (3, 32),
    "resnet18": (3, 32),
    "softmax": (10, 0),
    "mlp": (10, 0),
    "cnn1d": (40, 0),
}


def test_every_model_is_covered():
    assert set(CASES) | {"gpt2"} == set(MODELS)


def test_causal_lm_split_and_output_layout():
    model = build_model("gpt2", 12, 0, 50, seed=0).eval()
    x = torch.randint(0, 50, (3, 12))
    out = model(x)
    assert out.shape == (3, 50, 12)  # (batch, vocab, time): cross_entropy(out, next_tokens) works as is
    assert head_keys(model) == ["head.weight", "head.bias"] and model.feature_dim == 64
    assert set(head_keys(model)) | set(body_keys(model)) == set(model.state_dict())


@pytest.mark.parametrize("name", sorted(CASES))
def test_forward_and_split(name):
    channels, size = CASES[name]
    model = build_model(name, channels, size, 7, seed=0).eval()
    x = torch.randn(3, channels, size, size) if size else torch.randn(3, channels)
    out = model(x)
    assert out.shape == (3, 7)
    assert torch.allclose(model.head(model.features(x)), out)
    heads, bodies = head_keys(model), body_keys(model)
    assert heads == ["head.weight", "head.bias"]
    assert set(heads) | set(bodies) == set(model.state_dict()) and not set(heads) & set(bodies)
    assert model.head.in_features == model.feature_dim


def test_small_cnn_matches_spec_size():
    assert count_parameters(build_model("cnn", 1, 8, 10)) == 38330  # fedcac.md §8
    assert build_model("cnn", 1, 28, 10)(torch.randn(2, 1, 28, 28)).shape == (2, 10)


def test_c2i_cnn_matches_paper_flatten():
    model = build_model("c2i-cnn", 3, 64, 10)
    assert isinstance(model.fc1, torch.nn.Linear)
    assert model.fc1.in_features == 64 * 13 * 13  # paper Table 7


def test_seeded_build_is_reproducible():
    a, b = build_model("lenet", 1, 8, 10, seed=3), build_model("lenet", 1, 8, 10, seed=3)
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())


def test_bad_model_names():
    with pytest.raises(ValueError, match=r"unknown model 'vgg'.*allowed"):
        build_model("vgg", 1, 8, 10)
    with pytest.raises(ValueError, match="needs image inputs"):
        build_model("cnn", 10, 0, 2)
    with pytest.raises(ValueError, match="reads vector inputs as a signal but the data set gives images"):
        build_model("cnn1d", 1, 8, 10)


def test_the_1d_cnn_convolves_along_the_signal_and_takes_any_length():
    """A signal shifted along its length changes the 1-D CNN's output (it reads positions, not a bag of values), a
    signal given with its channel axis is the same signal, and the architecture is built for the length it gets."""
    model = build_model("cnn1d", 40, 0, 10, seed=0).eval()
    x = torch.randn(4, 40)
    assert torch.equal(model(x), model(x[:, None, :]))
    assert not torch.allclose(model(x), model(torch.roll(x, 3, dims=1)))
    assert [type(m) for m in model.modules() if isinstance(m, nn.Conv1d | nn.BatchNorm1d | nn.ReLU)] == [
        nn.Conv1d,
        nn.BatchNorm1d,
        nn.ReLU,
    ] * 3
    assert count_parameters(model) < 20_000  # a small model: the convolutional baseline of MNIST-1D is about 5k
    assert build_model("cnn1d", 100, 0, 3)(torch.randn(2, 100)).shape == (2, 3)


#: the models with normalisation layers, and the kind of layer
NORMALISED = {
    "cnn": nn.BatchNorm2d,
    "resnet8": nn.BatchNorm2d,
    "resnet10": nn.BatchNorm2d,
    "resnet18": nn.BatchNorm2d,
    "cnn1d": nn.BatchNorm1d,
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_normalisation_keys_are_every_array_of_the_normalisation_layers_learnt_without_building_weights(name):
    channels, size = CASES[name]
    model = build_model(name, channels, size, 7, seed=0)
    kind = NORMALISED.get(name)
    expected = [
        f"{m}.{k}" for m, layer in model.named_modules() if kind and isinstance(layer, kind) for k in layer.state_dict()
    ]
    assert sorted(norm_keys(model)) == sorted(expected) and bool(expected) == (name in NORMALISED)
    assert norm_keys(model) == [k for k in model.state_dict() if k in set(expected)]  # state_dict order
    rng = torch.random.get_rng_state()
    assert model_norm_keys(name, channels, size, 7) == tuple(norm_keys(model))
    assert torch.equal(rng, torch.random.get_rng_state())  # no weights were drawn to learn the names


def test_group_layer_and_instance_norms_count_and_a_norm_without_arrays_adds_nothing():
    model = nn.Sequential(
        nn.Conv2d(1, 4, 3),
        nn.GroupNorm(2, 4),
        nn.InstanceNorm2d(4, affine=True, track_running_stats=True),
        nn.InstanceNorm2d(4),  # no affine, no statistics: no arrays
        nn.Flatten(),
        nn.LayerNorm(4 * 6 * 6),
        nn.Linear(4 * 6 * 6, 3),
    )
    assert norm_keys(model) == [
        "1.weight",
        "1.bias",
        "2.weight",
        "2.bias",
        "2.running_mean",
        "2.running_var",
        "2.num_batches_tracked",
        "5.weight",
        "5.bias",
    ]
    assert norm_keys(nn.LayerNorm(3)) == ["weight", "bias"]  # a normalisation layer as the whole model
    assert norm_keys(nn.RMSNorm(3)) == ["weight"]
    shared = nn.BatchNorm1d(3)  # one layer under two names: both names' arrays are its arrays
    assert norm_keys(nn.Sequential(shared, nn.ReLU(), shared))[::5] == ["0.weight", "2.weight"]


def test_the_causal_lms_layer_norms_are_its_normalisation_layers_also_for_a_pretrained_folder(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    model = build_model("gpt2", 12, 0, 50, seed=0)
    keys = norm_keys(model)
    assert keys and all(".ln_" in k for k in keys) and len(keys) == 2 * (2 * 2 + 1)  # ln_1, ln_2 per layer; ln_f
    assert model_norm_keys("gpt2", 12, 0, 50) == tuple(keys)
    folder = tmp_path / "gpt2:tiny"  # a folder whose name has a colon, too
    GPT2LMHeadModel(GPT2Config(vocab_size=40, n_positions=16, n_embd=16, n_layer=3, n_head=2)).save_pretrained(folder)
    pretrained = build_model(f"gpt2:{folder}", 12, 0, 40)
    assert model_norm_keys(f"gpt2:{folder}", 12, 0, 40) == tuple(norm_keys(pretrained))
    assert len(norm_keys(pretrained)) == 2 * (2 * 3 + 1)


def test_the_registry_describes_a_model_without_the_caller_building_one():
    """What strategies learn from the registry (task.models.model_info): keys in state_dict order with shapes and
    dtypes, trained parameters and buffers, normalisation-layer keys, body / head and the feature width."""
    from task.models import describe, model_info

    cnn = build_model("cnn", 1, 8, 10)
    rng = torch.random.get_rng_state()
    info = model_info("cnn", 1, 8, 10)
    assert torch.equal(rng, torch.random.get_rng_state())  # no weights were drawn to describe it
    assert info == describe(cnn) and model_info("cnn", 1, 8, 10) is info  # built once per process
    state = cnn.state_dict()
    assert info.keys == list(state) and info.shapes == {k: tuple(v.shape) for k, v in state.items()}
    assert info.dtypes["conv.1.num_batches_tracked"] == "int64" and info.dtypes["head.bias"] == "float32"
    assert list(info.parameter_keys) == [n for n, _ in cnn.named_parameters()]
    assert info.buffer_keys == [k for k in state if k.split(".")[-1].startswith(("running_", "num_batches"))]
    assert list(info.norm_keys) == [k for k in state if k.startswith(("conv.1.", "conv.4."))]  # the two BatchNorms
    assert info.head_keys == ["head.weight", "head.bias"] and info.body_keys + info.head_keys == info.keys
    assert info.feature_dim == cnn.feature_dim == 64
    mlp = model_info("mlp", 64, 0, 10)
    assert mlp.norm_keys == () and mlp.buffer_keys == [] and mlp.keys == list(mlp.parameter_keys)
    resnet = model_info("resnet8", 3, 32, 10)
    assert "stages.1.shortcut.1.running_var" in resnet.norm_keys and resnet.feature_dim == 256

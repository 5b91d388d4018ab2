"""Every model: output shape, the body/head split by parameter names, and seeded construction."""

import pytest
import torch

from task.models import MODELS, body_keys, build_model, count_parameters, head_keys

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
    assert count_parameters(build_model("cnn", 1, 8, 10)) == 38330  # spec fedcac §8
    assert build_model("cnn", 1, 28, 10)(torch.randn(2, 1, 28, 28)).shape == (2, 10)


def test_c2i_cnn_matches_paper_flatten():
    model = build_model("c2i-cnn", 3, 64, 10)
    assert model.fc1.in_features == 64 * 13 * 13  # paper Table 7


def test_seeded_build_is_reproducible():
    a, b = build_model("lenet", 1, 8, 10, seed=3), build_model("lenet", 1, 8, 10, seed=3)
    assert all(torch.equal(a.state_dict()[k], b.state_dict()[k]) for k in a.state_dict())


def test_bad_model_names():
    with pytest.raises(ValueError, match="unknown model 'vgg'.*allowed"):
        build_model("vgg", 1, 8, 10)
    with pytest.raises(ValueError, match="needs image inputs"):
        build_model("cnn", 10, 0, 2)

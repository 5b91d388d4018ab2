"""Client2Vec's encoders (client2vec.md §2.1, §7): the synthetic stand-in is deterministic, normalised and follows
the prompt rule; open_clip's tiny model loads offline and missing weights are a clear error; embeddings are cached
on disk."""

import numpy as np
import pytest
import torch

from task.clip import MissingWeights, OpenClipEncoder, SyntheticEncoder, cached_embeddings, label_prompt


def test_synthetic_encoder_is_deterministic_normalised_and_prompt_rule():
    enc = SyntheticEncoder(512, 0)
    a = enc.encode_texts([label_prompt("apple"), label_prompt("zero")])
    b = SyntheticEncoder(512, 0).encode_texts([label_prompt("apple"), label_prompt("zero")])
    np.testing.assert_array_equal(a, b)
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, rtol=1e-5)
    assert label_prompt("apple") == "A photo of an apple" and label_prompt("zero") == "A photo of a zero"
    imgs = enc.encode_images(torch.rand(3, 1, 8, 8))
    assert imgs.shape == (3, 512) and np.allclose(np.linalg.norm(imgs, axis=1), 1.0, atol=1e-5)


def test_open_clip_tiny_model_offline_and_clear_errors(tmp_path):
    enc = OpenClipEncoder("pflower-tiny", "random")
    d = enc.encode_images(torch.rand(3, 1, 8, 8))
    t = enc.encode_texts([label_prompt("one"), label_prompt("eight")])
    assert d.shape == (3, 512) and t.shape == (2, 512)
    np.testing.assert_allclose(np.linalg.norm(d, axis=1), 1.0, rtol=1e-4)
    with pytest.raises(MissingWeights, match="c2v-clip-weights"):
        OpenClipEncoder("pflower-tiny", str(tmp_path / "missing.pt"))
    with pytest.raises(ValueError, match="c2v-clip-model"):
        OpenClipEncoder("no-such-clip", "random")
    # a local checkpoint file round-trips
    path = tmp_path / "tiny.pt"
    torch.save(enc.model.state_dict(), path)
    again = OpenClipEncoder("pflower-tiny", str(path))
    np.testing.assert_allclose(again.encode_texts([label_prompt("one")]), t[:1], atol=1e-5)


def test_embeddings_are_cached_on_disk(tmp_path):
    enc = SyntheticEncoder(512, 1)
    x, y = torch.rand(6, 1, 8, 8), torch.tensor([0, 1, 2, 0, 1, 2])
    D, L, hit = cached_embeddings(enc, "k", x, y, ["a", "b", "c"], tmp_path)
    D2, _L2, hit2 = cached_embeddings(enc, "k", x, y, ["a", "b", "c"], tmp_path)
    assert not hit and hit2 and len(list(tmp_path.glob("*.npz"))) == 1
    np.testing.assert_array_equal(D, D2)
    np.testing.assert_array_equal(L[0], L[3])


def test_registering_the_tiny_model_leaves_no_folder_behind(tmp_path, monkeypatch):
    """Every process that builds the tiny encoder registers its config with open_clip: the model must be known
    afterwards, and nothing may be left in the temporary directory (one folder per process had been)."""
    import tempfile

    import open_clip
    import open_clip.factory

    from task.clip import TINY_MODEL, _register_tiny

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(open_clip.factory, "_MODEL_CONFIGS", {})  # a fresh process: nothing registered yet
    assert TINY_MODEL not in open_clip.list_models()
    _register_tiny(open_clip)
    assert TINY_MODEL in open_clip.list_models()
    assert list(tmp_path.iterdir()) == []
    OpenClipEncoder(TINY_MODEL, "", True)  # and it builds from the registered config

"""``train-samples`` caps each client's training split with a seeded subsample, stratified by label; the validation
and test splits stay as they were (a samples-per-client axis changes only how much a client trains on)."""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from task.config import parse_settings
from task.data import DataSettings, load_client_data, load_local_file
from task.data.clients import training_subsample


def _rows(x: torch.Tensor) -> set[bytes]:
    return {r.tobytes() for r in x.reshape(len(x), -1).numpy()}


@settings(max_examples=40, deadline=None)
@given(
    counts=st.lists(st.integers(0, 25), min_size=1, max_size=6).filter(lambda c: sum(c) > 1),
    sizes=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_the_subsample_keeps_each_label_within_one_of_its_share_and_a_smaller_one_is_part_of_a_larger(
    counts, sizes, seed
):
    labels = np.random.default_rng(seed).permutation(np.repeat(np.arange(len(counts)), counts))
    total, k = len(labels), sum(1 for c in counts if c)
    bound = 1.0 - 1.0 / (2 * (k - 1)) if k > 1 else 0.0  # Tijdeman's bound
    previous: set[int] = set()
    for n in sorted({max(1, min(total - 1, int(f * total))) for f in sizes}):
        pos = training_subsample(labels, n, np.random.default_rng(seed))
        assert len(pos) == n and len(set(pos.tolist())) == n and pos.min() >= 0 and pos.max() < total
        assert previous <= set(pos.tolist())  # nested: the 25 are part of the 50
        previous = set(pos.tolist())
        got = np.bincount(labels[pos], minlength=len(counts))
        share = n * np.asarray(counts) / total
        assert np.all(np.abs(got - share) <= bound + 1e-9), (n, got, share)


def test_every_prefix_of_an_uneven_client_stays_within_tijdemans_bound():
    counts = [20, 20, 2, 28, 17]  # a label far below the others: the bound is tight here
    labels = np.random.default_rng(0).permutation(np.repeat(np.arange(5), counts))
    bound = 1.0 - 1.0 / (2 * (len(counts) - 1))
    for n in range(1, len(labels)):
        got = np.bincount(labels[training_subsample(labels, n, np.random.default_rng(0))], minlength=5)
        assert np.all(np.abs(got - n * np.asarray(counts) / len(labels)) <= bound + 1e-9), n


def test_a_capped_client_is_the_same_in_every_process_and_another_seed_draws_another_subsample():
    s = DataSettings(partition="iid", seed=4, train_samples=20)
    a = load_client_data(s, 1, 5)
    load_client_data.cache_clear()
    b = load_client_data(s, 1, 5)
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_train, b.y_train)
    from dataclasses import replace

    other = load_client_data(replace(s, seed=5), 1, 5)
    assert not torch.equal(a.x_train, other.x_train)


def test_no_cap_or_a_cap_above_the_split_keeps_every_sample():
    labels = np.array([0, 1, 1, 2, 2, 2])
    for n in (0, 6, 50):
        np.testing.assert_array_equal(training_subsample(labels, n, np.random.default_rng(0)), np.arange(6))


def test_the_subsample_depends_on_the_seed():
    labels = np.repeat(np.arange(3), 40)
    a = training_subsample(labels, 30, np.random.default_rng(0))
    b = training_subsample(labels, 30, np.random.default_rng(1))
    assert not np.array_equal(a, b)
    np.testing.assert_array_equal(a, training_subsample(labels, 30, np.random.default_rng(0)))


@pytest.mark.parametrize(
    "base",
    [
        DataSettings(partition="dirichlet", alpha=0.5, seed=3),
        DataSettings(partition="pathological", classes_per_client=2, seed=1, feature_shift=2),
        DataSettings(partition="two-source", seed=0),
    ],
)
def test_a_capped_client_trains_on_part_of_its_split_and_keeps_its_validation_and_test_splits(base):
    from dataclasses import replace

    full = load_client_data(base, 3, 8)
    cap = len(full.y_train) // 3
    small = load_client_data(replace(base, train_samples=cap), 3, 8)
    assert len(small.y_train) == cap
    assert _rows(small.x_train) <= _rows(full.x_train)  # a subsample of the same client's training split
    for split in ("x_val", "y_val", "x_test", "y_test", "x_calib", "y_calib"):
        a, b = getattr(full, split), getattr(small, split)
        assert (a is None and b is None) or torch.equal(a, b), split
    # every label the client has stays, in about its share
    hist_full, hist_small = full.label_histogram(), small.label_histogram()
    assert np.all(np.abs(hist_small - cap * hist_full / hist_full.sum()) <= 1.0 + 1e-9)
    # a cap above the split changes nothing
    same = load_client_data(replace(base, train_samples=len(full.y_train) + 5), 3, 8)
    assert torch.equal(same.x_train, full.x_train) and torch.equal(same.y_train, full.y_train)


def test_the_dialect_task_is_capped_in_lines():
    base = DataSettings(dataset="dialects", partition="planted-clusters", num_clusters=3, dialect_sequences=40)
    from dataclasses import replace

    full = load_client_data(base, 1, 3)
    small = load_client_data(replace(base, train_samples=7), 1, 3)
    assert len(small.x_train) == 7 and _rows(small.x_train) <= _rows(full.x_train)
    assert torch.equal(small.x_test, full.x_test) and torch.equal(small.x_val, full.x_val)


def test_a_node_data_file_is_capped_too(tmp_path):
    rng = np.random.default_rng(0)
    path = tmp_path / "me.npz"
    np.savez(path, x=rng.random((90, 1, 8, 8)).astype(np.float32), y=np.repeat(np.arange(3), 30))
    full = load_local_file(str(path), DataSettings(), 0)
    small = load_local_file(str(path), DataSettings(train_samples=12), 0)
    assert len(small.y_train) == 12 and _rows(small.x_train) <= _rows(full.x_train)
    np.testing.assert_array_equal(np.bincount(small.y_train.numpy()), [4, 4, 4])
    assert torch.equal(small.x_test, full.x_test) and torch.equal(small.x_val, full.x_val)


def test_the_run_config_key_reaches_the_data_settings_and_refuses_a_negative_cap():
    assert parse_settings({"train-samples": 25}).data.train_samples == 25
    assert parse_settings({}).data.train_samples == 0
    with pytest.raises(ValueError, match=r"'train-samples' must be an integer >= 0, got -1"):
        parse_settings({"train-samples": -1})
    with pytest.raises(ValueError, match="train-samples must be 0"):
        DataSettings(train_samples=-3)

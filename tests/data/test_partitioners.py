"""Every partitioner: sizes, disjointness, the label distribution it promises, and seeds."""

import numpy as np
import pytest

from task.data import (
    DataSettings,
    TwoSourcePartitioner,
    build_partitioner,
    index_table,
    load_centralized,
    load_client_data,
    source_shares,
    stratified_split,
)


@pytest.fixture(scope="module")
def digits():
    return load_centralized("digits")


def all_parts(part, n):
    return [np.asarray(part.load_partition(i)["idx"]) for i in range(n)]


def make(name, n, labels, **kw):
    part = build_partitioner(name, n, **kw)
    part.dataset = index_table(labels)
    return part


def assert_disjoint(parts, total):
    cat = np.concatenate(parts)
    assert len(cat) == len(set(cat.tolist()))
    assert cat.min() >= 0 and cat.max() < total


def test_digits_embedded(digits):
    assert digits.x.shape == (1797, 1, 8, 8) and digits.y.shape == (1797,)
    assert digits.x.min() >= 0.0 and digits.x.max() <= 1.0
    noisy = load_centralized("digits", noise_std=0.7)
    assert noisy.x.std() > digits.x.std()
    np.testing.assert_array_equal(noisy.x, load_centralized("digits", noise_std=0.7).x)


def test_iid_covers_everything_evenly(digits):
    parts = all_parts(make("iid", 10, digits.y), 10)
    assert_disjoint(parts, len(digits.y))
    assert sum(map(len, parts)) == len(digits.y)
    assert max(map(len, parts)) - min(map(len, parts)) <= 1


def test_dirichlet_skews_labels_more_for_small_alpha(digits):
    def skew(alpha):
        parts = all_parts(make("dirichlet", 10, digits.y, alpha=alpha, seed=1), 10)
        assert_disjoint(parts, len(digits.y))
        hists = np.array([np.bincount(digits.y[p], minlength=10) / len(p) for p in parts])
        return float(np.mean(hists.max(1)))

    assert skew(0.1) > skew(100.0) + 0.2


def test_dirichlet_is_seeded(digits):
    a = all_parts(make("dirichlet", 10, digits.y, alpha=0.5, seed=3), 10)
    b = all_parts(make("dirichlet", 10, digits.y, alpha=0.5, seed=3), 10)
    c = all_parts(make("dirichlet", 10, digits.y, alpha=0.5, seed=4), 10)
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


@pytest.mark.parametrize("k", [1, 2, 3])
def test_pathological_gives_exactly_k_classes(digits, k):
    parts = all_parts(make("pathological", 10, digits.y, classes_per_client=k, seed=0), 10)
    assert_disjoint(parts, len(digits.y))
    for p in parts:
        assert len(np.unique(digits.y[p])) == k


def test_planted_clusters(digits):
    part = make("planted-clusters", 20, digits.y, num_clusters=5, seed=0)
    parts = all_parts(part, 20)
    assert_disjoint(parts, len(digits.y))
    truth = part.ground_truth()
    for pid, p in enumerate(parts):
        labels = set(np.unique(digits.y[p]).tolist())
        assert labels == set(part.labels_of_cluster(truth[pid], 10).tolist())
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 4  # equal shards per label, up to label-count rounding


def test_planted_clusters_noisy_borrows_one_foreign_label(digits):
    part = make("planted-clusters-noisy", 20, digits.y, num_clusters=5, seed=2)
    parts = all_parts(part, 20)
    assert_disjoint(parts, len(digits.y))
    assert 0 < len(part.extra_labels) < 20
    for pid, p in enumerate(parts):
        own = set(part.labels_of_cluster(part.cluster_of(pid), 10).tolist())
        labels = set(np.unique(digits.y[p]).tolist())
        extra = labels - own
        if pid in part.extra_labels:
            assert extra == {part.extra_labels[pid]}
        else:
            assert not extra


@pytest.mark.parametrize("mixture,expected", [("10:90", (0.9, 0.1)), ("30:70", (0.7, 0.3))])
def test_two_source_mixture_shares(digits, mixture, expected):
    part = TwoSourcePartitioner(10, mixture, goal="inverted", seed=0)
    part.dataset = index_table(digits.y)
    parts = all_parts(part, 10)
    goals = [np.asarray(part.load_goal_partition(i)["idx"]) for i in range(10)]
    assert_disjoint(parts, len(digits.y))
    trained = set(np.concatenate(parts).tolist())
    for g in goals:  # goal data is only evaluated on: never trained on, no sample twice in one client's set,
        assert not trained & set(g.tolist()) and len(set(g.tolist())) == len(g)  # but shared across clients
        assert len(g) == part.goal_size == 200
    for pid, (p, g) in enumerate(zip(parts, goals, strict=True)):
        share_a = np.mean(digits.y[p] < 5)
        goal_a = np.mean(digits.y[g] < 5)
        want = expected[0] if pid < 5 else expected[1]
        assert abs(share_a - want) < 0.02
        assert abs(goal_a - (1 - want)) < 0.05  # inverted goal mixture


def test_source_shares_linear_and_random():
    np.testing.assert_allclose(source_shares("linear", 4, 0), [0.125, 0.375, 0.625, 0.875])
    r = source_shares("random", 50, 1)
    assert ((r >= 0) & (r <= 1)).all() and r.std() > 0.1
    np.testing.assert_array_equal(r, source_shares("random", 50, 1))
    with pytest.raises(ValueError, match="mixture"):
        source_shares("50:50", 4, 0)


def test_stratified_split_keeps_proportions():
    labels = np.repeat(np.arange(4), [40, 20, 10, 30])
    tr, va, te = stratified_split(labels, 0.2, 0.1, np.random.default_rng(0))
    assert len(set(tr) | set(va) | set(te)) == len(labels)
    assert not (set(tr) & set(te)) and not (set(tr) & set(va)) and not (set(va) & set(te))
    np.testing.assert_array_equal(np.bincount(labels[te], minlength=4), [8, 4, 2, 6])


def test_client_data_splits_and_feature_shift():
    s = DataSettings(partition="iid", feature_shift=3, seed=0)
    clients = [load_client_data(s, i, 6) for i in range(6)]
    assert [c.domain for c in clients] == ["original", "inverted", "rotated"] * 2
    for c in clients:
        assert len(c.y_train) > len(c.y_test) > 0 and len(c.y_val) > 0
        assert c.x_train.shape[1:] == (1, 8, 8)
    # inverted domain is 1 - x of the original pixels
    base = load_client_data(DataSettings(partition="iid", seed=0), 1, 6)
    np.testing.assert_allclose(clients[1].x_train.numpy(), 1.0 - base.x_train.numpy(), atol=1e-6)


def test_client_data_is_deterministic():
    s = DataSettings(partition="dirichlet", alpha=0.3, seed=5)
    a = load_client_data(s, 2, 8)
    load_client_data.cache_clear()
    b = load_client_data(s, 2, 8)
    assert np.array_equal(a.y_train.numpy(), b.y_train.numpy())
    assert np.array_equal(a.x_test.numpy(), b.x_test.numpy())


def test_data_copies_add_jittered_samples(digits):
    big = load_centralized("digits", copies=3)
    assert big.x.shape[0] == 3 * len(digits.y) and big.originals == len(digits.y)
    np.testing.assert_array_equal(big.y[: len(digits.y)], digits.y)
    np.testing.assert_array_equal(big.x[: len(digits.y)], digits.x)
    assert not np.allclose(big.x[len(digits.y) : 2 * len(digits.y)], digits.x)
    np.testing.assert_array_equal(big.with_copies(np.array([5, 0])), [5, 0, 1802, 1797, 3599, 3594])
    with pytest.raises(ValueError, match=r"only originals have copies: indices must be in \[0, 1797\)"):
        big.with_copies(np.array([1797]))


@pytest.mark.parametrize(
    "settings",
    [
        DataSettings(partition="dirichlet", alpha=0.5, data_copies=3, seed=0),
        DataSettings(partition="iid", data_copies=4, train_samples=150, seed=2),
        DataSettings(partition="two-source", data_copies=2, seed=1),
    ],
    ids=["dirichlet", "iid-capped", "two-source"],
)
def test_data_copies_never_put_a_near_copy_of_a_held_out_image_into_training(settings):
    """A jittered copy trains only where its original trains: no training image of any client is a copy of any
    client's validation, test or calibration image, and the held-out splits hold originals only."""
    from task.data.clients import split_indices
    from task.data.partitioners import partitioner_for

    n = 10
    _, data = partitioner_for(settings, n)
    splits = [split_indices(settings, i, n) for i in range(n)]
    held_out = np.concatenate(
        [np.concatenate([s.val, s.test, *([s.calib] if s.calib is not None else [])]) for s in splits]
    )
    trained = np.concatenate([s.train for s in splits])
    assert held_out.max() < data.originals  # originals only
    assert not set((trained % data.originals).tolist()) & set(held_out.tolist())
    # the same by content: no training image of any client is any copy of a held-out image
    training_images = {row.tobytes() for i in range(n) for row in load_client_data(settings, i, n).x_train.numpy()}
    copies_of_held_out = data.x[data.with_copies(np.unique(held_out))]
    assert not any(row.tobytes() in training_images for row in copies_of_held_out)
    assert len(trained) > len(np.unique(trained % data.originals))  # copies did enlarge the training splits


def test_data_copies_multiply_the_training_split_and_leave_held_out_splits_as_without_copies():
    one, three = DataSettings(partition="dirichlet", seed=3), DataSettings(partition="dirichlet", seed=3, data_copies=3)
    for pid in (0, 4):
        a, b = load_client_data(one, pid, 8), load_client_data(three, pid, 8)
        assert b.num_train == 3 * a.num_train
        np.testing.assert_array_equal(b.x_test.numpy(), a.x_test.numpy())
        np.testing.assert_array_equal(b.x_val.numpy(), a.x_val.numpy())
        np.testing.assert_array_equal(b.x_train.numpy()[: a.num_train], a.x_train.numpy())


def test_data_copies_add_no_clients():
    """Every client needs 2 originals: digits' 1,797 images fit 898 clients, with or without copies."""
    s = DataSettings(partition="iid", data_copies=7)
    assert load_client_data(s, 897, 898).num_train > 0
    with pytest.raises(ValueError, match=r"use at most 898 clients\) \(data-copies only enlarges training splits"):
        load_client_data(s, 0, 899)


def test_synth_concept_sources_conflict_and_mix_per_client():
    from task.data import synth_concept

    x, y, _source = synth_concept(num_samples=4000)
    assert x.shape == (4000, 10) and set(np.unique(y)) == {0, 1}
    # the two sources label the same inputs differently: a model of one source is wrong on the other
    _x2, y2, _ = synth_concept(num_samples=4000)
    np.testing.assert_array_equal(y, y2)  # deterministic
    s = DataSettings(dataset="synth-concept", partition="two-source", mixture="30:70")
    first, last = load_client_data(s, 0, 10), load_client_data(s, 9, 10)
    assert first.meta["source-a-share"] == 0.7 and last.meta["source-a-share"] == 0.3
    assert first.x_train.shape[1:] == (10,) and len(first.y_test) > 0


def test_strong_dirichlet_skew_over_many_clients_lowers_the_minimum_size_instead_of_failing(digits, caplog):
    """alpha 0.1 over 40 clients of the digits set: flwr-datasets' draws cannot give every client its minimum, so the
    minimum is halved (and the log says so) until a partition exists; every client still gets samples."""
    with caplog.at_level("INFO", logger="flwr.pflower"):
        parts = all_parts(make("dirichlet", 40, digits.y, alpha=0.1, seed=0), 40)
    assert_disjoint(parts, len(digits.y))
    assert all(len(p) >= 1 for p in parts)
    assert "lowering the minimum client size" in caplog.text


# ---------------------------------------------------------------------------------------------- quantity skew
def test_quantity_sizes_sum_to_the_data_set_and_give_everyone_the_minimum():
    from task.data.partitioners import MIN_CLIENT_SAMPLES, quantity_sizes

    for n, sigma, seed in ((10, 1.0, 0), (100, 1.0, 3), (179, 2.0, 1), (7, 0.5, 9)):
        sizes = quantity_sizes(1797, n, sigma, seed)
        assert sizes.shape == (n,) and sizes.sum() == 1797
        assert sizes.min() >= MIN_CLIENT_SAMPLES


def test_quantity_sizes_spread_grows_with_size_sigma_and_sigma_zero_is_equal():
    from task.data.partitioners import quantity_sizes

    def spread(sigma):  # coefficient of variation of the sizes, over a few seeds
        return np.mean([(s := quantity_sizes(5000, 50, sigma, seed)).std() / s.mean() for seed in range(5)])

    equal = quantity_sizes(1797, 10, 0.0, 0)
    assert equal.max() - equal.min() <= 1
    assert spread(0.25) > 0.1
    assert spread(1.0) > 2 * spread(0.25)
    assert spread(2.0) > spread(1.0)


def test_quantity_sizes_round_the_shares_by_their_largest_remainders():
    """Each client's size above the floor is its share of the rest rounded down, plus one for the clients whose
    shares lost the most in rounding (as many as the rounding lost in all)."""
    from task.data.partitioners import MIN_CLIENT_SAMPLES, quantity_sizes

    for seed in range(5):
        draws = np.random.default_rng([seed, 7_411]).lognormal(0.0, 1.0, size=13)
        share = (1000 - 13 * MIN_CLIENT_SAMPLES) * draws / draws.sum()
        extra = quantity_sizes(1000, 13, 1.0, seed) - MIN_CLIENT_SAMPLES - np.floor(share)
        assert set(extra.tolist()) <= {0, 1} and extra.sum() == round(share.sum() - np.floor(share).sum())
        remainders = share - np.floor(share)
        assert remainders[extra == 1].min(initial=1.0) >= remainders[extra == 0].max(initial=0.0)


def test_quantity_sizes_of_one_client_or_of_exactly_the_minimum_each():
    from task.data.partitioners import MIN_CLIENT_SAMPLES, quantity_sizes

    assert quantity_sizes(57, 1, 1.0, 0).tolist() == [57]
    assert quantity_sizes(7 * MIN_CLIENT_SAMPLES, 7, 1.0, 0).tolist() == [MIN_CLIENT_SAMPLES] * 7
    with pytest.raises(ValueError, match="num-partitions must be >= 1, got 0"):
        quantity_sizes(57, 0, 1.0, 0)


def test_quantity_sizes_follow_the_lognormal_draws_beyond_the_minimum():
    """Above the floor every client gets a share in proportion to its own draw: sizes are ordered as the draws,
    and the largest client is many times the smallest at size-sigma 1."""
    from task.data.partitioners import MIN_CLIENT_SAMPLES, quantity_sizes

    draws = np.random.default_rng([4, 7_411]).lognormal(0.0, 1.0, size=20)
    sizes = quantity_sizes(10_000, 20, 1.0, 4)
    spare = 10_000 - MIN_CLIENT_SAMPLES * 20
    np.testing.assert_allclose(sizes - MIN_CLIENT_SAMPLES, spare * draws / draws.sum(), atol=1.0)
    assert sizes.max() > 5 * sizes.min()


def test_quantity_sizes_are_seeded():
    from task.data.partitioners import quantity_sizes

    np.testing.assert_array_equal(quantity_sizes(1797, 30, 1.0, 5), quantity_sizes(1797, 30, 1.0, 5))
    assert not np.array_equal(quantity_sizes(1797, 30, 1.0, 5), quantity_sizes(1797, 30, 1.0, 6))


def test_quantity_sizes_refuse_too_many_clients_saying_how_many_fit():
    from task.data.partitioners import quantity_sizes

    assert quantity_sizes(1797, 179, 1.0, 0).min() == 10  # exactly enough
    with pytest.raises(ValueError, match=r"at least 10 samples: 180 clients need 1800, the data set has 1797; "):
        quantity_sizes(1797, 180, 1.0, 0)
    with pytest.raises(ValueError, match="use at most 179 clients"):
        quantity_sizes(1797, 500, 1.0, 0)
    with pytest.raises(ValueError, match="size-sigma must be >= 0"):
        quantity_sizes(1797, 10, -0.5, 0)


def test_quantity_dirichlet_partition_has_the_drawn_sizes_and_covers_the_data(digits):
    part = make("quantity-dirichlet", 30, digits.y, alpha=0.5, size_sigma=1.0, seed=2)
    parts = all_parts(part, 30)
    assert_disjoint(parts, len(digits.y))
    assert sum(map(len, parts)) == len(digits.y)
    np.testing.assert_array_equal([len(p) for p in parts], part.partition_sizes)
    assert max(map(len, parts)) > 4 * min(map(len, parts))


@pytest.mark.parametrize("sigma", [0.0, 0.5])
def test_quantity_dirichlet_labels_are_seeded_whatever_the_sizes(digits, sigma):
    """Equal sizes (size-sigma 0) or not, a seed gives the same partition and another seed another one."""

    def parts(seed):
        return all_parts(make("quantity-dirichlet", 8, digits.y, alpha=0.5, size_sigma=sigma, seed=seed), 8)

    assert all(np.array_equal(a, b) for a, b in zip(parts(1), parts(1), strict=True))
    other = parts(2)
    assert not all(np.array_equal(np.sort(a), np.sort(b)) for a, b in zip(parts(1), other, strict=True))
    if sigma == 0.0:
        assert max(map(len, other)) - min(map(len, other)) <= 1


def test_quantity_dirichlet_skews_labels_more_for_small_alpha(digits):
    def skew(alpha):  # mean share of a client's most common label, over the clients of a few seeds
        parts = [
            p
            for seed in range(3)
            for p in all_parts(make("quantity-dirichlet", 10, digits.y, alpha=alpha, seed=seed), 10)
        ]
        return float(np.mean([np.bincount(digits.y[p], minlength=10).max() / len(p) for p in parts]))

    assert skew(0.1) > skew(100.0) + 0.2


def test_quantity_dirichlet_refuses_bad_parameters(digits):
    with pytest.raises(ValueError, match="alpha must be > 0 for partition 'quantity-dirichlet'"):
        build_partitioner("quantity-dirichlet", 10, alpha=0.0)
    with pytest.raises(ValueError, match="size-sigma must be >= 0"):
        build_partitioner("quantity-dirichlet", 10, size_sigma=-1.0)


def test_quantity_dirichlet_clients_get_their_splits_and_too_many_clients_fail_clearly():
    s = DataSettings(partition="quantity-dirichlet", alpha=0.5, size_sigma=1.0, seed=1)
    clients = [load_client_data(s, i, 12) for i in range(12)]
    totals = [c.num_train + len(c.y_val) + len(c.y_test) for c in clients]
    assert sum(totals) == 1797 and min(totals) >= 10 and max(totals) > 4 * min(totals)
    with pytest.raises(ValueError, match="use at most 179 clients"):
        load_client_data(s, 0, 200)

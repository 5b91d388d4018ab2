"""pFedLIA's math (pfedlia.md §2.4-§2.8), checked on rows and matrices whose right answer is known by construction.

The client's side: the lazy-influence row (Eq. 1) and its reductions, the 2-means split that picks the beneficial
peers.  The server's side: the clustering features, OPTICS and its noise handling, late joiners, the peer-to-peer
groups; and CFL's split rule (Sattler et al.), the baseline pFedLIA is compared with.
"""

import itertools

import numpy as np
import pytest
import torch

from client_app.pfedlia_math import beneficial_peers, lazy_influence_row
from strategies.cfl_math import cosine_similarity_matrix, optimal_bipartition, should_split
from strategies.pfedlia_math import (
    adjusted_rand,
    assign_late_joiner,
    cluster_features,
    cluster_influence,
    groups_from_sets,
    reassign_noise,
)
from task.config import parse_settings


def test_lazy_influence_row_reductions():
    row = lazy_influence_row(1.0, np.array([0.5, 1.5]), num_val=10)
    np.testing.assert_allclose(row, [5.0, -5.0])
    np.testing.assert_allclose(lazy_influence_row(1.0, np.array([0.5, 1.5]), 10, "mean"), [0.5, -0.5])
    with pytest.raises(ValueError, match="lia-reduction"):
        lazy_influence_row(1.0, np.array([0.5]), 1, "max")


def test_two_means_on_rows():
    row = np.array([9.0, -3.0, 8.5, -4.0, 7.9, -2.5])
    np.testing.assert_array_equal(beneficial_peers(row, 0), [0, 2, 4])
    constant = np.array([1.0, 1.0, 1.0, 1.0])
    np.testing.assert_array_equal(beneficial_peers(constant, 2), [0, 1, 2, 3])  # constant row: everyone
    all_negative = np.array([-1.0, -50.0, -2.0, -60.0])
    np.testing.assert_array_equal(beneficial_peers(all_negative, 0), [0, 2])  # a top group is still taken
    np.testing.assert_array_equal(beneficial_peers(all_negative, 0, require_positive=True), [0])


def test_optics_recovers_blocks_and_reassigns_noise():
    rng = np.random.default_rng(0)
    truth = np.repeat(np.arange(3), 6)
    centers = rng.normal(0, 10, size=(3, 18))
    matrix = centers[truth] + rng.normal(0, 0.5, size=(18, 18))
    labels = cluster_influence(matrix, min_samples=3)
    assert adjusted_rand(truth, labels) == 1.0 and (labels >= 0).all()
    feats = np.array([[0.0], [0.1], [5.0], [5.1], [2.4]])
    np.testing.assert_array_equal(reassign_noise(feats, np.array([0, 0, 1, 1, -1])), [0, 0, 1, 1, 0])
    np.testing.assert_array_equal(reassign_noise(feats, np.array([0, 0, 1, 1, -1]), "singleton"), [0, 0, 1, 1, 2])
    np.testing.assert_array_equal(reassign_noise(feats, np.array([-1, -1, -1, -1, -1])), [0, 0, 0, 0, 0])
    with pytest.raises(ValueError, match="lia-noise"):
        reassign_noise(feats, np.array([0, 0, 1, 1, -1]), "drop")


def test_late_joiner_and_p2p_groups():
    labels = np.array([0, 0, 1, 1])
    assert assign_late_joiner(np.array([-5.0, -4.0, 3.0, 2.0]), labels) == 1
    groups = groups_from_sets({1: frozenset({1, 2}), 2: frozenset({1, 2}), 3: frozenset({3})})
    assert groups[1] == groups[2] != groups[3]


def test_cfl_bipartition_and_split_criterion():
    from strategies.cfl_math import cosine_similarity_matrix, optimal_bipartition, should_split

    rng = np.random.default_rng(0)
    a, b = rng.normal(size=50), rng.normal(size=50)
    updates = np.stack(
        [a + 0.1 * rng.normal(size=50) for _ in range(3)] + [b + 0.1 * rng.normal(size=50) for _ in range(3)]
    )
    left, right = optimal_bipartition(cosine_similarity_matrix(updates))
    assert {tuple(sorted(left)), tuple(sorted(right))} == {(0, 1, 2), (3, 4, 5)}
    opposed = np.concatenate([updates[:3], -updates[:3]])
    split, mean_norm, max_norm = should_split(opposed, eps1=1.0, eps2=1.0)
    assert split and mean_norm < 1e-9 and max_norm > 1.0
    assert not should_split(updates, eps1=1.0, eps2=1.0)[0]  # mean update still large: keep training together


# ------------------------------------------------------------------------------------------ math
def test_influence_row_is_the_summed_loss_drop_and_mean_is_per_sample():
    warm, lazy = 0.9, np.array([0.4, 1.3, 0.9])
    np.testing.assert_allclose(lazy_influence_row(warm, torch.tensor(lazy), 7, "sum"), 7 * (warm - lazy), atol=1e-5)
    np.testing.assert_allclose(
        lazy_influence_row(torch.tensor(warm), torch.tensor(lazy), 7, "mean"), warm - lazy, atol=1e-6
    )
    with pytest.raises(ValueError, match="lia-reduction"):
        lazy_influence_row(warm, torch.tensor(lazy), 7, "median")


def test_two_clients_each_find_the_other_beneficial():
    np.testing.assert_array_equal(beneficial_peers(np.array([3.0, -8.0]), 0), [0, 1])
    np.testing.assert_array_equal(beneficial_peers(np.array([3.0]), 0), [0])


def test_two_means_splits_small_scores_too():
    # scores well below 1 in magnitude still form two groups (no absolute tolerance swallows them)
    row = np.array([0.0, 0.30, 0.01, 0.32, 0.02, 0.31])
    np.testing.assert_array_equal(beneficial_peers(row, 0), [0, 1, 3, 5])


def test_a_row_constant_up_to_rounding_means_everyone_even_for_large_negative_scores():
    base = -1.0e4
    row = np.array([5.0, base, base + 2e-9, base, base + 2e-9])  # float noise on a constant row
    np.testing.assert_array_equal(beneficial_peers(row, 0), [0, 1, 2, 3, 4])


def test_scores_that_differ_only_at_rounding_scale_mean_everyone():
    # the spread passes the constant-row test, but 2-means' two centres lie within 1e-12 of each other
    np.testing.assert_array_equal(beneficial_peers(np.array([5.0, 0.0, 0.55e-12, 1.1e-12]), 0), [0, 1, 2, 3])


def test_require_positive_drops_peers_whose_influence_is_not_positive():
    row = np.array([4.0, 0.0, 0.0, -9.0, -10.0])  # the top group scores exactly zero
    np.testing.assert_array_equal(beneficial_peers(row, 0), [0, 1, 2])
    np.testing.assert_array_equal(beneficial_peers(row, 0, require_positive=True), [0])


def test_self_index_anywhere_is_always_included_and_never_clustered():
    row = np.array([-40.0, 7.0, -50.0, 6.5, -49.0])
    np.testing.assert_array_equal(beneficial_peers(row, 2), [1, 2, 3])  # its own (low) score does not count


def optimal_upper_group(values):
    """The exact 2-means split of 1-D values: sort, try every threshold, keep the least within-group squared
    error; returns the positions of the group with the larger mean."""
    order = np.argsort(values)
    s = np.asarray(values, float)[order]
    sse = [((s[:k] - s[:k].mean()) ** 2).sum() + ((s[k:] - s[k:].mean()) ** 2).sum() for k in range(1, len(s))]
    return sorted(order[int(np.argmin(sse)) + 1 :].tolist())


# rows on which a single k-means start (or another seed) lands in a worse local optimum than the 2-means split
HARD_ROWS = [
    [-1.0, 3.0, -1.8, 0.9, 1.3, 4.4, -1.5, 5.2, 0.5, -0.6, -2.0, 1.8, 0.1, -3.3, -3.4, -1.7],
    [-3.0, -1.2, 0.3, -7.7, 1.1, 4.2],
    [
        -2.4,
        -3.1,
        3.3,
        3.5,
        -0.4,
        4.0,
        -1.4,
        -1.0,
        -3.9,
        6.3,
        0.5,
        2.3,
        -4.6,
        1.7,
        -5.2,
        -1.8,
        2.2,
        4.5,
        5.0,
        0.1,
        -3.7,
        1.4,
    ],
    [2.6, -0.1, 1.0, 0.3, 5.3, 0.8, 3.7, -0.4, -2.4, -4.6, -3.2, 1.4, -2.9, 3.4, -1.1, -5.6, 0.6, -1.5, 5.7],
    [1.1, 3.5, -3.0, -6.8, 2.3, -3.6, -1.0, -3.5, 3.2, 2.6, -2.2, 2.7, 0.4, -0.4, 0.2, -0.6, 1.8, 0.9],
    [3.0, -2.9, 2.3, -0.3, 3.4, 1.4, -3.3, 0.4],
    [
        -0.8,
        -2.1,
        2.6,
        -2.7,
        -8.2,
        -3.2,
        0.3,
        -9.2,
        -1.1,
        -1.0,
        -4.3,
        -4.4,
        -1.4,
        -1.6,
        3.8,
        1.1,
        -4.7,
        -2.6,
        2.1,
        5.7,
        1.2,
    ],
]


@pytest.mark.parametrize("values", HARD_ROWS)
def test_beneficial_peers_are_the_upper_group_of_the_2_means_split(values):
    row = np.array([100.0, *values])  # the client itself first; its own score takes no part
    expected = [0] + [j + 1 for j in optimal_upper_group(values)]
    np.testing.assert_array_equal(beneficial_peers(row, 0), expected)


def test_two_means_with_two_peers_still_separates_them():
    np.testing.assert_array_equal(beneficial_peers(np.array([0.0, 5.0, -5.0]), 0), [0, 1])


def test_symmetric_scores_are_two_groups_not_a_constant_row():
    np.testing.assert_array_equal(beneficial_peers(np.array([0.0, 3.0, 3.0, -3.0, -3.0]), 0), [0, 1, 2])


def test_three_levels_give_the_upper_two_levels_in_one_group():
    row = np.array([0.0, 10.0, 9.0, 5.0, 4.8, -30.0, -31.0])
    np.testing.assert_array_equal(beneficial_peers(row, 0), [0, 1, 2, 3, 4])


def test_require_positive_keeps_small_positive_influences():
    row = np.array([4.0, 0.5, 0.6, -9.0, -10.0])
    np.testing.assert_array_equal(beneficial_peers(row, 0, require_positive=True), [0, 1, 2])


def test_rounding_tolerance_of_coinciding_centroids_is_1e_12_inclusive_and_absolute_below_one():
    """pfedlia.md §2.5: coinciding centroids (a constant row) mean every peer.  "Coinciding" is up to 1e-12: two groups
    whose centroids are exactly 1e-12 apart coincide; scores of magnitude below one that spread by 1.5e-12 (centroids
    1.5e-12 apart) are two groups, the tolerance there being absolute (1e-12), not larger."""
    exactly = np.array([9.0, -1e-13, 1e-13, 1e-12 - 1e-13, 1e-12 + 1e-13])  # centroids 0 and 1e-12, spread 1.2e-12
    np.testing.assert_array_equal(beneficial_peers(exactly, 0), [0, 1, 2, 3, 4])
    apart = np.array([9.0, 0.0, 0.0, 1.5e-12, 1.5e-12])
    np.testing.assert_array_equal(beneficial_peers(apart, 0), [0, 3, 4])


def test_features_are_the_rows_as_votes_or_standardised():
    m = np.array([[2.0, -1.0, 0.0], [5.0, 5.0, 5.0]])
    np.testing.assert_array_equal(cluster_features(m), m)
    np.testing.assert_array_equal(cluster_features(m, "sign"), [[1.0, 0.0, 0.0], [1.0, 1.0, 1.0]])  # 0 is no vote
    z = cluster_features(m, standardize=True)
    np.testing.assert_allclose(z[0], (m[0] - m[0].mean()) / m[0].std())
    np.testing.assert_array_equal(z[1], [0.0, 0.0, 0.0])  # a constant row stays finite
    with pytest.raises(ValueError, match="lia-score"):
        cluster_features(m, "rank")
    # a small positive influence is a vote too, and a row of small influences is standardised to unit spread
    small = np.array([[0.3, -0.2, 0.1]])
    np.testing.assert_array_equal(cluster_features(small, "sign"), [[1.0, 0.0, 1.0]])
    assert cluster_features(small, standardize=True).std() == pytest.approx(1.0)


def test_noise_points_join_the_cluster_of_their_nearest_clustered_point():
    feats = np.array([[0.0, 0.0], [0.0, 1.0], [10.0, 0.0], [10.0, 1.0], [7.0, 0.5], [1.0, 0.8]])
    labels = np.array([4, 4, 7, 7, -1, -1])
    got = reassign_noise(feats, labels)
    np.testing.assert_array_equal(got, [4, 4, 7, 7, 7, 4])
    np.testing.assert_array_equal(labels, [4, 4, 7, 7, -1, -1])  # the caller's labels are not modified
    np.testing.assert_array_equal(reassign_noise(feats, np.array([4, 4, 7, 7, 0, 1])), [4, 4, 7, 7, 0, 1])
    single = reassign_noise(feats, labels, "singleton")
    assert single[:4].tolist() == [4, 4, 7, 7] and len(set(single[4:].tolist()) | {4, 7}) == 4
    # all noise (OPTICS found no cluster): everyone forms one cluster
    assert reassign_noise(feats, np.full(6, -1)).tolist() == [0] * 6


def test_the_noise_mode_reaches_the_clustering():
    rng = np.random.default_rng(0)
    rows = np.vstack(
        [rng.normal(0, 0.1, (4, 2)), rng.normal(0, 0.1, (4, 2)) + np.array([50, 0]), [[25, 40]]]
    )  # + an outlier
    np.testing.assert_array_equal(cluster_influence(rows, min_samples=3), [0, 0, 0, 0, 1, 1, 1, 1, 0])
    np.testing.assert_array_equal(
        cluster_influence(rows, min_samples=3, noise="singleton"), [0, 0, 0, 0, 1, 1, 1, 1, 2]
    )


def test_optics_finds_clusters_of_two_when_min_samples_allows_it_and_caps_min_samples_at_n():
    rng = np.random.default_rng(0)
    truth = np.repeat(np.arange(3), 2)
    centers = np.array([[0.0, 0.0], [50.0, 0.0], [0.0, 50.0]])
    x = centers[truth] + rng.normal(0, 0.1, size=(6, 2))
    labels = cluster_influence(x, min_samples=2)
    assert adjusted_rand(truth, labels) == 1.0
    assert sorted(set(labels.tolist())) == [0, 1, 2]  # dense labels
    assert len(cluster_influence(x[:3], min_samples=5)) == 3  # min_samples larger than N still runs
    one = cluster_influence(np.ones((1, 1)))
    np.testing.assert_array_equal(one, [0])
    assert one.dtype == labels.dtype == np.int64  # cluster ids index arrays, whatever N is


def test_standardised_rows_cluster_by_pattern_not_by_offset():
    pattern = np.array([[1.0] * 4 + [0.0] * 4, [0.0] * 4 + [1.0] * 4])
    truth = np.array([0, 1] * 4)
    offsets = np.array([0.0, 0.0, 300.0, 300.0, 600.0, 600.0, 900.0, 900.0])
    rng = np.random.default_rng(1)
    m = offsets[:, None] + 5.0 * pattern[truth] + rng.normal(0, 0.01, size=(8, 8))
    labels = cluster_influence(m, min_samples=3, standardize=True)
    assert adjusted_rand(truth, labels) == 1.0


def test_sign_votes_cluster_by_who_helps_whom_not_by_magnitude():
    truth = np.array([0, 0, 0, 1, 1, 1])
    helps = np.where(truth[:, None] == truth[None, :], 1.0, -1.0)
    scale = np.array([1.0, 80.0, 0.5, 120.0, 2.0, 40.0])[:, None]  # very different score magnitudes per row
    labels = cluster_influence(helps * scale, min_samples=2, score="sign")
    assert adjusted_rand(truth, labels) == 1.0


def test_late_joiner_joins_the_cluster_its_lazy_scores_favour_on_average():
    labels = np.array([5, 5, 2, 2, 2])
    assert assign_late_joiner(np.array([1.0, 1.0, 3.0, -4.0, 2.0]), labels) == 5  # mean 1.0 vs 0.33
    assert assign_late_joiner(np.array([-1.0, -1.0, 0.0, 0.0, 0.5]), labels) == 2


def test_identical_beneficial_sets_share_one_group_numbered_in_node_order():
    sets = {30: frozenset({10, 30}), 10: frozenset({10, 30}), 20: frozenset({20})}
    assert groups_from_sets(sets) == {10: 0, 20: 1, 30: 0}


def test_adjusted_rand_ignores_label_names():
    assert adjusted_rand([0, 0, 1, 1], [7, 7, 3, 3]) == 1.0
    assert adjusted_rand([0, 0, 1, 1], [0, 1, 0, 1]) < 0.5


# ------------------------------------------------------------------------------------------ CFL
def test_cosine_similarity_of_updates_including_a_zero_update():
    u = np.array([[1.0, 0.0], [0.0, 2.0], [-3.0, 0.0], [0.0, 0.0]])
    s = cosine_similarity_matrix(u)
    np.testing.assert_allclose(s[:3, :3], [[1, 0, -1], [0, 1, 0], [-1, 0, 1]], atol=1e-12)
    assert np.isfinite(s).all() and (np.abs(s) <= 1.0).all()
    np.testing.assert_allclose(s[3], 0.0)


def test_cosine_similarity_of_small_updates_and_rounding_kept_inside_minus_one_one():
    small = np.array([[0.03, 0.04], [0.04, 0.03], [0.0, 0.001]])  # norms below 1: still cosines, not dot products
    np.testing.assert_allclose(
        cosine_similarity_matrix(small), [[1, 0.96, 0.8], [0.96, 1, 0.6], [0.8, 0.6, 1]], atol=1e-12
    )
    # this direction's normalised self-product rounds to 1 + 2e-16 (and -1 - 2e-16 against its opposite):
    # a cosine stays in [-1, 1], so 1 - similarity is a valid distance
    d = np.array([[0.008142180518343508, -0.2756029052993704, 1.2940638143982073, 1.0067243153057943]])
    s = cosine_similarity_matrix(np.vstack([d, -d]))
    assert s.max() == 1.0 and s.min() == -1.0


def test_bipartition_separates_opposed_groups_and_needs_two_clients():
    rng = np.random.default_rng(3)
    d = rng.normal(size=20)
    u = np.stack(
        [d + 0.05 * rng.normal(size=20) for _ in range(2)] + [-d + 0.05 * rng.normal(size=20) for _ in range(3)]
    )
    left, right = optimal_bipartition(cosine_similarity_matrix(u))
    assert {tuple(left.tolist()), tuple(right.tolist())} == {(0, 1), (2, 3, 4)}
    with pytest.raises(ValueError, match=r"^a bipartition needs at least two clients$"):
        optimal_bipartition(np.ones((1, 1)))


def test_two_clients_are_bipartitioned_one_each():
    left, right = optimal_bipartition(cosine_similarity_matrix(np.array([[1.0, 0.2], [0.3, -1.0]])))
    assert {tuple(left.tolist()), tuple(right.tolist())} == {(0,), (1,)}


def test_bipartition_minimises_the_largest_cross_group_similarity():
    # Sattler et al.: complete linkage on the distance 1 - similarity; checked against every split of five clients
    u = np.array([[-0.2, -1.0, 0.6], [-0.2, -0.4, 0.5], [-0.5, 1.4, 0.4], [-0.5, -1.9, -1.3], [1.1, -0.1, -0.3]])
    sim = cosine_similarity_matrix(u)

    def cross(group):
        rest = [i for i in range(5) if i not in group]
        return sim[np.ix_(list(group), rest)].max()

    splits = [g for r in (1, 2) for g in itertools.combinations(range(5), r)]
    best = min(splits, key=cross)
    left, right = optimal_bipartition(sim)
    got = left if len(left) <= len(right) else right
    assert tuple(got.tolist()) == best == (2,)


@pytest.mark.parametrize("eps1, eps2, expected", [(0.5, 1.0, True), (0.02, 1.0, False), (0.5, 3.0, False)])
def test_split_when_the_mean_update_is_small_and_some_update_is_large(eps1, eps2, expected):
    u = np.array([[2.0, 0.0], [-2.0, 0.2], [0.0, -0.1]])  # mean (0, 0.0333), norms 2, 2.01, 0.1
    split, mean_norm, max_norm = should_split(u, eps1, eps2)
    assert mean_norm == pytest.approx(np.linalg.norm(u.mean(0)))
    assert max_norm == pytest.approx(np.linalg.norm(u, axis=1).max())
    assert split is expected


def test_split_criterion_is_strict_at_both_thresholds():
    u = np.array([[3.0, 0.0], [0.0, 0.0], [0.0, 0.0]])  # mean norm exactly 1, largest norm exactly 3
    assert should_split(u, 1.01, 2.99)[0]
    assert not should_split(u, 1.0, 2.99)[0]  # mean norm < eps1, not <=
    assert not should_split(u, 1.01, 3.0)[0]  # max norm > eps2, not >=


def test_cfl_may_first_split_in_the_last_round_but_not_after_it():
    from task.options import ConfigConflict

    parse_settings({"method": "cfl", "num-server-rounds": 5, "cfl-min-rounds": 5})
    with pytest.raises(ConfigConflict) as err:
        parse_settings({"method": "cfl", "num-server-rounds": 5, "cfl-min-rounds": 6})
    assert str(err.value) == (
        "cfl-min-rounds=6 is after the last round (num-server-rounds=5): no cluster could ever split; use "
        "cfl-min-rounds <= num-server-rounds"
    )


def test_two_clients_are_never_split():
    assert not should_split(np.array([[1.0, 0.0], [-1.0, 0.0]]), 0.5, 0.5)[0]

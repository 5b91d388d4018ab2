"""pFedLIA pieces (pfedlia.md §2.4-§2.8): influence-row sign, OPTICS noise handling, 2-means, late joiners."""

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, RecordDict

from client_app.pfedlia_math import beneficial_peers, lazy_influence_row
from server_app.app import build_strategy
from strategies.pfedlia_math import (
    adjusted_rand,
    assign_late_joiner,
    cluster_influence,
    groups_from_sets,
    reassign_noise,
)
from task.config import parse_settings
from task.methods import METHODS, load_object
from task.params import record_to_numpy, to_record

CFG = {
    "method": "pfedlia",
    "partition": "planted-clusters",
    "num-clusters": 2,
    "model": "mlp",
    "momentum": 0.0,
    "batch-size": 16,
    "val-fraction": 0.25,
    "lazy-epochs": 10,
    "lia-mode": "p2p",
}


def client(pid, n=4, **extra):
    cfg = {**CFG, **extra}
    ctx = Context(
        run_id=1,
        node_id=100 + pid,
        node_config={"partition-id": pid, "num-partitions": n},
        state=RecordDict(),
        run_config=cfg,
    )
    return load_object(METHODS["pfedlia"].client)(ctx, parse_settings(cfg))


def test_influence_row_sign_same_labels_positive_disjoint_labels_negative():
    # planted clusters of 2: clients 0, 2 hold digits 0-4; clients 1, 3 hold digits 5-9
    theta0 = build_strategy(parse_settings(CFG)).global_state
    lazy = {}
    for pid in range(4):
        reply = client(pid).query("lazy", RecordDict({"arrays": to_record(theta0)}))
        lazy[pid] = record_to_numpy(reply["arrays"])
    stacked = {k: np.stack([lazy[p][k] for p in range(4)]) for k in theta0}
    content = RecordDict(
        {
            "arrays": to_record(theta0),
            "lazy": to_record(stacked),
            "lazy-nodes": ConfigRecord({"node-ids": [100, 101, 102, 103], "self-index": 0}),
        }
    )
    reply = client(0).query("lia", content)
    row = np.array(reply["metrics"]["lia-row"])
    assert row[2] > 0 and row[0] > 0  # a peer trained on my labels (and I myself) help
    assert row[1] < 0 and row[3] < 0  # disjoint-label peers hurt
    assert list(reply["metrics"]["beneficial"]) == [0, 2]


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


def test_bad_pfedlia_config():
    with pytest.raises(ValueError, match="lia-mode"):
        build_strategy(parse_settings({"method": "pfedlia", "lia-mode": "both"}))
    with pytest.raises(ValueError, match="warmup-rounds"):
        build_strategy(parse_settings({"method": "pfedlia", "warmup-rounds": 0}))


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

"""FedCAC invariants (fedcac.md §7) on hand-made tensors, plus the client/strategy round trip."""

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Context, RecordDict
from hypothesis import given, settings
from hypothesis import strategies as st

from client_app.fedcac_math import critical_masks, merge_customized, parameter_sensitivity
from server_app.app import build_strategy
from strategies.fedcac_math import (
    collaboration_matrix,
    collaborator_label_similarity,
    collaborators,
    customized_models,
    global_average,
    mask_overlap,
    overlap_threshold,
)
from task.config import parse_settings
from task.methods import METHODS, load_object
from task.methods.fedcac import pack_masks, unpack_masks
from task.models import build_model
from task.params import to_record


def random_masks(rng, n_clients, n, tau):
    k = int(tau * n)
    out = np.zeros((n_clients, n), bool)
    for i in range(n_clients):
        out[i, rng.choice(n, k, replace=False)] = True
    return out


@pytest.mark.parametrize("tau", [0.0, 0.1, 0.5, 0.77, 1.0])
def test_masks_have_exactly_floor_tau_n_ones_per_tensor_and_are_top_k(tau):
    model = build_model("cnn", 1, 8, 10, seed=0)
    torch.manual_seed(1)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    after = {n: p + 0.01 * torch.randn_like(p) for n, p in before.items()}
    s = parameter_sensitivity(before, after)
    masks = critical_masks(s, tau)
    total = 0
    for name, m in masks.items():
        assert m.shape == before[name].shape and m.dtype == torch.bool
        assert int(m.sum()) == int(np.floor(tau * m.numel() + 1e-9))
        if 0 < m.sum() < m.numel():
            assert s[name][m].min() >= s[name][~m].max()  # invariant 2: top-k correctness
        total += int(m.sum())
    n = sum(p.numel() for p in before.values())
    assert total / n <= tau + 1e-12 and tau - total / n <= len(masks) / n


def test_sensitivity_ignores_sign_and_is_zero_where_nothing_moved():
    before = {"w": torch.tensor([1.0, 2.0, 0.0, 3.0])}
    up = {"w": torch.tensor([1.5, 2.0, 0.0, 2.0])}
    down = {"w": torch.tensor([0.5, 2.0, 0.0, 4.0])}
    s_up = parameter_sensitivity(before, up)["w"]
    assert s_up[1] == 0 and s_up[2] == 0
    torch.testing.assert_close(parameter_sensitivity(before, {"w": torch.tensor([1.5, 2.0, 0.0, 2.0])})["w"], s_up)
    assert (parameter_sensitivity(before, down)["w"] >= 0).all()


def test_overlap_properties():
    rng = np.random.default_rng(0)
    m = random_masks(rng, 6, 20_000, 0.3)
    o = mask_overlap(m)
    np.testing.assert_allclose(np.diag(o), 1.0)
    np.testing.assert_allclose(o, o.T)  # equal-size masks
    assert ((o >= 0) & (o <= 1)).all()
    off = o[~np.eye(6, dtype=bool)]
    assert abs(off.mean() - 0.3) < 0.02  # ~tau for random masks
    same = mask_overlap(np.stack([m[0], m[0]]))
    np.testing.assert_allclose(same, 1.0)
    disjoint = np.zeros((2, 10), bool)
    disjoint[0, :5] = disjoint[1, 5:] = True
    np.testing.assert_allclose(mask_overlap(disjoint), np.eye(2))
    empty = mask_overlap(np.zeros((3, 8), bool))
    assert np.isfinite(empty).all() and (empty == 0).all()  # tau = 0 guard (no 0/0)


def literal_paper_overlap(masks):
    """The overlap as printed in the paper, ||M_i - M_j||_1 / (2n): a mismatch, kept here only to test
    that our corrected formula picks the opposite clients."""
    m = masks.astype(float)
    return np.abs(m[:, None, :] - m[None, :, :]).sum(-1) / (2 * m.shape[1])


def test_collaborators_invariant_under_affine_maps_and_flipped_by_the_literal_formula():
    rng = np.random.default_rng(1)
    base = random_masks(rng, 2, 400, 0.5)
    # two planted groups: clients share most of their group's mask
    masks = []
    for g in (0, 0, 0, 1, 1, 1):
        m = base[g].copy()
        flip = rng.choice(400, 30, replace=False)
        m[flip] = ~m[flip]
        masks.append(m)
    masks = np.array(masks)
    o = mask_overlap(masks)
    ours = collaborators(o, overlap_threshold(o, 1, 10), 1, 10)
    affine = 3.0 * o + 0.7
    assert all(
        np.array_equal(a, b)
        for a, b in zip(ours, collaborators(affine, overlap_threshold(affine, 1, 10), 1, 10), strict=True)
    )
    for i, c in enumerate(ours):
        assert set(c) and all((j < 3) == (i < 3) for j in c)  # corrected: own group
    lit = literal_paper_overlap(masks)
    theirs = collaborators(lit, overlap_threshold(lit, 1, 10), 1, 10)
    for i, c in enumerate(theirs):
        assert set(c) and all((j < 3) != (i < 3) for j in c)  # literal: the other group


def test_threshold_schedule_and_beta_cutoff():
    rng = np.random.default_rng(2)
    o = mask_overlap(random_masks(rng, 8, 2000, 0.5))
    off = o[~np.eye(8, dtype=bool)]
    assert overlap_threshold(o, 1, 10_000) == pytest.approx(off.mean(), abs=1e-3)
    assert overlap_threshold(o, 10, 10) == pytest.approx(off.max())
    sizes = [sum(len(c) for c in collaborators(o, overlap_threshold(o, t, 10), t, 10)) for t in range(1, 13)]
    assert sizes == sorted(sizes, reverse=True)  # |C_i| never grows for fixed masks
    assert sizes[9] >= 1 and sizes[10] == sizes[11] == 0  # max pair at t = beta, nobody after
    with pytest.raises(ValueError, match="beta"):
        overlap_threshold(o, 1, 0)


def test_degenerate_n2_and_all_ones_masks():
    masks = np.ones((2, 50), bool)
    o = mask_overlap(masks)
    assert overlap_threshold(o, 1, 5) == overlap_threshold(o, 5, 5) == 1.0  # O_avg == O_max
    assert [list(c) for c in collaborators(o, 1.0, 3, 5)] == [[1], [0]]  # tau=1, t<=beta: FedAvg
    assert all(len(c) == 0 for c in collaborators(o, 1.0, 6, 5))  # strict cutoff after beta
    assert [list(c) for c in collaborators(o, 1.0, 6, 5, strict_beta_cutoff=False)] == [[1], [0]]


def test_aggregation_rules():
    params = np.array([[1.0, 2.0], [3.0, 6.0], [5.0, 10.0]])
    collab = [np.array([1]), np.array([0, 2]), np.array([], dtype=int)]
    a = collaboration_matrix(collab)
    np.testing.assert_allclose(a.sum(1), 1.0)
    u = customized_models(params, collab)
    np.testing.assert_allclose(u[0], [2.0, 4.0])
    np.testing.assert_allclose(u[1], [3.0, 6.0])
    np.testing.assert_allclose(u[2], params[2])  # no collaborators: own values
    np.testing.assert_allclose(global_average(params), [3.0, 6.0])
    np.testing.assert_allclose(global_average(params, np.array([1, 0, 1])), [3.0, 6.0])
    same = np.tile([[4.0, 4.0]], (3, 1))
    np.testing.assert_allclose(customized_models(same, collab), same)  # invariant 10
    perm = [2, 0, 1]
    o = mask_overlap(random_masks(np.random.default_rng(3), 3, 300, 0.5))
    np.testing.assert_allclose(
        mask_overlap(random_masks(np.random.default_rng(3), 3, 300, 0.5)[perm]), o[np.ix_(perm, perm)]
    )


def test_mixing_eq11_is_idempotent_and_respects_the_mask():
    own = {"w": torch.tensor([1.0, 1.0, 1.0, 1.0])}
    custom = {"w": torch.tensor([2.0, 2.0, 2.0, 2.0])}
    wbar = {"w": torch.tensor([3.0, 3.0, 3.0, 3.0])}
    mask = {"w": torch.tensor([True, False, True, False])}
    mixed = merge_customized(own, custom, wbar, mask)
    torch.testing.assert_close(mixed["w"], torch.tensor([2.0, 3.0, 2.0, 3.0]))
    torch.testing.assert_close(merge_customized(mixed, custom, wbar, mask)["w"], mixed["w"])
    torch.testing.assert_close(merge_customized(own, None, wbar, mask)["w"], torch.tensor([1.0, 3.0, 1.0, 3.0]))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 5), st.integers(1, 7)), min_size=1, max_size=5), st.integers(0, 2**32 - 1))
def test_packed_masks_round_trip(shapes, seed):
    rng = np.random.default_rng(seed)
    masks = {f"t{i}": rng.random(s) < 0.5 for i, s in enumerate(shapes)}
    keys = list(masks)
    packed = pack_masks(masks, keys)
    assert packed.dtype == np.uint8 and len(packed) == (sum(m.size for m in masks.values()) + 7) // 8
    back = unpack_masks(packed, {k: masks[k].shape for k in keys})
    assert all(np.array_equal(back[k], masks[k]) for k in keys)


def test_packed_mask_costs_one_32nd_of_the_model():
    model = build_model("cnn", 1, 8, 10)
    masks = {n: torch.ones_like(p, dtype=torch.bool) for n, p in model.named_parameters()}
    packed = pack_masks(masks, list(masks))
    floats = sum(p.numel() for p in model.parameters()) * 4
    assert packed.nbytes <= floats / 32 + 1
    with pytest.raises(ValueError, match="packed mask must be uint8"):
        unpack_masks(packed[:-1], {n: tuple(p.shape) for n, p in model.named_parameters()})


def test_label_similarity_diagnostic():
    hist = np.array([[5, 5, 0, 0], [4, 6, 0, 0], [0, 0, 5, 5]])
    collab_sim, all_sim = collaborator_label_similarity([np.array([1]), np.array([0]), np.array([], int)], hist)
    assert collab_sim > 0.9 and all_sim < collab_sim


# ---------------------------------------------------------------- client + strategy without Flower's runtime
def run_rounds(cfg, rounds, n=4):
    settings_ = parse_settings(cfg)
    strat = build_strategy(settings_)
    ctxs = [
        Context(
            run_id=1,
            node_id=10 + i,
            node_config={"partition-id": i, "num-partitions": n},
            state=RecordDict(),
            run_config=cfg,
        )
        for i in range(n)
    ]
    cls = load_object(METHODS["fedcac"].client)
    diags = []
    for rnd in range(1, rounds + 1):
        ups = []
        for i, ctx in enumerate(ctxs):
            payload = strat.payload(10 + i, rnd, "train")
            payload["config"] = ConfigRecord({"server-round": rnd})
            u = strat.gate.check(rnd, 10 + i, cls(ctx, settings_).train(payload), "train", set())
            assert u is not None, strat.failures
            ups.append(u)
        diags.append(strat.aggregate(rnd, ups)["fedcac"])
    return strat, ctxs, diags


def test_tau_zero_is_fedavg_on_parameters():
    cfg = {"method": "fedcac", "tau": 0.0, "beta": 2, "partition": "iid", "local-epochs": 1}
    strat, ctxs, diags = run_rounds(cfg, 2)
    assert all(d["mask-fraction"] == 0.0 for d in diags)
    # every client's next model equals w_bar: no critical parameter survives
    settings_ = parse_settings(cfg)
    client = load_object(METHODS["fedcac"].client)(ctxs[0], settings_)
    payload = strat.payload(10, 3, "train")
    model, _ = client._mixed_model(payload)
    for k, v in strat.global_state.items():
        np.testing.assert_allclose(model.state_dict()[k].numpy(), v, atol=1e-6)


def test_after_beta_critical_parameters_stay_local():
    cfg = {"method": "fedcac", "tau": 0.5, "beta": 1, "partition": "pathological"}
    strat, ctxs, diags = run_rounds(cfg, 2)
    assert diags[-1]["collaborators-max"] == 0
    settings_ = parse_settings(cfg)
    client = load_object(METHODS["fedcac"].client)(ctxs[1], settings_)
    own = dict(client.load_state("model"))
    mask = unpack_masks(client.load_state("mask")["bits"], strat.param_shapes)
    model, _ = client._mixed_model(strat.payload(11, 3, "train"))
    state = model.state_dict()
    for k in strat.param_keys:
        np.testing.assert_allclose(state[k].numpy()[mask[k]], own[k][mask[k]], atol=1e-6)
        np.testing.assert_allclose(state[k].numpy()[~mask[k]], strat.global_state[k][~mask[k]], atol=1e-6)
    for k, value in own.items():  # BN statistics stay local
        if "running" in k:
            np.testing.assert_allclose(state[k].numpy(), value)


def test_bad_mask_is_rejected_and_logged():
    cfg = {"method": "fedcac"}
    strat, ctxs, _ = run_rounds(cfg, 1, n=2)
    settings_ = parse_settings(cfg)
    payload = strat.payload(10, 2, "train")
    payload["config"] = ConfigRecord({"server-round": 2})
    reply = load_object(METHODS["fedcac"].client)(ctxs[0], settings_).train(payload)
    reply["mask"] = to_record({"bits": np.zeros(3, np.uint8)})
    assert strat.gate.check(2, 10, reply, "train", set()) is None
    assert "record 'mask': array 'bits' has shape (3,)" in strat.failures[-1]["reason"]


def test_bad_fedcac_config():
    with pytest.raises(ValueError, match="'beta' must be an integer >= 1"):
        build_strategy(parse_settings({"method": "fedcac", "beta": 0}))
    with pytest.raises(ValueError, match=r"'tau' must be a number in \[0, 1\]"):
        build_strategy(parse_settings({"method": "fedcac", "tau": 1.5}))


def test_collaborators_on_planted_label_groups_share_labels_more_than_random_pairs():
    cfg = {
        "method": "fedcac",
        "tau": 0.5,
        "beta": 10,
        "partition": "planted-clusters",
        "num-clusters": 4,
        "local-epochs": 2,
        "fedcac-diagnostics": True,
        "seed": 3,
    }
    _, _, diags = run_rounds(cfg, 4, n=8)
    collab = [d["collaborator-label-similarity"] for d in diags if np.isfinite(d["collaborator-label-similarity"])]
    everyone = diags[0]["all-pairs-label-similarity"]
    assert collab and np.mean(collab) > everyone + 0.1, (collab, everyone)


# ---------------------------------------------------------------- partial participation (fedcac.md §6.11)
def test_a_client_that_missed_a_round_gets_no_stale_customized_model():
    from tests.strategy_harness import drive

    nodes = {71: 0, 5: 1, 909: 2, 44: 3}
    strat = build_strategy(
        parse_settings({"method": "fedcac", "model": "mlp", "min-nodes": 4, "beta": 10, "num-server-rounds": 4})
    )
    sent = {}

    def answer(rnd, node, phase, content):
        if phase == "train" and (rnd == 3 or (rnd in (2, 4) and nodes[node] == 2)):
            return []  # client 2 misses rounds 2 and 4; nobody's training arrives in round 3
        return None

    grid = drive(strat, nodes, 4, answer)
    for m in grid.sent:
        sent[(int(m.content["config"]["server-round"]), m.metadata.message_type, nodes[m.metadata.dst_node_id])] = (
            m.content
        )
    assert "custom" in sent[(2, "train", 2)]  # it took part in round 1: u_i of round 1
    assert "custom" not in sent[(3, "train", 2)]  # absent in round 2: nothing fresh, it keeps its own critical values
    assert all("custom" in sent[(3, "train", c)] for c in (0, 1, 3))
    assert not any("custom" in sent[(4, "train", c)] for c in range(4))  # round 2's u_i are two rounds old
    assert "custom" not in sent[(4, "evaluate", 2)] and "custom" in sent[(4, "evaluate", 0)]


def test_empty_masks_make_no_collaborators():
    from tests.strategy_harness import drive

    nodes = {1: 0, 2: 1, 3: 2}
    strat = build_strategy(parse_settings({"method": "fedcac", "model": "mlp", "min-nodes": 3, "beta": 10}))
    n_bits = strat.reply_spec("train", 1).records["mask"].tensors["bits"].shape[0]

    def answer(rnd, node, phase, content):  # tau = 0 on every client: empty masks
        if phase == "train":
            content["mask"] = to_record({"bits": np.zeros(n_bits, np.uint8)})

    drive(strat, nodes, 1, answer)
    diag = strat.history[0].extra["fedcac"]
    assert diag["collaborators-max"] == 0 and all(v == [] for v in diag["collaborators"].values())
    overlap = mask_overlap(np.zeros((3, 40), bool))
    assert all(len(c) == 0 for c in collaborators(overlap, overlap_threshold(overlap, 1, 10), 1, 10))

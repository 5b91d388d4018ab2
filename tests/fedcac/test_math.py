"""FedCAC's math (fedcac.md §2.3-§2.7, §7), on hand-made tensors and against independent computations.

The client's side: sensitivity (Eq. 5) from the post-training weights, exact per-tensor top-k masks (Eq. 6), the
bit-packed masks that cross the wire, Eq. 11's mixing.  The server's side: overlaps (Eq. 7), the rising threshold
and the collaborators (Eq. 8), w_bar (Eq. 9), the customized models (Eq. 10) and the label-similarity diagnostic.
"""

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from client_app.fedcac_math import critical_masks, merge_customized, parameter_sensitivity
from strategies.fedcac_math import (
    collaboration_matrix,
    collaborator_label_similarity,
    collaborators,
    customized_models,
    global_average,
    mask_overlap,
    overlap_threshold,
)
from task.methods.fedcac import pack_masks, packed_length, unpack_masks
from task.models import build_model


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
    """Eq. 5, ``s = |(theta_after - theta_before) * theta_after|``: a parameter moved up or moved down by the same
    amount scores the same when it ends at the same magnitude, |step| x |theta_after| in general, and 0 where it
    did not move."""
    before = torch.tensor([0.0, 2.0, -1.0, 3.0, 0.0])
    step = torch.tensor([0.5, 0.0, 0.25, 1.0, 0.0])
    up, down = before + step, before - step
    assert torch.equal((up - before).abs(), (down - before).abs())
    s_up = parameter_sensitivity({"w": before}, {"w": up})["w"]
    s_down = parameter_sensitivity({"w": before}, {"w": down})["w"]
    # from 0, up and down end at the same magnitude: the same score, and not zero
    assert s_up[0] == s_down[0] > 0
    # nothing moved: zero, up or down
    assert s_up[1] == s_down[1] == 0 and s_up[4] == s_down[4] == 0
    # every position: |step| x |end value|, computed here one number at a time
    for i in range(5):
        assert float(s_up[i]) == pytest.approx(abs(float(step[i])) * abs(float(up[i])))
        assert float(s_down[i]) == pytest.approx(abs(float(step[i])) * abs(float(down[i])))
    # the same end point reached from below and from above scores the same
    from_below = parameter_sensitivity({"w": up - step}, {"w": up})["w"]
    from_above = parameter_sensitivity({"w": up + step}, {"w": up})["w"]
    torch.testing.assert_close(from_below, from_above)
    # and the mirror image (every weight negated) scores the same
    torch.testing.assert_close(parameter_sensitivity({"w": -before}, {"w": -up})["w"], s_up)


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
    rows = []
    for g in (0, 0, 0, 1, 1, 1):
        m = base[g].copy()
        flip = rng.choice(400, 30, replace=False)
        m[flip] = ~m[flip]
        rows.append(m)
    masks = np.array(rows)
    o = mask_overlap(masks)
    ours = collaborators(o, overlap_threshold(o, 1, 10), 1, 10)
    affine = 3.0 * o + 0.7
    assert all(
        np.array_equal(a, b)
        for a, b in zip(ours, collaborators(affine, overlap_threshold(affine, 1, 10), 1, 10), strict=False)
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
    # Eq. 9 weighted: unequal weights, against the weighted mean computed here row by row (the plain mean is
    # [3, 6]; a weighting bug cannot give the expected [4, 8])
    weights = [1, 2, 5]
    expected = sum(w * row for w, row in zip(weights, params, strict=False)) / sum(weights)
    np.testing.assert_allclose(expected, [4.0, 8.0])
    np.testing.assert_allclose(global_average(params, np.array(weights)), expected)
    np.testing.assert_allclose(global_average(params, np.array([0.5, 1.0, 2.5])), expected)  # only shares count
    np.testing.assert_allclose(global_average(params, np.array([1, 0, 0])), params[0])  # weight 0: left out
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


# ------------------------------------------------------------ the same rules, against independent computations
def test_sensitivity_uses_the_post_training_weights():
    # parameter 0 moved a lot but ended near zero; parameter 1 moved a little and ended large.
    # Eq. 5 scores |delta * theta_after|: 1 wins.  Scoring with the start-of-round weights would pick 0.
    before = {"w": torch.tensor([3.0, 1.0])}
    after = {"w": torch.tensor([-0.1, 2.0])}
    s = parameter_sensitivity(before, after)["w"]
    expected = np.abs((np.array([-0.1, 2.0]) - np.array([3.0, 1.0])) * np.array([-0.1, 2.0]))
    np.testing.assert_allclose(s.numpy(), expected, rtol=1e-6)
    assert critical_masks({"w": s}, 0.5)["w"].tolist() == [False, True]
    with_before = np.abs((np.array([-0.1, 2.0]) - np.array([3.0, 1.0])) * np.array([3.0, 1.0]))
    assert with_before.argmax() == 0  # the test case really separates the two readings


def test_sensitivity_needs_the_start_of_round_value_of_every_parameter():
    with pytest.raises(ValueError, match="'b'"):
        parameter_sensitivity({"a": torch.zeros(2)}, {"a": torch.ones(2), "b": torch.ones(2)})


@pytest.mark.parametrize("tau, n", [(0.29, 100), (0.57, 100), (0.7, 10), (0.1, 30), (1.0, 7), (0.5, 1)])
def test_mask_size_is_floor_of_tau_n_in_exact_arithmetic(tau, n):
    # 0.29 * 100 is 28.999999999999996 in floats; fedcac.md's k = floor(tau n) is 29
    from fractions import Fraction

    k = int(Fraction(str(tau)) * n)  # exact floor
    s = {"w": torch.arange(n, dtype=torch.float32)}
    m = critical_masks(s, tau)["w"]
    assert int(m.sum()) == k
    assert m.tolist() == [i >= n - k for i in range(n)]  # the k largest scores


@pytest.mark.parametrize("tau", [-0.01, 1.01, 1.5, 2.0])
def test_tau_outside_the_unit_interval_is_refused_naming_the_key(tau):
    with pytest.raises(ValueError, match="tau"):
        critical_masks({"w": torch.ones(4)}, tau)


def test_masks_are_made_on_the_scores_device():
    # the device-agnostic rule (DESIGN: tensors made on the model's device); "meta" stands in for a GPU
    s = {"w": torch.rand(10, device="meta")}
    assert critical_masks(s, 0.5)["w"].device.type == "meta"


def test_pack_accepts_any_binary_dtype_and_round_trips():
    masks: dict[str, np.ndarray | torch.Tensor] = {
        "a": np.array([1.0, 0.0, 1.0]),
        "b": torch.tensor([[0, 1], [1, 1]], dtype=torch.uint8),
        "c": torch.tensor([True, False]),
    }
    shapes = {"a": (3,), "b": (2, 2), "c": (2,)}
    back = unpack_masks(pack_masks(masks, list(shapes)), shapes)
    assert back["a"].tolist() == [True, False, True]
    assert back["b"].tolist() == [[False, True], [True, True]]
    assert back["c"].tolist() == [True, False]


def test_packing_no_tensor_gives_an_empty_payload():
    packed = pack_masks({}, [])
    assert packed.dtype == np.uint8 and packed.shape == (0,)
    assert unpack_masks(packed, {}) == {}


@pytest.mark.parametrize("total", [1, 8, 9, 17])
def test_unpack_refuses_a_payload_of_the_wrong_type_or_length_and_says_the_right_length(total):
    shapes = {"w": (total,)}
    good = pack_masks({"w": np.ones(total, bool)}, ["w"])
    expected_len = -(-total // 8)  # ceil
    assert len(good) == expected_len
    assert unpack_masks(good, shapes)["w"].all()
    for bad in (
        good.astype(np.int64),
        good.astype(np.float32),
        good.reshape(1, -1),
        np.zeros(expected_len + 1, np.uint8),
    ):
        with pytest.raises(ValueError, match=f"length {expected_len} for {total} parameters"):
            unpack_masks(bad, shapes)


@pytest.mark.parametrize(
    "shapes",
    [{"w": (1,)}, {"w": (8,)}, {"w": (2, 4), "b": (8,)}, {"w": (3, 3), "b": (7,)}, {"w": (4, 4)}, {"w": (17,)}, {}],
)
def test_the_server_expects_exactly_the_bytes_a_client_sends(shapes):
    """fedcac.md §2.4 / §2.8: the uplink mask is one bit per parameter, ceil(n / 8) bytes.  The server sizes the
    expected payload from the parameter shapes alone (packed_length); it must equal what pack_masks makes,
    also when n is a multiple of 8 (no spare byte), or every honest reply would be refused."""
    masks = {k: np.ones(s, bool) for k, s in shapes.items()}
    n = sum(int(np.prod(s)) for s in shapes.values())
    assert packed_length(shapes) == len(pack_masks(masks, list(shapes))) == -(-n // 8)


def test_eq11_result_lives_on_the_models_device_whatever_the_mask_and_message_carry():
    wbar = {"w": torch.zeros(4, device="meta")}
    own, custom = {"w": torch.zeros(4)}, {"w": torch.ones(4)}  # as unpacked from a message: CPU
    mask = {"w": np.array([1, 0, 1, 0], bool)}  # as unpacked from the bit-packed payload: numpy
    assert merge_customized(own, custom, wbar, mask)["w"].device.type == "meta"
    assert merge_customized(own, None, wbar, mask)["w"].device.type == "meta"
    on_device = {"w": torch.tensor([True, False, True, False], device="meta")}  # a mask kept on the device
    assert merge_customized(own, custom, wbar, on_device)["w"].device.type == "meta"


def test_eq11_takes_critical_positions_from_u_and_the_rest_from_w_bar():
    rng = np.random.default_rng(0)
    shape = (3, 5)
    u, wbar, own = (rng.normal(size=shape).astype(np.float32) for _ in range(3))
    mask = rng.random(shape) < 0.4
    for m in (mask, torch.from_numpy(mask)):
        out = merge_customized(
            {"w": torch.from_numpy(own)}, {"w": torch.from_numpy(u)}, {"w": torch.from_numpy(wbar)}, {"w": m}
        )["w"].numpy()
        np.testing.assert_array_equal(out, mask * u + (~mask) * wbar)


def naive_overlap(masks):
    """<M_i, M_j> / K_i by counting positions, 0 for an empty M_i."""
    n = len(masks)
    out = np.zeros((n, n))
    for i in range(n):
        k = int(masks[i].sum())
        for j in range(n):
            out[i, j] = int(np.sum(masks[i] & masks[j])) / k if k else 0.0
    return out


@pytest.mark.parametrize("chunk", [1, 4, 7, 65_536])
def test_overlap_is_shared_critical_positions_over_own_count_however_it_is_chunked(chunk):
    rng = np.random.default_rng(chunk)
    masks = rng.random((5, 23)) < 0.4
    masks[3] = False
    masks[3, 5] = True  # a single critical parameter: K = 1
    masks[4] = False  # an empty mask: K = 0
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no 0/0 warnings leak out for the empty row
        got = mask_overlap(masks, chunk=chunk)
    np.testing.assert_allclose(got, naive_overlap(masks), atol=1e-12)


def test_overlap_needs_a_clients_by_parameters_matrix():
    with pytest.raises(ValueError, match="N x n"):
        mask_overlap(np.ones(5, bool))


def offdiag(o):
    return o[~np.eye(len(o), dtype=bool)]


def test_threshold_rises_linearly_from_mean_to_max_of_the_off_diagonal_overlaps():
    o = np.array([[1.0, 0.2, 0.5], [0.4, 1.0, 0.3], [0.9, 0.6, 1.0]])
    avg, top = offdiag(o).mean(), offdiag(o).max()
    for t, beta in ((1, 1), (1, 4), (3, 4), (4, 4), (6, 4)):
        assert overlap_threshold(o, t, beta) == pytest.approx(avg + t / beta * (top - avg))
    assert overlap_threshold(np.ones((1, 1)), 1, 3) == float("inf")  # one client: no pair to collaborate with
    assert [len(c) for c in collaborators(np.ones((1, 1)), overlap_threshold(np.ones((1, 1)), 1, 3), 1, 3)] == [0]


def test_the_most_overlapping_pair_still_collaborates_at_round_beta_despite_rounding():
    o = np.array([[1.0, 0.92, 0.02], [0.92, 1.0, 0.14], [0.02, 0.14, 1.0]])
    thr = overlap_threshold(o, 5, 5)
    assert thr > 0.92  # avg + 1.0 * (max - avg) rounds above max here: the case the tolerance is for
    assert [c.tolist() for c in collaborators(o, thr, 5, 5)] == [[1], [0], []]
    assert [c.tolist() for c in collaborators(o, overlap_threshold(o, 1, 5), 1, 5)] == [[1], [0], []]


def test_collaborators_are_those_at_or_above_the_threshold_and_never_oneself():
    o = np.array([[1.0, 0.5, 0.3, 0.7], [0.5, 1.0, 0.6, 0.2], [0.3, 0.6, 1.0, 0.4], [0.7, 0.2, 0.4, 1.0]])
    got = [c.tolist() for c in collaborators(o, 0.5, 1, 10)]
    assert got == [[1, 3], [0, 2], [1], [0]]
    assert [c.tolist() for c in collaborators(o, 0.5, 11, 10, strict_beta_cutoff=False)] == got
    assert all(len(c) == 0 for c in collaborators(o, 0.5, 11, 10))


def test_eq8_is_inclusive_a_pair_exactly_at_the_threshold_collaborates_even_without_tolerance():
    """fedcac.md §2.6 Eq. 8: C_i = {j != i : O_ij >= Threshold}.  "At or above", so the pair whose overlap equals
    the threshold is a collaborator; the tolerance only widens this for rounding, it is not what makes the
    boundary count."""
    o = np.array([[1.0, 0.5, 0.25], [0.5, 1.0, 0.25], [0.25, 0.25, 1.0]])
    assert [c.tolist() for c in collaborators(o, 0.5, 1, 10, tol=0.0)] == [[1], [0], []]
    assert [c.tolist() for c in collaborators(o, 0.25, 1, 10, tol=0.0)] == [[1, 2], [0, 2], [0, 1]]
    assert [c.tolist() for c in collaborators(o, 0.5 + 1e-9, 1, 10, tol=0.0)] == [[], [], []]


def test_customized_model_is_the_plain_mean_over_self_and_collaborators_in_the_models_dtype():
    rng = np.random.default_rng(4)
    params = rng.normal(size=(4, 6)).astype(np.float32)
    collab = [np.array([2, 3]), np.array([], dtype=np.int64), np.array([0]), np.array([0, 1, 2])]
    u = customized_models(params, collab)
    assert u.dtype == np.float32
    for i, c in enumerate(collab):
        np.testing.assert_allclose(u[i], params[[i, *c]].mean(0), rtol=1e-6)
    a = collaboration_matrix(collab)
    np.testing.assert_allclose(a[0], [1 / 3, 0, 1 / 3, 1 / 3])
    np.testing.assert_allclose(a[1], [0, 1, 0, 0])


def test_global_average_uniform_or_by_example_counts():
    params = np.array([[0.0, 4.0], [8.0, 0.0]])
    np.testing.assert_allclose(global_average(params), [4.0, 2.0])
    np.testing.assert_allclose(global_average(params, np.array([1, 3])), [6.0, 1.0])  # (1*p0 + 3*p1) / 4


def test_w_bar_weights_are_exact_shares_of_the_counts_whatever_their_number_type():
    """Eq. 9 with ``fedcac-weighting=num-examples`` (fedcac.md §2.7): p_i = n_i / sum_j n_j.  Counts may come as
    float32 (e.g. read back from a record); the shares are still exact to double precision, so three equal
    counts give the plain mean, not a mean with weights rounded to 0.33333334."""
    params = np.array([[1.0, 10.0], [2.0, -3.0], [4.0, 0.5]])
    plain = params.sum(0) / 3
    for counts in (np.array([7, 7, 7], np.float32), np.array([7, 7, 7]), [7.0, 7.0, 7.0]):
        np.testing.assert_allclose(global_average(params, counts), plain, rtol=1e-14, atol=0)
    np.testing.assert_allclose(
        global_average(params, np.array([3, 1, 1], np.float32)),
        (3 * params[0] + params[1] + params[2]) / 5,
        rtol=1e-14,
        atol=0,
    )


def test_label_similarity_is_exact_for_float32_histograms():
    """fedcac.md §8 diagnostic: the cosines are computed in double precision whatever the histograms' dtype, so a
    float32 copy of the counts gives the same numbers as the integer counts."""
    counts = np.array([[1, 2, 3], [3, 1, 2], [0, 1, 1]])
    unit = counts / np.linalg.norm(counts, axis=1, keepdims=True)
    cos = unit @ unit.T
    collab = [np.array([1]), np.array([0]), np.array([], dtype=np.int64)]
    pairs, everyone = collaborator_label_similarity(collab, counts.astype(np.float32))
    assert pairs == pytest.approx(cos[0, 1], rel=1e-14)
    assert everyone == pytest.approx(offdiag(cos).mean(), rel=1e-14)


def test_label_similarity_diagnostic_is_the_mean_cosine_over_collaborator_pairs_and_over_all_pairs():
    hist = np.array([[3.0, 4.0, 0.0], [6.0, 8.0, 0.0], [0.0, 0.0, 2.0], [0.0, 0.0, 0.0]])
    cos = np.zeros((4, 4))
    for i in range(4):
        for j in range(4):
            ni, nj = np.linalg.norm(hist[i]), np.linalg.norm(hist[j])
            cos[i, j] = hist[i] @ hist[j] / (ni * nj) if ni and nj else 0.0
    collab = [np.array([1]), np.array([0, 2]), np.array([], dtype=np.int64), np.array([], dtype=np.int64)]
    pairs, everyone = collaborator_label_similarity(collab, hist)
    assert pairs == pytest.approx(np.mean([cos[0, 1], cos[1, 0], cos[1, 2]]))
    assert everyone == pytest.approx(offdiag(cos).mean())
    shares = hist / np.maximum(hist.sum(1, keepdims=True), 1)  # cosine ignores scale: shares give the same
    assert collaborator_label_similarity(collab, shares) == pytest.approx((pairs, everyone))
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # undefined means are NaN, without "mean of empty slice" noise
        nobody, _ = collaborator_label_similarity([np.array([], dtype=np.int64)] * 4, hist)
        assert np.isnan(nobody)
        assert np.isnan(collaborator_label_similarity([np.array([], dtype=np.int64)], hist[:1])[1])  # no pair at all

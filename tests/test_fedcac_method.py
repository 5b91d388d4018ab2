"""What FedCAC must do (fedcac.md §2.3-§2.7), checked against independent computations.

Written to kill the mutants that survived the older tests (tests/MUTATION.md): sensitivity from the
post-training weights, exact per-tensor top-k, masks that survive the wire, Eq. 11 on the model's device,
and the server's overlap / threshold / collaborator / aggregation rules.
"""

import numpy as np
import pytest
import torch

from client_app.fedcac_math import critical_masks, merge_customized, parameter_sensitivity
from strategies.plots import pyplot
from task.methods.fedcac import pack_masks, packed_length, unpack_masks

pyplot()  # matplotlib on Agg, loaded with the module: the artefact tests below plot


# ------------------------------------------------------------------------------------------ client side
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
    masks = {
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


# ------------------------------------------------------------------------------------------ server side
from strategies.fedcac_math import (  # noqa: E402
    collaboration_matrix,
    collaborator_label_similarity,
    collaborators,
    customized_models,
    global_average,
    mask_overlap,
    overlap_threshold,
)


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


# ------------------------------------------------------------------------------------------ the strategy's options
from server_app.app import build_strategy  # noqa: E402
from strategies.fedcac import FedCACStrategy  # noqa: E402


def fedcac_strategy(settings) -> FedCACStrategy:
    """build_strategy for a FedCAC run config, typed as FedCAC's strategy."""
    strat = build_strategy(settings)
    assert isinstance(strat, FedCACStrategy)
    return strat


from task.config import parse_settings  # noqa: E402
from task.params import to_record  # noqa: E402
from tests.strategy_harness import drive  # noqa: E402
from tests.strategy_harness import kept_figures as harness_kept_figures  # noqa: E402


def strategy_round(rounds=1, n=3, all_critical=False, **cfg):
    nodes = {i + 1: i for i in range(n)}
    strat = fedcac_strategy(parse_settings({"method": "fedcac", "model": "mlp", "min-nodes": n, **cfg}))
    sent = {}

    def answer(rnd, node, phase, content):
        if phase == "train":
            content["metrics"]["num-examples"] = [1, 2, 5][nodes[node]]
            sent[nodes[node]] = {k: np.array(v.numpy()) for k, v in content["arrays"].items()}
            if all_critical:  # tau = 1: every mask all ones, every overlap 1
                bits = content["mask"]["bits"].numpy()
                content["mask"] = to_record({"bits": np.full_like(bits, 255)})

    drive(strat, nodes, rounds, answer)
    return strat, sent


@pytest.mark.parametrize("weighting, weights", [("uniform", [1, 1, 1]), ("num-examples", [1, 2, 5])])
def test_w_bar_is_the_uniform_or_example_weighted_mean_as_configured(weighting, weights):
    """Eq. 9 averages uniformly; ``fedcac-weighting=num-examples`` weights by training examples (fedcac.md §6.10)."""
    strat, sent = strategy_round(**{"fedcac-weighting": weighting})
    w = np.array(weights, float) / sum(weights)
    for k in strat.param_keys:
        expected = sum(w[i] * sent[i][k].astype(np.float64) for i in range(3))
        np.testing.assert_allclose(strat.global_state[k], expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("strict, expected", [(True, 0), (False, 1)])
def test_the_strict_beta_cutoff_option_reaches_the_collaborator_sets(strict, expected):
    """fedcac.md §2.6 / §6.8: with all-ones masks (tau = 1) O_avg = O_max, so without the strict cutoff the clients
    collaborate in every round; with it (the default) nobody collaborates once t > beta."""
    strat, _ = strategy_round(rounds=2, n=2, all_critical=True, beta=1, **{"strict-beta-cutoff": strict})
    diag = strat.history[-1].extra["fedcac"]
    assert strat.history[-1].server_round == 2 and diag["collaborators-max"] == expected


# ------------------------------------------------------------------------------------------ a whole server round
def planted_bits(n, client, server_round):
    """Critical masks with two planted groups (clients 0, 1 and 2, 3): each client's mask is its group's base
    mask with a few client- and round-specific flips, so overlaps differ within and across groups."""
    base = np.random.default_rng(1000 + client // 2).random(n) < 0.5
    flips = np.random.default_rng(7 * client + 31 * server_round).choice(n, n // 20 * (1 + client % 2), replace=False)
    base[flips] = ~base[flips]
    return np.packbits(base)


def play(strat, nodes, rounds, sent):
    """Drive ``rounds`` of ``strat``; ``sent[(round, client)]`` keeps what each client's train reply carried."""

    def answer(rnd, node, phase, content):
        if phase == "train":
            cid = nodes[node]
            n = sum(int(np.prod(s)) for s in strat.param_shapes.values())
            bits = planted_bits(n, cid, rnd)
            content["mask"] = to_record({"bits": bits})
            content["metrics"]["num-examples"] = 5 + cid
            sent[(rnd, cid)] = {
                "arrays": {k: np.array(v.numpy()) for k, v in content["arrays"].items()},
                "bits": bits,
                "hist": list(content["metrics"].get("label-histogram", [])),
            }

    drive(strat, nodes, rounds, answer)


def expected_round(strat, sent, rnd, beta, clients):
    """Eqs. 7-10 recomputed from the replies with plain loops (fedcac.md §2.5-§2.7), keyed by client id."""
    from task.models import build_model

    s = strat.settings
    keys = [k for k, _ in build_model(s.model, s.in_channels, s.image_size, s.num_classes).named_parameters()]
    n = sum(int(np.prod(strat.param_shapes[k])) for k in keys)
    masks = np.array([np.unpackbits(sent[(rnd, c)]["bits"])[:n].astype(bool) for c in clients])
    params = np.array([np.concatenate([sent[(rnd, c)]["arrays"][k].ravel() for k in keys]) for c in clients], float)
    o = naive_overlap(masks)
    off = offdiag(o)
    thr = off.mean() + rnd / beta * (off.max() - off.mean())
    collab = {
        c: [] if rnd > beta else [d for j, d in enumerate(clients) if j != i and o[i, j] >= thr - 1e-12]
        for i, c in enumerate(clients)
    }
    wbar = params.mean(0)
    u = {c: params[[clients.index(d) for d in [c, *collab[c]]]].mean(0) for c in clients}

    def split(flat):
        sizes = [int(np.prod(strat.param_shapes[k])) for k in keys]
        return {
            k: v.reshape(strat.param_shapes[k])
            for k, v in zip(keys, np.split(flat, np.cumsum(sizes)[:-1]), strict=True)
        }

    return {
        "overlap": o,
        "threshold": thr,
        "collab": collab,
        "wbar": split(wbar),
        "u": {c: split(u[c]) for c in clients},
        "mask-fraction": masks.mean(),
        "n": n,
    }


NODES = {21: 2, 22: 0, 23: 3, 24: 1}  # node id -> client id; neither order is the other's


def test_each_round_the_server_computes_eq7_to_eq10_over_the_replies_it_received():
    """fedcac.md §2.5-§2.7 for a whole round through the strategy: the overlap of the clients' unpacked masks, the
    threshold rising from mean to max (Eq. 7), the collaborators at or above it, none after beta (Eq. 8),
    w_bar (Eq. 9) and each client's u_i (Eq. 10); the next train message carries w_bar and u_i, and the round's
    diagnostics report exactly these numbers."""
    beta = 2
    strat = fedcac_strategy(
        parse_settings(
            {
                "method": "fedcac",
                "model": "mlp",
                "min-nodes": 4,
                "beta": beta,
                "fedcac-diagnostics": True,
                "num-server-rounds": 3,
            }
        )
    )
    sent, clients = {}, sorted(NODES.values())
    assert strat.param_keys == list(strat.param_shapes) and strat.shared_keys() == strat.param_keys
    train_arrays = strat.reply_spec("train", 21).records["arrays"].tensors
    assert {k: t.shape for k, t in train_arrays.items()} == strat.param_shapes
    for rnd in (1, 2, 3):
        play(strat, NODES, [rnd], sent)
        exp = expected_round(strat, sent, rnd, beta, clients)
        diag = strat.history[-1].extra["fedcac"]
        assert strat.history[-1].server_round == rnd
        assert diag["threshold"] == pytest.approx(exp["threshold"], rel=1e-9)
        off = offdiag(exp["overlap"])
        assert (diag["overlap-mean"], diag["overlap-min"], diag["overlap-max"]) == pytest.approx(
            (off.mean(), off.min(), off.max()), rel=1e-9
        )
        assert {int(c): sorted(v) for c, v in diag["collaborators"].items()} == exp["collab"]
        sizes = [len(v) for v in exp["collab"].values()]
        assert (diag["collaborators-mean"], diag["collaborators-min"], diag["collaborators-max"]) == pytest.approx(
            (np.mean(sizes), min(sizes), max(sizes))
        )
        assert diag["mask-fraction"] == pytest.approx(exp["mask-fraction"], rel=1e-12)
        if rnd == 1:
            assert min(sizes) > 0 and max(sizes) < 3  # the planted groups: collaborators, but not everyone
        hist = np.array([sent[(rnd, c)]["hist"] for c in clients], float)
        unit = hist / np.linalg.norm(hist, axis=1, keepdims=True)
        cos = unit @ unit.T
        pairs = [cos[i, clients.index(d)] for i, c in enumerate(clients) for d in exp["collab"][c]]
        if pairs:
            assert diag["collaborator-label-similarity"] == pytest.approx(np.mean(pairs))
        else:
            assert np.isnan(diag["collaborator-label-similarity"])
        assert diag["all-pairs-label-similarity"] == pytest.approx(offdiag(cos).mean())
        logged = strat.overlaps[rnd]
        order = [clients.index(c) for c in logged["partition-ids"]]
        assert sorted(logged["partition-ids"]) == clients
        np.testing.assert_allclose(logged["overlap"], exp["overlap"][np.ix_(order, order)], atol=5e-5)
        assert strat.max_mask_bytes == -(-exp["n"] // 8)
        for node, c in NODES.items():  # what the next train message and this round's evaluation carry
            for payload in (strat.payload(node, rnd + 1, "train"), strat.payload(node, rnd, "evaluate")):
                for k, v in payload["global"].items():
                    assert v.numpy().dtype == np.float32
                    np.testing.assert_allclose(v.numpy(), exp["wbar"][k], rtol=1e-5, atol=1e-6)
                    np.testing.assert_allclose(payload["custom"][k].numpy(), exp["u"][c][k], rtol=1e-5, atol=1e-6)
                assert set(payload["global"]) == set(payload["custom"]) == set(strat.param_keys)
            assert "custom" not in strat.payload(node, rnd + 2, "train") and "custom" not in strat.payload(
                node, rnd + 1, "evaluate"
            )
            assert "custom" not in strat.payload(node, rnd, "train")  # u_i of round rnd is for round rnd + 1 only
        assert strat.custom_round == rnd and set(strat.custom) == set(clients)
    assert strat.fresh_custom(999, 3) is None  # a node the server has never heard from gets no u_i


def test_the_train_reply_must_carry_one_bit_per_parameter_and_with_diagnostics_a_label_histogram():
    """fedcac.md §2.8 uplink: the packed mask (uint8, ceil(n / 8) bytes) is part of a train reply, not of an evaluate
    reply; the label histogram (one count per class) is asked for only with ``fedcac-diagnostics``."""
    from task.methods.fedcac import packed_length as bytes_for

    for diagnostics in (False, True):
        strat = fedcac_strategy(parse_settings({"method": "fedcac", "model": "mlp", "fedcac-diagnostics": diagnostics}))
        spec = strat.reply_spec("train", 1)
        (bits,) = spec.records["mask"].tensors.values()
        assert list(spec.records["mask"].tensors) == ["bits"]
        assert bits.shape == (bytes_for(strat.param_shapes),) and np.dtype(bits.dtype) == np.uint8
        assert set(spec.records["arrays"].tensors) == set(strat.param_keys)
        hist = spec.metrics.get("label-histogram")
        if diagnostics:
            assert hist.kind is int and hist.minimum == 0 and hist.length == strat.settings.num_classes
            assert hist.maximum >= 10**9
        else:
            assert hist is None
        evaluate = strat.reply_spec("evaluate", 1)
        assert "mask" not in evaluate.records and "label-histogram" not in evaluate.metrics


def kept_figures(monkeypatch):
    """pyplot for strategies.fedcac, except that closed figures are kept for inspection."""
    import strategies.fedcac as module

    return harness_kept_figures(monkeypatch, module)


def test_the_artefacts_hold_every_rounds_diagnostics_the_overlaps_at_first_beta_and_last_round_and_the_mask_cost(
    tmp_path, monkeypatch
):
    """docs Artefacts: ``fedcac_rounds.json`` is every round's diagnostics; ``fedcac_overlap.json`` / ``.png`` the
    overlap matrix at the first round, round beta and the last (ordered by client id); the collaborators plot
    shows mean |C_i|, the threshold and the mean overlap per round with a line at beta;
    ``fedcac_communication.json`` the packed mask bytes against the float32 model."""
    import json

    import matplotlib.pyplot as plt

    figures = kept_figures(monkeypatch)
    beta, rounds = 2, 4
    strat = fedcac_strategy(
        parse_settings({"method": "fedcac", "model": "mlp", "min-nodes": 4, "beta": beta, "num-server-rounds": rounds})
    )
    sent = {}
    play(strat, NODES, rounds, sent)
    strat.write_artifacts(tmp_path)

    logged = json.loads((tmp_path / "fedcac_rounds.json").read_text())
    diags = [h.extra["fedcac"] for h in strat.history]
    assert [r["round"] for r in logged] == list(range(1, rounds + 1))
    assert logged == json.loads(json.dumps([{"round": r + 1, **d} for r, d in enumerate(diags)]))

    n = sum(int(np.prod(s)) for s in strat.param_shapes.values())
    assert json.loads((tmp_path / "fedcac_communication.json").read_text()) == {
        "parameters": n,
        "float32-model-bytes": 4 * n,
        "packed-mask-bytes": -(-n // 8),
        "mask-to-model-ratio": pytest.approx(-(-n // 8) / (4 * n)),
    }

    overlaps = json.loads((tmp_path / "fedcac_overlap.json").read_text())
    assert list(overlaps) == ["1", str(beta), str(rounds)]
    assert overlaps == {str(r): strat.overlaps[r] for r in (1, beta, rounds)}

    assert len(figures) == 2
    heat, lines = figures
    panels = [ax for ax in heat.axes if ax.get_images()]
    assert len(panels) == 3 and len(heat.axes) == 6  # one panel per chosen round, each with its colour bar
    for ax, rnd in zip(panels, (1, beta, rounds), strict=True):
        assert f"round {rnd}" in ax.get_title() and "overlap" in ax.get_title()
        assert ax.get_xlabel() == "client" and ax.get_ylabel() == "client"
        (image,) = ax.get_images()
        assert image.get_clim() == (0, 1)
        entry = strat.overlaps[rnd]
        order = np.argsort(entry["partition-ids"])
        np.testing.assert_allclose(image.get_array(), np.array(entry["overlap"])[np.ix_(order, order)])
    assert tuple(heat.get_size_inches()) == pytest.approx((4.2 * 3, 3.8))
    for ax in panels:  # client ids are whole numbers: no tick at client 0.5
        for ticks in (ax.get_xticks(), ax.get_yticks()):
            inside = [t for t in ticks if -0.5 <= t <= 3.5]
            assert len(inside) >= 2 and all(float(t).is_integer() for t in inside)
    bars = [ax for ax in heat.axes if not ax.get_images()]
    for ax, bar in zip(panels, bars, strict=True):  # each colour bar is a thin strip beside its panel
        assert bar.get_position().width < 0.1 * ax.get_position().width
        assert bar.get_position().x0 >= ax.get_position().x1
    assert plt.imread(tmp_path / "fedcac_overlap.png").shape[:2] == (380, 1260)  # 100 dpi

    main = next(ax for ax in lines.axes if ax.get_ylabel() == "collaborators per client")
    twin = next(ax for ax in lines.axes if ax is not main)
    assert main.get_xlabel() == "round" and twin.get_ylabel() == "overlap"
    assert all(float(t).is_integer() for t in main.get_xticks())  # rounds are whole numbers
    xs = list(range(1, rounds + 1))
    series = {ln.get_label(): ln for ln in main.lines + twin.lines}
    for label, key in (
        ("mean |C_i|", "collaborators-mean"),
        ("threshold", "threshold"),
        ("mean overlap", "overlap-mean"),
    ):
        assert list(series[label].get_xdata()) == xs
        np.testing.assert_allclose(series[label].get_ydata(), [d[key] for d in diags])
    assert series["mean |C_i|"] in main.lines and series["threshold"] in twin.lines
    (vline,) = [ln for ln in main.lines if ln.get_label().startswith("_")]
    assert list(vline.get_xdata()) == [beta, beta]
    # the three series and the beta line are told apart by colour, and by line style in black and white too;
    # the count is marked at every round
    names = ("mean |C_i|", "threshold", "mean overlap")
    assert len({series[k].get_color() for k in names} | {vline.get_color()}) == 4
    assert len({series[k].get_linestyle() for k in names}) == 3
    assert series["mean |C_i|"].get_marker() not in (None, "None", "", " ")
    (legend,) = lines.legends
    assert sorted(t.get_text() for t in legend.get_texts()) == ["mean overlap", "mean |C_i|", "threshold"]
    assert tuple(lines.get_size_inches()) == pytest.approx((6, 3.5))
    assert plt.imread(tmp_path / "fedcac_collaborators.png").shape[:2] == (350, 600)
    for fig in figures:
        plt.close(fig)


def test_a_run_shorter_than_beta_shows_its_first_and_last_round_and_one_without_rounds_only_the_cost(
    tmp_path, monkeypatch
):
    """docs Artefacts: with fewer rounds than beta, round beta never came, so the overlap record and plot hold the
    first and the last round; before any aggregation there is nothing to plot and no mask was sent."""
    import json

    import matplotlib.figure

    figures = kept_figures(monkeypatch)
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda *a, **k: None)  # the content is what counts here
    strat = fedcac_strategy(parse_settings({"method": "fedcac", "model": "mlp", "min-nodes": 4, "beta": 5}))
    strat.write_artifacts(tmp_path)
    assert json.loads((tmp_path / "fedcac_rounds.json").read_text()) == []
    comm = json.loads((tmp_path / "fedcac_communication.json").read_text())
    assert comm["packed-mask-bytes"] is None and comm["mask-to-model-ratio"] is None
    assert not (tmp_path / "fedcac_overlap.json").exists() and not figures
    play(strat, NODES, 3, {})
    strat.write_artifacts(tmp_path)
    assert list(json.loads((tmp_path / "fedcac_overlap.json").read_text())) == ["1", "3"]
    panels = [ax for ax in figures[0].axes if ax.get_images()]
    assert [ax.get_title() for ax in panels] == ["mask overlap, round 1", "mask overlap, round 3"]


def test_a_round_with_a_single_participant_has_no_pair_no_collaborator_and_u_i_is_its_own_model():
    """fedcac.md §2.6 with one participant: there is no pair, so the threshold is unreachable, nobody collaborates, the
    overlap statistics of the round are 0 (no pair to average) and u_i = w_bar = the client's own model."""
    strat = fedcac_strategy(parse_settings({"method": "fedcac", "model": "mlp", "min-nodes": 1, "beta": 3}))
    sent = {}
    play(strat, {7: 3}, 1, sent)
    diag = strat.history[-1].extra["fedcac"]
    assert diag["threshold"] == float("inf") and diag["collaborators"] == {3: []}
    assert (diag["overlap-mean"], diag["overlap-min"], diag["overlap-max"]) == (0.0, 0.0, 0.0)
    assert (diag["collaborators-mean"], diag["collaborators-min"], diag["collaborators-max"]) == (0.0, 0, 0)
    for k, v in sent[(1, 3)]["arrays"].items():
        np.testing.assert_array_equal(strat.custom[3][k], v)
        np.testing.assert_allclose(strat.global_state[k], v, rtol=1e-6)


def test_the_round_does_not_depend_on_the_order_of_the_replies_and_the_heat_map_is_by_client_id(tmp_path, monkeypatch):
    """fedcac.md §7 (the server's result is per client, whatever order the replies come in): every u_i and the
    collaborator sets belong to the client that sent the model, and the overlap heat map is ordered by client id.
    A round where every mask is empty (tau = 0) has overlap 0 everywhere; the colour scale stays 0..1."""
    import matplotlib.figure

    from strategies.base import Reply

    figures = kept_figures(monkeypatch)
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda *a, **k: None)  # the figure's content counts here
    strat = fedcac_strategy(parse_settings({"method": "fedcac", "model": "mlp", "beta": 5}))
    n = sum(int(np.prod(s)) for s in strat.param_shapes.values())
    rng = np.random.default_rng(5)
    order = [3, 1, 2, 0]
    params = {c: {k: rng.normal(size=s).astype(np.float32) for k, s in strat.param_shapes.items()} for c in order}
    bits = {c: planted_bits(n, c, 1) for c in order}

    def replies(empty=False):
        return [
            Reply(
                100 + c,
                c,
                10,
                {},
                {"arrays": params[c], "mask": {"bits": np.zeros_like(bits[c]) if empty else bits[c]}},
            )
            for c in order
        ]

    strat.aggregate(1, replies())
    in_order = fedcac_strategy(parse_settings({"method": "fedcac", "model": "mlp", "beta": 5}))
    in_order.aggregate(1, sorted(replies(), key=lambda r: r.client))
    for c in order:
        for k in strat.param_keys:
            np.testing.assert_array_equal(strat.custom[c][k], in_order.custom[c][k])
    assert strat.overlaps[1]["partition-ids"] == order
    exp = naive_overlap(np.array([np.unpackbits(bits[c])[:n].astype(bool) for c in range(4)]))
    strat.aggregate(2, replies(empty=True))
    strat.write_artifacts(tmp_path)
    panels = [ax for ax in figures[0].axes if ax.get_images()]
    first, empty = (ax.get_images()[0] for ax in panels)
    np.testing.assert_allclose(first.get_array(), exp, atol=5e-5)  # rows and columns by client id
    np.testing.assert_array_equal(empty.get_array(), np.zeros((4, 4)))
    assert first.get_clim() == empty.get_clim() == (0, 1)

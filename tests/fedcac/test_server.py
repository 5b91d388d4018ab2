"""What FedCAC's server must do (fedcac.md §2.5-§2.7, §6.11), driven through its own round loop
(tests/strategy_harness.py) and through its real clients without Flower's runtime: Eq. 7-10 over the replies it
received, the options that reach the collaborator sets, the mask each reply must carry, partial participation, and
its own evaluation metric.  The artefacts it writes are in test_artifacts.py.
"""

import numpy as np
import pytest
from flwr.app import ConfigRecord, MetricRecord, RecordDict

from strategies.base import Reply
from strategies.fedcac import FedCACStrategy
from strategies.fedcac_artifacts import write_artifacts
from strategies.fedcac_math import (
    collaborators,
    mask_overlap,
    overlap_threshold,
)
from strategies.replies import Numbers
from task.config import parse_settings
from task.methods import METHODS, load_object
from task.methods.fedcac import unpack_masks
from task.models import build_model
from task.params import record_to_numpy, to_record
from tests.client_kit import node_contexts
from tests.fedcac.server_kit import NODES, Sent, kept_figures, planted_bits, play
from tests.strategy_harness import build_as, drive, strategy


# ------------------------------------------------------------------------------------------ the strategy's options
def strategy_round(rounds=1, n=3, all_critical=False, **cfg):
    nodes = {i + 1: i for i in range(n)}
    strat = build_as(FedCACStrategy, parse_settings({"method": "fedcac", "model": "mlp", "min-nodes": n, **cfg}))
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


@pytest.mark.parametrize("aggregator", ["mean", "median"])
def test_the_global_and_customized_models_keep_the_models_dtype(aggregator):
    """Eq. 9 and Eq. 10 (or the run's robust rule) are computed over float32 rows; the models the server keeps and
    sends are the model's own dtype, not a float64 copy twice the size on the wire."""
    strat, _ = strategy_round(aggregator=aggregator)
    for k in strat.param_keys:
        assert strat.global_state[k].dtype == strat.initial_state[k].dtype == np.float32, k
        assert {m[k].dtype for m in strat.custom.values()} == {np.dtype(np.float32)}, k


def test_with_a_sampled_cohort_the_customized_models_are_the_last_cohorts():
    """``fraction-train`` < 1: the nodes are identified before round 1 and each round draws two of three; the round's
    customized models (Eq. 10) are its participants' only."""
    strat, _ = strategy_round(rounds=3, n=3, **{"fraction-train": 0.67})
    assert strat.custom_round == 3
    participants = strat.history[-1].extra["fedcac"]["collaborators"]  # one entry per participant
    assert len(participants) == 2 and sorted(strat.custom) == sorted(participants)


@pytest.mark.parametrize("strict, expected", [(True, 0), (False, 1)])
def test_the_strict_beta_cutoff_option_reaches_the_collaborator_sets(strict, expected):
    """fedcac.md §2.6 / §6.8: with all-ones masks (tau = 1) O_avg = O_max, so without the strict cutoff the clients
    collaborate in every round; with it (the default) nobody collaborates once t > beta."""
    strat, _ = strategy_round(rounds=2, n=2, all_critical=True, beta=1, **{"strict-beta-cutoff": strict})
    diag = strat.history[-1].extra["fedcac"]
    assert strat.history[-1].server_round == 2 and diag["collaborators-max"] == expected


# ------------------------------------------------------------------------------------------ a whole server round
def expected_round(strat, sent, rnd, beta, clients):
    """Eqs. 7-10 recomputed from the replies with plain loops (fedcac.md §2.5-§2.7), keyed by client id."""

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


def test_each_round_the_server_computes_eq7_to_eq10_over_the_replies_it_received():
    """fedcac.md §2.5-§2.7 for a whole round through the strategy: the overlap of the clients' unpacked masks, the
    threshold rising from mean to max (Eq. 7), the collaborators at or above it, none after beta (Eq. 8),
    w_bar (Eq. 9) and each client's u_i (Eq. 10); the next train message carries w_bar and u_i, and the round's
    diagnostics report exactly these numbers."""
    beta = 2
    strat = build_as(
        FedCACStrategy,
        parse_settings(
            {
                "method": "fedcac",
                "model": "mlp",
                "min-nodes": 4,
                "beta": beta,
                "fedcac-diagnostics": True,
                "num-server-rounds": 3,
            }
        ),
    )
    sent: Sent = {}
    clients = sorted(NODES.values())
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
        hist = np.array([sent[(rnd, c)]["hist"] for c in clients], np.float64)
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
                sent_global, sent_custom = payload.array_records["global"], payload.array_records["custom"]
                for k, v in sent_global.items():
                    assert v.numpy().dtype == np.float32
                    np.testing.assert_allclose(v.numpy(), exp["wbar"][k], rtol=1e-5, atol=1e-6)
                    np.testing.assert_allclose(sent_custom[k].numpy(), exp["u"][c][k], rtol=1e-5, atol=1e-6)
                assert set(sent_global) == set(sent_custom) == set(strat.param_keys)
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
        strat = build_as(
            FedCACStrategy, parse_settings({"method": "fedcac", "model": "mlp", "fedcac-diagnostics": diagnostics})
        )
        spec = strat.reply_spec("train", 1)
        (bits,) = spec.records["mask"].tensors.values()
        assert list(spec.records["mask"].tensors) == ["bits"]
        assert bits.shape == (bytes_for(strat.param_shapes),) and np.dtype(bits.dtype) == np.uint8
        assert set(spec.records["arrays"].tensors) == set(strat.param_keys)
        hist = spec.metrics.get("label-histogram")
        if diagnostics:
            assert isinstance(hist, Numbers)  # one count per class: a list
            assert hist.kind is int and hist.minimum == 0 and hist.length == strat.settings.num_classes
            assert hist.maximum >= 10**9
        else:
            assert hist is None
        evaluate = strat.reply_spec("evaluate", 1)
        assert "mask" not in evaluate.records and "label-histogram" not in evaluate.metrics


def test_a_round_with_a_single_participant_has_no_pair_no_collaborator_and_u_i_is_its_own_model():
    """fedcac.md §2.6 with one participant: there is no pair, so the threshold is unreachable, nobody collaborates, the
    overlap statistics of the round are 0 (no pair to average) and u_i = w_bar = the client's own model."""
    strat = build_as(FedCACStrategy, parse_settings({"method": "fedcac", "model": "mlp", "min-nodes": 1, "beta": 3}))
    sent: Sent = {}
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

    figures = kept_figures(monkeypatch)
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda *a, **k: None)  # the figure's content counts here
    strat = build_as(FedCACStrategy, parse_settings({"method": "fedcac", "model": "mlp", "beta": 5}))
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
    in_order = build_as(FedCACStrategy, parse_settings({"method": "fedcac", "model": "mlp", "beta": 5}))
    in_order.aggregate(1, sorted(replies(), key=lambda r: r.client))
    for c in order:
        for k in strat.param_keys:
            np.testing.assert_array_equal(strat.custom[c][k], in_order.custom[c][k])
    assert strat.overlaps[1]["partition-ids"] == order
    exp = naive_overlap(np.array([np.unpackbits(bits[c])[:n].astype(bool) for c in range(4)]))
    strat.aggregate(2, replies(empty=True))
    write_artifacts(strat, tmp_path)
    panels = [ax for ax in figures[0].axes if ax.get_images()]
    first, empty = (ax.get_images()[0] for ax in panels)
    np.testing.assert_allclose(first.get_array(), exp, atol=5e-5)  # rows and columns by client id
    np.testing.assert_array_equal(empty.get_array(), np.zeros((4, 4)))
    assert first.get_clim() == empty.get_clim() == (0, 1)


# ---------------------------------------------------------------- client + strategy without Flower's runtime
def run_rounds(cfg, rounds, n=4):
    settings_ = parse_settings(cfg)
    strat = build_as(FedCACStrategy, settings_)
    ctxs = node_contexts(cfg, n)
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


def start_of_round(strat, ctx, cfg, node, rnd):
    """What the client starts round ``rnd`` from, as it shows it: its train reply with zero local epochs (the
    parameters it sends are the ones it started from) and the model it then keeps (BatchNorm statistics too)."""
    client = load_object(METHODS["fedcac"].client)(ctx, parse_settings({**cfg, "local-epochs": 0}))
    payload = strat.payload(node, rnd, "train")
    payload["config"] = ConfigRecord({"server-round": rnd})
    sent = record_to_numpy(client.train(payload)["arrays"])
    return sent, client.kept.load("model")


def test_tau_zero_is_fedavg_on_parameters():
    cfg = {"method": "fedcac", "tau": 0.0, "beta": 2, "partition": "iid", "local-epochs": 1}
    strat, ctxs, diags = run_rounds(cfg, 2)
    assert all(d["mask-fraction"] == 0.0 for d in diags)
    # every client's next model equals w_bar: no critical parameter survives
    sent, _ = start_of_round(strat, ctxs[0], cfg, 10, 3)
    assert sorted(sent) == sorted(strat.param_keys)
    for k in strat.param_keys:
        np.testing.assert_allclose(sent[k], strat.global_state[k], atol=1e-6)


def test_after_beta_critical_parameters_stay_local():
    cfg = {"method": "fedcac", "tau": 0.5, "beta": 1, "partition": "pathological"}
    strat, ctxs, diags = run_rounds(cfg, 2)
    assert diags[-1]["collaborators-max"] == 0
    settings_ = parse_settings(cfg)
    client = load_object(METHODS["fedcac"].client)(ctxs[1], settings_)
    own = dict(client.kept.load("model").items())
    mask = unpack_masks(client.kept.load("mask")["bits"], strat.param_shapes)
    sent, kept = start_of_round(strat, ctxs[1], cfg, 11, 3)
    assert any(mask[k].any() for k in mask) and not all(mask[k].all() for k in mask)  # both sources are checked
    for k in strat.param_keys:
        np.testing.assert_allclose(sent[k][mask[k]], own[k][mask[k]], atol=1e-6)
        np.testing.assert_allclose(sent[k][~mask[k]], strat.global_state[k][~mask[k]], atol=1e-6)
    running = [k for k in own if "running" in k]
    assert running  # the default cnn has BatchNorm statistics: they stay local
    for k in running:
        np.testing.assert_allclose(kept[k], own[k])


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
        build_as(FedCACStrategy, parse_settings({"method": "fedcac", "beta": 0}))
    with pytest.raises(ValueError, match=r"'tau' must be a number in \[0, 1\]"):
        build_as(FedCACStrategy, parse_settings({"method": "fedcac", "tau": 1.5}))


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
    strat = build_as(
        FedCACStrategy,
        parse_settings({"method": "fedcac", "model": "mlp", "min-nodes": 4, "beta": 10, "num-server-rounds": 4}),
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
    strat = build_as(FedCACStrategy, parse_settings({"method": "fedcac", "model": "mlp", "min-nodes": 3, "beta": 10}))
    (n_bits,) = strat.reply_spec("train", 1).records["mask"].tensors["bits"].shape
    assert isinstance(n_bits, int)  # the packed mask's length is fixed by the model

    def answer(rnd, node, phase, content):  # tau = 0 on every client: empty masks
        if phase == "train":
            content["mask"] = to_record({"bits": np.zeros(n_bits, np.uint8)})

    drive(strat, nodes, 1, answer)
    diag = strat.history[0].extra["fedcac"]
    assert diag["collaborators-max"] == 0 and all(v == [] for v in diag["collaborators"].values())
    overlap = mask_overlap(np.zeros((3, 40), bool))
    assert all(len(c) == 0 for c in collaborators(overlap, overlap_threshold(overlap, 1, 10), 1, 10))


def test_the_accuracy_before_aggregation_is_fedcacs_own_metric():
    reply = RecordDict(
        {
            "metrics": MetricRecord(
                {
                    "num-examples": 10,
                    "partition-id": 0,
                    "personal-acc": 0.5,
                    "personal-loss": 1.0,
                    "before-agg-acc": 0.7,
                }
            )
        }
    )
    fedavg, fedcac = strategy("fedavg"), strategy("fedcac")
    assert "before-agg-acc" not in fedavg.gate.check(1, 3, reply, "evaluate", set()).metrics  # never exposed
    assert fedcac.gate.check(1, 3, reply, "evaluate", set()).metrics["before-agg-acc"] == 0.7
    assert not fedcac.reply_spec("evaluate", 3).metrics["before-agg-acc"].required  # first contact has none


def naive_overlap(masks):
    """<M_i, M_j> / K_i by counting positions, 0 for an empty M_i."""
    n = len(masks)
    out = np.zeros((n, n))
    for i in range(n):
        k = int(masks[i].sum())
        for j in range(n):
            out[i, j] = int(np.sum(masks[i] & masks[j])) / k if k else 0.0
    return out


def offdiag(o):
    return o[~np.eye(len(o), dtype=bool)]

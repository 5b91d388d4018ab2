"""Client2Vec unit tests (client2vec.md §7): DSA-IGN, losses, index, sampler, aggregation, local loss, encoders."""

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from client_app.baselines import moon_loss
from client_app.client2vec_math import distill_loss, local_regulariser, orth_loss
from strategies.client2vec_math import (
    C2VServerState,
    aggregation_weights,
    cosine_matrix,
    eq2_objective,
    exclusion_window,
    sampling_probabilities,
)
from task.clip import MissingWeights, OpenClipEncoder, SyntheticEncoder, cached_embeddings, label_prompt
from task.dsa_ign import (
    IGNConfig,
    build_ign,
    client_index,
    loss_div,
    loss_orth,
    loss_recon,
    loss_sim,
    total_loss,
    train_dsa_ign,
)
from task.methods.client2vec import build_aux

torch.set_num_threads(1)


# ------------------------------------------------------------------------------------------ DSA-IGN
def test_dsa_ign_shapes_and_paper_parameter_count():
    net = build_ign(IGNConfig(ff=2048), 0)
    assert net.n_tokens == 32
    assert sum(p.numel() for p in net.parameters()) == 938_336
    z, u, d_hat = net(torch.randn(5, 512))
    assert z.shape == u.shape == d_hat.shape == (5, 512)


def test_without_positional_embedding_the_two_halves_collapse():
    d = torch.randn(8, 512)
    z, u, _ = build_ign(IGNConfig(pos_emb=False), 0).eval()(d)
    assert torch.equal(z, u)  # the paper's architecture: Z == U exactly in eval mode
    z, u, _ = build_ign(IGNConfig(pos_emb=True), 0).eval()(d)
    assert (z - u).abs().max() > 1e-3


def test_loss_closed_forms():
    b = 6
    same = torch.ones(b, 4)
    assert loss_div(same).item() == pytest.approx(1 + np.log(b - 1), abs=1e-5)
    ortho = torch.eye(b)
    assert loss_div(ortho).item() == pytest.approx(np.log(b - 1), abs=1e-5)
    v = torch.randn(b, 4)
    assert loss_sim(v, 3 * v).item() == pytest.approx(0.0, abs=1e-6)
    assert loss_sim(v, -v).item() == pytest.approx(2.0, abs=1e-6)
    e1, e2 = torch.zeros(b, 4), torch.zeros(b, 4)
    e1[:, 0], e2[:, 1] = 1, 1
    assert loss_sim(e1, e2).item() == pytest.approx(1.0)
    for mode in ("cos", "literal", "diag"):
        assert loss_orth(e1, e2, mode).item() == 0.0
    z, u = torch.randn(b, 8), torch.randn(b, 8)
    assert loss_orth(5 * z, 0.1 * u, "cos").item() == pytest.approx(loss_orth(z, u, "cos").item(), rel=1e-5)
    assert loss_orth(2 * z, u, "literal").item() == pytest.approx(2 * loss_orth(z, u, "literal").item(), rel=1e-5)
    assert loss_recon(v, v).item() == 0.0
    with pytest.raises(ValueError, match="c2v-orth-mode"):
        loss_orth(z, u, "l2")


def test_total_loss_is_finite_and_differentiable_and_training_lowers_it():
    net = build_ign(IGNConfig(ff=64, dropout=0.0), 0)
    d = torch.nn.functional.normalize(torch.randn(32, 512), dim=1)
    lab = torch.nn.functional.normalize(torch.randn(32, 512), dim=1)
    loss, parts = total_loss(net, d, lab)
    loss.backward()
    assert np.isfinite(loss.item()) and all(np.isfinite(v) for v in parts.values())
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())
    hist = train_dsa_ign(net, d.numpy(), lab.numpy(), epochs=15, batch_size=16)
    assert hist[-1]["total"] < hist[0]["total"]


# ------------------------------------------------------------------------------------------ client index
def test_client_index_is_order_free_and_label_half_is_histogram_map():
    rng = np.random.default_rng(0)
    net = build_ign(IGNConfig(ff=64), 0)
    T = rng.standard_normal((10, 512)).astype(np.float32)
    y = rng.integers(0, 10, 50)
    D, L = rng.standard_normal((50, 512)).astype(np.float32), T[y]
    bf, bl = client_index(net, D, L)
    perm = rng.permutation(50)
    bf2, _bl2 = client_index(net, D[perm], L[perm])
    np.testing.assert_allclose(bf, bf2, atol=1e-5)
    pi = np.bincount(y, minlength=10) / 50
    np.testing.assert_allclose(bl, pi @ T, atol=1e-5)
    np.testing.assert_allclose(client_index(net, D, L)[0], bf)  # same data, same index


# ------------------------------------------------------------------------------------------ sampler
def _state(m=20, seed=0, **kw):
    rng = np.random.default_rng(seed)
    return C2VServerState(
        rng.standard_normal((m, 16)), rng.standard_normal((m, 16)), rng.integers(5, 50, m), seed=seed, **kw
    )


def test_similarity_is_one_to_oneself_and_bounded():
    s = _state()
    for i in range(s.size):
        assert s.similarity([i])[i] == pytest.approx(1.0)
    sim = s.similarity([1, 4, 7])
    assert (sim >= -1 - 1e-9).all() and (sim <= 1 + 1e-9).all()


def test_sampler_probabilities_window_and_determinism():
    m, k = 40, 4
    assert exclusion_window(100, 10) == 5 and exclusion_window(60, 6) == 5 and exclusion_window(m, k) == 5
    s = _state(m, tau=0.5)
    history = []
    for t in range(1, 15):
        if t > 1:
            p = s.probabilities(t)
            assert p.sum() == pytest.approx(1.0) and (p >= 0).all()
            recent = set().union(*history[-exclusion_window(m, k) :])
            assert all(p[i] == 0 for i in recent) and (p > 0).sum() == m - len(recent)
        cohort = s.sample(t, k, use_index=True)
        assert len(set(cohort.tolist())) == k
        if history:
            assert not set(cohort.tolist()) & recent
        history.append(set(cohort.tolist()))
        s.observe(cohort)

    def sequence(state):
        out = []
        for t in range(1, 8):
            out.append(state.sample(t, k, True).tolist())
            state.observe(out[-1])
        return out

    assert sequence(_state(m, seed=3)) == sequence(_state(m, seed=3))


def test_round_one_is_uniform_and_temperature_limits():
    s = _state(10)
    np.testing.assert_allclose(s.probabilities(1), np.full(10, 0.1))
    sim = np.array([0.1, 0.5, -0.3, 0.9])
    np.testing.assert_allclose(sampling_probabilities(sim, 1e6), np.full(4, 0.25), atol=1e-5)
    assert sampling_probabilities(sim, 1e-4).argmax() == 3 and sampling_probabilities(sim, 1e-4).max() > 0.999
    blocked = np.array([False, False, False, True])
    p = sampling_probabilities(sim, 1e6, blocked)
    np.testing.assert_allclose(p, [1 / 3, 1 / 3, 1 / 3, 0], atol=1e-5)
    with pytest.raises(ValueError, match="c2v-tau"):
        sampling_probabilities(sim, 0.0)


# ------------------------------------------------------------------------------------------ aggregation
@hsettings(max_examples=50, deadline=None)
@given(st.lists(st.tuples(st.floats(-3, 3), st.integers(1, 500)), min_size=1, max_size=12), st.floats(0.05, 20))
def test_aggregation_weights_are_a_distribution_and_maximise_eq2(rows, lambda1):
    h, n = np.array([r[0] for r in rows]), np.array([r[1] for r in rows])
    w = aggregation_weights(h, n, lambda1)
    assert (w > 0).all() and w.sum() == pytest.approx(1.0)
    rng = np.random.default_rng(len(rows))
    best = eq2_objective(w, h, n, lambda1)
    for _ in range(20):
        assert eq2_objective(rng.dirichlet(np.ones(len(rows))), h, n, lambda1) <= best + 1e-9


def test_aggregation_limits_and_history_recursion():
    n = np.array([10.0, 30.0, 60.0])
    q = n / n.sum()
    np.testing.assert_allclose(aggregation_weights(np.array([0.3, -0.2, 0.9]), n, 1e9), q, atol=1e-6)
    np.testing.assert_allclose(aggregation_weights(np.full(3, 0.7), n, 1.0), q, atol=1e-12)
    s = _state(12, gamma=0.5)
    cohorts = [[0, 1, 2], [3, 4, 5], [1, 6, 7]]
    for c in cohorts:
        s.observe(c)
    explicit = sum(0.5 ** (len(cohorts) - 1 - t) * s.similarity(c) for t, c in enumerate(cohorts))
    np.testing.assert_allclose(s.H, explicit, atol=1e-12)
    s0 = _state(12, gamma=0.0)
    for c in cohorts:
        s0.observe(c)
    np.testing.assert_allclose(s0.H, s0.similarity(cohorts[-1]), atol=1e-12)
    np.testing.assert_allclose(s.weights([1, 6, 7], use_index=False), s.n[[1, 6, 7]] / s.n[[1, 6, 7]].sum())


# ------------------------------------------------------------------------------------------ local loss (iii)
def test_local_regulariser_terms():
    aux = build_aux(8, 16, 3, 0)
    beta = torch.zeros(4, 16)
    beta[:, 0] = 1.0
    with torch.no_grad():
        aux.proj.weight.zero_()
        aux.proj.weight[1] = 1.0  # z_P lies on axis 1, orthogonal to every beta_k (axis 0)
    z = torch.rand(5, 8) + 0.1
    assert orth_loss(aux.proj(z), beta).item() == pytest.approx(0.0, abs=1e-7)
    logits = torch.randn(5, 3)
    assert distill_loss(logits, logits.clone()).item() == pytest.approx(0.0, abs=1e-6)
    beta_rand = torch.randn(6, 16)
    o = orth_loss(aux.proj(z), beta_rand).item()
    assert orth_loss(aux.proj(z), beta_rand, mean_over_clients=True).item() == pytest.approx(o / 6, rel=1e-5)


def test_local_regulariser_reaches_the_backbone_and_not_the_prediction():
    from task.models import build_model

    model = build_model("mlp", 1, 8, 10, seed=0)
    aux = build_aux(model.feature_dim, 512, 10, 0)
    x = torch.rand(4, 1, 8, 8)
    before = model(x).detach().clone()
    z = model.features(x)
    loss = local_regulariser(z, model.head(z), aux, torch.randn(7, 512))
    loss.backward()
    assert model.fc1.weight.grad is not None and model.fc1.weight.grad.abs().sum() > 0
    assert model.head.weight.grad is None or model.head.weight.grad.abs().sum() == 0  # teacher is detached
    with torch.no_grad():
        aux.proj.weight.add_(1.0)
    assert torch.equal(model(x), before)  # P and h_P never change the model's output


def test_moon_loss_prefers_the_global_representation():
    z = torch.randn(6, 8)
    assert moon_loss(z, z, -z).item() < moon_loss(z, -z, z).item()
    assert moon_loss(z, z, z).item() == pytest.approx(np.log(2), abs=1e-6)


# ------------------------------------------------------------------------------------------ encoders
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


def test_options_reject_bad_values_naming_the_key():
    from task.config import parse_settings

    base = {"method": "client2vec"}
    assert parse_settings(base).options.base == "fedavg"
    for key, value in (("c2v-base", "feddyn"), ("c2v-tau", -1.0), ("c2v-sampling", "maybe"), ("c2v-encoder", "vit")):
        with pytest.raises(ValueError, match=key):
            parse_settings({**base, key: value})


def test_label_similarity_tracks_label_histograms():
    rng = np.random.default_rng(0)
    T = SyntheticEncoder(512, 0).encode_texts([label_prompt(str(c)) for c in range(10)])
    hists = rng.dirichlet(np.full(10, 0.3), size=30)
    beta_l = hists @ T
    iu = np.triu_indices(30, 1)
    corr = np.corrcoef(cosine_matrix(beta_l)[iu], cosine_matrix(hists)[iu])[0, 1]
    assert corr > 0.9


# ------------------------------------------------------------------------------------------ strategy
def _strategy(**cfg):
    from server_app.app import build_strategy
    from task.config import parse_settings

    return build_strategy(parse_settings({"method": "client2vec", "model": "mlp", **cfg}))


def test_strategy_aggregates_with_index_weights_and_carries_the_projection():
    from strategies.base import Reply

    strat = _strategy()
    assert any(k.startswith("c2v.") for k in strat.global_state)  # P and h_P are part of the shared state
    assert not any(k.startswith("c2v.") for k in _strategy(**{"c2v-local": False}).global_state)
    rng = np.random.default_rng(0)
    m = 5
    strat.c2v = C2VServerState(rng.standard_normal((m, 512)), rng.standard_normal((m, 512)), np.arange(1, m + 1) * 10.0)
    strat.index_clients = [0, 1, 2, 3, 4]
    strat.c2v.observe([0, 1])  # an earlier round
    updates = []
    for nid in (102, 104, 105):
        arrays = {k: rng.standard_normal(v.shape).astype(v.dtype) for k, v in strat.global_state.items()}
        updates.append(Reply(nid, nid - 101, 10 * (nid - 100), {}, {"arrays": arrays}))
    h_before = strat.c2v.H.copy()
    strat.aggregate(2, updates)
    rows = [1, 3, 4]
    h = 0.5 * h_before + strat.c2v.similarity(rows)
    expected_w = aggregation_weights(h[rows], strat.c2v.n[rows], 1.0)
    for k, v in strat.global_state.items():
        manual = sum(w * u.arrays[k].astype(np.float64) for w, u in zip(expected_w, updates, strict=True))
        np.testing.assert_allclose(v, manual, rtol=1e-5, atol=1e-6)
    assert strat.agg_weights[2] == pytest.approx(dict(zip([1, 3, 4], expected_w, strict=True)))


def test_strategy_rejects_bad_index_replies_with_a_reason():
    from flwr.app import MetricRecord, RecordDict

    from task.params import to_record

    strat = _strategy()
    bad_shape = RecordDict(
        {
            "metrics": MetricRecord({"num-examples": 10, "partition-id": 0}),
            "arrays": to_record({"beta_f": np.zeros(7, np.float32), "beta_l": np.zeros(512, np.float32)}),
        }
    )
    nan = RecordDict(
        {
            "metrics": MetricRecord({"num-examples": 10, "partition-id": 1}),
            "arrays": to_record({"beta_f": np.full(512, np.nan, np.float32), "beta_l": np.zeros(512, np.float32)}),
        }
    )
    no_n = RecordDict(
        {
            "metrics": MetricRecord({"partition-id": 2}),
            "arrays": to_record({"beta_f": np.zeros(512, np.float32), "beta_l": np.zeros(512, np.float32)}),
        }
    )
    for nid, content in ((1, bad_shape), (2, nan), (3, no_n)):
        assert strat.gate.check(1, nid, content, "c2v_index", set()) is None
    reasons = [f["reason"] for f in strat.failures]
    assert "'beta_f' has shape (7,)" in reasons[0] and "non-finite" in reasons[1] and "num-examples" in reasons[2]
    assert strat.client_of == {}  # nothing of a rejected reply is kept


ARMS = {"FedAvg": (False, False, False), "+ii": (False, True, False), "+i+ii+iii": (True, True, True)}


def _cohorts_and_index(arm, nodes, rounds=4):
    from tests.strategy_harness import drive

    sampling, aggregation, local = ARMS[arm]
    strat = _strategy(
        **{
            "min-nodes": len(nodes),
            "fraction-train": 0.5,
            "c2v-ign-epochs": 1,
            "c2v-ign-upload": 4,
            "c2v-sampling": sampling,
            "c2v-aggregation": aggregation,
            "c2v-local": local,
            "seed": 5,
        }
    )
    drive(strat, nodes, rounds)
    index = None if strat.c2v is None else (list(strat.index_clients), strat.c2v.beta_f.tobytes(), strat.ign_history)
    return strat.cohorts, index


def test_a_seed_draws_the_same_clients_whatever_flowers_node_ids():
    # Flower's simulated node ids are random per run: the same partitions behind other node ids must give the
    # same DSA-IGN, index and cohorts, and every arm without (i) must draw the FedAvg arm's clients
    first = {9001: 0, 12: 1, 777: 2, 4: 3, 55: 4, 60: 5}
    second = {3: 0, 80808: 1, 41: 2, 999: 3, 7: 4, 100: 5}
    cohorts_a, index_a = _cohorts_and_index("+ii", first)
    cohorts_b, index_b = _cohorts_and_index("+ii", second)
    assert cohorts_a == cohorts_b and index_a == index_b
    assert index_a[0] == sorted(index_a[0])  # index rows in client-id order
    fedavg, _ = _cohorts_and_index("FedAvg", second)
    assert fedavg == cohorts_a  # paired: the same draws as the index arm without sampling
    full_a, index_full_a = _cohorts_and_index("+i+ii+iii", first)
    full_b, index_full_b = _cohorts_and_index("+i+ii+iii", second)
    assert full_a == full_b and index_full_a == index_full_b
    assert all(len(c) == 3 for c in cohorts_a.values())

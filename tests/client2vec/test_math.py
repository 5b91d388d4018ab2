"""What Client2Vec's client-side losses must compute (client2vec.md §2.8, MOON), against explicit formulas."""

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
from task.clip import SyntheticEncoder, label_prompt
from task.methods.client2vec import build_aux


def cos_np(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return (a / np.linalg.norm(a, axis=1, keepdims=True)) @ (b / np.linalg.norm(b, axis=1, keepdims=True)).T


def softmax_np(x):
    e = np.exp(x - x.max(1, keepdims=True))
    return e / e.sum(1, keepdims=True)


def test_projection_modules_are_a_bias_free_projection_and_a_classifier_under_the_shared_prefix():
    aux = build_aux(6, 9, 4, seed=0)
    state = aux.state_with_prefix()
    assert {k: tuple(v.shape) for k, v in state.items()} == {
        "c2v.proj.weight": (9, 6),
        "c2v.head.weight": (4, 9),
        "c2v.head.bias": (4,),
    }
    assert torch.equal(aux.proj(torch.zeros(2, 6)), torch.zeros(2, 9))  # P z is linear in z: no offset
    again = build_aux(6, 9, 4, seed=0).state_with_prefix()  # server and clients build the same P and h_P
    assert all(torch.equal(state[k], again[k]) for k in state)
    other = build_aux(6, 9, 4, seed=1).state_with_prefix()
    assert not torch.equal(state["c2v.proj.weight"], other["c2v.proj.weight"])


def test_orth_loss_is_the_batch_mean_of_summed_absolute_cosines_to_every_feature_index():
    g = torch.Generator().manual_seed(0)
    z_p, beta = torch.randn(5, 7, generator=g), torch.randn(3, 7, generator=g)
    cos = np.abs(cos_np(z_p, beta))  # 5 x 3
    assert orth_loss(z_p, beta).item() == pytest.approx(cos.sum(1).mean(), rel=1e-5)
    assert orth_loss(z_p, beta, mean_over_clients=True).item() == pytest.approx(cos.mean(1).mean(), rel=1e-5)
    raw = np.abs(z_p.numpy().astype(np.float64) @ beta.numpy().T.astype(np.float64))
    assert orth_loss(z_p, beta, normalize=False).item() == pytest.approx(raw.sum(1).mean(), rel=1e-5)
    # cosines do not depend on the lengths of z_P or of any index row
    scaled = orth_loss(3.0 * z_p, beta * torch.tensor([[0.1], [5.0], [2.0]]))
    assert scaled.item() == pytest.approx(orth_loss(z_p, beta).item(), rel=1e-5)


def test_distillation_is_kl_from_the_detached_main_head_to_the_projection_head():
    g = torch.Generator().manual_seed(1)
    teacher = torch.randn(4, 3, generator=g, requires_grad=True)
    student = torch.randn(4, 3, generator=g, requires_grad=True)
    p, q = (
        softmax_np(teacher.detach().numpy().astype(np.float64)),
        softmax_np(student.detach().numpy().astype(np.float64)),
    )
    expected = (p * (np.log(p) - np.log(q))).sum(1).mean()
    loss = distill_loss(teacher, student)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    loss.backward()
    # only the projection head learns from it
    assert teacher.grad is None and student.grad is not None and student.grad.abs().sum() > 0


def test_local_regulariser_is_orthogonality_plus_distillation_through_p_and_h_p():
    aux = build_aux(6, 8, 3, seed=2)
    g = torch.Generator().manual_seed(2)
    z, logits, beta = torch.randn(5, 6, generator=g), torch.randn(5, 3, generator=g), torch.randn(4, 8, generator=g)
    z_p = aux.proj(z)
    # defaults: mean |cos| over the M clients (c2v-orth-mean-over-clients), same value with or without the detach
    expected = orth_loss(z_p, beta, True, True) + distill_loss(logits, aux.head(z_p))
    assert local_regulariser(z, logits, aux, beta).item() == pytest.approx(expected.item(), rel=1e-6)
    summed = orth_loss(z_p, beta, True, False) + distill_loss(logits, aux.head(z_p))
    got = local_regulariser(z, logits, aux, beta, mean_over_clients=False, detach_distill=False)
    assert got.item() == pytest.approx(summed.item(), rel=1e-6)
    plain = orth_loss(z_p, beta, False, True) + distill_loss(logits, aux.head(z_p))
    got = local_regulariser(z, logits, aux, beta, normalize=False, mean_over_clients=True)
    assert got.item() == pytest.approx(plain.item(), rel=1e-6)


def _feature_grads(detach_distill, beta):
    aux = build_aux(6, 8, 3, seed=2)
    g = torch.Generator().manual_seed(4)
    z = torch.randn(5, 6, generator=g, requires_grad=True)
    logits = torch.randn(5, 3, generator=g)
    kwargs = {} if detach_distill is None else {"detach_distill": detach_distill}  # None: the function's default
    local_regulariser(z, logits, aux, beta, **kwargs).backward()
    return z.grad, {k: p.grad for k, p in aux.named_parameters()}


def test_distillation_trains_p_and_h_p_but_not_the_features_unless_asked():
    """The root cause of the collapse at the defaults (docs/methods/client2vec.md): L_dist's gradient into the
    features. By default L_dist reaches P and h_P only; the features get L_orth's gradient alone."""
    beta = torch.zeros(4, 8)  # cos(z_P, 0) = 0: L_orth contributes no gradient at all
    z_grad, aux_grads = _feature_grads(None, beta)
    assert z_grad is None or z_grad.abs().max() == 0
    assert aux_grads["proj.weight"].abs().sum() > 0 and aux_grads["head.weight"].abs().sum() > 0
    z_grad, _ = _feature_grads(False, beta)  # c2v-dist-detach=false: the distillation moves the features too
    assert z_grad.abs().sum() > 0
    g = torch.Generator().manual_seed(5)
    z_grad, _ = _feature_grads(True, torch.randn(4, 8, generator=g))  # the orthogonality term still shapes z
    assert z_grad.abs().sum() > 0


def test_moon_loss_matches_its_formula_and_only_pulls_the_local_representation():
    g = torch.Generator().manual_seed(3)
    z = torch.randn(6, 5, generator=g, requires_grad=True)
    zg = torch.randn(6, 5, generator=g, requires_grad=True)
    zp = torch.randn(6, 5, generator=g, requires_grad=True)
    for t in (0.5, 2.0):
        pos = np.diag(cos_np(z.detach(), zg.detach())) / t
        neg = np.diag(cos_np(z.detach(), zp.detach())) / t
        expected = (-np.log(np.exp(pos) / (np.exp(pos) + np.exp(neg)))).mean()
        assert moon_loss(z, zg, zp, t).item() == pytest.approx(expected, rel=1e-5)
    pos, neg = np.diag(cos_np(z.detach(), zg.detach())) / 0.5, np.diag(cos_np(z.detach(), zp.detach())) / 0.5
    default = (np.log(np.exp(pos) + np.exp(neg)) - pos).mean()  # MOON's default temperature 0.5
    assert moon_loss(z, zg, zp).item() == pytest.approx(default, rel=1e-5)
    moon_loss(z, zg, zp).backward()
    assert zg.grad is None and zp.grad is None and z.grad is not None and z.grad.abs().sum() > 0


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
    history: list[set[int]] = []
    recent: set[int] = set()
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
    from task.models import MLP, build_model

    model = build_model("mlp", 1, 8, 10, seed=0)
    assert isinstance(model, MLP)
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


def test_label_similarity_tracks_label_histograms():
    rng = np.random.default_rng(0)
    T = SyntheticEncoder(512, 0).encode_texts([label_prompt(str(c)) for c in range(10)])
    hists = rng.dirichlet(np.full(10, 0.3), size=30)
    beta_l = hists @ T
    iu = np.triu_indices(30, 1)
    corr = np.corrcoef(cosine_matrix(beta_l)[iu], cosine_matrix(hists)[iu])[0, 1]
    assert corr > 0.9

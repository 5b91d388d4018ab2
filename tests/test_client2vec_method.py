"""What Client2Vec's client-side losses must compute (client2vec.md §2.8, MOON), against explicit formulas."""

import numpy as np
import pytest
import torch

from client_app.baselines import moon_loss
from client_app.client2vec_math import distill_loss, local_regulariser, orth_loss
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
    assert (
        teacher.grad is None and student.grad is not None and student.grad.abs().sum() > 0
    )  # only the projection head learns from it


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

"""What FedC2I's client math must do (fedc2i.md §2.2, §6.3, §7), checked against naive re-computations.

Each expectation is rebuilt here the slow, obvious way (an explicit leave-one-out model per client, a
classifier edited row by row, the power ratio l^gamma / sum l^gamma), independently of the vectorised code; the
invariants of fedc2i.md §7 are checked on small hand-made models.
"""

import numpy as np
import pytest
import torch
from torch import nn

from client_app.fedc2i_math import (
    batched_losses,
    influence_matrix,
    influence_vector,
    leave_one_out,
    mix_classifier,
    mix_states,
    sharpened_weights,
)
from task.models import SplitModel, build_model, head_keys


class TinyBN(SplitModel):
    """Linear - BatchNorm - ReLU body and a linear head: float parameters, float BN statistics and an
    integer buffer (num_batches_tracked), like the real models, in a size that runs in milliseconds."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(5, 6)
        self.bn = nn.BatchNorm1d(6)
        self.head = nn.Linear(6, 3)

    def features(self, x):
        return torch.relu(self.bn(self.fc(x)))


def tiny_models(m, seed=0):
    torch.manual_seed(seed)
    models = []
    for i in range(m):
        net = TinyBN()
        mean, var, count = net.bn.running_mean, net.bn.running_var, net.bn.num_batches_tracked
        assert mean is not None and var is not None and count is not None  # BatchNorm tracks running statistics
        with torch.no_grad():
            mean.normal_(0, 1)
            var.uniform_(0.5, 3.0)
            count.fill_(10 + i)
        models.append(net)
    return models


def stack(models):
    states = [net.state_dict() for net in models]
    return {k: torch.stack([s[k] for s in states]) for k in states[0]}


def batch(seed=1, n=24):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 5, generator=g), torch.randint(0, 3, (n,), generator=g)


def power_ratio(losses, gamma):
    powered = np.asarray(losses, dtype=np.float64) ** gamma
    return powered / powered.sum()


def test_leave_one_out_with_two_models_is_the_other_model_and_one_model_is_refused():
    w = {"a": torch.tensor([[1.0, 2.0], [5.0, -1.0]])}
    torch.testing.assert_close(leave_one_out(w)["a"], torch.tensor([[5.0, -1.0], [1.0, 2.0]]))
    with pytest.raises(ValueError, match=r"^leave-one-out needs at least two models$"):
        leave_one_out({"a": torch.ones(1, 3)})


def test_sharpened_weights_are_the_power_ratio_and_a_zero_loss_gets_zero_weight():
    losses = torch.tensor([0.2, 0.5, 0.9, 3.0])
    for gamma in (0.5, 1.0, 5.0):
        np.testing.assert_allclose(sharpened_weights(losses, gamma).numpy(), power_ratio(losses, gamma), rtol=1e-5)
    w = sharpened_weights(torch.tensor([0.0, 1.0, 3.0]), 2.0)
    assert torch.isfinite(w).all()
    np.testing.assert_allclose(w.numpy(), [0.0, 0.1, 0.9], atol=1e-6)
    torch.testing.assert_close(sharpened_weights(torch.tensor([0.0, 1.0, 3.0]), 0.0), torch.full((3,), 1 / 3))
    with pytest.raises(ValueError, match="gamma"):
        sharpened_weights(losses, -0.5)


def test_batched_losses_evaluate_each_candidate_in_eval_mode_with_its_own_statistics():
    models = tiny_models(4)
    x, y = batch()
    probe = tiny_models(1, seed=9)[0].train()  # left in training mode: BN would use the batch statistics
    got = batched_losses(probe, stack(models), x, y)
    expected = []
    for net in models:
        net.eval()
        expected.append(float(nn.functional.cross_entropy(net(x), y)))
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-5)


def test_influence_vector_scores_leave_one_out_extractors_with_the_clients_own_classifier():
    models = tiny_models(4)
    x, y = batch()
    stacked = stack(models)
    heads = head_keys(models[0])
    own_head = {k: torch.randn_like(stacked[k][0]) for k in heads}  # differs from every sent head
    gamma = 3.0
    lam, losses = influence_vector(TinyBN(), stacked, own_head, x, y, gamma, heads)
    expected = []
    for i in range(4):
        state = {}
        for k, v in stacked.items():
            if k in heads:
                state[k] = own_head[k]
            elif v.is_floating_point():
                state[k] = torch.stack([v[j] for j in range(4) if j != i]).mean(0)
            else:
                state[k] = v[i]
        net = TinyBN()
        net.load_state_dict(state)
        net.eval()
        expected.append(float(nn.functional.cross_entropy(net(x), y)))
    np.testing.assert_allclose(losses.numpy(), expected, rtol=1e-5)
    np.testing.assert_allclose(lam.numpy(), power_ratio(expected, gamma), rtol=1e-4)


def test_influence_matrix_equals_editing_the_own_classifier_row_by_row():
    g = torch.Generator().manual_seed(3)
    m, c, d, b = 4, 3, 5, 20
    feats = torch.randn(b, d, generator=g)
    y = torch.randint(0, c, (b,), generator=g)
    weights, biases = torch.randn(m, c, d, generator=g), torch.randn(m, c, generator=g)
    own_w, own_b = torch.randn(c, d, generator=g), torch.randn(c, generator=g)
    gamma = 4.0
    big_lambda, losses = influence_matrix(feats, y, own_w, own_b, weights, biases, gamma)
    for i in range(m):
        others = [j for j in range(m) if j != i]
        for col in range(c):
            w, bias = own_w.clone(), own_b.clone()
            w[col] = weights[others, col].mean(0)
            bias[col] = biases[others, col].mean(0)
            ref = nn.functional.cross_entropy(feats @ w.T + bias, y)
            assert float(losses[i, col]) == pytest.approx(float(ref), rel=1e-5)
    for col in range(c):  # normalised over clients, per class
        np.testing.assert_allclose(big_lambda[:, col].numpy(), power_ratio(losses[:, col].numpy(), gamma), rtol=1e-4)


def test_mix_states_is_the_weighted_sum_and_keeps_the_own_integer_buffers():
    stacked = {"w": torch.randn(3, 2, 2), "n": torch.tensor([7, 11, 13])}
    weights = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    out = mix_states(stacked, weights, ["w", "n"])
    expected = sum(float(weights[i]) * stacked["w"][i] for i in range(3))
    assert out["w"].dtype == torch.float32
    torch.testing.assert_close(out["w"], expected)
    assert int(out["n"]) == 7  # the receiver's own (first) value, not a mixture


def test_mix_classifier_mixes_each_class_row_and_its_bias_with_that_class_weights():
    g = torch.Generator().manual_seed(5)
    weights, biases = torch.randn(3, 4, 2, generator=g), torch.randn(3, 4, generator=g)
    influence = torch.softmax(torch.randn(3, 4, generator=g), dim=0)
    w, b = mix_classifier(weights, biases, influence)
    for col in range(4):
        torch.testing.assert_close(w[col], sum(influence[i, col] * weights[i, col] for i in range(3)))
        torch.testing.assert_close(b[col], sum(influence[i, col] * biases[i, col] for i in range(3)))


def stacked_models(models):
    states = [m.state_dict() for m in models]
    return {k: torch.stack([s[k] for s in states]) for k in states[0]}


def data(seed=0, n=64):
    g = torch.Generator().manual_seed(seed)
    x = torch.rand(n, 1, 8, 8, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return x, y


def test_leave_one_out_from_the_sum_equals_the_naive_average():
    w = {"a": torch.randn(5, 3, 2)}
    loo = leave_one_out(w)["a"]
    for i in range(5):
        naive = torch.stack([w["a"][j] for j in range(5) if j != i]).mean(0)
        torch.testing.assert_close(loo[i], naive)


def test_vmapped_losses_equal_a_loop_over_models():
    models = [build_model("cnn", 1, 8, 10, seed=s).eval() for s in range(4)]
    x, y = data()
    batched = batched_losses(models[0], stacked_models(models), x, y)
    loop = torch.stack([nn.functional.cross_entropy(m(x), y) for m in models])
    torch.testing.assert_close(batched, loop, rtol=1e-5, atol=1e-5)


def test_weights_are_a_distribution_and_gamma_zero_is_uniform():
    losses = torch.tensor([0.5, 1.0, 2.0, 4.0])
    for gamma in (0.0, 1.0, 5.0, 10.0):
        w = sharpened_weights(losses, gamma)
        assert (w >= 0).all() and torch.isclose(w.sum(), torch.tensor(1.0))
    torch.testing.assert_close(sharpened_weights(losses, 0.0), torch.full((4,), 0.25))
    torch.testing.assert_close(sharpened_weights(losses, 2.0), losses**2 / (losses**2).sum())
    with pytest.raises(ValueError, match="gamma"):
        sharpened_weights(losses, -1.0)


def _influence(models, own, gamma=5.0):
    x, y = data(1)
    stacked = stacked_models(models)
    heads = head_keys(models[0])
    return influence_vector(models[0], stacked, {h: models[own].state_dict()[h] for h in heads}, x, y, gamma, heads)


def test_a_peer_identical_to_the_client_gets_the_clients_weight():
    a, b, c = (build_model("c2i-small", 1, 8, 10, seed=s) for s in (0, 1, 2))
    twin = build_model("c2i-small", 1, 8, 10, seed=0)
    lam, _losses = _influence([a, b, twin, c], own=0)
    torch.testing.assert_close(lam[0], lam[2])
    assert torch.isclose(lam.sum(), torch.tensor(1.0))


def test_a_much_worse_peer_gets_less_weight():
    torch.manual_seed(0)
    x, y = data(2, n=128)
    good = build_model("c2i-small", 1, 8, 10, seed=0)
    opt = torch.optim.Adam(good.parameters(), 1e-2)
    for _ in range(60):
        opt.zero_grad()
        nn.functional.cross_entropy(good(x), y).backward()
        opt.step()
    peers = [build_model("c2i-small", 1, 8, 10, seed=0) for _ in range(3)]
    for p in peers:
        p.load_state_dict(good.state_dict())
    bad = build_model("c2i-small", 1, 8, 10, seed=9)
    with torch.no_grad():
        for w in bad.parameters():
            w.mul_(5.0)
    models = [good, *peers, bad]
    heads = head_keys(good)
    lam, _losses = influence_vector(
        good, stacked_models(models), {h: good.state_dict()[h] for h in heads}, x, y, 5.0, heads
    )
    # leaving the bad peer out gives the LOWEST loss, so it gets the least weight
    assert lam[-1] < lam[:-1].min()


def test_influence_matrix_columns_sum_to_one_and_mixing_changes_the_classifier():
    feats = torch.randn(16, 6)
    y = torch.randint(0, 3, (16,))
    weights, biases = torch.randn(4, 3, 6), torch.randn(4, 3)
    big_lambda, losses = influence_matrix(feats, y, weights[0], biases[0], weights, biases, gamma=5.0)
    assert big_lambda.shape == (4, 3) and (big_lambda >= 0).all()
    torch.testing.assert_close(big_lambda.sum(0), torch.ones(3))
    # brute force loss for (i, c) = (2, 1)
    loo_w = (weights.sum(0) - weights[2]) / 3
    loo_b = (biases.sum(0) - biases[2]) / 3
    w, b = weights[0].clone(), biases[0].clone()
    w[1], b[1] = loo_w[1], loo_b[1]
    torch.testing.assert_close(losses[2, 1], nn.functional.cross_entropy(feats @ w.T + b, y))
    mixed_w, _mixed_b = mix_classifier(weights, biases, big_lambda)
    assert not torch.allclose(mixed_w, weights[0])
    # the printed Eq. 10 (client's own row phi_{m,c} in the sum) is a no-op: it returns the own classifier
    printed_w = torch.einsum("mc,cd->cd", big_lambda, weights[0])
    torch.testing.assert_close(printed_w, weights[0])
    torch.testing.assert_close(mixed_w[1], (big_lambda[:, 1:2] * weights[:, 1]).sum(0))


def test_uniform_weights_mix_to_the_average():
    w = {"a": torch.randn(4, 3)}
    torch.testing.assert_close(mix_states(w, torch.full((4,), 0.25), ["a"])["a"], w["a"].mean(0))

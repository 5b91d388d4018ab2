"""The one training loop and the evaluation loop (task/train.py), checked against steps computed by hand.

Every method trains through ``train``; a loop that silently drops momentum, the extra loss, the parameter
subset or the per-sample averaging would change every method at once.
"""

import copy
import math

import pytest
import torch
from torch import nn

from task.models import SplitModel
from task.train import batches, evaluate, proximal_term, resolve_device, train


class Lin(SplitModel):
    def __init__(self, d=4, c=3, bn=False):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(d, 5), nn.BatchNorm1d(5)) if bn else nn.Linear(d, 5)
        self.head = nn.Linear(5, c)

    def features(self, x):
        return torch.tanh(self.body(x))


def data(n=12, d=4, c=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, d, generator=g), torch.randint(0, c, (n,), generator=g)


def model(seed=0, **kw):
    torch.manual_seed(seed)
    return Lin(**kw)


def grads(net, x, y, extra=None):
    net.zero_grad()
    loss = nn.functional.cross_entropy(net(x), y)
    if extra is not None:
        loss = loss + extra(net)
    loss.backward()
    return {n: p.grad.detach().clone() for n, p in net.named_parameters()}


def params(net):
    return {n: p.detach().clone() for n, p in net.named_parameters()}


def test_one_full_batch_sgd_step_with_weight_decay():
    x, y = data()
    net, ref = model(), model()
    g = grads(ref, x, y)
    w0 = params(ref)
    out = train(net, x, y, epochs=1, batch_size=len(y), lr=0.3, momentum=0.0, weight_decay=0.1)
    for n, p in net.named_parameters():
        torch.testing.assert_close(p.detach(), w0[n] - 0.3 * (g[n] + 0.1 * w0[n]))
    assert out["steps"] == 1


def test_momentum_carries_the_previous_step_within_one_call():
    x, y = data()
    net, ref = model(), model()
    lr, mu = 0.2, 0.9
    g1 = grads(ref, x, y)
    with torch.no_grad():
        for n, p in ref.named_parameters():
            p.sub_(lr * g1[n])
    g2 = grads(ref, x, y)
    w0 = params(model())
    train(net, x, y, epochs=2, batch_size=len(y), lr=lr, momentum=mu)
    for n, p in net.named_parameters():
        torch.testing.assert_close(p.detach(), w0[n] - lr * g1[n] - lr * (mu * g1[n] + g2[n]))


def test_adam_first_step_moves_each_weight_by_about_lr_against_its_gradient():
    x, y = data()
    net, ref = model(), model()
    g = grads(ref, x, y)
    w0 = params(ref)
    train(net, x, y, epochs=1, batch_size=len(y), lr=0.01, optimizer="adam")
    for n, p in net.named_parameters():
        expected = w0[n] - 0.01 * g[n] / (g[n].abs() + 1e-8)
        torch.testing.assert_close(p.detach(), expected, atol=1e-6, rtol=1e-4)
    with pytest.raises(ValueError, match="optimizer"):
        train(model(), x, y, optimizer="lbfgs")


def test_adam_applies_the_weight_decay_too():
    """weight-decay is a run setting for either optimizer (torch's Adam: L2 added to the gradient)."""
    x, y = data()
    net, ref = model(), model()
    g = grads(ref, x, y)
    w0 = params(ref)
    wd = 5.0
    train(net, x, y, epochs=1, batch_size=len(y), lr=0.01, weight_decay=wd, optimizer="adam")
    flipped = 0
    for n, p in net.named_parameters():
        d = g[n] + wd * w0[n]
        flipped += int((torch.sign(d) != torch.sign(g[n])).sum())
        torch.testing.assert_close(p.detach(), w0[n] - 0.01 * d / (d.abs() + 1e-8), atol=1e-6, rtol=1e-4)
    assert flipped > 0  # the decay changes the direction of some steps: the case this test needs


def test_the_extra_loss_sees_each_batch_with_its_labels_and_logits():
    """The hook contract (module docstring): ``extra_loss(model, x, y, logits)`` of the batch being trained on
    (MOON, Client2Vec and FedRoD compute their terms from the batch's inputs, labels and logits)."""
    x, y = data(n=10)
    net = model()
    calls = []

    def extra(m, xb, yb, logits):
        calls.append((xb.clone(), yb.clone(), logits.detach().clone(), m(xb).detach().clone()))
        return torch.zeros(())

    train(net, x, y, epochs=1, batch_size=4, lr=0.0, momentum=0.0, extra_loss=extra)
    assert [len(c[1]) for c in calls] == [4, 4, 2]
    rows = []
    for xb, yb, logits, own in calls:
        torch.testing.assert_close(logits, own)  # the logits of this batch
        for xi, yi in zip(xb, yb, strict=True):
            (i,) = [k for k in range(len(x)) if torch.equal(x[k], xi)]
            assert int(y[i]) == int(yi)  # each input with its own label
            rows.append(i)
    assert sorted(rows) == list(range(10))


def test_the_extra_loss_is_added_to_the_objective():
    x, y = data()

    def extra(m):
        return 2.0 * (m.head.weight**2).sum()

    net, ref = model(), model()
    g = grads(ref, x, y, extra)
    w0 = params(ref)
    train(net, x, y, epochs=1, batch_size=len(y), lr=0.1, momentum=0.0, extra_loss=lambda m, xb, yb, logits: extra(m))
    for n, p in net.named_parameters():
        torch.testing.assert_close(p.detach(), w0[n] - 0.1 * g[n])


def test_only_the_given_parameters_move():
    x, y = data()
    net = model()
    w0 = params(net)
    train(net, x, y, epochs=2, batch_size=4, lr=0.1, params=list(net.head.parameters()))
    for n, p in net.named_parameters():
        assert torch.equal(p.detach(), w0[n]) != n.startswith("head.")


def test_custom_loss_and_forward_are_the_ones_optimised_and_reported():
    x, y = data()
    net = model()
    w0 = params(net)
    out = train(net, x, y, epochs=1, batch_size=4, lr=0.5, loss_fn=lambda logits, t: (logits * 0.0).sum())
    assert out["train-loss"] == 0.0 and all(torch.equal(p.detach(), w0[n]) for n, p in net.named_parameters())
    c = 3
    out = train(
        net, x, y, epochs=1, batch_size=4, lr=0.5, forward=lambda xb: torch.zeros(len(xb), c, requires_grad=True)
    )
    assert out["train-loss"] == pytest.approx(math.log(c), rel=1e-6)  # uniform logits
    assert all(torch.equal(p.detach(), w0[n]) for n, p in net.named_parameters())


def test_reported_loss_and_accuracy_are_per_sample_means_over_uneven_batches():
    x, y = data(n=10)
    net = model()
    with torch.no_grad():
        logits = net(x)
    expected_loss = float(nn.functional.cross_entropy(logits, y))
    expected_acc = float((logits.argmax(1) == y).float().mean())
    out = train(net, x, y, epochs=2, batch_size=4, lr=0.0, momentum=0.0)  # lr 0: the model stays put
    assert out["train-loss"] == pytest.approx(expected_loss, rel=1e-5)
    assert out["train-acc"] == pytest.approx(expected_acc)
    assert out["steps"] == 6  # ceil(10 / 4) batches x 2 epochs


def test_batchnorm_models_skip_a_last_batch_of_one():
    x, y = data(n=9)
    assert train(model(bn=True), x, y, epochs=1, batch_size=4, lr=0.01)["steps"] == 2
    assert train(model(), x, y, epochs=1, batch_size=4, lr=0.01)["steps"] == 3


def test_batchnorm_models_train_on_a_last_batch_of_two_and_other_models_on_batches_of_one():
    """Only a batch of one is what BatchNorm cannot train on; batch-size 1 is an allowed setting."""
    x, y = data(n=10)
    assert train(model(bn=True), x, y, epochs=1, batch_size=4, lr=0.01)["steps"] == 3  # 4 + 4 + 2
    out = train(model(), x, y, epochs=1, batch_size=1, lr=0.0, momentum=0.0)
    assert out["steps"] == 10
    one = model()  # a client holding a single training sample still trains on it
    w0 = params(one)
    assert train(one, x[:1], y[:1], epochs=2, batch_size=4, lr=0.1)["steps"] == 2
    assert not all(torch.equal(p.detach(), w0[n]) for n, p in one.named_parameters())
    still = model()  # and reports that sample's loss and accuracy (per-sample means over one sample)
    with torch.no_grad():
        right = int(torch.nonzero(still(x).argmax(1) == y)[0, 0])  # a sample the model already predicts
        logits = still(x[right : right + 1])
    out = train(still, x[right : right + 1], y[right : right + 1], epochs=1, batch_size=4, lr=0.0, momentum=0.0)
    assert out["train-loss"] == pytest.approx(
        float(nn.functional.cross_entropy(logits, y[right : right + 1])), rel=1e-5
    )
    assert out["train-acc"] == 1.0


def test_nothing_to_train_returns_zeros_and_bad_settings_are_refused():
    x, y = data()
    zero = {"train-loss": 0.0, "train-acc": 0.0, "steps": 0}
    net = model()
    assert train(net, x, y, epochs=0) == zero
    assert train(net, x[:0], y[:0]) == zero
    frozen = model()
    for p in frozen.parameters():
        p.requires_grad_(False)
    assert train(frozen, x, y) == zero
    assert train(net, x, y, params=[]) == zero
    with pytest.raises(ValueError, match="local-epochs"):
        train(net, x, y, epochs=-1)
    with pytest.raises(ValueError, match="local-epochs"):
        train(net, x, y, batch_size=0)


def test_max_steps_stops_an_epoch_early():
    x, y = data(n=12)
    assert train(model(), x, y, epochs=1, batch_size=2, lr=0.01, max_steps=2)["steps"] == 2


@pytest.mark.parametrize("max_steps", [3, 5])  # at the end of an epoch of 3 batches, and inside the second one
def test_max_steps_caps_the_steps_of_the_whole_call_across_epochs(max_steps):
    x, y = data(n=12)
    capped, reference = model(), model()
    assert train(capped, x, y, epochs=3, batch_size=4, lr=0.1, max_steps=max_steps)["steps"] == max_steps
    # the same steps as a run that stops there by itself: the same seeded batches, nothing after the cap
    epochs, rest = divmod(max_steps, 3)
    train(reference, x, y, epochs=epochs + (rest > 0), batch_size=4, lr=0.1, max_steps=max_steps if rest else None)
    assert all(torch.equal(p, q) for p, q in zip(capped.parameters(), reference.parameters(), strict=True))


def test_training_is_seeded_by_its_seed():
    x, y = data(n=20)
    a, b, c = model(), model(), model()
    train(a, x, y, epochs=1, batch_size=5, lr=0.1, seed=3)
    train(b, x, y, epochs=1, batch_size=5, lr=0.1, seed=3)
    train(c, x, y, epochs=1, batch_size=5, lr=0.1, seed=4)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    assert not all(torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters(), strict=True))


def test_batches_cover_every_index_once_in_order_or_shuffled():
    assert [b.tolist() for b in batches(7, 3, None, shuffle=False)] == [[0, 1, 2], [3, 4, 5], [6]]
    shuffled = torch.cat(list(batches(7, 3, torch.Generator().manual_seed(0))))
    assert sorted(shuffled.tolist()) == list(range(7)) and shuffled.tolist() != list(range(7))


def test_evaluate_in_eval_mode_over_chunks_with_per_target_means():
    x, y = data(n=11)
    net = model(bn=True)
    train(net, x, y, epochs=1, batch_size=4, lr=0.1)  # BN statistics move away from their initial values
    net.train()
    ref = copy.deepcopy(net).eval()
    with torch.no_grad():
        logits = ref(x)
    loss, acc = evaluate(net, x, y, batch_size=3)
    assert loss == pytest.approx(float(nn.functional.cross_entropy(logits, y)), rel=1e-5)
    assert acc == pytest.approx(float((logits.argmax(1) == y).float().mean()))
    assert evaluate(net, x[:0], y[:0]) == (0.0, 0.0)


def test_sequence_targets_are_averaged_per_token():
    g = torch.Generator().manual_seed(2)
    logits = torch.randn(3, 5, 4, generator=g)  # (batch, classes, time)
    y = torch.randint(0, 5, (3, 4), generator=g)
    net = model()
    rows = torch.arange(3, dtype=torch.float32)[:, None]  # "inputs" that say which row of logits to return
    loss, acc = evaluate(net, rows, y, forward=lambda xb: logits[xb[:, 0].long()], batch_size=2)
    assert loss == pytest.approx(float(nn.functional.cross_entropy(logits, y)), rel=1e-5)
    assert acc == pytest.approx(float((logits.argmax(1) == y).float().mean()))


def test_proximal_term_is_half_mu_squared_distance_over_the_named_parameters():
    net = model()
    ref = {n: p.detach() + 0.5 for n, p in net.named_parameters() if n.startswith("head.")}
    term = proximal_term(ref, mu=0.4)
    n_head = sum(p.numel() for p in net.head.parameters())
    no_batch = torch.empty(0)  # the term reads no batch
    value = term(net, no_batch, no_batch, torch.zeros(1))
    assert float(value) == pytest.approx(0.5 * 0.4 * n_head * 0.25, rel=1e-5)
    value.backward()
    assert net.body.weight.grad is None
    torch.testing.assert_close(net.head.weight.grad, torch.full_like(net.head.weight, -0.4 * 0.5))


def test_device_names():
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto") == torch.device("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(ValueError, match="'device'"):
        resolve_device("gpu-zero")


# ------------------------------------------------------------------ defaults, devices and what a step may touch
def test_defaults_are_the_run_configs_declared_defaults():
    """A caller that leaves a setting out trains as a default run would: train()'s keyword defaults are the run
    config's declared defaults (task/config.py: local-epochs, batch-size, lr, momentum, weight-decay, seed).  45
    samples so that a batch size of 20 and one of 21 give different batches."""
    from task.config import Settings

    d = {k: o.default for k, o in Settings.declared().items()}
    x, y = data(n=45)
    implicit, explicit = model(), model()
    out_implicit = train(implicit, x, y)
    out_explicit = train(
        explicit,
        x,
        y,
        epochs=d["local-epochs"],
        batch_size=d["batch-size"],
        lr=d["lr"],
        momentum=d["momentum"],
        weight_decay=d["weight-decay"],
        seed=d["seed"],
        optimizer="sgd",
    )
    assert out_implicit == out_explicit
    assert all(torch.equal(p, q) for p, q in zip(implicit.parameters(), explicit.parameters(), strict=True))
    assert out_implicit["steps"] == d["local-epochs"] * math.ceil(45 / d["batch-size"])


@pytest.mark.parametrize("kw, n", [({"epochs": 0}, 12), ({}, 0)])
def test_nothing_to_train_leaves_the_model_exactly_as_it_was(kw, n):
    """No epochs or no data: no step, and the model is not even switched to training mode (its weights, buffers and
    mode are what the caller handed in)."""
    x, y = data(n=max(n, 1))
    net = model(bn=True).eval()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    assert train(net, x[:n], y[:n], lr=0.5, **kw)["steps"] == 0
    assert not net.training
    assert all(torch.equal(v, before[k]) for k, v in net.state_dict().items())


class _Held:
    """Data held apart from the model (as a CPU tensor is from a GPU model): records the device each batch the loop
    takes is moved to, then moves it there."""

    def __init__(self, t, moves):
        self.t, self.moves = t, moves

    def __len__(self):
        return len(self.t)

    def __getitem__(self, idx):
        return _Held(self.t[idx], self.moves)

    def to(self, device=None, **kw):
        self.moves.append(device)
        return self.t.to(device, **kw)


def _grad_of(p: torch.Tensor) -> torch.Tensor:
    assert p.grad is not None, "the backward pass left this parameter without a gradient"
    return p.grad.clone()


def test_every_batch_is_moved_to_the_models_device():
    """Module docstring of train(): tensors go to the model's device batch by batch, so the data can stay on the
    CPU (DESIGN: clients train on the local GPU).  No GPU here: the test checks the device each input and label
    batch is sent to, and that training on moved batches is training on the data."""
    x, y = data(n=10)
    moves: list[str | torch.device | None] = []
    net, ref = model(), model()
    # _Held is a stand-in for data kept on another device: it has the Tensor methods train() calls, not the type
    out = train(net, _Held(x, moves), _Held(y, moves), epochs=1, batch_size=4, lr=0.1)  # type: ignore[arg-type]
    device = next(net.parameters()).device
    assert len(moves) == 2 * 3  # inputs and labels of three batches
    assert all(m is not None and torch.device(m) == device for m in moves)
    assert out == train(ref, x, y, epochs=1, batch_size=4, lr=0.1)
    assert all(torch.equal(p, q) for p, q in zip(net.parameters(), ref.parameters(), strict=True))


class _TwoBranch(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = nn.Linear(4, 3), nn.Linear(4, 3)


def test_a_parameter_a_step_does_not_reach_is_not_moved_by_that_step():
    """A step only updates what its loss reaches: a parameter without a gradient in this step gets neither its
    momentum carried over nor weight decay (FedRep-style phases, or a forward that skips a branch).  The forward
    uses branch a on the first batch and branch b on the second; all rows are equal, so every batch is the same."""
    x = torch.randn(1, 4).repeat(8, 1)
    y = torch.tensor([1]).repeat(8)
    net, ref = _TwoBranch(), _TwoBranch()
    lr, wd = 0.1, 0.05
    w0 = params(ref)
    grad = {}
    for branch in ("a", "b"):
        ref.zero_grad()
        nn.functional.cross_entropy(getattr(ref, branch)(x[:4]), y[:4]).backward()
        grad.update({n: _grad_of(p) for n, p in ref.named_parameters() if n.startswith(branch)})
    calls: list[int] = []

    def forward(xb):
        calls.append(len(calls))
        return (net.a if len(calls) == 1 else net.b)(xb)

    train(net, x, y, epochs=1, batch_size=4, lr=lr, momentum=0.9, weight_decay=wd, forward=forward)
    assert len(calls) == 2
    for n, p in net.named_parameters():  # each branch: exactly one plain SGD step from w0, at the step that used it
        torch.testing.assert_close(p.detach(), w0[n] - lr * (grad[n] + wd * w0[n]))


def test_auto_picks_cuda_exactly_when_cuda_is_available(monkeypatch):
    """DESIGN: device ``auto`` is CUDA if available, else CPU.  No GPU here: torch.cuda.is_available is patched
    (a torch.device for CUDA can be named without one)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert resolve_device("auto") == torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == torch.device("cpu")
    assert resolve_device("cuda:0") == torch.device("cuda", 0)  # an explicit device is honoured as named
    with pytest.raises(ValueError, match=r"invalid device 'CUDA'.*'device'.*auto, cpu, cuda"):
        resolve_device("CUDA")


def test_proximal_term_is_made_on_the_models_device():
    """DESIGN: tensors are made on the model's device.  The term is on the device of the model's logits, also when
    it has nothing to sum ('meta' stands in for a GPU: no GPU here)."""
    net = model().to("meta")
    logits = torch.zeros(2, 3, device="meta")
    no_batch = torch.empty(0)  # the term reads no batch
    assert proximal_term({}, 0.3)(net, no_batch, no_batch, logits).device == torch.device("meta")
    ref = {n: p.detach() for n, p in net.named_parameters()}
    assert proximal_term(ref, 0.3)(net, no_batch, no_batch, logits).device == torch.device("meta")


def test_batched_losses_are_each_states_own_eval_mode_loss():
    """batched_losses: the mean cross-entropy on (x, y) of each of the M stacked states, in eval mode (BatchNorm uses
    each candidate's own running statistics, not the batch's), equal to evaluating every candidate on its own;
    the model handed in is left in eval mode and its own weights unused."""
    from task.train import batched_losses

    x, y = data(n=11)
    candidates = []
    for seed in range(3):
        net = model(seed=seed, bn=True)
        train(net, x, y, epochs=1, batch_size=4, lr=0.1, seed=seed)  # running statistics move, differently each
        candidates.append({k: v.detach().clone() for k, v in net.state_dict().items()})
    stacked = {k: torch.stack([c[k] for c in candidates]) for k in candidates[0]}
    host = model(seed=9, bn=True).train()
    got = batched_losses(host, stacked, x, y)
    assert got.shape == (3,) and not host.training
    for m, state in enumerate(candidates):
        ref = model(bn=True)
        ref.load_state_dict(state)
        assert float(got[m]) == pytest.approx(evaluate(ref, x, y)[0], rel=1e-5)

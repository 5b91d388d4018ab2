"""FedC2I invariants (fedc2i.md §7/§2.2) on small hand-made models, and the client/strategy round trip."""

import pytest
import torch
from flwr.app import ConfigRecord, Context, RecordDict
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
from server_app.app import build_strategy
from task.config import parse_settings
from task.methods import METHODS, load_object
from task.models import build_model, head_keys


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
        for p in bad.parameters():
            p.mul_(5.0)
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


# ---------------------------------------------------------------- strategy + client without Flower's runtime
def run(cfg, rounds=2, n=4):
    settings = parse_settings(cfg)
    strat = build_strategy(settings)
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
    cls = load_object(METHODS["fedc2i"].client)
    replies = {}
    for rnd in range(1, rounds + 1):
        ups = []
        for i, ctx in enumerate(ctxs):
            payload = strat.payload(10 + i, rnd, "train")
            payload["config"] = ConfigRecord({"server-round": rnd})
            replies[(rnd, i)] = payload
            u = strat.gate.check(rnd, 10 + i, cls(ctx, settings).train(payload), "train", set())
            assert u is not None, strat.failures
            ups.append(u)
        strat.aggregate(rnd, ups)
    return strat, replies


def test_round_one_starts_from_the_common_model_then_everyone_receives_everyone():
    strat, payloads = run({"method": "fedc2i", "partition": "iid", "feature-shift": 4})
    assert payloads[(1, 0)]["peers"]["head.bias"].shape[0] == 1
    assert payloads[(2, 0)]["peers"]["head.bias"].shape[0] == 4
    assert list(payloads[(2, 2)]["peer-clients"]["client-ids"]) == [0, 1, 3]  # the others, by client id
    assert list(payloads[(2, 2)]["peer-clients"]["num-examples"]) == [strat.sizes[c] for c in (0, 1, 3)]
    row = strat.influence[2]
    assert len(row) == 4 and all(abs(sum(r.values()) - 1) < 1e-5 for r in row.values())


def test_peer_sampling_bounds_the_download():
    _strat, payloads = run({"method": "fedc2i", "partition": "iid", "c2i-peers": 2}, rounds=2, n=5)
    assert payloads[(2, 0)]["peers"]["head.bias"].shape[0] == 2
    full, _ = run({"method": "fedc2i", "partition": "iid"}, rounds=2, n=5)
    assert payloads[(2, 0)]["peers"].count_bytes() < 0.5 * full.payload(10, 3, "train")["peers"].count_bytes()


def test_bad_fedc2i_config():
    with pytest.raises(ValueError, match="c2i-peers"):
        build_strategy(parse_settings({"method": "fedc2i", "c2i-peers": 1}))
    with pytest.raises(ValueError, match="c2i-variant"):
        build_strategy(parse_settings({"method": "fedc2i", "c2i-variant": "both"}))
    with pytest.raises(ValueError, match="gamma"):
        build_strategy(parse_settings({"method": "fedc2i", "gamma": -2.0}))


@pytest.mark.parametrize(
    "old,new",
    [
        ("lambda-only", "client-level"),
        ("Lambda-only", "class-level-averaged-extractor"),
        ("Lambda-local", "class-level-own-extractor"),
    ],
)
def test_the_variants_old_spellings_still_run_with_a_deprecation_warning(old, new):
    with pytest.warns(FutureWarning, match=f"'c2i-variant': '{old}' is deprecated, use '{new}'"):
        assert parse_settings({"method": "fedc2i", "c2i-variant": old}).options.variant == new
    with pytest.raises(ValueError, match="c2i-variant"):  # only the exact old spelling is an alias
        parse_settings({"method": "fedc2i", "c2i-variant": old.swapcase()})


@pytest.mark.parametrize("variant,own_extractor_matters", [("class-level-averaged-extractor", False), ("full", True)])
def test_the_lambda_g_ablation_scores_classes_with_the_global_extractor(variant, own_extractor_matters):
    # fedc2i.md §6.7: for the Lambda/g ablation the class-level influence uses the current global theta (the average
    # extractor), not the client's own.  Two sets of peers with the same average extractor but a different own
    # extractor must then give the same personalized model; in the full method (own theta*) they must not.
    cfg = {"method": "fedc2i", "model": "mlp", "partition": "iid", "c2i-variant": variant}
    settings = parse_settings(cfg)
    ctx = Context(
        run_id=1, node_id=5, node_config={"partition-id": 0, "num-partitions": 3}, state=RecordDict(), run_config=cfg
    )
    client = load_object(METHODS["fedc2i"].client)(ctx, settings)
    torch.manual_seed(0)
    models = [build_model("mlp", 1, 8, 10, seed=s) for s in range(3)]
    base = stacked_models(models)
    shifted = {k: v.clone() for k, v in base.items()}
    for k, stack in shifted.items():
        if not k.startswith("head."):  # move extractor mass from peer 1 to the client itself: same average
            d = 0.5 * torch.randn_like(stack[0])
            stack[0] += d
            stack[1] -= d
    sizes = [client.data.num_train] * 3
    out = []
    for stacked in (base, shifted):
        model = client.reset_model()
        client._personalized(model, stacked, sizes)
        out.append({k: v.clone() for k, v in model.state_dict().items()})
    same_head = torch.allclose(out[0]["head.weight"], out[1]["head.weight"], atol=1e-6)
    assert same_head != own_extractor_matters
    if not own_extractor_matters:
        for k in out[0]:
            torch.testing.assert_close(out[0][k], out[1][k], atol=1e-6, rtol=1e-5)

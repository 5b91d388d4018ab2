"""DSA-IGN and the Client2Vec options (client2vec.md §2.2-§2.5, §3), against the definitions there.

The options are checked against pyproject.toml's declared defaults (the run config Flower sends) and key by
key, so a misspelt key, a wrong default or an off-by-one range shows up.
"""

import tomllib
from pathlib import Path

import numpy as np
import pytest
import torch

from task.dsa_ign import (
    DSAIGN,
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
from task.methods.client2vec import Client2VecOptions

ROOT = Path(__file__).resolve().parents[2]
SMALL = IGNConfig(dim=16, token=8, layers=1, heads=2, ff=16, dropout=0.0)


def declared_defaults():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"]
    return {k: v for k, v in cfg.items() if k.startswith("c2v-")}


def test_code_defaults_equal_the_declared_run_config_defaults():
    assert Client2VecOptions.parse({}) == Client2VecOptions.parse(declared_defaults())


# key -> (a value other than the default, the option field it sets, the value that field then holds)
CHANGES = {
    "c2v-base": ("moon", "base", "moon"),
    "c2v-sampling": (False, "sampling", False),
    "c2v-aggregation": (False, "aggregation", False),
    "c2v-local": (False, "local", False),
    "c2v-encoder": ("synthetic", "encoder", "synthetic"),
    "c2v-clip-model": ("ViT-B-32", "clip_model", "ViT-B-32"),
    "c2v-clip-weights": ("/w.pt", "clip_weights", "/w.pt"),
    "c2v-normalize": (False, "normalize", False),
    "c2v-cache-dir": ("/c", "cache_dir", "/c"),
    "c2v-ign-mode": ("federated", "ign_mode", "federated"),
    "c2v-ign-epochs": (3, "ign_epochs", 3),
    "c2v-ign-local-epochs": (4, "ign_local_epochs", 4),
    "c2v-ign-fraction": (0.5, "ign_fraction", 0.5),
    "c2v-ign-upload": (64, "ign_upload", 64),
    "c2v-ign-batch": (32, "ign_batch", 32),
    "c2v-ign-lr": (0.01, "ign_lr", 0.01),
    "c2v-orth-mode": ("diag", "orth_mode", "diag"),
    "c2v-tau": (2.0, "tau", 2.0),
    "c2v-gamma": (0.9, "gamma", 0.9),
    "c2v-lambda1": (3.0, "lambda1", 3.0),
    "c2v-local-weight": (5.0, "local_weight", 5.0),
    "c2v-orth-normalize": (False, "orth_normalize", False),
    "c2v-orth-mean-over-clients": (False, "orth_mean_over_clients", False),
    "c2v-dist-detach": (False, "dist_detach", False),
    "c2v-ign-threads": (2, "ign_threads", 2),
}


@pytest.mark.parametrize("key", sorted(CHANGES))
def test_each_key_sets_its_own_option(key):
    value, field, expected = CHANGES[key]
    base, changed = Client2VecOptions.parse({}), Client2VecOptions.parse({key: value})
    assert getattr(changed, field) == expected != getattr(base, field)
    assert {f: v for f, v in vars(changed).items() if f != field} == {f: v for f, v in vars(base).items() if f != field}


@pytest.mark.parametrize(
    "key, value, field",
    [("c2v-ign-ff", 64, "ff"), ("c2v-ign-dropout", 0.3, "dropout"), ("c2v-pos-emb", False, "pos_emb")],
)
def test_network_keys_set_the_dsa_ign_shape(key, value, field):
    assert (
        getattr(Client2VecOptions.parse({key: value}).ign, field)
        == value
        != getattr(Client2VecOptions.parse({}).ign, field)
    )


@pytest.mark.parametrize(
    "key, ok, bad",
    [
        ("c2v-ign-epochs", [0], [-1]),
        ("c2v-ign-local-epochs", [1], [0]),
        ("c2v-ign-fraction", [0.0, 1.0], [-0.01, 1.01]),
        ("c2v-ign-upload", [2], [1]),
        ("c2v-ign-batch", [2], [1]),
        ("c2v-ign-lr", [0.0], [-1e-6]),
        ("c2v-ign-ff", [1], [0]),
        ("c2v-ign-dropout", [0.0, 1.0], [-0.1, 1.1]),
        ("c2v-tau", [1e-9], [0.0]),
        ("c2v-gamma", [0.0, 1.0], [-0.1, 1.1]),
        ("c2v-lambda1", [1e-9], [0.0]),
        ("c2v-local-weight", [0.0], [-0.5]),
    ],
)
def test_ranges_accept_their_bounds_and_refuse_beyond_naming_the_key(key, ok, bad):
    for v in ok:
        Client2VecOptions.parse({key: v})
    for v in bad:
        with pytest.raises(ValueError, match=key):
            Client2VecOptions.parse({key: v})


def test_flags_accept_true_or_false_strings_and_nonsense_is_refused():
    assert Client2VecOptions.parse({"c2v-sampling": "TRUE"}).sampling is True
    assert Client2VecOptions.parse({"c2v-sampling": "False"}).sampling is False
    assert Client2VecOptions.parse({"c2v-local": "false"}).local is False
    with pytest.raises(ValueError, match=r"c2v-local.*true or false"):
        Client2VecOptions.parse({"c2v-local": "perhaps"})
    with pytest.raises(ValueError, match=r"c2v-ign-epochs.*int"):
        Client2VecOptions.parse({"c2v-ign-epochs": "many"})
    with pytest.raises(ValueError, match=r"c2v-orth-mode.*one of"):
        Client2VecOptions.parse({"c2v-orth-mode": "l2"})


def test_network_shape_must_split_into_tokens_and_heads():
    with pytest.raises(ValueError, match="divisible"):
        IGNConfig(dim=10, token=8, heads=2)
    with pytest.raises(ValueError, match="divisible"):
        IGNConfig(dim=16, token=8, heads=3)
    IGNConfig(dim=16, token=8, heads=2)


def test_forward_is_the_spec_architecture_z_first_half_u_second_half_d_tilde_projected():
    net = build_ign(SMALL, 0).eval()
    assert net.n_tokens == 4  # 2 * 16 / 8
    d = torch.randn(3, 16)
    z, u, d_hat = net(d)
    assert net.pos is not None  # SMALL keeps the positional embedding
    tokens = torch.cat([d, d], 1).reshape(3, 4, 8) + net.pos
    out = net.encoder(tokens).reshape(3, 32)
    torch.testing.assert_close(z, out[:, :16])
    torch.testing.assert_close(u, out[:, 16:])
    torch.testing.assert_close(d_hat, out @ net.proj.weight.T + net.proj.bias)
    assert net.proj.in_features == 32 and net.proj.out_features == 16
    assert net.pos.shape == (1, 4, 8) and float(net.pos.detach().std()) < 0.1  # small N(0, 0.02) start
    assert build_ign(IGNConfig(dim=16, token=8, layers=1, heads=2, ff=16, pos_emb=False), 0).pos is None


def test_small_losses_match_their_definitions():
    u = torch.tensor([[1.0, 0.0], [0.6, 0.8], [0.0, 2.0]])
    cosm = torch.nn.functional.normalize(u, dim=1) @ torch.nn.functional.normalize(u, dim=1).T
    expected = np.mean([np.log(sum(np.exp(float(cosm[j, k])) for k in range(3) if k != j)) for j in range(3)])
    assert loss_div(u).item() == pytest.approx(expected, rel=1e-6)
    one = torch.ones(1, 2, requires_grad=True)
    assert loss_div(one).item() == 0.0 and loss_div(one).requires_grad
    z = torch.tensor([[1.0, 0.0], [1.0, 1.0]])
    v = torch.tensor([[0.0, 3.0], [2.0, 0.0]])
    c = np.array([[0.0, 1.0], [np.sqrt(0.5), np.sqrt(0.5)]])  # |cos(z_j, v_k)|
    assert loss_orth(z, v, "cos").item() == pytest.approx(c.mean(), rel=1e-6)
    assert loss_orth(z, v, "diag").item() == pytest.approx(np.mean([c[0, 0], c[1, 1]]), rel=1e-6)
    assert loss_orth(z, v, "literal").item() == pytest.approx(0 + 2 + 3 + 2, rel=1e-6)
    assert loss_recon(z, v).item() == pytest.approx(((z - v) ** 2).mean().item())
    assert loss_sim(z, v).item() == pytest.approx(np.mean([1.0, 1 - np.sqrt(0.5)]), rel=1e-6)


def test_total_loss_is_the_sum_of_the_four_parts_it_reports():
    net = build_ign(SMALL, 1)
    d, lab = torch.randn(6, 16), torch.randn(6, 16)
    for mode in ("cos", "literal"):
        total, parts = total_loss(net.eval(), d, lab, mode)
        z, u, d_hat = net(d)
        assert parts["div"] == pytest.approx(loss_div(u).item(), rel=1e-5)
        assert parts["sim"] == pytest.approx(loss_sim(z, lab).item(), rel=1e-5)
        assert parts["orth"] == pytest.approx(loss_orth(z, u, mode).item(), rel=1e-5)
        assert parts["recon"] == pytest.approx(loss_recon(d_hat, d).item(), rel=1e-5)
        assert total.item() == pytest.approx(sum(parts.values()), rel=1e-5)


def test_training_history_progress_and_mode():
    rng = np.random.default_rng(0)
    D, L = rng.normal(size=(5, 16)).astype(np.float32), rng.normal(size=(5, 16)).astype(np.float32)
    net = build_ign(SMALL, 2)
    seen = []
    hist = train_dsa_ign(net, D, L, epochs=3, batch_size=2, lr=0.01, progress=lambda e, h: seen.append((e, h)))
    assert len(hist) == 3 and [e for e, _ in seen] == [1, 2, 3] and seen[-1][1] == hist[-1]
    assert set(hist[0]) == {"div", "sim", "orth", "recon", "total"}
    assert hist[0]["total"] == pytest.approx(
        hist[0]["div"] + hist[0]["sim"] + hist[0]["orth"] + hist[0]["recon"], rel=1e-5
    )
    assert not net.training  # ready for the index
    frozen = build_ign(SMALL, 2)
    before = {k: v.clone() for k, v in frozen.state_dict().items()}
    train_dsa_ign(frozen, D, L, epochs=2, batch_size=2, lr=0.0)
    assert all(torch.equal(before[k], v) for k, v in frozen.state_dict().items())  # lr is the step size
    with pytest.raises(ValueError, match="as many label embeddings"):
        train_dsa_ign(net, D, L[:4], epochs=1)
    with pytest.raises(ValueError, match="as many label embeddings"):
        train_dsa_ign(net, D[:0], L[:0], epochs=1)


def test_training_lowers_the_loss_and_is_seeded():
    rng = np.random.default_rng(1)
    D, L = rng.normal(size=(16, 16)).astype(np.float32), rng.normal(size=(16, 16)).astype(np.float32)
    a, b = build_ign(SMALL, 3), build_ign(SMALL, 3)
    ha = train_dsa_ign(a, D, L, epochs=8, batch_size=8, lr=0.01, seed=5)
    hb = train_dsa_ign(b, D, L, epochs=8, batch_size=8, lr=0.01, seed=5)
    assert ha == hb and ha[-1]["total"] < ha[0]["total"]


def test_client_index_averages_u_over_all_samples_in_eval_mode():
    rng = np.random.default_rng(2)
    cfg = IGNConfig(dim=16, token=8, layers=1, heads=2, ff=16, dropout=0.5)  # dropout: train mode would be noisy
    net = build_ign(cfg, 4).train()
    D, L = rng.normal(size=(7, 16)).astype(np.float32), rng.normal(size=(7, 16)).astype(np.float32)
    bf, bl = client_index(net, D, L, batch_size=3)
    with torch.no_grad():
        _, u, _ = net.eval()(torch.from_numpy(D))
    np.testing.assert_allclose(bf, u.numpy().mean(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(bl, L.mean(0), rtol=1e-6)
    assert bf.dtype == np.float32 and bl.dtype == np.float32 and bf.shape == (16,)
    with pytest.raises(ValueError, match="at least one"):
        client_index(net, D[:0], L[:0])


def test_dsaign_default_config_is_the_papers():
    cfg = IGNConfig()
    assert (cfg.dim, cfg.token, cfg.layers, cfg.heads, cfg.ff, cfg.dropout, cfg.pos_emb) == (
        512,
        32,
        3,
        8,
        2048,
        0.1,
        True,
    )
    assert isinstance(build_ign(SMALL, 0), DSAIGN)


def test_training_defaults_are_the_specs_learning_rate_and_batch_size():
    """client2vec.md §2.5 / A6 [ours]: DSA-IGN trains with Adam at lr 1e-3 in batches of 128 unless told otherwise.  130
    pairs: batches of 128 and 2 (a batch of 129 would leave a single pair, which is skipped)."""
    rng = np.random.default_rng(3)
    D, L = rng.normal(size=(130, 16)).astype(np.float32), rng.normal(size=(130, 16)).astype(np.float32)
    a, b = build_ign(SMALL, 5), build_ign(SMALL, 5)
    ha = train_dsa_ign(a, D, L, epochs=2, seed=7)
    hb = train_dsa_ign(b, D, L, epochs=2, batch_size=128, lr=1e-3, seed=7)
    assert ha == hb
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())


def test_an_epochs_reported_losses_are_the_mean_over_its_batches():
    """train_dsa_ign reports each epoch's mean DSA-IGN losses (client2vec.md §2.4-§2.5; they go to client2vec.json and
    to the federated ign-loss).  With lr 0 the network never moves, so with the whole set as one batch every epoch
    reports the losses of that batch, whatever order the rows were drawn in (all four terms are means)."""
    rng = np.random.default_rng(4)
    D, L = rng.normal(size=(6, 16)).astype(np.float32), rng.normal(size=(6, 16)).astype(np.float32)
    net = build_ign(SMALL, 6)
    total, parts = total_loss(net.train(), torch.from_numpy(D), torch.from_numpy(L))
    hist = train_dsa_ign(net, D, L, epochs=2, batch_size=6, lr=0.0)
    for epoch in hist:
        assert epoch["total"] == pytest.approx(total.item(), rel=1e-5)
        for k, v in parts.items():
            assert epoch[k] == pytest.approx(v, rel=1e-5, abs=1e-7)


@pytest.mark.parametrize("mode", ["cos", "literal"])
def test_an_epochs_losses_average_its_batches_in_the_chosen_orthogonality_mode(mode):
    """As above over several batches: seven copies of one pair, batches of 3 (3 + 3, and a single leftover pair,
    which is skipped), lr 0, so every batch has the same losses and their mean is those losses.  The orthogonality
    term is the one ``orth_mode`` names (client2vec.md A5: ``literal`` is the raw sum, not the cosine mean)."""
    rng = np.random.default_rng(5)
    D = np.repeat(rng.normal(size=(1, 16)).astype(np.float32), 7, axis=0)
    L = np.repeat(rng.normal(size=(1, 16)).astype(np.float32), 7, axis=0)
    net = build_ign(SMALL, 7)
    total, parts = total_loss(net.train(), torch.from_numpy(D[:3]), torch.from_numpy(L[:3]), mode)
    for epoch in train_dsa_ign(net, D, L, epochs=2, batch_size=3, lr=0.0, orth_mode=mode):
        assert epoch["total"] == pytest.approx(total.item(), rel=1e-5)
        for k, v in parts.items():
            assert epoch[k] == pytest.approx(v, rel=1e-5, abs=1e-7)


def test_diversity_of_a_two_sample_batch_is_their_cosine_and_cos_is_the_default_orthogonality():
    """client2vec.md §2.4: L_div = (1/B) sum_j log sum_{k != j} exp(cos(u_j, u_k)); with B = 2 each log-sum has one
    term, so L_div = cos(u_1, u_2).  A5: the default L_orth is the mean |cos| over all pairs."""
    u = torch.tensor([[1.0, 0.0], [0.6, 0.8]])
    assert loss_div(u).item() == pytest.approx(0.6, rel=1e-6)
    z, v = torch.randn(4, 6), torch.randn(4, 6)
    assert loss_orth(z, v).item() == pytest.approx(loss_orth(z, v, "cos").item())


# ------------------------------------------------------------------ shapes, encoding, devices and seeds, in detail
@pytest.mark.parametrize(
    "dim, token, heads",
    [(4, 8, 2), (16, 8, 2), (12, 8, 4), (512, 32, 8), (10, 8, 2), (12, 9, 3), (16, 8, 3), (18, 12, 8)],
)
def test_a_shape_is_accepted_exactly_when_its_tokens_and_heads_split_evenly(dim, token, heads):
    """client2vec.md §2.3: I = [D, D] is cut into 2*dim/token tokens of width token, and each token's width is split
    over the heads; a shape is valid exactly when both divisions are exact (the rule is evaluated here in integers)."""
    valid = (2 * dim) % token == 0 and token % heads == 0
    if valid:
        net = build_ign(IGNConfig(dim=dim, token=token, layers=1, heads=heads, ff=8, dropout=0.0), 0).eval()
        assert net.n_tokens == 2 * dim // token
        z, u, d_hat = net(torch.randn(2, dim))
        assert z.shape == u.shape == d_hat.shape == (2, dim)
    else:
        with pytest.raises(ValueError, match="divisible"):
            IGNConfig(dim=dim, token=token, layers=1, heads=heads, ff=8)


def test_each_sample_is_encoded_on_its_own_tokens():
    """client2vec.md §2.3: the transformer attends over the tokens of ONE embedding (batch-first: (N, tokens, width));
    in eval mode a sample's Z, U and D~ do not depend on the other samples of the batch."""
    net = build_ign(SMALL, 3).eval()
    d = torch.randn(5, 16)
    with torch.no_grad():
        batch = net(d)
        for i in range(5):
            alone = net(d[i : i + 1])
            for got, ref in zip(batch, alone, strict=True):
                torch.testing.assert_close(got[i : i + 1], ref, rtol=1e-5, atol=1e-6)


def test_losses_are_made_on_the_inputs_device():
    """DESIGN: device-agnostic code, tensors made on the inputs' device ('meta' stands in for a GPU: no GPU here)."""
    u, z = torch.randn(4, 6, device="meta"), torch.randn(4, 6, device="meta")
    assert loss_div(u).device.type == "meta"
    assert loss_sim(z, u).device.type == "meta"
    for mode in ("cos", "literal", "diag"):
        assert loss_orth(z, u, mode).device.type == "meta"


def test_training_default_seed_is_the_run_configs_and_the_seed_matters():
    """The default seed of train_dsa_ign is the run config's default seed (0), and the seed decides the batches:
    130 pairs in batches of 128 and 2, so another seed puts other pairs in the small batch."""
    from task.config import Settings

    seed0 = Settings.declared()["seed"].default
    rng = np.random.default_rng(8)
    D, L = rng.normal(size=(130, 16)).astype(np.float32), rng.normal(size=(130, 16)).astype(np.float32)
    a, b, c = build_ign(SMALL, 5), build_ign(SMALL, 5), build_ign(SMALL, 5)
    ha = train_dsa_ign(a, D, L, epochs=1, lr=0.01)
    hb = train_dsa_ign(b, D, L, epochs=1, lr=0.01, seed=seed0, orth_mode="cos")
    hc = train_dsa_ign(c, D, L, epochs=1, lr=0.01, seed=seed0 + 1)
    assert ha == hb and ha != hc
    assert all(torch.equal(v, b.state_dict()[k]) for k, v in a.state_dict().items())


def test_embeddings_of_any_float_precision_train_the_float32_network():
    """Embeddings arrive as numpy arrays (a client's cache, the server's pooled uploads) in float32 or float64; the
    network is float32 and trains on them as on float32 copies (client2vec.md §2.5)."""
    rng = np.random.default_rng(9)
    D, L = rng.normal(size=(6, 16)).astype(np.float32), rng.normal(size=(6, 16)).astype(np.float32)
    ref = build_ign(SMALL, 6)
    href = train_dsa_ign(ref, D, L, epochs=2, batch_size=3, lr=0.01, seed=1)
    for D_, L_ in ((D.astype(np.float64), L), (D, L.astype(np.float64))):
        net = build_ign(SMALL, 6)
        assert train_dsa_ign(net, D_, L_, epochs=2, batch_size=3, lr=0.01, seed=1) == href
        assert all(torch.equal(v, ref.state_dict()[k]) for k, v in net.state_dict().items())


@pytest.mark.parametrize("n", [1, 3])
def test_torch_threads_sets_the_count_inside_and_restores_it_after(n):
    from task.dsa_ign import torch_threads

    before = torch.get_num_threads()
    with torch_threads(n):
        assert torch.get_num_threads() == n
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), torch_threads(n):
        raise RuntimeError("restored on errors too")
    assert torch.get_num_threads() == before
    with torch_threads(0):  # 0: torch's own setting is left alone
        assert torch.get_num_threads() == before


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
    labels = torch.nn.functional.normalize(torch.randn(32, 512), dim=1)
    loss, parts = total_loss(net, d, labels)
    loss.backward()
    assert np.isfinite(loss.item()) and all(np.isfinite(v) for v in parts.values())
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())
    hist = train_dsa_ign(net, d.numpy(), labels.numpy(), epochs=15, batch_size=16)
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


def test_options_reject_bad_values_naming_the_key():
    from task.config import parse_settings

    base = {"method": "client2vec"}
    options = parse_settings(base).options
    assert isinstance(options, Client2VecOptions) and options.base == "fedavg"
    for key, value in (("c2v-base", "feddyn"), ("c2v-tau", -1.0), ("c2v-sampling", "maybe"), ("c2v-encoder", "vit")):
        with pytest.raises(ValueError, match=key):
            parse_settings({**base, key: value})

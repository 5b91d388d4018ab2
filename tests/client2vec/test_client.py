"""What the Client2Vec client must do (client2vec.md §2.1, §2.2, §2.5, §2.8, §2.9), with the synthetic
encoder so every embedding can be recomputed here independently."""

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, RecordDict

from task.clip import SyntheticEncoder, class_names, label_prompt
from task.dsa_ign import IGNConfig, build_ign
from task.methods.client2vec import build_aux
from task.params import record_to_numpy, to_record
from tests.client_kit import client, client_data, context, numpy_state

LOW, HIGH = [0, 1, 2, 3, 4], [5, 6, 7, 8, 9]


@pytest.fixture
def cfg(tmp_path):
    return {
        "c2v-encoder": "synthetic",
        "c2v-cache-dir": str(tmp_path),
        "c2v-ign-ff": 16,
        "c2v-ign-upload": 12,
        "c2v-ign-batch": 32,
        "seed": 3,
    }


def reference_embeddings(data, seed=3):
    enc = SyntheticEncoder(512, seed)
    texts = enc.encode_texts([label_prompt(n) for n in class_names("digits", 10)])
    return enc.encode_images(data.x_train), texts[data.y_train.numpy()]


def ign_record(seed=3):
    net = build_ign(IGNConfig(ff=16, dropout=0.0), seed)
    return net, RecordDict({"ign": to_record(net.state_dict())})


def as_torch(rec):
    return {k: torch.from_numpy(v) for k, v in record_to_numpy(rec).items()}


def dist(a, b, keys):
    return float(sum(((a[k].double() - b[k].double()) ** 2).sum() for k in keys)) ** 0.5


# ------------------------------------------------------------------------------------------ index phase
def test_embedding_upload_is_a_sample_of_the_clients_own_image_and_label_embeddings(cfg):
    data = client_data(HIGH, n=4)
    c = client("client2vec", data, **cfg)
    rec = record_to_numpy(c.query("c2v_embed", RecordDict())["arrays"])
    D_full, L_full = reference_embeddings(data)
    assert rec["D"].shape == (12, 512) and rec["L"].shape == (12, 512)
    rows = [int(np.argmin(np.abs(D_full - d).sum(1))) for d in rec["D"]]
    assert len(set(rows)) == 12  # distinct samples
    np.testing.assert_allclose(rec["D"], D_full[rows], atol=1e-6)
    np.testing.assert_allclose(rec["L"], L_full[rows], atol=1e-6)  # each image with its own label prompt
    everything = client("client2vec", data, **{**cfg, "c2v-ign-upload": 1000}).query("c2v_embed", RecordDict())
    assert record_to_numpy(everything["arrays"])["D"].shape == (len(data.y_train), 512)


def test_embedding_cache_is_keyed_by_partition_and_by_a_nodes_own_file(cfg, tmp_path):
    a, b = client_data(LOW, n=4), client_data(HIGH, n=4)
    first = client("client2vec", a, context("client2vec", pid=0, **cfg)).embeddings()[0]
    other_partition = client("client2vec", b, context("client2vec", pid=1, **cfg)).embeddings()[0]
    np.testing.assert_allclose(other_partition, reference_embeddings(b)[0], atol=1e-6)
    np.testing.assert_allclose(first, reference_embeddings(a)[0], atol=1e-6)
    for name, data in (("a.npz", a), ("b.npz", b)):  # same partition id, each node its own file
        path = tmp_path / name
        np.savez(path, x=data.x_train.numpy(), y=data.y_train.numpy())
        data.meta["data-path"] = str(path)
    got_a = client("client2vec", a, context("client2vec", pid=2, **cfg)).embeddings()[0]
    got_b = client("client2vec", b, context("client2vec", pid=2, **cfg)).embeddings()[0]
    np.testing.assert_allclose(got_a, reference_embeddings(a)[0], atol=1e-6)
    np.testing.assert_allclose(got_b, reference_embeddings(b)[0], atol=1e-6)


def test_federated_dsa_ign_round_trains_the_sent_network_with_the_ign_options(cfg):
    data = client_data(HIGH, n=4)
    net, content = ign_record()
    sent = {k: v.clone() for k, v in net.state_dict().items()}
    still = as_torch(
        client("client2vec", data, **{**cfg, "c2v-ign-lr": 0.0, "c2v-ign-local-epochs": 1}).query("c2v_ign", content)[
            "arrays"
        ]
    )
    assert all(torch.equal(still[k], sent[k]) for k in sent)  # lr 0: the sent weights come back
    reply = client("client2vec", data, **{**cfg, "c2v-ign-local-epochs": 2}).query("c2v_ign", content)
    moved = as_torch(reply["arrays"])
    assert sorted(moved) == sorted(sent) and dist(moved, sent, [k for k in sent if sent[k].is_floating_point()]) > 0
    assert np.isfinite(reply["metrics"]["ign-loss"]) and reply["metrics"]["ign-loss"] > 0
    one = as_torch(client("client2vec", data, **{**cfg, "c2v-ign-local-epochs": 1}).query("c2v_ign", content)["arrays"])
    assert dist(one, moved, [k for k in sent if sent[k].is_floating_point()]) > 0
    with pytest.raises(ValueError, match=r"^the message carries no DSA-IGN weights \('ign' ArrayRecord\)$"):
        client("client2vec", data, **cfg).query("c2v_ign", RecordDict())
    partial = {k: v for k, v in numpy_state(sent).items() if k != "proj.bias"}
    with pytest.raises(ValueError, match="lacks"):
        client("client2vec", data, **cfg).query("c2v_ign", RecordDict({"ign": to_record(partial)}))


def test_client_index_is_mean_u_over_all_training_samples_and_the_mean_label_embedding(cfg):
    data = client_data(LOW, n=4)
    net, content = ign_record()
    rec = record_to_numpy(client("client2vec", data, **cfg).query("c2v_index", content)["arrays"])
    D_full, L_full = reference_embeddings(data)
    with torch.no_grad():
        _, u, _ = net.eval()(torch.from_numpy(D_full))
    np.testing.assert_allclose(rec["beta_f"], u.numpy().mean(0), atol=1e-5)
    np.testing.assert_allclose(rec["beta_l"], L_full.mean(0), atol=1e-6)
    with pytest.raises(ValueError, match="'client2vec' does not answer query 'no-such-query'"):
        client("client2vec", data, **cfg).query("no-such-query", RecordDict())


# ------------------------------------------------------------------------------------------ local training
@pytest.fixture(scope="module")
def start():
    """The global model a client receives: NOT the model it would build itself (training must start from it)."""
    c = client("client2vec", client_data(HIGH))
    g = torch.Generator().manual_seed(11)
    return {
        k: (v.detach() + 0.1 * torch.randn(v.shape, generator=g)) if v.is_floating_point() else v.detach().clone()
        for k, v in c.reset_model().state_dict().items()
    }


def train_content(state, beta=None, aux=None):
    arrays = numpy_state(state)
    if aux is not None:
        arrays.update({"c2v." + k: v for k, v in numpy_state(aux).items()})
    content = RecordDict({"arrays": to_record(arrays)})
    if beta is not None:
        content["c2v"] = to_record({"B_f": beta})
    return content


BETA = np.random.default_rng(0).normal(size=(4, 512)).astype(np.float32)


def test_without_the_index_matrix_training_is_the_base_algorithm_and_sends_no_projection(start, cfg):
    data = client_data(HIGH)
    reply = client("client2vec", data, **{**cfg, "c2v-base": "fedavg"}).train(train_content(start))
    plain = as_torch(client("fedavg", data, **cfg).train(train_content(start))["arrays"])
    got = as_torch(reply["arrays"])
    assert sorted(got) == sorted(start)
    assert dist(got, plain, list(start)) < 1e-5


def test_case_study_iii_trains_p_and_h_p_with_the_model_and_changes_the_local_update(start, cfg):
    data = client_data(HIGH)
    keys = list(start)
    reply = client("client2vec", data, **{**cfg, "c2v-local-weight": 1.0}).train(train_content(start, BETA))
    got = as_torch(reply["arrays"])
    aux0 = build_aux(64, 512, 10, 3).state_with_prefix()
    assert sorted(got) == sorted(keys + list(aux0))
    assert dist(got, aux0, list(aux0)) > 0  # P and h_P were trained
    plain = as_torch(client("fedavg", data, **cfg).train(train_content(start))["arrays"])
    assert dist(got, plain, keys) > 1e-4  # the regulariser changed the model's update
    off = as_torch(
        client("client2vec", data, **{**cfg, "c2v-local-weight": 0.0}).train(train_content(start, BETA))["arrays"]
    )
    assert dist(off, plain, keys) < 1e-5  # weight 0: the model trains as without it


def test_sent_projection_modules_are_where_training_continues(start, cfg):
    aux = build_aux(64, 512, 10, seed=99).state_dict()  # not what the client would build itself
    reply = client("client2vec", client_data(HIGH), **{**cfg, "local-epochs": 0}).train(train_content(start, BETA, aux))
    got = as_torch(reply["arrays"])
    assert all(torch.equal(got["c2v." + k], aux[k]) for k in aux)


def test_fedprox_base_pulls_towards_the_global_model(start, cfg):
    data = client_data(HIGH)
    keys = [k for k in start if start[k].is_floating_point()]
    far = as_torch(
        client("client2vec", data, **{**cfg, "c2v-base": "fedavg", "local-epochs": 3}).train(train_content(start))[
            "arrays"
        ]
    )
    near = as_torch(
        client("client2vec", data, **{**cfg, "c2v-base": "fedprox", "proximal-mu": 5.0, "local-epochs": 3}).train(
            train_content(start)
        )["arrays"]
    )
    assert dist(near, start, keys) < 0.8 * dist(far, start, keys)
    with pytest.raises(ValueError, match="proximal-mu"):
        client("client2vec", data, **{**cfg, "c2v-base": "fedprox", "proximal-mu": -1.0}).train(train_content(start))


def test_moon_keeps_the_last_local_model_and_its_contrastive_term_changes_the_update(start, cfg):
    data = client_data(HIGH)
    ctx = context("moon", **{**cfg, "moon-mu": 5.0})
    reply = client("moon", data, ctx).train(train_content(start))
    got = as_torch(reply["arrays"])
    prev = as_torch(ctx.state["moon-prev"])
    assert all(torch.equal(prev[k], got[k]) for k in got)  # the previous local model for the next round
    plain = as_torch(client("fedavg", data, **cfg).train(train_content(start))["arrays"])
    keys = [k for k in start if start[k].is_floating_point()]
    assert (
        dist(
            as_torch(client("moon", data, **{**cfg, "moon-mu": 0.0}).train(train_content(start))["arrays"]), plain, keys
        )
        < 1e-5
    )
    # second round with a stored previous model: the negative pair is no longer the global model itself
    second = as_torch(client("moon", data, ctx).train(train_content(start))["arrays"])
    first_again = as_torch(client("moon", data, **{**cfg, "moon-mu": 5.0}).train(train_content(start))["arrays"])
    # round one: no previous local model yet, it is the global one, so the term is constant (log 2)
    assert dist(first_again, plain, keys) < 1e-5
    assert dist(second, plain, keys) > 1e-4  # later rounds: pushed away from the previous local model
    for bad in ({"moon-mu": -1.0}, {"moon-temperature": 0.0}):
        with pytest.raises(ValueError, match="moon"):
            client("moon", data, **{**cfg, **bad}).train(train_content(start))


def test_evaluate_scores_the_main_model_and_ignores_the_projection(start, cfg):
    data = client_data(HIGH)
    c = client("client2vec", data, **cfg)
    aux = build_aux(64, 512, 10, seed=1).state_dict()
    with_aux = c.evaluate(train_content(start, aux=aux))["metrics"]
    without = c.evaluate(train_content(start))["metrics"]
    assert with_aux["personal-acc"] == without["personal-acc"] == with_aux["global-acc"]
    assert with_aux["personal-loss"] == pytest.approx(without["personal-loss"]) == with_aux["global-loss"]
    from task.train import evaluate

    model = c.reset_model()
    model.load_state_dict(start)
    loss, acc = evaluate(model, data.x_test, data.y_test)
    assert without["personal-loss"] == pytest.approx(loss) and without["personal-acc"] == pytest.approx(acc)


# ------------------------------------------------------------------ replies, caches and the local step, in detail
def test_index_phase_replies_report_their_work_as_method_time(cfg):
    """Every index-phase reply reports the client's own work (CLIP encoding, DSA-IGN epochs, the index) as
    ``time-method``, the one timed phase of these queries (base metrics: time-<phase>)."""
    data = client_data(HIGH, n=4)
    _, content = ign_record()
    for name, msg in (("c2v_embed", RecordDict()), ("c2v_ign", content), ("c2v_index", content)):
        metrics = client("client2vec", data, **{**cfg, "c2v-ign-local-epochs": 1}).query(name, msg)["metrics"]
        assert [k for k in metrics if k.startswith("time-")] == ["time-method"] and metrics["time-method"] > 0, name
        assert metrics["num-examples"] == len(data.y_train)


def test_embedding_upload_is_reproducible_and_embeddings_are_cached_in_the_configured_folder(cfg, tmp_path):
    """A run is reproducible from its run config (DESIGN): the same node uploads the same pairs; the CLIP embeddings
    are cached on disk in ``c2v-cache-dir`` (client2vec.md §2.1)."""
    data = client_data(HIGH, n=4)
    first = record_to_numpy(client("client2vec", data, **cfg).query("c2v_embed", RecordDict())["arrays"])
    assert list(tmp_path.glob("*.npz"))  # written where the option says
    again = record_to_numpy(client("client2vec", data, **cfg).query("c2v_embed", RecordDict())["arrays"])
    np.testing.assert_array_equal(first["D"], again["D"])
    np.testing.assert_array_equal(first["L"], again["L"])


def test_open_clip_index_uses_the_configured_model_weights_and_normalisation(cfg, tmp_path):
    """client2vec.md §2.1 / A1-A2: D is the configured open_clip model's image embedding, L2-normalised with
    c2v-normalize; a missing checkpoint is an error naming c2v-clip-weights, never a silent fallback to random
    weights."""
    from task.clip import OpenClipEncoder

    data = client_data(HIGH, n=2)
    clip = {**cfg, "c2v-encoder": "open-clip", "c2v-clip-model": "pflower-tiny", "c2v-clip-weights": "random"}
    raw = client("client2vec", data, **{**clip, "c2v-normalize": False}).embeddings()[0]
    ref = OpenClipEncoder("pflower-tiny", "random", False).encode_images(data.x_train)
    np.testing.assert_allclose(raw, ref, rtol=1e-5, atol=1e-6)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0, atol=1e-3)
    unit = client("client2vec", data, **{**clip, "c2v-normalize": True}).embeddings()[0]
    np.testing.assert_allclose(unit, raw / np.linalg.norm(raw, axis=1, keepdims=True), rtol=1e-5, atol=1e-6)
    with pytest.raises(Exception, match="c2v-clip-weights"):
        client("client2vec", data, **{**clip, "c2v-clip-weights": str(tmp_path / "none.pt")}).embeddings()
    with pytest.raises(ValueError, match="c2v-clip-model"):
        client("client2vec", data, **{**clip, "c2v-clip-model": "no-such-clip"}).embeddings()


def test_federated_dsa_ign_reply_is_the_local_update_and_its_last_epochs_loss(cfg):
    """Federated mode (client2vec.md §2.5): the sent network trains c2v-ign-local-epochs epochs of Adam at c2v-ign-lr on
    all local pairs, and ``ign-loss`` is the mean DSA-IGN loss of the LAST epoch.  20 pairs in one
    batch of 32: the epochs are the same batch whatever the shuffling, so an independent run reproduces them."""
    from task.dsa_ign import train_dsa_ign

    data = client_data(HIGH, n=4)
    net, content = ign_record()
    reply = client("client2vec", data, **{**cfg, "c2v-ign-local-epochs": 3, "c2v-ign-lr": 0.01}).query(
        "c2v_ign", content
    )
    D, L = reference_embeddings(data)
    hist = train_dsa_ign(net, D, L, epochs=3, batch_size=32, lr=0.01)
    assert hist[-1]["total"] != pytest.approx(hist[-2]["total"], rel=1e-4)  # the epochs differ: the test can tell
    assert reply["metrics"]["ign-loss"] == pytest.approx(hist[-1]["total"], rel=1e-5)


def test_federated_dsa_ign_trains_with_the_runs_batch_orthogonality_and_a_per_round_seed(cfg):
    """The local DSA-IGN update uses the run's c2v-ign-batch and c2v-orth-mode and shuffles with a seed of the client
    and the round (20 pairs in batches of 4: the order matters, so an independent run must use the same seed)."""
    from task.dsa_ign import train_dsa_ign

    data = client_data(HIGH, n=4)
    opts = {**cfg, "c2v-ign-local-epochs": 2, "c2v-ign-lr": 0.01, "c2v-ign-batch": 4, "c2v-orth-mode": "diag"}
    _net, content = ign_record()
    content["config"] = ConfigRecord({"server-round": 5})
    c = client("client2vec", data, **opts)
    c.begin(content)
    got = as_torch(c.query("c2v_ign", content)["arrays"])
    D, L = reference_embeddings(data)

    def trained(**kw):
        fresh, _ = ign_record()
        args = {"epochs": 2, "batch_size": 4, "lr": 0.01, "seed": c.seed + 5, "orth_mode": "diag", **kw}
        train_dsa_ign(fresh, D, L, **args)
        return fresh.state_dict()

    expected = trained()
    for k, v in expected.items():
        torch.testing.assert_close(got[k], v, msg=k)
    keys = list(expected)
    for other in (trained(seed=c.seed), trained(batch_size=128), trained(orth_mode="cos")):  # each setting shows
        assert dist(other, expected, keys) > 1e-4


def test_trained_acc_is_the_returned_models_test_accuracy(start, cfg):
    from task.train import evaluate

    data = client_data(HIGH)
    reply = client("client2vec", data, **cfg).train(train_content(start, BETA))
    model = client("client2vec", data, **cfg).reset_model()
    model.load_state_dict({k: v for k, v in as_torch(reply["arrays"]).items() if not k.startswith("c2v.")})
    assert reply["metrics"]["trained-acc"] == pytest.approx(evaluate(model, data.x_test, data.y_test)[1])


def test_moon_base_is_the_moon_client_round_after_round(start, cfg):
    """c2v-base=moon without the index matrix is MOON (spec: the base algorithm's own term alongside), including
    the previous local model kept in the node's state (``moon-prev``) for the next round."""
    data = client_data(HIGH)
    run = {**cfg, "moon-mu": 5.0, "local-epochs": 2}
    c2v_ctx, moon_ctx = context("client2vec", **{**run, "c2v-base": "moon"}), context("moon", **run)
    for _ in range(2):
        got = as_torch(client("client2vec", data, c2v_ctx).train(train_content(start))["arrays"])
        ref = as_torch(client("moon", data, moon_ctx).train(train_content(start))["arrays"])
        assert sorted(got) == sorted(ref) and dist(got, ref, [k for k in ref if ref[k].is_floating_point()]) < 1e-6
        prev = as_torch(c2v_ctx.state["moon-prev"])
        assert all(torch.equal(prev[k], got[k]) for k in got)


@pytest.mark.parametrize(
    "w, normalize, mean, detach, dtype", [(1.0, True, False, True, np.float32), (2.0, False, True, False, np.float64)]
)
def test_case_study_iii_step_is_eq4(start, cfg, w, normalize, mean, detach, dtype):
    """client2vec.md §2.8, Eq. 4: one full-batch SGD step on CE(h(z), y) + w * (L_orth(P z, B_f) + KL(h || h_P))
    over the model AND P, h_P (local_regulariser, with c2v-orth-normalize / -orth-mean-over-clients /
    -dist-detach as set), from the received global model; B_f is read as float32 whatever precision it arrives in."""
    from client_app.client2vec_math import local_regulariser

    data = client_data(HIGH)
    n, lr = len(data.y_train), 0.1
    run = {
        **cfg,
        "c2v-local-weight": w,
        "c2v-orth-normalize": normalize,
        "c2v-orth-mean-over-clients": mean,
        "c2v-dist-detach": detach,
        "batch-size": n,
        "lr": lr,
        "momentum": 0.0,
        "local-epochs": 1,
    }
    c = client("client2vec", data, **run)
    got = as_torch(c.train(train_content(start, BETA.astype(dtype)))["arrays"])
    model = c.reset_model()
    model.load_state_dict(start)
    aux = build_aux(64, 512, 10, 3)
    z = model.features(data.x_train)
    logits = model.head(z)
    loss = torch.nn.functional.cross_entropy(logits, data.y_train) + w * local_regulariser(
        z, logits, aux, torch.from_numpy(BETA), normalize=normalize, mean_over_clients=mean, detach_distill=detach
    )
    named = dict(model.named_parameters()) | {"c2v." + k: p for k, p in aux.named_parameters()}
    grads = dict(zip(named, torch.autograd.grad(loss, list(named.values())), strict=True))
    for k, p in named.items():
        torch.testing.assert_close(got[k], (p - lr * grads[k]).detach(), rtol=1e-4, atol=1e-5)


def test_sent_projection_modules_must_be_complete(start, cfg):
    aux = build_aux(64, 512, 10, seed=99).state_dict()
    del aux["head.bias"]
    with pytest.raises(ValueError, match="lacks"):
        client("client2vec", client_data(HIGH), **cfg).train(train_content(start, BETA, aux))


def test_a_nodes_file_read_with_other_data_settings_is_encoded_again(cfg, tmp_path):
    """The embedding cache is keyed by the data settings and partition as well as by a node's own file: the same,
    unchanged file read with another training split (here: another val-fraction) must not be served the embeddings
    cached for the other split (client2vec.md §2.1: D are the embeddings of the client's training split)."""
    a, b = client_data(LOW, n=4), client_data(HIGH, n=4)
    path = tmp_path / "node.npz"
    np.savez(path, x=a.x_train.numpy(), y=a.y_train.numpy())
    for data in (a, b):
        data.meta["data-path"] = str(path)
    got_a = client("client2vec", a, context("client2vec", pid=2, **cfg)).embeddings()[0]
    got_b = client("client2vec", b, context("client2vec", pid=2, **{**cfg, "val-fraction": 0.2})).embeddings()[0]
    np.testing.assert_allclose(got_a, reference_embeddings(a)[0], atol=1e-6)
    np.testing.assert_allclose(got_b, reference_embeddings(b)[0], atol=1e-6)


def _dead_features_and_train_acc(c, content, x):
    reply = c.train(content)
    state = {k: v for k, v in as_torch(reply["arrays"]).items() if not k.startswith("c2v.")}
    model = c.reset_model()
    model.load_state_dict(state)
    model.eval()
    with torch.no_grad():
        z = model.features(x)
    return float((z <= 0).all(0).float().mean()), float(reply["metrics"]["train-acc"])


def test_case_study_iii_at_the_users_defaults_trains_like_the_base_algorithm(cfg):
    """The collapse at the old defaults (docs/methods/client2vec.md, "Why the defaults"): with the optimiser and model a
    user gets (cnn with BatchNorm, SGD lr 0.05 momentum 0.9, batches of 20; two local epochs here) and the
    near-identical feature indices a random-weight CLIP gives (M = 10 rows), the local update with (iii) must
    train like the one without it.  With L_orth summed over the clients and L_dist reaching the features, the
    feature layer's ReLUs died (73-88 % of them zero on every training sample, against 30 % without (iii)) and
    the update learnt half as much."""
    from task.config import parse_settings

    user = parse_settings({"method": "client2vec"})
    run = {
        **cfg,
        "model": user.model,
        "lr": user.lr,
        "momentum": user.momentum,
        "batch-size": user.batch_size,
        "partition": user.data.partition,
        "local-epochs": 2,
    }
    data = client_data(list(range(10)), n=20)
    rng = np.random.default_rng(0)
    beta = (rng.normal(size=512) + 0.02 * rng.normal(size=(10, 512))).astype(np.float32)
    init = client("client2vec", data, **run).reset_model().state_dict()
    dead_plain, acc_plain = _dead_features_and_train_acc(
        client("client2vec", data, **run), train_content(init), data.x_train
    )
    dead, acc = _dead_features_and_train_acc(client("client2vec", data, **run), train_content(init, beta), data.x_train)
    assert dead <= dead_plain + 0.15
    assert acc >= acc_plain - 0.1


def test_a_client_whose_embeddings_are_cached_never_builds_the_encoder(cfg, monkeypatch):
    """The cache spares the CLIP model: a node that has its embeddings answers the index-phase queries without
    importing open_clip or loading weights (3 s per process idle, 13 s loaded; docs/methods/client2vec.md)."""
    import task.clip

    data = client_data(HIGH, n=4)
    clip = {**cfg, "c2v-encoder": "open-clip"}
    first = client("client2vec", data, **clip).embeddings()  # a cache miss builds the encoder and writes the cache

    def no_encoder(*args):
        raise AssertionError(f"encoder built on a cache hit: {args}")

    monkeypatch.setattr(task.clip, "build_encoder", no_encoder)
    again = client("client2vec", data, **clip).embeddings()
    np.testing.assert_array_equal(first[0], again[0])
    np.testing.assert_array_equal(first[1], again[1])
    with pytest.raises(AssertionError, match="encoder built"):  # another encoder's embeddings are not that cache
        client("client2vec", data, **{**clip, "c2v-normalize": False}).embeddings()

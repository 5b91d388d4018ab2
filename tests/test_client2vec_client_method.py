"""What the Client2Vec client must do (spec client2vec §2.1, §2.2, §2.5, §2.8, §2.9), with the synthetic
encoder so every embedding can be recomputed here independently."""

import numpy as np
import pytest
import torch
from flwr.app import RecordDict

from task.methods.client2vec import build_aux
from task.clip import SyntheticEncoder, class_names, label_prompt
from task.dsa_ign import IGNConfig, build_ign
from task.params import record_to_numpy, to_record
from tests.client_kit import client, client_data, context, numpy_state

LOW, HIGH = [0, 1, 2, 3, 4], [5, 6, 7, 8, 9]


@pytest.fixture
def cfg(tmp_path):
    return {"c2v-encoder": "synthetic", "c2v-cache-dir": str(tmp_path), "c2v-ign-ff": 16, "c2v-ign-upload": 12,
            "c2v-ign-batch": 32, "seed": 3}


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
    first = client("client2vec", a, ctx=context("client2vec", pid=0, **cfg)).embeddings()[0]
    other_partition = client("client2vec", b, ctx=context("client2vec", pid=1, **cfg)).embeddings()[0]
    np.testing.assert_allclose(other_partition, reference_embeddings(b)[0], atol=1e-6)
    np.testing.assert_allclose(first, reference_embeddings(a)[0], atol=1e-6)
    for name, data in (("a.npz", a), ("b.npz", b)):  # same partition id, each node its own file
        path = tmp_path / name
        np.savez(path, x=data.x_train.numpy(), y=data.y_train.numpy())
        data.meta["data-path"] = str(path)
    got_a = client("client2vec", a, ctx=context("client2vec", pid=2, **cfg)).embeddings()[0]
    got_b = client("client2vec", b, ctx=context("client2vec", pid=2, **cfg)).embeddings()[0]
    np.testing.assert_allclose(got_a, reference_embeddings(a)[0], atol=1e-6)
    np.testing.assert_allclose(got_b, reference_embeddings(b)[0], atol=1e-6)


def test_federated_dsa_ign_round_trains_the_sent_network_with_the_ign_options(cfg):
    data = client_data(HIGH, n=4)
    net, content = ign_record()
    sent = {k: v.clone() for k, v in net.state_dict().items()}
    still = as_torch(client("client2vec", data, **{**cfg, "c2v-ign-lr": 0.0, "c2v-ign-local-epochs": 1}).query("c2v_ign", content)["arrays"])
    assert all(torch.equal(still[k], sent[k]) for k in sent)  # lr 0: the sent weights come back
    reply = client("client2vec", data, **{**cfg, "c2v-ign-local-epochs": 2}).query("c2v_ign", content)
    moved = as_torch(reply["arrays"])
    assert sorted(moved) == sorted(sent) and dist(moved, sent, [k for k in sent if sent[k].is_floating_point()]) > 0
    assert np.isfinite(reply["metrics"]["ign-loss"]) and reply["metrics"]["ign-loss"] > 0
    one = as_torch(client("client2vec", data, **{**cfg, "c2v-ign-local-epochs": 1}).query("c2v_ign", content)["arrays"])
    assert dist(one, moved, [k for k in sent if sent[k].is_floating_point()]) > 0
    with pytest.raises(ValueError, match="DSA-IGN"):
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
    with pytest.raises(ValueError, match="query"):
        client("client2vec", data, **cfg).query("no-such-query", RecordDict())


# ------------------------------------------------------------------------------------------ local training
@pytest.fixture(scope="module")
def start():
    c = client("client2vec", client_data(HIGH))
    return {k: v.detach().clone() for k, v in c.fresh_model().state_dict().items()}


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
    off = as_torch(client("client2vec", data, **{**cfg, "c2v-local-weight": 0.0}).train(train_content(start, BETA))["arrays"])
    assert dist(off, plain, keys) < 1e-5  # weight 0: the model trains as without it


def test_sent_projection_modules_are_where_training_continues(start, cfg):
    aux = build_aux(64, 512, 10, seed=99).state_dict()  # not what the client would build itself
    reply = client("client2vec", client_data(HIGH), **{**cfg, "local-epochs": 0}).train(train_content(start, BETA, aux))
    got = as_torch(reply["arrays"])
    assert all(torch.equal(got["c2v." + k], aux[k]) for k in aux)


def test_fedprox_base_pulls_towards_the_global_model(start, cfg):
    data = client_data(HIGH)
    keys = [k for k in start if start[k].is_floating_point()]
    far = as_torch(client("client2vec", data, **{**cfg, "c2v-base": "fedavg", "local-epochs": 3}).train(train_content(start))["arrays"])
    near = as_torch(client("client2vec", data, **{**cfg, "c2v-base": "fedprox", "proximal-mu": 5.0, "local-epochs": 3}).train(
        train_content(start))["arrays"])
    assert dist(near, start, keys) < 0.8 * dist(far, start, keys)
    with pytest.raises(ValueError, match="proximal-mu"):
        client("client2vec", data, **{**cfg, "c2v-base": "fedprox", "proximal-mu": -1.0}).train(train_content(start))


def test_moon_keeps_the_last_local_model_and_its_contrastive_term_changes_the_update(start, cfg):
    data = client_data(HIGH)
    ctx = context("moon", **{**cfg, "moon-mu": 5.0})
    reply = client("moon", data, ctx=ctx).train(train_content(start))
    got = as_torch(reply["arrays"])
    prev = as_torch(ctx.state["moon-prev"])
    assert all(torch.equal(prev[k], got[k]) for k in got)  # the previous local model for the next round
    plain = as_torch(client("fedavg", data, **cfg).train(train_content(start))["arrays"])
    keys = [k for k in start if start[k].is_floating_point()]
    assert dist(as_torch(client("moon", data, **{**cfg, "moon-mu": 0.0}).train(train_content(start))["arrays"]), plain, keys) < 1e-5
    # second round with a stored previous model: the negative pair is no longer the global model itself
    second = as_torch(client("moon", data, ctx=ctx).train(train_content(start))["arrays"])
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

    model = c.fresh_model()
    model.load_state_dict(start)
    loss, acc = evaluate(model, data.x_test, data.y_test)
    assert without["personal-loss"] == pytest.approx(loss) and without["personal-acc"] == pytest.approx(acc)

"""Local DP in pFedLIA (docs/privacy.md, "Local DP in pFedLIA"): every model that leaves a client - its train replies,
which the server averages into the warm-up and cluster models every peer receives, and its lazy model
(``query.lazy``), which every peer scores - leaves as a local release around the model the message brought: the
change is clipped to ``dp-clip``, Gaussian noise of std ``sigma * dp-clip`` is added once, on the client; integer
buffers stay home.  The server admits releases without them, averages the releases without weights, and accounts
every client's epsilon over one release per round plus its lazy model.

The client is driven through the ClientApp's privacy steps (``private_reply`` for a train reply, ``query_reply`` for
a query) on the default model (``cnn``, with BatchNorm); the server through its own round loop against scripted
clients (tests/pfedlia/server_kit.py's federation)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Context, RecordDict

from client_app.app import query_reply
from client_app.privacy import private_reply
from task.config import parse_settings
from task.methods import METHODS, load_object
from task.params import record_to_numpy, to_record
from task.privacy import local_epsilon, update_norm
from tests.client_kit import declare
from tests.pfedlia.server_kit import CLIENTS, EXAMPLES, NODE, Federation, lazy_value, trained_value
from tests.strategy_harness import ReplayGrid, outgoing_messages, run_round

CLIENT_CFG = {"method": "pfedlia", "partition": "iid", "dp-mode": "local", "lr": 0.5, "lazy-epochs": 1}


def make_client(**cfg):
    cfg = {**CLIENT_CFG, **cfg}
    ctx = Context(
        run_id=1, node_id=7, node_config={"partition-id": 0, "num-partitions": 3}, state=RecordDict(), run_config=cfg
    )
    return load_object(METHODS["pfedlia"].client)(ctx, parse_settings(cfg))


def sent_model(seed=0):
    """A model of the client's network as the server would send it, moved away from the initial one (integer
    buffers included: the server sends whole models)."""
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, v in make_client(**{"dp-mode": "off"}).reset_model().state_dict().items():
        if not v.is_floating_point():
            out[name] = torch.full_like(v, 5).numpy()
        elif name.endswith("running_var"):
            out[name] = (v * (0.5 + torch.rand(v.shape, generator=g))).numpy()
        else:
            out[name] = (v + 0.1 * torch.randn(v.shape, generator=g)).numpy()
    return out


def message(model, server_round=2):
    return RecordDict({"arrays": to_record(model), "config": ConfigRecord({"server-round": server_round})})


def leaves(client, phase, content):
    """What leaves the client for a ``phase`` ("train" or "lazy") message: its reply after the ClientApp's privacy
    step."""
    client.begin(content)
    declare(client, content)  # the noise the server declares
    if phase == "train":
        reply = private_reply(client, client.train(content), content)
    else:
        reply = query_reply(client, phase, content)
    return record_to_numpy(reply.array_records["arrays"])


def floating(state):
    return {k: v for k, v in state.items() if np.issubdtype(v.dtype, np.floating)}


PHASES = ["train", "lazy"]


@pytest.mark.parametrize("phase", PHASES)
@pytest.mark.parametrize("clip", [0.05, 3.0])
def test_every_model_that_leaves_is_within_the_clip_norm_of_the_model_the_message_brought(phase, clip):
    """Without noise a release is exactly reference + clipped change: its distance from the model the message brought
    (the server's average for a train reply, theta_0 for the lazy model) is at most ``dp-clip``, and reaches it
    when training moved the model further; no integer buffer leaves."""
    sent = sent_model()
    out = leaves(make_client(**{"dp-clip": clip, "dp-noise-multiplier": 0.0}), phase, message(sent))
    reference = floating(sent)
    assert sorted(out) == sorted(reference) and len(reference) < len(sent)
    change = {k: out[k].astype(np.float64) - reference[k] for k in reference}
    assert update_norm(change) <= clip * (1 + 1e-5)
    assert update_norm(change) == pytest.approx(clip, rel=1e-4)


@pytest.mark.parametrize("phase", PHASES)
def test_the_noise_has_std_sigma_clip_and_is_added_once_per_release(phase):
    """The same client and message with and without noise: the difference of what leaves is the noise, of std
    sigma * C (twice the noise would be sqrt(2) times that)."""
    sigma, clip = 0.3, 0.2
    content = message(sent_model())
    plain = leaves(make_client(**{"dp-clip": clip, "dp-noise-multiplier": 0.0}), phase, content)
    noisy = leaves(make_client(**{"dp-clip": clip, "dp-noise-multiplier": sigma}), phase, content)
    keys = [k for k in plain if not k.endswith("running_var")]  # variances are cut at 0 after the noise
    noise = np.concatenate([(noisy[k].astype(np.float64) - plain[k]).ravel() for k in keys])
    expected = sigma * clip
    assert noise.size > 10_000
    assert abs(noise.mean()) < 6 * expected / math.sqrt(noise.size)
    assert abs(noise.std() - expected) < 6 * expected / math.sqrt(2 * noise.size)
    variances = [k for k in noisy if k.endswith("running_var")]
    assert variances and all((noisy[k] >= 0).all() for k in variances)


@pytest.mark.parametrize("phase", PHASES)
def test_no_noise_and_no_clipping_releases_the_model_bit_for_bit_without_its_integer_buffers(phase):
    content = message(sent_model())
    plain = make_client(**{"dp-mode": "off"})
    plain.begin(content)
    trained = record_to_numpy((plain.train(content) if phase == "train" else plain.query(phase, content))["arrays"])
    out = leaves(make_client(**{"dp-clip": 0.0, "dp-noise-multiplier": 0.0}), phase, content)
    assert sorted(out) == sorted(floating(trained)) and len(out) < len(trained)
    for k, v in out.items():
        assert v.dtype == trained[k].dtype
        np.testing.assert_array_equal(v, trained[k], err_msg=k)


@pytest.mark.parametrize("phase", PHASES)
def test_without_dp_the_whole_model_leaves_as_it_was_trained(phase):
    content = message(sent_model())
    client = make_client(**{"dp-mode": "off"})
    client.begin(content)
    trained = record_to_numpy((client.train(content) if phase == "train" else client.query(phase, content))["arrays"])
    out = leaves(make_client(**{"dp-mode": "off"}), phase, content)
    assert sorted(out) == sorted(trained)
    for k, v in out.items():
        np.testing.assert_array_equal(v, trained[k], err_msg=k)


def test_only_the_lazy_query_releases_a_model_and_the_others_reply_as_without_dp():
    """``query.identify`` and ``query.lia`` carry no model: the privacy step leaves them alone (the influence row is
    not noised: docs/privacy.md says it is not covered)."""
    assert METHODS["pfedlia"].queries == ("lazy", "lia")
    client = make_client(**{"dp-noise-multiplier": 5.0})
    assert client.released_queries == ("lazy",)
    content = message(sent_model())
    client.begin(content)
    reply = query_reply(client, "identify", content)
    assert not reply.array_records and dict(reply["metrics"]) == client.base_metrics()


def test_a_message_without_a_model_is_refused():
    client = make_client()
    refusal = r"^local DP releases pFedLIA's model against the model the message brought: it had none$"
    with pytest.raises(ValueError, match=refusal):
        client.release_reference(RecordDict({"config": ConfigRecord({"server-round": 1})}))


def test_the_reference_is_the_model_the_message_brought():
    sent = sent_model(seed=4)
    reference = make_client().release_reference(message(sent))
    assert sorted(reference) == sorted(sent)
    for k, v in sent.items():
        np.testing.assert_array_equal(reference[k], v, err_msg=k)


# ---------------------------------------------------------------------------------------------- server side
LOCAL = {"dp-mode": "local", "dp-clip": 0.5, "dp-noise-multiplier": 0.8, "model": "cnn"}


def mean_of(values):
    return float(np.mean(values))


def counters(strategy):
    return {k: v for k, v in strategy.initial_state.items() if not np.issubdtype(v.dtype, np.floating)}


def assert_floats_hold(state, value, integers):
    for k, v in state.items():
        if k in integers:
            np.testing.assert_array_equal(v, integers[k], err_msg=k)
        else:
            np.testing.assert_allclose(v, np.full(v.shape, value, v.dtype), rtol=1e-6, err_msg=k)


def test_the_server_admits_releases_without_integer_buffers_and_averages_them_without_weights():
    """Warm-up round 1, clustering round 2 (lazy models), a cluster round 3, every reply a release without
    ``num_batches_tracked``: all admitted; the models the server sends (theta_0, the lazy models peers score, the
    cluster models) keep the initial integer buffers; averages are unweighted (the sizes differ, so a size-weighted
    average would be caught)."""
    fed = Federation(rounds=3, **LOCAL).run()
    s = fed.strategy
    integers = counters(s)
    assert integers and not s.failures
    assert len(set(EXAMPLES.values())) > 1
    for phase in ("train", "lazy"):
        assert not set(integers) & set(s.reply_spec(phase, -1).records["arrays"].tensors)
    theta0 = mean_of([trained_value(1, c) for c in CLIENTS])
    for c in CLIENTS:
        assert_floats_hold(fed.payload(2, "lazy", c), theta0, integers)
        lazy = fed.payload(2, "lia", c, "lazy")
        for k, v in integers.items():
            assert (lazy[k] == v).all(), k
        for i, j in enumerate(fed.messages(2, "lia")[c]["lazy-clients"]["client-ids"]):
            assert_floats_hold({k: v[i] for k, v in lazy.items() if k not in integers}, lazy_value(j), integers)
    labels = s.assignment
    assert len(set(labels.values())) == 2
    for label in set(labels.values()):
        members = [c for c in CLIENTS if labels[c] == label]
        assert_floats_hold(s.cluster_models[label], mean_of([trained_value(3, c) for c in members]), integers)


def test_p2p_personal_models_are_unweighted_averages_of_releases_under_local_dp():
    fed = Federation(rounds=3, **LOCAL, **{"lia-mode": "p2p"}).run()
    s = fed.strategy
    integers = counters(s)
    assert not s.failures
    for c, members in s.sets.items():
        assert_floats_hold(s.personal[c], mean_of([trained_value(3, m) for m in members]), integers)


def test_without_dp_the_averages_stay_weighted_by_the_training_set_sizes():
    fed = Federation(rounds=2, model="cnn").run()
    n = np.array([EXAMPLES[c] for c in CLIENTS], float)
    expected = float(n @ [trained_value(1, c) for c in CLIENTS] / n.sum())
    for k, v in fed.strategy.theta0.items():
        if np.issubdtype(v.dtype, np.floating):
            np.testing.assert_allclose(v, np.full(v.shape, expected, v.dtype), rtol=1e-6, err_msg=k)
    assert "dp" not in fed.strategy.history[-1].extra


def test_every_clients_epsilon_composes_one_release_per_round_and_its_lazy_model():
    """Round 2 is the clustering round: every client releases its lazy model and its train reply."""
    s = Federation(rounds=4, **LOCAL).run().strategy
    dp = [h.extra["dp"] for h in s.history]
    assert [d["releases"] for d in dp] == [1, 3, 4, 5]
    assert [d["clients"] for d in dp] == [len(CLIENTS)] * 4
    assert [d["epsilon"] for d in dp] == pytest.approx([local_epsilon(0.8, r, 1e-5) for r in (1, 3, 4, 5)])
    assert all(d["noise-std"] == pytest.approx(0.8 * 0.5) and d["mode"] == "local" for d in dp)
    assert all(d["neighbours"] == "replace-one-data-set" for d in dp)


def test_a_lazy_query_asked_again_counts_again():
    """No lazy model arrived in round 2 (the clustering round moves to round 3): the clients released all the same,
    and release again in round 3."""
    silent = {(2, "lazy", c) for c in CLIENTS}
    fed = Federation(rounds=3, silent=silent, **LOCAL).run()
    s = fed.strategy
    assert {r for r, p, _, _ in fed.sent if p == "lazy"} == {2, 3}
    dp = [h.extra["dp"] for h in s.history]
    assert [d["releases"] for d in dp] == [1, 3, 5]
    assert s.clustered and s.lazy_queries == 2


@pytest.mark.parametrize("silent_round", [1, 2])
def test_a_round_without_valid_replies_still_counts(silent_round):
    silent = {(silent_round, "train", c) for c in CLIENTS}
    s = Federation(rounds=2, silent=silent, **LOCAL).run().strategy
    dp = [h.extra["dp"] for h in s.history]
    assert [d["clients"] for d in dp] == [0 if r == silent_round else len(CLIENTS) for r in (1, 2)]
    assert [d["releases"] for d in dp] == [1, 3]


def test_the_oracle_accounts_its_train_releases_only():
    """The Oracle groups by the planted groups its clients report: no lazy model, one release per round."""
    s = Federation(method="oracle", rounds=3, **LOCAL).run().strategy
    assert not s.failures and s.lazy_queries == 0
    assert [h.extra["dp"]["releases"] for h in s.history] == [1, 2, 3]


def test_a_resumed_run_still_counts_the_lazy_model_released_before_the_interruption():
    fed = Federation(rounds=3, **LOCAL)
    grid = ReplayGrid([NODE[c] for c in CLIENTS], fed.respond)
    with outgoing_messages():
        for r in (1, 2):
            run_round(fed.strategy, grid, r)
        resumed = Federation(rounds=3, **LOCAL)
        resumed.strategy.checkpoint.resume(fed.strategy.checkpoint.state(), 2)
        run_round(resumed.strategy, ReplayGrid([NODE[c] for c in CLIENTS], resumed.respond), 3)
    assert [h.extra["dp"]["releases"] for h in resumed.strategy.history] == [1, 3, 4]


def test_the_declaration_says_the_lazy_model_is_a_release_without_counters():
    from server_app.disclosure import declarations

    plain, _ = declarations("pfedlia")
    declared, info = declarations("pfedlia", **{"dp-mode": "local"})
    integers = [k for k in info.keys if not info.dtypes[k].startswith("float")]
    assert integers
    for kind in ("train", "query.lazy"):
        released, whole = declared[kind].sends["arrays"].arrays, plain[kind].sends["arrays"].arrays
        assert released is not None and whole is not None
        assert not set(integers) & set(released.tensors) and set(integers) <= set(whole.tensors), kind
    lazy = "its lazily trained whole model"
    assert declared["query.lazy"].sends["arrays"].what == lazy + " (its local release around the warm-up model)"
    assert plain["query.lazy"].sends["arrays"].what == lazy


def test_the_clustering_queries_declare_in_words_what_comes_from_whom():
    """The words docs/privacy.md and the recorder's reports use for pFedLIA's clustering round (the structure is
    checked against recordings in tests/privacy/test_recorder.py)."""
    from server_app.disclosure import declarations

    declared, _ = declarations("pfedlia", **{"dp-mode": "local"})
    lazy, lia = declared["query.lazy"], declared["query.lia"]
    assert lazy.reveals == "a model trained on its data alone"
    assert lia.reveals == "which peers' data resemble its own"
    theta0 = "the warm-up model (the clients' average)"
    assert {n: p.what for n, p in lazy.receives.items() if n != "config"} == {"arrays": theta0}
    assert {n: (p.what, p.from_peers) for n, p in lia.receives.items() if n != "config"} == {
        "arrays": (theta0, True),
        "lazy": ("every client's lazily trained whole model", True),
        "lazy-clients": ("the lazy models' client ids, and which one is its own", True),
    }
    assert lia.receives["lazy-clients"].entries == {"client-ids": True, "self-index": True}
    assert lia.receives["lazy-clients"].required
    for d in (lazy, lia):
        assert d.receives["config"].entries is not None and d.receives["config"].entries["clustered"] is True
        assert d.receives["config"].entries["evaluated-clustered"] is False
    assert "arrays" not in lia.sends and set(lia.sends["metrics"].entries or {}) >= {"lia-row"}
    oracle, _ = declarations("oracle", **{"dp-mode": "local", "partition": "planted-clusters"})
    assert not any(kind.startswith("query.l") for kind in oracle)

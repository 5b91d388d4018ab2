"""Local DP in FedC2I (docs/privacy.md): every model a client sends - which the server stores and forwards to its
peers - leaves the client as a local release around its own previous release (the first model of ``peers``):
the change is clipped to ``dp-clip``, Gaussian noise of std ``sigma * dp-clip`` is added once, on the client, from a
source the run config cannot reproduce; integer buffers stay home, running variances stay >= 0.  The server
forwards no training-set sizes, keeps the initial integer buffers, and reports every client's epsilon.

The client is driven through its train handler and ``client_app.privacy.private_reply`` (what the ClientApp's
train handler does with the reply), on the default model (``cnn``, with BatchNorm)."""

from __future__ import annotations

import dataclasses
import math
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, RecordDict, UserConfigValue

from client_app.privacy import private_reply
from server_app.app import build_strategy
from strategies.outcome import RoundLog
from task.config import parse_settings
from task.methods import METHODS, load_object
from task.params import record_to_numpy, stacked_record, to_record
from task.privacy import local_epsilon, update_norm
from tests.client_kit import declare, distinct_states, node_contexts, numpy_state
from tests.strategy_harness import drive, strategy

CLIENT_CFG = {"method": "fedc2i", "partition": "iid", "dp-mode": "local", "lr": 0.5}


def make_client(context: Context | None = None, /, **cfg):
    """A FedC2I client of partition 0 with ``cfg`` over the test's run config; ``context``: the node's, as the
    ClientApp hands one node's context to the client it builds for each message."""
    cfg = {**CLIENT_CFG, **cfg}
    ctx = context or Context(
        run_id=1, node_id=7, node_config={"partition-id": 0, "num-partitions": 3}, state=RecordDict(), run_config=cfg
    )
    return load_object(METHODS["fedc2i"].client)(ctx, parse_settings(cfg))


def received(client, k=3, seed=0):
    """k models of the client's network (its own previous release first), as numpy arrays."""
    return [numpy_state(s) for s in distinct_states(client, k, seed, spread=0.1)]


def message(states, server_round=2):
    return RecordDict(
        {
            "peers": stacked_record(states),
            "peer-clients": ConfigRecord({"client-ids": list(range(1, len(states)))}),
            "config": ConfigRecord({"server-round": server_round}),
        }
    )


def release(client, content):
    """What leaves the client for a train message ``content``: its reply after the ClientApp's privacy step."""
    client.begin(content)
    reply = private_reply(client, client.train(content), declare(client, content))
    return record_to_numpy(reply.array_records["arrays"]), dict(reply["metrics"])


def floating(state):
    return {k: v for k, v in state.items() if np.issubdtype(v.dtype, np.floating)}


@pytest.mark.parametrize("clip", [0.05, 0.5, 3.0])
def test_every_release_is_within_the_clip_norm_of_the_clients_own_previous_release(clip):
    """Without noise the release is exactly reference + clipped change: its distance from the client's own model
    (first in ``peers``) is at most ``dp-clip``, and reaches it when training moved the model further."""
    client = make_client(**{"dp-clip": clip, "dp-noise-multiplier": 0.0})
    states = received(client)
    for server_round in (1, 2, 3):
        out, _ = release(client, message(states, server_round))
        reference = floating(states[0])
        assert sorted(out) == sorted(reference)  # every floating array, and no integer buffer
        change = {k: out[k].astype(np.float64) - reference[k] for k in reference}
        assert update_norm(change) <= clip * (1 + 1e-5)
        assert update_norm(change) == pytest.approx(clip, rel=1e-4)  # training moved it further than the bound


def test_the_noise_has_std_sigma_clip_and_is_added_once_per_release():
    """The same client and message with and without noise: the difference of the releases is the noise, of std
    sigma * C (noise added twice would be sqrt(2) times that; noise on the unclipped model or scaled by the clip
    of the mean would miss it by orders)."""
    sigma, clip = 0.3, 0.2
    states = received(make_client())
    content = message(states)
    plain, _ = release(make_client(**{"dp-clip": clip, "dp-noise-multiplier": 0.0}), content)
    noisy, _ = release(make_client(**{"dp-clip": clip, "dp-noise-multiplier": sigma}), content)
    keys = [k for k in plain if not k.endswith("running_var")]  # variances are cut at 0 after the noise
    noise = np.concatenate([(noisy[k].astype(np.float64) - plain[k]).ravel() for k in keys])
    expected = sigma * clip
    assert noise.size > 10_000
    assert abs(noise.mean()) < 6 * expected / math.sqrt(noise.size)
    assert abs(noise.std() - expected) < 6 * expected / math.sqrt(2 * noise.size)
    variances = [k for k in noisy if k.endswith("running_var")]
    assert variances and all((noisy[k] >= 0).all() for k in variances)


def test_the_noise_cannot_be_regenerated_from_the_run_config():
    """Everyone who sees a release knows the run config (its seed): the same client, message and config must
    still release different noise, or the server could subtract it."""
    content = message(received(make_client()))
    first, _ = release(make_client(**{"dp-noise-multiplier": 0.5}), content)
    second, _ = release(make_client(**{"dp-noise-multiplier": 0.5}), content)
    assert any(not np.array_equal(first[k], second[k]) for k in first)


def test_no_noise_and_no_clipping_releases_the_trained_model_without_its_integer_buffers():
    content = message(received(make_client()))
    client = make_client(**{"dp-mode": "off"})
    client.begin(content)
    trained = record_to_numpy(client.train(content).array_records["arrays"])
    out, _ = release(make_client(**{"dp-clip": 0.0, "dp-noise-multiplier": 0.0}), content)
    assert sorted(out) == sorted(floating(trained)) and len(out) < len(trained)
    for k, v in out.items():
        np.testing.assert_allclose(v, trained[k], rtol=1e-5, atol=1e-6, err_msg=k)


def test_a_message_without_the_clients_own_model_is_refused():
    client = make_client()
    content = RecordDict({"config": ConfigRecord({"server-round": 1})})
    # what was needed (the client's own model, first in 'peers'), for what (local DP, FedC2I), and that none came
    with pytest.raises(ValueError, match=r"^local DP releases FedC2I's model against the client's own, first in "):
        client.release_reference(content)


# ---------------------------------------------------------------------------------------------- server side
def test_the_server_stores_and_forwards_each_release_with_the_initial_integer_buffers_and_no_sizes():
    """Two rounds of real clients through the strategy's reply gate: a release without integer buffers is
    admitted, stored with the initial model's buffers, and is what its client's peers (and the client itself, as
    its next reference) receive; peers learn each other's ids, not their training-set sizes."""
    cfg = {"method": "fedc2i", "partition": "iid", "dp-mode": "local", "dp-clip": 0.1, "dp-noise-multiplier": 0.5}
    settings = parse_settings(cfg)
    strat = build_strategy(settings)
    ctxs = node_contexts(cfg, 3)
    cls = load_object(METHODS["fedc2i"].client)
    integers = {k: v for k, v in strat.initial_state.items() if not np.issubdtype(v.dtype, np.floating)}
    assert integers  # the default model has BatchNorm counters
    sent, left = {}, {}
    for rnd in (1, 2):
        ups = []
        strat.history.append(RoundLog(rnd))
        strat.privacy.before_round(strat, rnd, 3)
        strat.privacy.journal_local(strat, rnd)
        for i, ctx in enumerate(ctxs):
            content = strat.payload(10 + i, rnd, "train")
            content["config"] = strat.round_config(rnd, "train")  # with the noise the server declares
            sent[(rnd, i)] = content
            client = cls(ctx, settings)
            client.begin(content)
            reply = private_reply(client, client.train(content), content)
            left[(rnd, i)] = record_to_numpy(reply.array_records["arrays"])
            u = strat.gate.check(rnd, 10 + i, reply, "train", set())
            assert u is not None, strat.failures
            ups.append(u)
        strat.history[-1].extra.update(strat.aggregate(rnd, ups))
        strat.on_round_end(rnd)
    assert not strat.failures
    for i in range(3):
        own_next = {k: v[0] for k, v in record_to_numpy(sent[(2, i)].array_records["peers"]).items()}
        for k, v in left[(1, i)].items():
            np.testing.assert_array_equal(own_next[k], v, err_msg=k)
        for k, v in integers.items():
            np.testing.assert_array_equal(own_next[k], v, err_msg=k)
        assert sorted(sent[(2, i)]["peer-clients"]) == ["client-ids"]
    dp = [h.extra["dp"] for h in strat.history]
    assert [d["releases"] for d in dp] == [1, 2] and [d["clients"] for d in dp] == [3, 3]
    assert [d["epsilon"] for d in dp] == pytest.approx([local_epsilon(0.5, r, 1e-5) for r in (1, 2)])
    assert all(d["noise-std"] == pytest.approx(0.5 * 0.1) for d in dp)


def test_under_local_dp_the_servers_models_are_the_releases_it_forwards_and_without_dp_none():
    """What a peer receives of a client is its latest release: under local DP the server saves those as its own
    models (``client-<id>``), which an audit of the releases reads; without DP the clients' models are theirs."""
    for mode in ("local", "off"):
        s = strategy("fedc2i", **{"dp-mode": mode, "min-nodes": 3})
        drive(s, {41: 0, 42: 1, 43: 2}, 1)
        models = s.server_models()
        if mode == "off":
            assert models == {}
            continue
        assert sorted(models) == ["client-0", "client-1", "client-2"]
        for c in range(3):
            assert all(np.array_equal(models[f"client-{c}"][k], v) for k, v in s.store[c].items())


def test_every_clients_epsilon_composes_its_releases_round_by_round():
    run: dict[str, UserConfigValue] = {"dp-mode": "local", "dp-noise-multiplier": 0.8, "dp-clip": 0.5, "dp-delta": 1e-6}
    s = strategy("fedc2i", **run)
    for r in range(1, 5):
        s.history.append(RoundLog(r))
        s.privacy.before_round(s, r, 3)
        s.privacy.journal_local(s, r)
        s.history[-1].extra["dp"] = s.privacy.account_local(3 if r != 2 else 0)
    dp = [h.extra["dp"] for h in s.history]
    assert [d["releases"] for d in dp] == [1, 2, 3, 4]  # round 2's replies were all rejected: it counts all the same
    assert [d["clients"] for d in dp] == [3, 0, 3, 3]
    assert [d["epsilon"] for d in dp] == pytest.approx([local_epsilon(0.8, r, 1e-6) for r in (1, 2, 3, 4)])
    assert all(d["noise-std"] == pytest.approx(0.8 * 0.5) and d["delta"] == 1e-6 for d in dp)
    # what rounds.json says of a round: its mode and the neighbouring relation the epsilon is for, by name
    assert sorted(dp[0]) == [
        *("accountant", "charged", "clients", "delta", "epsilon", "epsilon-pld", "epsilon-rdp", "mode"),
        *("neighbours", "noise-multiplier", "noise-std", "releases"),
    ]
    assert all(d["accountant"] == "pld" and d["epsilon-pld"] < d["epsilon-rdp"] for d in dp)
    assert (dp[0]["mode"], dp[0]["neighbours"]) == ("local", "replace-one-data-set")


def test_running_variances_leave_at_zero_or_above_however_large_the_noise():
    """Noise far larger than a variance would make about half of them negative; they are cut at 0 (everything else
    keeps its noise, negative values included)."""
    out, _ = release(make_client(**{"dp-clip": 1.0, "dp-noise-multiplier": 20.0}), message(received(make_client())))
    variances = [k for k in out if k.endswith("running_var")]
    others = np.concatenate([out[k].ravel() for k in out if k not in variances])
    assert variances and all((out[k] >= 0).all() for k in variances)
    assert any((out[k] == 0).any() for k in variances)  # cut, not redrawn or shifted
    assert (others < 0).mean() > 0.3


@pytest.mark.parametrize("mode", ["off", "central", "local"])
def test_the_clientapps_privacy_step_follows_the_runs_dp_mode(mode):
    """The same train reply of a FedAvg-style message (``arrays``) under each mode: off leaves it as it is (integer
    buffers included); central clips it around the message's model without noise; local would need the method's
    release reference, which a method without local DP does not name."""
    rng = np.random.default_rng(0)
    sent = {"w": rng.normal(size=(40, 25)).astype(np.float32), "bn.num_batches_tracked": np.array(3)}
    trained = {"w": sent["w"] + 0.2, "bn.num_batches_tracked": np.array(9)}  # change of norm ~6.3
    declared = {"dp-noise-multiplier": 1.0, "dp-clip": 0.4}  # what the server declares
    content = RecordDict({"arrays": to_record(sent), "config": ConfigRecord({"server-round": 1, **declared})})
    method = SimpleNamespace(
        settings=parse_settings({"method": "fedavg", "dp-mode": "off", "dp-clip": 0.4}),
        context=SimpleNamespace(node_config={}),  # a node without a privacy floor of its own
    )
    method.settings = dataclasses.replace(method.settings, dp_mode=mode)
    method.release_reference = lambda content: (_ for _ in ()).throw(NotImplementedError("no reference"))
    reply = RecordDict({"arrays": to_record(trained)})
    if mode == "local":
        with pytest.raises(NotImplementedError, match="no reference"):
            private_reply(method, reply, content)
        return
    out = record_to_numpy(private_reply(method, reply, content).array_records["arrays"])
    if mode == "off":
        assert sorted(out) == sorted(trained) and all(np.array_equal(out[k], trained[k]) for k in trained)
    else:
        assert sorted(out) == ["w"]
        np.testing.assert_allclose(out["w"] - sent["w"], np.full_like(sent["w"], 0.4 / math.sqrt(1000)), rtol=1e-3)


# ---------------------------------------------------------------------------------------------- what stays home
def test_the_client_evaluates_and_mixes_what_it_trained_not_its_noised_release():
    """Under local DP only the release leaves: the client keeps what it trained, evaluates that as its personalized
    model (not the release the server sends back), and starts its next mixing from it.  With noise of std 5 the
    release is far from the trained model, so a client that used the release would be caught."""
    client = make_client(**{"dp-noise-multiplier": 5.0, "dp-clip": 1.0})
    states = received(client, k=1)
    first = message(states, 1)
    client.begin(first)
    reply = client.train(first)
    trained = record_to_numpy(reply.array_records["arrays"])
    out = record_to_numpy(private_reply(client, reply, declare(client, first)).array_records["arrays"])
    assert max(float(np.abs(out[k] - trained[k]).max()) for k in floating(out)) > 1.0  # the release is noised
    evaluate = RecordDict({"arrays": to_record(out), "config": ConfigRecord({"server-round": 1})})
    client.begin(evaluate)
    personal = {k: v.detach().numpy() for k, v in client.personal_model(evaluate).state_dict().items()}
    for k, v in trained.items():
        np.testing.assert_allclose(personal[k], v, rtol=1e-6, atol=1e-7, err_msg=k)
    # round 2, no local training: the model it replies is what it started from - its own, which must be the trained
    # model and not the release that came back first in 'peers'
    again = make_client(client.context, **{"dp-noise-multiplier": 5.0, "dp-clip": 1.0, "local-epochs": 0})
    second = message([{**states[0], **out}], 2)
    again.begin(second)
    start = record_to_numpy(again.train(second).array_records["arrays"])
    for k in floating(trained):
        np.testing.assert_allclose(start[k], trained[k], rtol=1e-6, atol=1e-7, err_msg=k)


def test_without_local_dp_nothing_is_kept_and_the_evaluated_model_is_the_one_the_server_sent():
    client = make_client(**{"dp-mode": "off"})
    content = message(received(client, k=1), 1)
    client.begin(content)
    client.train(content)
    assert "model" not in client.context.state.array_records
    sent = received(client, k=1, seed=3)[0]
    evaluate = RecordDict({"arrays": to_record(sent), "config": ConfigRecord({"server-round": 1})})
    client.begin(evaluate)
    personal = client.personal_model(evaluate).state_dict()
    for k, v in sent.items():
        np.testing.assert_allclose(personal[k].numpy(), v, err_msg=k)

"""What Client2Vec's server must do before round one and for late joiners (client2vec.md §2.5, §2.9): train
the DSA-IGN on the clients' uploads (Global) or by FedAvg over their local updates (Federated), send it for the
index, collect and check every index reply, index late joiners with the trained network, and log and time it."""

import logging
from contextlib import contextmanager

import numpy as np
import pytest
import torch

from task.dsa_ign import build_ign, train_dsa_ign
from task.params import to_record
from tests.client2vec.server_kit import (
    NODES,
    Recorder,
    arrays,
    assert_state_close,
    assert_state_equal,
    c2v,
    sent,
)
from tests.strategy_harness import drive, strategy, with_metrics


def ign_state(net):
    return {k: v.numpy() for k, v in net.state_dict().items()}


@contextmanager
def pflower_log():
    """The strategy's log lines (logger flwr.pflower), whatever Flower's handlers do with them."""
    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    logger, handler = logging.getLogger("flwr.pflower"), Keep()
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_global_dsa_ign_is_trained_on_every_upload_pooled_in_client_order_and_sent_for_the_index():
    """client2vec.md §2.5 Global: every client uploads one batch of (D, L) pairs, the server pools them and trains
    DSA-IGN for c2v-ign-epochs epochs with the configured batch size, learning rate and orthogonality loss (and the
    run's seed), the pool in client-id order so that Flower's node ids do not matter; then every client gets that
    network to compute its index with (client2vec.md §2.9, phase 2)."""
    strat = c2v(**{"c2v-ign-epochs": 3, "c2v-ign-batch": 5, "c2v-ign-lr": 0.01, "c2v-orth-mode": "literal", "seed": 3})
    rec = Recorder()
    grid = drive(strat, NODES, 1, rec)
    assert sorted(m.metadata.dst_node_id for m in sent(grid, "c2v_embed")) == sorted(NODES)
    uploads = rec.by_client("c2v_embed")
    D = np.concatenate([arrays(u)["D"] for u in uploads])
    L = np.concatenate([arrays(u)["L"] for u in uploads])
    assert len(D) > 5  # more than one batch per epoch: the batch size and the shuffling seed matter
    reference = build_ign(strat.opts.ign, 3)
    history = train_dsa_ign(reference, D, L, epochs=3, batch_size=5, lr=0.01, seed=3, orth_mode="literal")
    assert strat.ign_history == history
    assert_state_equal(ign_state(strat.ign), ign_state(reference))
    index_messages = sent(grid, "c2v_index")
    assert sorted(m.metadata.dst_node_id for m in index_messages) == sorted(NODES)
    for m in index_messages:
        assert_state_equal(arrays(m.content, "ign"), ign_state(reference))


@pytest.mark.parametrize("epochs, logged", [(11, [2, 4, 6, 8, 10, 11]), (3, [1, 2, 3])])
def test_global_dsa_ign_training_reports_its_losses_every_fifth_of_the_epochs_and_at_the_end(epochs, logged):
    """The run's log says what the index phase trains on and shows the DSA-IGN losses (client2vec.md §2.4 terms) every
    fifth of the epochs (every epoch when there are fewer than ten) and after the last one."""
    strat = c2v(**{"c2v-ign-epochs": epochs})
    rec = Recorder()
    with pflower_log() as lines:
        drive(strat, NODES, 1, rec)
    pairs = sum(len(arrays(u)["D"]) for u in rec.by_client("c2v_embed"))
    assert f"[client2vec] training DSA-IGN on {pairs} pooled pairs from 6 nodes for {epochs} epochs" in lines
    expected = [
        f"[client2vec] DSA-IGN epoch {e}/{epochs}: loss {h['total']:.4f} (div {h['div']:.3f} sim {h['sim']:.3f} "
        f"orth {h['orth']:.3f} recon {h['recon']:.4f})"
        for e, h in enumerate(strat.ign_history, 1)
        if e in logged
    ]
    assert [line for line in lines if "DSA-IGN epoch" in line] == expected
    phase = [line for line in lines if "index phase" in line]
    assert len(phase) == 1 and phase[0].startswith("[client2vec] index phase: 6 nodes asked, 6 clients indexed in ")
    assert phase[0].endswith(f"{strat.index_seconds:.1f} s")


def test_the_index_phase_time_is_recorded_in_the_round_that_ran_it(monkeypatch):
    """Artefacts: the index phase's seconds go into client2vec.json and the round log of the round that ran it;
    training the DSA-IGN on the server is server time (rounds.json's server-seconds)."""
    import time

    import strategies.client2vec as module

    def slow_training(*args, **kwargs):
        time.sleep(0.3)
        return train_dsa_ign(*args, **kwargs)

    monkeypatch.setattr(module, "train_dsa_ign", slow_training)
    strat = c2v()
    start = time.perf_counter()
    drive(strat, NODES, 2)
    elapsed = time.perf_counter() - start
    assert 0.3 < strat.index_seconds < elapsed
    assert 0.3 < strat.history[0].extra["server-seconds"] < elapsed
    assert strat.history[0].extra["index-seconds"] == strat.index_seconds
    assert "index-seconds" not in strat.history[1].extra  # everyone is indexed: no index phase in round 2


def test_without_any_upload_the_dsa_ign_cannot_be_trained():
    strat = c2v()
    silent = Recorder(lambda r, n, phase, c: [] if phase == "c2v_embed" else None)
    with pytest.raises(RuntimeError, match=r"^no node uploaded usable embeddings; the DSA-IGN cannot be trained$"):
        drive(strat, NODES, 1, silent)


def test_without_any_index_reply_the_run_stops_before_round_one():
    strat = c2v()
    silent = Recorder(lambda r, n, phase, c: [] if phase == "c2v_index" else None)
    with pytest.raises(RuntimeError, match=r"^no node returned a usable client index; see failures.json$"):
        drive(strat, NODES, 1, silent)
    assert strat.c2v is None and strat.index_clients == []


def test_with_zero_dsa_ign_epochs_the_untrained_network_computes_the_index():
    """c2v-ign-epochs = 0: no DSA-IGN training (no upload asked for), the index comes from the initial network;
    one epoch already trains it."""
    strat = c2v(**{"c2v-ign-epochs": 0, "seed": 2})
    grid = drive(strat, NODES, 1)
    assert sent(grid, "c2v_embed") == [] and strat.ign_history == []
    for m in sent(grid, "c2v_index"):
        assert_state_equal(arrays(m.content, "ign"), ign_state(build_ign(strat.opts.ign, 2)))
    assert strat.c2v.size == 6
    once = c2v(**{"c2v-ign-epochs": 1})
    drive(once, NODES, 1)
    assert len(once.ign_history) == 1


def test_federated_dsa_ign_is_fedavg_over_a_fraction_of_the_nodes_for_each_of_its_rounds():
    """client2vec.md §2.5 Federated: for c2v-ign-epochs rounds, c2v-ign-fraction of the nodes get the current DSA-IGN
    (``ign``), train it locally, and the server averages their networks weighted by N_i; a round nobody answers
    leaves the network as it was.  The index is computed with the final network."""
    rounds = 3
    strat = c2v(**{"c2v-ign-mode": "federated", "c2v-ign-epochs": rounds, "c2v-ign-fraction": 0.5, "seed": 1})
    asked = []

    def answer(server_round, node, phase, content):
        if phase != "c2v_ign":
            return None
        asked.append(node)
        if len(asked) <= 3:
            return []  # every node of the first DSA-IGN round is silent
        return [with_metrics(content, num_examples=(NODES[node] + 1) ** 2)]

    rec = Recorder(answer)
    with pflower_log() as lines:
        grid = drive(strat, NODES, 1, rec)
    messages = sent(grid, "c2v_ign")
    assert len(messages) == 3 * rounds  # round(0.5 * 6) nodes per round
    replies = [c for _, _, c in rec.replies["c2v_ign"]]
    current = ign_state(build_ign(strat.opts.ign, 1))
    losses = []
    for r in range(rounds):
        batch = messages[3 * r : 3 * r + 3]
        assert len({m.metadata.dst_node_id for m in batch}) == 3
        for m in batch:  # this round's network: the initial one, then the average of the last answered round
            assert_state_close(arrays(m.content, "ign"), current)
        if r == 0:
            continue
        got = replies[3 * (r - 1) : 3 * r]
        n = np.array([int(c["metrics"]["num-examples"]) for c in got], dtype=float)
        current = {
            k: sum(w * arrays(c)[k].astype(np.float64) for w, c in zip(n / n.sum(), got, strict=True)).astype(
                np.float32
            )
            for k in current
        }
        losses.append(float(np.mean([c["metrics"]["ign-loss"] for c in got])))
    final = ign_state(strat.ign)
    assert_state_close(final, current)
    assert strat.ign_history == [{"total": pytest.approx(x)} for x in losses]
    for m in sent(grid, "c2v_index"):
        assert_state_equal(arrays(m.content, "ign"), final)
    progress = [line for line in lines if "federated DSA-IGN round" in line]
    assert progress[0] == f"[client2vec] federated DSA-IGN round 1/{rounds}: 0/3 replies, mean local loss nan"
    assert progress[1:] == [
        f"[client2vec] federated DSA-IGN round {r}/{rounds}: 3/3 replies, mean local loss {x:.4f}"
        for r, x in zip(range(2, rounds + 1), losses, strict=False)
    ]


def test_only_federated_dsa_ign_needs_the_client_ids_before_a_full_participation_round():
    """Federated DSA-IGN draws c2v-ign-fraction of the nodes in client-id order before any index exists, so the
    nodes are identified first even when every node trains; Global mode (or the base algorithm alone) does not."""
    nodes = list(NODES)
    assert c2v(**{"c2v-ign-mode": "federated"}).wants_client_ids(1, nodes)
    assert not c2v(**{"c2v-ign-mode": "global"}).wants_client_ids(1, nodes)
    off = {"c2v-sampling": False, "c2v-aggregation": False, "c2v-local": False}
    assert not c2v(**{"c2v-ign-mode": "federated", **off}).wants_client_ids(1, nodes)
    assert c2v(**{"c2v-ign-mode": "global", "fraction-train": 0.5}).wants_client_ids(1, nodes)  # the base rule stays


def test_late_joiners_are_indexed_with_the_trained_network_and_appended_to_the_registry():
    """client2vec.md §2.9 / docs: nodes connecting after the index phase are indexed when they first appear (the DSA-IGN
    is not trained again); their rows come after the others', with no history term."""
    first = {12: 0, 4: 1, 60: 2, 9001: 3}
    strat = c2v(**{"min-nodes": 4, "fraction-train": 0.5})
    rec = Recorder()
    drive(strat, first, [1, 2], rec)
    trained, index_seconds = ign_state(strat.ign), strat.index_seconds
    assert strat.index_clients == [0, 1, 2, 3]
    grid = drive(strat, NODES, [3], rec)
    assert sent(grid, "c2v_embed") == []
    asked = sent(grid, "c2v_index")
    assert sorted(m.metadata.dst_node_id for m in asked) == [55, 777]
    for m in asked:
        assert_state_equal(arrays(m.content, "ign"), trained)
    assert strat.index_clients == [0, 1, 2, 3, 4, 5] and strat.c2v.size == 6
    late = [c for c in rec.by_client("c2v_index") if int(c["metrics"]["partition-id"]) >= 4]
    np.testing.assert_array_equal(strat.c2v.beta_f[4:], np.stack([arrays(c)["beta_f"] for c in late]))
    np.testing.assert_array_equal(strat.c2v.beta_l[4:], np.stack([arrays(c)["beta_l"] for c in late]))
    assert strat.c2v.n[4:].tolist() == [float(c["metrics"]["num-examples"]) for c in late]
    assert strat.history[2].extra["index-seconds"] == pytest.approx(strat.index_seconds - index_seconds)
    assert len(strat.cohorts[3]) == 3  # round(0.5 * 6): the late joiners count


def upload(rows_d, rows_l, pid, width=512):
    from flwr.app import MetricRecord, RecordDict

    return RecordDict(
        {
            "metrics": MetricRecord({"num-examples": 10, "partition-id": pid}),
            "arrays": to_record({"D": np.ones((rows_d, width), np.float32), "L": np.ones((rows_l, width), np.float32)}),
        }
    )


def test_an_embedding_upload_holds_one_to_c2v_ign_upload_pairs_with_as_many_labels_as_images():
    """client2vec.md §2.5 / §2.9 phase 1G: a client uploads at most c2v-ign-upload (D, L) pairs of CLIP width, the same
    number of each (a client with fewer samples uploads fewer); anything else is rejected with its reason."""
    strat = c2v(**{"c2v-ign-upload": 4})
    for nid, rows in ((1, 1), (2, 4)):
        reply = strat.gate.check(1, nid, upload(rows, rows, nid), "c2v_embed", set())
        assert reply is not None and reply.records["arrays"]["D"].shape == reply.records["arrays"]["L"].shape == (
            rows,
            512,
        )
    for nid, content in ((3, upload(5, 5, 3)), (4, upload(0, 0, 4)), (5, upload(2, 2, 5, width=511))):
        assert strat.gate.check(1, nid, content, "c2v_embed", set()) is None
    assert strat.gate.check(1, 6, upload(3, 2, 6), "c2v_embed", set()) is None
    assert strat.failures[-1]["reason"] == "uploaded 3 image but 2 label embeddings"
    assert strat.gate.check(1, 7, upload(2, 3, 7), "c2v_embed", set()) is None
    assert strat.failures[-1]["reason"] == "uploaded 2 image but 3 label embeddings"


def test_a_federated_dsa_ign_reply_is_the_whole_network_and_its_local_loss():
    """client2vec.md §2.9 phase 1F: the reply carries every DSA-IGN parameter (shapes of the server's network) and the
    local loss (``ign-loss``, any finite value within the loss limit: the total DSA-IGN loss may be negative)."""
    from flwr.app import MetricRecord, RecordDict

    from strategies.replies import LOSS_LIMIT

    strat = c2v(**{"c2v-ign-mode": "federated"})
    state = ign_state(strat.ign)

    def reply(pid, loss, net=state):
        metrics = {"num-examples": 10, "partition-id": pid}
        if loss is not None:
            metrics["ign-loss"] = loss
        return RecordDict({"metrics": MetricRecord(metrics), "arrays": to_record(net)})

    good = strat.gate.check(1, 1, reply(1, -LOSS_LIMIT), "c2v_ign", set())
    assert good is not None and good.metrics["ign-loss"] == -LOSS_LIMIT
    assert_state_equal(good.arrays, state)
    assert strat.gate.check(1, 2, reply(2, LOSS_LIMIT), "c2v_ign", set()) is not None
    for nid, content in (
        (3, reply(3, None)),
        (4, reply(4, 2 * LOSS_LIMIT)),
        (5, reply(5, -2 * LOSS_LIMIT)),
        (6, reply(6, 1.0, dict(list(state.items())[1:]))),
    ):
        assert strat.gate.check(1, nid, content, "c2v_ign", set()) is None
    assert "ign-loss" in strat.failures[0]["reason"]


@pytest.mark.parametrize("threads", [1, 3])
def test_global_dsa_ign_trains_with_the_configured_torch_threads_and_restores_the_count(monkeypatch, threads):
    """c2v-ign-threads: the server's DSA-IGN training runs with that many torch threads (two threads burnt 9-10x the
    CPU of one per step on a loaded 2-core machine; docs/methods/client2vec.md), and the server's count is restored."""
    import strategies.client2vec as module

    seen, real = [], module.train_dsa_ign

    def spy(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return real(*args, **kwargs)

    monkeypatch.setattr(module, "train_dsa_ign", spy)
    before = torch.get_num_threads()
    drive(c2v(**{"c2v-ign-threads": threads}), NODES, 1, Recorder())
    assert seen == [threads] and torch.get_num_threads() == before


def test_strategy_rejects_bad_index_replies_with_a_reason():
    from flwr.app import MetricRecord, RecordDict

    from task.params import to_record

    strat = strategy("client2vec", model="mlp")
    bad_shape = RecordDict(
        {
            "metrics": MetricRecord({"num-examples": 10, "partition-id": 0}),
            "arrays": to_record({"beta_f": np.zeros(7, np.float32), "beta_l": np.zeros(512, np.float32)}),
        }
    )
    nan = RecordDict(
        {
            "metrics": MetricRecord({"num-examples": 10, "partition-id": 1}),
            "arrays": to_record({"beta_f": np.full(512, np.nan, np.float32), "beta_l": np.zeros(512, np.float32)}),
        }
    )
    no_n = RecordDict(
        {
            "metrics": MetricRecord({"partition-id": 2}),
            "arrays": to_record({"beta_f": np.zeros(512, np.float32), "beta_l": np.zeros(512, np.float32)}),
        }
    )
    for nid, content in ((1, bad_shape), (2, nan), (3, no_n)):
        assert strat.gate.check(1, nid, content, "c2v_index", set()) is None
    reasons = [f["reason"] for f in strat.failures]
    assert "'beta_f' has shape (7,)" in reasons[0] and "non-finite" in reasons[1] and "num-examples" in reasons[2]
    assert strat.client_of == {}  # nothing of a rejected reply is kept

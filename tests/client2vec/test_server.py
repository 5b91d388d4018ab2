"""What Client2Vec's server must do with the index each round (client2vec.md §2.6, §2.7, §8), through
its own round loop (tests/strategy_harness.py) with every reply recorded, so that each expectation is computed here
from what the clients sent: Eq. 1 cohorts and Eq. 3 aggregation on the collected index, the connected clients only,
the paired arms, and the same draws whatever Flower's node ids.  The math alone is in test_sampling_and_weights.py,
the index phase in test_index_phase.py, the artefacts in test_artifacts.py."""

import copy

import numpy as np
import pytest

from strategies.base import Reply
from strategies.client2vec_math import (
    C2VServerState,
    aggregation_weights,
)
from task.params import to_record
from tests.client2vec.server_kit import (
    ARMS_OFF,
    NODES,
    Recorder,
    arrays,
    assert_state_close,
    assert_state_equal,
    c2v,
    cos_loop,
    sent,
)
from tests.strategy_harness import drive, phase_of, strategy, with_metrics


def test_cohorts_and_aggregation_weights_follow_eq1_and_eq3_on_the_collected_index():
    """client2vec.md §2.2/§2.9: the registry holds every client's (beta_f, beta_l, N_i) in client-id order; and
    §2.6: each round's cohort is drawn by Eq. 1 from it (c2v-tau, the run's seed, round(fraction-train * M)
    clients); and §2.7: H <- gamma H + S(., C^t) over the round's participants and the new global model is the
    Eq. 3 average p_i = q_i exp(H_i / lambda1) / sum_j q_j exp(H_j / lambda1) with q from the registry's N_i.
    Train messages carry every client's beta_f (B_f) and c2v-local; evaluate messages neither."""
    tau, gamma, lam, seed, rounds = 0.2, 0.3, 2.0, 4, 4
    # K = round(0.34 * 6) = 2 of M = 6, W = 6 // 4 = 1: four eligible clients for two places, so tau matters
    strat = c2v(**{"fraction-train": 0.34, "c2v-tau": tau, "c2v-gamma": gamma, "c2v-lambda1": lam, "seed": seed})
    n_index = {c: 5 * (c + 1) ** 2 for c in range(6)}  # the registry's N_i, unlike the train replies' counts
    # two groups of three clients with nearly parallel indices (random 512-d vectors would all be near-orthogonal,
    # S ~ 0 for everyone, and tau could not change a draw)
    rng = np.random.default_rng(7)
    centres = rng.normal(size=(2, 2, 512))
    index_rows = {
        c: {
            "beta_f": centres[c % 2, 0] + 0.3 * rng.normal(size=512),
            "beta_l": centres[c % 2, 1] + 0.3 * rng.normal(size=512),
        }
        for c in range(6)
    }

    def structured(c):
        out = with_metrics(c, num_examples=n_index[int(c["metrics"]["partition-id"])])
        out["arrays"] = to_record(
            {k: v.astype(np.float32) for k, v in index_rows[int(c["metrics"]["partition-id"])].items()}
        )
        return out

    rec = Recorder(lambda r, node, phase, c: [structured(c)] if phase == "c2v_index" else None)
    grid = drive(strat, NODES, rounds, rec)

    index = rec.by_client("c2v_index")
    bf = np.stack([arrays(c)["beta_f"] for c in index]).astype(np.float64)
    bl = np.stack([arrays(c)["beta_l"] for c in index]).astype(np.float64)
    n = np.array([n_index[c] for c in range(6)], dtype=float)
    assert strat.index_clients == list(range(6))
    np.testing.assert_array_equal(strat.c2v.beta_f, bf)
    np.testing.assert_array_equal(strat.c2v.beta_l, bl)
    np.testing.assert_array_equal(strat.c2v.n, n)

    draws = C2VServerState(bf, bl, n, tau=tau, gamma=gamma, lambda1=lam, seed=seed)

    def cohorts(t_):
        state = C2VServerState(bf, bl, n, tau=t_, gamma=gamma, lambda1=lam, seed=seed)
        drawn = []
        for t in range(1, rounds + 1):
            cohort = state.sample(t, 2, use_index=True)
            state.observe(cohort)
            drawn.append(cohort.tolist())
        return drawn

    assert cohorts(tau) != cohorts(1.0), "the setting must make tau change the cohorts"
    H = np.zeros(6)
    model = {k: np.array(v) for k, v in strat.initial_state.items()}
    for t in range(1, rounds + 1):
        rows = draws.sample(t, 2, use_index=True)
        draws.observe(rows)
        assert strat.cohorts[t] == rows.tolist()
        train = sent(grid, "train", t)
        assert sorted(m.metadata.dst_node_id for m in train) == sorted(strat.node_of[c] for c in rows)
        for m in train:
            assert_state_close(arrays(m.content), model)  # the global model of the previous round
            b_f = arrays(m.content, "c2v")["B_f"]  # float32 on the wire (client2vec.md §2.9: 120 KB for M = 60)
            assert b_f.dtype == np.float32
            np.testing.assert_array_equal(b_f, bf.astype(np.float32))
            assert m.content["config"]["c2v-local"] is True
        for m in sent(grid, "evaluate", t):
            assert set(m.content.keys()) == {"arrays", "config"} and m.content["config"]["c2v-local"] is False
        S = np.array(
            [
                sum(n[j] * (cos_loop(bf[i], bf[j]) + cos_loop(bl[i], bl[j])) for j in rows) / (2 * n[rows].sum())
                for i in range(6)
            ]
        )
        H = gamma * H + S
        p = n[rows] / n[rows].sum() * np.exp(H[rows] / lam)
        p /= p.sum()
        assert strat.agg_weights[t] == pytest.approx(dict(zip(rows.tolist(), p, strict=False)))
        assert strat.history[t - 1].extra["c2v-weights"] == strat.agg_weights[t]
        updates = rec.by_client("train", t)
        assert [int(c["metrics"]["partition-id"]) for c in updates] == rows.tolist()
        model = {k: sum(w * arrays(c)[k].astype(np.float64) for w, c in zip(p, updates, strict=False)) for k in model}
    assert_state_close(strat.global_state, model)

    # a strategy restored from this one's checkpointed state goes on under the same c2v-tau, c2v-gamma, c2v-lambda1
    restored = c2v(**{"fraction-train": 0.34, "c2v-tau": tau, "c2v-gamma": gamma, "c2v-lambda1": lam, "seed": seed})
    restored.restore(copy.deepcopy(strat.state()))
    going_on, resumed = strat.c2v, restored.c2v
    np.testing.assert_array_equal(resumed.probabilities(rounds + 1), going_on.probabilities(rounds + 1))
    rows = going_on.sample(rounds + 1, 2, use_index=True)
    np.testing.assert_array_equal(resumed.sample(rounds + 1, 2, use_index=True), rows)
    going_on.observe(rows)
    resumed.observe(rows)
    np.testing.assert_array_equal(resumed.H, going_on.H)
    np.testing.assert_array_equal(resumed.weights(rows, use_index=True), going_on.weights(rows, use_index=True))


def test_the_cohort_is_drawn_among_the_connected_clients_only_and_sized_by_them():
    """client2vec.md §2.6 with dropouts: a client whose node is gone cannot be drawn, and K = round(fraction *
    connected)."""
    strat = c2v(**{"fraction-train": 0.5, "min-nodes": 5})
    drive(strat, NODES, [1])
    gone = {k: v for k, v in NODES.items() if v != 1}
    for t in (2, 3, 4):
        drive(strat, gone, [t])
        assert 1 not in strat.cohorts[t] and len(strat.cohorts[t]) == 2  # round(2.5) = 2
    everyone = c2v(**{"min-nodes": 5})  # full participation: exactly the connected clients, every round
    drive(everyone, NODES, [1])
    for t in (2, 3, 4):
        drive(everyone, gone, [t])
        assert everyone.cohorts[t] == [0, 2, 3, 4, 5]


def test_arms_without_index_sampling_draw_the_same_uniform_cohorts_and_the_plain_arm_is_fedavg():
    """client2vec.md §8 (paired arms): every arm without (i) draws the same clients per seed as the base algorithm
    alone; with every case study off there is no index phase, no B_f, and aggregation is FedAvg (weights N_i)."""
    cohorts = {}
    for name, cfg in {
        "plain": ARMS_OFF,
        "+ii": {"c2v-sampling": False, "c2v-local": False},
        "+iii": {"c2v-sampling": False, "c2v-aggregation": False},
    }.items():
        strat = c2v(**{"fraction-train": 0.5, "seed": 7, **cfg})
        rec = Recorder()
        grid = drive(strat, NODES, 4, rec)
        cohorts[name] = strat.cohorts
        for t, c in strat.cohorts.items():
            assert len(c) == 3 and len(set(c)) == 3
            assert sorted(m.metadata.dst_node_id for m in sent(grid, "train", t)) == sorted(strat.node_of[x] for x in c)
        if name != "+iii":  # without (iii) no B_f goes out and clients add no local loss
            assert all(
                "c2v" not in m.content and m.content["config"]["c2v-local"] is False for m in sent(grid, "train")
            )
        if name == "plain":
            assert not [m for m in grid.sent if phase_of(m).startswith("c2v")] and strat.c2v is None
            updates = rec.by_client("train", 4)
            n = np.array([int(c["metrics"]["num-examples"]) for c in updates], dtype=float)
            expected = {
                k: sum(w * arrays(c)[k].astype(np.float64) for w, c in zip(n / n.sum(), updates, strict=False))
                for k in strat.global_state
            }
            assert_state_close(strat.global_state, expected)
            assert strat.agg_weights == {} and "c2v-weights" not in strat.history[-1].extra
    assert cohorts["plain"] == cohorts["+ii"] == cohorts["+iii"]
    assert len({tuple(c) for c in cohorts["plain"].values()}) > 1  # drawn anew every round


def test_a_node_never_identified_is_recorded_as_client_minus_one_in_the_plain_arms_cohorts():
    """client2vec.json's cohorts name clients by partition id; in the plain arm with full participation round 1
    is sent before any node said who it is, recorded as -1."""
    strat = c2v(**ARMS_OFF)
    drive(strat, NODES, 2)
    assert strat.cohorts[1] == [-1] * 6 and strat.cohorts[2] == list(range(6))


def test_aggregation_ignores_updates_of_clients_without_an_index():
    """client2vec.md §2.7: Eq. 3 needs S(beta_i, .) of every participant; an update of a client that has no index (it
    joined after this round's index phase) is left out, and a round with only such updates changes nothing."""
    strat = c2v(**{"fraction-train": 0.5})
    drive(strat, NODES, 1)
    H, before = strat.c2v.H.copy(), {k: v.copy() for k, v in strat.global_state.items()}
    rng = np.random.default_rng(0)

    def update(node, client, n):
        return Reply(
            node,
            client,
            n,
            {},
            {"arrays": {k: rng.standard_normal(v.shape).astype(v.dtype) for k, v in before.items()}},
        )

    assert strat.aggregate(2, [update(31, 17, 40)]) == {}
    np.testing.assert_array_equal(strat.c2v.H, H)
    assert_state_equal(strat.global_state, before) and 2 not in strat.agg_weights
    known, stranger = update(12, 0, 10), update(31, 17, 40)
    extra = strat.aggregate(2, [known, stranger])
    assert extra == {"c2v-weights": {0: pytest.approx(1.0)}}
    assert_state_close(strat.global_state, known.arrays)


def test_strategy_aggregates_with_index_weights_and_carries_the_projection():
    from strategies.base import Reply

    strat = strategy("client2vec", model="mlp")
    assert any(k.startswith("c2v.") for k in strat.global_state)  # P and h_P are part of the shared state
    assert not any(
        k.startswith("c2v.") for k in strategy("client2vec", model="mlp", **{"c2v-local": False}).global_state
    )
    rng = np.random.default_rng(0)
    m = 5
    strat.c2v = C2VServerState(rng.standard_normal((m, 512)), rng.standard_normal((m, 512)), np.arange(1, m + 1) * 10.0)
    strat.index_clients = [0, 1, 2, 3, 4]
    strat.c2v.observe([0, 1])  # an earlier round
    updates = []
    for nid in (102, 104, 105):
        arrays = {k: rng.standard_normal(v.shape).astype(v.dtype) for k, v in strat.global_state.items()}
        updates.append(Reply(nid, nid - 101, 10 * (nid - 100), {}, {"arrays": arrays}))
    h_before = strat.c2v.H.copy()
    strat.aggregate(2, updates)
    rows = [1, 3, 4]
    h = 0.5 * h_before + strat.c2v.similarity(rows)
    expected_w = aggregation_weights(h[rows], strat.c2v.n[rows], 1.0)
    for k, v in strat.global_state.items():
        manual = sum(w * u.arrays[k].astype(np.float64) for w, u in zip(expected_w, updates, strict=False))
        np.testing.assert_allclose(v, manual, rtol=1e-5, atol=1e-6)
    assert strat.agg_weights[2] == pytest.approx(dict(zip([1, 3, 4], expected_w, strict=False)))


ARMS = {"FedAvg": (False, False, False), "+ii": (False, True, False), "+i+ii+iii": (True, True, True)}


def _cohorts_and_index(arm, nodes, rounds=4):
    from tests.strategy_harness import drive

    sampling, aggregation, local = ARMS[arm]
    strat = strategy(
        "client2vec",
        model="mlp",
        **{
            "min-nodes": len(nodes),
            "fraction-train": 0.5,
            "c2v-ign-epochs": 1,
            "c2v-ign-upload": 4,
            "c2v-sampling": sampling,
            "c2v-aggregation": aggregation,
            "c2v-local": local,
            "seed": 5,
        },
    )
    drive(strat, nodes, rounds)
    index = None if strat.c2v is None else (list(strat.index_clients), strat.c2v.beta_f.tobytes(), strat.ign_history)
    return strat.cohorts, index


def test_a_seed_draws_the_same_clients_whatever_flowers_node_ids():
    # Flower's simulated node ids are random per run: the same partitions behind other node ids must give the
    # same DSA-IGN, index and cohorts, and every arm without (i) must draw the FedAvg arm's clients
    first = {9001: 0, 12: 1, 777: 2, 4: 3, 55: 4, 60: 5}
    second = {3: 0, 80808: 1, 41: 2, 999: 3, 7: 4, 100: 5}
    cohorts_a, index_a = _cohorts_and_index("+ii", first)
    cohorts_b, index_b = _cohorts_and_index("+ii", second)
    assert cohorts_a == cohorts_b and index_a == index_b
    assert index_a[0] == sorted(index_a[0])  # index rows in client-id order
    fedavg, _ = _cohorts_and_index("FedAvg", second)
    assert fedavg == cohorts_a  # paired: the same draws as the index arm without sampling
    full_a, index_full_a = _cohorts_and_index("+i+ii+iii", first)
    full_b, index_full_b = _cohorts_and_index("+i+ii+iii", second)
    assert full_a == full_b and index_full_a == index_full_b
    assert all(len(c) == 3 for c in cohorts_a.values())


@pytest.mark.parametrize("change", ["drop", "add"])
def test_a_checkpoint_whose_dsa_ign_lacks_or_adds_a_tensor_is_refused(change):
    """A resume restores the DSA-IGN that indexed the clients, all of it: a checkpoint missing one of its tensors
    (or holding one it does not have) is refused rather than resumed with that tensor freshly initialised."""
    state = c2v().state()
    ign = dict(state["ign"])
    key = min(ign)
    if change == "drop":
        del ign[key]
    else:
        ign["extra.weight"] = ign[key]
    with pytest.raises(ValueError, match="lacks 1 model keys" if change == "drop" else "not a parameter"):
        c2v().restore({**state, "ign": ign})

"""What Client2Vec's server must do (client2vec.md §2.6, §2.7): index similarity, Eq. 1 sampling with the
exclusion window, Eq. 3 aggregation weights, late joiners.  Expectations are computed here from the
formulas, with plain loops."""

import json
import logging
import math
import warnings
from contextlib import contextmanager

import numpy as np
import pytest
import torch
import torch._dynamo  # the DSA-IGN's first Adam imports it (seconds): once at collection, not per test

from strategies.base import Reply
from strategies.client2vec_artifacts import write_artifacts
from strategies.client2vec_math import (
    C2VServerState,
    aggregation_weights,
    blocked_clients,
    cosine_matrix,
    draw_cohort,
    eq2_objective,
    exclusion_window,
    sampling_probabilities,
    similarity_to_set,
)
from task.dsa_ign import build_ign, train_dsa_ign
from task.params import to_record
from tests.strategy_harness import drive, phase_of, with_metrics
from tests.strategy_harness import kept_figures as harness_kept_figures


def cos(a, b):
    na, nb = np.linalg.norm(a), np.linalg.norm(b)
    return float(a @ b / (na * nb)) if na and nb else 0.0


def test_cosine_matrix_of_rows_with_another_set_and_with_a_zero_row():
    a = np.array([[1.0, 0.0], [1.0, 1.0], [0.0, 0.0]])
    b = np.array([[0.0, 2.0], [-3.0, 0.0]])
    got = cosine_matrix(a, b)
    assert got.shape == (3, 2)
    for i in range(3):
        for j in range(2):
            assert got[i, j] == pytest.approx(cos(a[i], b[j]))
    square = cosine_matrix(a)
    assert np.isfinite(square).all() and square[2].tolist() == [0.0, 0.0, 0.0]
    assert square[1, 1] == pytest.approx(1.0)


def test_similarity_to_a_cohort_is_the_size_weighted_mean_of_both_halves():
    rng = np.random.default_rng(0)
    bf, bl = rng.normal(size=(5, 4)), rng.normal(size=(5, 4))
    n = np.array([10.0, 20.0, 30.0, 40.0, 50.0])
    cohort = [1, 3, 4]
    got = similarity_to_set(cosine_matrix(bf), cosine_matrix(bl), n, cohort)
    for i in range(5):
        expected = sum(n[j] * (cos(bf[i], bf[j]) + cos(bl[i], bl[j])) for j in cohort) / (2 * n[cohort].sum())
        assert got[i] == pytest.approx(expected)
    with pytest.raises(ValueError, match=r"^similarity to an empty cohort is undefined$"):
        similarity_to_set(cosine_matrix(bf), cosine_matrix(bl), n, [])
    for bad in (np.array([10.0, -1.0, 5.0, 1.0, 1.0]), np.zeros(5)):
        with pytest.raises(ValueError, match="sample counts"):
            similarity_to_set(cosine_matrix(bf), cosine_matrix(bl), bad, [0, 1])
    zero_weight = np.array([10.0, 0.0, 30.0, 40.0, 50.0])  # a zero count among positive ones is allowed
    assert np.isfinite(similarity_to_set(cosine_matrix(bf), cosine_matrix(bl), zero_weight, [0, 1])).all()


@pytest.mark.parametrize("m, k, w", [(100, 10, 5), (60, 6, 5), (10, 3, 1), (7, 4, 0), (10, 1, 5), (5, 0, 0)])
def test_exclusion_window_is_floor_m_over_twice_the_last_cohort(m, k, w):
    assert exclusion_window(m, k) == w


def test_blocked_are_the_clients_drawn_within_the_window_counting_last_round():
    last = np.array([-np.inf, 1.0, 3.0, 4.0, 5.0])
    assert blocked_clients(last, 6, 2).tolist() == [False, False, False, True, True]
    assert blocked_clients(last, 6, 0).tolist() == [False] * 5
    assert blocked_clients(last, 6, 5).tolist() == [False, True, True, True, True]


def test_sampling_probabilities_are_a_softmax_of_similarity_over_tau_without_the_blocked():
    s = np.array([0.2, -0.4, 0.9, 0.1])
    for tau in (0.3, 1.0, 4.0):
        e = np.exp(s / tau)
        np.testing.assert_allclose(sampling_probabilities(s, tau), e / e.sum())
        blocked = np.array([False, True, False, False])
        e[1] = 0.0
        np.testing.assert_allclose(sampling_probabilities(s, tau, blocked), e / e.sum())
    np.testing.assert_allclose(sampling_probabilities(s, 1.0, np.zeros(4, bool)), sampling_probabilities(s, 1.0))
    tiny = sampling_probabilities(np.array([1.0, 0.999, -1.0]), 1e-3)  # exp(1000): no overflow
    assert np.isfinite(tiny).all() and tiny.sum() == pytest.approx(1.0) and tiny[0] > tiny[1] > tiny[2]
    with pytest.raises(ValueError, match=r"^every client is blocked; nothing to sample$"):  # the whole reason
        sampling_probabilities(s, 1.0, np.ones(4, bool))
    for tau in (0.0, -1.0):
        with pytest.raises(ValueError, match="c2v-tau"):
            sampling_probabilities(s, tau)


def test_draw_cohort_draws_distinct_eligible_clients_sorted():
    rng = np.random.default_rng(0)
    p = np.array([0.0, 0.25, 0.25, 0.0, 0.25, 0.25])
    for _ in range(20):
        c = draw_cohort(rng, p, 3)
        assert c.tolist() == sorted(set(c.tolist())) and len(c) == 3 and set(c.tolist()) <= {1, 2, 4, 5}
    assert draw_cohort(rng, p, 4).tolist() == [1, 2, 4, 5]
    with pytest.raises(ValueError, match="cannot draw 5"):
        draw_cohort(rng, p, 5)


def test_aggregation_weights_are_q_times_exp_history_over_lambda1_normalised():
    h, n = np.array([0.5, -0.3, 0.9]), np.array([10.0, 30.0, 60.0])
    for lam in (0.2, 1.0, 3.0):
        raw = n / n.sum() * np.exp(h / lam)
        np.testing.assert_allclose(aggregation_weights(h, n, lam), raw / raw.sum())
    big = aggregation_weights(np.array([900.0, 899.0]), np.array([1.0, 1.0]), 1.0)  # exp(900): no overflow
    np.testing.assert_allclose(big, [1 / (1 + math.exp(-1)), 1 - 1 / (1 + math.exp(-1))])
    with pytest.raises(ValueError, match="c2v-lambda1"):
        aggregation_weights(h, n, 0.0)
    for bad in (np.array([10.0, 0.0, 5.0]), np.array([])):
        with pytest.raises(ValueError, match="positive sample counts"):
            aggregation_weights(h[: len(bad)], bad, 1.0)


def test_eq2_objective_is_reward_minus_lambda1_kl_and_zero_weights_cost_nothing():
    h, n, lam = np.array([0.5, -0.3, 0.9]), np.array([10.0, 30.0, 60.0]), 2.0
    q = n / n.sum()
    p = np.array([0.2, 0.0, 0.8])
    expected = p @ h - lam * sum(p[i] * math.log(p[i] / q[i]) for i in range(3) if p[i] > 0)
    assert eq2_objective(p, h, n, lam) == pytest.approx(expected)
    assert eq2_objective(q, np.zeros(3), n, lam) == pytest.approx(0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a zero weight is a normal input, not a 0 * log 0 warning
        assert math.isfinite(eq2_objective(p, h, n, lam))


# ------------------------------------------------------------------------------------------ server state
def state(m=8, seed=0, **kw):
    rng = np.random.default_rng(seed)
    return C2VServerState(
        rng.normal(size=(m, 6)), rng.normal(size=(m, 6)), rng.integers(5, 50, m).astype(float), seed=seed, **kw
    )


def test_gamma_must_lie_in_the_unit_interval():
    for g in (-0.1, 1.1):
        with pytest.raises(ValueError, match="c2v-gamma"):
            state(gamma=g)
    state(gamma=0.0), state(gamma=1.0)


def test_late_joiners_extend_the_index_with_no_history_and_are_eligible_at_once():
    s = state(4)
    s.observe([0, 1])
    s.last_drawn[:] = 1
    rng = np.random.default_rng(9)
    bf, bl = rng.normal(size=(2, 6)), rng.normal(size=(2, 6))
    s.add(bf, bl, np.array([7.0, 9.0]))
    assert s.size == 6 and s.n[4:].tolist() == [7.0, 9.0]
    assert s.H[4:].tolist() == [0.0, 0.0] and np.isneginf(s.last_drawn[4:]).all()
    assert s.sim_f.shape == (6, 6) and s.sim_f[4, 5] == pytest.approx(cos(bf[0], bf[1]))
    assert s.sim_l[5, 0] == pytest.approx(cos(bl[1], s.beta_l[0]))


def test_probabilities_follow_eq1_on_the_last_cohort_with_unavailable_and_recent_clients_excluded():
    s = state(10, tau=0.5)
    s.sample(1, 2, use_index=True)  # window = 10 // (2*2) = 2 for the next draws
    first = s.last_drawn.copy()
    s.observe(np.flatnonzero(first == 1))
    available = np.ones(10, bool)
    available[7] = False
    p = s.probabilities(2, available)
    sim = s.similarity(np.flatnonzero(first == 1))
    e = np.exp(sim / 0.5)
    e[first == 1] = 0.0  # drawn last round: inside the window
    e[7] = 0.0  # not connected
    np.testing.assert_allclose(p, e / e.sum())


def test_a_last_cohort_of_one_client_already_steers_eq1():
    s = state(6, tau=0.5)
    s.observe([3])
    e = np.exp(s.similarity([3]) / 0.5)
    np.testing.assert_allclose(s.probabilities(2), e / e.sum())


def test_without_the_index_the_cohort_is_uniform_over_available_clients():
    s = state(6)
    available = np.array([True, False, True, True, False, True])
    seen = set()
    for t in range(1, 30):
        c = s.sample(t, 2, use_index=False, available=available)
        assert len(c) == 2 and set(c.tolist()) <= {0, 2, 3, 5}
        seen |= set(c.tolist())
        assert (s.last_drawn[c] == t).all() and s.prev_drawn_size == 2
    assert seen == {0, 2, 3, 5}


def test_the_window_is_lifted_when_too_few_clients_remain_eligible():
    s = state(6)
    c1 = s.sample(1, 3, use_index=True)  # window 6 // 6 = 1: the 3 drawn are blocked in round 2
    s.observe(c1)
    available = np.ones(6, bool)
    available[np.setdiff1d(np.arange(6), c1)[0]] = False  # only 2 eligible and unblocked, 3 wanted
    c2 = s.sample(2, 3, use_index=True, available=available)
    assert len(c2) == 3 and available[c2].all()
    s = state(4)
    s.observe(s.sample(1, 2, use_index=True))  # window 4 // 4 = 1: two of four blocked in round 2
    assert len(s.sample(2, 3, use_index=True)) == 3  # every client connected (no availability given)


def test_cohort_size_shrinks_to_the_available_clients():
    s = state(5)
    c = s.sample(1, 4, use_index=False, available=np.array([True, False, True, False, False]))
    assert c.tolist() == [0, 2]


def test_observing_updates_history_and_the_last_cohort_and_ignores_empty_rounds():
    s = state(6, gamma=0.5)
    s.observe([1, 2])
    h1 = s.similarity([1, 2])
    np.testing.assert_allclose(s.H, h1)
    s.observe([])
    np.testing.assert_allclose(s.H, h1)
    assert s.prev_cohort.tolist() == [1, 2]
    s.observe([4])
    np.testing.assert_allclose(s.H, 0.5 * h1 + s.similarity([4]))
    assert s.prev_cohort.tolist() == [4]


def test_weights_use_history_with_the_index_and_sample_counts_without():
    s = state(6, lambda1=0.7)
    s.observe([0, 3, 5])
    cohort = [0, 3, 5]
    np.testing.assert_allclose(s.weights(cohort, True), aggregation_weights(s.H[cohort], s.n[cohort], 0.7))
    np.testing.assert_allclose(s.weights(cohort, False), s.n[cohort] / s.n[cohort].sum())


def test_exactly_k_eligible_clients_are_all_drawn_and_the_window_stays():
    """client2vec.md §2.6: clients drawn in the last W rounds get p = 0; with M = 6 and |C| = 3 (W = 1) exactly K = 3
    clients remain eligible, enough for the draw, so the cohort must be exactly those three, whatever the seed."""
    for seed in range(5):
        s = state(6, seed=seed)
        c1 = s.sample(1, 3, use_index=True)
        s.observe(c1)
        c2 = s.sample(2, 3, use_index=True)
        assert c2.tolist() == np.setdiff1d(np.arange(6), c1).tolist()


def test_a_lifted_window_still_draws_only_connected_clients():
    """client2vec.md §2.6 with dropouts: when too few eligible clients are connected the window is lifted, but a client
    that is not connected can still not be drawn (it would never answer)."""
    for seed in range(10):
        s = state(10, seed=seed)
        c1 = s.sample(1, 5, use_index=True)  # W = 10 // 10 = 1: these five are blocked in round 2
        s.observe(c1)
        available = np.zeros(10, bool)
        available[c1[:3]] = True  # three blocked ones and one unblocked one are connected
        available[np.setdiff1d(np.arange(10), c1)[0]] = True
        c2 = s.sample(2, 3, use_index=True, available=available)
        assert len(c2) == 3 and available[c2].all()


def test_a_lifted_window_keeps_eq1_towards_the_last_cohort():
    """client2vec.md §2.6, Eq. 1: lifting the window drops only the exclusion, not the similarity weighting.  Clients 0
    and 1 (the last cohort) point along the first axis, the others at 10, 40, 70, ... degrees from it, so S(i, C) is
    cos(angle).  With tau = 0.05 Eq. 1 puts all but ~1e-8 of the mass on the four most similar connected
    clients; a uniform draw picks them one time in five."""
    angles = np.radians([0, 0, 10, 40, 70, 100, 130, 160])
    beta = np.stack([np.cos(angles), np.sin(angles)], axis=1)
    for seed in range(10):
        s = C2VServerState(beta, beta, np.full(8, 10.0), tau=0.05, seed=seed)
        only_01 = np.isin(np.arange(8), [0, 1])
        c1 = s.sample(1, 2, use_index=False, available=only_01)
        assert c1.tolist() == [0, 1]
        s.observe(c1)  # W = 8 // 4 = 2: clients 0 and 1 are blocked in round 2
        available = np.isin(np.arange(8), [0, 1, 2, 3, 5])  # 2, 3, 5 eligible, 4 wanted: the window is lifted
        assert s.sample(2, 4, use_index=True, available=available).tolist() == [0, 1, 2, 3]


def test_a_round_whose_replies_were_all_lost_still_leaves_the_next_draw_possible():
    """client2vec.md §2.6: with no C^{t-1} to compare to (round 1's replies all lost, nothing observed) the draw is
    uniform over the clients; the window from round 1's draw still applies and is lifted when too few remain."""
    s = state(4)
    c1 = s.sample(1, 2, use_index=True)  # never observed: every reply of round 1 was lost
    np.testing.assert_allclose(s.probabilities(2), np.where(np.isin(np.arange(4), c1), 0.0, 0.5))
    seen = set()
    for t in range(2, 40):
        c = s.sample(t, 3, use_index=True)  # W = 4 // (2*2) = 1 leaves 2 eligible of the 3 wanted: lifted
        assert len(c) == 3 and len(set(c.tolist())) == 3
        seen |= set(c.tolist())
    assert seen == {0, 1, 2, 3}


def test_a_cohort_of_one_client_with_one_sample_has_a_similarity():
    """client2vec.md §2.6: S(beta_i, C) only needs N_C > 0; a single client holding a single sample is a valid cohort,
    and S(., {j}) is then the mean of the two cosines to j."""
    rng = np.random.default_rng(4)
    bf, bl = rng.normal(size=(4, 3)), rng.normal(size=(4, 3))
    n = np.array([1.0, 5.0, 9.0, 2.0])
    got = similarity_to_set(cosine_matrix(bf), cosine_matrix(bl), n, [0])
    for i in range(4):
        assert got[i] == pytest.approx(0.5 * (cos(bf[i], bf[0]) + cos(bl[i], bl[0])))
    s = C2VServerState(bf, bl, n)
    s.observe([0])  # a round whose only participant holds one sample
    np.testing.assert_allclose(s.H, got)


def test_the_default_sampling_temperature_is_the_specs_one():
    """client2vec.md §3: tau = 1.0 by default (Global mode), so p = softmax(S(., C^{t-1}))."""
    beta = np.random.default_rng(1).normal(size=(6, 4))
    s = C2VServerState(beta, beta.copy(), np.full(6, 10.0))  # one draw for both parts
    s.observe([2])
    e = np.exp(s.similarity([2]))
    np.testing.assert_allclose(s.probabilities(2), e / e.sum())


def test_a_single_late_joiner_may_come_as_one_row_and_one_count():
    """client2vec.md §2.6 late joiners: one client's index halves (two vectors) and its sample count (a number) add one
    client, never drawn, with no history."""
    s = state(3)
    rng = np.random.default_rng(2)
    bf, bl = rng.normal(size=6), rng.normal(size=6)
    s.add(bf, bl, 12)
    assert s.size == 4 and s.n.tolist()[-1] == 12.0 and s.H[-1] == 0.0 and np.isneginf(s.last_drawn[-1])
    np.testing.assert_allclose(s.beta_f[-1], bf)
    np.testing.assert_allclose(s.beta_l[-1], bl)


# ------------------------------------------------------------------------------------------ the strategy
# Client2VecStrategy driven through its own round loop (tests/strategy_harness.py), with every reply recorded,
# so that each expectation is computed here from what the clients sent.


NODES = {9001: 3, 12: 0, 777: 5, 4: 1, 55: 4, 60: 2}  # Flower node id -> partition id, node ids out of client order


def c2v(**cfg):
    from server_app.app import build_strategy
    from task.config import parse_settings

    base = {
        "method": "client2vec",
        "model": "mlp",
        "min-nodes": len(NODES),
        "c2v-ign-ff": 8,
        "c2v-ign-upload": 4,
        "c2v-ign-epochs": 2,
    }
    return build_strategy(parse_settings({**base, **cfg}))


class Recorder:
    """drive()'s answer callback: keeps every reply sent, per phase, as (server round, client, content);
    ``change(server_round, node, phase, content)`` may return other contents (``[]``: the node stays silent)."""

    def __init__(self, change=None):
        self.change = change
        self.replies: dict[str, list] = {}

    def __call__(self, server_round, node, phase, content):
        out = self.change(server_round, node, phase, content) if self.change is not None else None
        contents = [content] if out is None else out
        for c in contents:
            self.replies.setdefault(phase, []).append((server_round, int(c["metrics"]["partition-id"]), c))
        return contents

    def by_client(self, phase, server_round=None):
        rows = [r for r in self.replies.get(phase, []) if server_round is None or r[0] == server_round]
        return [c for _, _, c in sorted(rows, key=lambda r: r[1])]


def sent(grid, phase, server_round=None):
    return [
        m
        for m in grid.sent
        if phase_of(m) == phase and (server_round is None or int(m.content["config"]["server-round"]) == server_round)
    ]


def arrays(content, record="arrays"):
    return {k: content[record][k].numpy() for k in content[record]}


def assert_state_equal(got, expected):
    assert set(got) == set(expected)
    for k in expected:
        np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(expected[k]), err_msg=k)


def assert_state_close(got, expected):
    assert set(got) == set(expected)
    for k in expected:
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(expected[k]), rtol=1e-5, atol=1e-6, err_msg=k)


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


def cos_loop(a, b):
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


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


ARMS_OFF = {"c2v-sampling": False, "c2v-aggregation": False, "c2v-local": False}


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


def test_domain_of_a_client_is_its_feature_shift_transform():
    """Data: with feature-shift = s, partition p gets transform p mod s (its domain); without, one domain."""
    assert [c2v(**{"feature-shift": 3}).domain_of(p) for p in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert {c2v().domain_of(p) for p in range(7)} == {0}


def test_index_quality_is_the_same_minus_cross_domain_mean_feature_cosine():
    """client2vec.md §8 acceptance check 1 (the Fig. 2 block structure): mean cos(beta_f) over pairs of distinct clients
    of the same domain minus the mean over pairs from different domains; undefined (left out) without both."""
    rng = np.random.default_rng(3)
    pids = [5, 0, 3, 1, 4, 2, 7]  # registry rows in arrival order, not sorted
    bf, bl = rng.normal(size=(7, 5)), rng.normal(size=(7, 5))
    strat = c2v(**{"feature-shift": 3})
    assert strat.index_quality() == {}  # no index yet
    strat.c2v, strat.index_clients = C2VServerState(bf, bl, np.full(7, 5.0)), pids
    same = [cos_loop(bf[i], bf[j]) for i in range(7) for j in range(7) if i != j and pids[i] % 3 == pids[j] % 3]
    cross = [cos_loop(bf[i], bf[j]) for i in range(7) for j in range(7) if pids[i] % 3 != pids[j] % 3]
    q = strat.index_quality()
    assert q == pytest.approx(
        {
            "beta-f-same-domain": np.mean(same),
            "beta-f-cross-domain": np.mean(cross),
            "beta-f-block-gap": np.mean(same) - np.mean(cross),
        }
    )
    one_domain = c2v()
    one_domain.c2v, one_domain.index_clients = C2VServerState(bf, bl, np.full(7, 5.0)), pids
    assert one_domain.index_quality() == {}  # no cross-domain pair
    own_domains = c2v(**{"feature-shift": 7})
    own_domains.c2v, own_domains.index_clients = C2VServerState(bf[:6], bl[:6], np.full(6, 5.0)), pids[:6]
    assert own_domains.index_quality() == {}  # no same-domain pair
    two = c2v(**{"feature-shift": 2})
    two.c2v, two.index_clients = C2VServerState(bf[:2], bl[:2], np.full(2, 5.0)), [0, 1]
    assert two.index_quality() == {}  # fewer than two in a domain
    single = c2v(**{"feature-shift": 2})
    single.c2v, single.index_clients = C2VServerState(bf[:1], bl[:1], np.full(1, 5.0)), [0]
    assert single.index_quality() == {}


def kept_figures(monkeypatch):
    """pyplot for strategies.client2vec, except that closed figures are kept for inspection."""
    import strategies.client2vec_artifacts as module

    return harness_kept_figures(monkeypatch, module)


def test_the_similarity_plot_marks_a_domain_of_one_client_first(tmp_path, monkeypatch):
    """A domain boundary after the very first row too (here domain 0 is client 0 alone): thin black lines between
    domains, across both heat maps."""
    figures = kept_figures(monkeypatch)
    strat = c2v(**{"fraction-train": 0.5, "feature-shift": 2, "min-nodes": 3, "num-server-rounds": 1})
    drive(strat, {7: 0, 8: 1, 9: 3}, 1)  # partitions 0 (domain 0), 1 and 3 (domain 1)
    write_artifacts(strat, tmp_path)
    (fig,) = figures
    panels = [ax for ax in fig.axes if ax.get_images()]
    for ax in panels:
        assert [ln.get_ydata()[0] for ln in ax.lines if ln.get_ydata()[0] == ln.get_ydata()[1]] == [0.5]
        assert [ln.get_xdata()[0] for ln in ax.lines if ln.get_xdata()[0] == ln.get_xdata()[1]] == [0.5]
        assert all(ln.get_color() == "k" and ln.get_linewidth() == 0.6 for ln in ax.lines)


def test_the_artefacts_hold_the_index_by_domain_the_runs_record_and_the_similarity_plot(tmp_path, monkeypatch):
    """docs Artefacts: client2vec_index.npz (the registry ordered by feature-shift domain, then partition id),
    client2vec.json (options, index-phase seconds, index quality, best-round global accuracy, DSA-IGN losses,
    cohorts, aggregation weights) and client2vec_similarity.png (cos of both halves in that order, from -1 to 1,
    domain boundaries marked)."""
    import dataclasses

    import matplotlib.pyplot as plt

    figures = kept_figures(monkeypatch)
    strat = c2v(**{"fraction-train": 0.5, "feature-shift": 2, "num-server-rounds": 3})
    drive(strat, NODES, 3)
    write_artifacts(strat, tmp_path)
    order = [0, 2, 4, 1, 3, 5]  # domain p % 2, then partition id; registry row r is partition r here
    assert strat.index_clients == list(range(6))
    with np.load(tmp_path / "client2vec_index.npz") as npz:
        assert npz["partition_id"].tolist() == order and npz["domain"].tolist() == [0, 0, 0, 1, 1, 1]
        np.testing.assert_array_equal(npz["beta_f"], strat.c2v.beta_f[order])
        np.testing.assert_array_equal(npz["beta_l"], strat.c2v.beta_l[order])
        np.testing.assert_array_equal(npz["num_examples"], strat.c2v.n[order])
    record = json.loads((tmp_path / "client2vec.json").read_text())
    assert record["options"] == dataclasses.asdict(strat.opts)
    assert record["index-seconds"] == strat.index_seconds > 0
    assert record["index-quality"] == strat.index_quality() and "beta-f-block-gap" in record["index-quality"]
    accs = [h.evaluate["global-acc"] for h in strat.history]
    assert len(accs) == 3 and record["best-global-acc"] == max(accs)
    assert record["dsa-ign-losses"] == strat.ign_history and len(record["dsa-ign-losses"]) == 2
    assert record["cohorts"] == {str(t): c for t, c in strat.cohorts.items()} and len(record["cohorts"]) == 3
    assert record["aggregation-weights"] == {
        str(t): {str(c): w for c, w in ws.items()} for t, ws in strat.agg_weights.items()
    }
    (fig,) = figures
    panels = [ax for ax in fig.axes if ax.get_images()]
    assert len(panels) == 2 and len(fig.axes) == 4  # two heat maps, each with its colour bar
    left, right = (ax.get_position() for ax in panels)
    assert left.x1 < right.x0 and left.y0 == pytest.approx(right.y0)  # side by side
    for ax, sim, half in zip(
        panels, (strat.c2v.sim_f, strat.c2v.sim_l), ("feature half cos(beta_f)", "label half cos(beta_l)"), strict=False
    ):
        assert ax.get_title() == half and ax.get_xlabel() == "client (ordered by domain)"
        (image,) = ax.get_images()
        np.testing.assert_allclose(image.get_array(), sim[np.ix_(order, order)])
        assert image.get_clim() == (-1, 1) and image.get_cmap().name == "RdBu_r"  # cosines, 0 in the middle
        assert [ln.get_ydata()[0] for ln in ax.lines if ln.get_ydata()[0] == ln.get_ydata()[1]] == [2.5]
        assert [ln.get_xdata()[0] for ln in ax.lines if ln.get_xdata()[0] == ln.get_xdata()[1]] == [2.5]
    gap = strat.index_quality()["beta-f-block-gap"]
    assert fig.get_suptitle() == (
        f"Client2Vec pairwise index similarity (6 clients; same - cross domain beta_f cos {gap:.2f})"
    )
    assert plt.imread(tmp_path / "client2vec_similarity.png").shape[:2] == (500, 1100)  # 11 x 5 in at 100 dpi
    plt.close(fig)


def test_artefacts_of_a_run_without_an_evaluated_round_or_domains(tmp_path, monkeypatch):
    """Before any evaluation the best accuracy is null (an accuracy of 0 is a result, not a missing one); with one
    domain there is no boundary and no gap; client axes show whole clients only (strategies/plots.py)."""
    import matplotlib.pyplot as plt

    figures = kept_figures(monkeypatch)
    three = {12: 0, 4: 1, 60: 2}
    strat = c2v(**{"num-server-rounds": 3, "min-nodes": 3})  # full participation: round 1 is evaluated in round 2
    drive(strat, three, 1)
    write_artifacts(strat, tmp_path)
    record = json.loads((tmp_path / "client2vec.json").read_text())
    assert record["best-global-acc"] is None and record["index-quality"] == {}
    (fig,) = figures
    assert all(not ax.lines for ax in fig.axes)
    assert fig.get_suptitle() == "Client2Vec pairwise index similarity (3 clients)"
    for ax in (ax for ax in fig.axes if ax.get_images()):
        lo, hi = sorted(ax.get_ylim())
        ticks = [t for t in list(ax.get_xticks()) + list(ax.get_yticks()) if lo <= t <= hi]
        assert ticks and all(float(t).is_integer() for t in ticks)
    plt.close(fig)
    strat.history[0].evaluate["global-acc"] = 0.0
    write_artifacts(strat, tmp_path)
    assert json.loads((tmp_path / "client2vec.json").read_text())["best-global-acc"] == 0.0
    for fig in figures[1:]:
        plt.close(fig)


def test_without_an_index_there_are_no_artefacts(tmp_path):
    write_artifacts(c2v(**ARMS_OFF), tmp_path)
    assert list(tmp_path.iterdir()) == []


def test_similarities_and_aggregation_weights_are_computed_in_double_precision_whatever_the_input_type():
    """client2vec.md §2.6-§2.7: S(beta_i, C) and the Eq. 3 weights are computed in double precision from whatever
    numbers they get (the index arrives as float32; counts may come as any number type), so that the same index gives
    the same draws and weights.  Half-precision inputs make a lower-precision computation visible."""
    rng = np.random.default_rng(8)
    a = rng.normal(size=(5, 6)).astype(np.float16)
    exact = a.astype(np.float64)
    unit = exact / np.linalg.norm(exact, axis=1, keepdims=True)
    got = cosine_matrix(a)
    assert got.dtype == np.float64
    np.testing.assert_allclose(got, unit @ unit.T, rtol=1e-12, atol=1e-14)
    sim_f, sim_l = unit @ unit.T, np.eye(5)
    n16 = np.array([3, 7, 11, 13, 17], dtype=np.float16)
    cohort = [0, 2, 3]
    w = n16.astype(np.float64)[cohort] / n16.astype(np.float64)[cohort].sum()
    np.testing.assert_allclose(
        similarity_to_set(sim_f, sim_l, n16, cohort),
        0.5 * (sim_f[:, cohort] + sim_l[:, cohort]) @ w,
        rtol=1e-12,
        atol=1e-14,
    )
    h16 = np.array([0.3, -0.7, 0.55], dtype=np.float16)
    raw = n16[cohort].astype(np.float64) * np.exp(h16.astype(np.float64) / 3.0)
    np.testing.assert_allclose(aggregation_weights(h16, n16[cohort], 3.0), raw / raw.sum(), rtol=1e-12)


def test_the_server_state_draws_with_the_runs_default_seed_unless_told_otherwise():
    """Reproducibility (client2vec.md §7 test 5, same seed same sequence): without a seed the state draws as with the
    run-config default seed 0."""
    rng = np.random.default_rng(6)
    bf, bl, n = rng.normal(size=(8, 4)), rng.normal(size=(8, 4)), np.full(8, 10.0)

    def draws(**kw):
        s = C2VServerState(bf, bl, n, **kw)
        out = []
        for t in range(1, 6):
            out.append(s.sample(t, 2, use_index=True).tolist())
            s.observe(out[-1])
        return out

    assert draws() == draws(seed=0) != draws(seed=1)


def test_aggregation_weights_of_an_empty_cohort_are_refused_with_the_reason():
    s = state(4)
    with pytest.raises(ValueError, match="positive sample counts"):
        s.weights([], True)


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


# ------------------------------------------------------------------------------------------ strategy
def _strategy(**cfg):
    from server_app.app import build_strategy
    from task.config import parse_settings

    return build_strategy(parse_settings({"method": "client2vec", "model": "mlp", **cfg}))


def test_strategy_aggregates_with_index_weights_and_carries_the_projection():
    from strategies.base import Reply

    strat = _strategy()
    assert any(k.startswith("c2v.") for k in strat.global_state)  # P and h_P are part of the shared state
    assert not any(k.startswith("c2v.") for k in _strategy(**{"c2v-local": False}).global_state)
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


def test_strategy_rejects_bad_index_replies_with_a_reason():
    from flwr.app import MetricRecord, RecordDict

    from task.params import to_record

    strat = _strategy()
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


ARMS = {"FedAvg": (False, False, False), "+ii": (False, True, False), "+i+ii+iii": (True, True, True)}


def _cohorts_and_index(arm, nodes, rounds=4):
    from tests.strategy_harness import drive

    sampling, aggregation, local = ARMS[arm]
    strat = _strategy(
        **{
            "min-nodes": len(nodes),
            "fraction-train": 0.5,
            "c2v-ign-epochs": 1,
            "c2v-ign-upload": 4,
            "c2v-sampling": sampling,
            "c2v-aggregation": aggregation,
            "c2v-local": local,
            "seed": 5,
        }
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

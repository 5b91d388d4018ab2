"""What Client2Vec's server math must compute (client2vec.md §2.6, §2.7): index similarity, Eq. 1
sampling with the exclusion window, Eq. 3 aggregation weights and the Eq. 2 objective, and the server state that
draws cohorts, keeps the history and takes late joiners.  Expectations are computed here from the formulas, with
plain loops."""

import math
import warnings

import numpy as np
import pytest

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

"""Client2Vec's server-side math (client2vec.md §2.6-2.7), plain numpy: index similarity, sampling, aggregation
weights.

Clients are rows 0..M-1 of the index matrices ``beta_f`` and ``beta_l`` (M, d); ``n`` holds their sample
counts.  A cohort is a list of row numbers.

See docs/methods/client2vec.md; its last section says where each section number cited here is explained.
"""

from __future__ import annotations

import numpy as np


def _unit(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    norm = np.linalg.norm(a, axis=1, keepdims=True)
    return a / np.where(norm > 0, norm, 1.0)


def cosine_matrix(a: np.ndarray, b: np.ndarray | None = None) -> np.ndarray:
    """Pairwise cosine similarity of the rows of ``a`` and ``b`` (one matrix product)."""
    ua = _unit(a)
    return ua @ (ua if b is None else _unit(b)).T


def similarity_to_set(
    sim_f: np.ndarray, sim_l: np.ndarray, n: np.ndarray, cohort: list[int] | np.ndarray
) -> np.ndarray:
    """S(beta_i, C) for every client i: 1/(2 N_C) sum_{j in C} N_j (cos_f(i, j) + cos_l(i, j)); in [-1, 1].

    ``sim_f`` / ``sim_l`` are the (M, M) cosine matrices of the two index halves.
    """
    cohort = np.asarray(cohort, dtype=int)
    if cohort.size == 0:
        raise ValueError("similarity to an empty cohort is undefined")
    w = np.asarray(n, dtype=np.float64)[cohort]
    if (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"cohort sample counts must be non-negative with a positive sum, got {w.tolist()}")
    return 0.5 * (sim_f[:, cohort] + sim_l[:, cohort]) @ (w / w.sum())


def exclusion_window(num_clients: int, last_cohort_size: int) -> int:
    """W = floor(M / (2 |C^{t-1}|)): clients drawn in the last W rounds (t-1 included) are blocked."""
    return num_clients // (2 * last_cohort_size) if last_cohort_size > 0 else 0


def sampling_probabilities(similarity: np.ndarray, tau: float, blocked: np.ndarray | None = None) -> np.ndarray:
    """Eq. 1: softmax(S / tau) over all clients, blocked clients set to 0, renormalised."""
    if tau <= 0:
        raise ValueError(f"sampling temperature must be > 0 (run-config key 'c2v-tau'), got {tau}")
    logits = np.asarray(similarity, dtype=np.float64) / tau
    if blocked is not None and np.asarray(blocked).any():
        logits = np.where(blocked, -np.inf, logits)
    if not np.isfinite(logits).any():
        raise ValueError("every client is blocked; nothing to sample")
    p = np.exp(logits - logits[np.isfinite(logits)].max())
    return p / p.sum()


def blocked_clients(last_drawn: np.ndarray, server_round: int, window: int) -> np.ndarray:
    """Boolean mask of clients drawn within the last ``window`` rounds (``last_drawn`` = round, -inf never)."""
    return (server_round - np.asarray(last_drawn, dtype=np.float64)) <= window


def draw_cohort(rng: np.random.Generator, p: np.ndarray, k: int) -> np.ndarray:
    """``k`` distinct clients drawn with probabilities ``p`` (without replacement), sorted."""
    eligible = int((p > 0).sum())
    if k > eligible:
        raise ValueError(f"cannot draw {k} distinct clients from {eligible} with positive probability")
    return np.sort(rng.choice(len(p), size=k, replace=False, p=p))


def aggregation_weights(history: np.ndarray, n: np.ndarray, lambda1: float) -> np.ndarray:
    """Eq. 3: p_i = q_i exp(H_i / lambda1) / sum_j q_j exp(H_j / lambda1), q_i = N_i / sum N, over a cohort."""
    if lambda1 <= 0:
        raise ValueError(f"lambda1 must be > 0 (run-config key 'c2v-lambda1'), got {lambda1}")
    n = np.asarray(n, dtype=np.float64)
    if n.size == 0 or (n <= 0).any():
        raise ValueError(f"aggregation needs positive sample counts, got {n.tolist()}")
    a = np.log(n / n.sum()) + np.asarray(history, dtype=np.float64) / lambda1
    a = np.exp(a - a.max())
    return a / a.sum()


def eq2_objective(p: np.ndarray, history: np.ndarray, n: np.ndarray, lambda1: float) -> float:
    """sum_i p_i H_i - lambda1 KL(p || q): what :func:`aggregation_weights` maximises on the simplex."""
    q = np.asarray(n, dtype=np.float64) / np.sum(n)
    p = np.asarray(p, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        kl = np.sum(np.where(p > 0, p * np.log(p / q), 0.0))
    return float(p @ np.asarray(history, dtype=np.float64) - lambda1 * kl)


class C2VServerState:
    """Sampling and aggregation state over M indexed clients: H (history term), last round drawn, last cohort."""

    def __init__(
        self,
        beta_f: np.ndarray,
        beta_l: np.ndarray,
        n: np.ndarray,
        *,
        tau: float = 1.0,
        gamma: float = 0.5,
        lambda1: float = 1.0,
        seed: int = 0,
    ) -> None:
        if not 0 <= gamma <= 1:
            raise ValueError(f"gamma must be in [0, 1] (run-config key 'c2v-gamma'), got {gamma}")
        self.tau, self.gamma, self.lambda1 = float(tau), float(gamma), float(lambda1)
        self.rng = np.random.default_rng(seed)
        self.beta_f = np.zeros((0, np.shape(beta_f)[1]))
        self.beta_l = np.zeros((0, np.shape(beta_l)[1]))
        self.n = np.zeros(0)
        self.H = np.zeros(0)
        self.last_drawn = np.zeros(0)
        self.prev_cohort: np.ndarray | None = None
        self.prev_drawn_size = 0
        #: the pairwise cosine similarities of the feature and label halves (recomputed by :meth:`add`)
        self.sim_f, self.sim_l = np.zeros((0, 0)), np.zeros((0, 0))
        self.add(beta_f, beta_l, n)

    @property
    def size(self) -> int:
        return len(self.n)

    def add(self, beta_f: np.ndarray, beta_l: np.ndarray, n: np.ndarray) -> None:
        """Append clients (late joiners): their history term starts at 0 and they were never drawn."""
        self.beta_f = np.vstack([self.beta_f, np.asarray(beta_f, np.float64).reshape(-1, self.beta_f.shape[1])])
        self.beta_l = np.vstack([self.beta_l, np.asarray(beta_l, np.float64).reshape(-1, self.beta_l.shape[1])])
        k = self.beta_f.shape[0] - len(self.n)
        self.n = np.concatenate([self.n, np.asarray(n, np.float64).reshape(k)])
        self.H = np.concatenate([self.H, np.zeros(k)])
        self.last_drawn = np.concatenate([self.last_drawn, np.full(k, -np.inf)])
        self.sim_f = cosine_matrix(self.beta_f)
        self.sim_l = cosine_matrix(self.beta_l)

    def similarity(self, cohort) -> np.ndarray:
        return similarity_to_set(self.sim_f, self.sim_l, self.n, cohort)

    def probabilities(self, server_round: int, available: np.ndarray | None = None) -> np.ndarray:
        """Eq. 1 with the exclusion window; uniform (over eligible clients) before any cohort exists."""
        mask = np.zeros(self.size, bool) if available is None else ~np.asarray(available, bool)
        window = exclusion_window(self.size, self.prev_drawn_size)
        mask = mask | blocked_clients(self.last_drawn, server_round, window)
        if self.prev_cohort is None or self.prev_cohort.size == 0:
            s = np.zeros(self.size)
        else:
            s = self.similarity(self.prev_cohort)
        return sampling_probabilities(s, self.tau, mask)

    def sample(self, server_round: int, k: int, use_index: bool, available: np.ndarray | None = None) -> np.ndarray:
        """Draw this round's cohort (k clients, without replacement) and remember it."""
        avail = np.ones(self.size, bool) if available is None else np.asarray(available, bool)
        if use_index:
            p = self.probabilities(server_round, avail)
            if (p > 0).sum() < k:  # fewer eligible than needed (dropouts shrank cohorts): lift the window
                p = sampling_probabilities(
                    np.zeros(self.size) if self.prev_cohort is None else self.similarity(self.prev_cohort),
                    self.tau,
                    ~avail,
                )
        else:
            p = avail / avail.sum()
        cohort = draw_cohort(self.rng, p, min(k, int((p > 0).sum())))
        self.last_drawn[cohort] = server_round
        self.prev_drawn_size = len(cohort)
        return cohort

    def observe(self, cohort) -> None:
        """The round's participants are known: C^t for the next sampling, and H <- gamma H + S(., C^t)."""
        cohort = np.asarray(cohort, dtype=int)
        if cohort.size == 0:
            return
        self.H = self.gamma * self.H + self.similarity(cohort)
        self.prev_cohort = cohort

    def weights(self, cohort, use_index: bool) -> np.ndarray:
        cohort = np.asarray(cohort, dtype=int)
        if not use_index:
            return self.n[cohort] / self.n[cohort].sum()
        return aggregation_weights(self.H[cohort], self.n[cohort], self.lambda1)

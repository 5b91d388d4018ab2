"""Client-level differential privacy: the Gaussian mechanism on clipped model updates, and its accountant.

Two modes (docs/privacy.md says which method supports which, and why):

- **central** (a trusted server; McMahan et al. 2018, "Learning differentially private recurrent language
  models", DP-FedAvg): each client clips its update to L2 norm ``clip`` (:func:`clip_update`); the server averages
  the ``m`` clipped updates of a round and adds Gaussian noise of std ``noise_multiplier * clip / m`` once, to the
  mean (:func:`noisy_mean`).  The guarantee covers everything computed from those noised means; the server itself
  sees each clipped update.
- **local** (peers, or an untrusted server, see a single client's model): the client clips its model's change
  from a reference everyone who sees the release already knows, and adds Gaussian noise of std
  ``noise_multiplier * clip`` itself, before the model leaves (:func:`local_release`).

The accountant is Flower's own (``flwr.serverapp.RdpAccountant``, Rényi DP, backed by Google's ``dp-accounting``,
the ``flwr[dp]`` extra); :func:`central_epsilon` and :func:`local_epsilon` say which event each mode composes:

- central, every client in every round: the Gaussian mechanism without amplification, neighbouring runs differ
  by one client's data being **added or removed** (the sum of clipped updates moves by at most ``clip``), as
  Flower's own DP strategy wrappers account it;
- central, ``cohort`` of ``population`` clients drawn uniformly without replacement each round (pflower's
  ``fraction-train`` < 1): the sampled Gaussian mechanism of Wang, Balle and Kasiviswanathan (2019), the only one
  dp-accounting offers for fixed-size samples.  It is defined for **replace-one** neighbours (the population size
  is public), under which the sum moves by up to ``2 * clip``, so the event's noise multiplier is half the
  run's.  Amplification by sampling assumes the adversary does not know which clients were drawn.
- local: each release is the Gaussian mechanism on one client's whole data set against any other data set of
  that client (the clipped change moves by up to ``2 * clip``), so again half the noise multiplier, composed over
  the client's releases, never amplified (a peer sees when a client's model is released).

Everything here is numpy and Flower's accountant; the functions are pure (noise comes from the generator given).
"""

from __future__ import annotations

import functools
import math
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

MODES = ("off", "central", "local")


class PrivacyConfigError(ValueError):
    """A differential-privacy setting that cannot be used (the message says which and what is allowed)."""


@dataclass(frozen=True)
class PrivacySupport:
    """The DP modes a method supports besides ``off``, and why it cannot give the others (docs/privacy.md)."""

    modes: tuple[str, ...] = ()
    why_not: str = "it declares no differential-privacy mode (privacy= on its registry entry)"
    #: under local DP, the releases a run plans besides one train reply per round (pFedLIA: its lazy model, once);
    #: ``dp-target-epsilon`` calibrates the noise for ``num-server-rounds`` plus these
    query_releases: int = 0


#: central DP on the averaged shared part; local DP, possible for the same methods, is not implemented yet
CENTRAL = PrivacySupport(("central",), "local DP is not implemented for it yet")


def privacy_conflicts(method: str, run: Any, support: PrivacySupport) -> list[str]:
    """Why the run's ``dp-*`` settings (``run``: the parsed run options) cannot work with ``method`` (empty: they
    can); checked at start-up, on the server and on every client alike."""
    mode = run.dp_mode
    if mode == "off":
        asked = [
            k
            for k, v in (("dp-target-epsilon", run.dp_target_epsilon), ("dp-max-epsilon", run.dp_max_epsilon))
            if v > 0
        ] + (["dp-adaptive-clip"] if run.dp_adaptive_clip else [])
        return [f"{', '.join(asked)}: only with dp-mode='central' or 'local' (dp-mode is 'off')"] if asked else []
    if mode not in support.modes:
        reason = (
            f"dp-mode={mode!r} is not available for method {method!r}: {support.why_not} (docs/privacy.md lists "
            "which method supports which mode; dp-mode='off' runs without differential privacy)"
        )
        return [reason]
    problems = []
    noise = run.dp_noise_multiplier > 0 or run.dp_target_epsilon > 0
    if run.dp_clip == 0 and noise:
        what = "dp-target-epsilon" if run.dp_target_epsilon > 0 else f"dp-noise-multiplier={run.dp_noise_multiplier}"
        problems.append(
            f"{what} needs a clip bound dp-clip > 0 (0: no clipping): noise on unbounded updates gives no guarantee"
        )
    if not 0 < run.dp_delta < 1:
        problems.append(f"dp-delta must be strictly between 0 and 1, got {run.dp_delta}")
    if 0 < run.dp_max_epsilon < run.dp_target_epsilon:
        problems.append(
            f"dp-target-epsilon={run.dp_target_epsilon:g} exceeds dp-max-epsilon={run.dp_max_epsilon:g}: the run "
            "would stop before its last round; lower the target or raise the maximum"
        )
    if run.dp_adaptive_clip and mode != "central":
        problems.append(
            "dp-adaptive-clip adapts the server's clip bound, so it needs dp-mode='central' (under local DP each "
            "client clips to dp-clip before its model leaves)"
        )
    if run.dp_adaptive_clip and run.dp_clip == 0:
        problems.append("dp-adaptive-clip starts from dp-clip and never exceeds it: dp-clip must be > 0")
    return problems


def clip_bound(dp_clip: float) -> float:
    """The clip norm of run-config ``dp-clip``: 0 means no clipping (an infinite bound)."""
    return math.inf if dp_clip == 0 else float(dp_clip)


# ---------------------------------------------------------------------------------------------- checks
def _check_floating(arrays: Mapping[str, np.ndarray]) -> None:
    ints = sorted(k for k, v in arrays.items() if not np.issubdtype(np.asarray(v).dtype, np.floating))
    if ints:
        raise PrivacyConfigError(
            f"differential privacy clips and noises floating-point arrays only; {ints} are not (integer buffers such "
            "as BatchNorm's num_batches_tracked count the batches a client trained: keep them out of what a client "
            "sends under DP)"
        )


def check_clip(clip: float) -> float:
    clip = float(clip)
    if not clip > 0:
        raise PrivacyConfigError(f"dp-clip must be > 0 (math.inf: no clipping), got {clip}")
    return clip


def check_noise_multiplier(noise_multiplier: float) -> float:
    noise_multiplier = float(noise_multiplier)
    if not (noise_multiplier >= 0 and math.isfinite(noise_multiplier)):
        raise PrivacyConfigError(f"dp-noise-multiplier must be finite and >= 0, got {noise_multiplier}")
    return noise_multiplier


def check_delta(delta: float) -> float:
    delta = float(delta)
    if not 0 < delta < 1:
        raise PrivacyConfigError(f"dp-delta must be strictly between 0 and 1, got {delta}")
    return delta


# ---------------------------------------------------------------------------------------------- mechanism
def update_norm(update: Mapping[str, np.ndarray]) -> float:
    """The L2 norm of the update flattened into one vector: ``||Δ||_2 = sqrt(sum_k sum_j Δ_kj^2)``."""
    return float(math.sqrt(sum(float(np.sum(np.square(np.asarray(v, dtype=np.float64)))) for v in update.values())))


def finite_or_zero(update: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``update`` where every value is finite, else the **zero update** (each array zero, its dtype and shape kept).

    An update that overflowed (±inf, NaN: local training diverged) carries where it overflowed; clipping would turn
    ±inf into NaN exactly there, and noise does not hide a NaN.  Under DP such an update counts as the client sending
    nothing new: the release is then the reference plus noise, the same whichever coordinates overflowed."""
    if all(np.isfinite(np.asarray(v)).all() for v in update.values()):
        return dict(update)
    return {k: np.zeros(np.shape(v), dtype=np.asarray(v).dtype) for k, v in update.items()}


def clip_update(update: Mapping[str, np.ndarray], clip: float) -> dict[str, np.ndarray]:
    """Flat L2 clipping (McMahan et al. 2018, Algorithm 1, ``ClipFn``): ``Δ · min(1, C / ||Δ||_2)``.

    The norm is that of the whole update flattened into one vector (:func:`update_norm`), so the result has norm
    at most ``clip``; an update already within the bound (and ``clip = inf``) is returned unchanged.  Each array
    keeps its dtype and shape.  A non-finite update is the zero update (:func:`finite_or_zero`).
    """
    clip = check_clip(clip)
    _check_floating(update)
    update = finite_or_zero(update)
    norm = update_norm(update)
    scale = 1.0 if norm <= clip else clip / norm
    return {k: (np.asarray(v) * scale).astype(np.asarray(v).dtype) for k, v in update.items()}


def model_delta(model: Mapping[str, np.ndarray], reference: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """``Δ = w - w_ref`` key by key (the keys of ``model``; each must be in ``reference`` with the same shape)."""
    missing = sorted(set(model) - set(reference))
    if missing:
        raise PrivacyConfigError(f"the reference lacks {missing}: cannot take the update of those arrays")
    out = {}
    for k, v in model.items():
        if np.shape(v) != np.shape(reference[k]):
            raise PrivacyConfigError(f"{k}: shape {np.shape(v)} differs from the reference's {np.shape(reference[k])}")
        out[k] = (np.asarray(v) - np.asarray(reference[k])).astype(np.asarray(v).dtype)
    return out


def central_noise_std(noise_multiplier: float, clip: float, denominator: float) -> float:
    """Std of the noise on the **average** of the clipped updates (central DP): ``sigma · C / d``.

    ``d`` is the round's fixed denominator: the cohort size m drawn (every client, or a fixed-size cohort), or the
    expected cohort q·N under Poisson sampling (McMahan et al. 2018's fixed-denominator estimator: the number of
    clients in the round, which would tell whether a given client was in it, is not released).  The same as noise
    ``sigma · C`` on the sum; Flower's ``compute_stdv`` has the same formula with d = m.
    """
    if not denominator > 0:
        raise PrivacyConfigError(f"the noisy average needs a denominator > 0 (the cohort), got {denominator}")
    return local_noise_std(noise_multiplier, clip) / denominator


def local_noise_std(noise_multiplier: float, clip: float) -> float:
    """Std of the noise one client adds to its own clipped update (local DP): ``sigma · C``.

    No noise (sigma = 0) is 0 whatever the clip norm; noise needs a finite clip norm to have a scale.
    """
    noise_multiplier, clip = check_noise_multiplier(noise_multiplier), check_clip(clip)
    if noise_multiplier == 0:
        return 0.0
    if math.isinf(clip):
        raise PrivacyConfigError(
            f"dp-noise-multiplier {noise_multiplier} needs a finite dp-clip: without a bound on the update, noise "
            "of any scale gives no guarantee"
        )
    return noise_multiplier * clip


def add_gaussian_noise(arrays: Mapping[str, np.ndarray], std: float, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """``x + N(0, std² I)``, independently per coordinate, drawn from ``rng`` (so a seeded run repeats).

    ``std = 0`` returns the arrays unchanged (as copies); each array keeps its dtype and shape.
    """
    if not (std >= 0 and math.isfinite(std)):
        raise PrivacyConfigError(f"the noise std must be finite and >= 0, got {std}")
    _check_floating(arrays)
    if std == 0:
        return {k: np.array(v) for k, v in arrays.items()}
    return {
        k: (np.asarray(v) + rng.normal(0.0, std, np.shape(v))).astype(np.asarray(v).dtype) for k, v in arrays.items()
    }


def noisy_mean(
    clipped_updates: Sequence[Mapping[str, np.ndarray]],
    noise_multiplier: float,
    clip: float,
    rng: np.random.Generator,
    denominator: float | None = None,
    template: Mapping[str, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Central DP's release: ``(Σ_i Δ_i + N(0, (sigma C)² I)) / d`` over the round's clipped updates.

    ``d`` (``denominator``) is the cohort size m by default; under Poisson sampling the expected cohort q·N, fixed
    before the round (:func:`central_noise_std`), so that the release does not depend on how many clients were in
    it, and a round with no update (``template`` gives the keys, shapes and dtypes) still releases noise.  The sum
    is unweighted: a weight per client (e.g. its number of examples) would change each client's sensitivity and
    itself reveal the client's data size.  The updates must already be clipped to ``clip`` (clients do it,
    :func:`clip_update`); the noise is added once, here.
    """
    if not clipped_updates and template is None:
        raise PrivacyConfigError("the noisy mean needs at least one client update (or a template of its arrays)")
    like = clipped_updates[0] if clipped_updates else template
    assert like is not None
    keys = list(like)
    for u in clipped_updates:
        if sorted(u) != sorted(keys):
            raise PrivacyConfigError(f"client updates carry different arrays: {sorted(u)} vs {sorted(keys)}")
    _check_floating(like)
    d = float(len(clipped_updates) if denominator is None else denominator)
    mean = {
        k: (
            np.sum([np.asarray(u[k], dtype=np.float64) for u in clipped_updates], axis=0) / d
            if clipped_updates
            else np.zeros(np.shape(like[k]))
        ).astype(np.asarray(like[k]).dtype)
        for k in keys
    }
    return add_gaussian_noise(mean, central_noise_std(noise_multiplier, clip, d), rng)


def local_release(
    model: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    noise_multiplier: float,
    clip: float,
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """Local DP's release of one client's model: ``w_ref + clip(w - w_ref, C) + N(0, (sigma C)² I)``.

    ``reference`` must be known to everyone who sees the release without the client's data (the model the
    client was sent, or its own previous release), otherwise the release is not a Gaussian mechanism of the
    clipped change alone.
    """
    # in float64, so that a release without clipping and noise is the model itself, not a rounding of it
    wide = {k: np.asarray(v, dtype=np.float64) for k, v in model.items()}
    ref = {k: np.asarray(reference[k], dtype=np.float64) for k in model if k in reference}
    change = clip_update(model_delta(wide, ref), clip)
    noisy = add_gaussian_noise(change, local_noise_std(noise_multiplier, clip), rng)
    return {k: (ref[k] + noisy[k]).astype(np.asarray(model[k]).dtype) for k in model}


# ---------------------------------------------------------------------------------------------- noise source
def noise_source() -> np.random.Generator:
    """A generator for DP noise, seeded with 128 bits from the operating system's CSPRNG (:mod:`secrets`) and never
    stored: nobody who knows the run config (the seed included) can regenerate the noise.  Central DP draws one per
    release on the server, local DP one per release on the client."""
    return np.random.Generator(np.random.PCG64(secrets.randbits(128)))


# ---------------------------------------------------------------------------------------------- adaptive clipping
def update_noise_multiplier(noise_multiplier: float, count_stddev: float) -> float:
    """Adaptive clipping's split of the round's privacy (Andrew et al. 2021, "Differentially private learning with
    adaptive clipping", Theorem 1): the noised sum of the updates (multiplier ``z_update``) and the noised count of
    unclipped updates (std ``count_stddev``, sensitivity 1/2 with the bits centred) together are one Gaussian
    mechanism of multiplier ``sigma`` when ``z_update = (sigma^-2 - (2 count_stddev)^-2)^-1/2``.  The accountant
    then composes ``sigma`` as without adaptive clipping.  Needs ``2 count_stddev > sigma``."""
    noise_multiplier = check_noise_multiplier(noise_multiplier)
    if noise_multiplier == 0:
        return 0.0
    if not 2 * count_stddev > noise_multiplier:
        raise PrivacyConfigError(
            f"adaptive clipping needs the count's noise std (dp-clip-count-stddev, {count_stddev:g}) above half of "
            f"the noise multiplier ({noise_multiplier:g} / 2): otherwise the count alone spends the round's budget"
        )
    return float((noise_multiplier**-2 - (2 * count_stddev) ** -2) ** -0.5)


def noisy_unclipped_share(
    norms: Sequence[float], clip: float, count_stddev: float, rng: np.random.Generator, denominator: float | None = None
) -> float:
    """The round's share of updates that the clip bound left unchanged, noised: ``(sum_i 1[||Δ_i|| <= C] +
    N(0, count_stddev^2)) / d`` (Andrew et al. 2021, Algorithm 1), ``d`` the round's denominator (the cohort m, or
    the expected cohort q·N under Poisson sampling, as for the updates)."""
    d = float(len(norms) if denominator is None else denominator)
    if not d > 0:
        raise PrivacyConfigError("the unclipped share needs at least one update (or a denominator > 0)")
    unclipped = sum(1 for n in norms if n <= clip)
    return float((unclipped + rng.normal(0.0, count_stddev)) / d)


def next_clip(clip: float, unclipped_share: float, target_quantile: float, learning_rate: float) -> float:
    """The geometric update of the clip bound toward the ``target_quantile`` of the update norms (Andrew et al. 2021,
    Algorithm 1): ``C * exp(-lr (b - gamma))``, ``b`` the noised unclipped share.  More updates unclipped than the
    target: the bound shrinks."""
    return float(clip * math.exp(-learning_rate * (unclipped_share - target_quantile)))


# ---------------------------------------------------------------------------------------------- accountant
#: how a central round's clients are drawn (run-config ``dp-sampling``, with ``fraction-train`` < 1)
SAMPLINGS = ("poisson", "fixed")
#: what a release records of how its contributors were drawn: ``all`` (every client of the population), a sampling
#: of :data:`SAMPLINGS`, or ``local`` (one client's own release of its model)
RELEASE_KINDS = ("all", *SAMPLINGS, "local")
#: the Rényi orders for sampled releases: integers (dp-accounting's fractional orders below 2 fail to converge for
#: Poisson-sampled Gaussians, with a warning each time, and are the best order only at epsilons of tens); releases
#: without sampling use dp-accounting's default orders, fractional ones included
RDP_ORDERS = (*range(2, 65), 80, 96, 128, 192, 256, 384, 512, 1024)
#: the neighbouring relation each kind of run is accounted under (docs/privacy.md, "The accountant")
ADD_OR_REMOVE, REPLACE_ONE, REPLACE_DATA_SET = "add-or-remove-one", "replace-one", "replace-one-data-set"


@dataclass(frozen=True)
class Bound:
    """An (epsilon, delta) bound and how it was found: ``epsilon`` is the tightest sound bound, ``accountant`` names
    the one that gave it (``pld``, ``rdp`` or, for fixed-size cohorts, ``coalition``); ``rdp`` and ``pld`` are the
    Rényi-DP and privacy-loss-distribution accountants' bounds (for fixed-size cohorts, which neither accounts
    against a coalition that knows the cohorts, those of the same releases without amplification)."""

    epsilon: float
    accountant: str
    rdp: float
    pld: float


@dataclass(frozen=True)
class Release:
    """``count`` releases made alike, as the release journal records them: each one's noise multiplier (the noise
    std over the clip bound) and how its contributors were drawn (``sampling``, one of :data:`RELEASE_KINDS`; a
    given client is in it with probability ``rate``: 1 for ``all`` and ``local``, q under Poisson sampling, m / N for
    a fixed-size cohort of m of N)."""

    noise_multiplier: float
    sampling: str = "all"
    rate: float = 1.0
    count: int = 1

    def __post_init__(self) -> None:
        check_noise_multiplier(self.noise_multiplier)
        if self.sampling not in RELEASE_KINDS:
            raise PrivacyConfigError(f"a release's sampling must be one of {RELEASE_KINDS}, got {self.sampling!r}")
        if not 0 < self.rate <= 1:
            raise PrivacyConfigError(f"a release's sampling rate must be in (0, 1], got {self.rate}")
        _check_count("releases", self.count)

    @property
    def sampled(self) -> bool:
        """Whether a given client may be left out of it (a rate below 1)."""
        return self.sampling in SAMPLINGS and self.rate < 1


def _check_count(name: str, count: int) -> None:
    if count < 0:
        raise PrivacyConfigError(f"{name} must be >= 0, got {count}")


def _tighter(rdp: float, pld: float) -> Bound:
    if pld < rdp:
        return Bound(pld, "pld", rdp, pld)
    return Bound(rdp, "rdp", rdp, pld)


def _pld_accountant(epsilon_scale: float):
    """dp-accounting's PLD accountant, its discretization 1e-4 of ``epsilon_scale`` (at least 1e-3): pessimistic
    (an upper bound whatever the step), and fast also where epsilon is in the thousands."""
    from dp_accounting.pld import PLDAccountant

    return PLDAccountant(value_discretization_interval=max(1e-3, 1e-4 * epsilon_scale))


def _rdp_accountant(sampled: bool = True):
    import dp_accounting

    return dp_accounting.rdp.RdpAccountant(orders=list(RDP_ORDERS)) if sampled else dp_accounting.rdp.RdpAccountant()


def _event(noise_multiplier: float, rate: float):
    """dp-accounting's event of one release: the Gaussian mechanism, Poisson-subsampled where ``rate`` < 1."""
    import dp_accounting

    gaussian = dp_accounting.GaussianDpEvent(noise_multiplier)
    return gaussian if rate >= 1 else dp_accounting.PoissonSampledDpEvent(rate, gaussian)


def _composed(events: Sequence[tuple[float, float, int]], delta: float) -> Bound:
    """The tighter of dp-accounting's Rényi-DP and PLD bounds of ``events`` ((noise multiplier, Poisson rate,
    count) each) composed, add-or-remove-one neighbours."""
    rdp = _rdp_accountant(sampled=any(rate < 1 for _, rate, _ in events))
    for sigma, rate, count in events:
        rdp.compose(_event(sigma, rate), count)
    rdp_epsilon = float(rdp.get_epsilon(delta))
    pld = _pld_accountant(rdp_epsilon)
    for sigma, rate, count in events:
        pld.compose(_event(sigma, rate), count)
    return _tighter(rdp_epsilon, float(pld.get_epsilon(delta)))


def gaussian_delta(epsilon: float, mu: np.ndarray) -> np.ndarray:
    """The exact privacy curve of the Gaussian mechanism of sensitivity over noise std ``mu`` (Balle & Wang 2018,
    Theorem 8): ``Phi(mu/2 - eps/mu) - e^eps Phi(-mu/2 - eps/mu)`` (0 where mu = 0), computed in log space."""
    from scipy.special import log_ndtr, ndtr

    mu = np.asarray(mu, dtype=np.float64)
    out = np.zeros_like(mu)
    some = mu > 0
    m = mu[some]
    out[some] = np.maximum(ndtr(m / 2 - epsilon / m) - np.exp(epsilon + log_ndtr(-m / 2 - epsilon / m)), 0.0)
    return out


#: the most points of the distribution of mu^2 the coalition bound enumerates before it merges rounds (an upper bound)
_MIXTURE_POINTS = 200_000


def _participation(groups: Sequence[tuple[float, float, int]]) -> tuple[np.ndarray, np.ndarray]:
    """(mu, probability) of the rounds a given client is in: in each group of ``count`` rounds of noise multiplier
    sigma, Binomial(count, rate) of them, each adding (2 / sigma)^2 to mu^2 (replace-one: the sum moves by 2C)."""
    from scipy.stats import binom

    size = math.prod(count + 1 for _, _, count in groups)
    if size > _MIXTURE_POINTS:  # merged: the least noise and the highest rate of any group, over every round
        groups = [(min(g[0] for g in groups), max(g[1] for g in groups), sum(g[2] for g in groups))]
    mu2, prob = np.zeros(1), np.ones(1)
    for sigma, rate, count in groups:
        k = np.arange(count + 1)
        pk = binom.pmf(k, count, rate)
        mu2 = (mu2[:, None] + k[None, :] * (2.0 / sigma) ** 2).ravel()
        prob = (prob[:, None] * pk[None, :]).ravel()
    return np.sqrt(mu2), prob


def coalition_epsilon(groups: Sequence[tuple[float, float, int]], delta: float) -> float:
    """Epsilon at ``delta`` of fixed-size cohorts against a coalition of the other clients.

    With m of N clients drawn per round, the other N - 1 together know whether a given client was drawn (m, or
    m - 1 of them were).  Given which rounds it was in (the same in both neighbouring runs: the draw does not
    depend on data), the releases are a composition of Gaussian mechanisms over those rounds only, replace-one
    neighbours (sensitivity 2C), so the privacy curve is the mixture over the rounds it may have been in:
    ``delta(eps) = sum_k P(k) delta_Gauss(eps; mu_k)``.  Exact (up to the root finding, rounded up); ``groups``:
    (noise multiplier, rate m / N, rounds) of alike rounds.
    """
    from scipy.optimize import brentq

    delta = check_delta(delta)
    mu, prob = _participation(groups)

    def excess(eps: float) -> float:
        return float(np.dot(prob, gaussian_delta(eps, mu))) - delta

    if excess(0.0) <= 0:
        return 0.0
    high = 1.0
    while excess(high) > 0:
        high *= 2
    eps = float(brentq(excess, 0.0, high, xtol=1e-10, rtol=1e-12))
    while excess(eps) > 0:  # never below the root
        eps = math.nextafter(eps, math.inf) + 1e-10
    return eps


@functools.lru_cache(maxsize=1024)
def _bound_of(releases: tuple[Release, ...], delta: float) -> tuple[Bound, str]:
    kinds = {r.sampling for r in releases}
    if kinds == {"local"}:  # the clipped change moves by up to 2C: noise multiplier sigma / 2, never amplified
        return _composed([(r.noise_multiplier / 2, 1.0, r.count) for r in releases], delta), REPLACE_DATA_SET
    if "local" in kinds:
        raise PrivacyConfigError("local and central releases cannot be composed into one client's bound")
    if any(r.sampled and r.sampling == "fixed" for r in releases):
        groups = [(r.noise_multiplier, r.rate if r.sampled else 1.0, r.count) for r in releases]
        unamplified = _composed([(r.noise_multiplier / 2, 1.0, r.count) for r in releases], delta)
        coalition = min(coalition_epsilon(groups, delta), unamplified.epsilon)
        return Bound(coalition, "coalition", unamplified.rdp, unamplified.pld), REPLACE_ONE
    events = [(r.noise_multiplier, r.rate if r.sampled else 1.0, r.count) for r in releases]
    return _composed(events, delta), ADD_OR_REMOVE


def releases_bound(releases: Sequence[Release], delta: float) -> tuple[Bound, str]:
    """(the bound, the neighbouring relation it holds for) of a run's ``releases`` as they were made, each at its
    own noise multiplier and sampling (docs/privacy.md, "The accountant"):

    - ``local``: each release is the Gaussian mechanism with multiplier sigma / 2 on one client's data set against
      any other (``replace-one-data-set``), composed over the releases, never amplified;
    - every client in every round (``all``) or Poisson sampling: the (Poisson-subsampled) Gaussian mechanism of
      multiplier sigma, ``add-or-remove-one`` neighbours (one client's data in or out, the population N declared);
      dp-accounting's RDP and PLD accountants, the tighter reported;
    - once any round drew a fixed-size cohort: ``replace-one`` neighbours, the bound against the coalition of the
      other clients (:func:`coalition_epsilon`), which knows who was drawn.

    No release: 0; any release without noise: infinity.
    """
    delta = check_delta(delta)
    counts: dict[tuple[float, str, float], int] = {}
    for r in releases:  # alike releases as one event of their count: a run's bound does not depend on their order
        if r.count > 0:
            key = (r.noise_multiplier, r.sampling, r.rate)
            counts[key] = counts.get(key, 0) + r.count
    kept = tuple(Release(sigma, kind, rate, count) for (sigma, kind, rate), count in sorted(counts.items()))
    if not kept:
        return Bound(0.0, "none", 0.0, 0.0), _neighbours(releases)
    if any(r.noise_multiplier == 0 for r in kept):
        return Bound(math.inf, "none", math.inf, math.inf), _neighbours(kept)
    return _bound_of(kept, delta)


def _neighbours(releases: Sequence[Release]) -> str:
    if releases and all(r.sampling == "local" for r in releases):
        return REPLACE_DATA_SET
    return REPLACE_ONE if any(r.sampled and r.sampling == "fixed" for r in releases) else ADD_OR_REMOVE


def central_bound(
    noise_multiplier: float, rounds: int, delta: float, rate: float = 1.0, sampling: str = "poisson"
) -> Bound:
    """The bound after ``rounds`` central rounds of noise multiplier sigma, each client in each round with
    probability ``rate`` (1: every client every round) drawn by ``sampling`` (:func:`releases_bound`)."""
    _check_count("rounds", rounds)
    if sampling not in SAMPLINGS:
        raise PrivacyConfigError(f"dp-sampling must be one of {SAMPLINGS}, got {sampling!r}")
    kind = sampling if rate < 1 else "all"
    return releases_bound([Release(check_noise_multiplier(noise_multiplier), kind, rate, rounds)], delta)[0]


def local_bound(noise_multiplier: float, releases: int, delta: float) -> Bound:
    """The bound of one client after ``releases`` local-DP releases of its model, each of noise multiplier sigma."""
    _check_count("releases", releases)
    return releases_bound([Release(check_noise_multiplier(noise_multiplier), "local", 1.0, releases)], delta)[0]


def central_epsilon(
    noise_multiplier: float, rounds: int, delta: float, rate: float = 1.0, sampling: str = "poisson"
) -> float:
    """Epsilon at ``delta`` after ``rounds`` central rounds (:func:`central_bound`)."""
    return central_bound(noise_multiplier, rounds, delta, rate, sampling).epsilon


def local_epsilon(noise_multiplier: float, releases: int, delta: float) -> float:
    """Epsilon at ``delta`` of one client after ``releases`` local-DP releases (:func:`local_bound`)."""
    return local_bound(noise_multiplier, releases, delta).epsilon


# ---------------------------------------------------------------------------------------------- calibration
def _calibrate(make_accountant, make_event, target_epsilon: float, delta: float, bracket) -> float:
    import dp_accounting

    return float(dp_accounting.calibrate_dp_mechanism(make_accountant, make_event, target_epsilon, delta, bracket))


def _smallest_within(bound, target_epsilon: float, candidates: list[float]) -> float:
    """The smallest candidate whose reported bound is at most the target (each candidate was calibrated by one
    accountant; the reported bound is the tighter of them, so each is a valid answer), nudged up by a hair where a
    different discretization put the report a rounding above it."""
    sigma = min(candidates)
    while bound(sigma) > target_epsilon:
        sigma *= 1.0001
    return sigma


def _rdp_and_pld_candidates(target_epsilon: float, delta: float, count: int, rate: float, scale: float) -> list[float]:
    """Each accountant's multiplier (times ``scale``: local DP's events have multiplier sigma / 2) for ``count``
    events of rate ``rate``: dp-accounting's ``calibrate_dp_mechanism`` on the Rényi-DP accountant, then on the PLD
    accountant searched below it (which the PLD bound never exceeds in practice; the Rényi-DP one where that fails)."""
    import dp_accounting

    def event(s):
        return dp_accounting.SelfComposedDpEvent(_event(s, rate), count)

    rdp = scale * _calibrate(
        lambda: _rdp_accountant(sampled=rate < 1),
        event,
        target_epsilon,
        delta,
        dp_accounting.LowerEndpointAndGuess(1e-3, 1.0),
    )
    low, high = rdp / scale / 2, rdp / scale
    try:
        pld = scale * _calibrate(
            lambda: _pld_accountant(target_epsilon),
            event,
            target_epsilon,
            delta,
            dp_accounting.ExplicitBracketInterval(low, high),
        )
    except ValueError:  # no sign change in the bracket: keep the Rényi-DP multiplier
        pld = rdp
    return [rdp, pld]


def _coalition_sigma(target_epsilon: float, delta: float, rounds: int, rate: float) -> float:
    """The noise multiplier whose :func:`coalition_epsilon` after ``rounds`` fixed-size rounds is the target."""
    from scipy.optimize import brentq

    def excess(log_sigma: float) -> float:
        return coalition_epsilon([(math.exp(log_sigma), rate, rounds)], delta) - target_epsilon

    low, high = 0.0, 0.0
    while excess(high) > 0:
        high += 1.0
    while excess(low) <= 0:
        low -= 1.0
    return math.exp(float(brentq(excess, low, high, xtol=1e-7)))


def calibrate_central(
    target_epsilon: float, delta: float, rounds: int, rate: float = 1.0, sampling: str = "poisson"
) -> float:
    """The noise multiplier whose :func:`central_bound` after ``rounds`` rounds (each client in each with
    probability ``rate``, drawn by ``sampling``) is ``target_epsilon`` at ``delta`` (at most, within 1e-6 of sigma):
    dp-accounting's ``calibrate_dp_mechanism`` on its Rényi-DP and PLD accountants (every client, or Poisson
    sampling), the coalition bound's own root (fixed-size cohorts); the smallest multiplier kept (as Opacus's
    ``make_private_with_epsilon`` does for DP-SGD)."""
    target_epsilon, delta = _check_target(target_epsilon), check_delta(delta)
    if rounds < 1 or not 0 < rate <= 1:
        raise PrivacyConfigError(f"calibration needs rounds >= 1 and a rate in (0, 1], got {rounds} and {rate}")
    if sampling not in SAMPLINGS:
        raise PrivacyConfigError(f"dp-sampling must be one of {SAMPLINGS}, got {sampling!r}")
    if sampling == "fixed" and rate < 1:
        candidates = [_coalition_sigma(target_epsilon, delta, rounds, rate)]
    else:
        candidates = _rdp_and_pld_candidates(target_epsilon, delta, rounds, rate, scale=1.0)
    return _smallest_within(
        lambda s: central_bound(s, rounds, delta, rate, sampling).epsilon, target_epsilon, candidates
    )


def calibrate_local(target_epsilon: float, delta: float, releases: int) -> float:
    """The noise multiplier whose :func:`local_bound` after ``releases`` releases is ``target_epsilon`` at
    ``delta`` (at most): dp-accounting's ``calibrate_dp_mechanism`` on the Rényi-DP and on the PLD accountant."""
    target_epsilon, delta = _check_target(target_epsilon), check_delta(delta)
    if releases < 1:
        raise PrivacyConfigError(f"calibration needs at least one release, got {releases}")
    candidates = _rdp_and_pld_candidates(target_epsilon, delta, releases, 1.0, scale=2.0)
    return _smallest_within(lambda s: local_bound(s, releases, delta).epsilon, target_epsilon, candidates)


def _check_target(target_epsilon: float) -> float:
    target_epsilon = float(target_epsilon)
    if not (target_epsilon > 0 and math.isfinite(target_epsilon)):
        raise PrivacyConfigError(f"a target epsilon must be finite and > 0, got {target_epsilon}")
    return target_epsilon

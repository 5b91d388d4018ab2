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


def clip_update(update: Mapping[str, np.ndarray], clip: float) -> dict[str, np.ndarray]:
    """Flat L2 clipping (McMahan et al. 2018, Algorithm 1, ``ClipFn``): ``Δ · min(1, C / ||Δ||_2)``.

    The norm is that of the whole update flattened into one vector (:func:`update_norm`), so the result has norm
    at most ``clip``; an update already within the bound (and ``clip = inf``) is returned unchanged.  Each array
    keeps its dtype and shape.
    """
    clip = check_clip(clip)
    _check_floating(update)
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


def central_noise_std(noise_multiplier: float, clip: float, num_clients: int) -> float:
    """Std of the noise on the **mean** of ``m`` clipped updates (central DP): ``sigma · C / m``.

    The same as noise ``sigma · C`` on their sum (DP-FedAvg, McMahan et al. 2018, with the fixed denominator ``m``);
    Flower's ``compute_stdv`` has the same formula.
    """
    if num_clients < 1:
        raise PrivacyConfigError(f"the noisy mean needs at least one client, got {num_clients}")
    return local_noise_std(noise_multiplier, clip) / num_clients


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
) -> dict[str, np.ndarray]:
    """Central DP's release: ``(1/m) Σ_i Δ_i + N(0, (sigma C / m)² I)`` over the ``m`` clipped updates of a round.

    The mean is unweighted: a weight per client (e.g. its number of examples) would change each client's
    sensitivity and itself reveal the client's data size.  The updates must already be clipped to ``clip``
    (clients do it, :func:`clip_update`); the noise is added once, here.
    """
    if not clipped_updates:
        raise PrivacyConfigError("the noisy mean needs at least one client update")
    keys = list(clipped_updates[0])
    for u in clipped_updates:
        if sorted(u) != sorted(keys):
            raise PrivacyConfigError(f"client updates carry different arrays: {sorted(u)} vs {sorted(keys)}")
    _check_floating(clipped_updates[0])
    m = len(clipped_updates)
    mean = {
        k: (np.sum([np.asarray(u[k], dtype=np.float64) for u in clipped_updates], axis=0) / m).astype(
            np.asarray(clipped_updates[0][k]).dtype
        )
        for k in keys
    }
    return add_gaussian_noise(mean, central_noise_std(noise_multiplier, clip, m), rng)


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


def noisy_unclipped_share(norms: Sequence[float], clip: float, count_stddev: float, rng: np.random.Generator) -> float:
    """The round's share of updates that the clip bound left unchanged, noised: ``(sum_i 1[||Δ_i|| <= C] +
    N(0, count_stddev^2)) / m`` (Andrew et al. 2021, Algorithm 1)."""
    if not norms:
        raise PrivacyConfigError("the unclipped share needs at least one update")
    unclipped = sum(1 for n in norms if n <= clip)
    return float((unclipped + rng.normal(0.0, count_stddev)) / len(norms))


def next_clip(clip: float, unclipped_share: float, target_quantile: float, learning_rate: float) -> float:
    """The geometric update of the clip bound toward the ``target_quantile`` of the update norms (Andrew et al. 2021,
    Algorithm 1): ``C * exp(-lr (b - gamma))``, ``b`` the noised unclipped share.  More updates unclipped than the
    target: the bound shrinks."""
    return float(clip * math.exp(-learning_rate * (unclipped_share - target_quantile)))


# ---------------------------------------------------------------------------------------------- accountant
@dataclass(frozen=True)
class Bound:
    """An (epsilon, delta) bound and how it was found: ``epsilon`` is the tighter of the Rényi-DP accountant's bound
    (``rdp``) and the privacy-loss-distribution accountant's (``pld``; for a fixed-size cohort, which it cannot
    account, the bound of the same rounds without amplification); ``accountant`` names the one that gave it."""

    epsilon: float
    accountant: str
    rdp: float
    pld: float


def _rdp_epsilon(noise_multiplier: float, count: int, delta: float, population: int, cohort: int, sampled: bool):
    """Epsilon of ``count`` identical Gaussian events through Flower's RdpAccountant (dp-accounting backend)."""
    from flwr.serverapp import GaussianPrivacyEvent, NeighboringRelation, PrivacyConfig, RdpAccountant, SamplingMethod

    config = PrivacyConfig(
        target_delta=delta,
        population_size=population,
        neighboring_relation=NeighboringRelation.REPLACE_ONE if sampled else NeighboringRelation.ADD_OR_REMOVE_ONE,
        sampling_method=SamplingMethod.WITHOUT_REPLACEMENT if sampled else SamplingMethod.NO_AMPLIFICATION,
    )
    accountant = RdpAccountant(config)
    accountant.compose(GaussianPrivacyEvent(noise_multiplier, cohort, population), count=count)
    return accountant.get_epsilon(delta)


def _pld_accountant(epsilon_scale: float):
    """dp-accounting's PLD accountant, its discretization 1e-4 of ``epsilon_scale`` (at least 1e-3): pessimistic
    (an upper bound whatever the step), and fast also where epsilon is in the thousands."""
    from dp_accounting.pld import PLDAccountant

    return PLDAccountant(value_discretization_interval=max(1e-3, 1e-4 * epsilon_scale))


def _pld_epsilon(noise_multiplier: float, count: int, delta: float, epsilon_scale: float) -> float:
    """Epsilon of ``count`` Gaussian mechanisms of multiplier sigma, add-or-remove-one, through dp-accounting's
    privacy-loss-distribution accountant (near the exact curve: Gaussian compositions are a Gaussian)."""
    import dp_accounting

    accountant = _pld_accountant(epsilon_scale)
    accountant.compose(dp_accounting.GaussianDpEvent(noise_multiplier), count)
    return float(accountant.get_epsilon(delta))


def _tighter(rdp: float, pld: float) -> Bound:
    if pld < rdp:
        return Bound(pld, "pld", rdp, pld)
    return Bound(rdp, "rdp", rdp, pld)


def _check_count(name: str, count: int) -> None:
    if count < 0:
        raise PrivacyConfigError(f"{name} must be >= 0, got {count}")


def central_bound(noise_multiplier: float, rounds: int, delta: float, population: int, cohort: int) -> Bound:
    """The bound after ``rounds`` noised means of ``cohort`` of ``population`` clients (central DP).

    ``cohort == population``: the Gaussian mechanism with noise multiplier sigma, add-or-remove-one-client neighbours,
    no amplification (both accountants).  ``cohort < population`` (drawn uniformly without replacement every round,
    by a generator only the server holds): the sampled Gaussian mechanism at rate ``cohort / population`` with
    replace-one neighbours and noise multiplier sigma / 2 (module docstring; Rényi DP only: dp-accounting's PLD
    accountant has no fixed-size sampling), or the same Gaussian without amplification (both accountants) where that
    bound is lower (cohorts close to the population).  0 rounds: 0; sigma = 0 (no noise): infinity.
    """
    noise_multiplier, delta = check_noise_multiplier(noise_multiplier), check_delta(delta)
    _check_count("rounds", rounds)
    if not 1 <= cohort <= population:
        raise PrivacyConfigError(f"need 1 <= cohort <= population, got cohort {cohort} of {population} clients")
    if rounds == 0:
        return Bound(0.0, "none", 0.0, 0.0)
    if noise_multiplier == 0:
        return Bound(math.inf, "none", math.inf, math.inf)
    if cohort == population:
        rdp = _rdp_epsilon(noise_multiplier, rounds, delta, population, cohort, sampled=False)
        return _tighter(rdp, _pld_epsilon(noise_multiplier, rounds, delta, rdp))
    # sampling can only help: the replace-one Gaussian without amplification bounds the same mechanism, and
    # Wang et al.'s bound is the looser of the two for cohorts close to the population
    unamplified = local_bound(noise_multiplier, rounds, delta)
    sampled = _rdp_epsilon(noise_multiplier / 2, rounds, delta, population, cohort, sampled=True)
    return _tighter(min(sampled, unamplified.rdp), unamplified.pld)


def local_bound(noise_multiplier: float, releases: int, delta: float) -> Bound:
    """The bound of one client after ``releases`` local-DP releases of its model.

    Each release is the Gaussian mechanism with noise std sigma·C on a change that moves by up to 2·C between any two
    data sets of the client: noise multiplier sigma / 2, composed ``releases`` times, no amplification.
    """
    noise_multiplier, delta = check_noise_multiplier(noise_multiplier), check_delta(delta)
    _check_count("releases", releases)
    if releases == 0:
        return Bound(0.0, "none", 0.0, 0.0)
    if noise_multiplier == 0:
        return Bound(math.inf, "none", math.inf, math.inf)
    rdp = _rdp_epsilon(noise_multiplier / 2, releases, delta, population=1, cohort=1, sampled=False)
    return _tighter(rdp, _pld_epsilon(noise_multiplier / 2, releases, delta, rdp))


def central_epsilon(noise_multiplier: float, rounds: int, delta: float, population: int, cohort: int) -> float:
    """Epsilon at ``delta`` after ``rounds`` noised means of ``cohort`` of ``population`` clients: the tighter
    accountant's (:func:`central_bound`)."""
    return central_bound(noise_multiplier, rounds, delta, population, cohort).epsilon


def local_epsilon(noise_multiplier: float, releases: int, delta: float) -> float:
    """Epsilon at ``delta`` of one client after ``releases`` local-DP releases: the tighter accountant's
    (:func:`local_bound`)."""
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


def calibrate_central(target_epsilon: float, delta: float, rounds: int, population: int, cohort: int) -> float:
    """The noise multiplier whose :func:`central_bound` after ``rounds`` rounds of ``cohort`` of ``population``
    clients is ``target_epsilon`` at ``delta`` (at most, within 1e-6 of sigma): dp-accounting's
    ``calibrate_dp_mechanism`` on each accountant that can account the run, the smallest multiplier kept (as Opacus's
    ``make_private_with_epsilon`` does for DP-SGD)."""
    import dp_accounting

    target_epsilon, delta = _check_target(target_epsilon), check_delta(delta)
    if rounds < 1 or not 1 <= cohort <= population:
        raise PrivacyConfigError(
            f"calibration needs rounds >= 1 and 1 <= cohort <= population, got {rounds}, {cohort} of {population}"
        )
    replace = dp_accounting.NeighboringRelation.REPLACE_ONE
    bracket = dp_accounting.LowerEndpointAndGuess(1e-3, 1.0)
    if cohort == population:
        rdp = _calibrate(
            dp_accounting.rdp.RdpAccountant,
            lambda s: dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(s), rounds),
            target_epsilon,
            delta,
            bracket,
        )
        candidates = [rdp, _calibrate_pld(target_epsilon, delta, rounds, rdp, scale=1.0)]
    else:
        sampled = _calibrate(
            lambda: dp_accounting.rdp.RdpAccountant(neighboring_relation=replace),
            lambda s: dp_accounting.SelfComposedDpEvent(
                dp_accounting.SampledWithoutReplacementDpEvent(
                    population, cohort, dp_accounting.GaussianDpEvent(s / 2)
                ),
                rounds,
            ),
            target_epsilon,
            delta,
            bracket,
        )
        candidates = [sampled, calibrate_local(target_epsilon, delta, rounds)]
    return _smallest_within(
        lambda s: central_bound(s, rounds, delta, population, cohort).epsilon, target_epsilon, candidates
    )


def calibrate_local(target_epsilon: float, delta: float, releases: int) -> float:
    """The noise multiplier whose :func:`local_bound` after ``releases`` releases is ``target_epsilon`` at
    ``delta`` (at most): dp-accounting's ``calibrate_dp_mechanism`` on the Rényi-DP and on the PLD accountant."""
    import dp_accounting

    target_epsilon, delta = _check_target(target_epsilon), check_delta(delta)
    if releases < 1:
        raise PrivacyConfigError(f"calibration needs at least one release, got {releases}")
    rdp = 2 * _calibrate(
        dp_accounting.rdp.RdpAccountant,
        lambda s: dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(s), releases),
        target_epsilon,
        delta,
        dp_accounting.LowerEndpointAndGuess(1e-3, 1.0),
    )
    candidates = [rdp, _calibrate_pld(target_epsilon, delta, releases, rdp, scale=2.0)]
    return _smallest_within(lambda s: local_bound(s, releases, delta).epsilon, target_epsilon, candidates)


def _calibrate_pld(target_epsilon: float, delta: float, count: int, rdp_sigma: float, scale: float) -> float:
    """The PLD accountant's multiplier (times ``scale``: local DP's events have multiplier sigma / 2), searched below
    the Rényi-DP one, which the PLD bound never exceeds in practice; the Rényi-DP one where that fails."""
    import dp_accounting

    def make():
        return _pld_accountant(target_epsilon)

    def event(s):
        return dp_accounting.SelfComposedDpEvent(dp_accounting.GaussianDpEvent(s), count)

    low, high = rdp_sigma / scale / 2, rdp_sigma / scale
    try:
        return scale * _calibrate(make, event, target_epsilon, delta, dp_accounting.ExplicitBracketInterval(low, high))
    except ValueError:  # no sign change in the bracket: keep the Rényi-DP multiplier
        return rdp_sigma


def _check_target(target_epsilon: float) -> float:
    target_epsilon = float(target_epsilon)
    if not (target_epsilon > 0 and math.isfinite(target_epsilon)):
        raise PrivacyConfigError(f"a target epsilon must be finite and > 0, got {target_epsilon}")
    return target_epsilon

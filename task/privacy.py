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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

MODES = ("off", "central", "local")


class PrivacyConfigError(ValueError):
    """A differential-privacy setting that cannot be used (the message says which and what is allowed)."""


@dataclass(frozen=True)
class PrivacySupport:
    """The DP modes a method supports besides ``off``, and why it cannot give the others (docs/privacy.md)."""

    modes: tuple[str, ...] = ()
    why_not: str = "it declares no differential-privacy mode (privacy= on its registry entry)"


#: central DP on the averaged shared part; local DP, possible for the same methods, is not implemented yet
CENTRAL = PrivacySupport(("central",), "local DP is not implemented for it yet")


def privacy_conflicts(
    method: str, mode: str, clip: float, noise_multiplier: float, delta: float, support: PrivacySupport
) -> list[str]:
    """Why the run's ``dp-*`` settings cannot work with ``method`` (empty: they can); checked at start-up."""
    if mode == "off":
        return []
    if mode not in support.modes:
        reason = (
            f"dp-mode={mode!r} is not available for method {method!r}: {support.why_not} (docs/privacy.md lists "
            "which method supports which mode; dp-mode='off' runs without differential privacy)"
        )
        return [reason]
    problems = []
    if clip == 0 and noise_multiplier > 0:
        problems.append(
            f"dp-noise-multiplier={noise_multiplier} needs a clip bound dp-clip > 0 (0: no clipping): noise on "
            "unbounded updates gives no guarantee"
        )
    if not 0 < delta < 1:
        problems.append(f"dp-delta must be strictly between 0 and 1, got {delta}")
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


# ---------------------------------------------------------------------------------------------- accountant
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


def central_epsilon(noise_multiplier: float, rounds: int, delta: float, population: int, cohort: int) -> float:
    """Epsilon at ``delta`` after ``rounds`` noised means of ``cohort`` of ``population`` clients (central DP).

    ``cohort == population``: the Gaussian mechanism with noise multiplier sigma, add-or-remove-one-client neighbours,
    no amplification.  ``cohort < population`` (drawn uniformly without replacement every round): the sampled
    Gaussian mechanism at rate ``cohort / population`` with replace-one neighbours and noise multiplier sigma / 2
    (module docstring), or the same Gaussian without amplification where that bound is lower (cohorts close to the
    population).  0 rounds: 0; sigma = 0 (no noise): infinity.
    """
    noise_multiplier, delta = check_noise_multiplier(noise_multiplier), check_delta(delta)
    if rounds < 0:
        raise PrivacyConfigError(f"rounds must be >= 0, got {rounds}")
    if not 1 <= cohort <= population:
        raise PrivacyConfigError(f"need 1 <= cohort <= population, got cohort {cohort} of {population} clients")
    if rounds == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    if cohort == population:
        return _rdp_epsilon(noise_multiplier, rounds, delta, population, cohort, sampled=False)
    # sampling can only help: the replace-one Gaussian without amplification bounds the same mechanism, and
    # Wang et al.'s bound is the looser of the two for cohorts close to the population
    return min(
        _rdp_epsilon(noise_multiplier / 2, rounds, delta, population, cohort, sampled=True),
        local_epsilon(noise_multiplier, rounds, delta),
    )


def local_epsilon(noise_multiplier: float, releases: int, delta: float) -> float:
    """Epsilon at ``delta`` of one client after ``releases`` local-DP releases of its model.

    Each release is the Gaussian mechanism with noise std sigma·C on a change that moves by up to 2·C between any two
    data sets of the client: noise multiplier sigma / 2, composed ``releases`` times, no amplification.
    """
    noise_multiplier, delta = check_noise_multiplier(noise_multiplier), check_delta(delta)
    if releases < 0:
        raise PrivacyConfigError(f"releases must be >= 0, got {releases}")
    if releases == 0:
        return 0.0
    if noise_multiplier == 0:
        return math.inf
    return _rdp_epsilon(noise_multiplier / 2, releases, delta, population=1, cohort=1, sampled=False)

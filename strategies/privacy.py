"""The server's half of client-level differential privacy (docs/privacy.md, task/privacy.py).

Central mode, one round: each client's update is its reply minus the model the server sent (clients clipped it
already; the server clips again, so one client that skipped it cannot break the bound for the others), the updates are
averaged **without weights**, Gaussian noise of std ``sigma * C / m`` is added once to that mean, and the
accountant's epsilon after all noised rounds so far goes into the round's history as ``extra["dp"]``.

Local mode: the clients clipped and noised their models themselves; the server only accounts
(:func:`account_local`).
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from task.privacy import (
    central_epsilon,
    central_noise_std,
    clip_bound,
    clip_update,
    local_epsilon,
    local_noise_std,
    model_delta,
    noisy_mean,
    update_norm,
)

#: a tag in the noise generator's seed, so DP noise never repeats another of the run's random streams
NOISE_STREAM = 27


def noise_secret() -> str:
    """A fresh secret for the server's DP noise (128 bits from the operating system, as hex).  Not the run's
    ``seed``: every client receives the run config, so noise drawn from it could be regenerated and subtracted.
    The strategy keeps the secret in its checkpoint (server-side), so a resumed run draws the same noise for a
    round it repeats: a repeated round releases the same model again, not a second noisy view of it."""
    return secrets.token_hex(16)


def noise_generator(secret: str, server_round: int) -> np.random.Generator:
    """The round's noise: seeded by the server's secret (:func:`noise_secret`) and the round."""
    return np.random.default_rng([int(secret, 16), int(server_round), NOISE_STREAM])


def central_round(
    global_state: Mapping[str, np.ndarray],
    replies: Sequence[Mapping[str, np.ndarray]],
    keys: Sequence[str],
    settings: Any,
    server_round: int,
    secret: str,
    variances: Sequence[str] = (),
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(the new shared model, what the round released) from the round's valid replies (``keys`` of each).

    ``variances`` (BatchNorm's running variances) cannot be negative: noise can push them below 0, so they are
    projected back to 0 after the noise, a post-processing that costs no privacy.
    """
    clip = clip_bound(settings.dp_clip)
    reference = {k: global_state[k] for k in keys}
    deltas = [model_delta({k: r[k] for k in keys}, reference) for r in replies]
    largest = max(update_norm(d) for d in deltas)
    update = noisy_mean(
        [clip_update(d, clip) for d in deltas],
        settings.dp_noise_multiplier,
        clip,
        noise_generator(secret, server_round),
    )
    new_state = dict(global_state)
    new_state.update({k: (reference[k] + update[k]).astype(reference[k].dtype) for k in keys})
    for k in variances:
        new_state[k] = np.maximum(new_state[k], 0).astype(new_state[k].dtype)
    released = {
        "mode": "central",
        "clients": len(replies),
        "noise-std": central_noise_std(settings.dp_noise_multiplier, clip, len(replies)),
        "largest-update-norm": largest,
    }
    return new_state, released


def central_aggregate(strategy: Any, server_round: int, updates: Sequence[Any]) -> dict[str, Any]:
    """Central DP's round on ``strategy`` (a :class:`strategies.base.PersonalizedStrategy`): its global model becomes
    the unweighted mean of the clipped updates plus noise (:func:`central_round`); returns the history entry with
    the run's privacy spent so far (:func:`account`, with the round's population and cohort)."""
    keys = strategy.released_keys()
    variances = [k for k in keys if k in strategy.model_info.buffer_keys and k.endswith("running_var")]
    strategy.global_state, released = central_round(
        strategy.global_state,
        [u.arrays for u in updates],
        keys,
        strategy.settings,
        server_round,
        strategy.noise_secret,
        variances,
    )
    return {"dp": account(strategy.history, released, strategy.settings, *strategy.dp_sample)}


def account(history: Sequence[Any], released: dict[str, Any], settings: Any, population: int, cohort: int) -> dict:
    """``released`` with the run's epsilon after this round (a cohort of ``cohort`` of ``population`` clients),
    composed over every noised round in ``history`` and this one.

    While every round had every client: add-or-remove-one neighbours, no amplification.  Once any round drew a
    cohort: replace-one neighbours (the only relation fixed-size sampling is analysed under) for all rounds,
    each counted at the highest sampling rate any of them had, which can only overstate epsilon.
    """
    earlier = [r.extra["dp"] for r in history if "dp" in r.extra]
    samples = [(e["cohort"], e["population"]) for e in earlier] + [(cohort, population)]
    rounds, sigma, delta = len(samples), settings.dp_noise_multiplier, settings.dp_delta
    if all(c == p for c, p in samples):
        epsilon, neighbours = central_epsilon(sigma, rounds, delta, population, population), "add-or-remove-one"
    else:
        worst_cohort, worst_population = max(samples, key=lambda cp: cp[0] / cp[1])
        epsilon = (
            central_epsilon(sigma, rounds, delta, worst_population, worst_cohort)
            if worst_cohort < worst_population
            else local_epsilon(sigma, rounds, delta)  # the replace-one Gaussian without amplification
        )
        neighbours = "replace-one"
    return {
        **released,
        "cohort": cohort,
        "population": population,
        "noised-rounds": rounds,
        "neighbours": neighbours,
        "epsilon": epsilon,
        "delta": delta,
    }


def account_local(history: Sequence[Any], clients: int, settings: Any, extra: int = 0) -> dict[str, Any]:
    """What a local-DP round released, with every client's epsilon after it (``extra["dp"]``).

    ``history`` holds every round so far, this one last.  A client releases at most one model per round in its
    train reply, so after r rounds no client has released more than r times, plus ``extra`` releases outside the
    train replies so far (pFedLIA's lazy model, one per lazy query): ``local_epsilon(sigma, r + extra, delta)``
    bounds every client's epsilon.  Every round counts, also one whose replies were all rejected (they left their
    clients all the same); a client that was not sent a train message in some round released less.  ``clients`` is
    the number of valid train releases this round received.
    """
    releases = len(history) + extra
    sigma, delta = settings.dp_noise_multiplier, settings.dp_delta
    return {
        "mode": "local",
        "clients": clients,
        "noise-std": local_noise_std(sigma, clip_bound(settings.dp_clip)),
        "releases": releases,
        "neighbours": "replace-one-data-set",
        "epsilon": local_epsilon(sigma, releases, delta),
        "delta": delta,
    }

"""The server's half of client-level differential privacy (docs/privacy.md, task/privacy.py).

Central mode, one round: each client's update is its reply minus the model the server sent (clients clipped it
already; the server clips again, to the round's clip bound, so one client that skipped it cannot break the bound for
the others), the updates are averaged **without weights**, Gaussian noise of std ``z * C / m`` is added once to that
mean from a generator seeded by the operating system's CSPRNG (never stored), and the accountant's epsilon after all
noised rounds so far goes into the round's history as ``extra["dp"]``.  With adaptive clipping the round's clip
bound follows the noised share of unclipped updates (Andrew et al.).

Local mode: the clients clipped and noised their models themselves; the server only accounts
(:func:`account_local`).

Both modes, across rounds (:class:`ServerPrivacy`, kept in the server's checkpoint):

- the noise multiplier, calibrated to ``dp-target-epsilon`` before round 1 when one is set;
- ``dp-max-epsilon``: before a round starts (before anything of it leaves a client or the server) the epsilon the
  round would reach is computed; above the maximum the run stops, with Flower's ``PrivacyBudgetExhausted``, after
  writing the checkpoint of the last complete round;
- a **release journal** (``<results>/checkpoints/dp-journal/``): central DP writes each round's noised model there,
  durably, before it can leave the server, and a round that runs again after a resume releases exactly that model
  again (the new replies are not used), so no two releases of a round differ; local DP writes before each round the
  most releases its clients may have made, and a resumed run charges the releases of the rounds it repeats.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import secrets
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from flwr.serverapp.exception import PrivacyBudgetExhausted

from strategies.exchange import RunAborted
from strategies.persistence import write_checkpoint
from task.privacy import (
    PrivacyConfigError,
    calibrate_central,
    central_bound,
    central_noise_std,
    clip_bound,
    clip_update,
    local_bound,
    local_noise_std,
    model_delta,
    next_clip,
    noise_source,
    noisy_mean,
    noisy_unclipped_share,
    update_noise_multiplier,
    update_norm,
)

log = logging.getLogger("flwr.pflower")

#: the folder of the release journal, under the results folder's checkpoints
JOURNAL = Path("checkpoints") / "dp-journal"


# ---------------------------------------------------------------------------------------------- the cohort
def cohort_generator(settings: Any) -> random.Random:
    """The generator that draws every round's cohort (and evaluation draws).  Without DP: seeded by the run's
    ``seed``, so a run repeats from its run config.  Under DP: seeded by 128 bits of the operating system's CSPRNG
    that only the server holds (its checkpoint keeps the generator, so a resumed run draws on): amplification by
    sampling assumes nobody else can tell who was drawn, and every client receives the run config, seed included."""
    return random.Random(settings.seed if settings.dp_mode == "off" else secrets.randbits(128))


# ---------------------------------------------------------------------------------------------- one central round
def central_round(
    global_state: Mapping[str, np.ndarray],
    replies: Sequence[Mapping[str, np.ndarray]],
    keys: Sequence[str],
    clip: float,
    noise_multiplier: float,
    rng: np.random.Generator,
    count_stddev: float | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(the new shared model, what the round released) from the round's valid replies (``keys`` of each): the
    unweighted mean of the updates clipped to ``clip``, plus noise of multiplier ``noise_multiplier`` on it.

    With ``count_stddev`` (adaptive clipping) the round also releases the noised share of updates the clip left
    unchanged (``unclipped-share``), and the update's noise multiplier is the part of ``noise_multiplier`` the count
    leaves (:func:`task.privacy.update_noise_multiplier`), so the round as a whole is still a Gaussian mechanism of
    ``noise_multiplier``.  Nothing else of the replies is released: no norm, no un-noised statistic.
    """
    reference = {k: global_state[k] for k in keys}
    deltas = [model_delta({k: r[k] for k in keys}, reference) for r in replies]
    z_update = noise_multiplier if count_stddev is None else update_noise_multiplier(noise_multiplier, count_stddev)
    update = noisy_mean([clip_update(d, clip) for d in deltas], z_update, clip, rng)
    new_state = dict(global_state)
    new_state.update({k: (reference[k] + update[k]).astype(reference[k].dtype) for k in keys})
    released: dict[str, Any] = {
        "mode": "central",
        "clients": len(replies),
        "clip": clip,
        "noise-std": central_noise_std(z_update, clip, len(replies)),
    }
    if count_stddev is not None:
        norms = [update_norm(d) for d in deltas]
        released["unclipped-share"] = noisy_unclipped_share(norms, clip, count_stddev, rng)
    return new_state, released


# ---------------------------------------------------------------------------------------------- the journal
def _fsync_dir(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_durably(path: Path, data: bytes) -> None:
    """``data`` into ``path`` through a temporary file, flushed to the disk before and after the rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        Path(tmp).replace(path)
    finally:
        Path(tmp).unlink(missing_ok=True)
    _fsync_dir(path.parent)


def state_digest(state: Mapping[str, np.ndarray]) -> str:
    """SHA-256 of ``state``'s keys, dtypes, shapes and bytes (the model a journaled release was taken against)."""
    h = hashlib.sha256()
    for k in sorted(state):
        a = np.ascontiguousarray(state[k])
        h.update(f"{k}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def journal_release(results: Path, server_round: int, entry: dict[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
    """Journal round ``server_round``'s central release (its model's released ``arrays`` and ``entry``: the record,
    the reference's digest, the privacy state after the round) before it can leave the server."""
    from safetensors.numpy import save

    folder = results / JOURNAL
    _write_durably(
        folder / f"round-{server_round:05d}.safetensors", save({k: np.ascontiguousarray(v) for k, v in arrays.items()})
    )
    _write_durably(folder / f"round-{server_round:05d}.json", json.dumps(entry).encode())


def journaled_release(results: Path, server_round: int) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """(entry, arrays) of round ``server_round``'s journaled central release, or None when it has none."""
    from safetensors.numpy import load_file

    folder = results / JOURNAL
    meta, arrays = folder / f"round-{server_round:05d}.json", folder / f"round-{server_round:05d}.safetensors"
    if not meta.is_file():
        return None
    return json.loads(meta.read_text()), load_file(str(arrays))


def journal_local_releases(results: Path, releases: int) -> None:
    """Local DP: before a round's messages leave, the most releases any client may have made once it ends."""
    _write_durably(results / JOURNAL / "local-releases.json", json.dumps({"releases": releases}).encode())


def journaled_local_releases(results: Path) -> int:
    path = results / JOURNAL / "local-releases.json"
    return int(json.loads(path.read_text())["releases"]) if path.is_file() else 0


# ---------------------------------------------------------------------------------------------- the server's state
class ServerPrivacy:
    """What the server keeps for differential privacy across rounds, in its checkpoint: the noise multiplier
    (``dp-noise-multiplier``, or calibrated to ``dp-target-epsilon`` before round 1), the clip bound (adaptive
    clipping moves it), the count's noise (adaptive clipping) and the releases charged for rounds a resumed run
    repeated (local DP)."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        central_target = settings.dp_mode == "central" and settings.dp_target_epsilon > 0
        #: None until calibrated (central DP with a target, at the first round)
        self.noise_multiplier: float | None = None if central_target else float(settings.dp_noise_multiplier)
        self.clip = clip_bound(settings.dp_clip)
        self.count_stddev: float | None = None  # adaptive clipping: set at the first round (cohort / 20 by default)
        self.charged = 0  # local DP: releases of rounds a resumed run repeats, charged on top of the rounds
        self.resumed_after: int | None = None  # the checkpoint's round, until the journal was read

    def state(self) -> dict[str, Any]:
        return {
            "noise-multiplier": self.noise_multiplier,
            "clip": self.clip,
            "count-stddev": self.count_stddev,
            "charged": self.charged,
        }

    def restore(self, state: Mapping[str, Any], rounds_done: int) -> None:
        self.noise_multiplier = state["noise-multiplier"]
        self.clip = float(state["clip"])
        self.count_stddev = state["count-stddev"]
        self.charged = int(state["charged"])
        self.resumed_after = rounds_done

    @property
    def sigma(self) -> float:
        if self.noise_multiplier is None:
            raise RuntimeError("the noise multiplier is calibrated before the first round")
        return self.noise_multiplier

    def adaptive(self) -> bool:
        return self.settings.dp_mode == "central" and self.settings.dp_adaptive_clip

    # ------------------------------------------------------------------ before a round
    def before_round(self, strategy: Any, server_round: int, population: int, cohort: int) -> None:
        """Before anything of round ``server_round`` leaves a node (its cohort of ``cohort`` of ``population``):
        calibrate the noise (first round), charge the repeats of a resumed run (local DP), journal the releases the
        round may make (local DP), and stop the run if the round would take epsilon above ``dp-max-epsilon``."""
        s = self.settings
        if self.noise_multiplier is None:
            self.noise_multiplier = calibrate_central(s.dp_target_epsilon, s.dp_delta, s.num_rounds, population, cohort)
            log.info(
                "[dp] noise multiplier %.4g: epsilon %g at delta %g after %d rounds of %d of %d clients",
                *(self.noise_multiplier, s.dp_target_epsilon, s.dp_delta, s.num_rounds, cohort, population),
            )
        if self.adaptive() and self.count_stddev is None:
            count_stddev = s.dp_clip_count_stddev or cohort / 20
            try:  # refuses a count noise that would spend the whole round
                update_noise_multiplier(self.sigma, count_stddev)
            except PrivacyConfigError as err:
                raise RunAborted(f"{err} (a cohort of {cohort}; dp-clip-count-stddev=0 means the cohort / 20)") from err
            self.count_stddev = count_stddev
        results = strategy.results_dir
        if s.dp_mode == "local":
            if self.resumed_after is not None and results is not None:
                # releases made in rounds after the checkpoint happen again, with fresh noise: charge the first ones
                done = local_releases_so_far(strategy.history)
                self.charged += max(0, journaled_local_releases(results) - done - self.charged)
            self.resumed_after = None
            after = local_releases_so_far(strategy.history) + self.charged + strategy.local_releases(server_round)
            epsilon = local_bound(self.sigma, after, s.dp_delta).epsilon
            if results is not None:
                journal_local_releases(results, after)
        else:
            epsilon = account(strategy.history, {}, self.sigma, s.dp_delta, population, cohort)["epsilon"]
        if 0 < s.dp_max_epsilon < epsilon:
            stop_for_budget(strategy, server_round, epsilon)

    # ------------------------------------------------------------------ after a central round
    def adapt(self, released: Mapping[str, Any]) -> None:
        """Adaptive clipping: the next round's clip bound from this round's noised unclipped share, never above
        ``dp-clip`` (the bound every client enforces itself)."""
        if self.adaptive() and "unclipped-share" in released:
            s = self.settings
            moved = next_clip(self.clip, released["unclipped-share"], s.dp_clip_quantile, s.dp_clip_lr)
            self.clip = min(moved, clip_bound(s.dp_clip))


def local_releases_so_far(history: Sequence[Any]) -> int:
    """The most releases a client made by the last accounted round (its ``releases``, 0 before any)."""
    records = [r.extra["dp"] for r in history if "dp" in r.extra]
    return int(records[-1]["releases"]) - int(records[-1].get("charged", 0)) if records else 0


def stop_for_budget(strategy: Any, server_round: int, epsilon: float) -> None:
    """Stop before round ``server_round``: write the checkpoint of the last complete round (where checkpoints are
    on), then raise Flower's :class:`PrivacyBudgetExhausted` with the reason."""
    s = strategy.settings
    done = strategy.rounds_done
    if strategy.results_dir is not None and s.checkpoint_every and done:
        write_checkpoint(strategy.results_dir, done, strategy.checkpoint_state(), s)
    raise PrivacyBudgetExhausted(
        f"round {server_round} would take epsilon to {epsilon:.4g} (delta {s.dp_delta:g}), above dp-max-epsilon="
        f"{s.dp_max_epsilon:g}: the run stops after round {done}"
        + (f"; resume-from='{strategy.results_dir}' continues it with a higher maximum" if done else "")
    )


# ---------------------------------------------------------------------------------------------- central DP
def central_aggregate(strategy: Any, server_round: int, updates: Sequence[Any]) -> dict[str, Any]:
    """Central DP's round on ``strategy`` (a :class:`strategies.base.PersonalizedStrategy`): its global model becomes
    the unweighted mean of the clipped updates plus noise (:func:`central_round`), journaled before it can leave;
    a round the journal already holds (a resumed run repeating it) releases the journaled model again.  Returns the
    history entry with the run's privacy spent so far (:func:`account`, with the round's population and cohort)."""
    dp: ServerPrivacy = strategy.dp
    keys = strategy.released_keys()
    results = strategy.results_dir
    reference = {k: strategy.global_state[k] for k in keys}
    digest = state_digest(reference)
    journaled = journaled_release(results, server_round) if results is not None else None
    if journaled is not None:
        entry, arrays = journaled
        if entry["reference"] != digest:  # the run stops (its summary says why) rather than release a second view
            raise RunAborted(
                f"round {server_round}'s release in {results / JOURNAL} was taken against another model than the "
                "checkpoint this run resumed from: releasing a new one would show two noisy views of the round"
            )
        new_state = dict(strategy.global_state)
        new_state.update(arrays)
        released = {**entry["released"], "replayed": True}
        dp.clip, dp.count_stddev = float(entry["dp"]["clip"]), entry["dp"]["count-stddev"]
        log.info(
            "[dp] round %d: released again as journaled before the resume (the new replies are unused)", server_round
        )
    else:
        new_state, released = central_round(
            strategy.global_state,
            [u.arrays for u in updates],
            keys,
            dp.clip,
            dp.sigma,
            noise_source(),
            dp.count_stddev if dp.adaptive() else None,
        )
        dp.adapt(released)
        if results is not None:
            entry = {"reference": digest, "released": released, "dp": dp.state()}
            journal_release(results, server_round, entry, {k: new_state[k] for k in keys})
    strategy.global_state = new_state
    population, cohort = strategy.dp_sample
    return {"dp": account(strategy.history, released, dp.sigma, strategy.settings.dp_delta, population, cohort)}


def account(
    history: Sequence[Any], released: dict[str, Any], sigma: float, delta: float, population: int, cohort: int
) -> dict:
    """``released`` with the run's epsilon after this round (a cohort of ``cohort`` of ``population`` clients),
    composed over every noised round in ``history`` and this one: the tighter of the Rényi-DP and the PLD bound,
    named in ``accountant``, both given.

    While every round had every client: add-or-remove-one neighbours, no amplification.  Once any round drew a
    cohort: replace-one neighbours (the only relation fixed-size sampling is analysed under) for all rounds,
    each counted at the highest sampling rate any of them had, which can only overstate epsilon.
    """
    earlier = [r.extra["dp"] for r in history if "dp" in r.extra]
    samples = [(e["cohort"], e["population"]) for e in earlier] + [(cohort, population)]
    rounds = len(samples)
    if all(c == p for c, p in samples):
        bound, neighbours = central_bound(sigma, rounds, delta, population, population), "add-or-remove-one"
    else:
        worst_cohort, worst_population = max(samples, key=lambda cp: cp[0] / cp[1])
        bound = (
            central_bound(sigma, rounds, delta, worst_population, worst_cohort)
            if worst_cohort < worst_population
            else local_bound(sigma, rounds, delta)  # the replace-one Gaussian without amplification
        )
        neighbours = "replace-one"
    return {
        **released,
        "cohort": cohort,
        "population": population,
        "noised-rounds": rounds,
        "noise-multiplier": sigma,
        "neighbours": neighbours,
        "epsilon": bound.epsilon,
        "accountant": bound.accountant,
        "epsilon-rdp": bound.rdp,
        "epsilon-pld": bound.pld,
        "delta": delta,
    }


def account_local(history: Sequence[Any], clients: int, settings: Any, extra: int = 0, charged: int = 0) -> dict:
    """What a local-DP round released, with every client's epsilon after it (``extra["dp"]``).

    ``history`` holds every round so far, this one last.  A client releases at most one model per round in its
    train reply, so after r rounds no client has released more than r times, plus ``extra`` releases outside the
    train replies so far (pFedLIA's lazy model, one per lazy query) and ``charged`` releases of rounds a resumed run
    repeated (:class:`ServerPrivacy`): the epsilon of ``r + extra + charged`` releases bounds every client's.  Every
    round counts, also one whose replies were all rejected (they left their clients all the same); a client that was
    not sent a train message in some round released less.  ``clients`` is the number of valid train releases this
    round received.
    """
    releases = len(history) + extra + charged
    sigma, delta = settings.dp_noise_multiplier, settings.dp_delta
    bound = local_bound(sigma, releases, delta)
    return {
        "mode": "local",
        "clients": clients,
        "noise-std": local_noise_std(sigma, clip_bound(settings.dp_clip)),
        "noise-multiplier": sigma,
        "releases": releases,
        "charged": charged,
        "neighbours": "replace-one-data-set",
        "epsilon": bound.epsilon,
        "accountant": bound.accountant,
        "epsilon-rdp": bound.rdp,
        "epsilon-pld": bound.pld,
        "delta": delta,
    }

"""The server's half of client-level differential privacy (docs/privacy.md, task/privacy.py).

Central mode, one round: each client's update is its reply minus the model the server sent (clients clipped it
already; the server clips again, to the round's clip bound, so one client that skipped it cannot break the bound for
the others), the updates are summed **without weights**, Gaussian noise of std ``z * C`` is added once to that sum
from a generator seeded by the operating system's CSPRNG (never stored), and the sum is divided by the round's fixed
denominator (the cohort drawn, or under Poisson sampling the expected cohort q·N).  The accountant's epsilon after
every release made so far goes into the round's history as ``extra["dp"]``.  With adaptive clipping the round's clip
bound follows the noised share of unclipped updates (Andrew et al.).

Local mode: the clients clipped and noised their models themselves, with the noise multiplier the server declared
in the round's messages; the server only accounts (:meth:`ServerPrivacy.account_local`).

Both modes, across rounds (:class:`ServerPrivacy`, kept in the server's checkpoint):

- the noise multiplier, calibrated to ``dp-target-epsilon`` before round 1 when one is set, for the population the
  rounds draw from (the held-out clients left out), and kept by a resumed run; the server declares it, with the
  round's clip bound, in every message of a DP run (``dp-noise-multiplier``, ``dp-clip``): a node's floor checks
  those values, and under local DP the client noises with them;
- the cohort: under DP drawn by the operating system's CSPRNG (``secrets.SystemRandom``), under central DP each client
  independently with probability ``fraction-train`` (Poisson sampling, the default) or a fixed-size cohort;
- ``dp-max-epsilon``: before a round releases anything, the epsilon the round would reach is computed; above the
  maximum the run stops, with Flower's ``PrivacyBudgetExhausted``, after writing the checkpoint of the last complete
  round;
- a **release journal** (``<results>/checkpoints/dp-journal/``): ``releases.jsonl`` records every release once it
  is made (central: once its noised model exists, before it can leave the server; local: just before the round's
  first release can leave a client), with the noise multiplier, sampling, cohort and population it was made with;
  the accountant charges exactly those releases, and a resumed run charges the journaled releases its checkpoint
  does not hold.  Central DP also writes each round's noised model there, and a round that runs again after a resume
  releases exactly that model again (the new replies are not used), so no two releases of a round differ.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import secrets
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from flwr.serverapp.exception import PrivacyBudgetExhausted

from strategies.exchange import RunAborted
from strategies.gate import cohort_size
from strategies.outcome import PrivacySpent
from strategies.persistence import write_checkpoint
from task.privacy import (
    Bound,
    PrivacyConfigError,
    Release,
    calibrate_central,
    calibrate_local,
    central_noise_std,
    clip_bound,
    clip_update,
    finite_or_zero,
    local_noise_std,
    model_delta,
    next_clip,
    noise_source,
    noisy_mean,
    noisy_unclipped_share,
    releases_bound,
    update_noise_multiplier,
    update_norm,
)

log = logging.getLogger("flwr.pflower")

#: the folder of the release journal, under the results folder's checkpoints
JOURNAL = Path("checkpoints") / "dp-journal"


# ---------------------------------------------------------------------------------------------- the cohort
def cohort_generator(settings: Any) -> random.Random:
    """The generator that draws every round's cohort (and evaluation draws).  Without DP: seeded by the run's
    ``seed``, so a run repeats from its run config.  Under DP: the operating system's CSPRNG itself
    (``secrets.SystemRandom``, which Opacus's secure mode also asks of its sampler): amplification by sampling
    assumes nobody else can tell who was drawn, every client receives the run config, seed included, and a
    generator with a state could be read from a checkpoint; this one has none, and nothing of it is stored."""
    return random.Random(settings.seed) if settings.dp_mode == "off" else secrets.SystemRandom()


def poisson_cohort(rng: random.Random, nodes: Sequence[int], rate: float) -> list[int]:
    """Poisson sampling: each of ``nodes`` in the cohort independently with probability ``rate`` (possibly none)."""
    return [n for n in nodes if rng.random() < rate]


def central_sampling(settings: Any) -> str:
    """How a central-DP round draws its clients: ``all`` (``fraction-train`` = 1) or ``dp-sampling``."""
    return "all" if settings.fraction_train >= 1 else settings.dp_sampling


# ---------------------------------------------------------------------------------------------- one central round
def central_round(
    global_state: Mapping[str, np.ndarray],
    replies: Sequence[Mapping[str, np.ndarray]],
    keys: Sequence[str],
    clip: float,
    noise_multiplier: float,
    rng: np.random.Generator,
    count_stddev: float | None = None,
    denominator: float | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """(the new shared model, what the round released) from the round's valid replies (``keys`` of each): the
    unweighted sum of the updates clipped to ``clip``, plus noise of multiplier ``noise_multiplier`` on it, over
    ``denominator`` (the cohort drawn, or the expected cohort under Poisson sampling; default: the replies).  An
    update that is not finite counts as the zero update.  Under Poisson sampling a round without any reply releases
    noise all the same: an unchanged model would say that nobody was drawn.

    With ``count_stddev`` (adaptive clipping) the round also releases the noised share of updates the clip left
    unchanged (``unclipped-share``), and the update's noise multiplier is the part of ``noise_multiplier`` the count
    leaves (:func:`task.privacy.update_noise_multiplier`), so the round as a whole is still a Gaussian mechanism of
    ``noise_multiplier``.  Nothing else of the replies is released: no norm, no count, no un-noised statistic.
    """
    reference = {k: global_state[k] for k in keys}
    deltas = [finite_or_zero(model_delta({k: r[k] for k in keys}, reference)) for r in replies]
    d = float(len(replies) if denominator is None else denominator)
    z_update = noise_multiplier if count_stddev is None else update_noise_multiplier(noise_multiplier, count_stddev)
    template = {k: np.asarray(v) for k, v in reference.items()}
    update = noisy_mean([clip_update(u, clip) for u in deltas], z_update, clip, rng, d, template)
    new_state = dict(global_state)
    new_state.update({k: (reference[k] + update[k]).astype(reference[k].dtype) for k in keys})
    released: dict[str, Any] = {"mode": "central", "clip": clip, "noise-std": central_noise_std(z_update, clip, d)}
    if count_stddev is not None:
        norms = [update_norm(u) for u in deltas]
        released["unclipped-share"] = noisy_unclipped_share(norms, clip, count_stddev, rng, d)
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


def _append_durably(path: Path, line: str) -> None:
    """One line appended to ``path``, flushed to the disk before this returns."""
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists()
    with path.open("a") as fh:
        fh.write(line + "\n")
        fh.flush()
        os.fsync(fh.fileno())
    if new:
        _fsync_dir(path.parent)


#: the release journal's ledger: one JSON line per release made (``ServerPrivacy.entry``)
LEDGER = "releases.jsonl"


def journal_entry(results: Path, entry: Mapping[str, Any]) -> None:
    """Record a release that is made in the journal's ledger (before it can leave)."""
    _append_durably(results / JOURNAL / LEDGER, json.dumps(dict(entry)))


def journaled_entries(results: Path) -> list[dict[str, Any]]:
    """Every release the journal's ledger records (a last line cut short by a crash is skipped: it was written
    before its release could leave, which the crash then prevented)."""
    path = results / JOURNAL / LEDGER
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:
            continue
    return out


def journaled_local_releases(results: Path) -> int:
    """The most releases a client may have made, as the journal records them (local DP)."""
    return sum(int(e["count"]) for e in journaled_entries(results) if e.get("mode") == "local")


def as_release(entry: Mapping[str, Any]) -> Release:
    """The accountant's view of a journal entry."""
    return Release(float(entry["noise-multiplier"]), entry["sampling"], float(entry["rate"]), int(entry["count"]))


# ---------------------------------------------------------------------------------------------- the server's state
class ServerPrivacy:
    """What the server keeps for differential privacy across rounds, in its checkpoint: the noise multiplier
    (``dp-noise-multiplier``, or calibrated to ``dp-target-epsilon`` before round 1), the clip bound (adaptive
    clipping moves it), the count's noise (adaptive clipping) and the ledger of every release made (the journal's
    entries), from which every epsilon is computed."""

    def __init__(self, settings: Any) -> None:
        self.settings = settings
        target = settings.dp_mode != "off" and settings.dp_target_epsilon > 0
        #: None until calibrated (a target epsilon, at the first round)
        self.noise_multiplier: float | None = None if target else float(settings.dp_noise_multiplier)
        self.clip = clip_bound(settings.dp_clip)
        self.count_stddev: float | None = None  # adaptive clipping: set at the first round (cohort / 20 by default)
        #: every release made, in order (the journal's entries): the accountant composes exactly these
        self.ledger: list[dict[str, Any]] = []
        self.resumed_after: int | None = None  # the checkpoint's round, until the journal was read
        #: the round's draw (central): sampling, rate, population, cohort (fixed-size and every client) and the
        #: denominator of its average
        self.draw: dict[str, Any] = {}

    def state(self) -> dict[str, Any]:
        return {
            "noise-multiplier": self.noise_multiplier,
            "clip": self.clip,
            "count-stddev": self.count_stddev,
            "ledger": [dict(e) for e in self.ledger],
        }

    def restore(self, state: Mapping[str, Any], rounds_done: int) -> None:
        self.noise_multiplier = state["noise-multiplier"]
        self.clip = float(state["clip"])
        self.count_stddev = state["count-stddev"]
        self.ledger = [dict(e) for e in state.get("ledger", [])]
        self.resumed_after = rounds_done

    @property
    def sigma(self) -> float:
        if self.noise_multiplier is None:
            raise RuntimeError("the noise multiplier is calibrated before the first round")
        return self.noise_multiplier

    def adaptive(self) -> bool:
        return self.settings.dp_mode == "central" and self.settings.dp_adaptive_clip

    def declared(self) -> dict[str, float]:
        """What every message of a DP run declares (once the noise multiplier is known): the noise multiplier and
        the clip bound of the round (central: what the server applies; local: what the client must), which a
        node's floor checks (client_app/floor.py)."""
        if self.settings.dp_mode == "off" or self.noise_multiplier is None:
            return {}
        return {"dp-noise-multiplier": float(self.noise_multiplier), "dp-clip": float(self.clip)}

    # ------------------------------------------------------------------ the ledger
    def spent(self, planned: Sequence[Release] = ()) -> tuple[Bound, str]:
        """(the bound, its neighbouring relation) of every release made so far (and ``planned``)."""
        return releases_bound([as_release(e) for e in self.ledger] + list(planned), self.settings.dp_delta)

    def published(self) -> PrivacySpent | None:
        """What the run's summary says of the privacy spent (None without DP)."""
        if self.settings.dp_mode == "off":
            return None
        bound, neighbours = self.spent()
        sampling = central_sampling(self.settings) if self.settings.dp_mode == "central" else None
        return PrivacySpent(bound.epsilon, neighbours, bound.accountant, self.noise_multiplier, sampling)

    def charged(self) -> int:
        """Releases a resumed run took from the journal (rounds it repeats, or released before its checkpoint's
        next round), charged on top of those its rounds record."""
        return sum(int(e["count"]) for e in self.ledger if e.get("charged"))

    def record(self, strategy: Any, entry: dict[str, Any]) -> None:
        """A release that is made: into the ledger and, durably, the journal (before it can leave)."""
        self.ledger.append(entry)
        if strategy.results_dir is not None:
            journal_entry(strategy.results_dir, entry)

    def entry(self, server_round: int, count: int, **more: Any) -> dict[str, Any]:
        mode = self.settings.dp_mode
        base = {"id": uuid.uuid4().hex, "round": server_round, "mode": mode, "noise-multiplier": self.sigma}
        if mode == "local":
            return {**base, "sampling": "local", "rate": 1.0, "count": count, "clip": self.clip, **more}
        return {**base, **self.draw, "count": count, "clip": self.clip, **more}

    def _take_journal(self, strategy: Any) -> None:
        """On resume: the journaled releases the checkpoint does not hold were made all the same (a round after the
        checkpoint, before a crash or a stop): charge them."""
        results = strategy.results_dir
        if self.resumed_after is None or results is None:
            return
        if not self.ledger and strategy.history:  # a checkpoint from before the ledger: rebuild it from the records
            self.ledger = _ledger_from_history(strategy.history)
        known = {e["id"] for e in self.ledger}
        for e in journaled_entries(results):
            if e["id"] not in known:
                self.ledger.append({**e, "charged": True})
        self.resumed_after = None

    # ------------------------------------------------------------------ before a round
    def before_round(self, strategy: Any, server_round: int, population: int) -> None:
        """Before anything of round ``server_round`` is released (``population``: the nodes the round draws from,
        the held-out clients left out): calibrate the noise (first round), plan the round's draw (central), charge
        what a resumed run's journal holds, and stop the run if the round would take epsilon above
        ``dp-max-epsilon``."""
        s = self.settings
        if s.dp_mode == "central":
            self.draw = self._plan_draw(population)
        if self.noise_multiplier is None:
            self.noise_multiplier = self._calibrate(strategy)
        if self.adaptive() and self.count_stddev is None:
            count_stddev = s.dp_clip_count_stddev or self.draw["denominator"] / 20
            try:  # refuses a count noise that would spend the whole round
                update_noise_multiplier(self.sigma, count_stddev)
            except PrivacyConfigError as err:
                cohort = f"{self.draw['denominator']:g}"
                raise RunAborted(f"{err} (a cohort of {cohort}; dp-clip-count-stddev=0 means the cohort / 20)") from err
            self.count_stddev = count_stddev
        self._take_journal(strategy)
        epsilon = self.spent(self.planned(strategy, server_round))[0].epsilon
        if 0 < s.dp_max_epsilon < epsilon:
            stop_for_budget(strategy, server_round, epsilon)

    def _plan_draw(self, population: int) -> dict[str, Any]:
        s = self.settings
        sampling = central_sampling(s)
        if sampling == "poisson":
            return {
                "sampling": "poisson",
                "rate": s.fraction_train,
                "population": population,
                "denominator": s.fraction_train * population,
            }
        cohort = cohort_size(population, s.fraction_train) if sampling == "fixed" else population
        return {
            "sampling": sampling,
            "rate": cohort / population if population else 1.0,
            "population": population,
            "cohort": cohort,
            "denominator": float(cohort),
        }

    def drew(self, cohort: Sequence[int]) -> None:
        """The cohort a fixed-size draw actually made (a method may draw fewer): its rate and denominator."""
        if self.settings.dp_mode == "central" and self.draw.get("sampling") in ("fixed", "all") and cohort:
            population = self.draw["population"]
            self.draw.update(cohort=len(cohort), rate=len(cohort) / population, denominator=float(len(cohort)))

    def planned(self, strategy: Any, server_round: int) -> list[Release]:
        """What round ``server_round`` will release: central, one noised average (none when the journal already
        holds it: a resumed run releases that again); local, the most releases a client makes in it."""
        if self.settings.dp_mode == "local":
            return [Release(self.sigma, "local", 1.0, strategy.local_releases(server_round))]
        results = strategy.results_dir
        if results is not None and (results / JOURNAL / f"round-{server_round:05d}.json").is_file():
            return []
        return [Release(self.sigma, self.draw["sampling"], self.draw["rate"], 1)]

    def _calibrate(self, strategy: Any) -> float:
        s = self.settings
        if s.dp_mode == "local":
            releases = s.num_rounds + strategy.planned_query_releases()
            sigma = calibrate_local(s.dp_target_epsilon, s.dp_delta, releases)
            log.info(
                "[dp] noise multiplier %.4g: epsilon %g at delta %g after %d releases of a client",
                *(sigma, s.dp_target_epsilon, s.dp_delta, releases),
            )
            return sigma
        d = self.draw
        sigma = calibrate_central(s.dp_target_epsilon, s.dp_delta, s.num_rounds, d["rate"], s.dp_sampling)
        drawn = {
            "all": f"every one of {d['population']} clients",
            "poisson": f"each of {d['population']} clients with probability {d['rate']:g} (Poisson)",
            "fixed": f"{d.get('cohort')} of {d['population']} clients (fixed-size)",
        }[d["sampling"]]
        log.info(
            "[dp] noise multiplier %.4g: epsilon %g at delta %g after %d rounds of %s",
            *(sigma, s.dp_target_epsilon, s.dp_delta, s.num_rounds, drawn),
        )
        return sigma

    def journal_local(self, strategy: Any, server_round: int) -> None:
        """Local DP, just before the round's first release can leave a client: the most releases a client makes in
        it, at the declared noise multiplier, into the ledger and the journal."""
        if self.settings.dp_mode == "local":
            self.record(strategy, self.entry(server_round, strategy.local_releases(server_round)))

    # ------------------------------------------------------------------ after a central round
    def adapt(self, released: Mapping[str, Any]) -> None:
        """Adaptive clipping: the next round's clip bound from this round's noised unclipped share, never above
        ``dp-clip`` (the bound every client enforces itself)."""
        if self.adaptive() and "unclipped-share" in released:
            s = self.settings
            moved = next_clip(self.clip, released["unclipped-share"], s.dp_clip_quantile, s.dp_clip_lr)
            self.clip = min(moved, clip_bound(s.dp_clip))

    def account_local(self, clients: int) -> dict[str, Any]:
        """What a local-DP round released, with every client's epsilon after it (``extra["dp"]``): ``clients`` is the
        number of valid releases the round's train replies brought.  The epsilon composes the ledger: each round's
        most releases per client (one train reply; pFedLIA's clustering round also its lazy model) at the noise
        multiplier declared in its messages, journaled before they could leave, and those a resumed run charged from
        the journal.  Every round counts, also one whose replies were all rejected (they left their clients all the
        same); a client that was not sent a message in some round released less."""
        entry = next((e for e in reversed(self.ledger) if not e.get("charged")), None)
        sigma = entry["noise-multiplier"] if entry is not None else self.sigma
        released = {"mode": "local", "clients": clients, "noise-std": local_noise_std(sigma, self.clip)}
        return self.report(released, entry or {"noise-multiplier": sigma})

    def report(self, released: Mapping[str, Any], entry: Mapping[str, Any]) -> dict[str, Any]:
        """A round's ``extra["dp"]``: what it released (``released``, its journal ``entry``) and the epsilon of every
        release made so far."""
        bound, neighbours = self.spent()
        mode = self.settings.dp_mode
        what = {"noise-multiplier": entry["noise-multiplier"]}
        if mode == "central":
            what |= {k: entry[k] for k in ("sampling", "rate", "population", "cohort") if k in entry}
            what["noised-rounds"] = sum(int(e["count"]) for e in self.ledger if e["mode"] == "central")
        else:
            what |= {"releases": sum(int(e["count"]) for e in self.ledger), "charged": self.charged()}
        return {
            **released,
            **what,
            "neighbours": neighbours,
            "epsilon": bound.epsilon,
            "accountant": bound.accountant,
            "epsilon-rdp": bound.rdp,
            "epsilon-pld": bound.pld,
            "delta": self.settings.dp_delta,
        }


def _ledger_from_history(history: Sequence[Any]) -> list[dict[str, Any]]:
    """The releases a checkpoint from before the ledger records in its rounds' ``dp`` entries."""
    out, seen = [], 0
    for r in history:
        d = r.extra.get("dp")
        if not d:
            continue
        if d.get("mode") == "local":
            count = int(d["releases"]) - seen
            seen = int(d["releases"])
            out.append(
                {
                    "id": uuid.uuid4().hex,
                    "round": r.server_round,
                    "mode": "local",
                    "sampling": "local",
                    "rate": 1.0,
                    "count": count,
                    "noise-multiplier": d["noise-multiplier"],
                }
            )
        else:
            cohort, population = int(d.get("cohort", 1)), int(d.get("population", 1))
            sampling = "all" if cohort >= population else "fixed"
            out.append(
                {
                    "id": uuid.uuid4().hex,
                    "round": r.server_round,
                    "mode": "central",
                    "sampling": sampling,
                    "rate": cohort / population,
                    "count": 1,
                    "noise-multiplier": d["noise-multiplier"],
                    "population": population,
                    "cohort": cohort,
                }
            )
    return out


def stop_for_budget(strategy: Any, server_round: int, epsilon: float) -> None:
    """Stop before round ``server_round``: write the checkpoint of the last complete round (where checkpoints are
    on), then raise Flower's :class:`PrivacyBudgetExhausted` with the reason."""
    s = strategy.settings
    done = strategy.rounds_done
    if strategy.history and strategy.history[-1].server_round == server_round:  # nothing of the round is recorded
        strategy.history.pop()
    if strategy.results_dir is not None and s.checkpoint_every and done:
        write_checkpoint(strategy.results_dir, done, strategy.checkpoint.state(), s)
    raise PrivacyBudgetExhausted(
        f"round {server_round} would take epsilon to {epsilon:.4g} (delta {s.dp_delta:g}), above dp-max-epsilon="
        f"{s.dp_max_epsilon:g}: the run stops after round {done}"
        + (f"; resume-from='{strategy.results_dir}' continues it with a higher maximum" if done else "")
    )


# ---------------------------------------------------------------------------------------------- central DP
def central_aggregate(strategy: Any, server_round: int, updates: Sequence[Any]) -> dict[str, Any]:
    """Central DP's round on ``strategy`` (a :class:`strategies.base.PersonalizedStrategy`): its global model becomes
    the noised average of the clipped updates (:func:`central_round`), journaled before it can leave; a round the
    journal already holds (a resumed run repeating it) releases the journaled model again.  Returns the history
    entry with the privacy spent by every release made so far."""
    dp: ServerPrivacy = strategy.privacy
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
        release = entry.get("release") or dp.entry(server_round, 1)  # a journal from before the ledger: this draw
        if release["id"] not in {e["id"] for e in dp.ledger}:  # journaled before a crash cut its ledger line
            dp.record(strategy, release)
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
            dp.draw["denominator"],
        )
        release = dp.entry(server_round, 1)
        dp.adapt(released)
        if results is not None:
            entry = {"reference": digest, "released": released, "dp": dp.state() | {"ledger": []}, "release": release}
            journal_release(results, server_round, entry, {k: new_state[k] for k in keys})
        dp.record(strategy, release)
    strategy.global_state = new_state
    return {"dp": dp.report(released, release)}

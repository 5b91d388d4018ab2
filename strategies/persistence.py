"""Persistence: checkpoints of a run and resuming from them.

After every ``checkpoint-every`` rounds (and the last) the strategy writes what a resumed run needs into
``<results>/checkpoints/`` (:mod:`task.checkpoint`: one JSON tree and one safetensors file, written
atomically): the base's part (history, failures, last evaluations, the sampling generator, an evaluation
waiting for the next round's train messages, the global model) and the method's own part, which the method
declares with ``state()`` / ``restore()`` next to its logic.  Nothing derivable is saved: names and shapes
come from the model, options from the run config, node ids change between runs anyway.

:func:`checkpoint_state` gathers what a checkpoint holds and :func:`resume` puts it back into a strategy freshly
built from the same settings; :func:`after_round` is what the round loop asks of persistence after each round.

``resume-from`` names the results folder of an interrupted run: its checkpoint must be of the same method,
model and data set, and every run-config key but those in :data:`RESUMABLE_CHANGES` must be unchanged.
``stop-after`` stops the ServerApp after a round's checkpoint as a crash would (:class:`SimulatedCrash`), to
test resuming.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from strategies.history import RoundLog
from task.checkpoint import CheckpointError, load_checkpoint, save_checkpoint, to_tree
from task.config import RunOptions, Settings
from task.export import model_manifest, save_model

if TYPE_CHECKING:
    from strategies.base import PersonalizedStrategy

#: run-config keys that may differ between an interrupted run and its resumption
RESUMABLE_CHANGES = frozenset(
    {
        "num-server-rounds",
        "resume-from",
        "stop-after",
        "results-dir",
        "round-timeout",
        "checkpoint-every",
        "save-models",
        "save-every",
        "save-best",
        "min-nodes",
        "node-wait-timeout",
        "dp-max-epsilon",
    }
)


class SimulatedCrash(RuntimeError):
    """``stop-after``: the ServerApp stops after a round's checkpoint as a crash would (for testing resume)."""


def checkpoint_meta(settings: Settings) -> dict[str, Any]:
    """What a resumed run must agree on: every run-config key but those in :data:`RESUMABLE_CHANGES`, each as
    its option reads it (a deprecated spelling and its new name are the same value)."""
    declared = {**RunOptions.declared(), **type(settings.options).declared()}
    config = {
        key: opt.convert(settings.raw.get(key, opt.default), warn=False)
        for key, opt in declared.items()
        if key not in RESUMABLE_CHANGES
    }
    return {"method": settings.method, "model": settings.model, "dataset": settings.data.dataset, "run-config": config}


def checkpoint_due(settings: Settings, server_round: int, last_round: int) -> bool:
    """A checkpoint is written after ``server_round``: every ``checkpoint-every`` rounds and after the last."""
    every = settings.checkpoint_every
    return bool(every) and (server_round % every == 0 or server_round == last_round)


def write_checkpoint(results: Path, server_round: int, state: dict[str, Any], settings: Settings) -> float:
    """Write ``state`` as round ``server_round``'s checkpoint under ``results/checkpoints``; the seconds it took."""
    start = time.perf_counter()
    tree, arrays = to_tree(state)
    save_checkpoint(results / "checkpoints", server_round, tree, arrays, checkpoint_meta(settings))
    return time.perf_counter() - start


def read_checkpoint(results: Path, settings: Settings) -> tuple[int, dict[str, Any]]:
    """(last complete round, saved state) of the run in ``results``; :class:`CheckpointError` naming the problem
    when the folder is missing, its checkpoint missing, truncated or of another format, the run another one
    (method, model, data set, run-config keys) or already finished."""
    if not results.is_dir():
        raise CheckpointError(f"resume-from {settings.resume_from!r}: no such results folder")
    done, state, meta = load_checkpoint(results / "checkpoints")
    expected = checkpoint_meta(settings)
    if any(meta.get(k) != expected[k] for k in ("method", "model", "dataset")):
        raise CheckpointError(
            f"resume-from {str(results)!r} is a {meta.get('method')} run of model {meta.get('model')} on "
            f"{meta.get('dataset')}; this run is {expected['method']} / {expected['model']} / "
            f"{expected['dataset']}"
        )
    differ = sorted(k for k, v in expected["run-config"].items() if meta.get("run-config", {}).get(k, v) != v)
    if differ:
        raise CheckpointError(
            f"resume-from {str(results)!r}: run-config keys {differ} differ from the interrupted run "
            f"(only {sorted(RESUMABLE_CHANGES)} may change)"
        )
    if done >= settings.num_rounds:
        raise CheckpointError(
            f"resume-from {str(results)!r}: the run already finished its {done} rounds; raise "
            f"num-server-rounds above {done} to continue it"
        )
    if not isinstance(state, dict) or not {"base", "method"} <= set(state):
        raise CheckpointError(f"checkpoint of {str(results)!r} holds no strategy state (no 'base' and 'method')")
    return done, state


def stop_if_asked(settings: Settings, server_round: int, last_round: int, results: Path | None) -> None:
    """``stop-after``: raise :class:`SimulatedCrash` after that round's checkpoint (unless it is the last)."""
    if settings.stop_after == server_round and server_round < last_round:
        raise SimulatedCrash(
            f"stop-after={server_round}: the ServerApp stops here as if it crashed (testing resume); "
            f"resume with resume-from='{results}'"
        )


def save_server_models(results: Path, settings: Settings, server_round: int, models: dict[str, Any]) -> None:
    """The server's models (global, cluster, tier) under ``<results>/models/server/`` (safetensors + manifest)."""
    for name, state in models.items():
        manifest = model_manifest(settings, round=server_round, **{"server-model": name})
        save_model(results / "models" / "server" / name, state, manifest)


def checkpoint_state(strategy: PersonalizedStrategy) -> dict[str, Any]:
    """What a checkpoint of ``strategy`` holds: the base's part (history, failures, each client's last evaluation,
    the sampling generator, an evaluation waiting for the next round's train messages, the global model, what
    differential privacy keeps across rounds, which clients are held out) and the method's own ``state()``."""
    base = {
        "history": [asdict(r) for r in strategy.history],
        "failures": strategy.gate.failures,
        "client-eval": strategy.client_eval,
        "rng": strategy.rng,
        "pending-evaluation": strategy.schedule.pending,
        "global": strategy.global_state,
        "dp": strategy.dp.state(),
        "holdout-first": strategy.holdout.first,
    }
    return {"base": base, "method": strategy.state()}


def resume(strategy: PersonalizedStrategy, saved: Mapping[str, Any], rounds_done: int) -> None:
    """Put a checkpoint's state (:func:`checkpoint_state`) into ``strategy``, freshly built from the same settings,
    so that it continues after round ``rounds_done``.  Node ids change between runs (simulation), so every node
    is asked who it is before the next round."""
    base = saved["base"]
    strategy.history = [RoundLog(**r) for r in base["history"]]
    strategy.gate.failures[:] = base["failures"]
    strategy.client_eval = dict(base["client-eval"])
    strategy.rng = base["rng"]
    strategy.schedule.pending = int(base["pending-evaluation"])
    strategy.global_state = base["global"]
    if "dp" in base:  # a checkpoint from before it existed: the settings' noise multiplier and clip bound
        strategy.dp.restore(base["dp"], rounds_done)
    strategy.holdout.first = int(base.get("holdout-first", -1))  # which clients are held out stays as it was
    strategy.restore(saved["method"])
    strategy.rounds_done, strategy.identify_everyone = rounds_done, True


def after_round(strategy: PersonalizedStrategy, server_round: int) -> None:
    """After round ``server_round`` of a run with a results folder: the server's models when the schedule saves
    them, the checkpoint when due (the seconds it took into the round's history), then ``stop-after``'s crash."""
    results, settings, last = strategy.results_dir, strategy.settings, strategy.schedule.last_round
    if results is not None and strategy.schedule.saves_models(server_round):
        save_server_models(results, settings, server_round, strategy.server_models())
    if results is not None and checkpoint_due(settings, server_round, last):
        seconds = write_checkpoint(results, server_round, checkpoint_state(strategy), settings)
        strategy.history[-1].extra["checkpoint-seconds"] = seconds
    stop_if_asked(settings, server_round, last, results)

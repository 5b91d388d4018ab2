"""Persistence: checkpoints of a run and resuming from them.

After every ``checkpoint-every`` rounds (and the last) the strategy writes what a resumed run needs into
``<results>/checkpoints/`` (:mod:`task.checkpoint`: one JSON tree and one safetensors file, written
atomically) the plain data (dicts, lists, numbers, numpy arrays) the strategy gives: the base assembles it
from its own part and each part's ``state()`` (gate, schedule, privacy, holdout) and the method's, and takes it
back with ``resume``.  Nothing derivable is saved: names and shapes come from the model, options from the run
config, node ids change between runs anyway.  This module only writes and reads files; it knows no strategy.

:func:`after_round` is what the round loop asks of persistence after each round.

``resume-from`` names the results folder of an interrupted run: its checkpoint must be of the same method,
model and data set, and every run-config key but those in :data:`RESUMABLE_CHANGES` must be unchanged.
``stop-after`` stops the ServerApp after a round's checkpoint as a crash would (:class:`SimulatedCrash`), to
test resuming.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from task.checkpoint import CheckpointError, load_checkpoint, save_checkpoint, to_tree
from task.config import Settings
from task.export import model_manifest, save_model

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
    declared = {**Settings.declared(), **type(settings.options).declared()}
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
    """The server's models (global, cluster, tier) under ``<results>/models/server/`` (safetensors + manifest); with
    ``save-history`` a copy of each also under ``models/server/round-<k>/``."""
    for name, state in models.items():
        manifest = model_manifest(settings, round=server_round, **{"server-model": name})
        save_model(results / "models" / "server" / name, state, manifest)
        if settings.save_history:
            save_model(results / "models" / "server" / f"round-{server_round:05d}" / name, state, manifest)


def after_round(
    results: Path | None,
    settings: Settings,
    server_round: int,
    last_round: int,
    models: Callable[[], dict[str, Any]] | None,
    state: Callable[[], dict[str, Any]],
) -> float | None:
    """After round ``server_round``: the server's ``models()`` when the schedule saves them (``None``: it does not),
    the checkpoint of ``state()`` when due; the seconds the checkpoint took (``None``: none written).  Without a
    results folder nothing is written.  ``stop-after``'s crash comes after it (:func:`stop_if_asked`)."""
    seconds = None
    if results is not None and models is not None:
        save_server_models(results, settings, server_round, models())
    if results is not None and checkpoint_due(settings, server_round, last_round):
        seconds = write_checkpoint(results, server_round, state(), settings)
    return seconds

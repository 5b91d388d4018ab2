"""The ServerApp: read the run config, build the chosen strategy, run it, write the results folder."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from server_app.results import ResultsWriter, resolve_results_path
from strategies.base import RESUMABLE_CHANGES, PersonalizedStrategy, RunAborted, checkpoint_meta
from task.checkpoint import CheckpointError, load_checkpoint
from task.config import Settings, parse_settings
from task.methods import load_object, method_spec
from task.models import body_keys, build_model, head_keys
from task.params import state_to_numpy, to_record

app = ServerApp()
log = logging.getLogger("flwr.pflower")


def build_strategy(settings: Settings) -> PersonalizedStrategy:
    """The method's strategy, holding the common initial model (built from the run's seed)."""
    model = build_model(
        settings.model, settings.in_channels, settings.image_size, settings.num_classes, seed=settings.seed
    )
    state = state_to_numpy(model.state_dict())
    cls = load_object(method_spec(settings.method).strategy)
    return cls(settings, state, body_keys(model), head_keys(model))


def resume_point(settings: Settings, strategy: PersonalizedStrategy) -> tuple[Path, int]:
    """(results folder, last complete round) of the run ``resume-from`` names, with its checkpoint restored into
    ``strategy``; a folder of another method, model or data set, a missing, truncated or newer checkpoint, or a
    run with no round left fail here, before anything is written."""
    folder = resolve_results_path(settings.resume_from)
    if not folder.is_dir():
        raise CheckpointError(f"resume-from {settings.resume_from!r}: no such results folder")
    done, state, meta = load_checkpoint(folder / "checkpoints")
    expected = checkpoint_meta(settings)
    if (
        meta.get("method") != expected["method"]
        or meta.get("model") != expected["model"]
        or meta.get("dataset") != expected["dataset"]
    ):
        raise CheckpointError(
            f"resume-from {str(folder)!r} is a {meta.get('method')} run of model {meta.get('model')} on "
            f"{meta.get('dataset')}; this run is {expected['method']} / {expected['model']} / "
            f"{expected['dataset']}"
        )
    differ = sorted(k for k, v in expected["run-config"].items() if meta.get("run-config", {}).get(k, v) != v)
    if differ:
        raise CheckpointError(
            f"resume-from {str(folder)!r}: run-config keys {differ} differ from the interrupted run "
            f"(only {sorted(RESUMABLE_CHANGES)} may change)"
        )
    if done >= settings.num_rounds:
        raise CheckpointError(
            f"resume-from {str(folder)!r}: the run already finished its {done} rounds; raise "
            f"num-server-rounds above {done} to continue it"
        )
    strategy.resume(state)
    return folder, done


@app.main()
def main(grid: Grid, context: Context) -> None:
    try:
        settings = parse_settings(context.run_config)
    except ValueError as err:  # said at once: Flower reports the exception only when its simulation backend is up
        log.error("the run config was refused at start-up: %s", err)
        raise
    strategy = build_strategy(settings)
    first = 1
    if settings.resume_from:
        folder, done = resume_point(settings, strategy)
        writer = ResultsWriter(settings, context.run_id, folder=folder, resumed_after=done)
        first = done + 1
        log.info("resuming %s after round %d", folder, done)
    else:
        writer = ResultsWriter(settings, context.run_id)
    strategy.results_dir = writer.folder
    start = time.monotonic()
    aborted = None
    try:
        strategy.start(
            grid=grid,
            initial_arrays=to_record(strategy.global_state),
            num_rounds=settings.num_rounds,
            timeout=settings.round_timeout,
            first_round=first,
        )
    except RunAborted as err:
        aborted = str(err)
    summary = writer.write(strategy, time.monotonic() - start, aborted=aborted)
    print(summary, flush=True)
    log.info(summary)
    if aborted:  # a non-zero exit: the run failed, and why is in the summary line and summary.json
        raise RunAborted(aborted)

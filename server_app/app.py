"""The ServerApp: read the run config, build the chosen strategy, run it, write the results folder."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.exception import PrivacyBudgetExhausted

from server_app.recorder import RecordingGrid
from server_app.results import ResultsWriter, resolve_results_path
from strategies.base import PersonalizedStrategy, RunAborted
from strategies.persistence import read_checkpoint, resume
from task.config import Settings, parse_settings
from task.methods import load_object, method_spec
from task.models import build_model, describe
from task.params import state_to_numpy, to_record
from task.recording import SERVER_FILE

app = ServerApp()
log = logging.getLogger("flwr.pflower")


def build_strategy(settings: Settings) -> PersonalizedStrategy:
    """The method's strategy, holding the common initial model (built from the run's seed) and what the model
    registry says about it (keys, shapes, body and head, normalisation layers)."""
    model = build_model(
        settings.model, settings.in_channels, settings.image_size, settings.num_classes, seed=settings.seed
    )
    cls = load_object(method_spec(settings.method).strategy)
    return cls(settings, state_to_numpy(model.state_dict()), describe(model))


def resume_point(settings: Settings, strategy: PersonalizedStrategy) -> tuple[Path, int]:
    """(results folder, last complete round) of the run ``resume-from`` names, with its checkpoint restored into
    ``strategy``; a folder of another method, model or data set, a missing, truncated or older / newer
    checkpoint, or a run with no round left fail here, before anything is written."""
    folder = resolve_results_path(settings.resume_from)
    done, state = read_checkpoint(folder, settings)
    resume(strategy, state, done)
    return folder, done


@app.main()
def main(grid: Grid, context: Context) -> None:
    try:
        settings = parse_settings(context.run_config)
    except ValueError as err:  # said at once: Flower reports the exception only when its simulation backend is up
        log.error("the run config was refused at start-up: %s", err)
        raise
    strategy = build_strategy(settings)
    if settings.resume_from:
        folder, done = resume_point(settings, strategy)
        writer = ResultsWriter(settings, context.run_id, folder=folder, resumed_after=done)
        log.info("resuming %s after round %d", folder, done)
    else:
        writer = ResultsWriter(settings, context.run_id)
    strategy.results_dir = writer.folder
    if settings.record_messages:  # audit: every message pushed and every reply pulled (docs/privacy.md)
        grid = RecordingGrid(grid, writer.folder / SERVER_FILE)
    start = time.monotonic()
    aborted = stopped = None
    try:
        strategy.start(
            grid=grid,
            initial_arrays=to_record(strategy.global_state),
            num_rounds=settings.num_rounds,
            timeout=settings.round_timeout,
        )
    except RunAborted as err:
        aborted = str(err)
    except PrivacyBudgetExhausted as err:  # dp-max-epsilon: a clean stop before the round, its checkpoint written
        stopped = str(err)
    summary = writer.write(strategy, time.monotonic() - start, aborted=aborted, stopped=stopped)
    print(summary, flush=True)
    log.info(summary)
    if aborted:  # a non-zero exit: the run failed, and why is in the summary line and summary.json
        raise RunAborted(aborted)

"""The ServerApp: read the run config, build the chosen strategy, run it, write the results folder."""

from __future__ import annotations

import logging
import sys
import time
from pathlib import Path
from typing import NoReturn

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp
from flwr.serverapp.exception import PrivacyBudgetExhausted

from server_app.coverage import coverage, shortfall
from server_app.recorder import RecordingGrid
from server_app.results import ResultsWriter, resolve_results_path
from server_app.runner import REFUSED_AT_START_UP, stop_line
from server_app.tracking import check_installed, open_watchers
from strategies.base import PersonalizedStrategy, RunAborted
from strategies.persistence import SimulatedCrash, read_checkpoint
from task.checkpoint import CheckpointError
from task.config import Settings, check_clients, parse_settings
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
    strategy.checkpoint.resume(state, done)
    return folder, done


#: how long the ServerApp waits for Flower to register a simulation's nodes (it does so as the ServerApp starts)
REGISTRATION_WAIT = 30.0


def simulated_clients(grid: Grid, wait: float = REGISTRATION_WAIT) -> int | None:
    """How many clients a simulation has, or None outside Flower's simulation.

    In simulation (``flwr run`` on a simulation SuperLink, or Flower's runtime driven in one process) every node is a
    simulated SuperNode holding partition ``partition-id`` of ``num-partitions`` = the number of nodes, all registered
    as the run starts: their count, once it stops changing, is the number of partitions.  In deployment each
    SuperNode's own node config says which partition, or which data file, it holds, and only the node knows it.
    Flower's simulation grid is recognised by its class, ``InMemoryGrid``, which is not part of Flower's public API
    (:mod:`server_app.flwr_internals` pins it; tests/runtime/test_refusals.py's run through ``flwr run`` checks that
    a simulation is recognised).  A process that never loaded it is not a simulation, and does not load it here."""
    if "flwr.superlink.grid" not in sys.modules:
        return None
    from server_app import flwr_internals

    if not isinstance(grid, flwr_internals.InMemoryGrid):
        return None
    deadline, seen = time.monotonic() + wait, -1
    while time.monotonic() < deadline:
        count = len(list(grid.get_node_ids()))
        if count and count == seen:
            return count
        seen = count
        time.sleep(0.05)
    return seen or None


def refuse(err: ValueError) -> NoReturn:
    """Stop at start-up: the reason on one log line, then the same exception for Flower to report the run as
    failed, without the frames of the code that found the problem (the line above says it all)."""
    log.error("%s%s", REFUSED_AT_START_UP, err)
    raise err.with_traceback(None) from None


@app.main()
def main(grid: Grid, context: Context) -> None:
    try:
        settings = parse_settings(context.run_config)
        check_installed(settings)
        if (clients := simulated_clients(grid)) is not None:  # what each client's splits will hold, before round 1
            check_clients(settings, clients)
    except ValueError as err:  # said at once: Flower reports the exception only when its simulation backend is up
        refuse(err)
    strategy = build_strategy(settings)
    if settings.resume_from:
        try:
            folder, done = resume_point(settings, strategy)
        except CheckpointError as err:  # a folder that does not fit this run: refused before anything is written
            refuse(err)
        writer = ResultsWriter(settings, context.run_id, folder=folder, resumed_after=done)
        log.info("resuming %s after round %d", folder, done)
    else:
        writer = ResultsWriter(settings, context.run_id)
    strategy.results_dir = writer.folder
    if settings.record_messages:  # audit: every message pushed and every reply pulled (docs/privacy.md)
        grid = RecordingGrid(grid, writer.folder / SERVER_FILE)
    watchers = open_watchers(settings, writer.folder, resumed=bool(settings.resume_from))  # TensorBoard, MLflow
    watchers.update(strategy.history)  # a resumed run's restored rounds at once
    strategy.round_watchers.append(watchers.update)
    start = time.monotonic()
    aborted = stopped = None
    failed = True
    try:
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
        except SimulatedCrash as stop:  # stop-after: one line scripts can read, then stop as a crash would
            print(stop_line(settings.stop_after, writer.folder), flush=True)
            raise stop.with_traceback(None) from None
        if aborted is None:  # a mean over too few of the clients asked is no result (server_app/coverage.py)
            aborted = shortfall(coverage(strategy.history), settings.min_coverage)
        summary = writer.write(strategy.results(), time.monotonic() - start, aborted=aborted, stopped=stopped)
        failed = aborted is not None
    finally:  # also when the ServerApp stops on an error: the rounds recorded so far
        watchers.finish(strategy.history, failed)
    print(summary, flush=True)  # once: scripts read it at a line's start (`^pflower `), Flower streams it as it is
    if aborted:  # a non-zero exit: the run failed, and why is in the summary line and summary.json
        raise RunAborted(aborted)

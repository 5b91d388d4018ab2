"""The ServerApp: read the run config, build the chosen strategy, run it, write the results folder."""

from __future__ import annotations

import logging
import time

from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from server_app.results import ResultsWriter
from strategies.base import PersonalizedStrategy, RunAborted
from task.methods import load_object, method_spec
from task.config import Settings, parse_settings
from task.models import body_keys, build_model, head_keys
from task.params import state_to_numpy, to_record

app = ServerApp()
log = logging.getLogger("flwr.pflower")


def build_strategy(settings: Settings) -> PersonalizedStrategy:
    """The method's strategy, holding the common initial model (built from the run's seed)."""
    model = build_model(settings.model, settings.in_channels, settings.image_size, settings.num_classes, seed=settings.seed)
    state = state_to_numpy(model.state_dict())
    cls = load_object(method_spec(settings.method).strategy)
    return cls(settings, state, body_keys(model), head_keys(model))


@app.main()
def main(grid: Grid, context: Context) -> None:
    settings = parse_settings(context.run_config)
    strategy = build_strategy(settings)
    writer = ResultsWriter(settings, context.run_id)
    strategy.results_dir = writer.folder
    start = time.monotonic()
    aborted = None
    try:
        strategy.start(
            grid=grid, initial_arrays=to_record(strategy.global_state), num_rounds=settings.num_rounds,
            timeout=settings.round_timeout,
        )
    except RunAborted as err:
        aborted = str(err)
    summary = writer.write(strategy, time.monotonic() - start, aborted=aborted)
    print(summary, flush=True)
    log.info(summary)
    if aborted:  # a non-zero exit: the run failed, and why is in the summary line and summary.json
        raise RunAborted(aborted)

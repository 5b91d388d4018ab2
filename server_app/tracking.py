"""Runs you can watch: the run's rounds (:class:`strategies.history.RoundLog`, the records ``rounds.json`` holds)
as TensorBoard event files in the run's folder and, with ``mlflow=true``, as an MLflow run.

``tensorboard --logdir results`` shows every run's curves side by side, one run per results folder.  A round is
written once it is complete: while the run goes on, every round but the last (a round's evaluation may ride on the
next round's train replies), and the rest when the run ends, also when it ends on an error.  A resumed run writes
its history again: TensorBoard drops what the interrupted process wrote (``purge_step``) and MLflow continues the
same run after the last round it has.  A writer that fails logs a warning, and the run goes on without it.

The writers load only when a run opens them (``torch.utils.tensorboard``, ``mlflow``): importing this module
costs the ServerApp nothing.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from server_app.results import resolve_results_path, round_scalars
from strategies.outcome import RoundLog
from task.config import Settings

log = logging.getLogger("flwr.pflower")

#: the file in a run's folder that names its MLflow run (a resumed run continues it)
MLFLOW_FILE = "mlflow.json"


class Sink(Protocol):
    """Where the rounds go: ``write`` gets (round, scalars) pairs in round order, each round once."""

    name: str

    def write(self, rows: Sequence[tuple[int, dict[str, float]]]) -> None: ...

    def close(self, failed: bool) -> None: ...


class TensorBoardSink:
    """Event files in the run's folder (``torch.utils.tensorboard``), one scalar per tag and round (the step); the
    run config as a table in the Text tab."""

    name = "TensorBoard"

    def __init__(self, folder: Path, settings: Settings, resumed: bool) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # a resumed run writes its whole history again: TensorBoard drops the earlier files' rounds from 1 on
        self.writer = SummaryWriter(str(folder), purge_step=1 if resumed else None)
        if not resumed:
            rows = [f"| `{k}` | `{v!r}` |" for k, v in sorted(settings.raw.items())]
            self.writer.add_text("run-config", "\n".join(["| key | value |", "|---|---|", *rows]), 0)
            self.writer.flush()

    def write(self, rows: Sequence[tuple[int, dict[str, float]]]) -> None:
        for step, scalars in rows:
            for tag, value in scalars.items():
                self.writer.add_scalar(tag, value, step)
        self.writer.flush()

    def close(self, failed: bool) -> None:
        self.writer.close()


class MLflowSink:
    """An MLflow run named after the results folder, in experiment ``mlflow-experiment`` of the tracking store
    ``mlflow-tracking-uri`` (default: SQLite in ``<results-dir>/mlflow.db``, artefacts under
    ``<results-dir>/mlartifacts``): the run config as parameters, every round's scalars as metrics (step = round).
    ``mlflow.json`` in the results folder names the run, so that a resumed run continues it."""

    name = "MLflow"

    def __init__(self, folder: Path, settings: Settings, resumed: bool) -> None:
        from mlflow.entities import Param
        from mlflow.tracking import MlflowClient

        results = resolve_results_path(settings.results_dir)
        uri = settings.mlflow_tracking_uri or f"sqlite:///{results / 'mlflow.db'}"
        self.client = MlflowClient(tracking_uri=uri)
        self.logged = 0  # the last round the MLflow run has
        link = folder / MLFLOW_FILE
        known = json.loads(link.read_text()) if resumed and link.is_file() else {}
        if known.get("tracking-uri") == uri:
            self.run_id = str(known["run-id"])
            history = self.client.get_metric_history(self.run_id, "time/seconds")
            self.logged = max((m.step for m in history), default=0)
            self.client.update_run(self.run_id, status="RUNNING")
            return
        experiment = self.client.get_experiment_by_name(settings.mlflow_experiment)
        if experiment is not None:
            experiment_id = experiment.experiment_id
        else:
            artifacts = None if settings.mlflow_tracking_uri else (results / "mlartifacts").as_uri()
            experiment_id = self.client.create_experiment(settings.mlflow_experiment, artifact_location=artifacts)
        tags = {"pflower.results-folder": str(folder), "pflower.method": settings.method}
        self.run_id = self.client.create_run(experiment_id, run_name=folder.name, tags=tags).info.run_id
        link.write_text(json.dumps({"tracking-uri": uri, "experiment-id": experiment_id, "run-id": self.run_id}))
        params = [Param(k, str(v)) for k, v in sorted(settings.raw.items())]
        for i in range(0, len(params), 100):  # MLflow takes at most 100 parameters per call
            self.client.log_batch(self.run_id, params=params[i : i + 100])

    def write(self, rows: Sequence[tuple[int, dict[str, float]]]) -> None:
        from mlflow.entities import Metric

        for step, scalars in rows:
            if step <= self.logged:
                continue
            stamp = int(time.time() * 1000)
            metrics = [Metric(tag, value, stamp, step) for tag, value in scalars.items()]
            for i in range(0, len(metrics), 1000):  # MLflow takes at most 1,000 metrics per call
                self.client.log_batch(self.run_id, metrics=metrics[i : i + 1000])
            self.logged = step

    def close(self, failed: bool) -> None:
        self.client.set_terminated(self.run_id, "FAILED" if failed else "FINISHED")


class RoundWatchers:
    """The run's open sinks; :meth:`update` after every round, :meth:`finish` at the end."""

    def __init__(self, sinks: Sequence[Sink]) -> None:
        self.sinks = list(sinks)
        self.written = 0  # the last round written

    def update(self, history: Sequence[RoundLog]) -> None:
        """Write the complete rounds of a run in progress: all but the last."""
        self._write(history[:-1])

    def finish(self, history: Sequence[RoundLog], failed: bool) -> None:
        """Write every round left and close the sinks (an MLflow run ends FAILED when ``failed``)."""
        self._write(history)
        self._each("closing", lambda sink: sink.close(failed))
        self.sinks = []

    def _write(self, rounds: Sequence[RoundLog]) -> None:
        rows = [(r.server_round, round_scalars(r)) for r in rounds if r.server_round > self.written]
        if rows:
            self.written = rows[-1][0]
            self._each("writing", lambda sink: sink.write(rows))

    def _each(self, action: str, call: Callable[[Sink], None]) -> None:
        for sink in list(self.sinks):
            try:
                call(sink)
            except Exception as err:  # noqa: BLE001  (a writer that fails must not fail the run)
                log.warning("%s: %s failed (%s: %s); the run goes on without it", sink.name, action, _kind(err), err)
                self.sinks.remove(sink)


def _kind(err: BaseException) -> str:
    return type(err).__name__


def check_installed(settings: Settings) -> None:
    """``mlflow=true`` where MLflow is not installed is refused before round 1, saying how to install it (it is an
    optional extra; TensorBoard's writer is a dependency, and a run without it only warns)."""
    if settings.mlflow and importlib.util.find_spec("mlflow") is None:
        raise ValueError(
            "run-config key 'mlflow' is true, but MLflow is not installed where the ServerApp runs: install it "
            "there with `pip install -e '.[mlflow]'`, or set mlflow=false"
        )


def open_watchers(settings: Settings, folder: Path, resumed: bool) -> RoundWatchers:
    """The sinks the run config asks for (``tensorboard``, ``mlflow``) on the results ``folder``; one that cannot
    be opened is left out with a warning."""
    makers: list[tuple[str, Callable[[], Sink]]] = []
    if settings.tensorboard:
        makers.append(("TensorBoard", lambda: TensorBoardSink(folder, settings, resumed)))
    if settings.mlflow:
        makers.append(("MLflow", lambda: MLflowSink(folder, settings, resumed)))
    sinks = []
    for name, make in makers:
        try:
            sinks.append(make())
        except Exception as err:  # noqa: BLE001  (a writer that fails must not fail the run)
            log.warning("%s: not written (%s: %s); the run goes on without it", name, _kind(err), err)
    return RoundWatchers(sinks)

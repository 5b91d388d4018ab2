"""Flower's simulation runtime in the calling process: the engine for sweeps and many short runs.

What runs is Flower's own simulation runtime, as ``flwr run`` runs it in its ``flwr-simulation`` process: a LinkState
in memory, the ServerApp in a thread talking to an ``InMemoryGrid``, simulated SuperNodes registered in the LinkState
with their Contexts (node config ``partition-id`` / ``num-partitions``, the run config fused from the app's
``pyproject.toml`` and the run's overrides exactly as ``flwr run`` fuses it), and Flower's vce loop moving every
Message between them.  The ServerApp and ClientApp are the objects ``flwr run`` loads (``[tool.flwr.app.components]``
of the app's ``pyproject.toml``).  Only the ``Backend`` differs: :class:`InProcessBackend` calls the ClientApp in this
process, one message at a time, on a copy of the message and the node's Context as Ray's actors get them, where
Flower's ``RayBackend`` starts a Ray cluster and an actor pool.

What that buys: no SuperLink, no ``flwr-simulation`` process, no Ray cluster to start and tear down for every run,
and imports, data and models loaded once per process for every run after the first.  What it costs: one client at a
time per process (parallelism comes from running several runs side by side, ``python -m server_app.sweep --jobs``),
no Ray resources (``client-resources-*`` are accepted and ignored), and a client that hangs holds its run.

The flwr internals this needs are all in :mod:`server_app.flwr_internals`.
"""

from __future__ import annotations

import contextlib
import copy
import io
import json
import logging
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from queue import Empty, Queue
from typing import Any, Self

import click
from flwr.app import Context, Message, RecordDict
from flwr.clientapp import ClientApp

from server_app import flwr_internals as fi

APP_DIR = Path(__file__).resolve().parents[1]
#: federation-config keys Flower's simulation takes that only the Ray backend uses: accepted, without effect here
RAY_ONLY_KEYS = ("client-resources-num-cpus", "client-resources-num-gpus", "init-args-", "backend", "verbose")


class EngineError(ValueError):
    """A run the engine cannot start: its message says what was wrong and what is allowed."""


class InProcessBackend(fi.Backend):
    """Flower's simulation ``Backend`` that calls the ClientApp in this process, one message at a time.

    Like the Ray actor (``flwr.simulation.ray_transport.ray_actor.ClientAppActor.run``), each call gets its own copy
    of the message and the node's Context (Ray pickles them to the actor), hands back copies of the reply and the
    updated Context (Ray pickles them back), and turns an exception of the ClientApp into Flower's
    ``ClientAppException``, which the vce loop answers with an error reply."""

    def __init__(self, backend_config: fi.BackendConfig | None = None) -> None:
        super().__init__(backend_config or {})
        self.app_fn: Callable[[], ClientApp] | None = None
        self._lock = threading.Lock()

    def build(self, app_fn: Callable[[], ClientApp]) -> None:
        self.app_fn = app_fn

    @property
    def num_workers(self) -> int:
        return 1

    def is_worker_idle(self) -> bool:
        return not self._lock.locked()

    def process_message(self, message: Message, context: Context) -> tuple[Message, Context]:
        if self.app_fn is None:
            raise ValueError("the backend was not built: call build() before process_message()")
        with self._lock:
            message, context = copy.deepcopy((message, context))
            try:
                app = self.app_fn()
                reply = app(message=message, context=context)
            except fi.LoadClientAppError:
                raise
            except Exception as ex:
                raise fi.ClientAppException(str(ex)) from ex
            return copy.deepcopy((reply, context))

    def terminate(self) -> None:
        self.app_fn = None


@dataclass
class Federation:
    """``--federation-config`` of a simulation: how many SuperNodes (Flower's default: 2)."""

    num_supernodes: int = 2
    ignored: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def parse(cls, federation_config: str | list[str] | Mapping[str, Any] | None) -> Federation:
        values = _config_values(federation_config, "--federation-config")
        size = values.pop("num-supernodes", 2)
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise EngineError(f"num-supernodes must be a whole number >= 1, got {size!r}")
        unknown = [k for k in values if not k.startswith(RAY_ONLY_KEYS)]
        if unknown:
            raise EngineError(
                f"--federation-config key(s) {', '.join(map(repr, unknown))} are not simulation settings: the engine "
                "takes num-supernodes (and accepts Ray's client-resources-* / init-args-*, which it does not use)"
            )
        return cls(num_supernodes=size, ignored=values)


def _config_values(config: str | list[str] | Mapping[str, Any] | None, what: str, axes: bool = False) -> dict[str, Any]:
    """``key=value`` text as ``flwr run`` parses it (Flower's own parser; a ``.toml`` file too), or a mapping taken
    through the same text so that its values get exactly the types ``flwr run`` would give them.  With ``axes``, a
    value may be an array (a sweep's axis)."""
    if config is None:
        return {}
    if isinstance(config, Mapping):
        config = [run_config_text(config)]
    elif isinstance(config, str):
        config = [config]
    try:
        values = fi.parse_config_args(list(config), flatten=not axes)
    except (ValueError, OSError, click.ClickException) as err:  # tomli's TOMLDecodeError is a ValueError
        message = err.format_message() if isinstance(err, click.ClickException) else str(err)
        raise EngineError(f"{what} cannot be read: {message}") from None
    return _flatten(values) if axes else dict(values)


def _flatten(values: Mapping[str, Any], parent: str = "") -> dict[str, Any]:
    """Nested tables as Flower's dotted keys (``flatten_dict``), arrays kept."""
    flat: dict[str, Any] = {}
    for key, value in values.items():
        name = f"{parent}.{key}" if parent else key
        if isinstance(value, Mapping):
            flat.update(_flatten(value, name))
        else:
            flat[name] = value
    return flat


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    text = str(value)
    if "'" in text:
        if '"' in text:
            raise EngineError(f"a run-config value cannot hold both quote characters: {text!r}")
        return '"' + text + '"'
    return "'" + text + "'"


def run_config_text(config: Mapping[str, Any]) -> str:
    """A run-config mapping as the ``key=value`` text ``flwr run --run-config`` takes."""
    return " ".join(f"{k}={toml_value(v)}" for k, v in config.items())


@dataclass
class App:
    """A Flower app folder: its components and its declared run config, read once."""

    folder: Path
    serverapp: str
    clientapp: str
    defaults: dict[str, Any]
    fab_id: str
    fab_version: str

    @classmethod
    def load(cls, folder: str | Path = APP_DIR) -> App:
        folder = Path(folder).expanduser().resolve()
        if not (folder / "pyproject.toml").is_file():
            raise EngineError(f"{folder} is not a Flower app folder (no pyproject.toml)")
        config = fi.get_project_config(folder)
        flwr_app = config["tool"]["flwr"]["app"]
        return cls(
            folder=folder,
            serverapp=flwr_app["components"]["serverapp"],
            clientapp=flwr_app["components"]["clientapp"],
            defaults=fi.flatten_dict(flwr_app.get("config", {})),
            fab_id=f"{flwr_app['publisher']}/{config['project']['name']}",
            fab_version=config["project"]["version"],
        )

    def overrides(self, run_config: str | list[str] | Mapping[str, Any] | None) -> dict[str, Any]:
        """The run's overrides, refused as Flower refuses them when a key is not declared by the app."""
        overrides = _config_values(run_config, "--run-config")
        unknown = sorted(set(overrides) - set(self.defaults))
        if unknown:
            import difflib

            said = []
            for key in unknown:
                close = difflib.get_close_matches(key, list(self.defaults), n=3)
                said.append(f"{key!r}" + (f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""))
            raise EngineError(
                f"run-config key(s) {', '.join(said)} not declared by the app ({self.folder / 'pyproject.toml'}); "
                "`python -m task.config` lists every key"
            )
        return overrides

    def fused(self, overrides: Mapping[str, Any]) -> dict[str, Any]:
        """The run config a ServerApp and every ClientApp see: the app's defaults fused with the overrides."""
        return dict(fi.fuse_dicts(self.defaults, dict(overrides)))


@dataclass
class RunResult:
    """How one run on the engine ended."""

    run_id: int
    run_config: dict[str, Any]
    num_supernodes: int
    seconds: float
    clientapp_seconds: float
    output: str
    error: BaseException | None = None
    context: Context | None = None

    @property
    def failed(self) -> bool:
        return self.error is not None


class _Capture(logging.Handler):
    """Flower's log lines (``LEVEL : message``, as ``flwr run --stream`` shows them) into a run's output."""

    def __init__(self, sink: Callable[[str], Any]) -> None:
        super().__init__(logging.DEBUG)
        self.sink = sink
        self.setFormatter(logging.Formatter("%(levelname)-8s: %(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        if record.levelno >= logging.INFO:
            self.sink(self.format(record) + "\n")


class _Tee(io.TextIOBase):
    def __init__(self, *sinks: Callable[[str], Any]) -> None:
        self.sinks = sinks

    def write(self, s: str) -> int:
        for sink in self.sinks:
            sink(s)
        return len(s)

    def flush(self) -> None:
        for sink in self.sinks:
            flush = getattr(getattr(sink, "__self__", None), "flush", None)
            if flush is not None:
                flush()


@contextlib.contextmanager
def _captured(echo: bool) -> Iterator[io.StringIO]:
    """The run's printed lines and Flower's log lines, into one buffer (and through to the console when ``echo``)."""
    buffer = io.StringIO()
    lock = threading.Lock()

    def sink(text: str) -> None:
        with lock:
            buffer.write(text)

    logger = logging.getLogger("flwr")
    capture = _Capture(sink)
    logger.addHandler(capture)
    console = [h for h in logger.handlers if h is not capture]
    levels = [h.level for h in console]
    if not echo:
        for handler in console:
            handler.setLevel(logging.CRITICAL + 1)
    real_stdout = sys.stdout
    sys.stdout = _Tee(sink, real_stdout.write) if echo else _Tee(sink)
    try:
        yield buffer
    finally:
        sys.stdout = real_stdout
        logger.removeHandler(capture)
        for handler, level in zip(console, levels, strict=True):
            handler.setLevel(level)


def _new_run(app: App, overrides: dict[str, Any]) -> fi.Run:
    run = fi.Run.create_empty(run_id=fi.generate_rand_int_from_bytes(fi.RUN_ID_NUM_BYTES))
    run.primary_task_id = fi.generate_rand_int_from_bytes(fi.TASK_ID_NUM_BYTES)
    run.fab_id, run.fab_version = app.fab_id, app.fab_version
    run.override_config = overrides
    run.federation_id = fi.NOOP_FEDERATION_ID
    return run


def run_app(
    run_config: str | list[str] | Mapping[str, Any] | None = None,
    federation_config: str | list[str] | Mapping[str, Any] | None = None,
    *,
    app: App | str | Path = APP_DIR,
    echo: bool = True,
) -> RunResult:
    """One run of the app on Flower's simulation runtime in this process (``flwr run``'s arguments, as text or
    mappings); returns how it ended, with everything it printed and logged."""
    app = app if isinstance(app, App) else App.load(app)
    federation = Federation.parse(federation_config)
    overrides = app.overrides(run_config)
    run = _new_run(app, overrides)
    fused = app.fused(overrides)

    state_factory = fi.LinkStateFactory(fi.FLWR_IN_MEMORY_DB_NAME, fi.NoOpFederationManager(), fi.ObjectStoreFactory())
    state = state_factory.state()
    assert isinstance(state, fi.InMemoryLinkState)
    state.run_ids[run.run_id] = fi.RunRecord(run=run)
    primary = int(run.primary_task_id or 0)
    state.task_store[primary] = fi.Task(task_id=primary, run_id=run.run_id)
    # the identity of the task this process runs, as flwr-simulation sets it for the ServerApp it runs
    fi.TaskIdentity.task_id, fi.TaskIdentity.run_id = primary, run.run_id
    fi.TaskIdentity.node_id = fi.SUPERLINK_NODE_ID
    grid = fi.InMemoryGrid(state_factory=state_factory)
    grid.set_run(run)
    server_context = Context(
        run_id=run.run_id, node_id=fi.SUPERLINK_NODE_ID, node_config={}, state=RecordDict(), run_config=fused
    )

    f_stop = threading.Event()
    errors: Queue[BaseException] = Queue()
    contexts: Queue[Context] = Queue()
    metrics = fi.VceMetrics()
    start = time.monotonic()
    error: BaseException | None = None
    context: Context | None = None
    with _captured(echo) as out:
        try:
            client_app = fi.load_app(app.clientapp, fi.LoadClientAppError, str(app.folder))
            if not isinstance(client_app, ClientApp):
                raise fi.LoadClientAppError(f"{app.clientapp} is not a ClientApp")
            nodes = fi.register_nodes(federation.num_supernodes, state_factory)
            stores = fi.register_node_contexts(nodes, run, str(app.folder))
            server = fi.run_serverapp_th(
                server_app_attr=app.serverapp,
                server_app=None,
                server_app_context=server_context,
                grid=grid,
                app_dir=str(app.folder),
                f_stop=f_stop,
                exception_queue=errors,
                enable_tf_gpu_growth=False,
                ctx_queue=contexts,
            )
            try:
                fi.run_api(
                    lambda: client_app,
                    InProcessBackend,
                    nodes,
                    state_factory,
                    stores,
                    f_stop,
                    metrics,
                )
            finally:
                f_stop.set()
                server.join()
            with contextlib.suppress(Empty):
                context = contexts.get_nowait()
            with contextlib.suppress(Empty):
                error = errors.get_nowait()
            if error is not None:  # as flwr-simulation reports it: the line, then the ServerApp's traceback
                logging.getLogger("flwr").error("Simulation raised an exception", exc_info=error)
        except Exception as ex:  # noqa: BLE001 - the runtime itself failed (loading the apps, the vce loop): said
            f_stop.set()
            error = ex
            logging.getLogger("flwr").error("the engine could not run the app: %s", ex)
        output = out.getvalue()
    return RunResult(
        run_id=run.run_id,
        run_config=fused,
        num_supernodes=federation.num_supernodes,
        seconds=time.monotonic() - start,
        clientapp_seconds=metrics.clientapp_runtime,
        output=output,
        error=error,
        context=context,
    )


class Engine:
    """Runs on the engine with :class:`server_app.runner.LocalSimulation`'s interface: ``run(run_config,
    num_supernodes)`` returns the run's ``summary.json`` plus ``log`` (everything it printed), or raises
    :class:`server_app.runner.RunFailed` when the run did not finish.  Use as a context manager (nothing to start)."""

    def __init__(self, workdir: str | Path | None = None, app: str | Path = APP_DIR, echo: bool = False) -> None:
        import tempfile

        self._own_dir = workdir is None
        self.home = Path(workdir or tempfile.mkdtemp(prefix="pflower-engine-"))
        self.app = App.load(app)
        self.echo = echo

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self._own_dir:
            import shutil

            shutil.rmtree(self.home, ignore_errors=True)

    def run(
        self,
        run_config: dict[str, Any],
        num_supernodes: int = 4,
        timeout: float | None = None,
        app_dir: Path | None = None,
        num_cpus: int | None = None,
        log_path: Path | None = None,
    ) -> dict[str, Any]:
        """``timeout`` and ``num_cpus`` are accepted for LocalSimulation's callers and not used (a run holds its
        process until it ends; clients run one at a time)."""
        from server_app.runner import RunFailed, results_folder_from_output

        del timeout, num_cpus
        if "results-dir" not in run_config:
            run_config = {**run_config, "results-dir": str(self.home / "results")}
        result = run_app(
            run_config,
            {"num-supernodes": num_supernodes},
            app=self.app if app_dir is None else App.load(app_dir),
            echo=self.echo,
        )
        if log_path is not None:
            Path(log_path).write_text(result.output)
        folder = results_folder_from_output(result.output)
        if folder is None:
            tail = "\n".join(result.output.splitlines()[-40:])
            raise RunFailed(f"the run failed on the engine ({result.error!r}) for {run_config}:\n{tail}", result.output)
        summary = json.loads((folder / "summary.json").read_text())
        if summary.get("aborted"):
            raise RunFailed(f"the run stopped early: {summary['aborted']}", output=result.output)
        summary["log"] = result.output
        summary["engine-seconds"] = result.seconds
        return summary

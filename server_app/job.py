"""Run a job with an exit status a script can trust: ``python -m server_app.job [APP] [SUPERLINK] [--run-config ...]
[--federation-config ...] [--check]``.

``flwr run --stream`` exits 0 whenever it could follow the run to its end, also when the ServerApp refused the run
config, stopped after ``stop-after`` or aborted (only a run-config key the app does not declare, refused by Flower
itself, gives 1).  This command takes ``flwr run``'s arguments, and

1. checks the run config first, with pflower's own option parser (the code the ServerApp and every ClientApp run
   on it, over the app's ``pyproject.toml`` defaults as Flower fuses them): a key the app does not declare, a bad
   value or values that conflict are refused here, naming the key and what is allowed, in a few seconds and
   before anything starts (no SuperLink, no Ray); where ``--federation-config`` sets ``num-supernodes``, also what
   that many simulated clients would get (:func:`task.config.check_clients`, as the ServerApp checks at start-up:
   a client without a training or a test example, a partition that cannot be drawn, with how many clients the data
   can serve) and ``min-nodes`` above it;
2. runs ``flwr run APP [SUPERLINK] --stream ...``, passing its output through;
3. reads how the run ended from the ServerApp's own lines (the summary line ``pflower ... -> <folder>`` and
   ``summary.json`` where that folder is readable from here, the stop line, the refusal line) and exits with:

   ====  =====================================================================================================
   0     completed: every round ran (the summary line, no ``ABORTED`` or ``STOPPED``; ``outcome`` in summary.json)
   1     Flower error: ``flwr run`` failed, or the run ended without any of pflower's lines (the ServerApp
         crashed, the SuperLink could not be reached, the run was stopped with ``flwr stop``, ...)
   2     usage: this command's own arguments are wrong
   3     refused: the run config (checked here, by the ServerApp at start-up, e.g. a ``resume-from`` folder
         that does not fit or more simulated clients than the data can serve, or by Flower)
   4     stopped after round k as asked (``stop-after=k``); its last line says how to resume
   5     not completed: aborted, the run could not go on, or its final means speak for fewer than
         ``min-coverage`` of the clients asked (``ABORTED: ...`` on the summary line, ``aborted`` in
         summary.json); or the privacy budget is exhausted (``dp-max-epsilon``: ``STOPPED: ...`` on the summary
         line, ``stopped`` in summary.json; ``resume-from`` with a higher maximum continues it)
   130   interrupted (Ctrl-C): this command stopped following; the run goes on on the SuperLink
   ====  =====================================================================================================

The last line it prints is ``pflower job: <outcome> (exit N)``.  ``--check`` only checks the run config (exit 0 or
3).  When this command's ``flwr run`` starts the local SuperLink, the SuperLink gets
``FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION=1`` (unless set otherwise) and a warnings filter that silences
Ray's ``RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO`` FutureWarning (about a future Ray; Ray's behaviour is unchanged).
When ``--federation-config`` sets ``num-supernodes``, Flower's warning "default simulated SuperNodes changed from
10 to 2", which Flower prints whatever the size, is left out (Flower's next line names the size in effect).
"""

from __future__ import annotations

import argparse
import difflib
import json
import os
import subprocess
import sys
from enum import IntEnum
from pathlib import Path
from typing import Any

from server_app.runner import refusal, results_folder_from_output, stopped_after, summary_line


class Exit(IntEnum):
    """The exit status of ``python -m server_app.job`` (and of ``deploy/local_cluster.py``, which shares them)."""

    COMPLETED = 0
    FLOWER_ERROR = 1
    USAGE = 2
    REFUSED = 3
    STOPPED = 4
    ABORTED = 5
    #: the privacy budget stopped the run (``dp-max-epsilon``): it ended before its last round, as an aborted one
    BUDGET_EXHAUSTED = 5
    INTERRUPTED = 130


#: Flower's warning on every simulated run, whatever the federation's size (flwr 1.41, flwr.simulation.app)
SIZE_WARNING = "default simulated SuperNodes changed from 10 to 2"
#: a warnings filter (Python's documented PYTHONWARNINGS) for Ray's notice about what a future Ray will do when a
#: task reserves no GPU; this Ray keeps hiding the GPUs from such a task, which is what the clients rely on
RAY_NOTICE_FILTER = "ignore::FutureWarning:ray._private.worker"
FLOWER_REFUSED = "Invalid run configuration"


class Refused(ValueError):
    """The run config cannot run; the message names the key and what is allowed."""


def app_defaults(app: str) -> dict[str, Any] | None:
    """The run config the app declares (``[tool.flwr.app.config]`` of its pyproject.toml, flattened as Flower
    does), for an app folder or a ``.fab`` file; None for anything else (Flower will say what is wrong)."""
    from flwr.common.config import flatten_dict, get_fab_config, get_project_config

    path = Path(app).expanduser()
    if path.is_dir() and (path / "pyproject.toml").is_file():
        config = get_project_config(path)
    elif path.is_file() and path.suffix == ".fab":
        config = get_fab_config(path)
    else:
        return None
    return flatten_dict(config["tool"]["flwr"]["app"].get("config", {}))


def check_run_config(app: str, run_config: list[str], federation_config: list[str] | None = None):
    """The settings the ServerApp would parse from ``run_config`` (``flwr run``'s ``--run-config`` values) over the
    app's defaults, or :class:`Refused`; None when the app is not a folder or ``.fab`` this command can read.  Where
    ``federation_config`` sets ``num-supernodes`` (a simulation of that many clients, each a partition of the run's
    data set) the run is also checked at that size (:func:`check_simulation`)."""
    import click
    from flwr.common.config import fuse_dicts, parse_config_args

    defaults = app_defaults(app)
    if defaults is None:
        return None
    try:
        overrides = parse_config_args(run_config or None)
    except (click.ClickException, ValueError, OSError) as err:
        message = err.format_message() if isinstance(err, click.ClickException) else str(err)
        raise Refused(f"--run-config cannot be read: {message}") from None
    unknown = sorted(set(overrides) - set(defaults))
    if unknown:
        said = []
        for key in unknown:
            close = difflib.get_close_matches(key, list(defaults), n=3)
            said.append(f"{key!r}" + (f" (did you mean {' or '.join(map(repr, close))}?)" if close else ""))
        raise Refused(
            f"run-config key{'s' if len(said) > 1 else ''} {', '.join(said)} not declared by the app: Flower refuses "
            f"{'them' if len(said) > 1 else 'it'} with a bare '{FLOWER_REFUSED}'; `python -m task.config` lists "
            "every key"
        )
    from task.config import parse_settings  # imports torch: after the checks that need only the keys

    try:
        settings = parse_settings(fuse_dicts(defaults, overrides))
    except ValueError as err:
        raise Refused(str(err)) from None
    if (clients := num_supernodes(federation_config or [])) is not None:
        check_simulation(settings, clients)
    return settings


def check_simulation(settings, clients: int) -> None:
    """Refuse what a simulation of ``clients`` SuperNodes cannot run, as the ServerApp would at its start
    (:func:`task.config.check_clients`: a client without a training or a test example, a partition that cannot be
    drawn, every client held out), and ``min-nodes`` above the SuperNodes started (the run would wait
    ``node-wait-timeout`` seconds for nodes that never come)."""
    from task.config import client_conflicts

    problems = []
    if settings.min_nodes > clients:
        problems.append(
            f"min-nodes={settings.min_nodes} waits for more nodes than num-supernodes={clients} starts; use "
            f"min-nodes <= {clients} or more SuperNodes"
        )
    try:
        problems += client_conflicts(settings, clients)
    except ValueError as err:  # the data set cannot be read from here
        problems.append(str(err))
    if problems:
        raise Refused("; ".join(problems))


def num_supernodes(federation_config: list[str]) -> int | None:
    """``num-supernodes`` of ``--federation-config`` (None when it is not set, or not a whole number: Flower says
    what is wrong with it)."""
    from flwr.common.config import parse_config_args

    try:
        value = parse_config_args(federation_config or None).get("num-supernodes")
    except Exception:  # noqa: BLE001 - Flower reports a bad --federation-config itself
        return None
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else None


def read_summary(output: str) -> dict[str, Any] | None:
    """``summary.json`` of the folder the summary line names, where it is readable from here (the results are
    written on the SuperLink's host, relative to its working directory)."""
    folder = results_folder_from_output(output)
    try:
        return json.loads((folder / "summary.json").read_text()) if folder else None
    except (OSError, ValueError):
        return None


def outcome(returncode: int, output: str, summary: dict[str, Any] | None = None) -> tuple[Exit, str]:
    """How a run ended, from ``flwr run --stream``'s exit status and output (and ``summary.json`` when read)."""
    if stop := stopped_after(output):
        k, folder = stop
        return Exit.STOPPED, (
            f"stopped after round {k} as asked (stop-after={k}); continue with --run-config \"resume-from='{folder}'\""
        )
    line = summary_line(output)
    if line is not None:
        said = line.rsplit(" -> ", 1)[0]
        aborted = (summary or {}).get("aborted") or (said.split(", ABORTED: ", 1)[1] if ", ABORTED: " in said else "")
        if aborted:
            return Exit.ABORTED, f"aborted: {aborted}"
        stopped = (summary or {}).get("stopped") or (said.split(", STOPPED: ", 1)[1] if ", STOPPED: " in said else "")
        if stopped:  # dp-max-epsilon: not every round ran; the checkpoint of the last one is written
            return Exit.BUDGET_EXHAUSTED, f"privacy budget exhausted: {stopped}"
        if returncode != 0:
            return Exit.FLOWER_ERROR, f"flwr run exited with {returncode} after the run's summary line: {line}"
        return Exit.COMPLETED, f"completed: {line}"
    if reason := refusal(output):
        return Exit.REFUSED, f"refused by the ServerApp at start-up: {reason}"
    if FLOWER_REFUSED in output:
        return Exit.REFUSED, f"refused by Flower: '{FLOWER_REFUSED}' (a run-config key the app does not declare?)"
    errors = [ln.strip() for ln in output.splitlines() if "ERROR" in ln or ln.startswith("Error")]
    last = f"; last error: {errors[-1][-300:]}" if errors else ""
    return Exit.FLOWER_ERROR, f"flwr run exited with {returncode} and the run printed no pflower summary line{last}"


def flwr_command(args: argparse.Namespace) -> list[str]:
    cmd = ["flwr", "run", args.app, *([args.superlink] if args.superlink else []), "--stream"]
    for value in args.federation_config:
        cmd += ["--federation-config", value]
    for value in args.run_config:
        cmd += ["--run-config", value]
    return cmd


def environment() -> dict[str, str]:
    """This command's environment for ``flwr run``, which hands it to a local SuperLink it starts."""
    env = dict(os.environ)
    env.setdefault("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", "1")
    env["PYTHONWARNINGS"] = ",".join(w for w in (env.get("PYTHONWARNINGS", ""), RAY_NOTICE_FILTER) if w)
    return env


def finish(code: Exit, message: str) -> int:
    print(f"pflower job: {message} (exit {int(code)})", flush=True)
    return int(code)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        prog="python -m server_app.job",
        description=__doc__.split("\n\n")[0],
        epilog="exit status: 0 completed, 1 Flower error, 2 usage, 3 run config refused, 4 stopped after round k as "
        "asked (stop-after), 5 aborted or privacy budget exhausted (dp-max-epsilon), 130 interrupted",
    )
    ap.add_argument("app", nargs="?", default=".", help="the app folder (or .fab), as for flwr run (default: .)")
    ap.add_argument("superlink", nargs="?", help="the SuperLink connection, as for flwr run (default: Flower's)")
    ap.add_argument("--run-config", "-c", action="append", default=[], help="as for flwr run (repeatable)")
    ap.add_argument("--federation-config", action="append", default=[], help="as for flwr run (repeatable)")
    ap.add_argument("--check", action="store_true", help="only check the run config (exit 0 or 3); start nothing")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        settings = check_run_config(args.app, args.run_config, args.federation_config)
    except Refused as err:
        return finish(Exit.REFUSED, f"refused before the run started: {err}")
    if settings is None:
        print(f"pflower job: {args.app!r} is not an app folder or .fab: the ServerApp will check the run config")
    elif args.check:
        return finish(Exit.COMPLETED, f"the run config is valid (method {settings.method!r})")
    hide_size_warning = num_supernodes(args.federation_config) is not None
    lines: list[str] = []
    proc = subprocess.Popen(
        flwr_command(args), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=environment()
    )
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            lines.append(line)
            if not (hide_size_warning and SIZE_WARNING in line):
                sys.stdout.write(line)
                sys.stdout.flush()
        proc.wait()
    except KeyboardInterrupt:
        proc.terminate()
        proc.wait()
        return finish(Exit.INTERRUPTED, "interrupted: stopped following the run, which goes on (flwr stop <run id>)")
    output = "".join(lines)
    code, message = outcome(proc.returncode, output, read_summary(output))
    return finish(code, message)


if __name__ == "__main__":
    sys.exit(main())

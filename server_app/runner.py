"""Run the app programmatically through Flower's own runtime, for tests and benchmarks.

:class:`LocalSimulation` starts a private ``flower-superlink --simulation`` (own ports, own
``FLWR_HOME``, runtime dependency installation disabled so runs use this environment), submits runs
with ``flwr run <app> <connection> --stream`` and stops the SuperLink by its process id on exit.
Nothing here bypasses Flower: every run goes through the SuperLink, the simulation runtime and the
Message API like any ``flwr run``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any, Self

APP_DIR = Path(__file__).resolve().parents[1]
CONNECTION = "pflower-local"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return "'" + str(value).replace("'", "") + "'"


def run_config_arg(config: dict[str, Any]) -> str:
    return " ".join(f"{k}={toml_value(v)}" for k, v in config.items())


def summary_line(output: str) -> str | None:
    """The ServerApp's ``pflower ... -> <folder>`` summary line in a run's output (the last one), or None."""
    lines = [line for line in output.splitlines() if line.startswith("pflower ") and re.search(r"-> \S+\s*$", line)]
    return lines[-1].rstrip() if lines else None


def results_folder_from_output(output: str) -> Path | None:
    """The results folder named by the summary line in a run's output (``flwr run --stream``), or None."""
    line = summary_line(output)
    return Path(line.rsplit("-> ", 1)[1].strip()) if line else None


#: the ServerApp's log line when it refuses the run config at start-up, before round 1 (a bad value, values that
#: conflict, a ``resume-from`` folder that does not fit); the reason follows it on the same line
REFUSED_AT_START_UP = "the run config was refused at start-up: "


def refusal(output: str) -> str | None:
    """The reason the ServerApp gave for refusing the run config at start-up, in a run's output, or None."""
    found = [
        line.split(REFUSED_AT_START_UP, 1)[1].strip() for line in output.splitlines() if REFUSED_AT_START_UP in line
    ]
    return found[-1] if found else None


def stop_line(after_round: int, folder: str | Path) -> str:
    """What the ServerApp prints when ``stop-after`` stops it after round ``after_round``'s checkpoint."""
    return (
        f"pflower stopped after round {after_round} as asked (stop-after={after_round}); "
        f"resume with resume-from='{folder}'"
    )


_STOP_RE = re.compile(
    r"^pflower stopped after round (\d+) as asked \(stop-after=\d+\); resume with resume-from='([^']+)'"
)


def stopped_after(output: str) -> tuple[int, Path] | None:
    """(round, results folder) of :func:`stop_line` in a run's output (the last one), or None."""
    found = [m for line in output.splitlines() if (m := _STOP_RE.match(line.strip()))]
    return (int(found[-1].group(1)), Path(found[-1].group(2))) if found else None


class RunFailed(RuntimeError):
    """A run that did not finish; ``output`` holds everything ``flwr run`` printed."""

    def __init__(self, message: str, output: str = "") -> None:
        super().__init__(message)
        self.output = output


class LocalSimulation:
    """A private SuperLink in simulation mode; use as a context manager."""

    def __init__(
        self, workdir: str | Path | None = None, startup_timeout: float = 60.0, num_cpus: int | None = 1
    ) -> None:
        """``num_cpus``: the CPUs each simulated client asks Ray for (``client-resources-num-cpus``), which sets how
        many clients run at a time (1, the README's command: as many as cores); None leaves Flower's own default (2,
        what a bare ``flwr run .`` gets: one client at a time on two cores, and one Ray worker to start, not two)."""
        self._own_dir = workdir is None
        self.num_cpus = num_cpus
        self.home = Path(workdir or tempfile.mkdtemp(prefix="pflower-flwr-"))
        self.port = free_port()
        self.health_port = free_port()
        self.startup_timeout = startup_timeout
        self.process: subprocess.Popen | None = None
        self.log_path = self.home / "superlink.log"  # what the SuperLink prints, once started

    @property
    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["FLWR_HOME"] = str(self.home)
        env["FLWR_DISABLE_UPDATE_CHECK"] = "1"
        env["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] = "1"
        env.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
        return env

    def start(self) -> Self:
        self.home.mkdir(parents=True, exist_ok=True)
        (self.home / "config.toml").write_text(
            f'[superlink]\ndefault = "{CONNECTION}"\n\n[superlink.{CONNECTION}]\n'
            f'address = "127.0.0.1:{self.port}"\ninsecure = true\n'
        )
        cmd = [
            shutil.which("flower-superlink") or "flower-superlink",
            "--insecure",
            "--simulation",
            "--isolation",
            "subprocess",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--health-server-address",
            f"127.0.0.1:{self.health_port}",
            "--disable-runtime-dependency-installation",
            "--database",
            str(self.home / "state.db"),
        ]
        with self.log_path.open("w") as log:  # the SuperLink writes through its own copy of the descriptor
            self.process = subprocess.Popen(
                cmd, env=self.env, stdout=log, stderr=subprocess.STDOUT, cwd=self.home, start_new_session=True
            )
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RunFailed(f"flower-superlink exited with {self.process.returncode}; see {self.log_path}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/health", timeout=0.5) as r:
                    if r.status == 200:
                        return self
            except OSError:
                pass
            time.sleep(0.3)
        self.stop()
        raise RunFailed(f"flower-superlink did not become healthy in {self.startup_timeout:.0f} s; see {self.log_path}")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)
        self.process = None
        if self._own_dir:
            shutil.rmtree(self.home, ignore_errors=True)

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def run(
        self,
        run_config: dict[str, Any],
        num_supernodes: int = 4,
        timeout: float = 1200.0,
        app_dir: Path = APP_DIR,
        num_cpus: int | None = None,
        log_path: Path | None = None,
    ) -> dict[str, Any]:
        """Submit one run, follow it to the end, and return its ``summary.json`` (plus ``log``); ``num_cpus``
        overrides the instance's client resources for this run."""
        if "results-dir" not in run_config:
            run_config = {**run_config, "results-dir": str(self.home / "results")}
        cpus = self.num_cpus if num_cpus is None else num_cpus
        fed = f"num-supernodes={num_supernodes}" + ("" if cpus is None else f" client-resources-num-cpus={int(cpus)}")
        cmd = [
            shutil.which("flwr") or "flwr",
            "run",
            str(app_dir),
            CONNECTION,
            "--stream",
            "--federation-config",
            fed,
            "--run-config",
            run_config_arg(run_config),
        ]
        proc = subprocess.run(
            cmd, env=self.env, capture_output=True, text=True, timeout=timeout, cwd=app_dir, check=False
        )
        out = proc.stdout + proc.stderr
        if log_path is not None:
            Path(log_path).write_text(out)
        folder = results_folder_from_output(out)
        if proc.returncode != 0 or folder is None:
            tail = "\n".join(out.splitlines()[-40:])
            raise RunFailed(f"flwr run failed (exit {proc.returncode}) for {run_config}:\n{tail}", output=out)
        summary = json.loads((folder / "summary.json").read_text())
        if summary.get("aborted"):  # flwr run exits 0 even when the ServerApp raised: the summary says it stopped
            raise RunFailed(f"the run stopped early: {summary['aborted']}", output=out)
        summary["log"] = out
        return summary

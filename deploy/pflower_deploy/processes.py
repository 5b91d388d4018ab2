"""Child processes in their own process groups (stopped by id, never by name), and waiting for /health."""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path


class ClusterError(RuntimeError):
    """A step of the deployment failed; the message says which and why."""


def say(msg: str) -> None:
    print(f"[local_cluster {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def tail(path: Path, n: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return f"(no {path})"


class Proc:
    """A child process in its own session/process group, with its output in a log file."""

    def __init__(
        self, name: str, cmd: list[str], env: dict[str, str], log: Path, cwd: Path, pipe: bool = False
    ) -> None:
        """``pipe``: stdout is a text pipe the caller reads (and copies to ``log`` itself)."""
        self.name, self.cmd, self.log = name, cmd, log
        with contextlib.ExitStack() as files:  # the child holds its own copy of the log's descriptor
            out = subprocess.PIPE if pipe else files.enter_context(log.open("ab"))
            self.popen = subprocess.Popen(
                cmd,
                env=env,
                cwd=cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
                text=pipe or None,
                errors="replace" if pipe else None,
            )
        self.pid = self.popen.pid

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal_group(self, sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)

    def stop(self, grace: float = 15.0) -> None:
        """SIGTERM to the process group, SIGKILL after ``grace`` seconds; also reaps the group's leftovers."""
        if self.alive():
            self.signal_group(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=grace)
        self.signal_group(signal.SIGKILL)  # children (superexec, clientapp/serverapp, nginx workers) in the group
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.popen.wait(timeout=10)


def wait_healthy(proc: Proc, url: str, ca: Path, timeout: float) -> None:
    """Poll ``url`` (HTTPS, verified against ``ca``) until it answers 200; fail early if ``proc`` exits."""
    ctx = ssl.create_default_context(cafile=str(ca))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            raise ClusterError(f"{proc.name} exited ({proc.popen.returncode}):\n{tail(proc.log)}")
        try:
            with urllib.request.urlopen(url, timeout=1, context=ctx) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.5)
    raise ClusterError(f"{proc.name} did not answer 200 on {url} in {timeout:.0f} s:\n{tail(proc.log)}")

"""A Ray head of a test's own on this machine (``ray start --head``), stopped by the processes that name its temp
folder, never by name (``ray stop`` would stop every Ray cluster of the machine, other tests' included)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

import pytest


@contextlib.contextmanager
def ray_head(num_cpus: int = 2) -> Iterator[tuple[str, str]]:
    """(the head's address, its temp folder) while it runs; skips the test where the ray CLI is missing."""
    ray = shutil.which("ray")
    if ray is None:
        pytest.skip("the ray CLI is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO="0")
    ray_dir = tempfile.mkdtemp(prefix="pfr")  # short: Ray's socket paths live under it (107-char limit)
    try:
        start = subprocess.run(
            [ray, "start", "--head", f"--port={port}", f"--num-cpus={num_cpus}", "--include-dashboard=false",
             "--disable-usage-stats", f"--temp-dir={ray_dir}"],
            env=env, capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
        assert start.returncode == 0, start.stdout + start.stderr
        yield f"127.0.0.1:{port}", ray_dir
    finally:
        for sig in (signal.SIGTERM, signal.SIGKILL):  # gcs_server outlived SIGTERM here: finish with SIGKILL
            for pid in subprocess.run(
                ["pgrep", "-f", ray_dir], capture_output=True, text=True, check=False
            ).stdout.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), sig)
            time.sleep(2)
        shutil.rmtree(ray_dir, ignore_errors=True)

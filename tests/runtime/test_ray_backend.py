"""The Ray backend settings the README documents: joining an existing Ray cluster.  (Client resources, one CPU per
client as the README's commands ask: tests/project/test_readme_examples.py runs those commands.)"""

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

SMALL = {"method": "fedavg", "num-server-rounds": 1, "min-nodes": 3, "model": "softmax"}


@pytest.mark.extended  # starts its own Ray cluster (python -m pytest -m extended)
def test_existing_ray_cluster_via_ray_address(tmp_path):
    from server_app.runner import LocalSimulation

    ray = shutil.which("ray")
    if ray is None:
        pytest.skip("the ray CLI is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO="0")
    ray_dir = tempfile.mkdtemp(prefix="pfr")  # short: Ray's socket paths live under it (107-char limit)
    start = subprocess.run(
        [
            ray,
            "start",
            "--head",
            f"--port={port}",
            "--num-cpus=2",
            "--include-dashboard=false",
            "--disable-usage-stats",
            f"--temp-dir={ray_dir}",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert start.returncode == 0, start.stdout + start.stderr
    old = os.environ.get("RAY_ADDRESS")
    os.environ["RAY_ADDRESS"] = f"127.0.0.1:{port}"
    try:
        with LocalSimulation(workdir=tmp_path / "flwr") as sim:
            summary = sim.run(SMALL, num_supernodes=3)
        assert summary["rounds"] == 1
        # the simulation's actors ran as workers of the external cluster: their logs are in its session folder
        workers = list(Path(ray_dir).glob("session_*/logs/worker-*"))
        assert workers, sorted(str(p) for p in Path(ray_dir).rglob("*"))[:20]
    finally:
        if old is None:
            os.environ.pop("RAY_ADDRESS", None)
        else:
            os.environ["RAY_ADDRESS"] = old
        # stop only this cluster's processes (by the temp dir in their command lines), never other Ray sessions
        for sig in (signal.SIGTERM, signal.SIGKILL):  # gcs_server outlived SIGTERM here: finish with SIGKILL
            for pid in subprocess.run(
                ["pgrep", "-f", ray_dir], capture_output=True, text=True, check=False
            ).stdout.split():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(int(pid), sig)
            time.sleep(2)
        shutil.rmtree(ray_dir, ignore_errors=True)

"""Differential privacy on Flower's deployment runtime (deploy/local_cluster.py, the loopback cluster: SuperLink and
SuperNodes as separate processes, TLS, node authentication): a central-DP FedAvg run and a local-DP FedC2I run each
finish with the run's (epsilon, delta) in summary.json, round by round in rounds.json and in the summary line; a
target epsilon sets every client's noise (local DP), and a maximum stops a run cleanly.

One short run per mode (two SuperNodes, two rounds, the run's other settings at their defaults); skips where
tests/deploy/test_local_cluster.py skips.  The default test run deploys local DP, whose accounting is where the
deployment differs from a simulation: each client counts its own releases in its own state folder, from a fresh
ClientApp process per message.  Central DP, accounted by the server as in a simulation (tests/privacy runs it
there), is deployed with ``python -m pytest -m extended``."""

import json
import shutil
from pathlib import Path

import pytest

from task.checkpoint import load_checkpoint
from task.privacy import calibrate_local, central_epsilon, local_epsilon

# one xdist worker runs every deployment test in turn: they share network namespace names and the machine's nginx
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("deploy")]

TOOLS = ("flower-superlink", "flower-supernode", "flwr", "openssl", "ssh-keygen")
missing = [t for t in TOOLS if shutil.which(t) is None]
if missing:
    pytest.skip(f"deployment tests need {missing} on PATH", allow_module_level=True)

from tests.deploy.test_local_cluster import run_cluster  # noqa: E402

NODES, ROUNDS = 2, 2


@pytest.mark.parametrize(
    "method,mode,expected",
    [
        pytest.param(
            "fedavg",
            "central",
            [central_epsilon(1.0, r, 1e-5, NODES, NODES) for r in range(1, ROUNDS + 1)],
            marks=pytest.mark.extended,
        ),
        ("fedc2i", "local", [local_epsilon(1.0, r, 1e-5) for r in range(1, ROUNDS + 1)]),
    ],
)
def test_a_dp_run_on_the_deployment_runtime_reports_epsilon_and_delta(tmp_path, method, mode, expected):
    report = run_cluster(
        tmp_path,
        *("--nodes", str(NODES), "--rounds", str(ROUNDS), "--method", method),
        *("--run-config", f"dp-mode='{mode}' eval-every={ROUNDS}"),
    )
    assert report["rounds"] == ROUNDS and report["clients"] == NODES and report["failures"] == 0
    folder = Path(report["results"])
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["dp-mode"] == mode and summary["delta"] == 1e-5
    assert summary["epsilon"] == pytest.approx(expected[-1])
    assert f"({expected[-1]:.3g}, 1e-05)-DP ({mode})" in report["summary-line"]
    rounds = json.loads((folder / "rounds.json").read_text())
    assert [r["extra"]["dp"]["epsilon"] for r in rounds] == pytest.approx(expected)
    assert all(r["extra"]["dp"]["clients"] == NODES for r in rounds)


@pytest.mark.extended
def test_under_local_dp_every_deployed_client_calibrates_its_noise_to_the_target_epsilon(tmp_path):
    """Each SuperNode's ClientApp computes the noise multiplier from the run config itself (it adds the noise), and
    the server accounts with the same one: epsilon after the planned rounds is the target.  Extended: a third
    deployment (about 95 s on a quiet machine); the default run keeps the local-DP one above and the budget's stop."""
    report = run_cluster(
        tmp_path,
        *("--nodes", str(NODES), "--rounds", str(ROUNDS), "--method", "fedc2i"),
        *("--run-config", f"dp-mode='local' dp-target-epsilon=30.0 eval-every={ROUNDS}"),
    )
    sigma = calibrate_local(30.0, 1e-5, ROUNDS)
    folder = Path(report["results"])
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["dp-noise-multiplier"] == pytest.approx(sigma) and 29.9 <= summary["epsilon"] <= 30.0
    rounds = json.loads((folder / "rounds.json").read_text())
    assert all(r["extra"]["dp"]["noise-std"] == pytest.approx(sigma * 1.0) for r in rounds)


def test_a_maximum_epsilon_stops_a_deployed_run_cleanly_before_the_round_that_would_exceed_it(tmp_path):
    """``--rounds 1``: the round the run completes (the cluster's report checks it); the run config plans three."""
    maximum = (central_epsilon(1.0, 1, 1e-5, NODES, NODES) + central_epsilon(1.0, 2, 1e-5, NODES, NODES)) / 2
    report = run_cluster(
        tmp_path,
        *("--nodes", str(NODES), "--rounds", "1", "--method", "fedavg"),
        *("--run-config", f"dp-mode='central' dp-max-epsilon={maximum!r} num-server-rounds=3"),
    )
    folder = Path(report["results"])
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["rounds"] == 1 and summary["stopped"].startswith("round 2 would take epsilon to")
    assert f"STOPPED: {summary['stopped']}" in report["summary-line"] and summary["epsilon"] <= maximum
    assert load_checkpoint(folder / "checkpoints")[0] == 1

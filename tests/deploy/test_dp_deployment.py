"""Differential privacy on Flower's deployment runtime (deploy/local_cluster.py, the loopback cluster: SuperLink and
SuperNodes as separate processes, TLS, node authentication): a central-DP FedAvg run and a local-DP FedC2I run each
finish with the run's (epsilon, delta) in summary.json, round by round in rounds.json and in the summary line.

One short run per mode (two SuperNodes, two rounds, the run's other settings at their defaults); skips where
tests/deploy/test_local_cluster.py skips.  The default test run deploys local DP, whose accounting is where the
deployment differs from a simulation: each client counts its own releases in its own state folder, from a fresh
ClientApp process per message.  Central DP, accounted by the server as in a simulation (tests/privacy runs it
there), is deployed with ``python -m pytest -m extended``."""

import json
import shutil
from pathlib import Path

import pytest

from task.privacy import central_epsilon, local_epsilon

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

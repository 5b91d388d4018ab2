"""Differential privacy on Flower's deployment runtime (deploy/local_cluster.py, the loopback cluster: SuperLink and
SuperNodes as separate processes, TLS, node authentication): a central-DP FedAvg run and a local-DP FedC2I run each
finish with the run's (epsilon, delta) in summary.json, round by round in rounds.json and in the summary line; a
SuperNode whose own privacy floor (``--node-config``) asks for more noise than the run refuses it.

One short run per mode (two SuperNodes that take part, two rounds, the run's other settings at their defaults);
skips where tests/deploy/test_local_cluster.py skips.  The default test run deploys local DP, whose accounting is
where the deployment differs from a simulation: each client counts its own releases in its own state folder, from
a fresh ClientApp process per message.  The same cluster has a third SuperNode with node config
``dp-min-noise-multiplier=2.0``, above the run's 1.0: a node config only a real SuperNode has (a simulation gives
its nodes a partition id and nothing else), so its refusal is checked here, in the same run to save a cluster's
start-up.  Central DP, accounted by the server as in a simulation (tests/privacy runs it there), is deployed with
``python -m pytest -m extended``."""

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
#: the extra SuperNode of the local-DP run, whose floor is above the run's noise multiplier
REFUSING = NODES
FLOOR = "dp-min-noise-multiplier=2.0"


@pytest.fixture(scope="module")
def local_run(tmp_path_factory) -> dict:
    return run_cluster(
        tmp_path_factory.mktemp("dp-local"),
        *("--nodes", str(NODES + 1), "--rounds", str(ROUNDS), "--method", "fedc2i"),
        *("--run-config", f"dp-mode='local' eval-every={ROUNDS}"),
        *("--node-config", f"{REFUSING}:{FLOOR}", "--refused-by", str(REFUSING)),
    )


def test_a_local_dp_run_on_the_deployment_runtime_reports_epsilon_and_delta(local_run):
    reported_epsilon(local_run, "local", [local_epsilon(1.0, r, 1e-5) for r in range(1, ROUNDS + 1)])
    assert local_run["failures"] == len(local_run["refusals"][f"node{REFUSING}"])  # the refusals, nothing else


def test_a_supernode_whose_floor_is_above_the_run_refuses_every_message_naming_its_key(local_run):
    """local_cluster.py checked that every failure is the refusing node's refusal and that the other nodes replied
    in every round; here: what the refusal says, as failures.json has it."""
    refused = local_run["refusals"][f"node{REFUSING}"]
    assert {r.split(":")[0] for r in refused} >= {f"round {r} train" for r in range(1, ROUNDS + 1)}
    reason = (
        "node config dp-min-noise-multiplier=2 is the least noise this node accepts, and the run asks for "
        "dp-noise-multiplier=1 (dp-mode='local')"
    )
    assert all(r.split(": ", 1)[1] == reason for r in refused)
    failures = json.loads((Path(local_run["results"]) / "failures.json").read_text())
    assert all("this node refuses the run: " + reason in f["reason"] for f in failures)


@pytest.mark.extended
def test_a_central_dp_run_on_the_deployment_runtime_reports_epsilon_and_delta(tmp_path):
    report = run_cluster(
        tmp_path,
        *("--nodes", str(NODES), "--rounds", str(ROUNDS), "--method", "fedavg"),
        *("--run-config", f"dp-mode='central' eval-every={ROUNDS}"),
    )
    assert report["failures"] == 0
    reported_epsilon(report, "central", [central_epsilon(1.0, r, 1e-5, NODES, NODES) for r in range(1, ROUNDS + 1)])


def reported_epsilon(report: dict, mode: str, expected: list[float]) -> None:
    assert report["rounds"] == ROUNDS and report["clients"] == NODES
    folder = Path(report["results"])
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["dp-mode"] == mode and summary["delta"] == 1e-5
    assert summary["epsilon"] == pytest.approx(expected[-1])
    assert f"({expected[-1]:.3g}, 1e-05)-DP ({mode})" in report["summary-line"]
    rounds = json.loads((folder / "rounds.json").read_text())
    assert [r["extra"]["dp"]["epsilon"] for r in rounds] == pytest.approx(expected)
    assert all(r["extra"]["dp"]["clients"] == NODES for r in rounds)

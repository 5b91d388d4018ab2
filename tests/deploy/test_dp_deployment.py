"""Differential privacy on Flower's deployment runtime (deploy/local_cluster.py, the loopback cluster: SuperLink and
SuperNodes as separate processes, TLS, node authentication): a central-DP FedAvg run and a local-DP FedC2I run each
finish with the run's (epsilon, delta) in summary.json, round by round in rounds.json and in the summary line; a
SuperNode whose own privacy floor (``--node-config``) asks for more noise than the run refuses it. A
target epsilon sets every client's noise (local DP), and a maximum stops a run cleanly.

One short run per mode (two SuperNodes that take part, two rounds, the run's other settings at their defaults);
skips where tests/deploy/test_local_cluster.py skips.  The default test run deploys local DP, whose accounting is
where the deployment differs from a simulation: each client counts its own releases in its own state folder, from
a fresh ClientApp process per message.  The same cluster has a third SuperNode with node config
``dp-min-noise-multiplier=2.0``, above the run's 1.0 (the two that take part carry README.md's example floor, which
the run meets): a node config only a real SuperNode has (a simulation gives
its nodes a partition id and nothing else), so its refusal is checked here, in the same run to save a cluster's
start-up.  Central DP, accounted by the server as in a simulation (tests/privacy runs it there), is deployed with
``python -m pytest -m extended``."""

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
#: the extra SuperNode of the local-DP run, whose floor is above the run's noise multiplier
REFUSING = NODES
FLOOR = "dp-min-noise-multiplier=2.0"


def readme_floor() -> str:
    """The floor README.md's example SuperNode sets (its ``dp-`` node config keys): the accepting SuperNodes of the
    local-DP run carry it, so the README's node config is what a real SuperNode gets, and the run (the defaults'
    noise multiplier and clip) satisfies it."""
    from tests.readme import readme_commands

    [line] = [c.text for c in readme_commands() if c.text.startswith("flower-supernode ") and "dp-" in c.text]
    config = line.split("--node-config", 1)[1].strip().strip('"')
    return " ".join(kv for kv in config.split() if kv.startswith("dp-"))


@pytest.fixture(scope="module")
def local_run(tmp_path_factory) -> dict:
    return run_cluster(
        tmp_path_factory.mktemp("dp-local"),
        *("--nodes", str(NODES + 1), "--rounds", str(ROUNDS), "--method", "fedc2i"),
        *("--run-config", f"dp-mode='local' eval-every={ROUNDS}"),
        *[a for i in range(NODES) for a in ("--node-config", f"{i}:{readme_floor()}")],
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
    reported_epsilon(report, "central", [central_epsilon(1.0, r, 1e-5) for r in range(1, ROUNDS + 1)])


def reported_epsilon(report: dict, mode: str, expected: list[float]) -> None:
    assert report["rounds"] == ROUNDS and report["clients"] == NODES
    folder = Path(report["results"])
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["dp-mode"] == mode and summary["delta"] == 1e-5
    assert summary["epsilon"] == pytest.approx(expected[-1])
    assert f"({expected[-1]:.3g}, 1e-05)-DP ({mode})" in report["summary-line"]
    rounds = json.loads((folder / "rounds.json").read_text())
    assert [r["extra"]["dp"]["epsilon"] for r in rounds] == pytest.approx(expected)
    if mode == "central":  # the server's noised average over every node's update
        assert all(r["extra"]["dp"]["cohort"] == NODES for r in rounds)
    else:  # each client noises its one release a round itself: the count the server charges is the rounds so far
        assert [r["extra"]["dp"]["releases"] for r in rounds] == list(range(1, ROUNDS + 1))


@pytest.mark.extended
def test_under_local_dp_every_deployed_client_calibrates_its_noise_to_the_target_epsilon(tmp_path):
    """The server calibrates the noise multiplier and declares it in every round's messages; each SuperNode's
    ClientApp noises with it, and the server accounts with the same one: epsilon after the planned rounds is the
    target.  Extended: a third
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
    maximum = (central_epsilon(1.0, 1, 1e-5) + central_epsilon(1.0, 2, 1e-5)) / 2
    report = run_cluster(
        tmp_path,
        *("--nodes", str(NODES), "--rounds", "1", "--method", "fedavg"),
        *("--run-config", f"dp-mode='central' dp-max-epsilon={maximum!r} num-server-rounds=3"),
        expect=5,  # the budget stopped it: as python -m server_app.job says
    )
    assert report["outcome"] == "privacy budget exhausted"
    folder = Path(report["results"])
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["rounds"] == 1 and summary["stopped"].startswith("round 2 would take epsilon to")
    assert f"STOPPED: {summary['stopped']}" in report["summary-line"] and summary["epsilon"] <= maximum
    assert load_checkpoint(folder / "checkpoints")[0] == 1

"""Deployment runtime end to end: deploy/local_cluster.py (SuperLink + SuperNodes, TLS, node auth).

Each test runs the script as a user would and reads the JSON line it prints last. The default tests share the
README's loopback example (parsed from README.md, so an edit there is what runs here), in a fast form: a run
stopped by ``stop-after`` after round 1 (exit 4), continued in the same work directory (exit 0), and the
``task.predict`` of a holder's model that follows. Where root, `ip netns` and nginx are available (CI runs as root),
both are the default multi-machine topology: every data holder and the operator in a network namespace of their
own, nginx in front of a loopback-only SuperLink, and, in the first, a data holder trying to submit a run and
register a key (`--netns --holder-check`); elsewhere they are the loopback cluster on the SuperLink's one port, and
the tests about the proxy topology skip with the reason.
"""

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from flwr.common.config import parse_config_args

from deploy.pflower_deploy.netns import unavailable_reason
from deploy.pflower_deploy.proxy import nginx_binary
from server_app.job import Exit
from server_app.runner import run_config_arg
from tests.readme import Command, loopback_example

# one xdist worker runs every deployment test in turn: they share network namespace names and the machine's nginx
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("deploy")]

ROOT = Path(__file__).resolve().parents[2]
#: the script, run as the README runs it: a module, from the repository root (every call's cwd)
SCRIPT = ["-m", "deploy.local_cluster"]
TOOLS = ("flower-superlink", "flower-supernode", "flwr", "openssl", "ssh-keygen")
missing = [t for t in TOOLS if shutil.which(t) is None]
if missing:
    pytest.skip(f"deployment tests need {missing} on PATH", allow_module_level=True)


NO_PROXY_TOPOLOGY = unavailable_reason() or (
    None if nginx_binary() else "nginx is missing (Debian: apt-get install nginx-light)"
)
needs_proxy_topology = pytest.mark.skipif(
    NO_PROXY_TOPOLOGY is not None, reason=f"proxy topology with namespaces not available: {NO_PROXY_TOPOLOGY}"
)


def run_cluster(workdir: Path, *args: str, timeout: float = 900, expect: int = 0) -> dict:
    workdir_args = [] if "--workdir" in args else ["--workdir", str(workdir)]
    proc = subprocess.run(
        [sys.executable, *SCRIPT, "--quiet", *workdir_args, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
        check=False,
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"no JSON report (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    report = json.loads(lines[-1])
    assert proc.returncode == expect and report["ok"], (
        f"exit {proc.returncode} (expected {expect}): {report.get('error')}\n"
        f"{proc.stdout[-4000:]}\n{proc.stderr[-2000:]}"
    )
    report["printed"] = proc.stdout + proc.stderr
    return report


def readme_cluster_args(command: Command, workdir: Path, resume_from: str | None = None) -> list[str]:
    """The README's ``local_cluster.py`` command as the suite runs it: its own arguments, with the README's work
    directory (``/tmp/lc``) in ``workdir``, half the rounds and the stop after round 1 (the fast form: one round
    before the stop, one after the resume), the evaluation in the last round only, and the folder the stopped
    run printed for ``<folder it printed>``."""
    text = command.text.replace("/tmp/lc", str(workdir))
    if resume_from is not None:
        assert "<folder it printed>" in text, command
        text = text.replace("<folder it printed>", resume_from)
    tokens = shlex.split(text)
    assert tokens[:3] == ["python", "-m", "deploy.local_cluster"], command
    args = tokens[3:]
    args[args.index("--rounds") + 1] = str(int(args[args.index("--rounds") + 1]) // 2)
    config = parse_config_args([args[args.index("--run-config") + 1]])
    if "stop-after" in config:
        config["stop-after"] = 1
    args[args.index("--run-config") + 1] = run_config_arg({**config, "eval-every": 2})
    return args


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("deploy-cluster")


@pytest.fixture(scope="module")
def node_files(workdir):
    # the README's --data-files folder: node 1 brings its own data file of 150 samples; node 0's is missing, so
    # local_cluster.py exports it (partition 0 of 2 of the run's data, with its held-out arrays)
    import numpy as np

    from task.data import DataSettings, export_client_file

    stop, _, _ = loopback_example()
    tokens = shlex.split(stop.text.replace("/tmp/lc", str(workdir)))
    folder = Path(tokens[tokens.index("--data-files") + 1])
    folder.mkdir(parents=True, exist_ok=True)
    export_client_file(DataSettings(), 1, 2, folder / "node-1.npz")
    with np.load(folder / "node-1.npz") as z:
        small = {k: z[k][:150] for k in ("x", "y")}
    np.savez(folder / "node-1.npz", **small)
    return folder


@pytest.fixture(scope="module")
def stopped(workdir, node_files):
    """The README's first loopback command (a run that stop-after stops), in the fast form, with the checks the
    default topology gets: an unregistered node, and with root, ip netns and nginx, the proxy topology with a data
    holder trying to submit a run and register a key."""
    stop, _, _ = loopback_example()
    args = [*readme_cluster_args(stop, workdir), "--unregistered-check"]
    if NO_PROXY_TOPOLOGY is None:
        args += ["--netns", "--holder-check"]  # the proxy topology is the default with --netns
    return run_cluster(workdir, *args, expect=Exit.STOPPED)


@pytest.fixture(scope="module")
def cluster(stopped, workdir):
    """The README's second loopback command: the stopped run continued in the same work directory."""
    _, resume, _ = loopback_example()
    args = readme_cluster_args(resume, workdir, resume_from=stopped["resume-from"])
    if NO_PROXY_TOPOLOGY is None:
        args += ["--netns"]
    return run_cluster(workdir, *args)


def test_a_run_stopped_as_asked_says_so_and_leaves_its_checkpoint(stopped):
    assert stopped["outcome"] == "stopped as asked" and stopped["stopped-after"] == 1  # and exit 4 (run_cluster)
    assert stopped["checkpoint"] == "round-00001" and Path(stopped["resume-from"]).is_dir()
    said = "stopped after round 1 as asked (stop-after=1); continue it with the same --workdir and --run-config"
    assert said in stopped["printed"] and "FAILED" not in stopped["printed"]


def test_a_refused_run_config_exits_3_before_anything_starts(tmp_path):
    """The run config is checked with the ServerApp's own parser before any SuperLink, key or node exists."""
    refused = ["--method", "fedcac", "--run-config", "tau=1.5"]
    proc = subprocess.run(
        [sys.executable, *SCRIPT, "--quiet", "--workdir", str(tmp_path), *refused],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
        check=False,
    )
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert proc.returncode == 3 and report["outcome"] == "refused", proc.stdout[-3000:]
    assert "run-config key 'tau' must be a number in [0, 1], got 1.5" in report["error"]
    assert report["events"] == [] and not (tmp_path / "certs").exists()  # nothing was made or started


def test_tls_auth_run_completes(cluster, stopped):
    r = cluster
    assert r["outcome"] == "completed" and Path(r["results"]) == Path(stopped["resume-from"])  # continued there
    assert r["rounds"] == 2 and r["clients"] == 2 and r["failures"] == 0
    assert [x["train"] for x in r["replies-per-round"]] == [2, 2]
    assert 0.3 < r["accuracy"] <= 1.0  # far above chance (0.1) on digits
    folder = Path(r["results"])
    assert (folder / "summary.json").exists() and (folder / "rounds.json").exists()
    events = {e["event"]: e for e in r["events"]}
    assert events["superlink up"]["tls"] and events["superlink up"]["supernode_auth"]
    assert len(events["registered"]["node_ids"]) == 2


def test_a_holders_model_scores_its_own_held_out_data_as_the_readme_shows(cluster, workdir):
    """The README's ``task.predict`` after the loopback runs: node 0's saved model on node 0's data file scores its
    held-out arrays, and gets the personalized accuracy the run reported for node 0."""
    import csv

    _, _, predict = loopback_example()
    done = subprocess.run(
        ["bash", "-c", predict.text.replace("/tmp/lc", str(workdir))],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout.strip().splitlines()[-1])
    assert said["arrays"] == "x_test/y_test" and said["held-out"] is True
    with (Path(cluster["results"]) / "clients.csv").open() as fh:
        rows = {int(float(r["partition-id"])): r for r in csv.DictReader(fh)}
    assert said["accuracy"] == pytest.approx(float(rows[0]["personal-acc"]))


def test_supernodes_trained_on_their_own_data_files(cluster, node_files):
    import csv

    from task.data import DataSettings, load_local_file

    with (Path(cluster["results"]) / "clients.csv").open() as fh:
        rows = {int(float(r["partition-id"])): r for r in csv.DictReader(fh)}
    for pid in (0, 1):
        expected = load_local_file(str(node_files / f"node-{pid}.npz"), DataSettings(), pid).num_train
        assert int(float(rows[pid]["num-examples"])) == expected
    assert int(float(rows[1]["num-examples"])) < 150  # the cut-down file, not partition 1 of the embedded data


def test_unregistered_supernode_is_refused(stopped):
    check = stopped["unregistered-check"]
    assert check["refused"]
    assert check["exit-code"] not in (None, 0)  # the SuperNode gave up
    assert "Failed to" in check["supernode-log"]  # e.g. "[code: 2004] Failed to activate SuperNode."
    assert "No SuperNode found with the given public key" in check["superlink-log"]
    assert check["listed-nodes"] == 2 and check["unknown-ids-listed"] == []  # never joined the federation


@needs_proxy_topology
def test_superlink_is_on_loopback_and_nodes_reach_only_the_fleet_listener(stopped):
    events = {e["event"]: e for e in stopped["events"]}
    addresses = stopped["addresses"]
    assert stopped["topology"] == "proxy" and stopped["netns"]
    assert events["superlink up"]["address"].startswith("127.0.0.1:")  # nothing else can connect to it
    started = [e for e in stopped["events"] if e["event"] == "supernode started"]
    assert started and all(e["netns"] and e["superlink"] in addresses["fleet"] for e in started)
    probes = stopped["holder-check"]["probes"]
    assert [p for spec, p in probes.items() if spec.startswith("tcp:")] == [{"error": "refused"}]


@needs_proxy_topology
def test_data_holder_cannot_submit_runs_or_register_keys(stopped):
    check = stopped["holder-check"]
    assert check["refused"] and check["from"] == "pfl-node0"
    attempts = check["attempts"]
    assert set(attempts) == {"fleet-listener", "control-listener", "superlink-port"}
    for target, expected in (
        ("fleet-listener", "404 Not Found"),
        ("control-listener", "403 Forbidden"),
        ("superlink-port", "unavailable"),
    ):
        for command in ("run", "register"):  # flwr run / flwr supernode register
            assert attempts[target][command]["exit"] != 0
            assert expected in attempts[target][command]["error"], (target, command, attempts[target][command])
    # the proxy answered them itself; the SuperLink never saw a Control call from the data holder
    assert "/v1/control/start-run 404" in check["proxy-statuses-for-holder"]
    assert "/v1/control/register-node 403" in check["proxy-statuses-for-holder"]
    assert check["superlink-control-calls-from-holder"] == []
    # nothing registered or started: the operator sees its 2 nodes and no run before its own
    assert check["registered-nodes"] == 2 and check["unknown-ids-listed"] == []
    assert check["runs-before-operator-run"] == 0
    # the same with raw requests: the fleet listener has no Control or Runtime route, the control listener
    # refuses the data holder's address
    fleet, control = check["targets"]["fleet-listener"], check["targets"]["control-listener"]
    probes = check["probes"]
    for route in ("control/start-run", "control/register-node", "runtime/acquire-task"):
        assert probes[f"https:POST:https://{fleet}/v1/{route}"]["status"] == 404
    assert probes[f"https:POST:https://{control}/v1/control/start-run"]["status"] == 403


@needs_proxy_topology
def test_operator_submits_from_its_namespace_and_the_run_completes(cluster):
    events = {e["event"]: e for e in cluster["events"]}
    control = cluster["addresses"]["control"]
    assert events["registered"]["operator_netns"] == "pfl-op" and events["registered"]["via"] in control
    assert events["flwr run"]["operator_netns"] == "pfl-op" and events["flwr run"]["via"] in control
    assert cluster["flwr-run-exit"] == 0
    assert [x["train"] for x in cluster["replies-per-round"]] == [2, 2]  # every node, every round


@needs_proxy_topology
def test_tls_is_required_on_every_hop_between_namespaces(stopped):
    tls = stopped["holder-check"]["tls"]
    assert tls["holder-plain-http"]["status"] == 400  # "The plain HTTP request was sent to HTTPS port"
    assert tls["operator-plain-http"]["status"] == 400
    assert "status" not in tls["superlink-plain-http"]  # the SuperLink itself speaks TLS only (loopback hop)


@pytest.mark.extended  # ~4 minutes: waits for the SuperLink to declare the node gone (python -m pytest -m extended)
def test_killed_supernode_run_finishes_with_failures_recorded(tmp_path):
    # SIGKILL SuperNode 1 when round 2 starts; the SuperLink turns its missing reply into an error reply once the
    # node misses its heartbeats (<= 60 s), the strategy records it and finishes the round with the other node
    r = run_cluster(
        tmp_path,
        "--nodes",
        "2",
        "--rounds",
        "2",
        "--kill-node",
        "1@2",
        "--round-timeout",
        "120",
        "--run-config",
        "eval-every=2",
    )
    assert r["killed"]["done"] and r["killed"]["round"] == 2
    assert r["rounds"] == 2  # the run went on to the end
    assert r["replies-per-round"][0]["train"] == 2
    observed = r["kill-observed"]
    assert observed["failure-recorded"] or observed["fewer-replies"]
    assert r["replies-per-round"][1]["train"] == 1
    failures = json.loads((Path(r["results"]) / "failures.json").read_text())
    # the error reply is made by the SuperLink (source node id 1); the strategy names the node it was sent to
    assert failures and all(f["round"] == 2 and "Node Unavailable" in f["reason"] for f in failures)
    assert all(f["node-id"] != 1 for f in failures)

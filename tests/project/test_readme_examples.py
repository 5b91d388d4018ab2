"""Every command the README shows runs, as written, in a test: an example that stops working fails the suite.

The commands are read from README.md (and deploy/README.md's one-machine section) by tests/readme.py, so an edit
to an example is what runs.  Runs go through Flower on a SuperLink of the test's own, started by the README's
own recipe for one (its block in the notes on command 1, with ``FLWR_HOME`` in a temporary folder) and stopped by
that recipe's ``kill`` of its pid; every ``flwr run .`` and ``python -m server_app.job .`` therefore runs as
written, from the repository root, in the fast form of tests/readme.py (one round, two where a run stops and
resumes; nothing else changed).  ``/tmp/...`` paths go to a temporary folder and ``<that folder>`` is the results
folder the command before printed.

A command that is already run elsewhere is not run twice here: ``ACCOUNTED`` names where (set-up command 1, the
default job, runs in .ci/run at full size before the tests; the test command is the suite itself; the loopback
deployment runs in tests/deploy/test_local_cluster.py; record-messages in tests/privacy/test_recorder.py), and
``test_every_command_is_run_by_a_test`` fails for a command that nothing runs.
"""

from __future__ import annotations

import csv
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.common.config import parse_config_args

from server_app.disclosure import declarations
from server_app.job import Exit, outcome
from server_app.runner import results_folder_from_output, stopped_after, summary_line
from strategies.disclosure_check import disagreements, mismatches
from task.recording import read_run
from tests.project.test_ci_command import readme_commands as setup_commands
from tests.readme import ROOT, Command, fast, local_deployment_commands, loopback_example, readme_commands

README = readme_commands()
SLOW = [pytest.mark.slow, pytest.mark.xdist_group("readme")]  # one worker: they share the SuperLink


def runs_flower(test):
    for mark in SLOW:
        test = mark(test)
    return test


def find(pattern: str) -> list[Command]:
    found = [c for c in README if re.search(pattern, c.text)]
    assert found, f"no README command matches {pattern!r}"
    return found


def block_of(pattern: str) -> list[Command]:
    first = find(pattern)[0]
    return [c for c in README if c.block == first.block]


@dataclass
class Ran:
    code: int
    out: str
    seconds: float


def sh(command: str, env: dict[str, str], cwd: Path = ROOT, timeout: float = 900) -> Ran:
    t0 = time.monotonic()
    done = subprocess.run(
        ["bash", "-c", command],
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=timeout,
        check=False,
    )
    return Ran(done.returncode, done.stdout, time.monotonic() - t0)


def gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return True
    return state in ("Z", "X")  # a zombie has stopped; its parent (init here) reaps it


@pytest.fixture(scope="module")
def own_superlink(tmp_path_factory):
    """The README's recipe for a SuperLink of one's own, its lines before its ``flwr run``, with ``FLWR_HOME`` in
    a temporary folder; at the end the recipe's last line, which stops it by its pid."""
    recipe = block_of(r"^export FLWR_HOME=")
    run_at = next(i for i, c in enumerate(recipe) if c.text.startswith("flwr run "))
    setup, stop = recipe[:run_at], recipe[run_at + 1 :]
    assert stop and stop[-1].text.startswith("kill "), recipe
    home, started_in = tmp_path_factory.mktemp("flwr-home"), tmp_path_factory.mktemp("superlink-cwd")
    lines = [re.sub(r"^export FLWR_HOME=\S+", f"export FLWR_HOME={home}", c.text) for c in setup]
    env = dict(os.environ)
    started = sh("set -e\n" + "\n".join(lines), env, cwd=started_in, timeout=180)
    pid = int((home / "superlink.pid").read_text())
    try:
        assert started.code == 0, started.out
        yield SimpleNamespace(home=home, started_in=started_in, pid=pid, env={**env, "FLWR_HOME": str(home)})
    finally:
        stopped = sh("\n".join(c.text for c in stop), {**env, "FLWR_HOME": str(home)}, timeout=60)
        deadline = time.monotonic() + 30
        while not gone(pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        if not gone(pid):  # the recipe failed to stop it: do it here, and fail
            os.kill(pid, signal.SIGKILL)
        assert stopped.code == 0 and gone(pid), f"the README's kill left SuperLink {pid} running: {stopped.out}"


_runs: dict[str, Ran] = {}


def listening_pids(port: str) -> list[str] | None:
    """The pids listening on ``port``, as the README finds Flower's local SuperLink (``lsof``; else ``ss``)."""
    if shutil.which("lsof"):
        done = subprocess.run(
            ["lsof", "-t", f"-iTCP:{port}", "-sTCP:LISTEN"], capture_output=True, text=True, check=False
        )
        return done.stdout.split()
    if shutil.which("ss"):
        done = subprocess.run(["ss", "-Hltnp", f"sport = :{port}"], capture_output=True, text=True, check=False)
        return re.findall(r"pid=(\d+)", done.stdout)
    return None


def summary_of(out: str) -> str:
    line = summary_line(out)
    assert line is not None, out[-3000:]
    return line


def folder_of(out: str) -> Path:
    folder = results_folder_from_output(out)
    assert folder is not None, out[-3000:]
    return folder


def run_id_of(out: str) -> str:
    started = re.search(r"Successfully started run (\d+)", out)
    assert started is not None, out[-3000:]
    return started.group(1)


def run_flwr(
    command: Command, superlink, expected: Exit = Exit.COMPLETED, replace: dict[str, str] | None = None
) -> Ran:
    """A ``flwr run .`` / ``python -m server_app.job .`` command in the fast form, on the test's SuperLink, from the
    repository root; one that lacks ``--stream`` is followed with ``flwr log <run id> --stream`` (as a user would).
    The same command (environment assignments aside) runs once per session."""
    text = command.text
    for old, new in (replace or {}).items():
        text = text.replace(old, new)
    text = fast(text.split(" && ", 1)[1] if text.startswith("pip install") else text)
    key = " ".join(t for t in shlex.split(text) if not re.match(r"^[A-Z_]+=", t))
    if key not in _runs:
        ran = sh(text, superlink.env)
        if "--stream" not in shlex.split(text) and "server_app.job" not in text:
            follow = sh(f"flwr log {run_id_of(ran.out)} --stream", superlink.env)
            ran = Ran(ran.code, ran.out + follow.out, ran.seconds + follow.seconds)
        _runs[key] = ran
    ran = _runs[key]
    code, said = outcome(0, ran.out)
    assert code == expected, f"{command}: {said}\n{ran.out[-4000:]}"
    if "server_app.job" in text:  # the command's own exit status says the same
        assert ran.code == expected, f"{command}: exit {ran.code}\n{ran.out[-3000:]}"
    return ran


@runs_flower
def test_a_method_example_runs_on_a_superlink_of_ones_own(own_superlink):
    """The README's method example, on the SuperLink of the README's recipe: the run is in that SuperLink's log,
    its results in ``results/`` of the folder the SuperLink was started from, and the SuperLink's pid is the one
    listening on its port (what the README's ``lsof`` finds for Flower's local SuperLink)."""
    [command] = block_of(r"method='fedrep'")
    ran = run_flwr(command, own_superlink)
    assert summary_of(ran.out).startswith("pflower fedrep on digits/pathological: 1 rounds, 10 clients, ")
    # printed once, not a second time as a log line
    assert sum(summary_of(ran.out) in line for line in ran.out.splitlines()) == 1, ran.out[-3000:]
    assert f"Created run {run_id_of(ran.out)}" in (own_superlink.home / "superlink.log").read_text()
    assert folder_of(ran.out).parent.resolve() == (own_superlink.started_in / "results").resolve()
    address = re.search(r'address = "127\.0\.0\.1:(\d+)"', (own_superlink.home / "config.toml").read_text())
    assert address is not None
    assert listening_pids(address.group(1)) in ([str(own_superlink.pid)], None)  # None: neither lsof nor ss here


def stopped_line(out: str) -> str:
    return next(line.strip() for line in out.splitlines() if line.startswith("pflower stopped after round"))


def said_as_shown(shown: str, printed: str) -> bool:
    """The README's ``#   ...`` line against the line printed, ``(...)`` standing for what it leaves out."""
    parts = [re.escape(p) for p in shown.split("(...)")]
    return re.fullmatch(".*".join(parts), printed) is not None


@runs_flower
def test_the_job_refuses_a_bad_run_config_at_once_as_shown(own_superlink):
    [command] = block_of(r"^python -m server_app\.job .*tau=1\.5")
    ran = sh(command.text, own_superlink.env)
    assert ran.code == Exit.REFUSED, ran.out
    [shown] = command.comments
    assert said_as_shown(shown, ran.out.strip().splitlines()[-1]), (shown, ran.out)
    assert "Successfully started run" not in ran.out  # nothing was submitted


@runs_flower
def test_a_stopped_run_resumes_and_a_clients_model_scores_its_own_held_out_data(own_superlink, tmp_path):
    stop, resume, export, predict = [c for c in block_of(r"stop-after=4") if "local_cluster" not in c.text][:4]
    stopped = run_flwr(stop, own_superlink, expected=Exit.STOPPED)
    stop_seen = stopped_after(stopped.out)
    assert stop_seen is not None, stopped.out[-3000:]
    after, folder = stop_seen
    assert after == 1 and (folder / "checkpoints" / "LATEST").read_text() == "round-00001"
    assert stopped.out.strip().splitlines()[-1].endswith("(exit 4)")
    shown = stop.comments[0].replace("round 4", "round 1").replace("stop-after=4", "stop-after=1")
    assert said_as_shown(shown.replace("/.../results/<that folder>", "(...)"), stopped_line(stopped.out)), shown
    resumed = run_flwr(resume, own_superlink, replace={"results/<that folder>": str(folder)})
    assert folder_of(resumed.out) == folder and "resuming" in resumed.out
    assert summary_of(resumed.out).startswith("pflower fedcac on digits/dirichlet: 2 rounds, 10 clients, ")
    # the model of client 3 on partition 3's held-out arrays: client 3's accuracy in the run
    exported = sh(export.text.replace("/tmp/", f"{tmp_path}/"), own_superlink.env)
    assert exported.code == 0, exported.out
    predicted = sh(
        predict.text.replace("/tmp/", f"{tmp_path}/").replace("results/<that folder>", str(folder)), own_superlink.env
    )
    assert predicted.code == 0, predicted.out
    said = json.loads(predicted.out.strip().splitlines()[-1])
    assert said["arrays"] == "x_test/y_test" and said["held-out"] is True
    with (folder / "clients.csv").open() as fh:
        rows = {int(float(r["partition-id"])): r for r in csv.DictReader(fh)}
    assert said["accuracy"] == pytest.approx(float(rows[3]["personal-acc"]))
    assert said["samples"] == len(np.load(tmp_path / "pred.npy"))


def dp_params():
    out = []
    for c in find(r"dp-mode="):
        tokens = shlex.split(c.text)
        method = parse_config_args([tokens[tokens.index("--run-config") + 1]])["method"]
        out.append(pytest.param(c, marks=SLOW, id=method))
    return out


@pytest.mark.parametrize("command", dp_params())
def test_the_differential_privacy_examples_run(own_superlink, command):
    ran = run_flwr(command, own_superlink)
    summary = json.loads((folder_of(ran.out) / "summary.json").read_text())
    assert summary["dp-mode"] in ("central", "local") and summary["epsilon"] > 0  # the privacy it cost


@runs_flower
def test_the_recording_example_writes_what_each_side_sent_as_the_method_declares(own_superlink):
    """The README's audit example: the server's recording in the results folder, each client's in its state folder,
    the two agree, and both match the method's declaration (tests/privacy/test_recorder.py runs the variants)."""
    [command] = find(r"record-messages=true")
    tokens = shlex.split(command.text)
    config = parse_config_args([tokens[tokens.index("--run-config") + 1]])
    ran = run_flwr(command, own_superlink)
    server, clients = read_run(folder_of(ran.out))
    assert server and clients  # both sides recorded
    assert disagreements(server, [line for lines in clients.values() for line in lines]) == []
    declared, _ = declarations(config["method"])
    assert mismatches(declared, server, clients=len(clients)) == []


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_tensorboard_example_serves_each_runs_curves(tmp_path):
    """The README's ``tensorboard --logdir results``, as written (plus a loopback address and a free port), on a
    results folder holding two runs' event files as pflower writes them: TensorBoard lists both runs and serves
    ``eval/personal-acc`` for each."""
    import urllib.request

    from server_app.app import build_strategy
    from server_app.tracking import open_watchers
    from task.config import parse_settings
    from tests.strategy_harness import drive

    [command] = find(r"^tensorboard ")
    for name in ("run-a", "run-b"):
        s = parse_settings({"model": "mlp", "min-nodes": 3, "method": "fedavg", "num-server-rounds": 2})
        strategy = build_strategy(s)
        watchers = open_watchers(s, tmp_path / "results" / name, resumed=False)
        strategy.round_watchers.append(watchers.update)
        drive(strategy, {11: 0, 12: 1, 13: 2}, 2)
        watchers.finish(strategy.history, failed=False)
    port = free_port()
    tokens = [*shlex.split(command.text.split("#")[0]), "--host", "127.0.0.1", "--port", str(port)]
    server = subprocess.Popen(tokens, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        tags: dict = {}
        deadline = time.monotonic() + 60
        runs = ("run-a", "run-b")
        while time.monotonic() < deadline and not all("eval/personal-acc" in tags.get(r, {}) for r in runs):
            assert server.poll() is None, server.stderr.read().decode() if server.stderr else "tensorboard exited"
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/data/plugin/scalars/tags", timeout=5) as r:
                    tags = json.loads(r.read())
            except OSError:
                pass
            time.sleep(0.5)
        assert {"run-a", "run-b"} <= set(tags), f"tensorboard lists {sorted(tags)}"
        assert all("eval/personal-acc" in tags[r] for r in ("run-a", "run-b")), tags
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)


# --------------------------------------------------------------------------- every command is run by a test
def default_job_runs_in_ci(command: Command) -> bool:
    """Set-up command 1 (the default job, about a minute at full size) runs in .ci/run as written, which then checks
    its summary line (tests/project/test_ci_command.py checks .ci/run runs it verbatim); the recipe's ``flwr run``
    is the same command."""
    [default_job] = [c for c in setup_commands() if c.startswith("pip install -e . && ")]
    ci = (ROOT / ".ci" / "run").read_text()
    checked = "grep -q '^pflower fedavg on digits/dirichlet: 10 rounds, 10 clients'" in ci
    flwr_part = default_job.split(" && ", 1)[1].split(" ", 1)[1]  # without the environment assignment
    return checked and (command.text == default_job or command.text.split("#")[0].strip() == flwr_part)


#: commands an end-to-end test elsewhere already runs: (pattern, the test, what shows that test runs this command)
ACCOUNTED = [
    (
        r"^pip install -e \. && |^flwr run \. --stream --federation-config \"num-supernodes=10 [^\"]*\"\s*(#.*)?$",
        (
            ".ci/run (runs set-up command 1 verbatim before the tests, at full size, and fails unless its summary "
            "line says 10 rounds and 10 clients); the same flwr run in the recipe for one's own SuperLink"
        ),
        default_job_runs_in_ci,
    ),
    (
        r"^pip install -e \"\.\[test\]\" && ",
        "tests/project/test_ci_command.py (.ci/run runs it verbatim; its checks run before pytest)",
        lambda c: c.text == setup_commands()[1],
    ),
    (
        r"^python -m deploy\.local_cluster |^python -m task\.predict /tmp/lc/",
        "tests/deploy/test_local_cluster.py (its shared cluster runs the README's loopback example)",
        lambda c: (
            c in loopback_example()
            and "loopback_example()" in (ROOT / "tests/deploy/test_local_cluster.py").read_text()
        ),
    ),
]
ACCOUNTED.append(
    (
        r"^python -m benchmarks\.own_data ",
        "tests/benchmarks/test_own_data.py (the README's commands, shrunk, on a local copy made from the digits)",
        lambda c: "readme_commands()" in (ROOT / "tests/benchmarks/test_own_data.py").read_text(),
    )
)
ACCOUNTED.append(
    (
        r"^flower-supernode \.\.\. --node-config ",
        "tests/deploy/test_dp_deployment.py (the local-DP run's accepting SuperNodes carry this floor)",
        lambda c: "readme_floor()" in (ROOT / "tests/deploy/test_dp_deployment.py").read_text(),
    )
)
ACCOUNTED.append(
    (
        r"^python -m server_app\.job \. --federation-config \"num-supernodes=800\"",
        "tests/runtime/test_job.py (the refusal of too many clients, word for word)",
        lambda c: (
            "test_the_readmes_800_iid_clients_are_refused_word_for_word"
            in (ROOT / "tests/runtime/test_job.py").read_text()
        ),
    )
)
#: the commands run here: the recipe for one's own SuperLink (its set-up and kill in ``own_superlink``), and the
#: examples of the tests above
RUN_HERE = [
    r"^export FLWR_HOME=|^PORT=|^mkdir -p \$FLWR_HOME|flower-superlink |^echo \$! |^until flwr ls|^kill \$\(cat",
    r"method='fedrep'",
    r"^python -m server_app\.job .*tau=1\.5",
    r"stop-after=4|resume-from='results/<that folder>'",
    r"^python -m deploy\.export_partitions --out /tmp/nodes|^python -m task\.predict results/<that folder>",
    r"dp-mode=",
    r"record-messages=true",
    r"^tensorboard --logdir results",
    r"^python -m server_app\.sweep ",
]


def fast_sweep(command: Command) -> str:
    """A ``python -m server_app.sweep .`` command in the suite's form: one round in every run (its axes kept), the
    app and a grid file named by their absolute paths (the test runs it in a folder of its own)."""
    from server_app.engine import _config_values
    from server_app.sweep import config_text

    tokens = shlex.split(command.text)
    tokens[tokens.index(".")] = str(ROOT)
    for i, token in enumerate(tokens[:-1]):
        if token == "--run-config":
            cfg = _config_values(tokens[i + 1], "--run-config", axes=True)
            tokens[i + 1] = config_text({**cfg, "num-server-rounds": 1})
        elif token == "--grid":
            tokens[i + 1] = str(ROOT / tokens[i + 1])
            tokens += ["--run-config", "num-server-rounds=1"]  # over every run of the grid
    return shlex.join(tokens)


@pytest.mark.slow
@pytest.mark.parametrize("command", find(r"^python -m server_app\.sweep "), ids=lambda c: f"line{c.line}")
def test_the_sweep_examples_run(command, tmp_path):
    """Each sweep example of the README runs (one round per run) and ends as its comments say: one run with its
    summary line, a grid with its table of every run."""
    from server_app.sweep import plan

    ran = sh(fast_sweep(command), dict(os.environ), cwd=tmp_path)
    assert ran.code == Exit.COMPLETED, ran.out[-4000:]
    tokens = shlex.split(fast_sweep(command))
    if "--grid" in tokens:
        import tomllib

        grid = tomllib.loads(Path(tokens[tokens.index("--grid") + 1]).read_text())
        runs = plan(["num-server-rounds=1"], [], grid)
    else:
        runs = plan([t for i, t in enumerate(tokens[1:], 1) if tokens[i - 1] == "--run-config"])
    if len(runs) == 1:
        assert summary_of(ran.out).startswith("pflower ")
    else:
        with (tmp_path / "results" / "sweep" / "table.csv").open() as fh:
            table = list(csv.DictReader(fh))
        assert len(table) == len(runs) and all(row["outcome"] == "completed" for row in table)
        assert f"{len(runs)} of {len(runs)} runs completed" in ran.out


def test_every_command_is_run_by_a_test():
    """A README command that no test runs (a new example, or one whose test no longer matches) fails here."""
    unaccounted = []
    for command in README:
        covered = [how for pattern, how, runs in ACCOUNTED if re.search(pattern, command.text) and runs(command)]
        here = [p for p in RUN_HERE if re.search(p, command.text)]
        if not covered and not here:
            unaccounted.append(str(command))
    assert unaccounted == [], "README commands no test runs:\n" + "\n".join(unaccounted)


def test_the_loopback_transcripts_are_the_deployment_tests_cluster():
    """deploy/README.md's one-machine section shows runs of ``python -m deploy.local_cluster``; the deployment tests'
    shared cluster runs the same options (with the README's loopback example's stop and resume, and fewer rounds)."""
    shown = local_deployment_commands()
    assert shown, "deploy/README.md's one-machine section shows no python -m deploy.local_cluster command"
    source = (ROOT / "tests/deploy/test_local_cluster.py").read_text()
    runs = {"--nodes", "--rounds", "--unregistered-check", "--netns", "--holder-check", "--workdir", "--quiet"}
    for command in shown:
        tokens = shlex.split(command.text)
        assert tokens[:3] == ["python", "-m", "deploy.local_cluster"], command
        flags = {t for t in tokens if t.startswith("--")}
        assert flags <= runs, f"{command}: {sorted(flags - runs)} not run by tests/deploy/test_local_cluster.py"
        for flag in flags - {"--nodes", "--rounds", "--workdir", "--quiet"}:
            assert f'"{flag}"' in source, f"{command}: tests/deploy/test_local_cluster.py does not pass {flag}"
        assert tokens[tokens.index("--nodes") + 1] == "2"  # as the shared cluster

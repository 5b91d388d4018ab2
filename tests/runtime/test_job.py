"""``python -m server_app.job``: a run config is checked before anything starts, and the exit status says how the
run ended (``flwr run --stream`` exits 0 when a run was refused, stopped or aborted).  The real runs behind each
outcome are in the end-to-end tests: the README's stop-after and resume examples run through this command
(tests/project/test_readme_examples.py), and the refused, aborted and stopped runs of tests/pfedlia/test_e2e.py,
tests/baselines/test_e2e.py and tests/resume/test_e2e.py check that their output reads as refused, aborted and
stopped."""

import json
import os
import re
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from server_app import job
from server_app.job import Exit, outcome
from server_app.runner import REFUSED_AT_START_UP, free_port, stop_line

ROOT = Path(__file__).resolve().parents[2]
SUMMARY = (
    "pflower fedavg on digits/dirichlet: 2 rounds, 2 clients, personalized acc 0.9100, global acc 0.9100, "
    "0 rejected replies, 30.1 s{aborted} -> {folder}"
)
FLOWER_FAILED = (
    "\x1b[91mERROR \x1b[0m:     Exit Code: 700\nAn unhandled exception occurred when running the simulation.\n"
)


def run_job(capsys, *argv: str) -> tuple[int, str]:
    code = job.main(list(argv))
    return code, capsys.readouterr().out


@pytest.fixture
def no_flower(monkeypatch):
    """Fails the test if the command starts any process (flwr run, a SuperLink, Ray)."""

    def started(*args, **kwargs):
        raise AssertionError(f"a process was started: {args[0] if args else kwargs}")

    monkeypatch.setattr(subprocess, "Popen", started)


@pytest.mark.parametrize(
    "run_config, said",
    [
        ("method='fedcac' tau=1.5", "run-config key 'tau' must be a number in [0, 1], got 1.5"),
        ("method='pfedlia' warmup-rounds=20", "warmup-rounds=20 is not shorter than num-server-rounds=10"),
        ("method='oracle'", "only partition 'planted-clusters' or 'planted-clusters-noisy' has"),
        ("num-rounds=3", "run-config key 'num-rounds' (did you mean 'num-server-rounds'"),
        ("method='fedavgg'", "run-config key 'method' must be one of ['local', 'fedavg'"),
    ],
)
def test_a_refused_run_config_exits_3_before_anything_starts(capsys, no_flower, run_config, said):
    code, out = run_job(capsys, ".", "--federation-config", "num-supernodes=10", "--run-config", run_config)
    assert code == 3  # Exit.REFUSED
    last = out.strip().splitlines()[-1]
    assert last.startswith("pflower job: refused before the run started: ") and last.endswith("(exit 3)")
    assert said in last


def test_800_dirichlet_clients_on_digits_are_refused_before_anything_starts_saying_how_many_can_be_served(
    capsys, no_flower
):
    """A new user scaling the default job up (the 800 clients of the issue): refused before flwr run starts."""
    code, out = run_job(capsys, ".", "--federation-config", "num-supernodes=800")
    last = out.strip().splitlines()[-1]
    assert code == 3 and last.startswith(
        "pflower job: refused before the run started: 800 clients are too many for dataset 'digits' (1,797 samples) "
        "with partition 'dirichlet' (alpha=0.5): every draw of flwr-datasets' Dirichlet partitioner left some client "
        "without a sample. "
    )
    assert re.search(r"It can serve at most (\d+) clients: use at most \1 clients", last)


def test_the_readmes_800_iid_clients_are_refused_word_for_word(capsys, no_flower):
    """The README's example of too many clients ("Too many clients for the data"): its command, refused before
    anything starts, with the line it shows (tests/data/test_capacity.py checks its counts against the clients)."""
    import shlex

    readme = (ROOT / "README.md").read_text()
    block = readme[readme.index("**Too many clients for the data.**") :].split("```bash\n", 1)[1].split("```", 1)[0]
    command, *shown = block.strip().splitlines()
    argv = shlex.split(command)
    assert argv[:3] == ["python", "-m", "server_app.job"]
    code, out = run_job(capsys, *argv[3:])
    assert code == 3
    assert out.strip().splitlines()[-1] == " ".join(line.removeprefix("#").strip() for line in shown)


def test_more_min_nodes_than_simulated_supernodes_is_refused_instead_of_waiting_for_them(capsys, no_flower):
    code, out = run_job(capsys, ".", "--check", "--federation-config", "num-supernodes=3", "-c", "min-nodes=4")
    assert code == 3 and "min-nodes=4 waits for more nodes than num-supernodes=3 starts" in out


def test_an_unknown_key_is_named_with_what_flower_would_say(capsys, no_flower):
    code, out = run_job(capsys, ".", "--check", "-c", "methd='fedavg'", "-c", "num-server-rounds=2")
    assert code == 3
    assert "'methd' (did you mean 'method'?)" in out and "bare 'Invalid run configuration'" in out
    assert "python -m task.config" in out


def test_check_accepts_a_valid_run_config_and_starts_nothing(capsys, no_flower):
    code, out = run_job(capsys, ".", "--check", "--run-config", "method='fedrep' partition='pathological'")
    assert code == 0  # Exit.COMPLETED
    assert "the run config is valid (method 'fedrep')" in out


def test_the_check_uses_the_apps_own_defaults(capsys, no_flower, tmp_path):
    """The defaults come from the app's pyproject.toml as Flower fuses them: an app whose default round count is
    shorter than pFedLIA's warm-up is refused without any key given."""
    app = tmp_path / "app"
    app.mkdir()
    text = (ROOT / "pyproject.toml").read_text().replace("num-server-rounds = 10", "num-server-rounds = 3")
    (app / "pyproject.toml").write_text(text)
    code, out = run_job(capsys, str(app), "--check", "--run-config", "method='pfedlia'")
    assert code == 3 and "warmup-rounds=5 is not shorter than num-server-rounds=3" in out


@pytest.mark.parametrize(
    "returncode, output, summary, expected, said",
    [
        (0, SUMMARY, None, Exit.COMPLETED, "completed: pflower fedavg on digits/dirichlet: 2 rounds"),
        (0, SUMMARY, None, Exit.ABORTED, "aborted: every reply failed: no data"),
        (0, SUMMARY, {"aborted": "too few nodes"}, Exit.ABORTED, "aborted: too few nodes"),
        (1, SUMMARY, None, Exit.FLOWER_ERROR, "exited with 1 after the run's summary line"),
        (0, f"INFO: [ROUND 3/10]\n{stop_line(3, '/r/x')}\n{FLOWER_FAILED}", None, Exit.STOPPED, "round 3 as asked"),
        (0, f"\x1b[91mERROR \x1b[0m:     {REFUSED_AT_START_UP}bad tau\n{FLOWER_FAILED}", None, Exit.REFUSED, "bad tau"),
        (1, "Error Invalid run configuration.", None, Exit.REFUSED, "refused by Flower"),
        (0, f"INFO: [ROUND 1/10]\n{FLOWER_FAILED}", None, Exit.FLOWER_ERROR, "last error: \x1b[91mERROR"),
        (1, "Error Connection to the SuperLink is unavailable.", None, Exit.FLOWER_ERROR, "exited with 1"),
    ],
    ids=[
        "completed",
        "aborted",
        "aborted-json",
        "flwr-failed",
        "stopped",
        "refused",
        "flower-refused",
        "crash",
        "down",
    ],
)
def test_the_outcome_is_read_from_the_servers_lines(returncode, output, summary, expected, said):
    aborted = ", ABORTED: every reply failed: no data" if said.startswith("aborted: every reply") else ""
    code, message = outcome(returncode, output.format(folder="/r/x", aborted=aborted), summary)
    assert code == expected and said in message
    if code == Exit.ABORTED:
        assert message.endswith(("no data", "too few nodes"))  # the reason, not the folder
    if code == Exit.STOPPED:
        assert "continue with --run-config \"resume-from='/r/x'\"" in message


STOP = "round 3 would take epsilon to 8.385 (delta 1e-05), above dp-max-epsilon=6.57: the run stops after round 2"


@pytest.mark.parametrize("summary", [None, {"stopped": STOP, "outcome": "budget-exhausted"}], ids=["line", "json"])
def test_a_run_its_privacy_budget_stopped_exits_5_not_completed(summary):
    """dp-max-epsilon stops the run before its last round: the summary line ends with ``STOPPED: ...`` and
    summary.json has ``stopped`` (and ``outcome``); that is not "completed every round"."""
    line = SUMMARY.format(folder="/r/x", aborted="" if summary else f", STOPPED: {STOP}")
    code, message = outcome(0, line, summary)
    assert code == Exit.BUDGET_EXHAUSTED and int(code) == 5 and message == f"privacy budget exhausted: {STOP}"


def fake_flwr(folder: Path, lines: list[str], status: int) -> Path:
    """An executable named ``flwr`` that records its arguments and environment, prints ``lines`` and exits."""
    record = folder / "flwr-call.json"
    script = folder / "flwr"
    script.write_text(
        f"#!{sys.executable}\nimport json, os, sys\n"
        f"json.dump({{'argv': sys.argv[1:], 'env': dict(os.environ)}}, open({str(record)!r}, 'w'))\n"
        f"print({chr(10).join(lines)!r})\nsys.exit({status})\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return record


@pytest.mark.parametrize("sized", [True, False])
def test_the_stream_passes_through_and_the_exit_status_is_the_outcome(capsys, monkeypatch, tmp_path, sized):
    folder = tmp_path / "results" / "run"
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"aborted": "every node failed in round 2"}))
    warning = "WARNING :   Since flwr 1.32, default simulated SuperNodes changed from 10 to 2."
    record = fake_flwr(tmp_path, ["Successfully started run 7", warning, SUMMARY.format(folder=folder, aborted="")], 0)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION", raising=False)
    monkeypatch.setenv("PYTHONWARNINGS", "default::DeprecationWarning")
    fed = ["--federation-config", "num-supernodes=10 client-resources-num-cpus=1"] if sized else []
    code, out = run_job(capsys, ".", "my-link", *fed, "--run-config", "num-server-rounds=2")
    # summary.json, read from the folder the summary line names, says the run aborted: exit 5
    assert code == 5 and out.strip().endswith(  # Exit.ABORTED
        "pflower job: aborted: every node failed in round 2 (exit 5)"
    )
    assert "Successfully started run 7" in out and SUMMARY.format(folder=folder, aborted="") in out
    assert (warning in out) is not sized  # Flower's size warning is left out only where the size was given
    call = json.loads(record.read_text())
    assert call["argv"] == ["run", ".", "my-link", "--stream", *fed, "--run-config", "num-server-rounds=2"]
    # what a local SuperLink this flwr run starts inherits: no runtime dependency installation, Ray's notice off
    assert call["env"]["FLWR_DISABLE_RUNTIME_DEPENDENCY_INSTALLATION"] == "1"
    assert call["env"]["PYTHONWARNINGS"] == "default::DeprecationWarning,ignore::FutureWarning:ray._private.worker"


def test_the_command_exits_5_when_the_privacy_budget_stopped_the_run(capsys, monkeypatch, tmp_path):
    folder = tmp_path / "results" / "run"
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({"stopped": STOP, "outcome": "budget-exhausted"}))
    fake_flwr(tmp_path, [SUMMARY.format(folder=folder, aborted=f", STOPPED: {STOP}")], 0)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    code, out = run_job(capsys, ".", "--run-config", "dp-mode='central' dp-max-epsilon=6.57")
    assert code == 5 and out.strip().endswith(f"pflower job: privacy budget exhausted: {STOP} (exit 5)")


def test_wrong_arguments_of_the_command_itself_exit_2(capsys, no_flower):
    with pytest.raises(SystemExit) as done:
        job.main([".", "--no-such-option"])
    assert (
        done.value.code == Exit.USAGE
        and int(Exit.USAGE) == 2
        and "unrecognized arguments: --no-such-option" in capsys.readouterr().err
    )


def test_ctrl_c_stops_following_the_run_and_exits_130(capsys, monkeypatch):
    """The command stops following (and stops its own flwr run process); the run goes on on the SuperLink."""
    stopped: list[str] = []

    class Following:
        def __init__(self, *args, **kwargs):
            self.stdout = self

        def __iter__(self):
            yield "Successfully started run 7\n"
            raise KeyboardInterrupt

        def terminate(self):
            stopped.append("terminate")

        def wait(self):
            stopped.append("wait")

    monkeypatch.setattr(subprocess, "Popen", Following)
    code, out = run_job(capsys, ".", "--run-config", "num-server-rounds=2")
    assert code == Exit.INTERRUPTED and int(code) == 130 and stopped == ["terminate", "wait"]
    assert out.strip().splitlines()[-1] == (
        "pflower job: interrupted: stopped following the run, which goes on (flwr stop <run id>) (exit 130)"
    )


@pytest.mark.skipif(shutil.which("flwr") is None, reason="needs the flwr CLI")
def test_a_superlink_that_cannot_be_reached_is_a_flower_error(tmp_path):
    """The real ``flwr run`` against a connection nobody listens on: Flower's own failure, exit 1."""
    (tmp_path / "config.toml").write_text(
        f'[superlink]\ndefault = "gone"\n\n[superlink.gone]\naddress = "127.0.0.1:{free_port()}"\ninsecure = true\n'
    )
    env = {**os.environ, "FLWR_HOME": str(tmp_path), "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "server_app.job", str(ROOT), "--run-config", "num-server-rounds=1"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr  # Exit.FLOWER_ERROR
    last = done.stdout.strip().splitlines()[-1]
    assert last.startswith("pflower job: flwr run exited with 1") and last.endswith("(exit 1)")


def test_the_readme_documents_every_exit_status():
    """The README's table of exit statuses is this command's: every status it can end with, and no other."""
    import re

    readme = (ROOT / "README.md").read_text()
    table = readme[readme.index("| exit | the run |") :].split("\n\n", 1)[0]
    documented = [int(n) for n in re.findall(r"^\| (\d+) \|", table, re.MULTILINE)]
    assert documented == sorted(int(e) for e in Exit)

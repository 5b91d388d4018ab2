"""CI runs the README's set-up commands exactly as written, and the test command enforces lint, format and types."""

import os
import re
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    """The commands of the README's first shell block (the set-up section), comments and blank lines left out."""
    block = re.search(r"```bash\n(.*?)```", (ROOT / "README.md").read_text(), re.DOTALL)
    assert block, "README.md has no ```bash block"
    return [line for line in block.group(1).splitlines() if line.strip() and not line.startswith("#")]


def ci_line(command: str) -> str:
    """The line of .ci/run that runs ``command`` as written: CI may keep a copy of the output (`2>&1 | tee log`) and
    stop on its failure (`|| exit`), but runs the command itself unchanged."""
    ci_lines = (ROOT / ".ci" / "run").read_text().splitlines()
    assert "set -euo pipefail" in ci_lines, ".ci/run must stop at the first failing command"
    ran = [
        line
        for line in ci_lines
        if line.removesuffix(" || exit") == command or line.startswith(f"{command} 2>&1 | tee ")
    ]
    assert len(ran) == 1, f".ci/run does not run the README's command as written (once): {command}"
    return ran[0]


def test_ci_runs_the_readme_commands_verbatim():
    commands = readme_commands()
    assert len(commands) == 2, commands
    for command in commands:
        ci_line(command)


def fake_tools(folder: Path, failing: str) -> Path:
    """Executables named like the test command's tools that log their arguments; `failing` exits with status 1."""
    log = folder / "calls.log"
    for tool in ("pip", "ruff", "mypy", "python"):
        script = folder / tool
        status = 1 if tool == failing else 0
        script.write_text(f'#!/bin/sh\necho "{tool} $*" >> "{log}"\nexit {status}\n')
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return log


@pytest.mark.parametrize("failing", ["ruff", "mypy", ""])
def test_the_test_command_lints_formats_and_type_checks_before_pytest(tmp_path, failing):
    test_command = readme_commands()[1]
    log = fake_tools(tmp_path, failing)
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}/usr/bin{os.pathsep}/bin"}
    done = subprocess.run(["bash", "-c", test_command], env=env, cwd=tmp_path, check=False)
    calls = [call.strip() for call in log.read_text().splitlines()]
    if failing:
        assert done.returncode != 0, f"a failing {failing} did not fail the test command"
        assert not any(call.startswith("python -m pytest") for call in calls), "pytest ran after a failing check"
    else:
        assert done.returncode == 0
        [pytest_call] = [i for i, call in enumerate(calls) if call.startswith("python -m pytest")]
        assert calls.index("ruff check .") < pytest_call
        assert calls.index("ruff format --check .") < pytest_call
        assert calls.index("mypy") < pytest_call


@pytest.mark.parametrize("failing", ["ruff", "mypy", "python"])
def test_a_failing_check_of_the_test_command_stops_ci(tmp_path, failing):
    """Under .ci/run's `set -euo pipefail` a failing command inside an && list does not stop the script (only the
    list's last one does): the test command's line must still stop CI when ruff or mypy fails, instead of skipping
    pytest and going on to the demo, which passed CI with no test run."""
    line = ci_line(readme_commands()[1])
    fake_tools(tmp_path, failing)
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}/usr/bin{os.pathsep}/bin"}
    script = f"set -euo pipefail\n{line}\necho CI went on\n"
    done = subprocess.run(["bash", "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, check=False)
    assert done.returncode != 0, f"a failing {failing} did not stop .ci/run"
    assert "CI went on" not in done.stdout


def test_ci_checks_the_benchmark_pages_against_their_records_and_stops_when_they_differ(tmp_path):
    """.ci/run runs `python -m benchmarks.report --check` (pages against records; records against the code, listed
    with --allow-stale while the one-commit rerun of the grids is under way) after the tests; a failing check stops
    CI before the demo."""
    lines = (ROOT / ".ci" / "run").read_text().splitlines()
    [line] = [ln for ln in lines if ln.startswith("python -m benchmarks.report")]
    assert line.removesuffix(" || exit").removesuffix(" --allow-stale") == "python -m benchmarks.report --check"
    assert lines.index(line) > lines.index(ci_line(readme_commands()[1]))
    assert lines.index(line) < next(i for i, ln in enumerate(lines) if ln.strip() == "demo_stage")
    fake_tools(tmp_path, "python")
    env = {**os.environ, "PATH": f"{tmp_path}{os.pathsep}/usr/bin{os.pathsep}/bin"}
    script = f"set -euo pipefail\n{line}\necho CI went on\n"
    done = subprocess.run(["bash", "-c", script], env=env, cwd=tmp_path, capture_output=True, text=True, check=False)
    assert done.returncode != 0 and "CI went on" not in done.stdout

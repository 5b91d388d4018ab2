"""Records that match the code (benchmarks/reporting/freshness.py): a record is stale when its method's files or the
shared training code changed since its commit, fresh when only other methods' files changed; a record that ran on
uncommitted code or names an unknown commit is stale; a shallow clone gets a clear message instead of a verdict;
``report.py --check`` refuses stale records unless told to list them only."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from benchmarks.records import write_record
from benchmarks.reporting import freshness

from .test_grids import record


def git(repo: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    done = subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, env=env)
    return done.stdout.strip()


@pytest.fixture
def repo(tmp_path) -> Path:
    """A repository holding (placeholders of) every file of FedCAC and of the baselines, and the shared code."""
    root = tmp_path / "repo"
    files = {*freshness.method_files("fedcac"), *freshness.method_files("fedavg")}
    for f in [*files, *(p if p.endswith(".py") else f"{p}/__init__.py" for p in freshness.SHARED)]:
        (root / f).parent.mkdir(parents=True, exist_ok=True)
        (root / f).write_text(f"# {f}\n")
    git(root, "init", "-q")
    git(root, "add", "-A")
    git(root, "commit", "-qm", "first")
    return root


def run_of(method: str, commit: str | None, dirty: bool = False) -> dict:
    rec = record("g", {"method": method, "seed": 0}, 0.5, config={"method": method})
    rec["code"] = {"commit": commit, "dirty": dirty}
    return rec


def verdict(checker: freshness.Checker, rec: dict) -> freshness.Verdict:
    v = checker.verdict(rec)
    assert v is not None
    return v


def commit_change(root: Path, path: str) -> str:
    (root / path).write_text((root / path).read_text() + "# changed\n")
    git(root, "commit", "-qam", f"change {path}")
    return git(root, "rev-parse", "HEAD")


def test_a_method_file_comes_from_the_registry_with_the_math_it_imports():
    files = freshness.method_files("fedcac")
    assert {"strategies/fedcac.py", "client_app/fedcac.py", "task/methods/fedcac.py"} <= set(files)
    assert "strategies/fedcac_math.py" in files and "strategies/fedcac_artifacts.py" in files
    assert "client_app/baselines.py" in freshness.method_files("ditto")
    with pytest.raises(KeyError, match="not in the registry"):
        freshness.method_files("nope")


def test_a_record_is_stale_when_its_method_or_the_shared_code_changed_and_fresh_otherwise(repo):
    first = git(repo, "rev-parse", "HEAD")
    checker = freshness.Checker(repo)
    assert verdict(checker, run_of("fedcac", first)).fresh
    commit_change(repo, "strategies/baselines.py")  # another method's file
    assert verdict(freshness.Checker(repo), run_of("fedcac", first)).fresh
    assert not verdict(freshness.Checker(repo), run_of("fedavg", first)).fresh
    commit_change(repo, "client_app/fedcac_math.py")
    v = verdict(freshness.Checker(repo), run_of("fedcac", first))
    assert not v.fresh and v.changed == ["client_app/fedcac_math.py"] and "1 file changed since" in (v.reason or "")
    # an uncommitted change counts: the working tree is what runs now
    head = git(repo, "rev-parse", "HEAD")
    assert verdict(freshness.Checker(repo), run_of("fedcac", head)).fresh
    (repo / "task" / "train.py").write_text("changed, not committed\n")
    assert verdict(freshness.Checker(repo), run_of("fedcac", head)).changed == ["task/train.py"]
    # against a named commit (a committed tree that runs it) the working tree does not count
    assert verdict(freshness.Checker(repo, head), run_of("fedcac", head)).fresh


def test_uncommitted_code_an_unknown_commit_and_a_record_of_no_run(repo):
    head = git(repo, "rev-parse", "HEAD")
    checker = freshness.Checker(repo)
    assert "uncommitted" in (verdict(checker, run_of("fedcac", head, dirty=True)).reason or "")
    assert "no commit" in (verdict(checker, run_of("fedcac", None)).reason or "")
    assert "not in this repository" in (verdict(checker, run_of("fedcac", "f" * 40)).reason or "")
    assert checker.verdict({"measurements": {}, "code": {"commit": head}}) is None


def test_a_shallow_clone_says_how_to_get_the_history(repo, tmp_path):
    first = git(repo, "rev-parse", "HEAD")
    commit_change(repo, "task/models.py")
    shallow = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow)], check=True)
    with pytest.raises(freshness.HistoryMissing, match="shallow; run `git fetch --unshallow`"):
        verdict(freshness.Checker(shallow), run_of("fedcac", first))


def test_report_check_refuses_stale_records_unless_asked_to_list_them(repo, tmp_path, capsys):
    from benchmarks import report

    first = git(repo, "rev-parse", "HEAD")
    raw = tmp_path / "raw"
    write_record(run_of("fedcac", first), raw)
    assert report.check_records(raw, checker=freshness.Checker(repo))
    commit_change(repo, "strategies/fedcac.py")
    capsys.readouterr()
    assert not report.check_records(raw, checker=freshness.Checker(repo))
    out = capsys.readouterr().out
    assert "records: 0 of 1 runs match today's code" in out and "g / fedcac: 1 stale record" in out
    assert report.check_records(raw, allow_stale=True, checker=freshness.Checker(repo))
    # a shallow clone cannot tell: the check says so and fails
    shallow = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow)], check=True)
    capsys.readouterr()
    assert not report.check_records(raw, checker=freshness.Checker(shallow))
    assert "git fetch --unshallow" in capsys.readouterr().out


def test_a_committed_tree_judges_its_records_against_its_own_commit(repo):
    """What the grids script reruns: on a committed tree (no repository of its own) a record is stale when its
    method's files differ between its commit and the commit that runs, whatever the working tree holds."""
    first = git(repo, "rev-parse", "HEAD")
    raw = repo / "benchmarks" / "raw"
    path = write_record(run_of("fedcac", first), raw)
    assert freshness.stale_test(raw, first)(path) is False
    later = commit_change(repo, "strategies/fedcac.py")
    assert freshness.stale_test(raw, later)(path) is True
    assert freshness.stale_test(raw, first)(path) is False


def test_a_record_keeping_its_files_digests_is_judged_without_any_history(repo, tmp_path):
    """What CI's fresh clone can tell: a record that keeps the digests of the files it ran is fresh while its method's
    files and the shared code are as they ran, stale once one of them changes (committed or not), whatever the
    history holds; another method's file does not count."""
    from benchmarks.method_code import file_digests

    shallow = tmp_path / "shallow"
    subprocess.run(["git", "clone", "-q", "--depth", "1", f"file://{repo}", str(shallow)], check=True)
    rec = run_of("fedcac", "f" * 40)  # a commit no clone holds
    rec["code"]["files"] = file_digests("fedcac", shallow)
    assert verdict(freshness.Checker(shallow), rec).fresh
    (shallow / "strategies" / "baselines.py").write_text("another method's file changed\n")
    assert verdict(freshness.Checker(shallow), rec).fresh
    (shallow / "task" / "data" / "__init__.py").write_text("the shared data code changed\n")
    v = verdict(freshness.Checker(shallow), rec)
    assert not v.fresh and v.changed == ["task/data/__init__.py"] and "1 file changed since it ran" in (v.reason or "")
    (shallow / "task" / "data" / "new.py").write_text("a file added to a shared folder\n")
    assert verdict(freshness.Checker(shallow), rec).changed == ["task/data/__init__.py", "task/data/new.py"]


def test_every_record_of_a_run_keeps_the_digests_of_the_files_its_method_ran():
    from benchmarks.method_code import ROOT, file_digests
    from benchmarks.running import record_from_run

    rec = record_from_run(
        None, grid="g", cell={"seed": 0}, command="c", num_supernodes=2, run_config={"method": "fedcac"}, error="x"
    )
    files = rec["code"]["files"]
    assert files == file_digests("fedcac", ROOT)
    assert {"strategies/fedcac.py", "client_app/fedcac_math.py", "task/train.py", "task/data/sources.py"} <= set(files)
    assert "strategies/pfedlia.py" not in files and all(len(d) == 16 for d in files.values())

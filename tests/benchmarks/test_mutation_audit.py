"""The mutation audit (benchmarks/mutation_audit.py): scores computed from verdicts and the equivalents list, verdicts
read from mutmut's files only while their function is unchanged, an audit's verdicts merged into the ledger, the
export's narrowed configuration, the time cap, and an audit of a small repository end to end."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks import mutation_audit as ma

COLUMNS = [
    "module",
    "mutants",
    "not run",
    "run",
    "caught",
    "timeout / crash",
    "survived",
    "gpu-only",
    "no tests",
    "equivalent",
    "import-time",
    "score",
    "run on",
]


def _row(lines: list[str] | str, module: str) -> dict[str, str]:
    lines = lines.splitlines() if isinstance(lines, str) else lines
    line = next(ln for ln in lines if ln.startswith(f"| {module} |"))
    return dict(zip(COLUMNS, [c.strip() for c in line.strip("|").split("|")], strict=True))


def _data(modules: dict[str, int], statuses: dict[str, str], commit: str = "0123456789ab") -> dict:
    """Verdict data of mutants named ``<module prefix>.x_f__mutmut_<n>``."""
    mutants = {}
    for name, status in statuses.items():
        module = next(m for m in modules if name.startswith(ma.dotted(m) + "."))
        mutants[name] = {"module": module, "status": status, "commit": commit}
    return {"modules": modules, "mutants": mutants}


def test_scores_count_verdicts_and_leave_equivalents_out():
    m = "strategies.x_math.x_f__mutmut_"
    statuses = ["killed", "killed", "killed", "timeout", "survived", "survived", "no tests"]
    data = _data({"strategies/x_math.py": 8}, {f"{m}{i}": s for i, s in enumerate(statuses, start=1)})
    equiv = {f"{m}5": ("equivalent", "same result")}
    lines = ma.score_table(data, equiv)
    row = _row(lines, "strategies/x_math.py")
    # 4 caught (3 killed + 1 timeout) of 7 run, less 1 equivalent: 4 / 6; the mutant without a verdict is "not run"
    assert [row[k] for k in ("run", "not run", "caught", "survived", "no tests", "equivalent")] == list("714111")
    assert row["score"] == f"{100 * 4 / 6:.1f}%" and row["timeout / crash"] == "1" and row["run on"] == "0123456"
    assert f"- `{m}6`" in lines and f"- `{m}5`" not in lines  # the survivor listed, the equivalent not
    data["modules"]["strategies/never.py"] = 5  # a module none of whose mutants has a verdict
    lines = ma.score_table(data, equiv)
    total = _row(lines, "**all of the above**")
    assert (total["mutants"], total["not run"], total["run"]) == ("13", "6", "7")
    assert "Not run at all: `strategies/never.py` (5)." in lines


def test_an_equivalent_that_a_test_kills_is_reported_and_counts_as_caught():
    data = _data({"task/t.py": 2}, {"task.t.x_f__mutmut_1": "killed", "task.t.x_f__mutmut_2": "survived"})
    equiv = {"task.t.x_f__mutmut_1": ("equivalent", "wrongly listed")}
    assert ma.counts(data, equiv)[1] == ["task.t.x_f__mutmut_1"]
    assert _row(ma.score_table(data, equiv), "task/t.py")["score"] == "50.0%"  # caught, not left out
    report = ma.compact(data) | {"date": "2026-12-04", "commit": "abc", "command": "c", "tests": []}
    text = ma.report_text(report, equiv, review=["task.t.x_f__mutmut_2"])
    killed, review = text.split("killed by a test")[1], text.split("changed since")[1]
    assert "`task.t.x_f__mutmut_1`" in killed.split("changed since")[0] and "`task.t.x_f__mutmut_2`" in review
    assert "2 of 2 mutants have a verdict." in text


def test_a_gpu_only_mutant_is_listed_apart_and_counts_as_not_caught():
    names = {f"c.x.x_f__mutmut_{i}": s for i, s in enumerate(["killed", "survived", "survived"], start=1)}
    equiv = {"c.x.x_f__mutmut_2": ("gpu-only", "a device move"), "c.x.x_f__mutmut_3": ("equivalent", "same")}
    lines = ma.score_table(_data({"c/x.py": 3}, names), equiv)
    row = _row(lines, "c/x.py")
    assert (row["caught"], row["gpu-only"], row["equivalent"], row["score"]) == ("1", "1", "1", "50.0%")
    assert lines[lines.index("- `c.x.x_f__mutmut_2`") - 2].startswith("Not caught, gpu-only")


def test_a_method_meets_the_target_only_with_every_module_run_and_each_at_90_percent():
    # a.py: 9 of 10 caught (90 %, the target exactly); b.py: 8 of 10 (below); c.py was never audited
    statuses = {f"m.a.x_f__mutmut_{i}": "killed" if i <= 9 else "survived" for i in range(1, 11)}
    statuses |= {f"m.b.x_f__mutmut_{i}": "killed" if i <= 8 else "survived" for i in range(1, 11)}
    data = _data({"m/a.py": 10, "m/b.py": 10}, statuses)
    per, _ = ma.counts(data, {})
    rows = ma.method_summary(data, per, {"A": ("m/a.py",), "AB": ("m/a.py", "m/b.py"), "AC": ("m/a.py", "m/c.py")})
    row = {r.split("|")[1].strip(): [c.strip() for c in r.strip("|").split("|")] for r in rows if r.startswith("| A")}
    assert row["A"][-1] == "yes" and row["A"][3] == "90.0% (`m/a.py`)"
    assert row["AB"][-1] == "no" and row["AB"][3] == "80.0% (`m/b.py`)"
    assert row["AC"][-1] == "no" and "never run: `m/c.py`" in row["AC"][2]
    data["modules"]["m/a.py"] = 11  # a module only partly run misses the target even at 100 % of what ran
    rows = ma.method_summary(data, ma.counts(data, {})[0], {"A": ("m/a.py",)})
    assert rows[-1].split("|")[3].strip() == "1" and rows[-1].split("|")[-2].strip() == "no"


def test_bad_equivalents_are_refused(tmp_path):
    bad = tmp_path / "e.csv"
    bad.write_text("mutant,kind,reason\ntask.t.x_f__mutmut_1,maybe,because\n")
    with pytest.raises(SystemExit, match="allowed: equivalent, import-time, gpu-only"):
        ma.equivalents(bad)
    bad.write_text("mutant,kind,reason\ntask.t.x_f__mutmut_1,equivalent, \n")
    with pytest.raises(SystemExit, match="has no reason"):
        ma.equivalents(bad)


def test_verdicts_are_stored_compactly_and_read_back_as_written(tmp_path):
    statuses = {f"task.t.x_f__mutmut_{i}": "killed" for i in (1, 2, 3, 5, 7, 8)} | {"task.t.x_f__mutmut_4": "survived"}
    statuses |= {"task.t.xǁCǁm__mutmut_1": "timeout", "task.t.xǁCǁm__mutmut_2": "killed"}
    data = _data({"task/t.py": 9}, statuses, commit="abc")
    ma.save(data, tmp_path / "r.json", date="2026-12-04")
    stored = json.loads((tmp_path / "r.json").read_text())
    assert stored["date"] == "2026-12-04" and stored["verdicts"] == {
        "task/t.py": {
            "abc": {
                "killed": {"task.t.x_f": "1-3,5,7-8", "task.t.xǁCǁm": "2"},
                "survived": {"task.t.x_f": "4"},
                "timeout": {"task.t.xǁCǁm": "1"},
            }
        }
    }
    assert ma.load(tmp_path / "r.json") == {
        "modules": data["modules"],
        "mutants": dict(sorted(data["mutants"].items())),
    }


def test_mutants_are_named_as_mutmut_names_them_and_hashed_by_their_functions_code():
    source = "def f(a):\n    return a + 1\n\n\nclass C:\n    def g(self, b):\n        return b < 2\n"
    today = ma.mutants_of("pkg/sub/__init__.py", source)
    assert today and all(n.startswith(("pkg.sub.x_f__mutmut_", "pkg.sub.xǁCǁg__mutmut_")) for n in today)
    changed = ma.mutants_of("pkg/sub/__init__.py", source.replace("a + 1", "a + 3"))
    assert {n: h for n, h in changed.items() if "ǁ" in n} == {n: h for n, h in today.items() if "ǁ" in n}
    assert all(changed[n] != today[n] for n in today if "x_f" in n)


def test_a_verdict_of_mutmut_stands_only_while_its_function_is_unchanged():
    today = {"m.x.x_f__mutmut_1": "h1", "m.x.x_f__mutmut_2": "h1", "m.x.x_g__mutmut_1": "h2", "m.x.x_k__mutmut_1": "h3"}
    meta = {
        "exit_code_by_key": {
            "m.x.x_f__mutmut_1": 1,
            "m.x.x_f__mutmut_2": 0,
            "m.x.x_g__mutmut_1": 1,
            "m.x.x_k__mutmut_1": None,
        },
        "hash_by_function_name": {"x_f": "h1", "x_g": "old", "x_k": "h3"},
    }
    verdicts, pending = ma.verdicts_from_meta(meta, today, "m/x.py", "c0ffee")
    assert verdicts == {
        "m.x.x_f__mutmut_1": {"module": "m/x.py", "status": "killed", "commit": "c0ffee"},
        "m.x.x_f__mutmut_2": {"module": "m/x.py", "status": "survived", "commit": "c0ffee"},
    }
    assert pending == ["m.x.x_g__mutmut_1", "m.x.x_k__mutmut_1"]  # g changed since mutmut ran it; k never ran
    assert ma.verdicts_from_meta({}, today, "m/x.py", "c0ffee") == ({}, list(today))


def test_an_audit_replaces_its_modules_verdicts_and_keeps_those_of_unchanged_functions():
    ledger = _data(
        {"m/x.py": 4, "m/y.py": 1},
        {
            "m.x.x_f__mutmut_1": "survived",  # run again by the audit
            "m.x.x_f__mutmut_2": "killed",  # not run again, function unchanged: kept
            "m.x.x_g__mutmut_1": "killed",  # its function changed: dropped
            "m.x.x_h__mutmut_1": "killed",  # no longer a mutant of the module: dropped
            "m.y.x_f__mutmut_1": "survived",  # another module: untouched
        },
        commit="old",
    )
    audit = _data({"m/x.py": 4}, {"m.x.x_f__mutmut_1": "killed"}, commit="new")
    today = {"m/x.py": {"m.x.x_f__mutmut_1", "m.x.x_f__mutmut_2", "m.x.x_g__mutmut_1", "m.x.x_k__mutmut_1"}}
    merged, dropped = ma.merge(ledger, audit, today, outdated={"m.x.x_g__mutmut_1"})
    assert {n: (r["status"], r["commit"]) for n, r in merged["mutants"].items()} == {
        "m.x.x_f__mutmut_1": ("killed", "new"),
        "m.x.x_f__mutmut_2": ("killed", "old"),
        "m.y.x_f__mutmut_1": ("survived", "old"),
    }
    assert dropped == ["m.x.x_g__mutmut_1", "m.x.x_h__mutmut_1"] and merged["modules"] == {"m/x.py": 4, "m/y.py": 1}
    assert _row(ma.score_table(merged, {}), "m/x.py")["not run"] == "2"


def _git(root: Path, *args: str) -> str:
    env = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    done = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, check=True, env=env)
    return done.stdout.strip()


def test_a_verdict_goes_stale_when_its_function_changes_and_only_then(tmp_path):
    """Changing a function's code (or taking it out) makes its verdicts stale; a new docstring, comment or annotation
    does not (mutmut mutates none of them), nor does a change to another function."""
    module = tmp_path / "m" / "x.py"
    module.parent.mkdir()
    module.write_text(
        "def f(a):\n    return a + 1\n\n\ndef g(a: int) -> int:\n    return a * 2\n\n\n"
        "class C:\n    def h(self):\n        return 3\n\n\ndef k():\n    return 0\n"
    )
    package = module.parent / "__init__.py"  # mutmut names a package's functions after the package: m.x_p
    package.write_text("def p():\n    return 1\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "1")
    commit = _git(tmp_path, "rev-parse", "--short=12", "HEAD")
    names = ["m.x.x_f__mutmut_1", "m.x.x_g__mutmut_1", "m.x.xǁCǁh__mutmut_1", "m.x.x_k__mutmut_1"]
    data = {"mutants": {n: {"module": "m/x.py", "status": "killed", "commit": commit} for n in names}}
    data["mutants"]["m.x_p__mutmut_1"] = {"module": "m/__init__.py", "status": "killed", "commit": commit}
    assert ma.stale(data, tmp_path) == ({}, [])
    module.write_text(
        "def f(a):\n    return a - 1\n\n\n"
        'def g(a: float) -> float:\n    """Twice a."""\n    return a * 2  # doubled\n\n\n'
        "class C:\n    def h(self):\n        return 4\n"
    )
    old, missing = ma.stale(data, tmp_path)
    assert missing == [] and set(old) == {"m.x.x_f__mutmut_1", "m.x.xǁCǁh__mutmut_1", "m.x.x_k__mutmut_1"}
    assert old["m.x.x_k__mutmut_1"] == "x_k is no longer in m/x.py" and commit in old["m.x.x_f__mutmut_1"]
    assert ma.stale(data, tmp_path, at=commit) == ({}, [])  # against the commit's code, not the working tree's
    package.write_text("def p():\n    return 2\n")
    assert set(ma.stale(data, tmp_path)[0]) == set(old) | {"m.x_p__mutmut_1"}
    unknown = {"mutants": {"m.x.x_f__mutmut_1": {"module": "m/x.py", "status": "killed", "commit": "0123456789ab"}}}
    assert ma.stale(unknown, tmp_path) == ({}, ["0123456789ab"])


def test_the_export_mutates_only_the_named_modules_and_keeps_the_deselected_checks():
    """The repository's pyproject narrowed as an audit narrows it: the deselection of the checks of the repository's own
    files (which do not hold in mutants/) and the markers stay, with or without --tests."""
    import tomllib

    text = (ma.ROOT / "pyproject.toml").read_text()
    before = tomllib.loads(text)["tool"]["mutmut"]["pytest_add_cli_args_test_selection"]
    assert "--deselect" in before
    for tests, expected in (([], before), (["tests/a.py", "tests/b"], ["tests/a.py", "tests/b", *before[1:]])):
        config = tomllib.loads(ma.narrowed_pyproject(text, ["strategies/cfl_math.py"], tests))
        assert config["tool"]["mutmut"]["only_mutate"] == ["strategies/cfl_math.py"]
        assert config["tool"]["mutmut"]["pytest_add_cli_args_test_selection"] == expected
        assert config["tool"]["flwr"] == tomllib.loads(text)["tool"]["flwr"]  # the rest as it was


def test_a_module_mutmut_does_not_mutate_is_refused_early(tmp_path):
    with pytest.raises(SystemExit, match="no such file"):
        ma.check_modules(["strategies/nothing.py"], ma.ROOT)
    with pytest.raises(SystemExit, match=r"not a module mutmut mutates; \[tool.mutmut\] only_mutate allows"):
        ma.check_modules(["server_app/app.py"], ma.ROOT)
    ma.check_modules(["strategies/cfl_math.py", "task/methods/__init__.py"], ma.ROOT)


def test_the_time_cap_stops_the_command_and_everything_it_started(tmp_path):
    child = tmp_path / "child.pid"
    script = (
        "import subprocess, time; p = subprocess.Popen(['sleep', '60']); "
        f"open({str(child)!r}, 'w').write(str(p.pid)); time.sleep(60)"
    )
    start = time.monotonic()
    assert ma.run_capped([sys.executable, "-c", script], tmp_path, seconds=3) is None
    assert time.monotonic() - start < 40
    pid = int(child.read_text())
    assert not Path(f"/proc/{pid}").exists() or "Z" in Path(f"/proc/{pid}/stat").read_text().split()[2]
    assert ma.run_capped([sys.executable, "-c", "raise SystemExit(3)"], tmp_path, seconds=30) == 3


def test_the_committed_table_is_what_the_committed_verdicts_and_equivalents_give():
    """docs/mutation/README.md's table is rendered from verdicts.json and equivalent.csv, never typed.  Both are data:
    a change to the code leaves this test as it was (a verdict of older code is shown with its commit, not refused)."""
    doc = (ma.ROOT / ma.DOC).read_text()
    assert ma.render_doc(doc, ma.load(ma.ROOT / ma.LEDGER), ma.equivalents(ma.ROOT / ma.EQUIVALENT)) == doc, (
        "run `python -m benchmarks.mutation_audit --table`"
    )


@pytest.mark.slow
def test_an_audit_is_capped_resumable_and_writes_a_report_with_its_commit(tmp_path):
    """mutmut run for real on a small repository: the first audit stops at its cap of mutants, the second goes on
    where it stopped, and each writes the dated report of its commit, the ledger and the README's table."""
    root = tmp_path / "repo"
    (root / "pkg").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "docs" / "mutation").mkdir(parents=True)
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "calc.py").write_text("def clamp(x, low, high):\n    return min(max(x, low), high)\n")
    (root / "tests" / "test_calc.py").write_text(
        "from pkg.calc import clamp\n\n\ndef test_clamp():\n    assert clamp(5, 0, 3) == 3 and clamp(-1, 0, 3) == 0\n"
    )
    (root / "pyproject.toml").write_text(
        '[project]\nname = "pkg"\nversion = "0"\n\n[tool.mutmut]\nsource_paths = ["pkg"]\nonly_mutate = ["pkg/*"]\n'
        'pytest_add_cli_args_test_selection = ["tests", "-p", "no:cacheprovider"]\n'
    )
    (root / "docs" / "mutation" / "README.md").write_text(f"# scores\n\n{ma.BEGIN}\n{ma.END}\n")
    _git(root, "init", "-q")
    _git(root, "add", ".")
    _git(root, "commit", "-q", "-m", "1")
    commit = _git(root, "rev-parse", "--short=12", "HEAD")
    today = ma.mutants_of("pkg/calc.py", (root / "pkg" / "calc.py").read_text())
    assert len(today) > 2
    kw = {"root": root, "workdir": tmp_path / "work", "date": "2026-12-04", "minutes": 5}
    # a recorded verdict of a commit git does not have (a rebased branch's) says nothing of today's code
    unknown = max(today)
    ma.save(_data({"pkg/calc.py": len(today)}, {unknown: "survived"}, commit="0123456789ab"), root / ma.LEDGER)

    report = ma.audit(["pkg/calc.py"], max_mutants=2, **kw)
    assert report == root / "docs" / "mutation" / "reports" / f"2026-12-04-{commit}.md"
    first = ma.load(report.with_suffix(".json"))
    assert len(first["mutants"]) == 2 and first["modules"] == {"pkg/calc.py": len(today)}
    assert unknown not in first["mutants"] and ma.load(root / ma.LEDGER) == first
    assert f"{len(today) - 2} not run yet" in report.read_text() and commit in report.read_text()

    # mutmut's verdicts are the audit's state: one marked a timeout here stays one if the next audit does not rerun it
    meta_path = tmp_path / "work" / "tree" / "mutants" / "pkg" / "calc.py.meta"
    meta = json.loads(meta_path.read_text())
    marked = min(first["mutants"])
    meta["exit_code_by_key"][marked] = 36
    meta_path.write_text(json.dumps(meta))
    ma.audit(["pkg/calc.py"], **kw)
    second = ma.load(report.with_suffix(".json"))
    assert set(second["mutants"]) == set(today) and {r["commit"] for r in second["mutants"].values()} == {commit}
    assert second["mutants"][marked]["status"] == "timeout"  # not run again
    assert ma.load(root / ma.LEDGER) == second
    row = _row((root / ma.DOC).read_text(), "pkg/calc.py")
    assert row["mutants"] == str(len(today)) and row["not run"] == "0" and row["run on"] == commit[:7]
    assert f"{len(today)} of {len(today)} mutants have a verdict." in report.read_text()

"""The mutation score table is computed from recorded verdicts, not typed (tests/mutation_scores.py)."""

import json
import subprocess

import pytest

from tests import mutation_scores as ms


def _meta(root, module, codes):
    path = root / (module + ".meta")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"exit_code_by_key": codes}))


def _row(text, module):
    line = next(ln for ln in text.splitlines() if ln.startswith(f"| {module} |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    return dict(
        zip(
            [
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
            ],
            cells,
            strict=True,
        )
    )


def test_scores_count_verdicts_and_leave_equivalents_out(tmp_path):
    mutants = tmp_path / "mutants"
    m = "strategies.x_math"
    _meta(
        mutants,
        "strategies/x_math.py",
        {f"{m}.x_f__mutmut_{i}": c for i, c in enumerate([1, 1, 1, -24, 0, 0, 33, None], start=1)},
    )
    _meta(mutants, "strategies/other.py", {"strategies.other.x_g__mutmut_1": None})
    results = tmp_path / "results.json"
    added, _ = ms.collect(mutants, "0123456789abcdef", [f"{m}.*"], path=results)
    assert added == 7  # the mutant without a verdict is not recorded
    data = ms.load(results)
    assert data["modules"] == {"strategies/x_math.py": 8}  # only the modules asked for
    equiv = {f"{m}.x_f__mutmut_5": ("equivalent", "same result")}
    text, stale = ms.table(data, equiv)
    row = _row(text, "strategies/x_math.py")
    # 4 caught (3 killed + 1 timeout) of 7 run, minus 1 equivalent: 4 / 6
    assert (row["run"], row["not run"], row["caught"], row["survived"], row["no tests"], row["equivalent"]) == (
        "7",
        "1",
        "4",
        "1",
        "1",
        "1",
    )
    assert row["score"] == f"{100 * 4 / 6:.1f}%"
    assert row["timeout / crash"] == "1"  # the timeout counts as caught, and is shown apart
    assert f"`{m}.x_f__mutmut_6`" in text and f"`{m}.x_f__mutmut_5` | equivalent" in text
    assert stale == [] and "`0123456789ab`" in text
    data["modules"]["strategies/never.py"] = 5  # a module none of whose mutants has a verdict of today's code
    text, _ = ms.table(data, equiv)
    total = _row(text, "**all of the above**")
    assert (total["mutants"], total["not run"], total["run"]) == ("13", "6", "7")
    assert "Not run at all: `strategies/never.py` (5)" in text


def test_an_equivalent_that_a_test_kills_is_reported_stale(tmp_path):
    mutants = tmp_path / "mutants"
    _meta(mutants, "task/t.py", {"task.t.x_f__mutmut_1": 1, "task.t.x_f__mutmut_2": 0})
    results = tmp_path / "r.json"
    ms.collect(mutants, "abc", [], path=results)
    text, stale = ms.table(ms.load(results), {"task.t.x_f__mutmut_1": ("equivalent", "wrongly listed")})
    assert stale == ["task.t.x_f__mutmut_1"]
    assert _row(text, "task/t.py")["score"] == "50.0%"  # a stale equivalent counts as caught, not as left out


def test_later_verdicts_replace_earlier_ones(tmp_path):
    mutants, results = tmp_path / "mutants", tmp_path / "r.json"
    _meta(mutants, "task/t.py", {"task.t.x_f__mutmut_1": 0})
    ms.collect(mutants, "old", [], path=results)
    _meta(mutants, "task/t.py", {"task.t.x_f__mutmut_1": 1})
    ms.collect(mutants, "new", [], path=results)
    assert ms.load(results)["mutants"]["task.t.x_f__mutmut_1"] == {
        "module": "task/t.py",
        "status": "killed",
        "commit": "new",
    }


def test_a_verdict_for_a_mutant_the_module_no_longer_has_is_dropped(tmp_path):
    """After a change, mutmut renumbers a function's mutants: a verdict for a number that no longer exists would
    count as run although nothing was (the table showed -1 mutants not run)."""
    mutants, results = tmp_path / "mutants", tmp_path / "r.json"
    _meta(mutants, "task/t.py", {"task.t.x_f__mutmut_1": 1, "task.t.x_f__mutmut_2": 1, "task.t.x_g__mutmut_1": 1})
    _meta(mutants, "task/u.py", {"task.u.x_h__mutmut_1": 1})
    ms.collect(mutants, "old", [], path=results)
    _meta(mutants, "task/t.py", {"task.t.x_f__mutmut_1": 0, "task.t.x_g__mutmut_1": None})
    ms.collect(mutants, "new", ["task.t.x_f*"], path=results)
    kept = ms.load(results)["mutants"]
    assert sorted(kept) == ["task.t.x_f__mutmut_1", "task.t.x_g__mutmut_1", "task.u.x_h__mutmut_1"]
    assert kept["task.t.x_g__mutmut_1"]["commit"] == "old"  # not run this time, still there: kept as it was
    assert _row(ms.table(ms.load(results), {})[0], "task/t.py")["not run"] == "0"


def test_bad_equivalents_file_and_empty_folder_are_refused(tmp_path):
    bad = tmp_path / "e.csv"
    bad.write_text("mutant,kind,reason\ntask.t.x_f__mutmut_1,maybe,because\n")
    with pytest.raises(SystemExit, match="allowed: equivalent, import-time, gpu-only"):
        ms.equivalents(bad)
    bad.write_text("mutant,kind,reason\ntask.t.x_f__mutmut_1,equivalent, \n")
    with pytest.raises(SystemExit, match="has no reason"):
        ms.equivalents(bad)
    with pytest.raises(SystemExit, match="run `mutmut run` there first"):
        ms.collect(tmp_path / "nothing", "abc", [], path=tmp_path / "r.json")


def test_a_method_meets_the_target_only_with_every_module_run_and_each_at_90_percent(tmp_path):
    mutants, results = tmp_path / "mutants", tmp_path / "r.json"
    # a.py: 9 of 10 caught (90 %, the target exactly); b.py: 8 of 10 (below); c.py is never run
    _meta(mutants, "m/a.py", {f"m.a.x_f__mutmut_{i}": (1 if i <= 9 else 0) for i in range(1, 11)})
    _meta(mutants, "m/b.py", {f"m.b.x_f__mutmut_{i}": (1 if i <= 8 else 0) for i in range(1, 11)})
    ms.collect(mutants, "abc", [], path=results)
    data = ms.load(results)
    per: dict[str, ms.Counter[str]] = {}
    for rec in data["mutants"].values():
        c = per.setdefault(rec["module"], ms.Counter())
        c["run"] += 1
        c["caught" if rec["status"] in ms.CAUGHT else rec["status"]] += 1
    rows = ms.method_summary(data, per, {"A": ("m/a.py",), "AB": ("m/a.py", "m/b.py"), "AC": ("m/a.py", "m/c.py")})
    row = {r.split("|")[1].strip(): [c.strip() for c in r.strip("|").split("|")] for r in rows if r.startswith("| A")}
    assert row["A"][-1] == "yes" and row["A"][3] == "90.0% (`m/a.py`)"
    assert row["AB"][-1] == "no" and row["AB"][3] == "80.0% (`m/b.py`)"
    assert row["AC"][-1] == "no" and "never run: `m/c.py`" in row["AC"][2]
    # a module only partly run does not meet the target even at 100 % of what ran
    _meta(mutants, "m/a.py", {"m.a.x_f__mutmut_1": 1, "m.a.x_f__mutmut_2": None})
    ms.collect(mutants, "def", [], path=tmp_path / "r2.json")
    d2 = ms.load(tmp_path / "r2.json")
    rows = ms.method_summary(d2, {"m/a.py": ms.Counter(run=1, caught=1)}, {"A": ("m/a.py",)})
    assert rows[-1].split("|")[3].strip() == "1" and rows[-1].split("|")[-2].strip() == "no"


def test_a_gpu_only_mutant_is_listed_apart_and_counts_as_not_caught(tmp_path):
    mutants, results = tmp_path / "mutants", tmp_path / "r.json"
    _meta(mutants, "c/x.py", {"c.x.x_f__mutmut_1": 1, "c.x.x_f__mutmut_2": 0, "c.x.x_f__mutmut_3": 0})
    ms.collect(mutants, "abc", [], path=results)
    equiv = {"c.x.x_f__mutmut_2": ("gpu-only", "a device move"), "c.x.x_f__mutmut_3": ("equivalent", "same")}
    text, _ = ms.table(ms.load(results), equiv)
    row = _row(text, "c/x.py")
    assert (row["caught"], row["gpu-only"], row["equivalent"], row["score"]) == ("1", "1", "1", "50.0%")
    assert "kind gpu-only" in text and "`c.x.x_f__mutmut_2`" in text


def test_the_committed_score_table_is_what_the_committed_verdicts_and_equivalents_give(capsys):
    """docs/mutation/README.md's table is rendered from docs/mutation/verdicts.json and equivalent.csv, never typed:
    regenerating it changes nothing, and no listed equivalent is killed by a test."""
    assert ms.DOC.parent == ms.RESULTS.parent == ms.EQUIVALENT.parent  # the table beside what it is made of
    assert ms.render(check=True) == 0, capsys.readouterr().out
    data = ms.load()
    assert sum(data["modules"].values()) >= len(data["mutants"])  # what was not run on today's code shows as such


def test_no_committed_verdict_describes_code_that_has_since_changed():
    """A verdict counts only for the code it was run on: every recorded mutant's function is, apart from docstrings,
    comments and annotations, what it was at the commit the verdict names (after a change, `stale --drop` and a
    re-run)."""
    old, missing = ms.stale(ms.load())
    if missing:
        pytest.skip(f"this clone lacks the commits {', '.join(missing)} (shallow): the verdicts cannot be checked")
    assert not old, f"{len(old)} verdicts describe changed code, e.g. {sorted(old.items())[:3]}"


def _git(root, *args):
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True)


def test_a_verdict_goes_stale_when_its_function_changes_and_only_then(tmp_path):
    """Changing a function's code (or taking it out) makes its verdicts stale; a new docstring, comment or
    annotation does not (mutmut mutates none of them), nor does a change to another function."""
    module = tmp_path / "m" / "x.py"
    module.parent.mkdir()
    module.write_text(
        "def f(a):\n    return a + 1\n\n\ndef g(a: int) -> int:\n    return a * 2\n\n\n"
        "class C:\n    def h(self):\n        return 3\n\n\ndef k():\n    return 0\n"
    )
    package = module.parent / "__init__.py"  # mutmut names a package's functions after the package: m.x_p
    package.write_text("def p():\n    return 1\n")
    _git(tmp_path, "init", "-q")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "--allow-empty", "-m", "0")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "1")
    commit = subprocess.run(
        ["git", "-C", str(tmp_path), "rev-parse", "--short=12", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    names = ["m.x.x_f__mutmut_1", "m.x.x_g__mutmut_1", "m.x.xǁCǁh__mutmut_1", "m.x.x_k__mutmut_1"]
    data = {"mutants": {n: {"module": "m/x.py", "status": "killed", "commit": commit} for n in names}}
    data["mutants"]["m.x_p__mutmut_1"] = {"module": "m/__init__.py", "status": "killed", "commit": commit}
    assert ms.stale(data, tmp_path) == ({}, [])
    module.write_text(
        "def f(a):\n    return a - 1\n\n\n"
        'def g(a: float) -> float:\n    """Twice a."""\n    return a * 2  # doubled\n\n\n'
        "class C:\n    def h(self):\n        return 4\n"
    )
    old, missing = ms.stale(data, tmp_path)
    assert missing == [] and set(old) == {"m.x.x_f__mutmut_1", "m.x.xǁCǁh__mutmut_1", "m.x.x_k__mutmut_1"}
    package.write_text("def p():\n    return 2\n")
    assert set(ms.stale(data, tmp_path)[0]) == set(old) | {"m.x_p__mutmut_1"}
    assert old["m.x.x_k__mutmut_1"] == "x_k is no longer in m/x.py" and commit in old["m.x.x_f__mutmut_1"]
    unknown = {"mutants": {"m.x.x_f__mutmut_1": {"module": "m/x.py", "status": "killed", "commit": "0123456789ab"}}}
    assert ms.stale(unknown, tmp_path) == ({}, ["0123456789ab"])


def test_verdicts_are_stored_compactly_and_read_back_as_collected(tmp_path):
    """The stored file groups each module's verdicts by commit and status and writes a function's mutant numbers
    as ranges; reading it gives back every mutant with its module, status and commit."""
    mutants, results = tmp_path / "mutants", tmp_path / "r.json"
    codes = {f"task.t.x_f__mutmut_{i}": 1 for i in (1, 2, 3, 5, 7, 8)} | {"task.t.x_f__mutmut_4": 0}
    codes |= {"task.t.xǁCǁm__mutmut_1": 36, "task.t.xǁCǁm__mutmut_2": 1}
    _meta(mutants, "task/t.py", codes)
    ms.collect(mutants, "abc", [], path=results)
    stored = json.loads(results.read_text())
    assert stored["verdicts"] == {
        "task/t.py": {
            "abc": {
                "killed": {"task.t.x_f": "1-3,5,7-8", "task.t.xǁCǁm": "2"},
                "survived": {"task.t.x_f": "4"},
                "timeout": {"task.t.xǁCǁm": "1"},
            }
        }
    }
    data = ms.load(results)
    assert data["modules"] == {"task/t.py": 9}
    assert {k: v["status"] for k, v in data["mutants"].items()} == {k: ms.STATUS[c] for k, c in codes.items()}
    assert ms.expand(ms.compact(data)) == data

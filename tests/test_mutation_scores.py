"""The mutation score table is computed from recorded verdicts, not typed (tests/mutation_scores.py)."""

import json

import pytest

from tests import mutation_scores as ms


def _meta(root, module, codes):
    path = root / (module + ".meta")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"exit_code_by_key": codes}))


def _row(text, module):
    line = next(l for l in text.splitlines() if l.startswith(f"| {module} |"))
    cells = [c.strip() for c in line.strip("|").split("|")]
    return dict(zip(["module", "mutants", "not run", "run", "caught", "survived", "no tests", "equivalent",
                     "import-time", "score"], cells))


def test_scores_count_verdicts_and_leave_equivalents_out(tmp_path):
    mutants = tmp_path / "mutants"
    m = "strategies.x_math"
    _meta(mutants, "strategies/x_math.py", {f"{m}.x_f__mutmut_{i}": c for i, c in
                                            enumerate([1, 1, 1, -24, 0, 0, 33, None], start=1)})
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
    assert (row["run"], row["not run"], row["caught"], row["survived"], row["no tests"], row["equivalent"]) == \
        ("7", "1", "4", "1", "1", "1")
    assert row["score"] == f"{100 * 4 / 6:.1f}%"
    assert f"`{m}.x_f__mutmut_6`" in text and f"`{m}.x_f__mutmut_5` | equivalent" in text
    assert stale == [] and "`0123456789ab`" in text


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
    assert ms.load(results)["mutants"]["task.t.x_f__mutmut_1"] == {"module": "task/t.py", "status": "killed",
                                                                   "commit": "new"}


def test_bad_equivalents_file_and_empty_folder_are_refused(tmp_path):
    bad = tmp_path / "e.csv"
    bad.write_text("mutant,kind,reason\ntask.t.x_f__mutmut_1,maybe,because\n")
    with pytest.raises(SystemExit, match="allowed: equivalent, import-time"):
        ms.equivalents(bad)
    bad.write_text("mutant,kind,reason\ntask.t.x_f__mutmut_1,equivalent, \n")
    with pytest.raises(SystemExit, match="has no reason"):
        ms.equivalents(bad)
    with pytest.raises(SystemExit, match="run `mutmut run` there first"):
        ms.collect(tmp_path / "nothing", "abc", [], path=tmp_path / "r.json")

"""The equal-tuning grids (benchmarks/grids.py) and their section of RESULTS.md (benchmarks/reporting/grids.py) on
synthetic records: selection on validation scores only, every method with the same budget, the chosen setting held
across the grid, paired differences only between runs on the same data, partial grids shown as such, the compute
stated, and the figures checked by ``report.py --check``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import families, grids, records, reporting, running
from benchmarks.records import write_record
from benchmarks.reporting import figures
from benchmarks.reporting import grids as report_grids
from benchmarks.reporting.grids import FamilyRecords
from benchmarks.running import fingerprint

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


def tiny() -> dict[str, families.Family]:
    fam = families.FAMILIES["label-skew"]
    rows = tuple(r for r in fam.rows if r.name in ("local", "fedavg", "fedcac", "pifl"))
    return {"label-skew": replace(fam, rows=rows, samples={25: {}, 50: {}}, heterogeneity=dict(fam.heterogeneity))}


MACHINE = {"cores": 2, "memory-gib": 24, "gpu": False, "python": "3.11", "flwr": "1.41.0", "torch": "2"}


def record(grid, cell, acc, *, num_examples=(30, 40, 50), test_examples=None, rounds=(), error=None, config=None, **kw):
    """A synthetic record (``kw``: ``wall`` seconds of ``flwr run``, ``seconds`` of ServerApp time)."""
    wall, tests = kw.get("wall", 30.0), test_examples or [9] * len(num_examples)
    clients = {
        "columns": ["client", "num-examples", "personal-acc", "test-examples"],
        "rows": [[i, n, acc, t] for i, (n, t) in enumerate(zip(num_examples, tests, strict=True))],
    }
    return {
        "schema": 1,
        "grid": grid,
        "cell": cell,
        "command": "python -m benchmarks.grids",
        "run": None,
        "num-supernodes": len(num_examples),
        "error": error,
        "code": {"commit": "0123456789abcdef", "dirty": False},
        "machine": {**MACHINE, "load-before": wall / 10},  # the load is told apart by the run's wall time
        "run-config": {"val-fraction": 0.2, **(config or {})},
        "overrides": ["val-fraction", *(config or {})],
        "summary": {"personal-acc": None if error else acc, "seconds": kw.get("seconds", 10.0)},
        "rounds": list(rounds),
        "clients": clients if not error else {"columns": [], "rows": []},
        "artefacts": {},
        "fingerprint": fingerprint(clients, [], {}),
        "wall-seconds": wall,
    }


def write_selection(raw, fam, scores: dict[str, list[float]], seeds=(0, 1)):
    """``scores[row]``: one validation accuracy per setting of the row (the same for every seed + a seed offset)."""
    for row in fam.rows:
        for s in seeds:
            for setting, base in zip(row.settings(fam.lrs), scores[row.name], strict=False):
                cell = {"method": row.name, "setting": families.setting_label(setting), "seed": s}
                write_record(
                    record(fam.select_grid, cell, base + 0.001 * s, config={"evaluate-split": "validation"}), raw
                )


def write_grid(raw, fam, row, setting, samples, het, accs, **kw):
    for seed, a in enumerate(accs):
        cell = {"samples": samples, "heterogeneity": het, "method": row, "setting": setting, "seed": seed}
        write_record(record(fam.grid, cell, a, **kw), raw)


# =========================================================================== the plan (grids.py)
def test_every_planned_run_config_is_one_the_app_accepts():
    from task.methods import METHODS

    design = {
        name: replace(f, rows=tuple(r for r in f.rows if r.config["method"] in METHODS))
        for name, f in families.FAMILIES.items()
    }
    for fam in design.values():
        chosen = {r.name: families.setting_label(s) for r in fam.rows for s in r.settings(fam.lrs)[-1:]}
        grids.check_configs(families.selection_runs(fam, [0]) + families.grid_runs(fam, chosen, [0], True))
        grids.check_configs(families.grid_runs(fam, chosen, [0], False))
    bad = replace(design["label-skew"], rows=(families.Row("pifl", {"method": "pifl"}, "tiers", (2, 11)),))
    with pytest.raises(SystemExit, match=r"label-skew / pifl: .*tiers=11"):
        grids.check_configs(families.selection_runs(bad, [0]))


def test_every_method_of_a_family_gets_the_same_number_of_settings_and_selection_never_scores_on_test():
    for fam in families.FAMILIES.values():
        sizes = {len(r.settings(fam.lrs)) for r in fam.rows}
        assert len(sizes) == 1 and 4 <= sizes.pop() <= 9  # lr and one key, 2-3 values each
        for r in fam.rows:
            assert r.key != "lr" and 2 <= len(r.values) <= 3 and 2 <= len(fam.lrs) <= 3
        runs = families.selection_runs(fam, [0, 1])
        assert len(runs) == 2 * sum(len(r.settings(fam.lrs)) for r in fam.rows)
        n, h = fam.middle
        for run in runs:
            assert run.config["evaluate-split"] == "validation"
            assert run.config["train-samples"] == n and run.cell["seed"] == run.config["seed"]
            assert {k: run.config[k] for k in fam.heterogeneity[h]} == fam.heterogeneity[h]
        # seed by seed: the first seed of every method comes before the second of any
        assert [r.cell["seed"] for r in runs] == sorted(r.cell["seed"] for r in runs)


def test_grid_runs_use_the_chosen_setting_on_the_test_split_middle_cell_first():
    fam = families.FAMILIES["feature-shift"]
    chosen = {r.name: families.setting_label(r.settings(fam.lrs)[-1]) for r in fam.rows if r.name != "moon"}
    middle = families.grid_runs(fam, chosen, [0, 1, 2], middle=True)
    rest = families.grid_runs(fam, chosen, [0, 1, 2], middle=False)
    assert {(r.cell["samples"], r.cell["heterogeneity"]) for r in middle} == {fam.middle}
    assert fam.middle not in {(r.cell["samples"], r.cell["heterogeneity"]) for r in rest}
    assert len(middle) + len(rest) == 3 * len(chosen) * len(fam.cells())
    for run in middle + rest:
        row = fam.row(run.cell["method"])
        assert "evaluate-split" not in run.config  # the app's default: the test split
        assert run.cell["method"] != "moon"  # no setting chosen yet: no grid run
        assert {k: run.config[k] for k in ("lr", row.key)} == families.setting_of(fam, row, chosen[row.name])
        assert run.config["train-samples"] == run.cell["samples"]
        assert run.config["seed"] == run.cell["seed"] and run.config["method"] == row.config["method"]
    # the samples axis: only the largest value needs copies of the data set
    copies = {r.cell["samples"]: r.config.get("data-copies", 1) for r in rest}
    assert copies[max(copies)] > 1 and all(v == 1 for k, v in copies.items() if k != max(copies))


def test_a_setting_is_chosen_on_mean_validation_accuracy_ties_going_to_the_first(tmp_path):
    fam = tiny()["label-skew"]
    write_selection(
        tmp_path,
        fam,
        {"local": [0.5, 0.7, 0.6, 0.1], "fedavg": [0.8, 0.8, 0.2, 0.8], "fedcac": [0.1] * 4, "pifl": [0.3] * 4},
    )
    sel = FamilyRecords.load(fam, tmp_path).selection
    assert sel["local"].chosen == families.setting_label(fam.row("local").settings(fam.lrs)[1])
    assert sel["fedavg"].chosen == families.setting_label(fam.row("fedavg").settings(fam.lrs)[0])
    assert sel["local"].mean(sel["local"].chosen) == pytest.approx(0.7005)


def test_a_failed_setting_cannot_be_chosen_and_a_missing_run_leaves_the_method_unselected(tmp_path):
    fam = tiny()["label-skew"]
    write_selection(
        tmp_path,
        fam,
        {"local": [0.5, 0.7, 0.6, 0.1], "fedavg": [0.8] * 4, "fedcac": [0.1] * 4, "pifl": [0.3] * 4},
    )
    best = families.setting_label(fam.row("local").settings(fam.lrs)[1])
    cell = {"method": "local", "setting": best, "seed": 1}
    write_record(record(fam.select_grid, cell, 0.0, error="RuntimeError: boom"), tmp_path)
    other = families.setting_label(fam.row("pifl").settings(fam.lrs)[2])
    (tmp_path / fam.select_grid / f"{records.cell_name({'method': 'pifl', 'setting': other, 'seed': 0})}.json").unlink()
    sel = FamilyRecords.load(fam, tmp_path).selection
    assert sel["local"].chosen == families.setting_label(fam.row("local").settings(fam.lrs)[2])
    assert sel["pifl"].chosen is None and "incomplete" in sel["pifl"].reason
    text = report_grids.render_grids(tmp_path, {}, tiny())
    assert "failed" in text and "selection incomplete (7 of 8 runs)" in text


# =========================================================================== the report
def _filled(tmp_path):
    design = tiny()
    fam = design["label-skew"]
    write_selection(
        tmp_path, fam, {"local": [0.5, 0.7, 0.6, 0.1], "fedavg": [0.8] * 4, "fedcac": [0.9] * 4, "pifl": [0.3] * 4}
    )
    sel = FamilyRecords.load(fam, tmp_path).selection
    rng = np.random.default_rng(0)
    truth = {}
    for samples, het in fam.cells():
        for name in ("local", "fedavg", "fedcac", "pifl"):
            if (samples, het) != fam.middle and name == "fedavg":
                continue  # FedAvg only at the middle cell: "not run" elsewhere
            accs = list(rng.uniform(0.3, 0.9, size=3))
            truth[(name, samples, het)] = accs
            kw = {"test_examples": (4, 4, 4)} if name == "pifl" else {}
            write_grid(tmp_path, fam, name, sel[name].chosen, samples, het, accs, **kw)
    return design, fam, sel, truth


def _row(text: str, title: str, method: str) -> list[str]:
    section = text.split(f"#### {title}", 1)[1].split("\n####", 1)[0]
    line = next(line for line in section.splitlines() if line.startswith(f"| {method} |"))
    return [c.strip() for c in line.strip("|").split("|")]


def _points(deltas) -> str:
    d = np.asarray(deltas) * 100
    return f"{d.mean():+.1f} ({d.min():+.1f} to {d.max():+.1f})"


def test_each_cell_shows_mean_spread_setting_and_paired_differences_with_wins(tmp_path):
    design, fam, sel, truth = _filled(tmp_path)
    text = report_grids.render_grids(tmp_path, {}, design)
    n, h = fam.middle
    title = f"{n} training samples per client, {h} (middle cell: selection ran here)"
    cac = _row(text, title, "fedcac")
    a, ref = np.array(truth[("fedcac", n, h)]), np.array(truth[("local", n, h)])
    assert cac[1] == f"`{sel['fedcac'].chosen}`"
    assert cac[2] == f"{a.mean():.4f} ({a.min():.4f}-{a.max():.4f})"
    assert cac[3] == _points(a - ref) and cac[4] == f"{(a > ref).sum()}/3"
    avg = np.array(truth[("fedavg", n, h)])
    assert cac[5] == _points(a - avg) and cac[6] == f"{(a > avg).sum()}/3"
    assert _row(text, title, "local")[3:5] == ["", ""]  # no difference to itself
    # PI-FL is scored on another part of the test split (same training data): shown, marked
    pifl = _row(text, title, "pifl")
    assert pifl[3] == _points(np.array(truth[("pifl", n, h)]) - ref) + " †"
    assert not cac[3].endswith("†")
    # away from the middle, FedAvg was not run
    other = next(c for c in fam.cells() if c != fam.middle)
    assert _row(text, f"{other[0]} training samples per client, {other[1]}", "fedavg")[2] == "not run"
    assert _row(text, f"{other[0]} training samples per client, {other[1]}", "fedcac")[5] == "fedavg not run"


def test_runs_on_different_data_are_not_paired(tmp_path):
    design, fam, sel, truth = _filled(tmp_path)
    n, h = fam.middle
    write_grid(tmp_path, fam, "fedcac", sel["fedcac"].chosen, n, h, truth[("fedcac", n, h)], num_examples=(31, 40, 50))
    write_grid(tmp_path, fam, "pifl", sel["pifl"].chosen, n, h, truth[("pifl", n, h)], num_examples=(31, 40, 50))
    text = report_grids.render_grids(tmp_path, {}, design)
    title = f"{n} training samples per client, {h} (middle cell: selection ran here)"
    cac, pifl = _row(text, title, "fedcac"), _row(text, title, "pifl")
    assert cac[3] == "no paired Δ (seed 0: the runs' data differ (data fingerprints disagree))" and cac[4] == "—"
    assert pifl[3].startswith("no paired Δ") and "data differ" in pifl[3]  # another test split is no excuse then


def test_records_of_an_earlier_selection_are_counted_and_left_out(tmp_path):
    design, fam, sel, _ = _filled(tmp_path)
    n, h = fam.middle
    other = next(
        families.setting_label(s)
        for s in fam.row("local").settings(fam.lrs)
        if families.setting_label(s) != sel["local"].chosen
    )
    write_grid(tmp_path, fam, "local", other, n, h, [0.99, 0.99])
    text = report_grids.render_grids(tmp_path, {}, design)
    assert "2 grid records ran a setting that is not the method's chosen one" in text
    assert "0.99" not in text


def test_the_compute_the_grid_took_and_the_machine_load_are_stated(tmp_path):
    design, fam, sel, truth = _filled(tmp_path)
    h = fam.middle[1]
    write_grid(tmp_path, fam, "fedcac", sel["fedcac"].chosen, 25, h, truth[("fedcac", 25, h)], wall=4000.0)
    text = report_grids.render_grids(tmp_path, {}, design)
    selection = records.load_records(fam.select_grid, tmp_path)
    runs = records.load_records(fam.grid, tmp_path)
    wall = sum(r["wall-seconds"] for r in selection + runs)
    assert (
        f"Compute: {len(selection)} selection runs ({len(selection) * 30 / 60:.0f} min) and {len(runs)} grid runs"
        in text
    )
    assert f"{wall / 3600:.1f} h of wall time in all" in text
    loads = [r["wall-seconds"] / 10 for r in selection + runs]
    assert f"1-minute load average when a run started: median {np.median(loads):.1f}" in text


def test_without_records_the_section_says_the_grids_have_not_run_and_gives_the_command(tmp_path):
    text = report_grids.render_grids(tmp_path, {})
    assert 'The grids have not been run yet: run `benchmarks/run_committed.sh "grids"`' in text
    assert "|" not in text and report_grids.figures_grids(tmp_path) == []
    # one family run, the other not: the other names its own command
    write_selection(
        tmp_path,
        tiny()["label-skew"],
        {"local": [0.5] * 4, "fedavg": [0.5] * 4, "fedcac": [0.5] * 4, "pifl": [0.5] * 4},
    )
    text = report_grids.render_grids(tmp_path, {})
    assert 'Not run yet: run `benchmarks/run_committed.sh "grids --families feature-shift"`' in text
    assert "| fedper | — | not run: selection incomplete (0 of 8 runs)" in text  # a method of the full design


def test_the_figure_draws_one_line_per_method_through_the_mean_and_spread_over_seeds(tmp_path):
    design, fam, _, truth = _filled(tmp_path)
    (fig,) = report_grids.figures_grids(tmp_path, design)
    samples, het = fig.panels
    n, h = fam.middle
    assert samples.xticks == [str(s) for s in fam.samples] and het.xticks == list(fam.heterogeneity)
    for panel in (samples, het):
        assert [line.label for line in panel.lines] == ["local", "fedavg", "fedcac", "pifl"]
    cac = samples.lines[2]
    accs = [truth[("fedcac", s, h)] for s in fam.samples]
    assert cac.x == [0, 1] and cac.y == pytest.approx([np.mean(a) for a in accs])
    assert cac.lo == pytest.approx([min(a) for a in accs]) and cac.hi == pytest.approx([max(a) for a in accs])
    middle = list(fam.heterogeneity).index(h)
    assert het.lines[1].x == [middle]  # FedAvg: the middle cell only
    assert het.lines[0].y == pytest.approx([np.mean(truth[("local", n, x)]) for x in fam.heterogeneity])
    assert f"]({fig.file})" in report_grids.render_grids(tmp_path, {}, design)  # the section shows it


def test_report_check_draws_the_grids_figure_and_finds_it_stale_when_a_record_changes(tmp_path):
    raw, out = tmp_path / "raw", tmp_path / "out"
    out.mkdir()
    _, fam, sel, _ = _filled(raw)
    assert "grids-label-skew.png" in reporting.stale_figures(raw, out)  # not drawn yet
    for fig in reporting.build_figures(raw):
        figures.draw(fig, out)
    assert reporting.stale_figures(raw, out) == []
    n, h = fam.middle
    write_grid(raw, fam, "fedcac", sel["fedcac"].chosen, n, h, [0.1, 0.2, 0.3])
    assert reporting.stale_figures(raw, out) == ["grids-label-skew.png"]
    assert "## When each method pays off" in reporting.build(raw)  # a section of RESULTS.md


def test_the_smoke_rehearsal_prints_its_section_and_draws_its_figure(tmp_path, capsys):
    design, *_ = _filled(tmp_path)
    grids.print_smoke(design, tmp_path)
    printed = capsys.readouterr().out
    assert "### Label skew" in printed and "#### Selection" in printed
    assert (tmp_path / "grids-label-skew.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


class FakeBench:
    """Stands in for running.Bench: records what it was asked to run and answers with a record (failed if told)."""

    def __init__(self, fail: bool = False) -> None:
        self.grid, self.fail = "grids", fail
        self.ran: list[dict[str, Any]] = []

    def run(self, cell: dict[str, Any], cfg: dict[str, Any], clients: int) -> dict[str, Any]:
        self.ran.append(cell)
        return record(self.grid, cell, 0.5, error="RuntimeError: the SuperLink is gone" if self.fail else None)


def test_runs_with_a_record_are_skipped_and_failed_ones_rerun_only_when_asked(tmp_path, capsys):
    # the plan the script prints (--dry-run) counts what is left to run: 3 failed and 2 good records of its 8
    # selection runs leave 3 to do, or 6 with --retry-failed
    fam = grids.restrict(families.FAMILIES, ["label-skew"], ["local", "fedavg"], [])["label-skew"]
    runs = families.selection_runs(fam, [0])
    assert len(runs) == 8
    running.run_all(runs[:3], FakeBench(fail=True), tmp_path, running.Progress(3))
    running.run_all(runs[3:5], FakeBench(), tmp_path, running.Progress(2))
    assert "progress 2/2 runs" in capsys.readouterr().out
    plan = ["--dry-run", "--raw-dir", str(tmp_path), "--families", "label-skew", "--methods", "local,fedavg"]
    plan += ["--select-seeds", "0", "--seeds", "0", "--seconds-per-run", "10"]
    grids.main(plan)
    assert "plan: 8 selection runs (3 to do)" in capsys.readouterr().out
    grids.main([*plan, "--retry-failed"])
    assert "plan: 8 selection runs (6 to do)" in capsys.readouterr().out


def test_the_script_stops_when_runs_keep_failing(tmp_path):
    fam = tiny()["label-skew"]
    runs = families.selection_runs(fam, [0])
    bench = FakeBench(fail=True)
    with pytest.raises(SystemExit, match="5 runs in a row failed"):
        running.run_all(runs, bench, tmp_path, running.Progress(len(runs)))
    assert len(bench.ran) == running.MAX_FAILURES_IN_A_ROW < len(runs)


def test_smoke_records_never_go_to_the_committed_raw_folder():
    with pytest.raises(SystemExit, match="scratch --raw-dir"):
        grids.main(["--smoke", "--dry-run"])

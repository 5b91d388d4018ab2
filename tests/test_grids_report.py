"""The equal-tuning grids (benchmarks/grids.py) and their report (benchmarks/grids_report.py) on synthetic records:
selection on validation scores only, every method with the same budget, the chosen setting held across the grid,
paired differences only between runs on the same data, and partial grids shown as such."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"
sys.path.insert(0, str(BENCH))

import grids
import grids_report
from common import _fingerprint, write_record


def tiny() -> dict[str, grids.Family]:
    fam = grids.FAMILIES["label-skew"]
    rows = tuple(r for r in fam.rows if r.name in ("local", "fedavg", "fedcac", "pifl"))
    return {"label-skew": replace(fam, rows=rows, samples={25: {}, 50: {}}, heterogeneity=dict(fam.heterogeneity))}


def record(grid, cell, acc, *, num_examples=(30, 40, 50), test_examples=(9, 9, 9), error=None, config=None):
    clients = {
        "columns": ["client", "num-examples", "personal-acc", "test-examples"],
        "rows": [[i, n, acc, t] for i, (n, t) in enumerate(zip(num_examples, test_examples))],
    }
    return {
        "schema": 1,
        "grid": grid,
        "cell": cell,
        "command": "python benchmarks/grids.py",
        "run": None,
        "num-supernodes": len(num_examples),
        "error": error,
        "code": {"commit": "0123456789abcdef", "dirty": False},
        "machine": {"cores": 2, "memory-gib": 24, "gpu": False, "python": "3.11", "flwr": "1.41.0", "torch": "2"},
        "run-config": {"val-fraction": 0.2, **(config or {})},
        "overrides": ["val-fraction", *(config or {})],
        "summary": {"personal-acc": None if error else acc},
        "rounds": [],
        "clients": clients if not error else {"columns": [], "rows": []},
        "artefacts": {},
        "fingerprint": _fingerprint(clients, [], {}),
        "wall-seconds": 30.0,
    }


def write_selection(raw, fam, scores: dict[str, list[float]], seeds=(0, 1)):
    """``scores[row]``: one validation accuracy per setting of the row (the same for every seed + a seed offset)."""
    for row in fam.rows:
        for s in seeds:
            for setting, base in zip(row.settings(fam.lrs), scores[row.name]):
                cell = {"method": row.name, "setting": grids.setting_label(setting), "seed": s}
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
        for name, f in grids.FAMILIES.items()
    }
    for fam in design.values():
        chosen = {r.name: grids.setting_label(s) for r in fam.rows for s in r.settings(fam.lrs)[-1:]}
        grids.check_configs(grids.selection_runs(fam, [0]) + grids.grid_runs(fam, chosen, [0], True))
        grids.check_configs(grids.grid_runs(fam, chosen, [0], False))
    bad = replace(design["label-skew"], rows=(grids.Row("pifl", {"method": "pifl"}, "tiers", (2, 11)),))
    with pytest.raises(SystemExit, match="label-skew / pifl: .*tiers=11"):
        grids.check_configs(grids.selection_runs(bad, [0]))


def test_every_method_of_a_family_gets_the_same_number_of_settings_and_selection_never_scores_on_test():
    for fam in grids.FAMILIES.values():
        sizes = {len(r.settings(fam.lrs)) for r in fam.rows}
        assert len(sizes) == 1 and 4 <= sizes.pop() <= 9  # lr and one key, 2-3 values each
        for r in fam.rows:
            assert r.key != "lr" and 2 <= len(r.values) <= 3 and 2 <= len(fam.lrs) <= 3
        runs = grids.selection_runs(fam, [0, 1])
        assert len(runs) == 2 * sum(len(r.settings(fam.lrs)) for r in fam.rows)
        n, h = fam.middle
        for run in runs:
            assert run.config["evaluate-split"] == "validation"
            assert run.config["train-samples"] == n and run.cell["seed"] == run.config["seed"]
            assert {k: run.config[k] for k in fam.heterogeneity[h]} == fam.heterogeneity[h]
        # seed by seed: the first seed of every method comes before the second of any
        assert [r.cell["seed"] for r in runs] == sorted(r.cell["seed"] for r in runs)


def test_grid_runs_use_the_chosen_setting_on_the_test_split_middle_cell_first():
    fam = grids.FAMILIES["feature-shift"]
    chosen = {r.name: grids.setting_label(r.settings(fam.lrs)[-1]) for r in fam.rows if r.name != "moon"}
    middle = grids.grid_runs(fam, chosen, [0, 1, 2], middle=True)
    rest = grids.grid_runs(fam, chosen, [0, 1, 2], middle=False)
    assert {(r.cell["samples"], r.cell["heterogeneity"]) for r in middle} == {fam.middle}
    assert fam.middle not in {(r.cell["samples"], r.cell["heterogeneity"]) for r in rest}
    assert len(middle) + len(rest) == 3 * len(chosen) * len(fam.cells())
    for run in middle + rest:
        row = fam.row(run.cell["method"])
        assert "evaluate-split" not in run.config  # the app's default: the test split
        assert run.cell["method"] != "moon"  # no setting chosen yet: no grid run
        assert {k: run.config[k] for k in ("lr", row.key)} == grids.setting_of(fam, row, chosen[row.name])
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
    sel = grids.selections(fam, tmp_path)
    assert sel["local"].chosen == grids.setting_label(fam.row("local").settings(fam.lrs)[1])
    assert sel["fedavg"].chosen == grids.setting_label(fam.row("fedavg").settings(fam.lrs)[0])
    assert sel["local"].mean(sel["local"].chosen) == pytest.approx(0.7005)


def test_a_failed_setting_cannot_be_chosen_and_a_missing_run_leaves_the_method_unselected(tmp_path):
    fam = tiny()["label-skew"]
    write_selection(
        tmp_path,
        fam,
        {"local": [0.5, 0.7, 0.6, 0.1], "fedavg": [0.8] * 4, "fedcac": [0.1] * 4, "pifl": [0.3] * 4},
    )
    best = grids.setting_label(fam.row("local").settings(fam.lrs)[1])
    cell = {"method": "local", "setting": best, "seed": 1}
    write_record(record(fam.select_grid, cell, 0.0, error="RuntimeError: boom"), tmp_path)
    other = grids.setting_label(fam.row("pifl").settings(fam.lrs)[2])
    (tmp_path / fam.select_grid / f"{grids.cell_name({'method': 'pifl', 'setting': other, 'seed': 0})}.json").unlink()
    sel = grids.selections(fam, tmp_path)
    assert sel["local"].chosen == grids.setting_label(fam.row("local").settings(fam.lrs)[2])
    assert sel["pifl"].chosen is None and "incomplete" in sel["pifl"].reason
    text = grids_report.render(tmp_path, tiny())
    assert "failed" in text and "selection incomplete (7 of 8 runs)" in text


# =========================================================================== the report
def _filled(tmp_path):
    design = tiny()
    fam = design["label-skew"]
    write_selection(
        tmp_path, fam, {"local": [0.5, 0.7, 0.6, 0.1], "fedavg": [0.8] * 4, "fedcac": [0.9] * 4, "pifl": [0.3] * 4}
    )
    sel = grids.selections(fam, tmp_path)
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


def test_each_cell_shows_mean_spread_setting_and_paired_differences_with_wins(tmp_path):
    design, fam, sel, truth = _filled(tmp_path)
    text = grids_report.render(tmp_path, design)
    n, h = fam.middle
    title = f"{n} training samples per client, {h} (middle cell: selection ran here)"
    cac = _row(text, title, "fedcac")
    a, ref = np.array(truth[("fedcac", n, h)]), np.array(truth[("local", n, h)])
    assert cac[1] == f"`{sel['fedcac'].chosen}`"
    assert cac[2] == f"{a.mean():.3f} ± {a.std():.3f} (n=3)"
    d = a - ref
    assert cac[3] == f"{d.mean() * 100:+.1f} ± {d.std() * 100:.1f} pts, wins {(d > 0).sum()}/3"
    d2 = a - np.array(truth[("fedavg", n, h)])
    assert cac[4] == f"{d2.mean() * 100:+.1f} ± {d2.std() * 100:.1f} pts, wins {(d2 > 0).sum()}/3"
    # PI-FL is scored on another part of the test split (same training data): shown, marked
    assert _row(text, title, "pifl")[3].endswith("†")
    # away from the middle, FedAvg was not run
    other = next(c for c in fam.cells() if c != fam.middle)
    row = _row(text, f"{other[0]} training samples per client, {other[1]}", "fedavg")
    assert row[2] == "not run"
    assert _row(text, f"{other[0]} training samples per client, {other[1]}", "fedcac")[4] == "fedavg not run"


def test_runs_on_different_data_are_not_paired(tmp_path):
    design, fam, sel, truth = _filled(tmp_path)
    n, h = fam.middle
    write_grid(tmp_path, fam, "fedcac", sel["fedcac"].chosen, n, h, truth[("fedcac", n, h)], num_examples=(31, 40, 50))
    text = grids_report.render(tmp_path, design)
    row = _row(text, f"{n} training samples per client, {h} (middle cell: selection ran here)", "fedcac")
    assert row[3].startswith("no paired Δ") and "data" in row[3]


def test_records_of_an_earlier_selection_are_counted_and_left_out(tmp_path):
    design, fam, sel, _ = _filled(tmp_path)
    n, h = fam.middle
    other = next(
        grids.setting_label(s)
        for s in fam.row("local").settings(fam.lrs)
        if grids.setting_label(s) != sel["local"].chosen
    )
    write_grid(tmp_path, fam, "local", other, n, h, [0.99, 0.99])
    text = grids_report.render(tmp_path, design)
    assert "2 grid record(s) ran a setting that is not the method's chosen one" in text
    assert "0.990" not in text


def test_an_empty_raw_folder_renders_every_cell_as_not_run_and_still_draws(tmp_path):
    text = grids_report.render(tmp_path, tiny())
    assert "not run: selection incomplete" in text and "| local |" in text
    paths = grids_report.plots(tmp_path, tmp_path / "png", tiny())
    assert sorted(p.name for p in paths) == ["grids-label-skew-heterogeneity.png", "grids-label-skew-samples.png"]
    assert all(p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)


def test_the_pictures_draw_one_line_per_method_with_records(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    design, fam, _, truth = _filled(tmp_path)
    drawn = []
    real = plt.Axes.errorbar

    def spy(self, x, y, *a, **kw):
        drawn.append((kw.get("label"), list(y), list(kw.get("yerr"))))
        return real(self, x, y, *a, **kw)

    monkeypatch.setattr(plt.Axes, "errorbar", spy)
    grids_report.plots(tmp_path, tmp_path / "png", design)
    n, h = fam.middle
    by_label = {}  # label -> [(samples picture), (heterogeneity picture)]
    for label, y, err in drawn:
        by_label.setdefault(label, []).append((y, err))
    assert set(by_label) == {"local", "fedavg", "fedcac", "pifl"}
    y, err = by_label["fedcac"][0]  # the samples picture: one point per samples value
    expected = [np.mean(truth[("fedcac", s, h)]) for s in fam.samples]
    assert y == pytest.approx(expected) and err == pytest.approx([np.std(truth[("fedcac", s, h)]) for s in fam.samples])
    assert [len(y) for y, _ in by_label["fedavg"]] == [1, 1]  # FedAvg: the middle cell only, in both pictures
    het_y, _ = by_label["local"][1]
    assert het_y == pytest.approx([np.mean(truth[("local", n, x)]) for x in fam.heterogeneity])


class FakeBench:
    """Stands in for common.Bench: records what it was asked to run and answers with a record (failed if told)."""

    def __init__(self, fail: bool = False) -> None:
        self.grid, self.fail, self.ran = "grids", fail, []

    def run(self, cell, cfg, clients):
        self.ran.append(cell)
        return record(self.grid, cell, 0.5, error="RuntimeError: the SuperLink is gone" if self.fail else None)


def test_runs_with_a_record_are_skipped_and_failed_ones_rerun_only_when_asked(tmp_path, capsys):
    fam = tiny()["label-skew"]
    runs = grids.selection_runs(fam, [0])
    grids.run_all(runs[:3], FakeBench(fail=True), tmp_path, grids.Progress(3))
    grids.run_all(runs[3:5], FakeBench(), tmp_path, grids.Progress(2))
    assert [grids._done(r, tmp_path, retry_failed=False) for r in runs[:6]] == [True] * 5 + [False]
    assert [grids._done(r, tmp_path, retry_failed=True) for r in runs[:6]] == [False] * 3 + [True] * 2 + [False]
    assert "progress 2/2 runs" in capsys.readouterr().out


def test_the_script_stops_when_runs_keep_failing(tmp_path):
    fam = tiny()["label-skew"]
    runs = grids.selection_runs(fam, [0])
    bench = FakeBench(fail=True)
    with pytest.raises(SystemExit, match="5 runs in a row failed"):
        grids.run_all(runs, bench, tmp_path, grids.Progress(len(runs)))
    assert len(bench.ran) == grids.MAX_FAILURES_IN_A_ROW < len(runs)


def test_smoke_records_never_go_to_the_committed_raw_folder():
    with pytest.raises(SystemExit, match="scratch --raw-dir"):
        grids.main(["--smoke", "--dry-run"])

"""The equal-tuning grids (benchmarks/grids.py, benchmarks/families.py) and their section of RESULTS.md
(benchmarks/reporting/grids.py) on synthetic records: every method with the same shared keys and the same number of
values of its own, selection on validation scores over several seeds only, the learning rate extended while the
choice sits at an edge, the chosen setting held across the grid, paired differences with intervals only between
runs on the same data, the spread over clients, partial grids shown as such, records of a superseded procedure
marked, the compute stated, and the figures checked by ``report.py --check``."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from benchmarks import families, grids, protocol, records, reporting, running
from benchmarks.records import write_record
from benchmarks.reporting import figures
from benchmarks.reporting import grids as report_grids
from benchmarks.reporting.grids import FamilyRecords
from benchmarks.running import fingerprint

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
ROWS = ("local", "fedavg", "fedcac", "pifl")


def tiny(**over: Any) -> dict[str, families.Family]:
    """The label-skew family with four rows, two samples values, two learning rates (no extension by default)."""
    fam = families.FAMILIES["label-skew"]
    rows = tuple(r for r in fam.rows if r.name in ROWS)
    kw: dict[str, Any] = {"lrs": (0.01, 0.05), "ladder": (), "seeds": (0, 1, 2)} | over
    return {"label-skew": replace(fam, rows=rows, samples={25: {}, 50: {}}, **kw)}


MACHINE = {"cores": 2, "memory-gib": 24, "gpu": False, "python": "3.11", "flwr": "1.41.0", "torch": "2"}


def record(grid, cell, acc, *, num_examples=(30, 40, 50), test_examples=None, rounds=(), error=None, config=None, **kw):
    """A synthetic record (``kw``: ``wall`` seconds of ``flwr run``, ``seconds`` of ServerApp time, ``client_accs``
    per-client accuracies whose mean is the record's accuracy, ``summary`` keys to add)."""
    wall, tests = kw.get("wall", 30.0), test_examples or [9] * len(num_examples)
    accs = kw.get("client_accs") or [acc] * len(num_examples)
    clients = {
        "columns": ["client", "num-examples", "personal-acc", "test-examples"],
        "rows": [[i, n, a, t] for i, (n, a, t) in enumerate(zip(num_examples, accs, tests, strict=True))],
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
        "summary": {"personal-acc": None if error else float(np.mean(accs)), "seconds": kw.get("seconds", 10.0)}
        | kw.get("summary", {}),
        "rounds": list(rounds),
        "clients": clients if not error else {"columns": [], "rows": []},
        "artefacts": {},
        "failures": {"count": kw.get("failures", 0), "first": []},
        "fingerprint": fingerprint(clients, [], {}),
        "wall-seconds": wall,
    }


def write_selection(raw, fam, scores: dict[str, list[float]], seeds=None, lrs=None):
    """``scores[row]``: one validation accuracy per setting of the row (the same for every seed + a seed offset)."""
    for row in fam.rows:
        for i, s in enumerate(fam.select_seeds if seeds is None else seeds):
            for setting, base in zip(fam.settings(row, lrs), scores[row.name], strict=False):
                cell = {"method": row.name, "setting": families.setting_label(setting), "seed": s}
                write_record(
                    record(fam.select_grid, cell, base + 0.001 * i, config={"evaluate-split": "validation"}), raw
                )


def write_grid(raw, fam, row, setting, samples, het, accs, **kw):
    for seed, a in enumerate(accs):
        cell = {"samples": samples, "heterogeneity": het, "method": row, "setting": setting, "seed": seed}
        write_record(record(fam.grid, cell, a, **kw), raw)


# =========================================================================== the plan (families.py, grids.py)
def test_every_planned_run_config_is_one_the_app_accepts():
    from task.methods import METHODS

    design = grids.runnable(
        {
            name: replace(f, rows=tuple(r for r in f.rows if r.config["method"] in METHODS))
            for name, f in families.FAMILIES.items()
        }
    )
    assert {"label-skew", "feature-shift", "domain-per-client"} <= set(design)
    for fam in design.values():
        chosen = {r.name: families.setting_label(fam.tuning.settings(r)[-1]) for r in fam.rows}
        protocol.check_configs(families.selection_runs(fam, [0]) + families.grid_runs(fam, chosen, [0], True))
        protocol.check_configs(families.grid_runs(fam, chosen, [0], False))
    bad = replace(design["label-skew"], rows=(families.Row("pifl", {"method": "pifl"}, "tiers", (2, 11)),))
    with pytest.raises(SystemExit, match=r"label-skew / pifl: .*tiers=11"):
        protocol.check_configs(families.selection_runs(bad, [0]))


def test_a_family_whose_keys_the_app_lacks_is_left_out_with_a_message(capsys):
    design = grids.runnable(families.FAMILIES, known={"method", "seed"})
    assert "many-clients" not in design and "newcomers" not in design and "label-skew" in design
    out = capsys.readouterr().out
    assert "many-clients: left out: the app has no run-config key size-sigma" in out


def test_every_method_gets_the_same_shared_keys_and_the_same_number_of_values_of_its_own():
    defaults = records.run_config_defaults()
    for fam in families.FAMILIES.values():
        tuning = fam.tuning
        # the learning rates bracket the app's default; the local epochs are tuned by every method
        assert min(tuning.lrs) < defaults["lr"] < max(tuning.lrs)
        assert len(tuning.epochs) >= 2 and defaults["local-epochs"] in tuning.epochs
        for r in fam.rows:
            settings = tuning.settings(r)
            assert {s["lr"] for s in settings} == set(tuning.lrs)
            assert {s["local-epochs"] for s in settings} == set(tuning.epochs)
            if r.key is None:
                assert len(settings) == len(tuning.lrs) * len(tuning.epochs)
                continue
            # at most one key of its own, never a shared one, with the same number of values, one of them the
            # app's default (the rule the values were fixed by, written beside them)
            assert r.key not in ("lr", "local-epochs") and len(r.values) == families.OWN_VALUES
            assert defaults[r.key] in r.values and r.rule
            assert len(settings) == len(tuning.lrs) * len(tuning.epochs) * families.OWN_VALUES
        if fam.tuned_from is not None:  # a family that is not tuned again runs rows its source selected
            assert {r.name for r in fam.rows} <= {r.name for r in fam.tuned_from.rows}
            assert families.selection_runs(fam) == []
    # selection at two seeds at least, none of them a grid seed
    for fam in families.FAMILIES.values():
        assert len(fam.tuning.select_seeds) >= 2 and not set(fam.tuning.select_seeds) & set(fam.seeds)


def test_selection_runs_score_on_validation_at_the_middle_cell_seed_by_seed():
    fam = families.FAMILIES["label-skew"]
    runs = families.selection_runs(fam)
    assert len(runs) == len(fam.select_seeds) * sum(len(fam.settings(r)) for r in fam.rows)
    n, h = fam.middle
    for run in runs:
        assert run.config["evaluate-split"] == "validation"
        assert run.config["train-samples"] == n and run.cell["seed"] == run.config["seed"]
        assert {k: run.config[k] for k in fam.heterogeneity[h]} == fam.heterogeneity[h]
        assert run.config["local-epochs"] in fam.epochs and run.config["lr"] in fam.lrs
    # seed by seed: the first seed of every method comes before the second of any
    assert [r.cell["seed"] for r in runs] == sorted(r.cell["seed"] for r in runs)


def test_grid_runs_use_the_chosen_setting_on_the_test_split_middle_cell_first():
    fam = families.FAMILIES["feature-shift"]
    chosen = {r.name: families.setting_label(fam.settings(r)[-1]) for r in fam.rows if r.name != "moon"}
    middle = families.grid_runs(fam, chosen, [0, 1, 2], middle=True)
    rest = families.grid_runs(fam, chosen, [0, 1, 2], middle=False)
    assert {(r.cell["samples"], r.cell["heterogeneity"]) for r in middle} == {fam.middle}
    assert fam.middle not in {(r.cell["samples"], r.cell["heterogeneity"]) for r in rest}
    assert len(middle) + len(rest) == 3 * len(chosen) * len(fam.cells())
    for run in middle + rest:
        row = fam.row(run.cell["method"])
        assert "evaluate-split" not in run.config  # the app's default: the test split
        assert run.cell["method"] != "moon"  # no setting chosen yet: no grid run
        setting = families.setting_of(fam, row, chosen[row.name])
        assert {k: run.config[k] for k in setting} == setting
        assert run.config["train-samples"] == run.cell["samples"]
        assert run.config["seed"] == run.cell["seed"] and run.config["method"] == row.config["method"]
    # the samples axis: only the largest value needs copies of the data set
    copies = {r.cell["samples"]: r.config.get("data-copies", 1) for r in rest}
    assert copies[max(copies)] > 1 and all(v == 1 for k, v in copies.items() if k != max(copies))


def test_the_federations_users_run():
    many, one, new = (families.FAMILIES[n] for n in ("many-clients", "domain-per-client", "newcomers"))
    assert many.clients >= 100 and many.base["fraction-train"] <= 0.1 and many.base["partition"] == "quantity-dirichlet"
    assert {h["size-sigma"] for h in many.heterogeneity.values()} >= {0.0} and len(many.heterogeneity) == 2
    from task.data.catalogue import DOMAINS

    assert one.clients == len(DOMAINS) == one.base["feature-shift"] and {"fedbn", "ditto"} <= {r.name for r in one.rows}
    assert 0 < new.base["holdout-clients"] < new.clients


def test_mnist1d_runs_the_label_skew_and_the_100_client_families_tuned_on_its_own_selection():
    """A second data set away from the ceiling: the same rows, cells and tuning as label skew on digits, tuned again on
    MNIST-1D (never on digits' choices), and the 100-client federation with MNIST-1D's choices; no run copies data."""
    digits, skew = families.FAMILIES["label-skew"], families.FAMILIES["mnist1d-label-skew"]
    many = families.FAMILIES["mnist1d-many-clients"]
    assert skew.rows == digits.rows and skew.cells() == digits.cells() and skew.tuned_from is None
    assert skew.select_grid not in (digits.select_grid, digits.grid) and skew.grid != digits.grid
    assert many.tuned_from is skew and many.select_grid == skew.select_grid
    assert many.clients == families.MANY_CLIENTS.clients and many.heterogeneity == families.MANY_CLIENTS.heterogeneity
    runs = families.selection_runs(skew) + [
        r for fam in (skew, many) for r in families.grid_runs(fam, {"local": "lr=0.05 local-epochs=1"}, [0], False)
    ]
    assert runs and all(r.config["dataset"] == "mnist1d" and r.config.get("data-copies", 1) == 1 for r in runs)
    assert {r.grid for r in runs} == {skew.select_grid, skew.grid, many.grid}


# =========================================================================== selection
def test_a_setting_is_chosen_on_mean_validation_accuracy_over_the_selection_seeds_ties_going_to_the_first(tmp_path):
    fam = tiny()["label-skew"]
    n = len(fam.settings(fam.row("local")))
    write_selection(
        tmp_path,
        fam,
        {"local": [0.5, 0.7, 0.6, 0.1], "fedavg": [0.8, 0.8, 0.2, 0.8], "fedcac": [0.1] * 8, "pifl": [0.3] * 8},
    )
    sel = FamilyRecords.load(fam, tmp_path).selection
    assert n == 4 and sel["local"].chosen == families.setting_label(fam.settings(fam.row("local"))[1])
    assert sel["fedavg"].chosen == families.setting_label(fam.settings(fam.row("fedavg"))[0])
    assert sel["local"].mean(sel["local"].chosen) == pytest.approx(0.7005)  # two seeds: 0.700, 0.701
    assert sel["local"].seeds == list(fam.select_seeds) and sel["local"].budget == 4


def test_a_failed_setting_cannot_be_chosen_and_a_missing_run_leaves_the_method_unselected(tmp_path):
    fam = tiny()["label-skew"]
    write_selection(
        tmp_path, fam, {"local": [0.5, 0.7, 0.6, 0.1], "fedavg": [0.8] * 4, "fedcac": [0.1] * 8, "pifl": [0.3] * 8}
    )
    best = families.setting_label(fam.settings(fam.row("local"))[1])
    cell = {"method": "local", "setting": best, "seed": fam.select_seeds[1]}
    write_record(record(fam.select_grid, cell, 0.0, error="RuntimeError: boom"), tmp_path)
    other = families.setting_label(fam.settings(fam.row("pifl"))[2])
    gone = {"method": "pifl", "setting": other, "seed": fam.select_seeds[0]}
    (tmp_path / fam.select_grid / f"{records.cell_name(gone)}.json").unlink()
    sel = FamilyRecords.load(fam, tmp_path).selection
    assert sel["local"].chosen == families.setting_label(fam.settings(fam.row("local"))[2])
    assert sel["pifl"].chosen is None and "incomplete" in sel["pifl"].reason
    text = report_grids.render_grids(tmp_path, {}, tiny())
    assert "failed" in text and "selection incomplete (15 of 16 runs)" in text


def test_a_learning_rate_chosen_at_an_edge_is_extended_until_the_choice_is_inside(tmp_path):
    fam = tiny(lrs=(0.01, 0.05), ladder=(0.005, 0.01, 0.05, 0.1, 0.2))["label-skew"]
    row = fam.row("local")
    # the best setting has the largest learning rate: the next one of the ladder must run before a choice
    write_selection(tmp_path, replace(fam, rows=(row,)), {"local": [0.5, 0.6, 0.7, 0.8]})
    sel = families.select(fam, row, records.load_records(fam.select_grid, tmp_path))
    assert sel.chosen is None and sel.pending == 0.1 and "lr=0.1 is to run next" in sel.reason
    ext = families.selection_runs(fam, lrs=[0.1], rows=[row])
    assert {r.config["lr"] for r in ext} == {0.1} and len(ext) == len(fam.epochs) * len(fam.select_seeds)
    # 0.1 is better still: 0.2 next; 0.2 is worse: the choice is 0.1, inside the grid, no edge
    write_selection(tmp_path, replace(fam, rows=(row,)), {"local": [0.85, 0.9]}, lrs=[0.1])
    sel = families.select(fam, row, records.load_records(fam.select_grid, tmp_path))
    assert sel.pending == 0.2
    write_selection(tmp_path, replace(fam, rows=(row,)), {"local": [0.1, 0.2]}, lrs=[0.2])
    sel = families.select(fam, row, records.load_records(fam.select_grid, tmp_path))
    assert sel.chosen == "lr=0.1 local-epochs=2" and sel.lrs == [0.01, 0.05, 0.1, 0.2] and not sel.edge
    assert sel.budget == 8
    # grids.py asks for exactly the runs a choice waits for
    assert protocol.extension_runs({"label-skew": replace(fam, rows=(row,))}, tmp_path) == []


def test_a_choice_at_the_end_of_the_ladder_is_kept_and_said_so(tmp_path):
    fam = tiny(lrs=(0.01, 0.05), ladder=(0.01, 0.05))["label-skew"]
    row = fam.row("local")
    write_selection(tmp_path, replace(fam, rows=(row,)), {"local": [0.5, 0.6, 0.7, 0.8]})
    sel = families.select(fam, row, records.load_records(fam.select_grid, tmp_path))
    assert sel.chosen == "lr=0.05 local-epochs=2" and sel.edge and sel.pending is None


def test_an_own_key_that_moves_nothing_is_flagged_in_the_selection_table(tmp_path):
    fam = tiny()["label-skew"]
    write_selection(
        tmp_path,
        fam,
        {
            "local": [0.5, 0.7, 0.6, 0.1],
            "fedavg": [0.8] * 4,
            "fedcac": [0.1, 0.1, 0.2, 0.2, 0.3, 0.3, 0.4, 0.4],  # beta: the same at every lr and local epochs
            "pifl": [0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8],
        },
    )
    fr = FamilyRecords.load(fam, tmp_path)
    assert fr.selection["fedcac"].key_moved(fam.settings(fam.row("fedcac"))) is False
    assert fr.selection["pifl"].key_moved(fam.settings(fam.row("pifl"))) is True
    assert fr.selection["local"].key_moved(fam.settings(fam.row("local"))) is None  # no key of its own
    table = report_grids.selection_table(fr)
    rows = {line.split("|")[1].strip(): line for line in table.splitlines() if line.startswith("| ")}
    assert "| **no** |" in rows["fedcac"] and "| yes |" in rows["pifl"]


def test_a_family_tuned_elsewhere_runs_the_settings_chosen_there(tmp_path):
    source = tiny()["label-skew"]
    fam = replace(families.FAMILIES["newcomers"], rows=source.rows, tuned_from=source)
    write_selection(
        tmp_path, source, {"local": [0.5, 0.7, 0.6, 0.1], "fedavg": [0.8] * 4, "fedcac": [0.1] * 8, "pifl": [0.3] * 8}
    )
    chosen = FamilyRecords.load(fam, tmp_path).selection
    assert chosen["local"].chosen == FamilyRecords.load(source, tmp_path).selection["local"].chosen
    runs = families.grid_runs(fam, {k: v.chosen for k, v in chosen.items() if v.chosen}, None, True)
    assert runs and all(r.grid == fam.grid and r.config["holdout-clients"] > 0 for r in runs)


def test_records_of_the_superseded_procedure_are_shown_under_it_until_the_plan_has_records(tmp_path):
    old = families.PREVIOUS["label-skew"]
    fam = families.FAMILIES["label-skew"]
    write_selection(tmp_path, old, {r.name: [0.5, 0.6, 0.7, 0.8] for r in old.rows})
    fr = FamilyRecords.load(fam, tmp_path)
    assert fr.superseded and fr.family is old and fr.selection["cfl"].chosen == "lr=0.05 cfl-eps2=1.6"
    text = report_grids.render_family(fr, {})
    assert "**These records ran a superseded procedure**" in text and old.superseded in text
    # one selection record of the current plan: the plan is read, the old records are not
    cell = {"method": "local", "setting": "lr=0.01 local-epochs=1", "seed": fam.select_seeds[0]}
    write_record(record(fam.select_grid, cell, 0.5), tmp_path)
    fr = FamilyRecords.load(fam, tmp_path)
    assert not fr.superseded and fr.selection["local"].chosen is None


# =========================================================================== the report
def peak(fam, row, lr: float = 0.05, at: int = 0) -> list[float]:
    """Validation scores of ``row``'s settings: 0.9 at the ``at``-th setting of learning rate ``lr``, 0.5 elsewhere."""
    settings = fam.settings(fam.row(row))
    best = [i for i, s in enumerate(settings) if s["lr"] == lr][at]
    return [0.9 if i == best else 0.5 for i in range(len(settings))]


def _filled(tmp_path):
    """Records of the full plan's label-skew selection (every row's best setting inside its learning-rate grid) and a
    grid of four rows on the tiny design."""
    design = tiny(lrs=families.LR)
    fam = design["label-skew"]
    write_selection(tmp_path, fam, {r: peak(fam, r) for r in ROWS})
    sel = FamilyRecords.load(fam, tmp_path).selection
    rng = np.random.default_rng(0)
    truth = {}
    for samples, het in fam.cells():
        for name in ROWS:
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


def test_each_cell_shows_accuracy_setting_paired_differences_with_intervals_and_the_spread(tmp_path):
    design, fam, sel, truth = _filled(tmp_path)
    text = report_grids.render_grids(tmp_path, {}, design)
    n, h = fam.middle
    title = f"{n} training samples per client, {h} (middle cell: selection ran here)"
    cac = _row(text, title, "fedcac")
    a, ref = np.array(truth[("fedcac", n, h)]), np.array(truth[("local", n, h)])
    assert cac[1] == f"`{sel['fedcac'].chosen}`"
    assert cac[2] == f"{a.mean():.4f} ({a.min():.4f}-{a.max():.4f})"
    # the paired difference is the mean of the per-seed differences, its interval around it
    point = cac[3].strip("*").split(" [")[0]
    assert point == f"{(a - ref).mean() * 100:+.1f}"
    lo, hi = (float(v) for v in cac[3].strip("*").split("[")[1].rstrip("]").split(","))
    assert lo <= float(point) <= hi
    assert cac[3].startswith("**") == (lo > 0 or hi < 0)  # bold where the interval excludes zero
    assert _row(text, title, "local")[3] == "" and _row(text, title, "fedavg")[4] == ""  # none to itself
    # PI-FL is scored on another part of the test split (same training data): shown, marked
    assert _row(text, title, "pifl")[3].rstrip("*").endswith("†")
    assert not cac[3].rstrip("*").endswith("†")
    # the spread over clients: every client has the run's accuracy here, so no spread, and the worst is the mean
    assert cac[5] == "0.000" and cac[6] == f"{np.mean(a):.3f}"
    worse = int(sum(a < ref)) * 3
    assert cac[8] == f"{worse / 9:.0%} ({worse} of 9)"
    # away from the middle, FedAvg was not run
    other = next(c for c in fam.cells() if c != fam.middle)
    assert _row(text, f"{other[0]} training samples per client, {other[1]}", "fedavg")[2] == "not run"
    assert _row(text, f"{other[0]} training samples per client, {other[1]}", "fedcac")[4] == "fedavg not run"
    # the size of the test sets, from the records
    assert "the test sets hold 27-27 examples per seed over 3 clients (9-9 per client)" in text


def test_runs_on_different_data_are_not_paired(tmp_path):
    design, fam, sel, truth = _filled(tmp_path)
    n, h = fam.middle
    write_grid(tmp_path, fam, "fedcac", sel["fedcac"].chosen, n, h, truth[("fedcac", n, h)], num_examples=(31, 40, 50))
    write_grid(tmp_path, fam, "pifl", sel["pifl"].chosen, n, h, truth[("pifl", n, h)], num_examples=(31, 40, 50))
    text = report_grids.render_grids(tmp_path, {}, design)
    title = f"{n} training samples per client, {h} (middle cell: selection ran here)"
    cac, pifl = _row(text, title, "fedcac"), _row(text, title, "pifl")
    assert cac[3] == "no interval (seed 0: the runs' data differ (data fingerprints disagree))"
    assert pifl[3].startswith("no interval") and "data differ" in pifl[3]  # another test split is no excuse then


def test_records_of_an_earlier_selection_are_counted_and_left_out(tmp_path):
    design, fam, sel, _ = _filled(tmp_path)
    n, h = fam.middle
    other = next(
        families.setting_label(s)
        for s in fam.settings(fam.row("local"))
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
    # RESULTS.md's compute section sums the same wall seconds per grid
    from benchmarks.reporting import compute

    table = compute.render_compute(tmp_path)
    assert f"| {fam.grid} | {len(runs)} | 0 | {wall_of(runs)} | {len(runs)} of {len(runs)} |" in table


def wall_of(recs) -> str:
    s = sum(r["wall-seconds"] for r in recs)
    return f"{s / 3600:.1f} h" if s >= 360 else f"{s / 60:.0f} min"


def test_every_method_states_its_budget_and_choice(tmp_path):
    design, fam, sel, _ = _filled(tmp_path)
    text = report_grids.render_grids(tmp_path, {}, design)
    for name in ROWS:
        row = _row(text, "Selection", name)
        assert row[2] == str(len(fam.settings(fam.row(name)))) and row[4].startswith(f"`{sel[name].chosen}`")
    assert "Every method is tuned over the learning rate (0.01, 0.05, 0.1) and the local epochs (1, 2)" in text


def test_without_records_the_section_says_the_grids_have_not_run_and_gives_the_command(tmp_path):
    text = report_grids.render_grids(tmp_path, {})
    assert 'The grids have not been run yet: run `benchmarks/run_committed.sh "grids"`' in text
    assert "|" not in text and report_grids.figures_grids(tmp_path) == []
    # one family run, the others not: each names its own command, and the keys it needs
    fam = families.FAMILIES["label-skew"]
    write_selection(tmp_path, replace(fam, rows=fam.rows[:1]), {"local": [0.5] * 6})
    text = report_grids.render_grids(tmp_path, {})
    assert "Not run yet (10 clients, 20 rounds, cells" in text
    assert 'run `benchmarks/run_committed.sh "grids --families feature-shift"`' in text
    assert "It needs the run-config key(s) `holdout-clients`." in text
    assert "| fedper | — | not run: selection incomplete (0 of 12 runs)" in text  # a method of the full design


def test_the_newcomers_table_reads_what_each_method_gave_a_held_out_client(tmp_path):
    source = tiny()["label-skew"]
    fam = replace(families.FAMILIES["newcomers"], rows=source.rows, tuned_from=source, samples={50: {}})
    write_selection(tmp_path, source, {"local": [0.5] * 4, "fedavg": [0.8] * 4, "fedcac": [0.9] * 8, "pifl": [0.3] * 8})
    sel = FamilyRecords.load(fam, tmp_path).selection
    n, h = fam.middle
    for name, (got, tuned) in {"fedavg": (0.5, 0.7), "fedcac": (0.4, 0.8)}.items():
        write_grid(
            tmp_path,
            fam,
            name,
            sel[name].chosen,
            n,
            h,
            [0.6, 0.6],
            summary={"newcomer-acc": got, "newcomer-finetuned-acc": tuned},
        )
    text = report_grids.render_family(FamilyRecords.load(fam, tmp_path), {})
    table = text.split("Held-out clients never train", 1)[1]
    assert "| fedcac | 0.400 (0.400-0.400) | 0.800 (0.800-0.800) |" in table
    assert "| local |" not in table  # no runs


def test_the_figures_draw_accuracy_and_the_paired_differences_with_their_intervals(tmp_path):
    design, fam, _, truth = _filled(tmp_path)
    acc, margins = report_grids.figures_grids(tmp_path, design)
    samples, het = acc.panels
    n, h = fam.middle
    assert samples.xticks == [str(s) for s in fam.samples] and het.xticks == list(fam.heterogeneity)
    assert samples.joined and not het.joined  # heterogeneity cells are categories: no line joins them
    assert acc.distinct and margins.distinct
    for panel in (samples, het):
        assert [line.label for line in panel.lines] == list(ROWS)
    cac = samples.lines[2]
    accs = [truth[("fedcac", s, h)] for s in fam.samples]
    assert cac.x == [0, 1] and cac.y == pytest.approx([np.mean(a) for a in accs])
    assert cac.lo == pytest.approx([min(a) for a in accs]) and cac.hi == pytest.approx([max(a) for a in accs])
    middle = list(fam.heterogeneity).index(h)
    assert het.lines[1].x == [middle]  # FedAvg: the middle cell only
    # the differences: one panel per reference, every cell a category, a rule at zero, the point inside its interval
    vs_local, vs_fedavg = margins.panels
    assert vs_local.zero and not vs_local.joined and len(vs_local.xticks) == len(fam.cells())
    line = next(x for x in vs_local.lines if x.label == "fedcac")
    d = (np.array(truth[("fedcac", n, h)]) - np.array(truth[("local", n, h)])).mean() * 100
    at = report_grids.axis_cells(FamilyRecords.load(fam, tmp_path)).index(fam.middle)
    assert vs_local.xticks[at] == f"{n}, {h}"
    i = line.x.index(at)
    assert line.y[i] == pytest.approx(d) and line.lo[i] <= line.y[i] <= line.hi[i]
    assert [x.label for x in vs_fedavg.lines] == ["local", "fedcac", "pifl"]
    section = report_grids.render_grids(tmp_path, {}, design)
    assert f"]({acc.file})" in section and f"]({margins.file})" in section


def test_report_check_draws_the_grids_figures_and_finds_them_stale_when_a_record_changes(tmp_path):
    raw, out = tmp_path / "raw", tmp_path / "out"
    out.mkdir()
    _, fam, sel, _ = _filled(raw)
    assert "grids-label-skew.png" in reporting.stale_figures(raw, out)  # not drawn yet
    for fig in reporting.build_figures(raw):
        figures.draw(fig, out)
    assert reporting.stale_figures(raw, out) == []
    n, h = fam.middle
    write_grid(raw, fam, "fedcac", sel["fedcac"].chosen, n, h, [0.1, 0.2, 0.3])
    assert reporting.stale_figures(raw, out) == ["grids-label-skew.png", "grids-label-skew-margins.png"]
    assert "## When each method pays off" in reporting.build(raw)  # a section of RESULTS.md


def test_the_smoke_rehearsal_prints_its_section_and_the_page_and_draws_its_figures(tmp_path, capsys):
    design, *_ = _filled(tmp_path)
    grids.print_smoke(design, tmp_path)
    printed = capsys.readouterr().out
    assert "### Label skew" in printed and "#### Selection" in printed and "## Label skew" in printed
    assert "### Fairness: the spread over clients" in printed
    for name in ("grids-label-skew.png", "grids-label-skew-margins.png"):
        assert (tmp_path / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


# =========================================================================== running (resumable)
class FakeBench:
    """Stands in for running.Bench: records what it was asked to run and answers with a record (failed if told)."""

    def __init__(self, fail: bool = False) -> None:
        self.grid, self.fail = "grids", fail
        self.ran: list[dict[str, Any]] = []

    def run(self, cell: dict[str, Any], cfg: dict[str, Any], clients: int) -> dict[str, Any]:
        self.ran.append(cell)
        return record(self.grid, cell, 0.5, error="RuntimeError: the SuperLink is gone" if self.fail else None)


def test_runs_with_a_record_are_skipped_failed_ones_rerun_only_when_asked_and_stale_ones_rerun(tmp_path, capsys):
    # the plan the script prints (--dry-run) counts what is left to run: 3 failed and 2 good records leave the
    # rest, and with --retry-failed the failed ones too
    fam = grids.restrict(families.FAMILIES, ["label-skew"], ["local", "fedavg"], [])["label-skew"]
    runs = families.selection_runs(fam)
    assert len(runs) == 2 * len(fam.lrs) * len(fam.epochs) * len(fam.select_seeds)
    running.run_all(runs[:3], FakeBench(fail=True), tmp_path, running.Progress(3))
    running.run_all(runs[3:5], FakeBench(), tmp_path, running.Progress(2))
    assert "progress 2/2 runs" in capsys.readouterr().out
    plan = ["--dry-run", "--raw-dir", str(tmp_path), "--families", "label-skew", "--methods", "local,fedavg"]
    plan += ["--seconds-per-run", "10", "--keep-stale"]
    grids.main(plan)
    out = capsys.readouterr().out
    assert f"{len(runs)} selection runs ({len(runs) - 5} left" in out and "h left of" in out
    grids.main([*plan, "--retry-failed"])
    assert f"{len(runs)} selection runs ({len(runs) - 2} left" in capsys.readouterr().out
    # a record whose method's code changed since its commit is run again
    todo = running.Todo(tmp_path, is_stale=lambda path: "fedavg" in path.name)
    left = todo.left(runs)
    good = [r for r in runs[3:5] if r.cell["method"] == "local"]
    assert all(r not in left for r in good) and todo.stale == sum(1 for r in runs[3:5] if r.cell["method"] == "fedavg")


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


def test_the_estimate_comes_from_a_timing_run_and_scales_to_the_planned_rounds(tmp_path):
    fam = families.FAMILIES["many-clients"]
    (fedavg, every) = protocol.timing_runs({"many-clients": fam})
    assert every.config["fraction-train"] == 1.0 and fedavg.config["fraction-train"] == fam.base["fraction-train"]
    assert fedavg.config["num-server-rounds"] == fam.base["eval-every"] + 1
    rounds = [{"round": i + 1, "seconds": s} for i, s in enumerate([20.0] + [2.0] * 10)]
    for run, scale in ((fedavg, 1.0), (every, 5.0)):
        rec = record(
            protocol.TIMING,
            run.cell,
            0.5,
            wall=70.0 * scale,
            rounds=[{**r, "seconds": r["seconds"] * scale} for r in rounds],
        )
        write_record(rec, tmp_path)
    per = grids.estimate(fam, tmp_path)
    assert per is not None
    # start-up 70 - 20 = 50 s, then 2 s per round over the 100 planned rounds (99 after the first)
    assert per["fedavg"] == pytest.approx(50 + 99 * 2.0)
    assert per["local"] == pytest.approx(5 * 50 + 99 * 10.0)  # Local trains every client every round


def test_a_family_without_fedavg_is_compared_with_local_only(tmp_path):
    """A rehearsal (or a family) may lack one reference: its tables and figures compare with the other."""
    fam = replace(
        tiny(lrs=families.LR)["label-skew"],
        rows=tuple(r for r in tiny()["label-skew"].rows if r.name in ("local", "fedcac")),
    )
    write_selection(tmp_path, fam, {r: peak(fam, r) for r in ("local", "fedcac")})
    sel = FamilyRecords.load(fam, tmp_path).selection
    n, h = fam.middle
    write_grid(tmp_path, fam, "local", sel["local"].chosen, n, h, [0.5, 0.6])
    write_grid(tmp_path, fam, "fedcac", sel["fedcac"].chosen, n, h, [0.7, 0.8])
    text = report_grids.render_grids(tmp_path, {}, {"label-skew": fam})
    assert _row(text, f"{n} training samples per client, {h} (middle cell: selection ran here)", "fedcac")[4] == (
        "fedavg not run"
    )
    [panel] = report_grids.margins_figure(FamilyRecords.load(fam, tmp_path)).panels  # type: ignore[union-attr]
    assert panel.title == "minus local"

"""Cross-CPU float noise (benchmarks/float_noise.py, benchmarks/reporting/float_noise.py) on synthetic records: a
method's move is its accuracy under another numeric setting minus the reference run's on the same seed and data; its
noise is the largest move; a paired difference's floor is how far that difference moved; the choosing page shows the
floor beside the interval and calls no win that is not larger than it; and the script's arms run the same configs
with only their numeric setting changed, the portable-kernels arm in a process of its own."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from benchmarks import float_noise as script
from benchmarks.records import write_record
from benchmarks.reporting import choosing, float_noise
from benchmarks.reporting.float_noise import GRID, REFERENCE, Noise
from benchmarks.reporting.grids import FamilyRecords

from .test_choosing import design, run, select_all
from .test_grids import record


def noise_run(raw: Path, context: str, method: str, arm: str, seed: int, acc: float, **kw) -> None:
    cell = {"context": context, "method": method, "arm": arm, "seed": seed}
    threads = 2 if arm == "threads-2" else 1
    rec = record(GRID, cell, acc, config={"method": method, "client-threads": threads}, **kw)
    rec["machine"]["cpu-capability"] = "DEFAULT" if arm == "kernels-default" else "AVX512"
    write_record(rec, raw)


def measured(raw: Path, context: str, accs: dict[str, dict[str, list[float]]]) -> None:
    """``accs[method][arm]``: its accuracy per seed under that arm."""
    for method, arms in accs.items():
        for arm, values in arms.items():
            for seed, acc in enumerate(values):
                noise_run(raw, context, method, arm, seed, acc)


def test_moves_noise_and_the_floor_of_a_paired_difference(tmp_path):
    measured(
        tmp_path,
        "label-skew",
        {
            "fedcac": {REFERENCE: [0.970, 0.900], "threads-2": [0.985, 0.895], "kernels-default": [0.960, 0.900]},
            "local": {REFERENCE: [0.800, 0.850], "threads-2": [0.800, 0.850], "kernels-default": [0.805, 0.850]},
            "fedavg": {REFERENCE: [0.900, 0.880], "threads-2": [0.900, 0.870]},
        },
    )
    noise = float_noise.load(tmp_path)["label-skew"]
    assert noise.moves["fedcac"] == pytest.approx(
        {("threads-2", 0): 0.015, ("threads-2", 1): -0.005, ("kernels-default", 0): -0.010, ("kernels-default", 1): 0.0}
    )
    assert noise.of("fedcac") == pytest.approx(0.015) and noise.of("local") == pytest.approx(0.005)
    assert noise.of("nosuch") is None
    # FedCAC - Local moved by 0.015 on seed 0 under two threads, by 0.015 on seed 0 under the portable kernels
    assert noise.floor("fedcac", "local") == pytest.approx(0.015)
    # FedAvg has no run under the portable kernels: only the arms both ran count
    assert noise.floor("fedcac", "fedavg") == pytest.approx(0.015) and noise.floor("local", "fedavg") == pytest.approx(
        0.01
    )
    assert noise.arms == ["kernels-default", "threads-2"]


def test_runs_that_cannot_be_compared_are_counted_not_used(tmp_path):
    measured(tmp_path, "defaults", {"fedcac": {REFERENCE: [0.9], "threads-2": [0.92]}})
    noise_run(tmp_path, "defaults", "fedcac", "kernels-default", 0, 0.5, error="Traceback\nRuntimeError: died")
    noise_run(tmp_path, "defaults", "fedcac", "threads-2", 1, 0.5)  # no reference run of seed 1
    noise_run(tmp_path, "defaults", "local", REFERENCE, 0, 0.8)
    noise_run(tmp_path, "defaults", "local", "threads-2", 0, 0.1, num_examples=(5, 6, 7))  # other data
    noise = float_noise.load(tmp_path)["defaults"]
    assert noise.moves == {"fedcac": pytest.approx({("threads-2", 0): 0.02})} and noise.unpaired == 3
    assert noise.floor("fedcac", "local") is None


def test_the_section_puts_each_move_in_points_with_the_settings_each_arm_ran(tmp_path):
    measured(
        tmp_path,
        "defaults",
        {
            "local": {REFERENCE: [0.80, 0.82], "threads-2": [0.80, 0.82]},
            "fedcac": {REFERENCE: [0.970, 0.90], "threads-2": [0.985, 0.89]},
        },
    )
    text = float_noise.render_float_noise(tmp_path, {})
    assert "`reference`: client-threads 1, CPU kernels AVX512" in text
    assert "`threads-2`: client-threads 2, CPU kernels AVX512" in text
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    # Local first (a reference), then the others; no FedAvg ran here, so no floor of a difference to it
    assert rows == [
        "| `local` | 0.810 | +0.00, +0.00 | 0.00 |  | — |",
        "| `fedcac` | 0.935 | +1.50, -1.00 | 1.50 | 1.50 | — |",
    ]
    assert "Not yet re-run" in float_noise.render_float_noise(tmp_path / "none", {})


def _cell_with_a_win(raw: Path):
    """FedCAC above Local by 8 points and above FedAvg by 9 at the middle cell, on every seed (test_choosing's win)."""
    fam = design()["label-skew"]
    chosen = select_all(raw, fam)
    run(raw, fam, chosen, "local", fam.middle, {0: 0.60, 1: 0.80, 2: 0.70})
    run(raw, fam, chosen, "fedavg", fam.middle, {0: 0.70, 1: 0.65, 2: 0.72})
    run(raw, fam, chosen, "fedcac", fam.middle, {0: 0.71, 1: 0.83, 2: 0.80})
    return fam


def test_a_win_not_larger_than_its_float_noise_is_not_called_a_win(tmp_path):
    fam = _cell_with_a_win(tmp_path)
    assert choosing.judgements(FamilyRecords.load(fam, tmp_path))[fam.middle]["fedcac"].win  # no noise measured
    # FedCAC's difference to FedAvg moves by 10 points between the arms: its 9-point win could be the CPU's
    measured(
        tmp_path,
        "label-skew",
        {
            "fedcac": {REFERENCE: [0.9], "threads-2": [0.8]},
            "local": {REFERENCE: [0.8], "threads-2": [0.8]},
            "fedavg": {REFERENCE: [0.8], "threads-2": [0.8]},
        },
    )
    fr = FamilyRecords.load(fam, tmp_path)
    assert fr.noise_context == "label-skew"
    j = choosing.judgements(fr)[fam.middle]["fedcac"]
    assert not j.win and j.status == "no win" and j.reason == "not larger than the float noise"
    assert j.floors == pytest.approx((0.10, 0.10))
    assert j.versus() == "vs Local +8.0 [+3.0, +11.0], vs FedAvg +9.0 [+1.0, +18.0] (float noise ±10.0 / ±10.0)"
    page = choosing.render_choosing(tmp_path, {fam.name: fam})
    assert "**FedCAC** wins nowhere" in page and "(float noise ±10.0 / ±10.0); not larger than the float noise" in page
    assert "Float noise (`benchmarks/float_noise.py`): context `label-skew`, arms `threads-2`" in page


def test_a_win_larger_than_its_float_noise_stays_a_win_and_shows_the_noise_beside_it(tmp_path):
    fam = _cell_with_a_win(tmp_path)
    measured(
        tmp_path,
        "label-skew",
        {
            "fedcac": {REFERENCE: [0.9, 0.9], "threads-2": [0.905, 0.9]},
            "local": {REFERENCE: [0.8, 0.8], "threads-2": [0.8, 0.799]},
            "fedavg": {REFERENCE: [0.8, 0.8], "threads-2": [0.8, 0.8]},
        },
    )
    j = choosing.judgements(FamilyRecords.load(fam, tmp_path))[fam.middle]["fedcac"]
    assert j.win and j.floors == pytest.approx((0.005, 0.005))
    assert "`fedcac` (vs Local +8.0 [+3.0, +11.0], vs FedAvg +9.0 [+1.0, +18.0] (float noise ±0.5 / ±0.5))" in (
        choosing.render_choosing(tmp_path, {fam.name: fam})
    )


def test_a_method_whose_noise_was_not_measured_keeps_its_win_and_says_so(tmp_path):
    fam = _cell_with_a_win(tmp_path)
    measured(tmp_path, "label-skew", {"local": {REFERENCE: [0.8], "threads-2": [0.8]}})
    j = choosing.judgements(FamilyRecords.load(fam, tmp_path))[fam.middle]["fedcac"]
    assert j.win and j.reason == "its float noise was not measured" and "(float noise ? / ?)" in j.versus()


def test_a_family_tuned_elsewhere_borrows_its_source_familys_noise(tmp_path):
    measured(tmp_path, "label-skew", {"local": {REFERENCE: [0.8], "threads-2": [0.8]}})
    source = design()["label-skew"]
    many = replace(families_many(), rows=source.rows, tuned_from=source)
    fr = FamilyRecords.load(many, tmp_path)
    assert fr.noise is not None and fr.noise_context == "label-skew"
    measured(tmp_path, many.name, {"local": {REFERENCE: [0.8], "threads-2": [0.7]}})
    own = FamilyRecords.load(many, tmp_path)
    assert own.noise_context == many.name and own.noise is not None and own.noise.of("local") == pytest.approx(0.1)
    assert FamilyRecords.load(source, tmp_path / "elsewhere").noise is None


def families_many():
    from benchmarks.families import FAMILIES

    return FAMILIES["many-clients"]


# =========================================================================== the script's plan
def test_every_arm_runs_the_reference_config_with_only_its_numeric_setting_changed():
    runs = script.context_runs("label-skew", ["local", "fedcac"], [0, 1], ["threads-2", "kernels-default"])
    assert len(runs) == 2 * 2 * 3
    by_cell = {(r.method, r.arm, r.seed): r for r in runs}
    for (method, arm, seed), r in by_cell.items():
        ref = by_cell[(method, REFERENCE, seed)]
        changed = {k for k in {*r.config, *ref.config} if r.config.get(k) != ref.config.get(k)}
        assert changed == ({"client-threads"} if arm == "threads-2" else set())
        assert r.config["seed"] == seed and r.clients == 10 and r.config["partition"] == "dirichlet"
    assert script.ARMS["kernels-default"].env == {"ATEN_CPU_CAPABILITY": "default"}
    defaults = script.context_runs("defaults", [], [0], [])
    assert {r.config["method"] for r in defaults} >= {"local", "fedavg", "fedcac", "client2vec"}
    assert all(set(r.config) == {"method", "seed", "client-threads"} for r in defaults)
    from task.config import parse_settings

    for r in script.context_runs("mnist1d-label-skew", [], [0], ["threads-2"]):
        parse_settings(r.config)  # the app accepts every planned run config


def test_unknown_contexts_and_arms_are_refused_naming_what_exists(tmp_path):
    with pytest.raises(SystemExit, match=r"unknown context or arm \['nosuch'\]; contexts: \['defaults'"):
        script.main(["--contexts", "nosuch", "--raw-dir", str(tmp_path), "--dry-run"])
    with pytest.raises(SystemExit, match=r"unknown context or arm \['reference'\]"):
        script.main(["--arms", "reference", "--raw-dir", str(tmp_path), "--dry-run"])


@pytest.mark.slow
def test_the_portable_kernels_arm_runs_in_a_process_of_its_own(tmp_path, capsys):
    """One method, one seed, one round: the reference and two threads in this process, the portable kernels in a child
    started with ATEN_CPU_CAPABILITY=default, whose record names the kernels it ran."""
    import torch

    if torch.backends.cpu.get_cpu_capability() == "DEFAULT":
        pytest.skip("this CPU runs PyTorch's portable kernels already: the arm is left out")
    args = ["--contexts", "defaults", "--methods", "local", "--seeds", "0", "--rounds", "1"]
    script.main([*args, "--raw-dir", str(tmp_path), "--jobs", "1"])
    recs = {r["cell"]["arm"]: r for r in (float_noise.load_records(GRID, tmp_path))}
    assert set(recs) == {REFERENCE, "threads-2", "kernels-default"}
    assert recs["kernels-default"]["machine"]["cpu-capability"] == "DEFAULT"
    assert recs[REFERENCE]["machine"]["cpu-capability"] == recs["threads-2"]["machine"]["cpu-capability"] != "DEFAULT"
    assert recs["threads-2"]["run-config"]["client-threads"] == 2 and all(not r["error"] for r in recs.values())
    assert isinstance(float_noise.load(tmp_path)["defaults"], Noise)
    assert "## Float noise" in capsys.readouterr().out

"""docs/choosing-a-method.md (benchmarks/reporting/choosing.py) on synthetic records: a method wins a cell only when
its paired differences to Local and to FedAvg both have a 95 % interval above zero, paired on the seed, the client and
the same data; cells without records say so; a paper's method that wins nowhere is said to; the spread over clients
is given per method and cell; what leaves a client is read from the reply specs; costs are the records' means; and
``report.py --check`` fails when the page's generated block is stale."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from benchmarks import families, records
from benchmarks.families import Family
from benchmarks.records import write_record
from benchmarks.reporting import choosing
from benchmarks.reporting.grids import FamilyRecords

from .test_grids import record

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"

ROWS = ("local", "fedavg", "fedcac", "pifl")
ACC_OF = {"local": 0.60, "fedavg": 0.70, "fedcac": 0.75, "pifl": 0.65}  # a method's accuracy when a test sets none


def design() -> dict[str, Family]:
    fam = families.FAMILIES["label-skew"]
    rows = tuple(r for r in fam.rows if r.name in ROWS)
    het = {k: v for k, v in fam.heterogeneity.items() if k in ("dirichlet-0.1", "dirichlet-0.5")}
    return {
        "label-skew": replace(
            fam, rows=rows, samples={25: {}, 50: {}}, heterogeneity=het, lrs=(0.01, 0.05), ladder=(), seeds=(0, 1, 2)
        )
    }


def select_all(raw: Path, fam: Family) -> dict[str, str]:
    """Selection runs of every row at every selection seed, the first setting best: the chosen setting of each row."""
    for row in fam.rows:
        for seed in fam.select_seeds:
            for i, setting in enumerate(fam.settings(row)):
                cell = {"method": row.name, "setting": families.setting_label(setting), "seed": seed}
                write_record(record(fam.select_grid, cell, 0.9 - 0.01 * i), raw)
    return {r.name: families.setting_label(fam.settings(r)[0]) for r in fam.rows}


def coords(fam: Family, chosen: dict[str, str], method: str, cell: tuple[int, str], seed: int) -> dict:
    return {"samples": cell[0], "heterogeneity": cell[1], "method": method, "setting": chosen[method], "seed": seed}


def run(raw: Path, fam: Family, chosen: dict[str, str], method: str, cell: tuple[int, str], accs, **kw) -> None:
    """Grid records of ``method`` at ``cell``: ``accs`` maps seed -> accuracy."""
    for seed, acc in accs.items():
        write_record(record(fam.grid, coords(fam, chosen, method, cell, seed), acc, **kw), raw)


def judged(raw: Path, fam: Family) -> dict[tuple[int, str], dict[str, choosing.Judgement]]:
    return choosing.judgements(FamilyRecords.load(fam, raw))


# =========================================================================== who wins
def test_a_method_better_than_local_and_fedavg_on_every_seed_wins_and_one_worse_on_a_seed_does_not(tmp_path):
    fam = design()["label-skew"]
    chosen = select_all(tmp_path, fam)
    mid = fam.middle
    run(tmp_path, fam, chosen, "local", mid, {0: 0.60, 1: 0.80, 2: 0.70})
    run(tmp_path, fam, chosen, "fedavg", mid, {0: 0.70, 1: 0.65, 2: 0.72})
    # FedCAC beats the better of the two on every seed; PI-FL beats them on average (mean 0.77 > 0.74) but not on seed 1
    run(tmp_path, fam, chosen, "fedcac", mid, {0: 0.71, 1: 0.83, 2: 0.80})
    run(tmp_path, fam, chosen, "pifl", mid, {0: 0.90, 1: 0.70, 2: 0.71})
    cell = judged(tmp_path, fam)[mid]
    cac, pifl = cell["fedcac"], cell["pifl"]
    # every client of a run has the run's accuracy: only the draw of seeds moves the mean, so the interval runs from
    # the smallest to the largest seed's difference (a resample of three times the same seed has chance 1/27 > 2.5 %)
    assert cac.win and cac.seeds == [0, 1, 2]
    assert cac.vs_local is not None and cac.vs_fedavg is not None
    assert (cac.vs_local.point, cac.vs_local.lo, cac.vs_local.hi) == pytest.approx((0.08, 0.03, 0.11))
    assert (cac.vs_fedavg.point, cac.vs_fedavg.lo, cac.vs_fedavg.hi) == pytest.approx((0.09, 0.01, 0.18))
    assert not pifl.win and pifl.status == "no win" and pifl.vs_local is not None
    assert pifl.vs_local.lo == pytest.approx(-0.10) and pifl.vs_local.hi == pytest.approx(0.30)
    page = choosing.render_choosing(tmp_path, design())
    assert (
        "**FedCAC** wins in 1 of 1 judged cell: 50 samples, dirichlet-0.5 (vs Local +8.0 [+3.0, +11.0], vs FedAvg "
        "+9.0 [+1.0, +18.0])" in page
    )
    assert "**PI-FL** wins nowhere: in none of the 1 judged cell is it above both Local and FedAvg" in page
    winners = next(
        line
        for line in page.splitlines()
        if line.startswith("| 50 samples, dirichlet-0.5 (middle: selection ran here) |")
    )
    assert "`fedcac` (vs Local +8.0 [+3.0, +11.0]" in winners and "`pifl`" not in winners.split("|")[4]


def test_pairing_is_on_the_seed_not_on_the_order_of_the_runs(tmp_path):
    fam = design()["label-skew"]
    chosen = select_all(tmp_path, fam)
    mid = fam.middle
    run(tmp_path, fam, chosen, "local", mid, {0: 0.50, 1: 0.95, 2: 0.60})
    run(tmp_path, fam, chosen, "fedavg", mid, {0: 0.40, 1: 0.90, 2: 0.55})
    # seed 1 is missing: compared with the references' seeds 0 and 2 it is better on both; paired by position (its
    # second run against their second) it would be 0.30 below Local
    run(tmp_path, fam, chosen, "fedcac", mid, {0: 0.55, 2: 0.65})
    j = judged(tmp_path, fam)[mid]["fedcac"]
    assert j.win and j.seeds == [0, 2] and j.vs_local is not None and j.vs_local.point == pytest.approx(0.05)
    # a seed FedAvg has not run yet is left out of the comparison, not paired with another seed's run
    run(tmp_path, fam, chosen, "fedcac", mid, {1: 0.97})
    (tmp_path / fam.grid / f"{records.cell_name(coords(fam, chosen, 'fedavg', mid, 2))}.json").unlink()
    j = judged(tmp_path, fam)[mid]["fedcac"]
    assert j.win and j.seeds == [0, 1] and j.margin == pytest.approx(0.035)  # the smaller of +0.035 and +0.045
    # a method that ran one seed only is not judged, however large its margin
    run(tmp_path, fam, chosen, "pifl", mid, {0: 0.99})
    j = judged(tmp_path, fam)[mid]["pifl"]
    assert j.status == "too few seeds" and not j.win and "1 seed: not judged" in j.text()


def test_runs_on_other_data_are_never_paired_so_they_cannot_win(tmp_path):
    fam = design()["label-skew"]
    chosen = select_all(tmp_path, fam)
    mid = fam.middle
    run(tmp_path, fam, chosen, "local", mid, {0: 0.5, 1: 0.5, 2: 0.5})
    run(tmp_path, fam, chosen, "fedavg", mid, {0: 0.5, 1: 0.5, 2: 0.5})
    run(tmp_path, fam, chosen, "fedcac", mid, {0: 0.9, 1: 0.9, 2: 0.9}, num_examples=(31, 40, 50))
    j = judged(tmp_path, fam)[mid]["fedcac"]
    assert j.status == "unpaired" and not j.win and "data differ" in j.reason
    assert "**FedCAC**: not judged yet" in choosing.render_choosing(tmp_path, design())


def test_a_failed_method_and_cells_without_records_show_as_such_never_as_numbers(tmp_path):
    fam = design()["label-skew"]
    chosen = select_all(tmp_path, fam)
    mid = fam.middle
    run(tmp_path, fam, chosen, "local", mid, {0: 0.6, 1: 0.6, 2: 0.6})
    run(tmp_path, fam, chosen, "fedavg", mid, {0: 0.7, 1: 0.7, 2: 0.7})
    run(tmp_path, fam, chosen, "pifl", mid, {0: 0.0}, error="Traceback\nRuntimeError: boom")
    cells = judged(tmp_path, fam)
    assert cells[mid]["pifl"].status == "failed" and "RuntimeError: boom" in cells[mid]["pifl"].reason
    # better on the seeds it finished, but it failed on a seed Local and FedAvg ran: no win
    run(tmp_path, fam, chosen, "fedcac", mid, {0: 0.9, 1: 0.9})
    run(tmp_path, fam, chosen, "fedcac", mid, {2: 0.0}, error="Traceback\nRuntimeError: boom")
    j = judged(tmp_path, fam)[mid]["fedcac"]
    assert j.status == "no win" and j.seeds == [0, 1] and "failed on seed 2" in j.text()
    for seed in (0, 1, 2):
        (tmp_path / fam.grid / f"{records.cell_name(coords(fam, chosen, 'fedcac', mid, seed))}.json").unlink()
    cells = judged(tmp_path, fam)
    for cell in fam.cells()[1:]:
        assert cells[cell]["fedcac"].status == "not run yet"
    page = choosing.render_choosing(tmp_path, design())
    assert "| 25 samples, dirichlet-0.5 | not run yet | not run yet | not judged yet | — |" in page
    assert "**FedCAC**: not judged yet (no cell has enough of its runs with Local's and FedAvg's)." in page
    # what is missing is listed: every method-cell without all its seeds
    assert (
        "Label skew: 2 of 12 (method, cell) pairs have all 3 planned seeds' results; cells short of them, per method: "
        "`local` 2 of 3, `fedavg` 2 of 3, `fedcac` 3 of 3, `pifl` 3 of 3." in page
    )
    assert "The defaults (`benchmarks/defaults.py`): no records." in page


def test_a_method_without_a_chosen_setting_is_not_run_and_a_family_without_records_is_unmeasured(tmp_path):
    fam = design()["label-skew"]
    page = choosing.render_choosing(tmp_path, design())
    assert "*Not run yet: no records of `python -m benchmarks.grids --families label-skew` (10 clients" in page
    setting = families.setting_label(fam.settings(fam.row("fedcac"))[0])
    cell = {"method": "fedcac", "setting": setting, "seed": fam.select_seeds[0]}
    write_record(record(fam.select_grid, cell, 0.5), tmp_path)
    cells = judged(tmp_path, fam)
    assert cells[fam.middle]["fedcac"].status == "not run yet"
    assert "selection incomplete" in cells[fam.middle]["fedcac"].reason


def test_the_page_gives_the_spread_over_clients_and_the_share_worse_than_local_per_method_and_cell(tmp_path):
    fam = design()["label-skew"]
    chosen = select_all(tmp_path, fam)
    mid = fam.middle
    for seed in (0, 1):
        for method, accs in (("local", [0.6, 0.6, 0.6]), ("fedavg", [0.5, 0.5, 0.5]), ("fedcac", [0.9, 0.9, 0.3])):
            write_record(record(fam.grid, coords(fam, chosen, method, mid, seed), 0.0, client_accs=accs), tmp_path)
    page = choosing.render_choosing(tmp_path, design())
    section = page.split("### Fairness: the spread over clients", 1)[1].split("\n### ", 1)[0]
    row = next(line for line in section.splitlines() if line.startswith("| `fedcac` |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    head = next(line for line in section.splitlines() if line.startswith("| method |"))
    column = [c.strip() for c in head.strip("|").split("|")].index("50 samples, dirichlet-0.5")
    # a higher mean than Local (0.70 against 0.60) bought by hurting a third of the clients shows here
    std = float(np.std([0.9, 0.9, 0.3]))
    assert cells[column] == f"{std:.3f} / 0.300 / {np.percentile([0.9, 0.9, 0.3], 10):.3f} / 33%"
    assert next(line for line in section.splitlines() if line.startswith("| `local` |")).count("/") == 2


# =========================================================================== costs and what leaves a client
def test_costs_are_per_client_per_round_means_over_the_runs(tmp_path):
    fam = design()["label-skew"]
    chosen = select_all(tmp_path, fam)
    rounds_a = [
        {
            "round": 1,
            "bytes-down": 600,
            "bytes-up": 300,
            "train-bytes-down": 300,
            "train-bytes-up": 300,
            "seconds": 9.0,
        },
        {
            "round": 2,
            "bytes-down": 300,
            "bytes-up": 300,
            "train-bytes-down": 300,
            "train-bytes-up": 300,
            "seconds": 1.0,
        },
        {
            "round": 3,
            "bytes-down": 900,
            "bytes-up": 330,
            "train-bytes-down": 300,
            "train-bytes-up": 300,
            "seconds": 2.0,
        },
    ]
    double = ("bytes-down", "train-bytes-down")
    rounds_b = [{**r, **{k: r[k] * 2 for k in double}, "seconds": r["seconds"] * 3} for r in rounds_a]
    run(tmp_path, fam, chosen, "fedcac", fam.middle, {0: 0.7}, rounds=rounds_a, seconds=20.0)
    run(tmp_path, fam, chosen, "fedcac", fam.middle, {1: 0.7}, rounds=rounds_b, seconds=40.0)
    recs = FamilyRecords.load(fam, tmp_path).cell("fedcac", *fam.middle)
    row = choosing.cost_row("fedcac", recs)
    # 3 clients: down 600 / 3 = 200 B per client and round (run a), 400 B (run b); up (310 / 3)
    assert row[1] == "300 B" and row[2] == f"{np.mean([300, 300, 330]) / 3:.0f} B"
    assert row[3] == "1 of 2"  # round 1 had traffic beyond the train messages; the last round is not counted
    total_a, train_a = 1800 + 930, 900 + 900
    total_b, train_b = 3600 + 930, 1800 + 900
    share = np.mean([(total_a - train_a) / total_a, (total_b - train_b) / total_b])
    assert row[4] == f"{share * 100:.0f} %"
    assert row[5] == f"{np.mean([2.0, 6.0]):.2f}" and row[6] == "30"
    assert choosing.cost_row("pifl", [])[1] == "not run yet"


@pytest.fixture
def fresh_protocols():
    choosing._protocol.cache_clear()
    yield
    choosing._protocol.cache_clear()


def test_what_leaves_a_client_is_read_from_the_reply_specs(fresh_protocols, monkeypatch):
    from strategies.baselines import FedAvgStrategy
    from strategies.replies import Number

    table = choosing.leaves_table(
        [choosing.protocol(m, {"method": m}) for m in ("local", "lgfedavg", "fedcac", "pifl")]
    )
    rows = {line.split("|")[1].strip(): line for line in table.splitlines()[2:]}
    assert "only the metrics every reply carries" in rows["`local`"] and "model weights" not in rows["`local`"]
    assert "the head only" in rows["`lgfedavg`"]
    assert "record `mask`" in rows["`fedcac`"] and "without its BatchNorm statistics" in rows["`fedcac`"]
    assert "**bid**: `bid`" in rows["`pifl`"] and "a separate `evaluate` message every round" in rows["`pifl`"]
    # a method that declared one more reply field would show it: the table follows the code
    original = FedAvgStrategy.reply_spec

    def more(self, phase, node_id):
        spec = original(self, phase, node_id)
        return spec.with_metrics(**{"label-counts": Number(int, 0, 1000)}) if phase == "train" else spec

    monkeypatch.setattr(FedAvgStrategy, "reply_spec", more)
    row = choosing.leaves_table([choosing.protocol("fedavg", {"method": "fedavg"})]).splitlines()[2]
    assert "`label-counts` (an integer in [0, 1000])" in row


# =========================================================================== the page and its check
FRAME = f"# Choosing\n\nhand-written frame\n\n{choosing.BEGIN}\nold block\n{choosing.END}\n\nhand-written end\n"


def test_the_page_keeps_its_frame_and_refuses_a_frame_without_markers(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(FRAME)
    text = choosing.build_page(tmp_path, page, design())
    assert text.startswith("# Choosing\n\nhand-written frame\n\n") and text.endswith("hand-written end\n")
    assert "old block" not in text and "## Label skew" in text
    page.write_text("# no markers\n")
    with pytest.raises(choosing.PageError, match="BEGIN GENERATED"):
        choosing.build_page(tmp_path, page, design())


def test_the_check_fails_when_the_page_is_stale(tmp_path):
    fam = design()["label-skew"]
    page = tmp_path / "page.md"
    page.write_text(FRAME)
    assert choosing.stale_page(tmp_path, page, design())  # never generated
    page.write_text(choosing.build_page(tmp_path, page, design()))
    assert not choosing.stale_page(tmp_path, page, design())
    page.write_text(page.read_text().replace("hand-written frame", "a better frame"))
    assert not choosing.stale_page(tmp_path, page, design())  # the frame is the author's
    chosen = select_all(tmp_path, fam)
    assert choosing.stale_page(tmp_path, page, design())  # new records
    page.write_text(choosing.build_page(tmp_path, page, design()))
    assert not choosing.stale_page(tmp_path, page, design())
    page.write_text(page.read_text().replace(chosen["fedcac"], "lr=0.05 local-epochs=1 beta=15", 1))
    assert choosing.stale_page(tmp_path, page, design())  # a hand edit of the generated block


def test_report_check_covers_the_page(tmp_path, monkeypatch, capsys):
    """``report.py --check`` (the command the lead and CI run) exits 1 on a stale page and 0 once it is rewritten."""
    from benchmarks import report
    from benchmarks.reporting import privacy_audit as audit
    from benchmarks.reporting import robustness as generated

    page, results, raw = tmp_path / "page.md", tmp_path / "RESULTS.md", tmp_path / "raw"
    page.write_text(FRAME)
    raw.mkdir()
    args = ["report.py", "--raw-dir", str(raw), "--out", str(results), "--page", str(page)]
    robustness = tmp_path / "robustness.md"  # the other generated pages, kept off the committed ones
    robustness.write_text(f"{generated.BEGIN}\n{generated.END}\n")
    privacy = tmp_path / "privacy.md"
    privacy.write_text(f"{audit.BEGIN}\n{audit.END}\n")
    args += ["--robustness-page", str(robustness), "--privacy-page", str(privacy)]

    def main(*more: str) -> int:
        monkeypatch.setattr(sys, "argv", [*args, *more])
        try:
            report.main()
        except SystemExit as done:
            return int(done.code or 0)
        return 0

    assert main("--check") == 1  # the page was never generated
    assert main() == 0 and "old block" not in page.read_text()
    assert main("--check") == 0
    page.write_text(page.read_text().replace("## Label skew", "## Label skew, edited by hand"))
    capsys.readouterr()
    assert main("--check") == 1
    assert f"{page}: differs from the raw records" in capsys.readouterr().out


def test_the_committed_page_is_generated_from_the_committed_records():
    assert not choosing.stale_page(records.RAW), (
        "docs/choosing-a-method.md's generated block differs from what benchmarks/raw/ gives: do not edit it by "
        "hand; run `python -m benchmarks.report` and commit the result"
    )

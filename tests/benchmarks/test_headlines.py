"""The papers' own claims, tested once more (benchmarks/reporting/headlines.py), on synthetic records: a claim holds
in a setting only when the method is above every baseline the claim names with a 95 % interval above zero, paired on
the same data; every other run above the method is named, and so are rejected replies; a pFedLIA setting also needs
the planted clusters found; Client2Vec is judged on its last round with the best round beside it; the choosing page
gives each paper's method what its own claim gave, and links to the table it comes from."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from benchmarks.records import write_record
from benchmarks.reporting import choosing, headlines

from .test_choosing import design, record, run, select_all

ROOT = Path(__file__).resolve().parents[2]


def recs(grid: str, accs: dict[int, float], num_examples=(30, 40, 50), rounds=(), **cell) -> list[dict]:
    return [record(grid, {**cell, "seed": s}, a, num_examples=num_examples, rounds=rounds) for s, a in accs.items()]


def write(raw: Path, grid: str, accs: dict[int, float], artefacts: dict | None = None, rounds=(), **cell) -> None:
    for rec in recs(grid, accs, rounds=rounds, **cell):
        rec["artefacts"] = artefacts or {}
        write_record(rec, raw)


# =========================================================================== one comparison
def test_a_claim_holds_only_when_the_method_is_above_every_named_baseline_with_its_interval():
    arm = recs("g", {0: 0.80, 1: 0.75, 2: 0.90})
    weak = recs("g", {0: 0.70, 1: 0.70, 2: 0.70})
    close = recs("g", {0: 0.70, 1: 0.76, 2: 0.70})  # lower on average, but better than the method on seed 1
    text, held, above = headlines.against("M", arm, [("Weak", weak)])
    assert held is True and above == ()
    # every client has its run's accuracy: the interval runs from the smallest seed difference to the largest
    assert text == "M (0.817, 3 seeds) is above Weak (0.700; +11.7 [+5.0, +20.0] points)"
    text, held, _ = headlines.against("M", arm, [("Weak", weak), ("Close", close)])
    assert held is False and "cannot be told apart from Close (0.720; +9.7 [-1.0, +20.0] points)" in text


def test_every_run_above_the_method_is_named_and_so_are_rejected_replies():
    arm = recs("g", {0: 0.80, 1: 0.80})
    weak = recs("g", {0: 0.70, 1: 0.70})
    strong = recs("g", {0: 0.90, 1: 0.95})  # a baseline the claim does not name
    for r in weak[1:]:
        r["failures"] = {"count": 4, "first": []}
    text, held, above = headlines.against("M", arm, [("Weak", weak)], [("Strong", strong)])
    assert held is True and len(above) == 1 and above[0].startswith("Strong (+12.5 points, its interval excludes zero)")
    assert "Above it: Strong" in text and "Rejected replies: Weak: 4 rejected replies (seed 1)" in text


def test_runs_on_other_data_give_no_verdict_rather_than_a_false_one():
    arm = recs("g", {0: 0.9, 1: 0.9})
    other = recs("g", {0: 0.1, 1: 0.1}, num_examples=(31, 40, 50))
    text, held, _ = headlines.against("M", arm, [("Other", other)])
    assert held is None and "cannot be compared with Other" in text and "data differ" in text
    assert headlines.against("M", [], [("Other", other)]) == ("M: no run", None, ())


@pytest.mark.parametrize(
    "held, expected",
    [
        ([True, True], "holds"),
        ([False, False], "does not hold"),
        ([True, False, False], "holds in 1 of 3 settings"),
        ([True, None], "holds where measured (1 of 2)"),
        ([None], "not measured"),
        ([], "not measured"),
    ],
)
def test_the_verdict_over_settings(held, expected):
    assert headlines.verdict([headlines.Check(str(i), "", h) for i, h in enumerate(held)]) == expected


# =========================================================================== from the benchmarks' records
def test_fedcac_holds_in_the_partition_where_it_beats_everyone_and_not_where_one_baseline_wins_a_seed(tmp_path):
    good, mixed = "pathological", "dirichlet-0.5"
    for method, _ in headlines.BASELINES["fedcac"]:
        write(tmp_path, "fedcac", {0: 0.6, 1: 0.6, 2: 0.6}, method=method, partition=good)
        write(tmp_path, "fedcac", {0: 0.6, 1: 0.6, 2: 0.6}, method=method, partition=mixed)
    write(tmp_path, "fedcac", {0: 0.7, 1: 0.7, 2: 0.7}, method="fedcac", partition=good)
    write(tmp_path, "fedcac", {0: 0.7, 1: 0.7, 2: 0.7}, method="fedcac", partition=mixed)
    write(tmp_path, "fedcac", {0: 0.5, 1: 0.8, 2: 0.5}, method="ditto", partition=mixed)  # beats FedCAC on seed 1
    checks = {c.setting: c for c in headlines._fedcac(tmp_path)}
    assert checks[good].held is True and checks[mixed].held is False
    assert "cannot be told apart from Ditto (0.600; +10.0 [-10.0, +20.0] points)" in checks[mixed].text
    _section, verdicts = headlines.render_claims(tmp_path)
    assert verdicts["fedcac"] == "holds in 1 of 2 settings"
    assert verdicts["pifl"] == verdicts["fedc2i"] == "not measured"


def test_pfedlia_needs_the_planted_clusters_found_as_well_as_the_accuracy(tmp_path):
    def clustering(a: float) -> dict:
        return {"pfedlia": {"clustering": {"ari": a}}}

    for part, aris in (("pathological", (1.0, 0.95)), ("noisy", (1.0, 0.4))):
        for method, _ in headlines.BASELINES["pfedlia"]:
            write(tmp_path, "pfedlia", {0: 0.5, 1: 0.5}, method=method, partition=part, participation="full")
        for seed, a in enumerate(aris):  # beats both baselines on both seeds in both partitions
            write(
                tmp_path,
                "pfedlia",
                {seed: 0.9},
                clustering(a),
                method="pfedlia-central",
                partition=part,
                participation="full",
            )
    checks = {c.setting: c for c in headlines._pfedlia(tmp_path)}
    found, missed = checks["pathological, full participation"], checks["noisy, full participation"]
    assert found.held is True and "ARI 0.95-1.00, at least 0.9 in 2 of 2 seeds" in found.text
    assert missed.held is False and "at least 0.9 in 1 of 2 seeds" in missed.text


def test_client2vec_is_judged_on_its_last_round_with_the_best_round_beside_it(tmp_path):
    for seed in (0, 1):
        for arm, accs in (("FedAvg", [0.3, 0.5, 0.4]), ("+i+ii+iii", [0.2, 0.6, 0.1])):
            rounds = [{"round": i + 1, "global-acc": a} for i, a in enumerate(accs)]
            [rec] = recs("client2vec", {seed: 0.0}, rounds=rounds, arm=arm, setting="4dom-a0.1")
            rec["summary"]["global-acc"] = accs[-1]
            rec["clients"]["columns"].append("global-acc")
            for row in rec["clients"]["rows"]:
                row.append(accs[-1])
            write_record(rec, tmp_path)
    [check] = headlines._client2vec(tmp_path)
    # the last rounds, 0.1 against 0.4: below FedAvg; the best rounds (0.6 against 0.5) would say the opposite
    assert check.held is False and "last round (0.100, 2 seeds) is below FedAvg (0.400; -30.0" in check.text
    assert "best round (0.600, 2 seeds) is above FedAvg (0.500; +10.0 [+10.0, +10.0] points)" in check.text


# =========================================================================== on the page
def test_the_page_gives_each_paper_method_its_claim_and_what_the_runs_show(tmp_path):
    fam = design()["label-skew"]
    chosen = select_all(tmp_path, fam)
    mid = fam.middle
    run(tmp_path, fam, chosen, "local", mid, {0: 0.60, 1: 0.60})
    run(tmp_path, fam, chosen, "fedavg", mid, {0: 0.70, 1: 0.70})
    run(tmp_path, fam, chosen, "fedcac", mid, {0: 0.80, 1: 0.80})  # wins
    run(tmp_path, fam, chosen, "pifl", mid, {0: 0.50, 1: 0.50})  # wins nowhere
    for method, _ in headlines.BASELINES["pifl"]:
        write(tmp_path, "pifl", {0: 0.6, 1: 0.6}, method=method, partition="synth-10:90")
    write(tmp_path, "pifl", {0: 0.7, 1: 0.7}, method="pifl", partition="synth-10:90")
    write(tmp_path, "pifl", {0: 0.9, 1: 0.9}, method="ifca", partition="synth-10:90")  # not named by the claim
    page = choosing.render_choosing(tmp_path, design())
    lines = {
        m: next(ln for ln in page.splitlines() if f"**{n}** wins" in ln)
        for m, n in (("fedcac", "FedCAC"), ("pifl", "PI-FL"))
    }
    assert "Its paper's own claim, in the setting closest to the paper's: holds (below)." in lines["pifl"]
    assert "Its paper's own claim, in the setting closest to the paper's: not measured (below)." in lines["fedcac"]
    assert "## The papers' own claims, tested once more" in page
    row = next(ln for ln in page.splitlines() if ln.startswith("| **PI-FL** |"))
    assert "synth-10:90: PI-FL (0.700, 2 seeds) is above FedAvg (0.600; +10.0 [+10.0, +10.0] points)" in row
    assert "Above it: IFCA (+20.0 points, its interval excludes zero)" in row
    assert row.endswith("| holds; 1 run set above it |")
    assert "(in the records: 3 clients, — rounds, 100% of the clients per round)" in row


def test_every_claim_links_to_a_heading_of_the_committed_results():
    headings = {
        headlines.anchor(m.group(1))
        for m in re.finditer(r"^#+ (.+)$", (ROOT / "benchmarks" / "RESULTS.md").read_text(), re.MULTILINE)
    }
    assert {c.method for c in headlines.CLAIMS} == set(choosing.PAPERS)
    for claim in headlines.CLAIMS:
        assert headlines.anchor(claim.section) in headings, claim.section


def test_the_anchor_is_githubs():
    assert headlines.anchor("PI-FL on two-source data") == "pi-fl-on-two-source-data"
    assert headlines.anchor("Client2Vec case studies on feature-shift x label-skew digits") == (
        "client2vec-case-studies-on-feature-shift-x-label-skew-digits"
    )

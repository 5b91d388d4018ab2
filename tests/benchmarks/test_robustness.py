"""The robustness benchmark (benchmarks/robustness.py, its grid benchmarks/attack_grid.py) and what the report makes
of its records (benchmarks/reporting/robustness.py: its section of RESULTS.md, its figure, the generated block of
docs/robustness.md).

The plan must be the issue's grid in an order that makes a partial run useful, every refusal must be the app's own;
the renderer must compare honest clients with the same clients, keep stopped runs out of the means, and say what is
not run; the committed records and the page must agree.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from benchmarks import attack_grid as spec
from benchmarks import records
from benchmarks import robustness as script
from benchmarks.reporting import robustness as section
from task.attacks import AttackOptions, attackers

from .test_report import rec

CLIENTS = list(range(10))
BAD = attackers(AttackOptions(attack="noise", attack_share=0.3), CLIENTS)  # 1, 4, 8


# --------------------------------------------------------------------------- the plan
def test_the_grid_is_every_method_attack_share_rule_and_seed_once():
    cells = spec.cells()
    per_method = (1 + (len(spec.ATTACKS) - 1) * len(spec.SHARES)) * len(spec.AGGREGATORS) * len(spec.SEEDS)
    assert len(cells) == len(set(cells)) == len(spec.METHODS) * per_method
    assert {"fedavg", "ditto", "fedrep", "fedcac", "fedc2i", "pfedlia", "cfl", "ifca", "pifl"} <= set(spec.METHODS)
    assert {"none", "sign-flip", "label-flip", "backdoor", "side-channel"} == set(spec.ATTACKS)
    assert {"mean", "median", "trimmed-mean", "multi-krum"} == set(spec.AGGREGATORS)
    assert {c.share for c in cells if c.attack == "none"} == {0.0}
    assert {c.share for c in cells if c.attack != "none"} == set(spec.SHARES) == {0.1, 0.3}


def test_a_run_config_sets_only_the_grid_keys_and_the_cheap_output_settings():
    for c in spec.cells():
        cfg = c.config
        assert cfg["method"] == c.method and cfg["seed"] == c.seed
        assert cfg.get("aggregator", "mean") == c.aggregator and cfg.get("attack", "none") == c.attack
        if c.attack != "none":
            assert cfg["attack-share"] == c.share
        assert set(cfg) - {"method", "seed", "aggregator", "attack", "attack-share"} == set(spec.COMMON)
    # the output settings keep no model, checkpoint or event file: nothing that changes what a run learns
    assert spec.COMMON == {"save-models": False, "checkpoint-every": 0, "tensorboard": False}


def test_the_order_runs_the_headline_first_seed_by_seed_and_every_cell_once():
    ordered = spec.in_order(spec.cells())
    assert sorted(ordered, key=str) == sorted(spec.cells(), key=str)
    headline = [
        c
        for c in ordered
        if (c.attack, c.share) in (("none", 0.0), ("sign-flip", 0.3))
        and c.aggregator in ("mean", "multi-krum")
        and c.seed in (0, 1)
    ]
    assert ordered[: len(headline)] == headline  # the headline block comes first ...
    assert [c.seed for c in headline] == sorted(c.seed for c in headline)  # ... seed 0 of every method first
    assert {c.method for c in headline if c.seed == 0} == set(spec.METHODS)
    steps = [spec.step_of(c) for c in ordered]
    assert steps == sorted(steps) and max(steps) < len(spec.STEPS)  # every cell in a step, steps in order
    ten = [i for i, c in enumerate(ordered) if c.share == 0.1]
    assert min(ten) > max(i for i, c in enumerate(ordered) if c.share == 0.3)  # 10 % last


def test_the_refusals_are_the_apps_own_and_depend_on_neither_share_nor_seed():
    from task.config import parse_settings
    from task.options import ConfigConflict

    accepted, reasons = script.split_refused(spec.cells())
    without_side_channel = {"fedavg", "ditto", "fedrep", "fedc2i", "cfl", "ifca"}
    expected = {(m, "side-channel", g) for m in without_side_channel for g in spec.AGGREGATORS}
    expected |= {("fedc2i", a, g) for a in spec.ATTACKS for g in ("median", "trimmed-mean", "multi-krum")}
    assert set(reasons) == expected
    for c in spec.cells():
        if (c.method, c.attack, c.aggregator) in reasons:
            with pytest.raises(ConfigConflict):
                parse_settings(c.config)
    assert len(accepted) == len(spec.cells()) - sum((c.method, c.attack, c.aggregator) in reasons for c in spec.cells())


def test_the_dry_run_prints_the_plan_and_hours_and_writes_nothing(tmp_path, capsys):
    script.main(["--dry-run", "--raw-dir", str(tmp_path), "--seconds-per-run", "60"])
    out = capsys.readouterr().out
    assert f"plan: {len(spec.cells())} cells" in out and "to do" in out
    left = re.search(r"all that is left: (\d+) runs, about ([0-9.]+) h on this machine", out)
    assert left is not None, out
    runs, hours = int(left.group(1)), float(left.group(2))
    assert hours == pytest.approx(runs * 60 / 3600, abs=0.051)  # printed to 0.1 h
    assert not list(tmp_path.rglob("*.json"))


def test_the_script_refuses_values_outside_the_grid(tmp_path):
    with pytest.raises(SystemExit, match="unknown methods"):
        script.main(["--dry-run", "--raw-dir", str(tmp_path), "--methods", "fedavg,nosuch"])
    with pytest.raises(SystemExit, match="unknown shares"):
        script.main(["--dry-run", "--raw-dir", str(tmp_path), "--shares", "0.5"])


# --------------------------------------------------------------------------- the renderer on synthetic records
def run(method, attack, share, rule, seed, per_client, *, error=None, aborted=None, rounds=None, **summary):
    """A record of the grid: ``per_client`` is every client's final personalized accuracy."""
    cell = {"method": method, "attack": attack, "attackers": share, "aggregator": rule, "seed": seed}
    bad = attackers(AttackOptions(attack="noise", attack_share=share), CLIENTS) if attack != "none" else []
    honest = float(np.mean([a for c, a in enumerate(per_client) if c not in bad]))
    r = rec(cell, personal=None if error else float(np.mean(per_client)), grid=spec.GRID, error=error)
    r["clients"] = {
        "columns": ["client", "num-examples", "personal-acc", "test-examples"],
        "rows": [[c, 10 + c, a, 5] for c, a in enumerate(per_client)],
    }
    r["fingerprint"]["data-columns"] = ["client", "num-examples", "test-examples"]
    r["summary"].update(
        {
            "attack": attack,
            "aggregator": rule,
            "attackers": bad,
            "honest-personal-acc": None if error or attack == "none" else honest,
            "aborted": aborted,
            "rounds": len(rounds) if rounds else 10,
            **summary,
        }
    )
    if rounds is not None:
        r["rounds"] = [{"round": i + 1, "honest-personal-acc": v} for i, v in enumerate(rounds)]
    return r


def refusal(method, attack, rule, reason):
    r = rec({"method": method, "attack": attack, "aggregator": rule}, grid=spec.REFUSED_GRID, error=reason)
    r["refused"] = reason
    return r


def write(tmp_path, recs):
    for r in recs:
        records.write_record(r, tmp_path)
    return tmp_path


CLEAN = [0.9] * 10
#: the attackers' own clients do worse without any attack: the honest clients' reference is not the mean of all
UNEVEN = [0.9, 0.5, 0.9, 0.9, 0.5, 0.9, 0.9, 0.9, 0.5, 0.9]


def test_the_drop_compares_the_honest_clients_with_themselves_without_the_attack(tmp_path):
    attacked = [0.8 if c not in BAD else 0.1 for c in CLIENTS]
    raw = write(
        tmp_path,
        [run("fedavg", "none", 0.0, "mean", 0, UNEVEN), run("fedavg", "sign-flip", 0.3, "mean", 0, attacked)],
    )
    grid = section.Records.load(raw)
    a = grid.seeds("fedavg", "sign-flip", 0.3, "mean")
    assert grid.drops(a) == pytest.approx([0.8 - 0.9])  # not 0.8 - mean(UNEVEN)
    table = section.attack_table(grid, "sign-flip", 0.3)
    fedavg = next(line for line in table.splitlines() if line.startswith("| FedAvg "))
    assert "0.800 [1 seed]<br>Δ -10.0" in fedavg


def test_a_stopped_run_is_shown_stopped_and_kept_out_of_the_mean(tmp_path):
    raw = write(
        tmp_path,
        [
            run("ifca", "none", 0.0, "median", 0, CLEAN),
            run("ifca", "none", 0.0, "median", 1, CLEAN),
            run("ifca", "sign-flip", 0.3, "median", 0, [0.85] * 10),
            run(
                "ifca",
                "sign-flip",
                0.3,
                "median",
                1,
                [0.1] * 10,
                error="the run stopped early: round 5: every train reply failed",
                aborted="round 5: every train reply failed",
                rounds=[0.3, 0.2, 0.1, None, None],
            ),
        ],
    )
    grid = section.Records.load(raw)
    text = section.acc_text(grid.seeds("ifca", "sign-flip", 0.3, "median"))
    assert text == "0.850 [1 seed]; stopped in round 5 (1 of 2 runs)"
    (outcome,) = section.outcomes(grid, "sign-flip", 0.3)
    assert outcome.stopped == 1 and outcome.broke and not outcome.held
    assert section.last_honest(grid.seeds("ifca", "sign-flip", 0.3, "median")[1]) == (3, 0.1)
    # the figure has a point for the run that ran to the end only
    (fig,) = section.figures_robustness(raw)
    (panel,) = [p for p in fig.panels if p.title.startswith("sign-flip")]
    (line,) = panel.lines
    assert line.x == [float(spec.AGGREGATORS.index("median"))] and line.y == pytest.approx([0.85])


def test_cells_not_run_and_refused_are_said_so_and_counted(tmp_path):
    reason = "ConfigConflict: aggregator='median' cannot be used with method 'fedc2i': its server averages nothing"
    raw = write(
        tmp_path,
        [run("fedavg", "none", 0.0, "mean", 0, CLEAN), refusal("fedc2i", "none", "median", reason)],
    )
    grid = section.Records.load(raw)
    table = section.cost_table(grid)
    rows = {line.split("|")[1].strip(): line for line in table.splitlines()[2:]}
    assert rows["FedAvg"].count("not run") == 3 and "0.900 [1 seed]" in rows["FedAvg"]
    assert "refused" in rows["FedC2I"]
    lines, counts = section.coverage(grid)
    refused_cells = len(spec.SEEDS)  # none / median for FedC2I, at every seed (no share without an attack)
    assert counts == {
        "planned": len(spec.cells()) - refused_cells,
        "recorded": 1,
        "stopped": 0,
        "failed": 0,
        "refused": refused_cells,
    }
    assert lines[0].startswith(f"1 of the {len(spec.cells()) - refused_cells} planned runs are recorded")
    assert "sign-flip by 30 % of the clients" in lines[1]  # a block without any run is named
    refusals = section.refusal_table(grid)
    assert refusals is not None and "its server averages nothing" in refusals and "aggregator=" not in refusals
    text = section.render_robustness(raw, records.run_config_defaults())
    assert "**Sign-flip" not in text  # no table for an attack without runs: the coverage line lists it


def test_no_drop_is_claimed_between_runs_on_other_data(tmp_path):
    ref = run("fedavg", "none", 0.0, "mean", 0, CLEAN)
    other = run("fedavg", "label-flip", 0.3, "mean", 0, [0.7] * 10)
    other["fingerprint"]["data"] = "other"
    other["clients"]["rows"] = [[c, 99, 0.7, 5] for c in CLIENTS]  # other training sizes: other data
    raw = write(tmp_path, [ref, other])
    grid = section.Records.load(raw)
    assert grid.drops(grid.seeds("fedavg", "label-flip", 0.3, "mean")) == []
    assert "Δ —" in section.attack_table(grid, "label-flip", 0.3)


def test_a_run_whose_rejected_replies_left_sizes_unknown_still_pairs_on_what_it_knows(tmp_path):
    ref = run("fedcac", "none", 0.0, "mean", 0, CLEAN)
    hit = run("fedcac", "sign-flip", 0.3, "multi-krum", 0, [0.2] * 10)
    hit["fingerprint"]["data"] = "partial"  # the digest of the rows with the sizes missing
    hit["clients"]["rows"] = [[c, None, 0.2, 5] for c in CLIENTS]  # NaN replies rejected: no training size
    raw = write(tmp_path, [ref, hit])
    grid = section.Records.load(raw)
    assert grid.drops(grid.seeds("fedcac", "sign-flip", 0.3, "multi-krum"), aggregator="mean") == pytest.approx(
        [0.2 - 0.9]
    )
    hit["clients"]["rows"][0][3] = 6  # a test split of another size: not the same data
    raw = write(tmp_path, [hit])
    grid = section.Records.load(raw)
    assert grid.drops(grid.seeds("fedcac", "sign-flip", 0.3, "multi-krum"), aggregator="mean") == []


def test_the_claims_sort_combinations_into_held_and_broke_by_their_loss(tmp_path):
    held = [0.89 if c not in BAD else 0.0 for c in CLIENTS]  # -1 point for the honest clients
    broke = [0.6 if c not in BAD else 0.0 for c in CLIENTS]  # -30 points
    raw = write(
        tmp_path,
        [
            run("fedavg", "none", 0.0, "mean", 0, CLEAN),
            run("fedavg", "sign-flip", 0.3, "multi-krum", 0, held),
            run("fedavg", "sign-flip", 0.3, "median", 0, broke),
            run("pifl", "none", 0.0, "mean", 0, CLEAN),
            run("pifl", "sign-flip", 0.3, "mean", 0, held),
        ],
    )
    grid = section.Records.load(raw)
    by = {(o.method, o.rule): o for o in section.outcomes(grid, "sign-flip", 0.3)}
    assert by["fedavg", "multi-krum"].held and not by["fedavg", "multi-krum"].broke
    assert by["fedavg", "median"].broke and not by["fedavg", "median"].held
    claims = section.attack_claims(grid, "sign-flip", 0.3)
    assert "FedAvg with Multi-Krum (-1.0 points)" in claims[0] and "PI-FL with the mean (-1.0 points)" in claims[0]
    assert "median" not in claims[0] and "FedAvg with the median (-30.0 points)" in claims[1]
    assert "median" not in claims[2]  # the highest accuracies are of those that did not break
    assert section.attack_claims(grid, "backdoor", 0.1) == ["Backdoor by 10 % of the clients: not yet measured."]
    (overall,) = section.overall_claims(grid)
    total = (len(spec.ATTACKS) - 1) * len(spec.SHARES)
    assert f"FedAvg with Multi-Krum (1 of {total} attack settings run: sign-flip by 30 % of the clients)" in overall
    assert "PI-FL with the mean (1 of" in overall and "FedAvg with the median" not in overall
    assert overall.endswith("1 other combination broke or lost more than 2 points under at least one.")


def test_the_isolation_verdicts_are_counted_over_runs(tmp_path):
    recs = [run("ifca", "none", 0.0, "mean", s, CLEAN) for s in (0, 1)]
    for seed, isolated in ((0, True), (1, False)):
        r = run("ifca", "sign-flip", 0.3, "mean", seed, CLEAN, **{"attackers-isolated": {"clusters": isolated}})
        recs.append(r)
    grid = section.Records.load(write(tmp_path, recs))
    assert section.isolation_claims(grid, "sign-flip", 0.3) == [
        "IFCA, sign-flip by 30 % of the clients: its clusters isolated the attackers in 1 of 2 runs."
    ]
    table = section.isolation_table(grid, "sign-flip", 0.3)
    assert table is not None and "clusters: isolated in 1 of 2 runs" in table


def test_the_page_keeps_its_frame_and_refuses_one_without_markers(tmp_path):
    frame = f"# title\n\nabove\n\n{section.BEGIN}\nold\n{section.END}\n\nbelow\n"
    text = section.page_text(frame, "new block")
    assert text.startswith("# title\n\nabove\n\n") and text.endswith(f"{section.END}\n\nbelow\n")
    assert "new block" in text and "old" not in text
    with pytest.raises(ValueError, match="must hold"):
        section.page_text("no markers", "x")


# --------------------------------------------------------------------------- the committed records and the page
def _committed() -> list[dict]:
    return records.load_records(spec.GRID)


def test_docs_robustness_md_holds_what_the_records_give():
    assert section.PAGE.read_text() == section.build_page(records.RAW), (
        "docs/robustness.md's generated block differs from what benchmarks/raw/ gives: run "
        "`python -m benchmarks.report` and commit the result"
    )


def test_the_pages_own_words_about_the_grid_are_the_grids():
    text = section.PAGE.read_text().split(section.END, 1)[1]
    shares = " and ".join(f"{s * 100:g} %" for s in spec.SHARES)
    assert f"at {shares} of {spec.CLIENTS} clients on one data set" in re.sub(r"\s+", " ", text)


def test_the_committed_runs_are_cells_of_the_grid_with_nothing_else_set():
    defaults = records.run_config_defaults()
    allowed = {"method", "seed", "aggregator", "attack", "attack-share", "min-nodes", "results-dir", *spec.COMMON}
    grid = {c.coordinates.__repr__() for c in spec.cells()}
    for r in _committed():
        assert repr(r["cell"]) in grid, r["cell"]
        changed = {k for k, v in r["run-config"].items() if defaults.get(k) != v}
        assert changed <= allowed, (r["cell"], changed - allowed)
        assert r["num-supernodes"] == spec.CLIENTS


def test_the_committed_honest_accuracy_is_the_mean_over_the_clients_that_did_not_attack():
    """What the drop relies on: a run's honest accuracy is its non-attackers' per-client accuracies, averaged (where
    the last round scored every client; the tables mark the runs where it did not)."""
    checked = 0
    for r in records.ok(_committed()):
        if r["cell"]["attack"] == "none" or section.partly_scored(r):  # the last round scored every client
            continue
        bad = attackers(AttackOptions(attack="noise", attack_share=r["cell"]["attackers"]), CLIENTS)
        assert r["summary"]["attackers"] == bad
        honest = section.accuracy_of(r, [c for c in CLIENTS if c not in bad])
        assert honest == pytest.approx(r["summary"]["honest-personal-acc"], abs=1e-5)
        checked += 1
    if not checked:
        pytest.skip("no attacked run committed yet")


def test_the_committed_refusals_are_what_the_app_says_today():
    committed = records.load_records(spec.REFUSED_GRID)
    if not committed:
        pytest.skip("no refusal committed yet")
    _, reasons = script.split_refused(spec.cells())
    assert {(r["cell"]["method"], r["cell"]["attack"], r["cell"]["aggregator"]): r["refused"] for r in committed} == (
        reasons
    )


def test_the_section_references_its_figure_or_says_it_has_no_runs(tmp_path):
    assert "Not yet run: run `python -m benchmarks.robustness`" in section.render_robustness(tmp_path, {})
    assert section.figures_robustness(tmp_path) == []
    text = section.render_robustness(records.RAW, records.run_config_defaults())
    if records.ok(_committed()):
        assert f"]({section.FIGURE})" in text

"""The robustness benchmark (benchmarks/robustness.py, its grid as data benchmarks/attack_grid.py) and what the report
makes of its records (benchmarks/reporting/robustness.py: a verdict per cell with both halves, a recommendation per
threat, its section of RESULTS.md and the generated block of docs/robustness.md).

The plan must be the issue's grid (every attack at 10 % and 30 %, every rule each method accepts, 5 seeds) in an order
that makes a partial run useful, every refusal must be the app's own; the verdicts must count the backdoor, stand
against the cells' noise and call a lie that changed nothing "no effect"; the recommendations must follow the records;
the committed records and the page must agree.
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


def bad_at(share: float) -> list[int]:
    return attackers(AttackOptions(attack="noise", attack_share=share), CLIENTS) if share else []


# --------------------------------------------------------------------------- the plan
def test_the_grid_is_every_method_in_its_settings_under_every_attack_at_both_shares_every_rule_and_seed_once():
    cells = spec.cells()
    assert len(cells) == len(set(cells))
    assert spec.SHARES == (0.1, 0.3) and len(spec.SEEDS) == 5
    assert set(spec.RULES) == {"mean", "median", "trimmed-mean", "multi-krum", "bulyan", "norm-bound", "fltrust"}
    careful = {"alie", "min-max", "min-sum", "model-replacement", "size-lie"}
    assert careful | {"sign-flip", "noise", "free-rider", "label-flip", "backdoor", "side-channel"} == set(spec.ATTACKS)
    for setting, method, attacks in spec.blocks():
        mine = [c for c in cells if (c.setting, c.method) == (setting, method)]
        for attack in attacks:
            shares = {c.share for c in mine if c.attack == attack}
            assert shares == ({0.0} if attack == "none" else {0.1, 0.3}), (setting, method, attack)
        assert {(c.aggregator, c.seed) for c in mine} == {(g, s) for g in spec.RULES for s in spec.SEEDS}
    # the side-channel lie runs where it moves an honest run, for the methods whose channel reaches other clients
    sides = {(c.setting, c.method) for c in cells if c.attack == "side-channel"}
    assert sides == {(s, m) for m, s in spec.SIDE_CHANNEL_SETTINGS.items()}
    # pFedLIA and CFL are measured where they form clusters, beside FedAvg
    on = {m for s, m, _ in spec.blocks() if s == "planted-clusters"}
    assert {"pfedlia", "cfl", "fedavg"} <= on and {c.setting for c in cells if c.method == "pfedlia"} == {
        "planted-clusters"
    }


def test_a_run_config_sets_only_the_grid_keys_and_the_cheap_output_settings():
    grid_keys = {"method", "seed", "aggregator", "attack", "attack-share", "attack-num-examples"}
    for c in spec.cells():
        cfg = c.config
        assert cfg["method"] == c.method and cfg["seed"] == c.seed and cfg.get("aggregator", "mean") == c.aggregator
        own = spec.SETTINGS[c.setting].config | spec.method_keys(c.method, c.setting)
        assert set(cfg) - grid_keys - set(own) == set(spec.COMMON)
        assert all(cfg[k] == v for k, v in own.items())
        if c.attack == "none":  # nobody attacks, and the trigger's baseline is measured
            assert (cfg["attack"], cfg["attack-share"]) == ("backdoor", 0.0)
        else:
            assert cfg["attack-share"] == c.share and cfg["attack"] == spec.ATTACKS[c.attack]["attack"]
    lie = next(c for c in spec.cells() if c.attack == "size-lie")
    assert lie.config["attack-num-examples"] == 2**31 - 1 and lie.config["attack"] == "backdoor"
    assert spec.COMMON == {"save-models": False, "checkpoint-every": 0, "tensorboard": False}


def test_the_refusals_are_the_apps_own_and_depend_on_neither_share_nor_seed():
    from task.config import parse_settings
    from task.options import ConfigConflict

    accepted, reasons = script.split_refused(spec.cells())
    refused_rules = {
        "fedrep": {"fltrust"},
        "fedcac": {"norm-bound", "fltrust"},
        "fedc2i": {"median", "trimmed-mean", "bulyan", "fltrust"},
    }
    expected = {(s, m, a, g) for s, m, attacks in spec.blocks() for a in attacks for g in refused_rules.get(m, ())}
    assert set(reasons) == expected
    for c in spec.cells():
        if (c.setting, c.method, c.attack, c.aggregator) in reasons:
            with pytest.raises(ConfigConflict):
                parse_settings(c.config)
    assert len(accepted) == len(spec.cells()) - sum(
        (c.setting, c.method, c.attack, c.aggregator) in reasons for c in spec.cells()
    )


def test_the_order_runs_seed_by_seed_with_the_runs_without_an_attack_first_then_30_then_10_percent():
    ordered = spec.in_order(spec.cells())
    assert sorted(ordered, key=str) == sorted(spec.cells(), key=str)
    assert [c.seed for c in ordered] == sorted(c.seed for c in ordered)
    for seed in spec.SEEDS:
        ranks = [0 if c.attack == "none" else 1 if c.share == 0.3 else 2 for c in ordered if c.seed == seed]
        assert ranks == sorted(ranks)


def test_the_dry_run_prints_the_plan_its_size_and_hours_and_writes_nothing(tmp_path, capsys):
    script.main(["--dry-run", "--raw-dir", str(tmp_path), "--seconds-per-run", "60"])
    out = capsys.readouterr().out
    planned = len(script.split_refused(spec.cells())[0])
    assert f"plan: {len(spec.cells())} cells" in out and f"{planned} runs planned" in out
    left = re.search(r"all that is left: (\d+) runs, about ([0-9.]+) h of one core", out)
    assert left is not None, out
    runs, hours = int(left.group(1)), float(left.group(2))
    knowing = sum(c.attack in spec.KNOWING for c in script.split_refused(spec.cells())[0])
    expected = (runs - knowing + script.KNOWING_FACTOR * knowing) * 60 / 3600
    assert runs == planned and hours == pytest.approx(expected, abs=0.051)
    assert not list(tmp_path.rglob("*.json"))


def test_the_plan_written_for_the_sweep_is_every_run_left_as_the_sweeps_grid_file_reads_it(tmp_path):
    import tomllib

    from server_app.sweep import plan

    path = tmp_path / "plan.toml"
    script.main(["--raw-dir", str(tmp_path), "--write-plan", str(path), "--methods", "ifca", "--seeds", "0"])
    specs = plan(grid=tomllib.loads(path.read_text()))
    expected = [c for c in script.split_refused(spec.cells())[0] if c.method == "ifca" and c.seed == 0]
    assert [s.run_config for s in specs] == [{"min-nodes": spec.CLIENTS, **c.config} for c in spec.in_order(expected)]
    assert {s.num_supernodes for s in specs} == {spec.CLIENTS}
    assert not (tmp_path / spec.GRID).exists()  # a plan runs nothing; the app's refusals are recorded
    _, reasons = script.split_refused(spec.cells())
    assert len(records.load_records(spec.REFUSED_GRID, tmp_path)) == len(reasons)


def test_the_script_refuses_values_outside_the_grid(tmp_path):
    with pytest.raises(SystemExit, match="unknown methods"):
        script.main(["--dry-run", "--raw-dir", str(tmp_path), "--methods", "fedavg,nosuch"])
    with pytest.raises(SystemExit, match="unknown shares"):
        script.main(["--dry-run", "--raw-dir", str(tmp_path), "--shares", "0.5"])


def test_the_run_without_attackers_trains_exactly_as_attack_none(tmp_path):
    """The grid's run without an attack is a backdoor at share 0: no client attacks, so every client ends exactly as
    without any attack, and each reports the trigger's success with no backdoor planted (the baseline)."""
    from tests.in_process import run_in_process

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    plain = run_in_process("fedavg", tmp_path / "a", **{"record-messages": False})[0]
    baseline = run_in_process("fedavg", tmp_path / "b", attack="backdoor", **{"attack-share": 0.0})[0]
    for c, metrics in plain.client_eval.items():
        other = baseline.client_eval[c]
        assert (metrics["personal-acc"], metrics["personal-loss"]) == (other["personal-acc"], other["personal-loss"])
        assert 0.0 <= other["backdoor-success"] <= 1.0 and "backdoor-success" not in metrics


# --------------------------------------------------------------------------- the renderer on synthetic records
def run(setting, method, attack, share, rule, seed, per_client, *, loss=None, error=None, aborted=None, **summary):
    """A record of the grid: ``per_client`` is every client's final personalized accuracy (``loss``: their losses,
    by default 1 - accuracy)."""
    cell = {
        "setting": setting,
        "method": method,
        "attack": attack,
        "attackers": share,
        "aggregator": rule,
        "seed": seed,
    }
    bad = bad_at(share) if attack != "none" else []
    honest = float(np.mean([a for c, a in enumerate(per_client) if c not in bad]))
    r = rec(cell, personal=None if error else float(np.mean(per_client)), grid=spec.GRID, error=error)
    losses = loss if loss is not None else [round(1 - a, 6) for a in per_client]
    backdoor = summary.pop("per_client_backdoor", None)
    columns = ["client", "num-examples", "personal-acc", "personal-loss", "test-examples"]
    rows = [[c, 10 + c, a, lo, 36] for c, (a, lo) in enumerate(zip(per_client, losses, strict=True))]
    if backdoor is not None:
        columns.append("backdoor-success")
        rows = [[*row, b] for row, b in zip(rows, backdoor, strict=True)]
        honest_backdoor = float(np.mean([b for c, b in enumerate(backdoor) if c not in bad]))
        summary.setdefault("backdoor-success", honest_backdoor)
    r["clients"] = {"columns": columns, "rows": rows}
    r["fingerprint"]["data-columns"] = ["client", "num-examples", "test-examples"]
    r["summary"].update(
        {
            "attack": attack,
            "aggregator": rule,
            "attackers": bad,
            "honest-personal-acc": None if error or attack == "none" else honest,
            "aborted": aborted,
            "rounds": 10,
            **summary,
        }
    )
    return r


def write(tmp_path, recs):
    for r in recs:
        records.write_record(r, tmp_path)
    return tmp_path


def noisy(base: float, seed: int, spread: float = 0.004) -> list[float]:
    """Ten clients' accuracies around ``base``, a different small spread per seed (a real cell's noise)."""
    rng = np.random.default_rng(seed)
    return [float(np.clip(base + rng.normal(0, spread), 0, 1)) for _ in CLIENTS]


def shifted(accs: list[float], by: float, share: float) -> list[float]:
    bad = bad_at(share)
    return [a if c in bad else a + by for c, a in enumerate(accs)]


SETTING, M = "label-skew", "fedavg"


def cell_runs(method, rule, attack, share, by, seeds=range(5), base=0.9, **summary):
    """(no-attack runs, attacked runs) of one cell over ``seeds``: the honest clients moved by ``by``."""
    refs = [run(SETTING, method, "none", 0.0, rule, s, noisy(base, s)) for s in seeds]
    hits = [run(SETTING, method, attack, share, rule, s, shifted(noisy(base, s), by, share), **summary) for s in seeds]
    return refs, hits


def test_a_cell_holds_where_the_losss_interval_stays_within_the_threshold_and_is_hurt_beyond_it(tmp_path):
    held_refs, held = cell_runs(M, "multi-krum", "sign-flip", 0.3, -0.005)
    _, hurt = cell_runs(M, "median", "sign-flip", 0.3, -0.08)
    hurt_refs = [run(SETTING, M, "none", 0.0, "median", s, noisy(0.9, s)) for s in range(5)]
    _, broke = cell_runs(M, "trimmed-mean", "sign-flip", 0.3, -0.4)
    broke_refs = [run(SETTING, M, "none", 0.0, "trimmed-mean", s, noisy(0.9, s)) for s in range(5)]
    grid = section.Records.load(write(tmp_path, held_refs + held + hurt_refs + hurt + broke_refs + broke))
    v = section.verdict(grid, SETTING, M, "multi-krum", "sign-flip", 0.3)
    assert v.label == "held" and v.loss is not None and v.loss.point == pytest.approx(-0.005, abs=1e-9)
    assert v.loss.lo >= -section.HELD and len(v.loss.seeds) == 5
    assert section.verdict(grid, SETTING, M, "median", "sign-flip", 0.3).label == "hurt"
    assert section.verdict(grid, SETTING, M, "trimmed-mean", "sign-flip", 0.3).label == "broke"


def test_a_cell_whose_interval_straddles_the_threshold_is_not_told_apart(tmp_path):
    refs = [run(SETTING, M, "none", 0.0, "mean", s, noisy(0.9, s)) for s in range(3)]
    hits = [
        run(SETTING, M, "noise", 0.3, "mean", s, shifted(noisy(0.9, s), by, 0.3))
        for s, by in enumerate([0.0, -0.04, -0.01])
    ]
    grid = section.Records.load(write(tmp_path, refs + hits))
    v = section.verdict(grid, SETTING, M, "mean", "noise", 0.3)
    assert v.loss is not None and v.loss.lo < -section.HELD < v.loss.hi and v.label == "not told apart"


def test_no_cell_is_held_while_its_backdoor_succeeds(tmp_path):
    """The accuracy half holds (no loss at all), the backdoor half does not: the backdoor sends 90 % of the honest
    clients' triggered inputs to its target, against 5 % with no backdoor planted."""
    refs = [
        run(SETTING, M, "none", 0.0, "mean", s, noisy(0.9, s), per_client_backdoor=noisy(0.05, s)) for s in range(5)
    ]
    hits = [
        run(SETTING, M, "backdoor", 0.3, "mean", s, noisy(0.9, s), per_client_backdoor=noisy(0.9, s)) for s in range(5)
    ]
    quiet = [  # a backdoor that did not take: its trigger scores what it scores with none planted, give or take
        run(
            SETTING,
            M,
            "backdoor",
            0.1,
            "mean",
            s,
            shifted(noisy(0.9, s), -0.001, 0.1),
            per_client_backdoor=noisy(0.05, s),
        )
        for s in range(5)
    ]
    grid = section.Records.load(write(tmp_path, refs + hits + quiet))
    v = section.verdict(grid, SETTING, M, "mean", "backdoor", 0.3)
    assert v.loss is not None and v.loss.lo >= -section.HELD  # no accuracy lost ...
    assert v.backdoor_took_hold and v.label == "hurt" and "backdoor 0.90" in v.text()  # ... but not held
    assert v.baseline is not None and v.baseline[2] < 0.1
    held = section.verdict(grid, SETTING, M, "mean", "backdoor", 0.1)
    assert not held.backdoor_took_hold and held.label == "held"


def test_a_lie_whose_runs_equal_their_runs_without_an_attack_bit_for_bit_had_no_effect(tmp_path):
    refs = [run(SETTING, "pifl", "none", 0.0, "mean", s, noisy(0.9, s)) for s in range(3)]
    same = [run(SETTING, "pifl", "side-channel", 0.3, "mean", s, noisy(0.9, s)) for s in range(3)]
    grid = section.Records.load(write(tmp_path, refs + same))
    v = section.verdict(grid, SETTING, "pifl", "mean", "side-channel", 0.3)
    assert v.label == "had no effect here" and v.held and "held" not in v.text()
    # one client's loss differs in its last digit: the lie did something, and the cell is judged as any other
    moved = run(SETTING, "pifl", "side-channel", 0.3, "mean", 0, noisy(0.9, 0), loss=[0.1] * 10)
    grid = section.Records.load(write(tmp_path, [moved]))
    assert section.verdict(grid, SETTING, "pifl", "mean", "side-channel", 0.3).label == "held"


def test_a_stopped_run_breaks_the_cell_and_a_run_outside_the_rules_assumption_is_marked(tmp_path):
    refs = [run(SETTING, M, "none", 0.0, "bulyan", s, noisy(0.9, s)) for s in range(2)]
    hits = [
        run(SETTING, M, "alie", 0.3, "bulyan", 0, noisy(0.9, 0), **{"outside-assumption": 10}),
        run(
            SETTING,
            M,
            "alie",
            0.3,
            "bulyan",
            1,
            [0.1] * 10,
            error="the run stopped early: round 5: every train reply failed",
            aborted="round 5: every train reply failed",
        ),
    ]
    grid = section.Records.load(write(tmp_path, refs + hits))
    v = section.verdict(grid, SETTING, M, "bulyan", "alie", 0.3)
    assert v.label == "broke" and v.stopped == 1 and v.outside == 1
    assert "stopped in 1 of 2 runs" in v.text() and "outside the rule's assumption in 1 of 2 runs" in v.text()


def threat_records(winner_rule="multi-krum"):
    """FedAvg and FedRep under every attack of 'send crafted updates' at 10 %: FedRep with ``winner_rule`` and FedAvg
    with the median hold under all of them, FedRep with the mean breaks under sign-flip."""
    out = []
    attacks = spec.THREATS["send crafted updates"]
    for method, rule, base, by in (
        ("fedavg", "median", 0.95, -0.001),
        ("fedrep", winner_rule, 0.97, -0.002),
        ("fedrep", "mean", 0.98, -0.3),
    ):
        for s in range(3):
            out.append(run(SETTING, method, "none", 0.0, rule, s, noisy(base, s)))
            out.extend(run(SETTING, method, a, 0.1, rule, s, shifted(noisy(base, s), by, 0.1)) for a in attacks)
    return out


def test_the_recommendation_is_the_most_accurate_combination_that_held_under_every_attack_of_the_threat(tmp_path):
    grid = section.Records.load(write(tmp_path, threat_records()))
    text = section.recommendation(grid, "send crafted updates", 0.1, SETTING)
    assert text is not None
    n = len(spec.THREATS["send crafted updates"])
    assert text.startswith(f"Label-skew data: use FedRep with Multi-Krum: it held under all {n}")
    # what it costs: FedRep with Multi-Krum against FedRep with the mean, both without an attack, paired
    assert re.search(r"it costs -1\.0 \[-\d\.\d, -\d\.\d\] points against FedRep with the mean", text), text
    assert "With one global model: FedAvg with the median" in text
    assert section.recommendation(grid, "send crafted updates", 0.3, SETTING) == "Label-skew data: not yet measured."
    assert section.recommendation(grid, "lie in a side channel", 0.1, "planted-clusters") is not None  # IFCA's lie


def test_without_a_combination_that_held_under_all_the_recommendation_names_the_closest_and_what_it_missed(tmp_path):
    recs = [r for r in threat_records() if not (r["cell"]["method"] == "fedrep" and r["cell"]["aggregator"] != "mean")]
    recs = [r for r in recs if not (r["cell"]["method"] == "fedavg" and r["cell"]["attack"] == "alie")]
    for s in range(3):  # FedAvg with the median loses 10 points under ALIE
        recs.append(run(SETTING, "fedavg", "alie", 0.1, "median", s, shifted(noisy(0.95, s), -0.1, 0.1)))
    grid = section.Records.load(write(tmp_path, recs))
    text = section.recommendation(grid, "send crafted updates", 0.1, SETTING)
    n = len(spec.THREATS["send crafted updates"])
    assert text is not None and "no method and rule held under every one of these attacks" in text
    assert f"The closest: FedAvg with the median, held under {n - 1} of {n}" in text and "ALIE (hurt" in text


def test_qin_et_als_finding_is_checked_on_the_backdoors_success_under_the_mean(tmp_path):
    recs = []
    for method, success in (("fedrep", 0.05), ("ditto", 0.8), ("fedavg", 0.9)):
        for s in range(3):
            recs.append(run(SETTING, method, "none", 0.0, "mean", s, noisy(0.9, s), per_client_backdoor=noisy(0.05, s)))
            hit = [min(b, 0.05) for b in noisy(success, s + 10)] if method == "fedrep" else noisy(success, s)
            recs.append(run(SETTING, method, "backdoor", 0.3, "mean", s, noisy(0.9, s), per_client_backdoor=hit))
    grid = section.Records.load(write(tmp_path, recs))
    claims = section.qin_claims(grid)
    line = next(c for c in claims if c.startswith("Backdoor by 30 %"))
    assert "FedRep 0.05 (held" in line and "Ditto 0.80 (took hold" in line and line.endswith("this agrees.")
    assert any(c.startswith("Backdoor by 10 %") and "not yet measured" in c for c in claims)


def test_the_threshold_is_stated_against_the_cells_noise_and_the_resolution_of_one_test_error(tmp_path):
    refs, hits = cell_runs(M, "mean", "sign-flip", 0.3, -0.01)
    grid = section.Records.load(write(tmp_path, refs + hits))
    lines = section.noise_lines(grid)
    assert lines[0].startswith("The threshold, 2 points, is set against the cells' noise")
    honest = len(CLIENTS) - len(bad_at(0.3))
    assert f"at most {100 / (honest * 36):.2f} points" in lines[1]  # 36 test examples per client here


def test_cells_not_run_and_refused_are_said_so_and_counted(tmp_path):
    reason = "ConfigConflict: aggregator='median' cannot be used with method 'fedc2i': its server averages nothing"
    refusal = rec(
        {"setting": SETTING, "method": "fedc2i", "attack": "none", "aggregator": "median"},
        grid=spec.REFUSED_GRID,
        error=reason,
    )
    refusal["refused"] = reason
    raw = write(tmp_path, [run(SETTING, M, "none", 0.0, "mean", 0, noisy(0.9, 0)), refusal])
    grid = section.Records.load(raw)
    assert section.verdict(grid, SETTING, "fedc2i", "median", "none", 0.0).label == "refused"
    assert section.verdict(grid, SETTING, M, "mean", "sign-flip", 0.3).label == "not run"
    lines, counts = section.coverage(grid)
    assert counts["recorded"] == 1 and counts["planned"] == len(spec.cells()) - len(spec.SEEDS)
    assert "sign-flip by 30 % of the clients" in lines[1]
    table = section.refusal_table(grid)
    assert table is not None and "its server averages nothing" in table and "aggregator=" not in table


def test_the_page_says_nothing_is_measured_without_records_and_keeps_its_frame(tmp_path):
    text = section.render_advice(tmp_path)
    assert "Nothing of this grid is measured yet" in text and "recommendation" in text
    frame = f"# title\n\nabove\n\n{section.BEGIN}\nold\n{section.END}\n\nbelow\n"
    out = section.page_text(frame, "new block")
    assert out.startswith("# title\n\nabove\n\n") and out.endswith(f"{section.END}\n\nbelow\n") and "old" not in out
    with pytest.raises(ValueError, match="must hold"):
        section.page_text("no markers", "x")


def test_the_page_and_the_section_render_whatever_records_exist(tmp_path):
    raw = write(tmp_path, threat_records())
    advice = section.render_advice(raw)
    assert (
        "**If up to 10 % of the clients may send crafted updates**" in advice and "use FedRep with Multi-Krum" in advice
    )
    text = section.render_robustness(raw, records.run_config_defaults())
    assert "Label-skew data, attackers 10 % of the clients." in text and "FedRep, Multi-Krum" in text
    assert section.figures_robustness(raw) == []  # the figure shows the attacks by 30 %: none here
    thirty = [r for r in threat_records() if r["cell"]["attack"] == "none"]
    thirty += [run(SETTING, "fedrep", "sign-flip", 0.3, "median", s, noisy(0.9, s)) for s in range(3)]
    (tmp_path / "thirty").mkdir()
    (fig,) = section.figures_robustness(write(tmp_path / "thirty", thirty))
    assert [p.title for p in fig.panels] == ["sign-flip by 30 % of the clients"]


# --------------------------------------------------------------------------- the committed records and the page
def _committed() -> list[dict]:
    return [r for r in records.load_records(spec.GRID) if "setting" in r["cell"]]


def test_docs_robustness_md_holds_what_the_records_give():
    assert section.PAGE.read_text() == section.build_page(records.RAW), (
        "docs/robustness.md's generated block differs from what benchmarks/raw/ gives: run "
        "`python -m benchmarks.report` and commit the result"
    )


def test_the_pages_own_words_about_the_grid_are_the_grids():
    text = re.sub(r"\s+", " ", section.PAGE.read_text().split(section.END, 1)[1])
    shares = " and ".join(f"{s * 100:g} %" for s in spec.SHARES)
    assert f"at {shares} of {spec.CLIENTS} clients" in text and f"{len(spec.SEEDS)} seeds" in text


def test_the_committed_runs_are_cells_of_the_grid_with_nothing_else_set():
    grid = {repr(c.coordinates): c.config for c in spec.cells()}
    for r in _committed():
        assert repr(r["cell"]) in grid, r["cell"]
        expected = grid[repr(r["cell"])]
        assert all(r["run-config"].get(k) == v for k, v in expected.items()), r["cell"]
        assert r["num-supernodes"] == spec.CLIENTS


def test_the_committed_refusals_are_what_the_app_says_today():
    committed = [r for r in records.load_records(spec.REFUSED_GRID) if "setting" in r["cell"]]
    if not committed:
        pytest.skip("no refusal of this grid committed yet")
    _, reasons = script.split_refused(spec.cells())
    got = {
        (c["setting"], c["method"], c["attack"], c["aggregator"]): r["refused"] for r in committed if (c := r["cell"])
    }
    assert got == {k: v for k, v in reasons.items() if k in got}


def test_a_record_whose_methods_code_changed_since_it_ran_is_run_again_unless_kept(tmp_path, capsys):
    """The one-commit rerun: a record that keeps the digests of the files its method ran is skipped while they are
    today's, and planned again once one differs (``--keep-stale`` keeps it)."""
    from benchmarks.method_code import ROOT, file_digests

    [first, *_] = [r for r in script.split_refused(spec.cells())[0] if r.method == "fedavg" and r.seed == 0]
    ask = ["--dry-run", "--raw-dir", str(tmp_path), "--methods", "fedavg", "--seeds", "0", "--seconds-per-run", "1"]

    def left(*extra: str) -> int:
        script.main([*ask, *extra])
        found = re.search(r"all that is left: (\d+) runs", capsys.readouterr().out)
        assert found is not None
        return int(found.group(1))

    def record(files: dict[str, str]) -> dict:
        return {
            "grid": spec.GRID,
            "cell": first.coordinates,
            "run-config": first.config,
            "error": None,
            "summary": {},
            "code": {"commit": "f" * 40, "files": files},
        }

    everything = left()
    today = file_digests("fedavg", ROOT)
    records.write_record(record(today), tmp_path)
    assert left() == everything - 1  # today's code: skipped
    records.write_record(record({**today, next(iter(today)): "0" * 64}), tmp_path)
    assert left() == everything  # its method's code changed since: run again
    assert left("--keep-stale") == everything - 1

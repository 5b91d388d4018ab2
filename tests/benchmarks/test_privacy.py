"""The accuracy-against-epsilon benchmark (benchmarks/privacy.py) and its section of RESULTS.md.

The noise multiplier of each target is searched on the accountant the runs use (task/privacy.py); the committed
records must be what that search and the runs' own accountant give; the section is rendered from the records
(refusals as the runs reported them, gaps paired by seed) and its figure sets infinity apart.
"""

from __future__ import annotations

import math

import pytest

from benchmarks import privacy as script
from benchmarks import records
from benchmarks.reporting import figures
from benchmarks.reporting import privacy as section
from task.config import parse_settings
from task.methods import METHODS as REGISTRY
from task.options import ConfigConflict
from task.privacy import central_bound, local_bound

from .test_report import rec


# --------------------------------------------------------------------------- the noise multiplier of a target
@pytest.mark.parametrize("mode", ["central", "local"])
@pytest.mark.parametrize("target", [1.0, 4.0, 16.0])
def test_the_search_reaches_each_target_on_the_runs_accountant(mode, target):
    acc = script.accounting(mode)
    assert (acc.rounds, acc.population, acc.cohort, acc.delta) == (10, 10, 10, 1e-5)  # the defaults, 10 nodes
    sigma = script.noise_multiplier_for(target, acc.epsilon)
    direct = (
        central_bound(sigma, 10, 1e-5).rdp if mode == "central" else local_bound(sigma, 10, 1e-5).rdp
    )  # the accountant itself, not the script's wrapper (the Rényi-DP bound the committed runs reported)
    assert target * (1 - script.TOLERANCE) <= direct <= target
    assert sigma == script.round_up(sigma)  # what the run config gets: DIGITS significant digits
    # less noise, by the last digit, would overshoot the target or stay within it: the search is tight
    smaller = sigma - 10 ** (math.floor(math.log10(sigma)) - script.DIGITS + 1)
    assert acc.epsilon(smaller) > target * (1 - script.TOLERANCE)


def test_local_dp_needs_twice_the_central_multiplier_for_the_same_epsilon():
    # a local release moves by 2C between two data sets of a client, the central mean's sum by C (task/privacy.py)
    central = script.noise_multiplier_for(4.0, script.accounting("central").epsilon)
    local = script.noise_multiplier_for(4.0, script.accounting("local").epsilon)
    assert local == pytest.approx(2 * central, rel=2e-3)


def test_the_search_follows_the_settings_a_cohort_and_more_rounds():
    acc = script.accounting("central", {"num-server-rounds": 20, "fraction-train": 0.5}, clients=10)
    assert (acc.rounds, acc.cohort, acc.population) == (20, 5, 10)
    sigma = script.noise_multiplier_for(4.0, acc.epsilon)
    assert 4.0 * (1 - script.TOLERANCE) <= central_bound(sigma, 20, 1e-5, 0.5).rdp <= 4.0


def test_the_search_refuses_targets_it_cannot_reach():
    with pytest.raises(ValueError, match="finite and > 0"):
        script.noise_multiplier_for(math.inf, script.accounting("central").epsilon)
    with pytest.raises(ValueError, match="almost no noise"):
        script.noise_multiplier_for(1e9, script.accounting("central").epsilon)


def test_round_up_keeps_the_target():
    assert script.round_up(3.66812) == 3.669 and script.round_up(12.8101) == 12.82 and script.round_up(1.149) == 1.149


# --------------------------------------------------------------------------- the plan
def test_the_plan_sets_only_method_seed_and_the_dp_keys():
    runs = script.plan(list(script.METHODS), list(script.TARGETS), list(script.SEEDS))
    cells = [(r.cell["method"], r.cell["epsilon"], r.cell["seed"]) for r in runs]
    assert len(cells) == len(set(cells))
    for r in runs:
        m, e, s = r.cell["method"], r.cell["epsilon"], r.cell["seed"]
        if e == script.INF:
            assert r.config == {"method": m, "seed": s} and r.target["mode"] == "off"
        else:
            assert r.config == {
                "method": m,
                "seed": s,
                "dp-mode": script.METHODS[m],
                "dp-noise-multiplier": r.target["noise-multiplier"],
            }
            assert r.target["epsilon"] == float(e) and r.target["predicted-epsilon"] <= float(e)
    # every method without DP at every seed; DP at every seed where the method supports it; a refusal once per
    # target (first seed); Local never with DP
    assert sum(e == script.INF for _, e, _ in cells) == len(script.METHODS) * len(script.SEEDS)
    for m in ("fedavg", "ditto", "fedc2i"):
        assert sum(c[0] == m and c[1] != script.INF for c in cells) == len(script.TARGETS) * len(script.SEEDS)
    assert {c for c in cells if c[0] == "fedcac" and c[1] != script.INF} == {
        ("fedcac", "1", 0),
        ("fedcac", "4", 0),
        ("fedcac", "16", 0),
    }
    assert not [c for c in cells if c[0] == "local" and c[1] != script.INF]
    assert [r.cell["seed"] for r in runs] == sorted(r.cell["seed"] for r in runs)  # seed by seed


def test_the_planned_configs_start_or_are_refused_with_the_registry_reason():
    for r in script.plan(list(script.METHODS), [4.0], [0]):
        if r.target["mode"] != "off" and script.refused(r.cell["method"], r.target["mode"]):
            with pytest.raises(ConfigConflict) as err:
                parse_settings(r.config)
            assert REGISTRY[r.cell["method"]].privacy.why_not in str(err.value)
        else:
            settings = parse_settings(r.config)
            assert settings.dp_mode == r.config.get("dp-mode", "off")


# --------------------------------------------------------------------------- the committed records
def _committed() -> list[dict]:
    return records.load_records(section.GRID)


def test_the_committed_records_ran_the_searched_multipliers_and_reached_their_targets():
    recs = [r for r in _committed() if r.get("dp-target", {}).get("epsilon") is not None]
    if not recs:
        pytest.skip("no privacy records committed yet")
    for r in recs:
        t = r["dp-target"]
        acc = script.accounting(t["mode"], {k: r["run-config"][k] for k in ("num-server-rounds", "fraction-train")})
        assert t["noise-multiplier"] == script.noise_multiplier_for(t["epsilon"], acc.epsilon)
        assert r["run-config"]["dp-noise-multiplier"] == t["noise-multiplier"]
        assert r["run-config"]["dp-mode"] == t["mode"]
        if script.refused(r["cell"]["method"], t["mode"]):  # a refusal: it says so, with the registry's reason
            assert r["error"] and REGISTRY[r["cell"]["method"]].privacy.why_not in r["error"]
            continue
        if r["error"]:  # a run that started and stopped later (e.g. its replies rejected): no final epsilon
            continue
        # the multiplier was searched on the Renyi-DP bound; the run's own server accountant reports the tighter of
        # it and the PLD bound at that multiplier: at most the searched epsilon, which is at most the target
        reported = r["summary"]["epsilon"]
        assert reported == pytest.approx(tighter_bound(t["mode"], t["noise-multiplier"], t["accounting"]), rel=1e-9)
        assert reported <= t["predicted-epsilon"] * (1 + 1e-9) and t["predicted-epsilon"] <= t["epsilon"]
        assert r["summary"]["delta"] == t["accounting"]["delta"]


def tighter_bound(mode: str, sigma: float, a: dict) -> float:
    """The epsilon the server reports at noise multiplier ``sigma``: the tighter of its two accountants."""
    from task.privacy import central_bound, local_bound

    if mode == "central":
        return central_bound(sigma, a["rounds"], a["delta"], a["cohort"] / a["population"]).epsilon
    return local_bound(sigma, a["rounds"], a["delta"]).epsilon


def test_the_committed_runs_differ_from_the_defaults_only_in_the_dp_keys():
    defaults = records.run_config_defaults()
    allowed = {"method", "seed", "min-nodes", "results-dir", "dp-mode", "dp-noise-multiplier"}
    for r in _committed():
        changed = {k for k, v in r["run-config"].items() if defaults.get(k) != v}
        assert changed <= allowed, (r["cell"], changed - allowed)


# --------------------------------------------------------------------------- the section
def _grid(tmp_path, accs, refusal="task.options.ConfigConflict: dp-mode='central' is not available for method 'x'"):
    """Records of grid privacy: ``accs[(method, epsilon)]`` is a list of accuracies by seed (None: refused)."""
    for (method, eps), per_seed in accs.items():
        for seed, acc in enumerate(per_seed):
            mode = "off" if eps == "inf" else ("local" if method == "fedc2i" else "central")
            sigma = {"1": 12.82, "4": 3.669, "16": 1.149}.get(eps)
            cfg = {"dp-mode": mode, "dp-clip": 1.0, **({"dp-noise-multiplier": sigma} if sigma else {})}
            r = rec({"method": method, "epsilon": eps, "seed": seed}, personal=acc, grid="privacy", config=cfg)
            r["dp-target"] = {"epsilon": None if eps == "inf" else float(eps), "mode": mode, "noise-multiplier": sigma}
            if mode != "off":
                r["summary"].update(epsilon=float(eps) * 0.997, delta=1e-5)
            if (method, eps, seed) == ("fedavg", "16", 1):  # the server rejected some of its replies
                r["failures"] = {"count": 3, "first": ["metric 'train-loss' must be in [0, 1e+09], got 2.5e+10"]}
                r["rounds"][-1]["eval-clients"] = 7
            if acc is None:
                r["error"], r["rounds"] = f"Traceback\n{refusal}\nERROR :     Exit Code: 700", []
                r["summary"] = dict.fromkeys(r["summary"])
            records.write_record(r, tmp_path)


def _rows(text_):
    return [line.split(" | ") for line in text_.splitlines() if line.startswith("| ") and "---" not in line][1:]


def test_the_table_pairs_each_epsilon_with_the_methods_own_run_without_dp(tmp_path):
    _grid(
        tmp_path,
        {
            ("fedavg", "inf"): [0.90, 0.94],
            ("fedavg", "16"): [0.50, 0.60],
            ("fedavg", "1"): [0.10, 0.12],
            ("fedcac", "inf"): [0.95, 0.97],
            ("fedcac", "1"): [None],
            ("fedcac", "16"): [None],
            ("local", "inf"): [0.80, 0.82],
        },
    )
    text_ = section.render_privacy(tmp_path, records.run_config_defaults())
    rows = _rows(text_)
    assert [(r[0][2:], r[2]) for r in rows] == [
        ("FedAvg", "1"),
        ("FedAvg", "16"),
        ("FedAvg", "∞"),
        ("FedCAC", "1, 16"),  # every DP run refused alike: one row
        ("FedCAC", "∞"),
        ("Local", "∞"),
    ]
    fedavg_1, fedavg_16, fedavg_inf, cac_dp = rows[0], rows[1], rows[2], rows[3]
    assert fedavg_1[1:6] == ["central", "1", "12.82", "0.997 (δ 1e-05)", "2"]
    assert fedavg_16[6] == "0.5500 (0.5000-0.6000)"
    assert fedavg_16[7].rstrip(" |") == "-37.0 (-40.0 to -34.0)"  # paired by seed with FedAvg without DP
    assert fedavg_inf[4] == "∞ (no DP)" and fedavg_inf[7].rstrip(" |") == "—"
    assert cac_dp[6] == (
        "refused at start-up: task.options.ConfigConflict: dp-mode='central' is not available for method 'x'"
    )
    assert "FedAvg (without DP 0.9200): -81.0 points at ε=1, -37.0 points at ε=16 (means over seeds)." in text_
    assert "At ε=16, above Local (0.8100, no model leaves a client): none." in text_
    assert "at most the target in 4 of 4 DP runs" in text_
    assert (
        "FedAvg at ε=16: the server's reply gate rejected 3 replies in 1 of 2 runs (e.g. metric 'train-loss' must "
        "be in [0, 1e+09], got ...); its accuracy is the mean over the clients evaluated in the last round: 7 of "
        "10." in text_
    )
    # the noise per coordinate, from the records' run configs: central sigma * clip / clients
    assert "dp-clip / clients, dp-clip=1): 1.28 at ε=1, 0.115 at ε=16" in text_
    assert "](privacy_epsilon.png)" in text_ and "../docs/privacy.md#local-dp-in-fedc2i" in text_


def test_the_section_without_records_names_the_command(tmp_path):
    text_ = section.render_privacy(tmp_path, {})
    assert "run `python -m benchmarks.privacy`" in text_ and "|" not in text_
    assert section.figures_privacy(tmp_path) == []


def test_the_figure_puts_epsilon_on_a_log_axis_and_infinity_beyond_a_break(tmp_path):
    _grid(
        tmp_path,
        {
            ("fedavg", "inf"): [0.9, 0.94],
            ("fedavg", "4"): [0.5, 0.6],
            ("fedavg", "16"): [0.7, 0.8],
            ("fedcac", "inf"): [0.95],
            ("fedcac", "4"): [None],
            ("local", "inf"): [0.8, 0.82],
        },
    )
    (fig,) = section.figures_privacy(tmp_path)
    (panel,) = fig.panels
    assert isinstance(panel, figures.BrokenAxisPanel)
    lines = {line.label: line for line in panel.lines}
    assert lines["FedAvg"].x == [2.0, 4.0, 6.0] and lines["FedAvg"].y == pytest.approx([0.55, 0.75, 0.92])
    assert lines["FedAvg"].lo == pytest.approx([0.5, 0.7, 0.9]) and lines["FedAvg"].hi == pytest.approx(
        [0.6, 0.8, 0.94]
    )
    assert lines["FedCAC"].x == [6.0]  # refused runs have no point
    assert lines["Local (no release)"].reference and lines["Local (no release)"].y == pytest.approx([0.81] * 3)
    assert panel.xticks == ["4", "16", "∞"] and panel.xtick_at == [2.0, 4.0, 6.0] and panel.break_at is not None
    assert 4.0 < panel.break_at < 6.0
    assert "(1-2 seeds per point" in fig.title
    path = figures.draw(fig, tmp_path)
    assert figures.stored_digest(path) == fig.digest()

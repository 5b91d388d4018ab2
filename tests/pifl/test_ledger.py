"""PI-FL's token ledger (pifl.md §2.4): every round's entry is the settlement of the spec and adds up to
the balances, late joiners bring their tokens, the ledger exists from the first round on, and pifl_ledger.json /
pifl_ledger.png (docs/methods/pifl.md "Artefacts") hold the round log and plot it."""

import json

import numpy as np
import pytest

from strategies.pifl_artifacts import write_artifacts
from strategies.pifl_math import (
    LedgerError,
    TokenLedger,
)
from task.methods.pifl import MICRO
from task.params import record_to_numpy
from tests.pifl.server_kit import NODES, TIER_ACC, pifl, sent, tier_accuracies
from tests.strategy_harness import drive, with_metrics


def test_a_late_joiner_gets_the_initial_tokens_and_the_ledger_stays_conserved():
    strat = pifl(**{"slots-performance": 1, "slots-random": 1, "initial-tokens": 7.0})
    drive(strat, NODES, 2)
    drive(strat, {**NODES, 55: 4}, [3])
    assert strat.ledger.balances[4] >= 0 and strat.ledger.supply == 5 * 7 * MICRO == strat.ledger.total()
    assert strat.ledger_log[-1]["total"] == 35 * MICRO


def test_the_ledger_artefact_holds_every_round(tmp_path):
    strat = pifl(**{"slots-performance": 1, "slots-random": 1})
    drive(strat, NODES, 2, tier_accuracies)
    write_artifacts(strat, tmp_path)
    data = json.loads((tmp_path / "pifl_ledger.json").read_text())
    assert data["micro-tokens-per-token"] == MICRO and [r["round"] for r in data["rounds"]] == [1, 2]
    assert data["rounds"][1]["total"] == 400 * MICRO and sorted(data["rounds"][1]["tiers"]) == ["0", "1"]
    assert (tmp_path / "pifl_ledger.png").stat().st_size > 0


# ------------------------------------------------------------------------------------------ the round's ledger log
SHARE_A = {0: 0.1, 1: 0.3, 2: 0.6, 3: 0.9}  # each client's share of source A (two-source partitions)


TIER0_LEVEL = {1: 0.5, 2: 0.55, 3: 0.5, 4: 0.6}  # tier 0's accuracy by round: gains below and above gamma, a loss


def ledger_acc(rnd, c, k):
    """Client c's accuracy of tier k after round rnd."""
    return TIER0_LEVEL[rnd] + 0.02 * c if k == 0 else TIER_ACC[c][k]


def ledger_round_answer(rnd, node, phase, content):
    c = NODES[node]
    if phase == "bid":
        return [with_metrics(content, bid=[0] if c < 3 else [1])]
    if phase == "train":
        return [with_metrics(content, source_a_share=SHARE_A[c])]
    if phase == "evaluate":
        return [with_metrics(content, tier_acc=[ledger_acc(rnd, c, k) for k in (0, 1)])]
    return None


def test_every_rounds_ledger_entry_is_the_settlement_of_spec_2_4_and_adds_up_to_the_balances():
    # pifl.md §2.4 per tier and round r >= 2: payers pay tau_p into P_k; theta = eta_R (gamma - min(gamma, delta)) /
    # gamma
    # with delta the relative gain of Acc_k (mean a_ck over the tier's winners) over its best so far; floor(theta P_k)
    # refunded in equal shares; the rest paid by reverse rank (n - pos) / beta; the log entry says all of it
    eta, gamma, price = 0.5, 0.25, 2 * MICRO
    strat = pifl(
        **{"slots-performance": 1, "slots-random": 1, "max-refund": eta, "full-use-gain": gamma, "slot-price": 2.0}
    )
    grid = drive(strat, NODES, 4, ledger_round_answer)
    log = strat.ledger_log
    assert [e["round"] for e in log] == [1, 2, 3, 4]
    # the bid query of round r tells every client its own balance after round r - 1, and the price (pifl.md §7)
    bids = sent(grid, "bid")
    assert sorted((r, c) for r, c, _ in bids) == [(r, c) for r in (2, 3, 4) for c in range(4)]
    for r, c, content in bids:
        assert dict(content["ledger"]) == {"balance": log[r - 2]["balances"][c], "price": price}
    assert len({content["ledger"]["balance"] for r, c, content in bids if r == 4}) > 1  # balances differ by then
    # a winner is sent its own tier's model: the one every client evaluated at the end of the previous round
    evaluated = {r: record_to_numpy(content["tiers"]) for r, c, content in sent(grid, "evaluate") if c == 0}
    for r, c, content in sent(grid, "train"):
        if r > 1:
            k = content["tier"]["tier"]
            assert c in log[r - 1]["tiers"][k]["members"]
            for key, v in record_to_numpy(content["arrays"]).items():
                np.testing.assert_array_equal(v, evaluated[r - 1][key][k])
    best = {k: np.mean([ledger_acc(1, c, k) for c in log[0]["tiers"][k]["members"]]) for k in (0, 1)}
    ratios = []
    balances, pools = dict.fromkeys(range(4), 100 * MICRO), {0: 0, 1: 0}
    for e in log[1:]:
        for k in (0, 1):
            t = e["tiers"][k]
            members = t["members"]
            assert members == sorted(members) and t["payers"] == members and t["delivered"] == members
            assert set(members) <= ({0, 1, 2} if k == 0 else {3}) and len(members) == (2 if k == 0 else 1)
            utility = np.mean([ledger_acc(e["round"], c, k) for c in members])
            assert t["utility"] == pytest.approx(utility)
            gain = max(0.0, (utility - best[k]) / best[k])
            ratio = eta * (gamma - min(gamma, gain)) / gamma
            assert t["refund-ratio"] == pytest.approx(ratio)
            ratios.append(ratio)
            best[k] = max(best[k], utility)
            assert t["payments"] == dict.fromkeys(members, price)
            pool = pools[k] + price * len(members)
            share = int(np.floor(ratio * pool + 1e-6)) // len(members)
            assert t["refunds"] == dict.fromkeys(members, share)
            rest = pool - share * len(members)
            n = len(members)
            assert sorted(t["rewards"].values(), reverse=True) == [
                (n - p) * rest // (n * (n + 1) // 2) for p in range(n)
            ]
            pools[k] = rest - sum(t["rewards"].values())
            assert t["pool"] == pools[k] and 0 <= t["pool"] < n  # only rounding dust stays
            for c in members:
                balances[c] += t["refunds"][c] + t["rewards"][c] - price
            assert t["source-a-share"] == pytest.approx(np.mean([SHARE_A[c] for c in members]))
        assert e["balances"] == balances and e["total"] == 400 * MICRO == sum(balances.values()) + sum(pools.values())
    assert strat.ledger.balances == balances and strat.ledger.pools == pools
    assert any(0 < r < eta for r in ratios) and eta in ratios  # a partial refund and a full one were exercised
    # Omega_kc (pifl.md §2.3) counts every round client c won a slot of tier k; each round's history names the tier
    # sizes
    for k in (0, 1):
        tally: dict[int, int] = {}
        for e in log:
            for c in e["tiers"][k]["members"]:
                tally[c] = tally.get(c, 0) + 1
        assert strat.counts[k] == tally
    assert [h.extra["pifl"] for h in strat.history] == [
        {"tier-sizes": {k: len(e["tiers"][k]["members"]) for k in (0, 1)}} for e in log
    ]
    assert log[0]["tiers"][0]["source-a-share"] == pytest.approx(
        np.mean([SHARE_A[c] for c in log[0]["tiers"][0]["members"]])
    )


def test_the_ledger_artefact_is_the_round_log_and_its_plot_an_image(tmp_path):
    # docs/methods/pifl.md "Artefacts": pifl_ledger.json holds every round's entry as logged (balances, per-tier
    # settlement, membership share of source A); pifl_ledger.png plots balances and membership
    strat = pifl(**{"slots-performance": 1, "slots-random": 1})
    drive(strat, NODES, 3, ledger_round_answer)
    write_artifacts(strat, tmp_path)
    data = json.loads((tmp_path / "pifl_ledger.json").read_text())
    assert data == json.loads(json.dumps({"micro-tokens-per-token": MICRO, "rounds": strat.ledger_log}))
    assert [r["round"] for r in data["rounds"]] == [1, 2, 3]
    assert data["rounds"][2]["balances"] == {str(c): b for c, b in strat.ledger.balances.items()}
    from PIL import Image

    with Image.open(tmp_path / "pifl_ledger.png") as img:
        assert img.format == "PNG" and img.size == (1100, 400)  # two panels, 11 x 4 inches at 100 dpi


def test_the_ledger_plot_draws_every_clients_balance_and_every_tiers_membership_per_round(tmp_path, monkeypatch):
    """pifl_ledger.png (docs "Artefacts"): left, one line per client of the last round, its balance in tokens over
    the rounds (a gap before a late joiner joined); right, one line per tier, its members' mean share of source A,
    on [0, 1]; the two panels side by side."""
    import strategies.pifl_artifacts as module
    from tests.strategy_harness import kept_figures

    figures = kept_figures(monkeypatch, module)
    strat = pifl(**{"slots-performance": 1, "slots-random": 1})
    drive(strat, NODES, 2, ledger_round_answer)
    late = max(NODES.values()) + 1  # a fifth client connects in round 3

    def answer(rnd, node, phase, content):
        if node in NODES:
            return ledger_round_answer(rnd, node, phase, content)
        return {
            "bid": [with_metrics(content, bid=[1])],
            "train": [with_metrics(content, source_a_share=0.5)],
            "evaluate": [with_metrics(content, tier_acc=[0.5, 0.5])],
        }.get(phase)

    drive(strat, {**NODES, 55: late}, [3], answer)
    write_artifacts(strat, tmp_path)
    (fig,) = figures
    ax1, ax2 = fig.axes
    assert (
        ax1.get_position().y0 == pytest.approx(ax2.get_position().y0) and ax1.get_position().x1 < ax2.get_position().x0
    )
    log = strat.ledger_log
    clients = sorted(log[-1]["balances"])
    assert late in clients and len(ax1.lines) == len(clients)
    for line, c in zip(ax1.lines, clients, strict=True):
        assert list(line.get_xdata()) == [1, 2, 3]
        expected = [e["balances"][c] / MICRO if c in e["balances"] else np.nan for e in log]
        np.testing.assert_allclose(line.get_ydata(), expected)
    assert np.isnan(ax1.lines[clients.index(late)].get_ydata()[:2]).all()
    assert (
        ax1.get_title() == "token balance per client" and ax1.get_ylabel() == "tokens" and ax1.get_xlabel() == "round"
    )
    assert all(line.get_linewidth() == 0.8 for line in ax1.lines)  # thin: one line per client
    assert ax2.get_title() == "tier membership: mean share of source A" and ax2.get_xlabel() == "round"
    assert [ln.get_label() for ln in ax2.lines] == ["tier 0", "tier 1"] and ax2.get_ylim() == (0, 1)
    for k, line in enumerate(ax2.lines):
        shares = [e["tiers"][k]["source-a-share"] for e in log]
        assert list(line.get_xdata()) == [1, 2, 3] and line.get_marker() == "o"
        np.testing.assert_allclose(line.get_ydata(), [np.nan if v is None else v for v in shares])
    assert any(np.isfinite(line.get_ydata()).any() for line in ax2.lines)


def test_a_run_without_rounds_writes_an_empty_ledger_and_no_plot(tmp_path):
    strat = pifl()
    write_artifacts(strat, tmp_path)
    assert json.loads((tmp_path / "pifl_ledger.json").read_text()) == {"micro-tokens-per-token": MICRO, "rounds": []}
    assert not (tmp_path / "pifl_ledger.png").exists()


def test_a_late_joiner_brings_its_own_tokens_and_joins_only_once():
    ledger = TokenLedger([0, 1], num_tiers=2, initial=100 * MICRO, price=MICRO)
    ledger.charge(0, [0])
    ledger.add_client(7, 40 * MICRO)
    assert ledger.balances[7] == 40 * MICRO and ledger.supply == 240 * MICRO
    ledger.check()  # conserved: the supply grew by exactly the newcomer's tokens
    with pytest.raises(LedgerError, match="client 7 is already in the ledger"):
        ledger.add_client(7, 10 * MICRO)
    assert ledger.balances[7] == 40 * MICRO and ledger.supply == 240 * MICRO


# ---------------------------------------------------------------- the ledger exists from the first round on
def test_the_ledger_used_before_the_first_round_opened_it_is_an_error_that_says_when_it_exists():
    """The ledger is opened when round 1 starts (or restored by a resume); a use before that must fail loudly
    instead of settling on a ledger that is not there, and say when the ledger exists."""
    strat = pifl()
    for too_early in (strat.open_ledger, lambda: strat.on_round_end(1)):
        with pytest.raises(RuntimeError) as err:
            too_early()
        message = str(err.value)
        assert "ledger" in message and "before the first round opened it" in message  # what was wrong
        assert "once round 1 has started" in message and "resume" in message  # when it is there
    drive(strat, NODES, 1)
    opened = strat.open_ledger()
    assert opened is strat.ledger and sorted(opened.balances) == sorted(NODES.values())
    resumed = pifl()
    resumed.checkpoint.resume(strat.checkpoint.state(), 1)
    assert resumed.open_ledger().balances == opened.balances  # restored without a round

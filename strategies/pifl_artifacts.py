"""PI-FL's artefacts (docs/methods/pifl.md, "Artefacts"): the token ledger per round (``pifl_ledger.json``) and
the balances and tier membership over the rounds (``pifl_ledger.png``)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from strategies.pifl import PIFLStrategy
from strategies.plots import integer_ticks, pyplot, save
from task.methods.pifl import MICRO


def write_artifacts(strategy: PIFLStrategy, folder: Path) -> None:
    plt = pyplot()
    (folder / "pifl_ledger.json").write_text(
        json.dumps({"micro-tokens-per-token": MICRO, "rounds": strategy.ledger_log}, indent=1)
    )
    if not strategy.ledger_log:
        return
    rounds = [e["round"] for e in strategy.ledger_log]
    clients = sorted(strategy.ledger_log[-1]["balances"])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for c in clients:
        ax1.plot(rounds, [e["balances"].get(c, np.nan) / MICRO for e in strategy.ledger_log], lw=0.8)
    ax1.set_title("token balance per client")
    ax1.set_xlabel("round")
    integer_ticks(ax1)
    ax1.set_ylabel("tokens")
    for k in range(strategy.num_tiers):
        ys = [e["tiers"][k]["source-a-share"] for e in strategy.ledger_log]
        ax2.plot(rounds, [np.nan if y is None else y for y in ys], marker="o", label=f"tier {k}")
    ax2.set_ylim(0, 1)
    ax2.set_title("tier membership: mean share of source A")
    ax2.set_xlabel("round")
    integer_ticks(ax2)
    ax2.legend()
    save(plt, fig, folder / "pifl_ledger.png")

"""What every end-to-end DP run must report, whatever its mode (shared by the central and the local e2e tests)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from server_app.runner import summary_line


def reported_dp(summary: dict[str, Any], mode: str, neighbours: str, expected: list[float]) -> list[dict[str, Any]]:
    """Check a two-round, four-client run's DP report (summary, summary line, rounds.json) against the epsilon
    the accountant gives round by round (``expected``); return each round's ``dp`` record for the mode's own
    checks."""
    assert summary["rounds"] == 2 and summary["clients"] == 4 and summary["failures"] == 0
    assert summary["dp-mode"] == mode and summary["delta"] == 1e-5
    assert summary["epsilon"] == pytest.approx(expected[-1]) and summary["dp-neighbours"] == neighbours
    line = summary_line(summary["log"])
    assert line is not None and f"({expected[-1]:.3g}, 1e-05)-DP ({mode})" in line
    rounds = json.loads((Path(summary["results"]) / "rounds.json").read_text())
    dp = [r["extra"]["dp"] for r in rounds]
    assert [d["epsilon"] for d in dp] == pytest.approx(expected)
    return dp


def same_accuracy_every_round(plain: dict[str, Any], private: dict[str, Any]) -> None:
    """The two runs' personalized accuracy agrees round by round (to a hundredth)."""
    rounds = [json.loads((Path(s["results"]) / "rounds.json").read_text()) for s in (plain, private)]
    for a, b in zip(*rounds, strict=True):
        assert b["evaluate"]["personal-acc"] == pytest.approx(a["evaluate"]["personal-acc"], abs=0.01)

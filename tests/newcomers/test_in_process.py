"""Every method with a held-out client, its real client handlers in one process (tests/in_process.py) at the user's
defaults shrunk in rounds and samples: the held-out client is asked who it is and then, after the last round, only
what a newcomer is asked (pFedLIA's newcomer also scores the stored lazy models first); it replies with both scores;
and every message of the run, the newcomer's included, is what the method declares (docs/privacy.md)."""

from __future__ import annotations

import pytest

from server_app.app import build_strategy
from strategies.disclosure_check import mismatches
from task.config import parse_settings
from task.methods import METHODS
from tests.in_process import run_in_process

#: the messages a held-out client may get: who it is, then (after the last round) the newcomer's
ALLOWED = {"query.identify", "query.newcomer"}
#: pFedLIA's newcomer scores the stored lazy models (query.lia) to find its cluster, as a late joiner does
EXTRA = {"pfedlia": {"query.lia"}}


@pytest.mark.parametrize("method", sorted(METHODS))
def test_a_held_out_client_is_only_a_newcomer_and_its_messages_are_declared(method, tmp_path):
    strategy, server, _, config = run_in_process(method, tmp_path, nodes=4, **{"holdout-clients": 1})
    to_node: dict[int, list[tuple[int, str]]] = {}
    for line in server:
        if line["direction"] == "pushed":
            to_node.setdefault(line["node"], []).append((line["round"], line["type"]))
    (newcomer,) = [n for n, sent in to_node.items() if any(t == "query.newcomer" for _, t in sent)]
    assert {t for _, t in to_node[newcomer]} <= ALLOWED | EXTRA.get(method, set())
    assert {r for r, t in to_node[newcomer] if t != "query.identify"} == {2}  # after the last round only
    assert strategy.holdout.first == 3 and strategy.client_of[newcomer] == 3
    assert all(strategy.client_of[n] != 3 for n, sent in to_node.items() if any(t == "train" for _, t in sent))
    (scores,) = strategy.holdout.results.values()
    assert 0.0 <= scores["newcomer-acc"] <= 1.0 and 0.0 <= scores["newcomer-finetuned-acc"] <= 1.0
    assert strategy.failures == []
    declared = build_strategy(parse_settings(config)).disclosure()
    assert "query.newcomer" in declared
    assert mismatches(declared, server) == []

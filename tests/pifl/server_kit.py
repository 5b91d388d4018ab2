"""The PI-FL federation the server tests drive (tests/strategy_harness.py): four nodes whose ids are not
their partition ids, the strategies built as the ServerApp builds them, the clients' scripted answers, and the
two-source run config of the tier tables."""

import numpy as np

from task.config import parse_settings
from task.params import to_record
from tests.strategy_harness import drive, strategy, with_metrics

NODES = {901: 0, 17: 1, 4242: 2, 333: 3}  # node id -> partition id


def pifl(**cfg):
    return strategy("pifl", **{"dataset": "digits", "model": "mlp", "min-nodes": 4, "server-set-size": 50, **cfg})


TIER_ACC = {0: [0.9, 0.2], 1: [0.7, 0.4], 2: [0.3, 0.8], 3: [0.5, 0.6]}  # client -> its accuracy of tiers 0, 1


def sent(grid, phase):
    """(round, client, content) of every message of ``phase`` the strategy sent."""
    out = []
    for m in grid.sent:
        kind = m.metadata.message_type
        if kind.split(".", 1)[-1] == phase:
            out.append((int(m.content["config"]["server-round"]), NODES[m.metadata.dst_node_id], m.content))
    return out


def tier_accuracies(rnd, node, phase, content):
    if phase == "evaluate":
        return [with_metrics(content, tier_acc=TIER_ACC[NODES[node]])]
    return None


SIZES = {0: 10, 1: 30, 2: 20, 3: 40}


def train_one_round_with_offsets(strat, seed, scale):
    """Round 1 in which client c answers its train message with the round's starting model plus its own random
    offset and SIZES[c] examples; returns (starting model, SIZES, offsets)."""
    base = {k: v.copy() for k, v in strat.tiers[0].items()}
    rng = np.random.default_rng(seed)
    offset = {c: {k: rng.normal(scale=scale, size=v.shape).astype(v.dtype) for k, v in base.items()} for c in range(4)}

    def answer(rnd, node, phase, content):
        c = NODES[node]
        if phase == "train":
            out = with_metrics(content, num_examples=SIZES[c])
            out["arrays"] = to_record({k: v + offset[c][k] for k, v in base.items()})
            return [out]
        return None

    drive(strat, NODES, 1, answer)
    return base, SIZES, offset


def two_source(**cfg):
    return parse_settings(
        {
            "method": "pifl",
            "dataset": "digits",
            "model": "mlp",
            "partition": "two-source",
            "mixture": "10:90",
            "min-nodes": 4,
            **cfg,
        }
    )


def pifl_one_slot(**cfg):
    """One performance and one random slot per tier."""
    return pifl(**{"slots-performance": 1, "slots-random": 1, **cfg})

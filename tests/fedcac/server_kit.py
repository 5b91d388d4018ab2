"""What FedCAC's server tests share: four nodes whose ids are not their client ids, replies with planted
critical masks driven through the strategy's own round loop (tests/strategy_harness.py), and the figures the
artefacts writer draws."""

from collections.abc import Iterable
from typing import Any

import numpy as np

from strategies.fedcac import FedCACStrategy
from strategies.plots import pyplot
from task.params import to_record
from tests.strategy_harness import drive
from tests.strategy_harness import kept_figures as harness_kept_figures

pyplot()  # matplotlib on Agg, loaded with the module: the artefact tests plot


def planted_bits(n, client, server_round):
    """Critical masks with two planted groups (clients 0, 1 and 2, 3): each client's mask is its group's base
    mask with a few client- and round-specific flips, so overlaps differ within and across groups."""
    base = np.random.default_rng(1000 + client // 2).random(n) < 0.5
    flips = np.random.default_rng(7 * client + 31 * server_round).choice(n, n // 20 * (1 + client % 2), replace=False)
    base[flips] = ~base[flips]
    return np.packbits(base)


Sent = dict[tuple[int, int], dict[str, Any]]  # (round, client) -> what its train reply carried


def play(strat: FedCACStrategy, nodes: dict[int, int], rounds: int | Iterable[int], sent: Sent) -> None:
    """Drive ``rounds`` of ``strat``; ``sent[(round, client)]`` keeps what each client's train reply carried."""

    def answer(rnd, node, phase, content):
        if phase == "train":
            cid = nodes[node]
            n = sum(int(np.prod(s)) for s in strat.param_shapes.values())
            bits = planted_bits(n, cid, rnd)
            content["mask"] = to_record({"bits": bits})
            content["metrics"]["num-examples"] = 5 + cid
            sent[(rnd, cid)] = {
                "arrays": {k: np.array(v.numpy()) for k, v in content["arrays"].items()},
                "bits": bits,
                "hist": list(content["metrics"].get("label-histogram", [])),
            }

    drive(strat, nodes, rounds, answer)


NODES = {21: 2, 22: 0, 23: 3, 24: 1}  # node id -> client id; neither order is the other's


def kept_figures(monkeypatch):
    """pyplot for strategies.fedcac, except that closed figures are kept for inspection."""
    import strategies.fedcac_artifacts as module

    return harness_kept_figures(monkeypatch, module)

"""A scripted pFedLIA federation: the server's round loop (tests/strategy_harness.py) against clients whose
replies the test chooses, so every model the strategy should hold or send is known in closed form.  Client ids are
not 0..N-1 and node ids differ from them, so an index into the lazy list, a client id and a node id cannot be
confused."""

from typing import Any

import numpy as np
from flwr.app import MetricRecord

from strategies.pfedlia import PFedLIAStrategy
from task.config import parse_settings
from task.params import record_to_numpy, to_record
from tests.strategy_harness import (
    ReplayGrid,
    build_as,
    outgoing_messages,
    phase_of,
    reply_message,
    run_round,
    valid_content,
)

CLIENTS = [3, 8, 11, 20, 25, 31]


PLANTED = {3: 0, 8: 1, 11: 0, 20: 1, 25: 0, 31: 1}  # two planted groups of three


EXAMPLES = {3: 2, 8: 3, 11: 5, 20: 7, 25: 11, 31: 13}


NODE = {c: 9000 - 17 * i for i, c in enumerate(CLIENTS)}  # node ids in the opposite order of the client ids


def trained_value(rnd, c):
    """Every array of client c's round-rnd train reply holds this one number."""
    return float(100 * rnd + c)


def lazy_value(c):
    return float(1000 + c)


def influence(i, j):
    """I(i, j): positive within a planted group, negative across (a little client-specific spread)."""
    return (6.0 if PLANTED[i] == PLANTED[j] else -6.0) + 0.01 * ((i * 7 + j) % 5)


class Federation:
    """Runs the strategy over scripted clients; records every message sent (round, phase, client, content)."""

    def __init__(
        self,
        method="pfedlia",
        rounds=3,
        silent=(),
        beneficial=None,
        planted=True,
        influence=influence,
        clients=CLIENTS,
        identify_planted=False,
        **cfg,
    ):
        self.strategy = build_as(
            PFedLIAStrategy,
            parse_settings(
                {
                    "dataset": "digits",
                    "model": "mlp",
                    "min-nodes": 1,
                    "num-server-rounds": rounds,
                    "local-epochs": 1,
                    "method": method,
                    "warmup-rounds": 1,
                    "optics-min-samples": 2,
                    **({"partition": "planted-clusters"} if method == "oracle" else {}),
                    **cfg,
                }
            ),
        )
        self.silent = set(silent)  # (round, phase, client) that send nothing
        self.beneficial = beneficial or (
            lambda i, lazy_ids: [k for k, j in enumerate(lazy_ids) if PLANTED[j] == PLANTED[i] and j != i]
        )
        self.planted = planted
        self.identify_planted = identify_planted  # identify replies carry the planted group (as the client's do)
        self.influence = influence
        self.sent = []
        self.present = {r: list(clients) for r in range(1, rounds + 1)}

    def respond(self, msg):
        client = {n: c for c, n in NODE.items()}[msg.metadata.dst_node_id]
        phase, rnd = phase_of(msg), int(msg.content["config"]["server-round"])
        self.sent.append((rnd, phase, client, msg.content))
        if (rnd, phase, client) in self.silent:
            return []
        content = valid_content(
            self.strategy.reply_spec(phase, msg.metadata.dst_node_id), client, seed=rnd * 100 + client
        )
        metrics: dict[str, Any] = dict(content.metric_records["metrics"])
        metrics["num-examples"] = EXAMPLES[client]
        metrics.pop("planted-cluster", None)
        if phase == "identify" and self.identify_planted:
            metrics["planted-cluster"] = PLANTED[client]
        if phase == "train":
            if self.planted:
                metrics["planted-cluster"] = PLANTED[client]
            content["arrays"] = to_record(
                {
                    k: np.full_like(v, trained_value(rnd, client))
                    for k, v in record_to_numpy(content.array_records["arrays"]).items()
                }
            )
        elif phase == "lazy":
            content["arrays"] = to_record(
                {
                    k: np.full_like(v, lazy_value(client))
                    for k, v in record_to_numpy(content.array_records["arrays"]).items()
                }
            )
        elif phase == "lia":
            lazy_ids = list(msg.content["lazy-clients"]["client-ids"])
            metrics["lia-row"] = [self.influence(client, j) for j in lazy_ids]
            if "beneficial" in metrics:
                metrics["beneficial"] = list(self.beneficial(client, lazy_ids))
        content["metrics"] = MetricRecord(metrics)
        return [reply_message(msg.metadata.dst_node_id, content)]

    def run(self):
        s = self.strategy
        with outgoing_messages():
            for r in range(1, s.settings.num_rounds + 1):
                grid = ReplayGrid([NODE[c] for c in self.present[r]], self.respond)
                run_round(s, grid, r)
        return self

    def messages(self, rnd, phase):
        return {c: content for r, p, c, content in self.sent if r == rnd and p == phase}

    def payload(self, rnd, phase, client, record="arrays"):
        return record_to_numpy(self.messages(rnd, phase)[client][record])


def fedavg(clients, rnd):
    """FedAvg of the scripted train replies: sum n_j v_j / sum n_j (pfedlia.md §2.6)."""
    n = np.array([EXAMPLES[c] for c in clients], float)
    return float(n @ [trained_value(rnd, c) for c in clients] / n.sum())


def assert_holds(state, value):
    for k, v in state.items():
        np.testing.assert_allclose(v, np.full(v.shape, value, np.float32), rtol=1e-6, err_msg=k)


def same_partition(labels: dict, groups: dict) -> bool:
    return all((labels[a] == labels[b]) == (groups[a] == groups[b]) for a in labels for b in labels)


# peer-to-peer: client 3 finds only client 11 beneficial (not its whole planted group), everyone else its group
def p2p_beneficial(i, lazy_ids):
    if i == 3:
        return [lazy_ids.index(11)]
    return [k for k, j in enumerate(lazy_ids) if PLANTED[j] == PLANTED[i] and j != i]


P2P_SETS = {c: sorted({c} | {j for j in CLIENTS if PLANTED[j] == PLANTED[c]}) for c in CLIENTS}


P2P_SETS[3] = [3, 11]

"""The Client2Vec federation the server tests drive (tests/strategy_harness.py): six nodes whose ids are
not in client order, the strategy built small as the ServerApp builds it, a recorder of every reply, and
comparisons of model states."""

import numpy as np
import torch._dynamo  # noqa: F401  the DSA-IGN's first Adam imports it (seconds): once at collection, not per test

from tests.strategy_harness import phase_of, strategy

NODES = {9001: 3, 12: 0, 777: 5, 4: 1, 55: 4, 60: 2}  # Flower node id -> partition id, node ids out of client order


def c2v(**cfg):
    base = {
        "model": "mlp",
        "min-nodes": len(NODES),
        "c2v-ign-ff": 8,
        "c2v-ign-upload": 4,
        "c2v-ign-epochs": 2,
    }
    return strategy("client2vec", **{**base, **cfg})


class Recorder:
    """drive()'s answer callback: keeps every reply sent, per phase, as (server round, client, content);
    ``change(server_round, node, phase, content)`` may return other contents (``[]``: the node stays silent)."""

    def __init__(self, change=None):
        self.change = change
        self.replies: dict[str, list] = {}

    def __call__(self, server_round, node, phase, content):
        out = self.change(server_round, node, phase, content) if self.change is not None else None
        contents = [content] if out is None else out
        for c in contents:
            self.replies.setdefault(phase, []).append((server_round, int(c["metrics"]["partition-id"]), c))
        return contents

    def by_client(self, phase, server_round=None):
        rows = [r for r in self.replies.get(phase, []) if server_round is None or r[0] == server_round]
        return [c for _, _, c in sorted(rows, key=lambda r: r[1])]


def sent(grid, phase, server_round=None):
    return [
        m
        for m in grid.sent
        if phase_of(m) == phase and (server_round is None or int(m.content["config"]["server-round"]) == server_round)
    ]


def arrays(content, record="arrays"):
    return {k: content[record][k].numpy() for k in content[record]}


def assert_state_equal(got, expected):
    assert set(got) == set(expected)
    for k in expected:
        np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(expected[k]), err_msg=k)


def assert_state_close(got, expected):
    assert set(got) == set(expected)
    for k in expected:
        np.testing.assert_allclose(np.asarray(got[k]), np.asarray(expected[k]), rtol=1e-5, atol=1e-6, err_msg=k)


def cos_loop(a, b):
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


ARMS_OFF = {"c2v-sampling": False, "c2v-aggregation": False, "c2v-local": False}

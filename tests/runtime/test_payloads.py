"""What the server sends: every message of a round carries the model the strategy holds when the round starts.

The global model's record is built once per phase and shared by the messages of that phase (speed);
these tests pin that sharing never sends a stale or another round's model.
"""

import numpy as np
import pytest
from flwr.app import ConfigRecord

from server_app.app import build_strategy
from task.config import parse_settings
from tests.strategy_harness import (
    ReplayGrid,
    outgoing_messages,
    phase_of,
    reply_message,
    shared_arrays,
    valid_content,
)

NODES = [11, 4, 29]


def _arrays(record) -> dict[str, np.ndarray]:
    return {k: v.numpy() for k, v in record.items()}


@pytest.mark.parametrize("method,key", [("fedavg", "arrays"), ("fedcac", "global")])
def test_every_message_carries_the_global_model_of_its_round(method, key):
    strategy = build_strategy(
        parse_settings(
            {
                "method": method,
                "dataset": "digits",
                "model": "mlp",
                "min-nodes": 3,
                "num-server-rounds": 3,
                "local-epochs": 1,
            }
        )
    )

    def respond(msg):
        node, phase = msg.metadata.dst_node_id, phase_of(msg)
        seed = int(msg.content["config"]["server-round"]) * 100 + node  # different updates every round
        return [reply_message(node, valid_content(strategy.reply_spec(phase, node), NODES.index(node), seed))]

    grid = ReplayGrid(NODES, respond)
    with outgoing_messages():
        for server_round in (1, 2, 3):
            expected = {k: np.array(v) for k, v in strategy.global_state.items()}
            sent = len(grid.sent)
            messages = strategy.configure_train(server_round, shared_arrays(strategy), ConfigRecord(), grid)
            train = grid.send_and_receive(messages)
            messages = [m for m in grid.sent[sent:] if phase_of(m) == "train"]
            assert len(messages) == len(NODES)
            for m in messages:
                got = _arrays(m.content[key])
                assert set(got) == set(expected)
                for k, value in expected.items():
                    np.testing.assert_array_equal(got[k], value)
            arrays, _ = strategy.aggregate_train(server_round, train)
            assert arrays is not None, "every reply was valid, so the round has a model"
            changed = any(not np.array_equal(strategy.global_state[k], expected[k]) for k in expected)
            assert changed, "the replies differ from the model sent, so aggregation must move it"
            evaluate = grid.send_and_receive(strategy.configure_evaluate(server_round, arrays, ConfigRecord(), grid))
            strategy.aggregate_evaluate(server_round, evaluate)

"""The message recorder's two halves without a Flower run: the server's Grid wrapper records every message pushed
and every reply pulled, the ClientApp's mod every message received and every reply sent (only with run-config
``record-messages``, and into the node's own state folder), both describing records without their values."""

import json
from types import SimpleNamespace
from typing import cast

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid

from client_app.app import recorder_mod
from server_app.recorder import RecordingGrid
from task import recording
from task.params import to_record
from tests.strategy_harness import OutgoingMessage, ReplayGrid, reply_message

SECRET = 1234.5  # a value that must never appear in a recording


def _content(server_round: int) -> RecordDict:
    return RecordDict(
        {
            "arrays": to_record({"w": np.full((2, 3), SECRET, np.float32)}),
            "config": ConfigRecord({"server-round": server_round, "phase": "train", "peers": [11, 12]}),
        }
    )


def _reply_content() -> RecordDict:
    return RecordDict(
        {
            "arrays": to_record({"w": np.full((2, 3), SECRET, np.float32), "n": np.array(7, np.int64)}),
            "metrics": MetricRecord({"num-examples": 7, "train-loss": SECRET, "scores": [SECRET] * 5}),
        }
    )


def test_the_grid_wrapper_records_every_message_pushed_and_reply_pulled(tmp_path):
    path = tmp_path / recording.SERVER_FILE
    inner = ReplayGrid([5, 6], lambda m: [reply_message(m.metadata.dst_node_id, _reply_content())])
    grid = RecordingGrid(cast(Grid, inner), path)
    assert list(grid.get_node_ids()) == [5, 6]
    messages = [cast(Message, OutgoingMessage(_content(3), "train", node)) for node in (5, 6)]
    replies = list(grid.send_and_receive(messages, timeout=5))
    assert len(replies) == 2 and inner.sent == messages  # passed through unchanged
    lines = recording.read(path)
    assert [(e["direction"], e["type"], e["node"], e["round"]) for e in lines] == [
        ("pushed", "train", 5, 3),
        ("pushed", "train", 6, 3),
        ("pulled", "train", 5, 3),
        ("pulled", "train", 6, 3),
    ]
    assert lines[0]["content"] == {
        "arrays": {"arrays": {"w": [[2, 3], "float32"]}},
        "metrics": {},
        "configs": {"config": ["peers", "phase", "server-round"]},
        "lengths": {"config": {"peers": 2}},
    }
    assert lines[2]["content"]["arrays"]["arrays"]["n"] == [[], "int64"]
    assert lines[2]["content"]["metrics"] == {"metrics": ["num-examples", "scores", "train-loss"]}
    assert lines[2]["content"]["lengths"] == {"metrics": {"scores": 5}}  # how long a list is, not what it holds
    assert str(SECRET) not in path.read_text()


def test_a_failed_reply_is_not_recorded_as_sent_content(tmp_path):
    path = tmp_path / recording.SERVER_FILE
    inner = ReplayGrid([5], lambda m: [reply_message(5, error="crashed")])
    message = cast(Message, OutgoingMessage(_content(1), "evaluate", 5))
    RecordingGrid(cast(Grid, inner), path).send_and_receive([message], timeout=1)
    assert [e["direction"] for e in recording.read(path)] == ["pushed"]


def _message(content: RecordDict, kind: str = "query.identify"):
    return SimpleNamespace(content=content, metadata=SimpleNamespace(message_type=kind))


def _node(tmp_path, record: bool, **node_config) -> Context:
    return Context(
        run_id=1,
        node_id=42,
        node_config={"partition-id": 2, "num-partitions": 3, **node_config},
        state=RecordDict(),
        run_config={"method": "fedavg", "record-messages": record},
    )


def _served(content: RecordDict):
    reply = SimpleNamespace(content=_reply_content(), has_error=lambda: False)
    return reply, (lambda msg, ctx: reply)


def _message_config(tmp_path, content: RecordDict) -> RecordDict:
    content.config_records["config"]["state-dir"] = str(tmp_path / "suggested")
    content.config_records["config"]["run-key"] = "run-1"
    return content


def test_the_client_mod_records_what_the_node_received_and_sent_in_its_own_folder(tmp_path):
    content = _message_config(tmp_path, _content(2))
    reply, handler = _served(content)
    own = tmp_path / "node-state"
    assert recorder_mod(_message(content), _node(tmp_path, True, **{"state-dir": str(own)}), handler) is reply
    path = own / "run-1" / "client-2" / recording.CLIENT_FILE
    lines = recording.read(path)
    assert [(e["direction"], e["type"], e["node"], e["round"]) for e in lines] == [
        ("received", "query.identify", 42, 2),
        ("sent", "query.identify", 42, 2),
    ]
    assert lines[1]["content"]["arrays"] == {"arrays": {"n": [[], "int64"], "w": [[2, 3], "float32"]}}
    assert not (tmp_path / "suggested").exists()  # the node's own state-dir wins over the server's suggestion
    assert str(SECRET) not in path.read_text()


def test_the_client_mod_uses_the_folder_the_server_suggests_when_the_node_names_none(tmp_path):
    content = _message_config(tmp_path, _content(1))
    recorder_mod(_message(content), _node(tmp_path, True), _served(content)[1])
    assert (tmp_path / "suggested" / "run-1" / "client-2" / recording.CLIENT_FILE).is_file()


def test_the_client_mod_records_nothing_by_default(tmp_path):
    content = _message_config(tmp_path, _content(1))
    reply, handler = _served(content)
    assert recorder_mod(_message(content), _node(tmp_path, False), handler) is reply
    assert not any(tmp_path.rglob(recording.CLIENT_FILE))


def test_a_bad_value_of_the_key_is_refused_with_its_name():
    from task.config import parse_settings

    with pytest.raises(ValueError, match="'record-messages' must be true or false"):
        parse_settings({"record-messages": "yes"})


def test_a_broken_recording_line_is_an_error(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_text(json.dumps({"direction": "sent"}) + "\n[1, 2]\n")
    with pytest.raises(ValueError, match=r"x\.jsonl:2: expected a JSON object"):
        recording.read(path)
    path.write_text("{not json\n")
    with pytest.raises(ValueError, match=r"x\.jsonl:1: not a JSON line"):
        recording.read(path)


@pytest.mark.parametrize("missing", ["state-dir", "run-key"])
def test_the_client_mod_records_nothing_without_a_state_folder_or_a_run_key(tmp_path, monkeypatch, missing):
    """Recording on, but neither the node nor the message names a state folder (or the message names no run):
    the node has nowhere of its own to write, so it writes nothing, anywhere (not under the working directory)."""
    monkeypatch.chdir(tmp_path)
    content = _message_config(tmp_path, _content(1))
    del content.config_records["config"][missing]
    reply, handler = _served(content)
    assert recorder_mod(_message(content), _node(tmp_path, True), handler) is reply
    assert not any(tmp_path.rglob(recording.CLIENT_FILE))

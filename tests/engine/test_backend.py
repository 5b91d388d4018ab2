"""The engine's Backend runs a ClientApp as Flower's Ray actors do: on its own copy of the message and the node's
Context, with the reply and the updated Context handed back as copies, and an exception of the ClientApp turned into
Flower's ClientAppException (which the vce loop answers with an error reply)."""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from server_app import flwr_internals as fi
from server_app.engine import InProcessBackend


@pytest.fixture(autouse=True)
def identity(monkeypatch):
    """The task identity Flower's runtime gives the process (a Message is stamped with its run)."""
    for name, value in (("_run_id", 1), ("_task_id", 1), ("_node_id", fi.SUPERLINK_NODE_ID)):
        monkeypatch.setattr(fi.TaskIdentity, name, value)


def message(value: float = 1.0) -> Message:
    msg = Message(RecordDict({"arrays": ArrayRecord({"w": Array(np.full(3, value, np.float32))})}), dst_node_id=7,
                  message_type="train")  # fmt: skip
    msg.metadata.__dict__["_message_id"] = "m1"  # as a Grid sets it when it pushes the message
    return msg


def context() -> Context:
    return Context(run_id=1, node_id=7, node_config={"partition-id": 0}, state=RecordDict(), run_config={})


def backend_for(app: ClientApp) -> InProcessBackend:
    backend = InProcessBackend()
    backend.build(lambda: app)
    return backend


def test_the_client_app_works_on_copies_and_its_state_is_handed_back():
    app = ClientApp()
    kept = {}

    @app.train()
    def train(msg: Message, ctx: Context) -> Message:
        arrays = msg.content.array_records["arrays"]
        arrays["w"] = Array(arrays["w"].numpy() * 2)  # changes its own copy
        ctx.state["seen"] = ArrayRecord({"w": Array(arrays["w"].numpy())})
        kept["context"] = ctx
        return Message(RecordDict({"arrays": arrays}), reply_to=msg)

    sent, ctx = message(), context()
    reply, updated = backend_for(app).process_message(sent, ctx)
    # the server's message is untouched
    assert np.array_equal(sent.content.array_records["arrays"]["w"].numpy(), np.ones(3))
    assert np.array_equal(reply.content.array_records["arrays"]["w"].numpy(), np.full(3, 2.0))
    assert "seen" in updated.state and "seen" not in ctx.state  # the new Context is handed back, as Ray returns it
    assert updated is not kept["context"]  # a copy: the app keeps no handle on the node's stored Context


def test_an_exception_of_the_client_app_becomes_flowers_client_app_exception():
    app = ClientApp()

    @app.train()
    def train(msg: Message, ctx: Context) -> Message:
        raise RuntimeError("out of data")

    with pytest.raises(fi.ClientAppException, match="out of data"):
        backend_for(app).process_message(message(), context())


def test_one_message_at_a_time_and_a_backend_that_was_not_built_says_so():
    backend = InProcessBackend()
    assert backend.num_workers == 1 and backend.is_worker_idle()
    with pytest.raises(ValueError, match="call build"):
        backend.process_message(message(), context())

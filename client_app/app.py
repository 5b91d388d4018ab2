"""The ClientApp: one train, one evaluate and one handler per query, each dispatching to the method's code.

The run config's ``method`` picks the client class from the registry (``task.methods``); an exception in a
handler becomes an error reply (Flower does that), which the strategy logs and leaves out of the round.
"""

from __future__ import annotations

import functools

from flwr.app import Context, Message, MetricRecord
from flwr.clientapp import ClientApp

from client_app import faults
from client_app.base import ClientMethod
from task.methods import all_queries, load_object, method_spec
from task.config import Settings, parse_settings

app = ClientApp()


@functools.lru_cache(maxsize=16)
def _settings(items: tuple) -> Settings:
    return parse_settings(dict(items))


def client_for(context: Context) -> ClientMethod:
    """The client side of the run's method for this node (settings parsed once per process)."""
    settings = _settings(tuple(sorted(context.run_config.items())))
    return load_object(method_spec(settings.method).client)(context, settings)


def method_for(msg: Message, context: Context) -> ClientMethod:
    method = client_for(context)
    method.begin(msg.content)
    faults.before_handler(method.settings.fault, method.partition_id, method.round_seed)
    return method


@app.train()
def train(msg: Message, context: Context) -> Message:
    method = method_for(msg, context)
    # one message per round: the server may ask for the evaluation of the model this client starts the round
    # from (the previous round's result) together with the local update
    evaluation = method.evaluation(msg.content) if method.config.get("evaluate") else None
    method.timings.clear()  # the reply's time-train / time-method are the local update's
    content = method.train(msg.content)
    if evaluation is not None:
        content["evaluation"] = MetricRecord(evaluation)
    content = faults.corrupt_train_reply(method.settings.fault, method.partition_id,
                                         method.round_seed, content)
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    return Message(content=method_for(msg, context).evaluate(msg.content), reply_to=msg)


def _query_handler(name: str):
    def handler(msg: Message, context: Context) -> Message:
        method = method_for(msg, context)
        content = faults.corrupt_query_reply(method.settings.fault, method.partition_id, method.round_seed, name,
                                             method.query(name, msg.content))
        return Message(content=content, reply_to=msg)

    handler.__name__ = f"query_{name}"
    return handler


for _name in sorted(all_queries()):
    app.query(_name)(_query_handler(_name))

"""The ClientApp: one train, one evaluate and one handler per query, each dispatching to the method's code.

The run config's ``method`` picks the client class from the registry (``task.methods``); an exception in a
handler becomes an error reply (Flower does that), which the strategy logs and leaves out of the round.
"""

from __future__ import annotations

import functools
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from flwr.app import Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from client_app import IMPORT_STARTED, attacks, faults, floor
from client_app.base import ClientMethod
from client_app.privacy import private_reply
from task import recording
from task.config import Settings, parse_settings
from task.methods import all_queries, load_object, method_spec


def recorder_mod(msg: Message, context: Context, call_next) -> Message:
    """Flower mod: with run-config ``record-messages``, every message this node receives and every reply it sends,
    described (types, keys, shapes, never values), into the node's own state folder (:mod:`task.recording`)."""
    reply = call_next(msg, context)
    try:
        record = _settings(tuple(sorted(context.run_config.items()))).record_messages
    except ValueError:  # a bad run config: the handler failed with the reason already
        return reply
    if record:
        config: Mapping[str, Any] = msg.content.config_records.get("config") or {}
        path = recording.client_file(
            str(context.node_config.get("state-dir", config.get("state-dir", ""))),
            str(config.get("run-key", "")),
            int(context.node_config.get("partition-id", -1)),
        )
        if path is not None:
            kind, node, rnd = msg.metadata.message_type, context.node_id, recording.message_round(msg.content)
            lines = [recording.entry(recording.RECEIVED, kind, node, rnd, msg.content)]
            if not reply.has_error():
                lines.append(recording.entry(recording.SENT, kind, node, rnd, reply.content))
            recording.append(path, lines)
    return reply


app = ClientApp(mods=[recorder_mod])


def _process_start() -> float | None:
    """Unix time this process started (Linux ``/proc``), or None where that is not available."""
    try:
        ticks = int(Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()[19])
        boot = next(
            float(line.split()[1]) for line in Path("/proc/stat").read_text().splitlines() if line.startswith("btime")
        )
        return boot + ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, StopIteration):
        return None


_PROCESS_START = _process_start()


def stamped(content: RecordDict, handler_start: float, setup_done: float) -> RecordDict:
    """Add the ``timing`` record: when this process started, when this module's imports began (the package's
    :data:`client_app.IMPORT_STARTED`: importing this module imports the package first) and ended, when the handler
    began, finished its set-up (settings, data, client) and ended (unix seconds).  The server turns them, with when
    it pushed the message and pulled the reply, into where a message's time went."""
    stamps: dict[str, int | float | list[int] | list[float]] = {
        "app-import": IMPORT_STARTED,
        "app-ready": _APP_READY,
        "handler-start": handler_start,
        "setup-done": setup_done,
        "handler-end": time.time(),
    }
    if _PROCESS_START is not None:
        stamps["process-start"] = _PROCESS_START
    content["timing"] = MetricRecord(stamps)
    return content


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
    faults.before_handler(method.settings.fault, method.partition_id, method.server_round)
    attacks.poison(method)  # run-config 'attack': an attacker's training data (label-flip, backdoor)
    return method


def started(msg: Message, context: Context) -> tuple[ClientMethod, float, float]:
    """(the method's client for this message, when the handler began, when its set-up ended): unix seconds.

    A run that asks for less privacy than the node's own floor (node config ``dp-min-noise-multiplier``,
    ``dp-max-clip``, ``dp-require``; :mod:`client_app.floor`) is refused here, before any data is loaded, and so is
    a message whose round declares less (the noise multiplier and clip bound the server will apply, or this client
    must)."""
    start = time.time()
    floor.admit(context.run_config, context.node_config)
    floor.check_declared(context.run_config, context.node_config, msg.content.config_records.get("config"))
    method = method_for(msg, context)
    return method, start, time.time()


@app.train()
def train(msg: Message, context: Context) -> Message:
    method, start, setup = started(msg, context)
    # one message per round: the server may ask for the evaluation of the model this client starts the round
    # from (the previous round's result) together with the local update
    evaluation = method.evaluation(msg.content) if method.config.get("evaluate") else None
    method.timings.clear()  # the reply's time-train / time-method are the local update's
    content = method.train(msg.content)
    content = private_reply(method, content, msg.content)  # under dp-mode central / local: clipped (and noised)
    if evaluation is not None:
        content["evaluation"] = MetricRecord(evaluation)
    content = attacks.train_reply(method, msg.content, content)  # run-config 'attack': an attacker's model or mask
    content = faults.corrupt_train_reply(
        method.settings.fault, method.partition_id, method.server_round, stamped(content, start, setup)
    )
    return Message(content=content, reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    method, start, setup = started(msg, context)
    content = attacks.evaluate_reply(method, method.evaluate(msg.content))  # an attacker's side channel
    return Message(content=stamped(content, start, setup), reply_to=msg)


def query_reply(method: ClientMethod, name: str, content: RecordDict) -> RecordDict:
    """The method's reply to ``query.<name>``; a query that releases a model other clients see (declared in the
    method's ``released_queries``, e.g. pFedLIA's lazy model) leaves under the run's ``dp-mode`` as a train reply
    does: clipped, and under local DP noised, around the method's ``release_reference``."""
    reply = method.query(name, content)
    if name in method.released_queries:
        reply = private_reply(method, reply, content)
    return reply


def _query_handler(name: str):
    def handler(msg: Message, context: Context) -> Message:
        method, start, setup = started(msg, context)
        content = attacks.query_reply(method, name, msg.content, query_reply(method, name, msg.content))
        content = faults.corrupt_query_reply(
            method.settings.fault, method.partition_id, method.server_round, name, stamped(content, start, setup)
        )
        return Message(content=content, reply_to=msg)

    handler.__name__ = f"query_{name}"
    return handler


for _name in sorted(all_queries()):
    app.query(_name)(_query_handler(_name))

_APP_READY = time.time()  # this module and everything it imports are loaded

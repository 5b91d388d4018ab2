"""Drive a strategy's own round loop (configure/aggregate, query phases) in a unit test, without clients.

:class:`ReplayGrid` is a test double of Flower's ``Grid``: it lists nodes and answers every message the
strategy sends with a reply made by a callback.  :func:`valid_content` makes a reply that satisfies a
:class:`~strategies.replies.ReplySpec` (random but deterministic per seed), and :func:`corruptions` lists
the hostile variants of one reply (every declared field broken in every way that must be rejected).
:func:`snapshot` / :func:`assert_same_state` compare everything a strategy keeps between rounds.
Federated *runs* go through Flower's runtime in the e2e tests; this is for testing a strategy's logic.
"""

from __future__ import annotations

import copy
import itertools
import math
import random
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, fields, is_dataclass, replace
from types import SimpleNamespace
from typing import Any, TypeVar
from unittest import mock

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict, UserConfigValue
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.serverapp import Grid
from flwr.supercore.run import Run

from server_app.app import build_strategy
from strategies.base import PersonalizedStrategy
from strategies.replies import Arrays, Dim, Number, Numbers, ReplySpec, Tensor
from task.config import Settings, parse_settings
from task.params import to_record

# ---------------------------------------------------------------------------------------------- the strategy
S = TypeVar("S", bound=PersonalizedStrategy)


def strategy(method: str, **run_config: UserConfigValue) -> Any:
    """The strategy the ServerApp builds for a run of ``method`` with ``run_config``: its keys as Flower spells them
    (``strategy("fedavg", model="mlp", **{"min-nodes": 3})``), parsed and checked as in a run.  Typed ``Any``, so a
    test may read any method's state from it unchecked; one that wants mypy to check those reads builds the strategy
    with :func:`build_as` instead."""
    return build_strategy(parse_settings({"method": method, **run_config}))


def build_as(kind: type[S], settings: Settings) -> S:
    """``build_strategy(settings)``, checked to be a ``kind``: a test that reads a method's own state (its ledger,
    its clusters) says which strategy class it expects, and fails with the class it got if the registry disagrees."""
    strategy = build_strategy(settings)
    if not isinstance(strategy, kind):
        raise AssertionError(
            f"method {settings.method!r} builds a {type(strategy).__name__}, not the {kind.__name__} this test reads"
        )
    return strategy


# ---------------------------------------------------------------------------------------------- the grid
_ids = itertools.count(1)


class OutgoingMessage:
    """Stands in for ``flwr.app.Message`` on the way out: a Flower Message can only be made inside a running
    app (it reads the task identity), so unit tests patch ``strategies.exchange.Message`` with this."""

    def __init__(self, content: RecordDict, message_type: str, dst_node_id: int) -> None:
        self.content = content
        self.metadata = SimpleNamespace(message_type=message_type, dst_node_id=dst_node_id, message_id=f"m{next(_ids)}")


def outgoing_messages():
    """Context manager: the strategies build :class:`OutgoingMessage` s instead of Flower Messages."""
    return mock.patch("strategies.exchange.Message", OutgoingMessage)


def reply_message(src: int, content: RecordDict | None = None, error: str | None = None) -> Any:
    """A reply as the strategy sees it: metadata (source node), content, or an error."""
    return SimpleNamespace(
        metadata=SimpleNamespace(src_node_id=src, reply_to_message_id=""),
        content=content,
        has_error=lambda: error is not None,
        error=SimpleNamespace(reason=error),
    )


class GridDouble(Grid):
    """Base of the test doubles of Flower's ``Grid``: a Grid the strategies accept, outside any Flower run.  The
    strategies only list nodes and push / pull messages (``strategies.exchange``); the rest of the interface says
    it is not there instead of pretending."""

    def set_run(self, run: Run) -> None:
        raise NotImplementedError(f"a {type(self).__name__} belongs to no Flower run")

    @property
    def run(self) -> Run:
        raise NotImplementedError(f"a {type(self).__name__} belongs to no Flower run")

    def create_message(
        self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str, ttl: float | None = None
    ) -> Message:
        raise NotImplementedError("the strategies build their messages themselves (see outgoing_messages())")

    def get_node_ids(self) -> list[int]:
        raise NotImplementedError(f"a {type(self).__name__} lists no nodes")

    def push_messages(self, messages: Iterable[Message]) -> list[str]:
        raise NotImplementedError(f"a {type(self).__name__} takes no messages")

    def pull_messages(self, message_ids: Iterable[str]) -> list[Message]:
        raise NotImplementedError(f"a {type(self).__name__} has no replies")

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> list[Message]:
        raise NotImplementedError(f"a {type(self).__name__} has no replies")


class ReplayGrid(GridDouble):
    """``get_node_ids``, ``send_and_receive`` and ``push_messages`` / ``pull_messages`` over a callback
    ``respond(message) -> [reply messages]``."""

    def __init__(self, nodes: Iterable[int], respond: Callable[[Any], list[Any]]) -> None:
        self.nodes = list(nodes)
        self.respond = respond
        self.sent: list[Any] = []
        self._pending: list[Any] = []

    def get_node_ids(self) -> list[int]:
        return list(self.nodes)

    def send_and_receive(self, messages: Iterable[Any], *, timeout: float | None = None) -> list[Any]:
        out = []
        for m in messages:
            self.sent.append(m)
            out.extend(self.respond(m))
        return out

    def push_messages(self, messages: Iterable[Any]) -> list[str]:
        """Flower's Grid API as the strategy's own exchange uses it: push now; each reply names the message it
        answers (as Flower's do), and the next pull returns them all."""
        self._pending, answered = [], []
        for m in messages:
            self.sent.append(m)
            for r in self.respond(m):
                if not r.metadata.reply_to_message_id:
                    r.metadata.reply_to_message_id = m.metadata.message_id
                self._pending.append(r)
                answered.append(m.metadata.message_id)
        return answered  # a message nobody answers is a silent node: waiting for it would only wait out the timeout

    def pull_messages(self, message_ids: Iterable[str]) -> list[Any]:
        out, self._pending = self._pending, []
        return out


def phase_of(message: Any) -> str:
    kind = message.metadata.message_type
    return kind.split(".", 1)[1] if kind.startswith("query.") else kind


def shared_arrays(strategy) -> ArrayRecord:
    """What Flower's loop hands the strategy's phases: the shared model (``start``'s ``initial_arrays``, then
    what ``aggregate_train`` returned, which is the same record)."""
    return to_record(strategy.global_state) if strategy.global_state else ArrayRecord()


def run_round(strategy, grid: ReplayGrid, server_round: int) -> None:
    """One round exactly as Flower's ``Strategy.start`` drives it."""
    messages = strategy.configure_train(server_round, shared_arrays(strategy), ConfigRecord(), grid)
    arrays, _ = strategy.aggregate_train(server_round, grid.send_and_receive(messages))
    messages = strategy.configure_evaluate(server_round, arrays, ConfigRecord(), grid)
    strategy.aggregate_evaluate(server_round, grid.send_and_receive(messages))


# ---------------------------------------------------------------------------------------------- valid replies
def _number(rule: Number | Numbers, rng: random.Random) -> float | int:
    lo, hi = rule.minimum, rule.maximum
    if rule.kind is int:
        return rng.randint(int(np.ceil(lo)), int(np.floor(min(hi, lo + 1000))))
    return rng.uniform(max(lo, -1e3), min(hi, 1e3)) if hi - lo > 2e3 else rng.uniform(lo, hi)


def _value(rule: Number | Numbers, rng: random.Random) -> Any:
    if isinstance(rule, Number):
        return _number(rule, rng)
    if rule.length is not None:
        n = rule.length
    elif rule.max_length is not None:
        n = rng.randint(0, rule.max_length)
    else:  # Numbers refuses to be declared without either
        raise ValueError(f"{rule} declares neither a length nor a max_length")
    if rule.total is not None:
        w = np.array([rng.random() + 0.05 for _ in range(n)])
        return [float(v) for v in w / w.sum()]
    if rule.distinct and rule.kind is int:
        pool = list(range(int(rule.minimum), int(min(rule.maximum, rule.minimum + 1000)) + 1))
        return sorted(rng.sample(pool, min(n, len(pool))))
    return [_number(rule, rng) for _ in range(n)]


def _array(tensor: Tensor, dims: dict[int, int], rng: np.random.Generator) -> np.ndarray:
    shape = tuple(
        dims.setdefault(id(d), int(rng.integers(d.low, d.high + 1))) if isinstance(d, Dim) else d for d in tensor.shape
    )
    dtype = np.dtype(tensor.dtype)
    if np.issubdtype(dtype, np.floating):
        values = rng.standard_normal(shape)
        return (np.abs(values) if tensor.nonnegative else values).astype(dtype)
    return rng.integers(0, 100 if dtype != np.uint8 else 256, size=shape).astype(dtype)


def valid_content(spec: ReplySpec, client: int, seed: int, num_examples: int | None = None) -> RecordDict:
    """A reply that satisfies ``spec`` for ``client`` (deterministic for a seed)."""
    rng, nrng = random.Random(seed), np.random.default_rng(seed)
    dims: dict[int, int] = {}
    metrics = {k: _value(rule, rng) for k, rule in spec.metrics.items()}
    metrics["partition-id"] = client
    metrics["num-examples"] = num_examples if num_examples is not None else 10 + client
    content = RecordDict({"metrics": MetricRecord(metrics)})
    if spec.evaluation is not None:  # the evaluation of the previous round's model, asked for with this message
        content["evaluation"] = MetricRecord({k: _value(rule, rng) for k, rule in spec.evaluation.items()})
    for name, rec in spec.records.items():
        content[name] = to_record({k: _array(t, dims, nrng) for k, t in rec.tensors.items()})
    return content


# ---------------------------------------------------------------------------------------------- hostile replies
@dataclass(frozen=True)
class Corruption:
    """One way to break one field of a reply; ``apply`` returns the broken copy."""

    what: str
    apply: Callable[[RecordDict], RecordDict]


def _with_metric(key: str, value: Any, record: str = "metrics") -> Callable[[RecordDict], RecordDict]:
    def apply(content: RecordDict) -> RecordDict:
        out = copy.deepcopy(content)
        metrics: dict[str, Any] = dict(out.metric_records[record])
        if value is _MISSING:
            metrics.pop(key, None)
        else:
            metrics[key] = value
        out[record] = MetricRecord(metrics)
        return out

    return apply


def _with_array(
    record: str, key: str, change: Callable[[np.ndarray], np.ndarray | None]
) -> Callable[[RecordDict], RecordDict]:
    """``change`` gets the array ``key`` of ``record`` and returns its replacement (None: the array is dropped)."""

    def apply(content: RecordDict) -> RecordDict:
        out = copy.deepcopy(content)
        arrays = {k: v.numpy() for k, v in out.array_records[record].items()}
        new = change(arrays[key])
        if new is None:
            arrays.pop(key, None)
        else:
            arrays[key] = new
        out[record] = to_record(arrays)
        return out

    return apply


def _with_extra_array(record: str, key: str, value: np.ndarray) -> Callable[[RecordDict], RecordDict]:
    def apply(content: RecordDict) -> RecordDict:
        out = copy.deepcopy(content)
        arrays = {k: v.numpy() for k, v in out.array_records[record].items()}
        arrays[key] = value
        out[record] = to_record(arrays)
        return out

    return apply


def _without_record(record: str) -> Callable[[RecordDict], RecordDict]:
    def apply(content: RecordDict) -> RecordDict:
        out = copy.deepcopy(content)
        del out[record]
        return out

    return apply


_MISSING = object()


def _bad_numbers(rule: Number) -> list[tuple[str, Any]]:
    bad: list[tuple[str, Any]] = [
        ("NaN", float("nan")),
        ("inf", float("inf")),
        ("-inf", float("-inf")),
        ("a list", [1.0, 2.0]),
        ("huge", 1e308 if rule.kind is float else 2**62),
        # the next number beyond each bound (adding or taking 1 at float32's limits would change nothing)
        ("above the maximum", rule.maximum + 1 if rule.kind is int else math.nextafter(rule.maximum, math.inf)),
        ("below the minimum", rule.minimum - 1 if rule.kind is int else math.nextafter(rule.minimum, -math.inf)),
    ]
    if rule.minimum >= 0:
        bad.append(("negative", -1e6 if rule.kind is float else -1))
    if rule.kind is int:
        bad.append(("a float for an integer", 1.5))
    return bad


def corruptions(spec: ReplySpec, content: RecordDict, record: str = "metrics") -> list[Corruption]:
    """Every hostile variant of ``content`` that ``spec`` must reject."""
    out: list[Corruption] = []
    if record == "metrics" and spec.evaluation is not None:
        out.append(Corruption("record evaluation: missing", _without_record("evaluation")))
        nested = ReplySpec(metrics=spec.evaluation)
        out += [Corruption(f"evaluation {c.what}", c.apply) for c in corruptions(nested, content, "evaluation")]
    metrics = content.metric_records[record]
    for key, rule in spec.metrics.items():
        if key == "partition-id":
            continue  # identity clashes are tested on their own
        if rule.required:
            out.append(Corruption(f"{key}: missing", _with_metric(key, _MISSING, record)))
        if isinstance(rule, Number):
            for what, value in _bad_numbers(rule):
                out.append(Corruption(f"{key}: {what}", _with_metric(key, value, record)))
            continue
        current = metrics.get(key)
        out.append(
            Corruption(f"{key}: a scalar for a list", _with_metric(key, 0.5 if rule.kind is float else 1, record))
        )
        sample = current if isinstance(current, list) and current else [rule.minimum]
        element = Number(rule.kind, rule.minimum, rule.maximum)
        for what, value in _bad_numbers(element):
            if isinstance(value, list):
                continue
            rest = [float(v) for v in sample[1:]] if isinstance(value, float) else list(sample[1:])  # one type per list
            out.append(Corruption(f"{key}: an element {what}", _with_metric(key, [value, *rest], record)))
        if rule.length is not None:
            out.append(
                Corruption(
                    f"{key}: one element too many",
                    _with_metric(key, list(sample) + [sample[0]] * (rule.length + 1 - len(sample)), record),
                )
            )
            if rule.length > 0:
                out.append(
                    Corruption(f"{key}: one element short", _with_metric(key, list(sample)[: rule.length - 1], record))
                )
        if rule.max_length is not None:
            out.append(
                Corruption(f"{key}: too many elements", _with_metric(key, [sample[0]] * (rule.max_length + 1), record))
            )
        if rule.distinct and isinstance(current, list) and current:
            out.append(
                Corruption(f"{key}: a repeated element", _with_metric(key, [current[0]] * max(2, len(current)), record))
            )
        if rule.total is not None and isinstance(current, list) and current:
            out.append(
                Corruption(
                    f"{key}: does not sum to {rule.total}", _with_metric(key, [v * 0.5 for v in current], record)
                )
            )
    for name, rec in spec.records.items():
        if rec.required:
            out.append(Corruption(f"record {name}: missing", _without_record(name)))
        out.append(
            Corruption(f"record {name}: an extra array", _with_extra_array(name, "unexpected", np.zeros(1, np.float32)))
        )
        for key, tensor in rec.tensors.items():
            out.append(Corruption(f"{name}/{key}: missing", _with_array(name, key, lambda _: None)))
            out.append(
                Corruption(
                    f"{name}/{key}: wrong shape", _with_array(name, key, lambda a: np.zeros((*a.shape, 2), a.dtype))
                )
            )
            out.append(
                Corruption(
                    f"{name}/{key}: wrong dtype",
                    _with_array(name, key, lambda a: a.astype(np.float64 if a.dtype != np.float64 else np.float32)),
                )
            )
            if np.issubdtype(np.dtype(tensor.dtype), np.floating) and tensor.finite:
                for what, bad in (("NaN", np.nan), ("inf", np.inf)):

                    def put(a: np.ndarray, bad: float = bad) -> np.ndarray:
                        a = a.copy()
                        if a.size:
                            a.flat[a.size // 2] = bad
                        return a

                    out.append(Corruption(f"{name}/{key}: {what}", _with_array(name, key, put)))
            if tensor.nonnegative:

                def negative(a: np.ndarray) -> np.ndarray:
                    a = a.copy()
                    if a.size:
                        a.flat[a.size // 2] = -1.0
                    return a

                out.append(Corruption(f"{name}/{key}: negative", _with_array(name, key, negative)))
    return out


# ---------------------------------------------------------------------------------------------- state
_IGNORED = {
    # central DP's noise secret: drawn afresh by every strategy on purpose (no two runs share their noise)
    "failures",
    "_outbox",
    "_t0",
    "_round_start",
    "settings",
    "results_dir",
    "_server_set",
    "_holdouts",
    "spec_of",
    # a part's reference back to the strategy it belongs to (the checkpoint, the round loop): the strategy itself
    "strategy",
}


def _volatile(key: Any) -> bool:
    k = str(key)
    return k.endswith("seconds") or "rss" in k or k in _IGNORED


def snapshot(obj: Any, _depth: int = 0) -> Any:
    """A comparable copy of everything ``obj`` keeps (timings and failure logs left out)."""
    if _depth > 12:
        return repr(obj)
    if isinstance(obj, np.ndarray):
        return ("ndarray", obj.dtype.str, obj.shape, obj.tobytes())
    if isinstance(obj, torch.Tensor):
        return snapshot(obj.detach().cpu().numpy(), _depth + 1)
    if isinstance(obj, torch.nn.Module):
        return snapshot(dict(obj.state_dict()), _depth + 1)
    if isinstance(obj, random.Random):
        return ("random", obj.getstate())
    if isinstance(obj, np.random.Generator):
        return ("generator", repr(obj.bit_generator.state))
    if isinstance(obj, (np.generic,)):
        return obj.item()
    if isinstance(obj, dict):
        return {k: snapshot(v, _depth + 1) for k, v in obj.items() if not _volatile(k)}
    if isinstance(obj, (list, tuple)):
        return type(obj)(snapshot(v, _depth + 1) for v in obj)
    if isinstance(obj, (set, frozenset)):
        return ("set", sorted(map(repr, obj)))
    if isinstance(obj, float) and np.isnan(obj):
        return ("nan",)
    if is_dataclass(obj) and not isinstance(obj, type):
        return (
            type(obj).__name__,
            {f.name: snapshot(getattr(obj, f.name), _depth + 1) for f in fields(obj) if not _volatile(f.name)},
        )
    if (
        hasattr(obj, "__dict__")
        and not isinstance(obj, type)
        and type(obj).__module__.split(".")[0] in ("strategies", "task", "tests")
    ):
        return (type(obj).__name__, {k: snapshot(v, _depth + 1) for k, v in vars(obj).items() if not _volatile(k)})
    return obj


def assert_same_state(a: Any, b: Any, path: str = "strategy") -> None:
    """Raise AssertionError naming the first place where two snapshots differ."""
    if type(a) is not type(b):
        raise AssertionError(f"{path}: {type(a).__name__} != {type(b).__name__}")
    if isinstance(a, dict):
        if set(a) != set(b):
            raise AssertionError(
                f"{path}: keys differ: only left {sorted(map(str, set(a) - set(b)))[:5]}, "
                f"only right {sorted(map(str, set(b) - set(a)))[:5]}"
            )
        for k in a:
            assert_same_state(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        if len(a) != len(b):
            raise AssertionError(f"{path}: length {len(a)} != {len(b)}")
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_state(x, y, f"{path}[{i}]")
    elif a != b:
        raise AssertionError(f"{path}: {str(a)[:120]} != {str(b)[:120]}")


__all__ = [
    "SUPERLINK_NODE_ID",
    "Arrays",
    "Corruption",
    "GridDouble",
    "OutgoingMessage",
    "ReplayGrid",
    "assert_same_state",
    "build_as",
    "corruptions",
    "outgoing_messages",
    "phase_of",
    "replace",
    "reply_message",
    "run_round",
    "snapshot",
    "strategy",
    "valid_content",
]


# ---------------------------------------------------------------------------------------------- scripted runs
def drive(
    strategy,
    clients_of_nodes: dict[int, int],
    rounds: int | Iterable[int],
    answer: Callable[[int, int, str, RecordDict], list[RecordDict] | None] | None = None,
    seed: int = 0,
) -> ReplayGrid:
    """Run ``rounds`` of ``strategy`` with nodes ``clients_of_nodes`` (node id -> partition id).

    Every reply is made from the strategy's own reply spec; ``answer(server_round, node, phase, content)``
    may return the contents to send instead (``[]``: the node stays silent) or None to keep the reply.
    """
    counter: dict[tuple, int] = {}

    def respond(msg):
        node, phase = msg.metadata.dst_node_id, phase_of(msg)
        server_round = int(msg.content["config"]["server-round"])
        key = (server_round, phase, clients_of_nodes[node])  # the same client answers the same in every run
        counter[key] = counter.get(key, -1) + 1
        spec = strategy.reply_spec(phase, node)
        content = valid_content(spec, clients_of_nodes[node], seed + zlib.crc32(repr((key, counter[key])).encode()))
        out = answer(server_round, node, phase, content) if answer is not None else None
        return [reply_message(node, c) for c in (out if out is not None else [content])]

    grid = ReplayGrid(clients_of_nodes, respond)
    with outgoing_messages():
        for r in range(1, rounds + 1) if isinstance(rounds, int) else rounds:
            run_round(strategy, grid, r)
    return grid


def with_metrics(content: RecordDict, **values: Any) -> RecordDict:
    """A copy of ``content`` with metrics replaced (keyword names with '_' for '-')."""
    out = copy.deepcopy(content)
    metrics: dict[str, Any] = dict(out.metric_records["metrics"])
    metrics.update({k.replace("_", "-"): v for k, v in values.items()})
    out["metrics"] = MetricRecord(metrics)
    return out


def kept_figures(monkeypatch, module) -> list:
    """Replace ``module``'s pyplot (``strategies.plots.pyplot``) by pyplot itself except that closed figures are kept,
    so a test can inspect what a method's ``write_artifacts`` (``strategies/<method>_artifacts.py``) drew; returns the
    list they are kept in."""
    import matplotlib.pyplot as plt

    figures: list = []

    class Keep:
        def __getattr__(self, name):
            return getattr(plt, name)

        @staticmethod
        def close(fig):
            figures.append(fig)

    monkeypatch.setattr(module, "pyplot", Keep)
    return figures

"""What a message carries, declared by the method: what a client's reply must carry, once per phase, what the
strategy gets from a valid one, and what each party receives.

A :class:`ReplySpec` names every metric and every array record a strategy reads from a reply of one phase
(``train``, ``evaluate`` or a query such as ``bid``): type, length, shape, dtype, range, finiteness and
cross-field rules.  The reply gate (strategies/gate.py) turns a message's content into plain values when (and only
when) everything declared is present and well-formed, and hands the strategy a :class:`Reply`; otherwise the reason
goes into ``failures.json`` while the round goes on without that reply.  Keys a spec does not declare are never
exposed to the strategy, so no method can read an unchecked value.

A :class:`Disclosure` per message type (the strategy's ``disclosure()``, docs/privacy.md) declares every record a
client's reply sends and every record the message brings, each a :class:`Part`, marking what was derived from other
clients; sizes are written in the model's key sets, the options and :data:`PER_CLIENT` / :data:`PER_PEER`, never as
typed numbers.  strategies/disclosure.py turns a reply spec into what a reply sends, and strategies/disclosure_check.py
holds a recording of the run to the declaration.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

#: largest value accepted for counts (num-examples) and identifiers (partition ids)
INT_LIMIT = 2**31 - 1
#: bounds of plausible values: anything beyond is a broken or hostile client, not a measurement.  A loss is
#: computed from float32 logits, so an honest one is finite and at most float32's largest value, however far off
#: the model is (a model noised for differential privacy at a small epsilon gives honest cross-entropies of 1e12
#: and more: a tighter bound rejected those replies and stopped such runs).  Weighted means of such values over
#: any number of clients stay far inside float64.
LOSS_LIMIT = float(np.finfo(np.float32).max)
SECONDS_LIMIT = 1e7
MEMORY_LIMIT_MB = 1e9
VALUE_LIMIT = 1e15  # any other real quantity (e.g. an influence score summed over a validation split)
#: the suffix of the arrays that are variances (BatchNorm's running variances), which cannot be negative
VARIANCE = "running_var"


class InvalidReply(ValueError):
    """A reply that does not match its phase's :class:`ReplySpec`; the message says what and what is allowed."""


@dataclass(frozen=True)
class Number:
    """A scalar metric: ``int`` or ``float`` (an int is accepted where a float is declared), finite, within
    ``[minimum, maximum]`` (both bounds must be declared: an unbounded value is a door left open)."""

    kind: type
    minimum: float
    maximum: float
    required: bool = True

    def __post_init__(self) -> None:
        if self.minimum is None or self.maximum is None or self.minimum > self.maximum:
            raise ValueError(f"a Number needs bounds minimum <= maximum, got [{self.minimum}, {self.maximum}]")


@dataclass(frozen=True)
class Numbers:
    """A list metric: exact ``length`` (or at most ``max_length``), every element a finite number in range,
    optionally ``distinct`` elements and a ``total`` the elements must sum to (within ``1e-4``: clients
    compute distributions in float32)."""

    kind: type
    minimum: float
    maximum: float
    length: int | None = None
    max_length: int | None = None
    distinct: bool = False
    total: float | None = None
    required: bool = True

    def __post_init__(self) -> None:
        if self.minimum is None or self.maximum is None or self.minimum > self.maximum:
            raise ValueError(f"Numbers need bounds minimum <= maximum, got [{self.minimum}, {self.maximum}]")
        if self.length is None and self.max_length is None:
            raise ValueError("Numbers need a length or a max_length")


@dataclass(frozen=True)
class Dim:
    """A variable array dimension in ``[low, high]`` (e.g. the number of uploaded embeddings)."""

    low: int
    high: int

    def __contains__(self, n: int) -> bool:
        return self.low <= n <= self.high

    def __repr__(self) -> str:
        return f"{self.low}..{self.high}"


@dataclass(frozen=True)
class Tensor:
    """One array of a record: its shape (ints or :class:`Dim`), dtype, whether it must be finite, and whether it
    must be non-negative (a BatchNorm running variance: a negative one turns every model it is averaged into NaN)."""

    shape: tuple[int | Dim, ...]
    dtype: str = "float32"
    finite: bool = True
    nonnegative: bool = False


@dataclass(frozen=True)
class Arrays:
    """An ``ArrayRecord``: exactly these arrays (no more, no fewer)."""

    tensors: Mapping[str, Tensor]
    required: bool = True

    @staticmethod
    def like(state: Mapping[str, np.ndarray], keys: list[str] | None = None) -> Arrays:
        """The spec of an ArrayRecord holding ``keys`` of ``state`` with their shapes and dtypes; BatchNorm's running
        variances (keys ending in ``running_var``) must be non-negative."""
        keys = list(state) if keys is None else keys
        return Arrays(
            {
                k: Tensor(tuple(np.shape(state[k])), str(np.asarray(state[k]).dtype), nonnegative=k.endswith(VARIANCE))
                for k in keys
            }
        )


#: a cross-field rule: (metrics, records) -> reason or None
Rule = Callable[[Mapping[str, Any], Mapping[str, Mapping[str, np.ndarray]]], "str | None"]


@dataclass(frozen=True)
class ReplySpec:
    """Everything a strategy reads from one phase's reply.

    ``evaluation``: the metrics of an ``evaluation`` MetricRecord the reply must also carry (a train reply
    that evaluates the client's model of the previous round, see :mod:`strategies.schedule`).
    """

    metrics: Mapping[str, Number | Numbers] = field(default_factory=dict)
    records: Mapping[str, Arrays] = field(default_factory=dict)
    rules: tuple[Rule, ...] = ()
    evaluation: Mapping[str, Number | Numbers] | None = None

    def with_metrics(self, **more: Number | Numbers) -> ReplySpec:
        return replace(self, metrics={**self.metrics, **{k.replace("_", "-"): v for k, v in more.items()}})

    def with_records(self, **more: Arrays) -> ReplySpec:
        return replace(self, records={**self.records, **more})

    def with_rule(self, rule: Rule) -> ReplySpec:
        return replace(self, rules=(*self.rules, rule))

    def with_evaluation(self, metrics: Mapping[str, Number | Numbers]) -> ReplySpec:
        return replace(self, evaluation=dict(metrics))


@dataclass
class Reply:
    """One admitted reply (:mod:`strategies.gate`): only what the phase's :class:`ReplySpec` declares, already
    checked, and the node and client it came from; ``timing``: its optional timing stamps (:data:`TIMING`)."""

    node_id: int
    client: int
    num_examples: int
    metrics: dict[str, Any]
    records: dict[str, dict[str, np.ndarray]] = field(default_factory=dict)
    timing: dict[str, float] = field(default_factory=dict)

    @property
    def arrays(self) -> dict[str, np.ndarray]:
        """The ``arrays`` record (the model update of a train reply)."""
        return self.records.get("arrays", {})


#: the optional ``timing`` record of every reply: unix seconds at which the client's process started, its app
#: module's imports began and ended, and its handler began, finished its set-up and ended (diagnostics of where
#: a message's time goes; see strategies/message_timing.py)
STAMP = Number(float, 0.0, 1e11, required=False)
TIMING = dict.fromkeys(
    ("process-start", "app-import", "app-ready", "handler-start", "setup-done", "handler-end"), STAMP
)


# ---------------------------------------------------------------------- metrics every phase may carry
COUNT = Number(int, 1, INT_LIMIT)
IDENTIFIER = Number(int, 0, INT_LIMIT)
ACCURACY = Number(float, 0.0, 1.0)
LOSS = Number(float, 0.0, LOSS_LIMIT)
SECONDS = Number(float, 0.0, SECONDS_LIMIT, required=False)

#: every reply: who the client is and how many training examples it has
BASE = ReplySpec(
    metrics={
        "num-examples": COUNT,
        "partition-id": IDENTIFIER,
        "time-train": SECONDS,
        "time-method": SECONDS,
        "peak-rss-mb": Number(float, 0.0, MEMORY_LIMIT_MB, required=False),
    }
)
#: a train reply's training statistics (optional: Local and a few methods report fewer)
TRAIN = BASE.with_metrics(
    **{
        "train-loss": replace(LOSS, required=False),
        "train-acc": replace(ACCURACY, required=False),
        "trained-acc": replace(ACCURACY, required=False),
        "steps": Number(int, 0, INT_LIMIT, required=False),
    }
)
#: an evaluate reply: the personalized model's accuracy, and the global model's where the method has one
EVALUATE = BASE.with_metrics(
    **{
        "personal-acc": ACCURACY,
        "personal-loss": LOSS,
        "test-examples": replace(COUNT, required=False),
        "global-acc": replace(ACCURACY, required=False),
        "global-loss": replace(LOSS, required=False),
    }
)


# ---------------------------------------------------------------------- what a message carries, both ways
@dataclass(frozen=True)
class Clients(Dim):
    """A count bounded by the federation's size (the deployment's, not the run config's): from ``low`` to the
    number of clients less ``fewer``.  Without the federation's size it is bounded by ``high`` only."""

    fewer: int = 0

    def within(self, clients: int) -> Dim:
        """This count in a federation of ``clients`` clients."""
        return Dim(self.low, clients - self.fewer)

    def __repr__(self) -> str:
        return f"{self.low}..N{f' - {self.fewer}' if self.fewer else ''}"


#: one model per client of the federation
PER_CLIENT = Clients(1, INT_LIMIT)
#: one entry per other client of the federation (a client's peers)
PER_PEER = Clients(1, INT_LIMIT, fewer=1)


@dataclass(frozen=True)
class Part:
    """One record of a message.  An ArrayRecord declares its ``arrays``; a metric or config record its entry
    names (``entries``: name -> required) and the length of every entry that is a list (``lengths``; an entry
    not named there is a single value).  ``what`` says in words what it holds; ``from_peers`` marks what a
    client receives that was derived from other clients (their models, an aggregate of them, their ids)."""

    what: str
    arrays: Arrays | None = None
    entries: Mapping[str, bool] | None = None
    required: bool = True
    from_peers: bool = False
    lengths: Mapping[str, int | Dim] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if (self.arrays is None) == (self.entries is None):
            raise ValueError(f"a Part declares either arrays or entries, not {'both' if self.arrays else 'neither'}")
        undeclared = sorted(set(self.lengths) - set(self.entries or {}))
        if undeclared:
            raise ValueError(f"a Part declares the lengths of entries it does not declare: {undeclared}")

    def with_lengths(self, lengths: Mapping[str, int | Dim]) -> Part:
        """This part with the lengths of more list entries declared (or declared anew)."""
        return replace(self, lengths={**self.lengths, **lengths})

    @property
    def kind(self) -> str:
        return "arrays" if self.arrays is not None else "entries"


@dataclass(frozen=True)
class Disclosure:
    """What one message type carries: ``sends`` (the client's reply, record name -> :class:`Part`) and
    ``receives`` (the server's message); ``reveals``: what the reply could tell about the client's data."""

    sends: Mapping[str, Part]
    receives: Mapping[str, Part] = field(default_factory=dict)
    reveals: str = ""


def lengths_on(parts: Mapping[str, Part], record: str, lengths: Mapping[str, int | Dim]) -> dict[str, Part]:
    """``parts`` with the lengths of more list entries of ``record`` declared (where ``parts`` has it): a list
    whose length the reply spec knows only during the run (e.g. one score per model the client was sent)."""
    out = dict(parts)
    if record in out:
        out[record] = out[record].with_lengths(lengths)
    return out

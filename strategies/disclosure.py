"""What each party receives, declared per method and message type.

A strategy's :meth:`~strategies.base.PersonalizedStrategy.disclosure` maps every message type its run uses
(``train``, ``evaluate``, ``query.<name>``) to a :class:`Disclosure`: every record a client's reply carries out
of the node (``sends``: everything that leaves, also what the reply gate ignores) and every record the message
brings to the node (``receives``), marking what was derived from other clients (``from_peers``).  Sizes are
written in terms of the model's key sets (:class:`~task.models.ModelInfo`), the run config and the method's
options, never as typed numbers, through the same :class:`~strategies.replies.Arrays` / ``Tensor`` / ``Dim`` a
reply spec uses; :func:`sent` turns a phase's reply spec into its ``sends``.

The declarations are checked, not trusted: :mod:`strategies.disclosure_check` compares a message recording with them
(a record, an array, a shape, a dtype, a metric or a list length that is not declared, or a required one that is
missing; a count bounded by the federation's size, a :class:`Clients` dimension, held to it) and
renders them as docs/privacy.md's per-method table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from strategies.replies import INT_LIMIT, TIMING, Arrays, Dim, Numbers, ReplySpec, Tensor


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


@dataclass(frozen=True)
class Unread:
    """A metric a client sends that the server does not read: declared, always present; a list of ``length``
    values where one is given."""

    required: bool = True
    length: int | Dim | None = None


def entries(rules: Mapping[str, Any]) -> dict[str, bool]:
    """A reply spec's metric rules as entry names -> required."""
    return {name: bool(getattr(rule, "required", True)) for name, rule in rules.items()}


def list_lengths(rules: Mapping[str, Any]) -> dict[str, int | Dim]:
    """The length of every list a reply spec's metric rules declare: a :class:`~strategies.replies.Numbers`'
    ``length``, or up to its ``max_length``; an :class:`Unread` list's ``length``."""
    out: dict[str, int | Dim] = {}
    for name, rule in rules.items():
        if isinstance(rule, Numbers):
            out[name] = rule.length if rule.length is not None else Dim(0, int(rule.max_length or 0))
        elif isinstance(rule, Unread) and rule.length is not None:
            out[name] = rule.length
    return out


def sent(
    spec: ReplySpec, what: Mapping[str, str] | None = None, evaluation: Mapping[str, Any] | None = None
) -> dict[str, Part]:
    """The records a reply of ``spec`` carries: its ``metrics``, its array records (described by ``what``), the
    optional ``timing`` stamps every reply may bring and, with ``evaluation``, the optional ``evaluation``
    metrics of a train reply that also evaluates the client's previous model."""
    what = what or {}
    parts = {
        "metrics": Part(
            "who the client is, its data size and its statistics",
            entries=entries(spec.metrics),
            lengths=list_lengths(spec.metrics),
        ),
        "timing": Part("when the client's process and handler ran", entries=entries(TIMING), required=False),
    }
    for name, arrays in spec.records.items():
        parts[name] = Part(what.get(name, name), arrays=arrays, required=arrays.required)
    if evaluation is not None:
        parts["evaluation"] = Part(
            "how well its previous model fits its held-out data",
            entries=entries(evaluation),
            required=False,
            lengths=list_lengths(evaluation),
        )
    return parts


def lengths_on(parts: Mapping[str, Part], record: str, lengths: Mapping[str, int | Dim]) -> dict[str, Part]:
    """``parts`` with the lengths of more list entries of ``record`` declared (where ``parts`` has it): a list
    whose length the reply spec knows only during the run (e.g. one score per model the client was sent)."""
    out = dict(parts)
    if record in out:
        out[record] = out[record].with_lengths(lengths)
    return out


def stacked(arrays: Arrays, count: int | Dim) -> Arrays:
    """Several models of ``arrays`` in one record (:func:`task.params.stacked_record`): a leading model axis."""
    return Arrays({k: Tensor((count, *t.shape), t.dtype) for k, t in arrays.tensors.items()}, arrays.required)

"""What each party receives, from the declarations.

A strategy's :meth:`~strategies.base.PersonalizedStrategy.disclosure` maps every message type its run uses
(``train``, ``evaluate``, ``query.<name>``) to a :class:`~strategies.replies.Disclosure` of
:class:`~strategies.replies.Part` records (declared in strategies/replies.py, beside the reply specs): every record a
client's reply carries out of the node (``sends``: everything that leaves, also what the reply gate ignores) and every
record the message brings to the node (``receives``).  This module turns a phase's reply spec into its ``sends``
(:func:`sent`), declares the metrics a client sends unread (:class:`Unread`) and stacked models (:func:`stacked`).

The declarations are checked, not trusted: :mod:`strategies.disclosure_check` compares a message recording with them
(a record, an array, a shape, a dtype, a metric or a list length that is not declared, or a required one that is
missing; a count bounded by the federation's size, a :class:`~strategies.replies.Clients` dimension, held to it) and
renders them as docs/privacy.md's per-method table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from strategies.replies import TIMING, Arrays, Dim, Numbers, Part, ReplySpec, Tensor


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


def stacked(arrays: Arrays, count: int | Dim) -> Arrays:
    """Several models of ``arrays`` in one record (:func:`task.params.stacked_record`): a leading model axis."""
    return Arrays({k: Tensor((count, *t.shape), t.dtype) for k, t in arrays.tensors.items()}, arrays.required)

"""What each party receives, declared per method and message type.

A strategy's :meth:`~strategies.base.PersonalizedStrategy.disclosure` maps every message type its run uses
(``train``, ``evaluate``, ``query.<name>``) to a :class:`Disclosure`: every record a client's reply carries out
of the node (``sends``: everything that leaves, also what the reply gate ignores) and every record the message
brings to the node (``receives``), marking what was derived from other clients (``from_peers``).  Sizes are
written in terms of the model's key sets (:class:`~task.models.ModelInfo`), the run config and the method's
options, never as typed numbers, through the same :class:`~strategies.replies.Arrays` / ``Tensor`` / ``Dim`` a
reply spec uses; :func:`sent` turns a phase's reply spec into its ``sends``.

The declarations are checked, not trusted: :mod:`strategies.disclosure_check` compares a message recording with them
(a record, an array, a shape, a dtype or a metric that is not declared, or a required one that is missing) and
renders them as docs/privacy.md's per-method table.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from strategies.replies import INT_LIMIT, TIMING, Arrays, Dim, ReplySpec, Tensor

#: one model per client of the federation (its size is the deployment's, not the run config's)
PER_CLIENT = Dim(1, INT_LIMIT)


@dataclass(frozen=True)
class Part:
    """One record of a message.  An ArrayRecord declares its ``arrays``; a metric or config record its entry
    names (``entries``: name -> required).  ``what`` says in words what it holds; ``from_peers`` marks what a
    client receives that was derived from other clients (their models, an aggregate of them, their ids)."""

    what: str
    arrays: Arrays | None = None
    entries: Mapping[str, bool] | None = None
    required: bool = True
    from_peers: bool = False

    def __post_init__(self) -> None:
        if (self.arrays is None) == (self.entries is None):
            raise ValueError(f"a Part declares either arrays or entries, not {'both' if self.arrays else 'neither'}")

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
    """A metric a client sends that the server does not read: declared, always present."""

    required: bool = True


def entries(rules: Mapping[str, Any]) -> dict[str, bool]:
    """A reply spec's metric rules as entry names -> required."""
    return {name: bool(getattr(rule, "required", True)) for name, rule in rules.items()}


def sent(
    spec: ReplySpec, what: Mapping[str, str] | None = None, evaluation: Mapping[str, Any] | None = None
) -> dict[str, Part]:
    """The records a reply of ``spec`` carries: its ``metrics``, its array records (described by ``what``), the
    optional ``timing`` stamps every reply may bring and, with ``evaluation``, the optional ``evaluation``
    metrics of a train reply that also evaluates the client's previous model."""
    what = what or {}
    parts = {
        "metrics": Part("who the client is, its data size and its statistics", entries=entries(spec.metrics)),
        "timing": Part("when the client's process and handler ran", entries=entries(TIMING), required=False),
    }
    for name, arrays in spec.records.items():
        parts[name] = Part(what.get(name, name), arrays=arrays, required=arrays.required)
    if evaluation is not None:
        parts["evaluation"] = Part(
            "how well its previous model fits its held-out data", entries=entries(evaluation), required=False
        )
    return parts


def stacked(arrays: Arrays, count: int | Dim) -> Arrays:
    """Several models of ``arrays`` in one record (:func:`task.params.stacked_record`): a leading model axis."""
    return Arrays({k: Tensor((count, *t.shape), t.dtype) for k, t in arrays.tensors.items()}, arrays.required)

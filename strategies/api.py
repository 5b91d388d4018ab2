"""What a method's strategy leans on, in one place: ``from strategies.api import ...``.

A method's server module (``strategies/<name>.py``) imports the framework from here only, never from the base's
parts; its own math comes from ``strategies/<name>_math.py`` and its files are written by
``strategies/<name>_artifacts.py``.  docs/adding-a-method.md says what to read, in which order.

:class:`PersonalizedStrategy` (strategies/base.py): the hooks a method overrides, what it calls from them, and its
named parts (``self.robust``, ``self.exchange``, ...: its constructor says what each offers a method).
:data:`IDENTIFY` is the query that asks a node who it is; :data:`log` the app's logger.

What a message carries (strategies/replies.py): a :class:`ReplySpec` per phase, of :class:`Number` (a metric),
:class:`Numbers` (a list) and :class:`Arrays` of :class:`Tensor` (an ArrayRecord; :class:`Dim`: a variable
dimension), with the common bounds; a valid reply reaches the method as a :class:`Reply`.  A :class:`Disclosure` per
message type, of :class:`Part` records, sized with :data:`PER_CLIENT` / :data:`PER_PEER` (:class:`Clients` counts);
:func:`lengths_on` declares the lengths of a record's list entries.
"""

from __future__ import annotations

from strategies.base import IDENTIFY, PersonalizedStrategy, log
from strategies.replies import (
    ACCURACY,
    INT_LIMIT,
    LOSS,
    LOSS_LIMIT,
    PER_CLIENT,
    PER_PEER,
    VALUE_LIMIT,
    Arrays,
    Clients,
    Dim,
    Disclosure,
    Number,
    Numbers,
    Part,
    Reply,
    ReplySpec,
    Tensor,
    lengths_on,
)

__all__ = [
    "ACCURACY",
    "IDENTIFY",
    "INT_LIMIT",
    "LOSS",
    "LOSS_LIMIT",
    "PER_CLIENT",
    "PER_PEER",
    "VALUE_LIMIT",
    "Arrays",
    "Clients",
    "Dim",
    "Disclosure",
    "Number",
    "Numbers",
    "Part",
    "PersonalizedStrategy",
    "Reply",
    "ReplySpec",
    "Tensor",
    "lengths_on",
    "log",
]

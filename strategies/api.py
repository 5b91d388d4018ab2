"""What a method's strategy leans on, in one place: ``from strategies.api import ...``.

A method's server module (``strategies/<name>.py``) imports the framework from here only, never from the base's
parts; its own math comes from ``strategies/<name>_math.py`` and its files are written by
``strategies/<name>_artifacts.py``.  docs/adding-a-method.md says which of the modules below to read, in which order,
and which to skip.

The base, :class:`PersonalizedStrategy` (:mod:`strategies.base`): the hooks a method overrides and Flower's round
loop that calls them; the services a method calls from its hooks (``self.client``, ``self.draw``,
``self.send_query``, ``self.record_of``, ``self.sends``, ``self.model_part``, ...) are
:class:`strategies.services.StrategyServices`, mixed into it.  :data:`IDENTIFY` is the query that asks a node who it
is; :data:`log` the app's logger.

What a reply must carry and what the strategy reads of it (:mod:`strategies.replies`): :class:`ReplySpec` built from
:class:`Number` (a scalar metric), :class:`Numbers` (a list), :class:`Arrays` of :class:`Tensor` (an ArrayRecord;
:class:`Dim` for a variable dimension) and the common bounds (:data:`ACCURACY`, :data:`LOSS`, :data:`INT_LIMIT`,
:data:`LOSS_LIMIT`, :data:`VALUE_LIMIT`); a valid reply reaches the method as a :class:`Reply`.

What every message carries out of a client and into it (:mod:`strategies.disclosure`): a :class:`Disclosure` per
message type, of :class:`Part` records; :data:`PER_CLIENT` sizes a record that holds one model per client and
:data:`PER_PEER` one per other client (both :class:`Clients` counts, held to the federation's size);
:func:`lengths_on` declares the lengths of a record's list entries.
"""

from __future__ import annotations

from strategies.base import IDENTIFY, PersonalizedStrategy, log
from strategies.disclosure import PER_CLIENT, PER_PEER, Clients, Disclosure, Part, lengths_on
from strategies.replies import (
    ACCURACY,
    INT_LIMIT,
    LOSS,
    LOSS_LIMIT,
    VALUE_LIMIT,
    Arrays,
    Dim,
    Number,
    Numbers,
    Reply,
    ReplySpec,
    Tensor,
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

"""What a method's strategy uses besides its hooks, mixed into :class:`strategies.base.PersonalizedStrategy`.

The base (``strategies/base.py``) holds the hooks a method overrides and the round loop; this holds the services
a method calls from them, each a thin front of one part: the shared model (:attr:`global_state`, the keys a
reply releases), clients and sampling (the reply gate's client ids, :meth:`by_client`, :meth:`draw`,
:meth:`cohort_size`), extra phases (:meth:`send_query`, :meth:`identify`, :meth:`receive`), the time a round's
server work took, and the parts of a method's declaration of what its messages carry (:meth:`sends`,
:meth:`model_part`, :meth:`config_part`; see :mod:`strategies.disclosure`).  Nothing here is overridden.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from flwr.app import ArrayRecord, Message, MessageType, RecordDict
from flwr.serverapp import Grid

from strategies.disclosure import Part, Unread, sent, stacked
from strategies.exchange import MessageExchange, wait_for_nodes
from strategies.gate import ReplyGate, cohort_size
from strategies.history import add_seconds, note_timing
from strategies.outcome import RoundLog
from strategies.replies import BASE, Arrays, Dim, Reply, ReplySpec
from task.config import Settings
from task.models import ModelInfo

if TYPE_CHECKING:
    from flwr.app import ConfigRecord

IDENTIFY = "identify"


class StrategyServices:
    """The services of a personalized strategy (see the module docstring); the base provides the state below."""

    settings: Settings
    initial_state: dict[str, np.ndarray]
    exchange: MessageExchange
    gate: ReplyGate
    model_info: ModelInfo
    rng: random.Random
    history: list[RoundLog]
    node_of: dict[int, int]
    #: phase -> how many nodes its latest messages went to (how many clients its valid replies could have spoken for)
    asked: dict[str, int]
    unread_metrics: ClassVar[Mapping[str, tuple[str, ...]]]
    _global_state: dict[str, np.ndarray] | None

    if TYPE_CHECKING:  # hooks of the base, called from here

        def shared_keys(self) -> list[str]: ...
        def reply_spec(self, phase: str, node_id: int) -> ReplySpec: ...
        def round_config(self, server_round: int, phase: str) -> ConfigRecord: ...

    # ------------------------------------------------------------------ what a method's messages carry
    def sends(self, phase: str, what: Mapping[str, str] | None = None) -> dict[str, Part]:
        """What a reply of ``phase`` carries: the records of its reply spec (``what``: record -> in words), the
        metrics the method's clients send unread (:attr:`unread_metrics`), the optional timing stamps and, with a
        train reply, the optional evaluation of the client's previous model."""
        evaluation: dict[str, Any] | None = None
        if phase == "train":
            evaluation = {k: v for k, v in self.reply_spec("evaluate", -1).metrics.items() if k not in BASE.metrics}
            evaluation.update(dict.fromkeys(self.unread_metrics.get("evaluate", ()), Unread()))
        parts = sent(self.reply_spec(phase, -1), what, evaluation)
        if phase in self.unread_metrics:
            metrics = parts["metrics"]
            unread = dict.fromkeys(self.unread_metrics[phase], True)
            parts["metrics"] = replace(metrics, entries={**(metrics.entries or {}), **unread})
        return parts

    def model_part(self, what: str, count: int | Dim | None = None, **kw: Any) -> Part:
        """An ArrayRecord of the model's shared keys derived from other clients; with ``count``, that many models
        stacked (:func:`strategies.disclosure.stacked`)."""
        arrays = Arrays.like(self.initial_state, list(self.shared_keys()))
        kw.setdefault("from_peers", True)
        return Part(what, arrays=arrays if count is None else stacked(arrays, count), **kw)

    def config_part(self, **more: bool) -> Part:
        """The ``config`` record every message carries: the round, the phase, where the client keeps its state
        and models, what to evaluate and save (:meth:`round_config`), and a method's ``more`` entries."""
        optional = ("run-key", "state-dir", "model-dir", "evaluate", "evaluate-round", "save-model", "save-best")
        declared = ("dp-noise-multiplier", "dp-clip")  # under DP: the round's noise and clip bound
        return Part(
            "the server's instructions (nothing about other clients)",
            entries={"server-round": True, "phase": True, **dict.fromkeys(optional + declared, False), **more},
        )

    # ------------------------------------------------------------------ the shared model, clients, sampling, phases
    def released_keys(self) -> list[str]:
        """The shared keys a train reply carries: all of them, but under differential privacy only floating-point
        arrays (an integer buffer such as BatchNorm's ``num_batches_tracked`` counts a client's batches), and under
        central DP only trained parameters (BatchNorm's running statistics stay on the client, docs/privacy.md)."""
        keys = self.shared_keys()
        if self.settings.dp_mode == "off":
            return keys
        home = set(self.model_info.buffer_keys) if self.settings.dp_mode == "central" else set()
        return [
            k for k in keys if np.issubdtype(np.asarray(self.initial_state[k]).dtype, np.floating) and k not in home
        ]

    @property
    def global_state(self) -> dict[str, np.ndarray]:
        """The shared model (the shared keys of the common initial model until the first aggregation)."""
        if self._global_state is None:
            self._global_state = {k: np.array(self.initial_state[k]) for k in self.shared_keys()}
        return self._global_state

    @global_state.setter
    def global_state(self, value: dict[str, np.ndarray]) -> None:
        self._global_state = value

    def client(self, node_id: int) -> int | None:
        """The client id behind ``node_id`` (None until the node has replied once)."""
        return self.gate.client_of.get(node_id)

    def record_of(self, state: Mapping[str, Any]) -> ArrayRecord:
        """``state`` as an ArrayRecord, converted once per phase however many messages carry it."""
        return self.exchange.record_of(state)

    cohort_size = staticmethod(cohort_size)

    def by_client(self, nodes: Iterable[int]) -> list[int]:
        """``nodes`` ordered by client id (nodes not identified yet last, by node id)."""
        return self.gate.by_client(nodes)

    def draw(self, nodes: list[int], k: int) -> list[int]:
        """``k`` of ``nodes`` drawn with the run's generator by client id (all of them when k >= len)."""
        return self.gate.draw(self.rng, nodes, k)

    def server_time(self, seconds: float) -> None:
        """Add ``seconds`` of server work to the round's ``server-seconds``."""
        add_seconds(self.history, seconds)

    def available_nodes(self, grid: Grid) -> list[int]:
        """The connected nodes, once there are ``min-nodes`` of them (:func:`wait_for_nodes`)."""
        return wait_for_nodes(
            grid, self.settings.min_nodes, timeout=self.settings.node_wait_timeout, known=self.node_of
        )

    def identify(self, grid: Grid, server_round: int, nodes: list[int]) -> list[Reply]:
        """Ask nodes that never replied which client they are (a tiny ``query.identify``); their valid replies."""
        unknown = self.gate.unknown(nodes)
        return self.send_query(grid, server_round, IDENTIFY, {n: RecordDict() for n in unknown}) if unknown else []

    def send_query(self, grid: Grid, server_round: int, name: str, payloads: Mapping[int, RecordDict]) -> list[Reply]:
        """Extra phase: send ``query.<name>`` with each node's own payload; return the replies that match
        ``reply_spec(name, node)``, ordered by client id (the others are recorded in failures)."""
        for content in payloads.values():
            content["config"] = self.round_config(server_round, name)
        messages = self.exchange.address(server_round, name, f"{MessageType.QUERY}.{name}", payloads)
        return self.receive(server_round, name, self.exchange.send(grid, messages))

    def receive(self, server_round: int, phase: str, replies: Iterable[Message]) -> list[Reply]:
        """The phase's valid replies, ordered by client id: the exchange attributes each to its node and names the
        silent ones (how many nodes were asked goes into :attr:`asked`), the gate admits the valid ones and records
        the rest, and the bytes and message times of what it admitted go into the history."""
        arrivals = self.exchange.receive(server_round, phase, replies)
        self.asked[phase] = len({a.node for a in arrivals.replies} | set(arrivals.silent))
        admitted = self.gate.admit(server_round, phase, arrivals)
        note_timing(self.history, phase, self.exchange.account(server_round, phase, admitted))
        return [reply for _, reply in admitted]

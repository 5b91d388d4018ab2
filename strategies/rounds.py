"""Flower's round loop over a strategy's hooks and parts: :class:`RoundLoop`, the part ``self.loop`` of
:class:`strategies.base.PersonalizedStrategy`, whose Flower ``Strategy`` methods (``start``, ``configure_train``,
``aggregate_train``, ``configure_evaluate``, ``aggregate_evaluate``, ``summary``) hand over to it.

Flower's contract.  :meth:`RoundLoop.start` honours ``Strategy.start``: its arguments (``initial_arrays`` is the
shared model the run starts from, ``timeout`` the wait for each phase's replies, ``train_config`` /
``evaluate_config`` go into every train / evaluate message's config, ``evaluate_fn`` is called before the first round
and after each round) and its ``Result``; a resumed strategy runs the rounds after its checkpoint.  The four phase
methods keep Flower's signatures and use every argument: ``arrays`` is the shared model the phase sends (it becomes
the strategy's ``global_state``, and messages carry that very record), ``config`` is merged into each message's
config.  Each node gets its own content from the method's ``payload``, which is where a personalized method differs
from Flower's broadcast.

One round: nodes that never replied are asked who they are (``query.identify``) when the cohort depends on it, the
held-out clients are left out, differential privacy checks its budget, the method's ``prepare_round`` runs its extra
phases, ``sample`` draws the cohort, each node gets its ``payload``; the valid train replies go to ``aggregate`` (an
evaluation that rode on them into the history first); then the round's evaluate phase (unless it rides on the next
round's train messages), ``on_evaluated``, ``on_round_end``, and the checkpoint.  A reply travels one way: the
exchange receives it, the gate admits or rejects it, the method reads what was admitted.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Protocol

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from strategies.attack_report import honest_metrics
from strategies.checkpointing import Checkpoint
from strategies.exchange import MessageExchange, wait_for_nodes
from strategies.gate import ReplyGate, cohort_size, shared_model
from strategies.history import (
    close_round,
    late_evaluation_line,
    note_timing,
    progress_line,
    record_evaluation,
    train_metrics,
)
from strategies.newcomers import Holdout, evaluate_newcomers
from strategies.outcome import RoundLog
from strategies.privacy import ServerPrivacy
from strategies.replies import Reply
from strategies.schedule import EvaluationSchedule
from task.config import Settings
from task.params import to_record

log = logging.getLogger("flwr.pflower")


class Looped(Protocol):
    """What the round loop reads and calls of a strategy (:class:`strategies.base.PersonalizedStrategy`): its parts,
    its record of the run, and the hooks a method overrides."""

    name: str
    settings: Settings
    initial_state: dict[str, np.ndarray]
    global_state: dict[str, np.ndarray]
    exchange: MessageExchange
    gate: ReplyGate
    schedule: EvaluationSchedule
    privacy: ServerPrivacy
    holdout: Holdout
    checkpoint: Checkpoint
    rng: random.Random
    history: list[RoundLog]
    client_eval: dict[int, dict[str, float]]
    round_watchers: list[Callable[[list[RoundLog]], None]]
    rounds_done: int
    identify_everyone: bool

    def shared_keys(self) -> list[str]: ...
    def round_config(self, server_round: int, phase: str) -> ConfigRecord: ...
    def payload(self, node_id: int, server_round: int, phase: str) -> RecordDict: ...
    def prepare_round(self, grid: Grid, server_round: int, nodes: list[int]) -> None: ...
    def wants_client_ids(self, server_round: int, nodes: list[int]) -> bool: ...
    def sample(self, server_round: int, nodes: list[int]) -> list[int]: ...
    def aggregate(self, server_round: int, updates: list[Reply]) -> dict[str, Any]: ...
    def on_evaluated(self, server_round: int, replies: list[Reply]) -> None: ...
    def on_round_end(self, server_round: int) -> None: ...
    def identify(self, grid: Grid, server_round: int, nodes: list[int]) -> list[Reply]: ...
    def draw(self, nodes: list[int], k: int) -> list[int]: ...
    def server_time(self, seconds: float) -> None: ...


def numbers(metrics: Mapping[str, Any]) -> MetricRecord:
    """The numeric entries of a round's metrics, as Flower's ``Result`` keeps them."""
    return MetricRecord({k: v for k, v in metrics.items() if isinstance(v, (int, float))})


class RoundLoop:
    """Flower's ``Strategy`` methods of a strategy (see the module docstring)."""

    def __init__(self, strategy: Looped) -> None:
        self.strategy = strategy
        #: phase -> how many nodes its latest messages went to (how many clients its valid replies could speak for)
        self.asked: dict[str, int] = {}
        self._t0 = self._round_start = time.monotonic()
        self._first_round = 1

    def summary(self) -> None:
        s, c = self.strategy, self.strategy.settings
        log.info(
            "%s on %s (%s), model %s, %d rounds, fraction-train %.2f, seed %d",
            *(s.name, c.data.dataset, c.data.partition, c.model, c.num_rounds, c.fraction_train, c.seed),
        )

    def start(
        self,
        grid: Grid,
        initial_arrays: ArrayRecord,
        num_rounds: int = 3,
        timeout: float = 3600,
        train_config: ConfigRecord | None = None,
        evaluate_config: ConfigRecord | None = None,
        evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None,
    ) -> Result:
        """Rounds ``rounds_done + 1 .. num_rounds`` (all of them unless the strategy was resumed), then the held-out
        clients as newcomers."""
        s = self.strategy
        first = s.rounds_done + 1
        s.schedule.last_round, s.exchange.timeout = num_rounds, timeout
        log.info("[%s] rounds %d..%d", s.name, first, num_rounds)
        self.summary()
        self._t0, self._first_round, result, arrays = time.monotonic(), first, Result(), initial_arrays
        if evaluate_fn is not None and first == 1 and (metrics := evaluate_fn(0, arrays)) is not None:
            result.evaluate_metrics_serverapp[0] = metrics
        for server_round in range(first, num_rounds + 1):
            log.info("[ROUND %s/%s]", server_round, num_rounds)
            messages = self.configure_train(server_round, arrays, train_config or ConfigRecord(), grid)
            aggregated, metrics = self.aggregate_train(server_round, s.exchange.send(grid, messages))
            arrays = result.arrays = aggregated if aggregated is not None else arrays
            if metrics is not None:
                result.train_metrics_clientapp[server_round] = metrics
            messages = self.configure_evaluate(server_round, arrays, evaluate_config or ConfigRecord(), grid)
            if (metrics := self.aggregate_evaluate(server_round, s.exchange.send(grid, messages))) is not None:
                result.evaluate_metrics_clientapp[server_round] = metrics
            if evaluate_fn is not None and (metrics := evaluate_fn(server_round, arrays)) is not None:
                result.evaluate_metrics_serverapp[server_round] = metrics
        if s.holdout.count:  # the held-out clients, as newcomers, after the last round
            evaluate_newcomers(s, grid, num_rounds)
        return result

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        s = self.strategy
        self._round_start = time.monotonic()
        nodes = self.available_nodes(grid)  # before the round is logged: a run that gives up here has no round r
        s.history.append(RoundLog(server_round))
        if s.identify_everyone or s.holdout.count or s.wants_client_ids(server_round, nodes):
            s.identify(grid, server_round, nodes)
            s.identify_everyone = False
        nodes = s.holdout.training(nodes, s.gate.client_of)  # a held-out client never takes part
        if s.settings.dp_mode != "off":  # calibration, budget, for the nodes the round draws from: before the
            s.privacy.before_round(s, server_round, len(nodes))  # round releases anything (a stop unlogs it)
            s.privacy.journal_local(s, server_round)  # local DP: journaled before the first release can leave
        s.prepare_round(grid, server_round, nodes)
        cohort = s.sample(server_round, nodes)
        s.privacy.drew(cohort)
        s.schedule.start_round()
        return self.messages(server_round, arrays, config, cohort, "train", MessageType.TRAIN)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        s = self.strategy
        start = time.perf_counter()
        updates = self.receive(server_round, "train", replies)
        if s.schedule.fused:  # the previous round's evaluation came with these replies
            evaluated = [Reply(u.node_id, u.client, u.num_examples, u.metrics.pop("evaluation")) for u in updates]
            metrics = self.record_evaluation(s.schedule.fused, evaluated, self.asked.get("train"), counted=False)
            log.info(late_evaluation_line(s.name, s.schedule.fused, metrics))
            s.schedule.fused = 0
        # under Poisson sampling a central-DP round releases noise even without a reply: an unchanged model would
        # say that nobody was drawn
        poisson = s.settings.dp_mode == "central" and s.privacy.draw.get("sampling") == "poisson"
        extra = s.aggregate(server_round, updates) if updates or poisson else {}
        if not updates:
            log.warning("round %d: no valid train replies; state left unchanged", server_round)
        metrics = train_metrics(updates, asked=self.asked.get("train"), private=s.settings.dp_mode != "off")
        s.history[-1].train = metrics
        s.history[-1].extra.update(extra)
        arrays = to_record(s.global_state) if s.global_state else ArrayRecord()
        s.server_time(time.perf_counter() - start)
        return arrays, numbers(metrics)

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        s = self.strategy
        if s.schedule.rides_on_next_train(server_round):
            s.schedule.defer(server_round)
        if not s.schedule.has_evaluate_phase(server_round):
            return []
        nodes = self.available_nodes(grid)
        if s.holdout.count:  # a held-out client is evaluated only as a newcomer, at the end
            s.identify(grid, server_round, nodes)
            nodes = s.holdout.training(nodes, s.gate.client_of)
        k = cohort_size(len(nodes), s.settings.fraction_evaluate)
        if k < len(nodes):
            s.identify(grid, server_round, nodes)
        return self.messages(server_round, arrays, config, s.draw(nodes, k), "evaluate", MessageType.EVALUATE)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        s = self.strategy
        metrics: dict[str, float] = {}
        if s.schedule.has_evaluate_phase(server_round):
            evaluated = self.receive(server_round, "evaluate", replies)
            self.record_evaluation(server_round, evaluated, asked=self.asked.get("evaluate"))
            metrics = s.history[-1].evaluate
        s.on_round_end(server_round)
        close_round(s.history[-1], s.exchange.comm.pop(server_round, {}), time.monotonic() - self._round_start)
        s.rounds_done, ran = server_round, server_round - self._first_round + 1
        how = s.schedule.how_evaluated(server_round)
        log.info(progress_line(s.name, server_round, s.schedule.last_round, ran, self._t0, metrics, how))
        for watch in s.round_watchers:
            watch(s.history)
        s.checkpoint.after_round(server_round)
        return numbers(metrics)

    # ------------------------------------------------------------------ the round's pieces
    def messages(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, nodes: list[int], phase: str, kind: str
    ) -> list[Message]:
        """The phase's messages: Flower's ``arrays`` (``start``'s ``initial_arrays``, then what ``aggregate_train``
        returned) becomes the global model and is the record sent as it; each node's ``payload``, ``config`` under
        the strategy's round config."""
        s = self.strategy
        start = time.perf_counter()
        if model := shared_model(arrays, s.initial_state, s.shared_keys()):  # exactly the shared keys
            s.global_state = model
        payloads = {}
        with s.exchange.sharing_records({id(s.global_state): (s.global_state, arrays)}):
            for node in nodes:
                payloads[node] = s.payload(node, server_round, phase)
                payloads[node]["config"] = ConfigRecord({**config, **s.round_config(server_round, phase)})
        messages = s.exchange.address(server_round, phase, kind, payloads)
        s.server_time(time.perf_counter() - start)
        return messages

    def record_evaluation(
        self, server_round: int, updates: list[Reply], asked: int | None = None, counted: bool = True
    ) -> dict[str, float]:
        """Round ``server_round``'s evaluation replies (of the ``asked`` nodes asked for one) into the history, then the
        method's ``on_evaluated``.  Under DP no single client's value is kept, and an evaluation that came with train
        replies (``counted`` False) keeps no count either: its clients are the round's cohort, whose size Poisson
        sampling does not release."""
        s = self.strategy
        private = s.settings.dp_mode != "off"
        counted = counted or not private
        metrics = record_evaluation(s.history, s.client_eval, server_round, updates, asked, private, counted)
        metrics.update(honest_metrics(s.settings, updates))  # under an injected attack (docs/robustness.md)
        s.on_evaluated(server_round, updates)
        return metrics

    def available_nodes(self, grid: Grid) -> list[int]:
        """The connected nodes, once there are ``min-nodes`` of them (:func:`strategies.exchange.wait_for_nodes`)."""
        c = self.strategy.settings
        return wait_for_nodes(grid, c.min_nodes, timeout=c.node_wait_timeout, known=self.strategy.gate.node_of)

    def query(self, grid: Grid, server_round: int, name: str, payloads: Mapping[int, RecordDict]) -> list[Reply]:
        """``query.<name>`` with each node's own payload; the valid replies, ordered by client id."""
        s = self.strategy
        for content in payloads.values():
            content["config"] = s.round_config(server_round, name)
        messages = s.exchange.address(server_round, name, f"{MessageType.QUERY}.{name}", payloads)
        return self.receive(server_round, name, s.exchange.send(grid, messages))

    def receive(self, server_round: int, phase: str, replies: Iterable[Message]) -> list[Reply]:
        """The phase's valid replies, ordered by client id: the exchange attributes each to its node and names the
        silent ones (how many nodes were asked goes into :attr:`asked`), the gate admits the valid ones and records
        the rest, and the bytes and message times of what it admitted go into the history."""
        s = self.strategy
        arrivals = s.exchange.receive(server_round, phase, replies)
        self.asked[phase] = len({a.node for a in arrivals.replies} | set(arrivals.silent))
        admitted = s.gate.admit(server_round, phase, arrivals)
        note_timing(s.history, phase, s.exchange.account(server_round, phase, admitted))
        return [reply for _, reply in admitted]

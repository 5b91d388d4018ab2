"""The personalized base every strategy here stands on: the hooks a method overrides and the round loop.

`PersonalizedStrategy` is a ``flwr.serverapp.strategy.Strategy`` (Message API) composed of parts, each in its own
module (docs/adding-a-method.md, step 3, lists them; a method reaches them through
:class:`strategies.services.StrategyServices`), and its checkpoint (:mod:`strategies.checkpointing`).  Per-client
state is keyed by **client id** (the ``partition-id`` a node reports), never by Flower's node id; nodes the server
has not heard from are asked who they are (``query.identify``) before it chooses among them, so that a seed draws
the same clients in every run.

Flower's contract.  :meth:`start` honours ``Strategy.start``: its arguments (``initial_arrays`` is the shared
model the run starts from, ``timeout`` the wait for each phase's replies, ``train_config`` / ``evaluate_config``
go into every train / evaluate message's config, ``evaluate_fn`` is called before the first round and after
each round) and its ``Result``; a resumed strategy runs the rounds after its checkpoint.  The four phase methods
keep Flower's signatures and use every argument: ``arrays`` is the shared model the phase sends (it becomes
:attr:`global_state`, and messages carry that very record), ``config`` is merged into each message's config.
Each node gets its own content from :meth:`payload`, which is where a personalized method differs from Flower's
broadcast.

A method overrides the hooks of the first section below (``hooks for methods``: what the server aggregates and
sends, what a reply must carry, what each message discloses, what one node receives, the cohort, the aggregation,
what a held-out client gets, its models and its checkpoint state), and nothing else of the base
(docs/adding-a-method.md, step 3, tabulates them).  Its files (JSON, PNG) are written beside it, in
``strategies/<method>_artifacts.py``.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from strategies import attack_report
from strategies.attack_report import honest_metrics, with_attack_metrics
from strategies.checkpointing import Checkpoint
from strategies.disclosure import Disclosure, Part
from strategies.exchange import MessageExchange, RunAborted
from strategies.gate import ReplyGate, shared_model
from strategies.history import close_round, late_evaluation_line, progress_line, record_evaluation, train_metrics
from strategies.newcomers import NEWCOMER_SPEC, Holdout, evaluate_newcomers, newcomer_disclosure
from strategies.outcome import RoundLog, RunResults
from strategies.privacy import ServerPrivacy, central_aggregate, cohort_generator, poisson_cohort
from strategies.replies import BASE, EVALUATE, TRAIN, Arrays, Reply, ReplySpec
from strategies.robust import RobustAveraging
from strategies.schedule import EvaluationSchedule
from strategies.services import IDENTIFY, StrategyServices
from task.config import Settings
from task.methods import NEWCOMER, load_object, method_spec
from task.models import ModelInfo
from task.params import to_record

__all__ = ["IDENTIFY", "PersonalizedStrategy", "Reply", "RunAborted", "log"]

log = logging.getLogger("flwr.pflower")


class PersonalizedStrategy(StrategyServices, Strategy):
    """Round loop, client identities and reply validation shared by all methods (see the module docstring)."""

    #: whether the server holds a global model whose accuracy clients report as ``global-acc``
    has_global_model = True
    #: whether a round's evaluation may ride on the next round's train messages (one message per client and
    #: round); methods that train only some clients, or settle after evaluation, keep an evaluate phase
    evaluate_in_train = True
    #: phase -> metrics the method's clients send that the server does not read (they leave the node all the same;
    #: :meth:`disclosure` declares them)
    unread_metrics: ClassVar[Mapping[str, tuple[str, ...]]] = {}

    def __init__(self, settings: Settings, initial_state: Mapping[str, np.ndarray], model_info: ModelInfo) -> None:
        self.settings = settings
        self.options = settings.options  # the method's own typed options (task.methods)
        self.name = settings.method
        self.initial_state = {k: np.array(v) for k, v in initial_state.items()}
        self.model_info = model_info  # keys, shapes, dtypes, body / head / normalisation keys of the model
        self.history: list[RoundLog] = []  # one entry per round (the same list for the whole run)
        self.exchange = MessageExchange(settings.round_timeout)
        self.gate = ReplyGate(self.reply_spec)
        #: the gate's node id -> client id, client id -> its node, rejected replies and silent nodes (the same objects)
        self.client_of, self.node_of, self.failures = self.gate.client_of, self.gate.node_of, self.gate.failures
        self.schedule = EvaluationSchedule(settings, self.evaluate_in_train)
        #: draws cohorts: from the run's seed, so a run repeats; under DP from a secret only the server holds
        self.rng = cohort_generator(settings)
        #: what differential privacy keeps across rounds (noise multiplier, clip bound, release journal)
        self.privacy = ServerPrivacy(settings)
        #: the run's aggregation rule wherever a method averages client models (strategies/robust.py)
        self.robust = RobustAveraging(settings, self.history, self.gate.client_of)
        self.client_eval: dict[int, dict[str, float]] = {}  # client id -> last evaluate metrics
        self.asked: dict[str, int] = {}  # phase -> nodes its latest messages went to
        self.results_dir: Path | None = None
        #: called with the history after every round (the ServerApp's TensorBoard and MLflow writers)
        self.round_watchers: list[Callable[[list[RoundLog]], None]] = []
        self.rounds_done = 0  # the last complete round (a resumed strategy continues after it)
        self._global_state: dict[str, np.ndarray] | None = None
        self.identify_everyone = False  # set on resume: ask every node who it is before the next round
        self._t0 = self._round_start = time.monotonic()
        self._first_round = 1
        #: the clients held out of training (run-config ``holdout-clients``), evaluated at the end as newcomers
        self.holdout = Holdout(settings.holdout_clients)
        #: what a checkpoint holds of the strategy, and how a resumed run takes it back (strategies/checkpointing.py)
        self.checkpoint = Checkpoint(self)

    # ------------------------------------------------------------------ hooks for methods
    def shared_keys(self) -> list[str]:
        """State keys the server aggregates and sends (default: the whole model)."""
        return list(self.initial_state)

    def reply_spec(self, phase: str, node_id: int) -> ReplySpec:
        """What a reply of ``phase`` from ``node_id`` must carry.  Default: train replies carry the shared keys
        in ``arrays`` (and the evaluation the message asked for); evaluate replies the personalized accuracy;
        queries only the client's identity."""
        if phase == "train":
            keys = self.released_keys()
            spec = TRAIN.with_records(arrays=Arrays.like(self.initial_state, keys)) if keys else TRAIN
            if self.schedule.fused:  # the node was asked for the evaluation of its previous round's model
                evaluation = self.reply_spec("evaluate", node_id).metrics
                spec = spec.with_evaluation({k: v for k, v in evaluation.items() if k not in BASE.metrics})
            return spec
        if phase == NEWCOMER:
            return NEWCOMER_SPEC
        return with_attack_metrics(EVALUATE, self.settings) if phase == "evaluate" else BASE

    def disclosure(self) -> dict[str, Disclosure]:
        """What each message type of this run carries (``train``, ``evaluate``, ``query.<name>``): every record a
        client's reply sends and every record the message brings, with what of it comes from other clients
        (docs/privacy.md; a recording of the run must match it exactly).  Default: each phase's reply spec, and
        the global model (the shared keys, averaged over the cohort) with every train and evaluate message."""
        receives = {"config": self.config_part()}
        if self.shared_keys():
            receives["arrays"] = self.model_part("the global model: the shared keys averaged over the clients")
        moved = "how its data moved the shared keys" if self.shared_keys() else "how well its own model fits its data"
        declared = {
            MessageType.TRAIN: Disclosure(
                self.sends("train", {"arrays": "its trained model's shared keys"}), receives, moved
            ),
            MessageType.EVALUATE: Disclosure(self.sends("evaluate"), receives, "how well the models fit its data"),
            f"{MessageType.QUERY}.{IDENTIFY}": Disclosure(
                self.sends(IDENTIFY), {"config": self.config_part()}, "which client it is"
            ),
        }
        if self.holdout.count:  # held-out clients get query.newcomer after the last round
            declared[f"{MessageType.QUERY}.{NEWCOMER}"] = newcomer_disclosure(self, declared)
        return declared

    def round_config(self, server_round: int, phase: str) -> ConfigRecord:
        """The config of every message: the round and phase; where clients keep state and models (a node's own
        node config wins); whether to evaluate (train) and to save the personalized model."""
        cfg = ConfigRecord({"server-round": server_round, "phase": phase})
        if self.results_dir is not None:
            cfg["run-key"] = self.results_dir.name
            cfg["state-dir"] = str(self.results_dir / "client-state")
            cfg["model-dir"] = str(self.results_dir / "models" / "clients")
        for key, value in self.schedule.config(server_round, phase).items():
            cfg[key] = value
        for key, value in self.privacy.declared().items():  # under DP: the noise and clip bound of the round
            cfg[key] = value
        return cfg

    def payload(self, node_id: int, server_round: int, phase: str) -> RecordDict:
        """What a ``phase`` ("train" or "evaluate") message to ``node_id`` carries (default: the global model)."""
        return RecordDict({"arrays": self.record_of(self.global_state)})

    def prepare_round(self, grid: Grid, server_round: int, nodes: list[int]) -> None:
        """Extra phases before the round's cohort is drawn (bids, clustering, the client index); default none."""

    def wants_client_ids(self, server_round: int, nodes: list[int]) -> bool:
        """Whether the cohort depends on which client each node is (then unknown nodes are identified first).
        Default: when only part of the nodes is drawn."""
        return self.cohort_size(len(nodes), self.settings.fraction_train) < len(nodes)

    def sample(self, server_round: int, nodes: list[int]) -> list[int]:
        """The round's cohort: ``fraction-train`` of the nodes, drawn by client id with the run's seed; under central
        DP with ``dp-sampling='poisson'`` (the default) each node independently with probability ``fraction-train``,
        drawn by the operating system's CSPRNG."""
        if self.settings.dp_mode == "central" and self.privacy.draw.get("sampling") == "poisson":
            return poisson_cohort(self.rng, self.by_client(nodes), self.settings.fraction_train)
        return self.draw(nodes, self.cohort_size(len(nodes), self.settings.fraction_train))

    def planned_query_releases(self) -> int:
        """Under local DP: the releases the run plans besides one train reply per round (pFedLIA: its lazy model,
        once), for ``dp-target-epsilon``'s calibration (the method's registry entry declares them)."""
        return method_spec(self.settings.method).privacy.query_releases

    def local_releases(self, server_round: int) -> int:
        """Under local DP: the most models one client releases in round ``server_round`` (default 1, its train
        reply; pFedLIA's clustering round adds the lazy model).  The privacy budget is checked with it."""
        return 1

    def aggregate(self, server_round: int, updates: list[Reply]) -> dict[str, Any]:
        """Default: example-weighted average of the shared keys (FedAvg), or the run's robust ``aggregator``
        (``self.robust.average_models``); under central DP the unweighted mean of the clipped updates plus noise
        (:mod:`strategies.privacy`).  Returns extra history entries."""
        if self.settings.dp_mode == "central" and self.released_keys():
            return central_aggregate(self, server_round, updates)
        if updates and self.shared_keys():
            sizes, clients = [u.num_examples for u in updates], [u.client for u in updates]
            self.global_state = self.robust.average_models(
                [u.arrays for u in updates], sizes, clients, self.global_state
            )
        return {}

    def on_evaluated(self, server_round: int, replies: list[Reply]) -> None:
        """The round's valid evaluate replies, after the common metrics were recorded (default: nothing)."""

    def on_round_end(self, server_round: int) -> None:
        """Called after evaluation of every round (e.g. to settle tokens or record tier tables)."""

    def newcomer_payloads(self, grid: Grid, server_round: int, nodes: list[int]) -> dict[int, RecordDict]:
        """What each held-out node (run-config ``holdout-clients``) gets after the last round to build the model the
        method gives a client that never trained (:mod:`strategies.newcomers`; the client's ``newcomer_model``
        builds it).  Default: what an evaluate message gives a node the server knows nothing about (the global
        model; every cluster or tier model where the client chooses among them).  A method whose newcomer message
        differs also declares it in :meth:`newcomer_receives`."""
        return {n: self.payload(n, server_round, "evaluate") for n in nodes}

    def newcomer_receives(self) -> Mapping[str, Part] | None:
        """What a ``query.newcomer`` message brings, for the method's declaration (:meth:`disclosure`); None (the
        default): what its evaluate message brings."""
        return None

    def server_models(self) -> dict[str, dict[str, np.ndarray]]:
        """The models the server holds, by name (default: the global model, where the method has one)."""
        return {"global": self.global_state} if self.has_global_model and self.global_state else {}

    def clustering_outcome(self) -> tuple[int, str] | None:
        """A clustering method's (clusters at the end, what a single cluster meant) for the run's summary
        (default: None, not a clustering method)."""
        return None

    def state(self) -> dict[str, Any]:
        """What of this method a resumed run needs, in plain values (numbers, strings, lists, dicts, numpy
        arrays, random generators; see :mod:`task.checkpoint`); nothing derivable from the settings or the
        model.  The base saves its own part (history, failures, the global model, the sampling generator)."""
        return {}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Put back what :meth:`state` returned, into a strategy freshly built from the same settings."""

    def results(self) -> RunResults:
        """What the run produced, as the results writer takes it (server_app/results.py), read at the end of the run:
        the rounds, the clients' last evaluations and newcomer scores, the failures, the robustness record, the
        clustering outcome, the privacy spent, and the method's own files (``strategies/<method>_artifacts.py``)."""
        artifacts = method_spec(self.name).artifacts
        outcome = RunResults(
            self.history,
            self.client_eval,
            self.failures,
            self.holdout.results,
            self.holdout.means(),
            attack_report.report(self),
            self.clustering_outcome() if self.history else None,
            self.privacy.published(),
        )
        if artifacts is not None:
            outcome.write_artifacts = functools.partial(load_object(artifacts), self)
        return outcome

    # ------------------------------------------------------------------ Flower's Strategy API
    def summary(self) -> None:
        s = self.settings
        log.info(
            "%s on %s (%s), model %s, %d rounds, fraction-train %.2f, seed %d",
            *(self.name, s.data.dataset, s.data.partition, s.model, s.num_rounds, s.fraction_train, s.seed),
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
        """Flower's round loop (configure, send and receive, aggregate; train then evaluate) for rounds
        ``rounds_done + 1 .. num_rounds`` (all of them unless the strategy was resumed); see the module docstring."""
        first = self.rounds_done + 1
        self.schedule.last_round, self.exchange.timeout = num_rounds, timeout
        log.info("[%s] rounds %d..%d", self.name, first, num_rounds)
        self.summary()
        self._t0, self._first_round, result, arrays = time.monotonic(), first, Result(), initial_arrays
        if evaluate_fn is not None and first == 1 and (metrics := evaluate_fn(0, arrays)) is not None:
            result.evaluate_metrics_serverapp[0] = metrics
        for server_round in range(first, num_rounds + 1):
            log.info("[ROUND %s/%s]", server_round, num_rounds)
            messages = self.configure_train(server_round, arrays, train_config or ConfigRecord(), grid)
            aggregated, metrics = self.aggregate_train(server_round, self.exchange.send(grid, messages))
            arrays = result.arrays = aggregated if aggregated is not None else arrays
            if metrics is not None:
                result.train_metrics_clientapp[server_round] = metrics
            messages = self.configure_evaluate(server_round, arrays, evaluate_config or ConfigRecord(), grid)
            if (metrics := self.aggregate_evaluate(server_round, self.exchange.send(grid, messages))) is not None:
                result.evaluate_metrics_clientapp[server_round] = metrics
            if evaluate_fn is not None and (metrics := evaluate_fn(server_round, arrays)) is not None:
                result.evaluate_metrics_serverapp[server_round] = metrics
        if self.holdout.count:  # the held-out clients, as newcomers, after the last round
            evaluate_newcomers(self, grid, num_rounds)
        return result

    def configure_train(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        self._round_start = time.monotonic()
        nodes = self.available_nodes(grid)  # before the round is logged: a run that gives up here has no round r
        self.history.append(RoundLog(server_round))
        if self.identify_everyone or self.holdout.count or self.wants_client_ids(server_round, nodes):
            self.identify(grid, server_round, nodes)
            self.identify_everyone = False
        nodes = self.holdout.training(nodes, self.client_of)  # a held-out client never takes part
        if self.settings.dp_mode != "off":  # calibration, budget, for the nodes the round draws from: before the
            self.privacy.before_round(self, server_round, len(nodes))  # round releases anything (a stop unlogs it)
            self.privacy.journal_local(self, server_round)  # local DP: journaled before the first release can leave
        self.prepare_round(grid, server_round, nodes)
        cohort = self.sample(server_round, nodes)
        self.privacy.drew(cohort)
        self.schedule.start_round()
        return self._messages(server_round, arrays, config, cohort, "train", MessageType.TRAIN)

    def aggregate_train(
        self, server_round: int, replies: Iterable[Message]
    ) -> tuple[ArrayRecord | None, MetricRecord | None]:
        start = time.perf_counter()
        updates = self.receive(server_round, "train", replies)
        if self.schedule.fused:  # the previous round's evaluation came with these replies
            evaluated = [Reply(u.node_id, u.client, u.num_examples, u.metrics.pop("evaluation")) for u in updates]
            metrics = self.record_evaluation(self.schedule.fused, evaluated, self.asked.get("train"), counted=False)
            log.info(late_evaluation_line(self.name, self.schedule.fused, metrics))
            self.schedule.fused = 0
        # under Poisson sampling a central-DP round releases noise even without a reply: an unchanged model would
        # say that nobody was drawn
        poisson = self.settings.dp_mode == "central" and self.privacy.draw.get("sampling") == "poisson"
        extra = self.aggregate(server_round, updates) if updates or poisson else {}
        if not updates:
            log.warning("round %d: no valid train replies; state left unchanged", server_round)
        metrics = train_metrics(updates, asked=self.asked.get("train"), private=self.settings.dp_mode != "off")
        self.history[-1].train = metrics
        self.history[-1].extra.update(extra)
        arrays = to_record(self.global_state) if self.global_state else ArrayRecord()
        self.server_time(time.perf_counter() - start)
        return arrays, MetricRecord({k: v for k, v in metrics.items() if isinstance(v, (int, float))})

    def configure_evaluate(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid
    ) -> Iterable[Message]:
        if self.schedule.rides_on_next_train(server_round):
            self.schedule.defer(server_round)
        if not self.schedule.has_evaluate_phase(server_round):
            return []
        nodes = self.available_nodes(grid)
        if self.holdout.count:  # a held-out client is evaluated only as a newcomer, at the end
            self.identify(grid, server_round, nodes)
            nodes = self.holdout.training(nodes, self.client_of)
        k = self.cohort_size(len(nodes), self.settings.fraction_evaluate)
        if k < len(nodes):
            self.identify(grid, server_round, nodes)
        return self._messages(server_round, arrays, config, self.draw(nodes, k), "evaluate", MessageType.EVALUATE)

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        metrics: dict[str, float] = {}
        if self.schedule.has_evaluate_phase(server_round):
            evaluated = self.receive(server_round, "evaluate", replies)
            self.record_evaluation(server_round, evaluated, asked=self.asked.get("evaluate"))
            metrics = self.history[-1].evaluate
        self.on_round_end(server_round)
        close_round(self.history[-1], self.exchange.comm.pop(server_round, {}), time.monotonic() - self._round_start)
        self.rounds_done, ran = server_round, server_round - self._first_round + 1
        how = self.schedule.how_evaluated(server_round)
        log.info(progress_line(self.name, server_round, self.schedule.last_round, ran, self._t0, metrics, how))
        for watch in self.round_watchers:
            watch(self.history)
        self.checkpoint.after_round(server_round)
        return MetricRecord({k: v for k, v in metrics.items() if isinstance(v, (int, float))})

    # ------------------------------------------------------------------ the round's pieces
    def _messages(
        self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, nodes: list[int], phase: str, kind: str
    ) -> list[Message]:
        """The phase's messages: Flower's ``arrays`` (``start``'s ``initial_arrays``, then what ``aggregate_train``
        returned) becomes the global model and is the record sent as it; each node's :meth:`payload`, ``config``
        under the base's round config."""
        start = time.perf_counter()
        if model := shared_model(arrays, self.initial_state, self.shared_keys()):  # exactly the shared keys
            self.global_state = model
        payloads = {}
        with self.exchange.sharing_records({id(self.global_state): (self.global_state, arrays)}):
            for node in nodes:
                payloads[node] = self.payload(node, server_round, phase)
                payloads[node]["config"] = ConfigRecord({**config, **self.round_config(server_round, phase)})
        messages = self.exchange.address(server_round, phase, kind, payloads)
        self.server_time(time.perf_counter() - start)
        return messages

    def record_evaluation(
        self, server_round: int, updates: list[Reply], asked: int | None = None, counted: bool = True
    ) -> dict[str, float]:
        """Round ``server_round``'s evaluation replies (of the ``asked`` nodes asked for one) into the history, then the
        method's :meth:`on_evaluated`.  Under DP no single client's value is kept, and an evaluation that came with
        train replies (``counted`` False) keeps no count either: its clients are the round's cohort, whose size
        Poisson sampling does not release."""
        private = self.settings.dp_mode != "off"
        counted = counted or not private
        metrics = record_evaluation(self.history, self.client_eval, server_round, updates, asked, private, counted)
        metrics.update(honest_metrics(self.settings, updates))  # under an injected attack (docs/robustness.md)
        self.on_evaluated(server_round, updates)
        return metrics

"""The personalized base every strategy here stands on: the hooks a method overrides, what it calls, and its parts.

:class:`PersonalizedStrategy` is one ``flwr.serverapp.strategy.Strategy`` (Message API) class: what it does besides
a method's hooks is done by named parts, each an object of its own module that the constructor makes and says what a
method may use of (Flower's round loop is the part ``self.loop``, strategies/rounds.py).  Per-client state is keyed by
**client id** (the ``partition-id`` a node reports), never by Flower's node id.

A method overrides the hooks of the first section below and nothing else (docs/adding-a-method.md, step 3); each
round the loop calls ``prepare_round`` -> ``sample`` -> ``payload`` (with ``round_config``) -> the replies, checked
against ``reply_spec`` -> ``aggregate`` -> the evaluation -> ``on_evaluated`` -> ``on_round_end``, and ``state`` /
``restore`` with every checkpoint and resume.  The second section is what a method calls from its hooks.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Message, MessageType, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from strategies import attack_report
from strategies.attack_report import with_attack_metrics
from strategies.checkpointing import Checkpoint
from strategies.disclosure import Unread, sent, stacked
from strategies.exchange import MessageExchange, RunAborted
from strategies.gate import ReplyGate, cohort_size
from strategies.history import add_seconds
from strategies.newcomers import NEWCOMER_SPEC, Holdout, newcomer_disclosure
from strategies.outcome import RoundLog, RunResults
from strategies.privacy import ServerPrivacy, central_aggregate, cohort_generator, poisson_cohort
from strategies.replies import BASE, EVALUATE, TRAIN, Arrays, Dim, Disclosure, Part, Reply, ReplySpec
from strategies.robust import RobustAveraging
from strategies.rounds import RoundLoop
from strategies.schedule import EvaluationSchedule
from task.config import Settings
from task.methods import NEWCOMER, load_object, method_spec
from task.models import ModelInfo

__all__ = ["IDENTIFY", "PersonalizedStrategy", "Reply", "RunAborted", "log"]

log = logging.getLogger("flwr.pflower")
#: the query that asks a node which client it is
IDENTIFY = "identify"


class PersonalizedStrategy(Strategy):
    """The hooks, what a method calls, and the parts shared by all methods (see the module docstring)."""

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
        self.client_eval: dict[int, dict[str, float]] = {}  # client id -> last evaluate metrics
        self.results_dir: Path | None = None  # set by the ServerApp: the run's results folder
        #: called with the history after every round (the ServerApp's TensorBoard and MLflow writers)
        self.round_watchers: list[Callable[[list[RoundLog]], None]] = []
        self.rounds_done = 0  # the last complete round (a resumed strategy continues after it)
        self.identify_everyone = False  # set on resume: ask every node who it is before the next round
        self._global_state: dict[str, np.ndarray] | None = None
        #: draws cohorts: from the run's seed, so a run repeats; under DP from a secret only the server holds
        self.rng = cohort_generator(settings)
        # ---- the parts
        #: sends messages through the Grid and collects their replies; ``record_of(state)`` makes a state the
        #: ArrayRecord every message of the phase shares, ``comm`` the bytes per round (strategies/exchange.py)
        self.exchange = MessageExchange(settings.round_timeout)
        #: admits the valid replies (:meth:`reply_spec`) and binds node ids to client ids (strategies/gate.py)
        self.gate = ReplyGate(self.reply_spec)
        #: the gate's node id -> client id, client id -> its node, rejected replies and silent nodes (the same objects)
        self.client_of, self.node_of, self.failures = self.gate.client_of, self.gate.node_of, self.gate.failures
        #: which rounds are evaluated, on which message; ``fused``: the round the train replies evaluate
        self.schedule = EvaluationSchedule(settings, self.evaluate_in_train)
        #: what differential privacy keeps across rounds (noise multiplier, clip bound, release journal);
        #: ``account_local(releases)``: a local-DP round's epsilon (strategies/privacy.py)
        self.privacy = ServerPrivacy(settings)
        #: the run's aggregation rule wherever a method averages client models: ``average_models(models, weights,
        #: clients, reference=None, group="global")``, ``average_rows`` on rows of flattened models (weights None:
        #: uniform), ``bound_models`` and ``choose_peers`` (FedC2I); strategies/robust.py, docs/robustness.md
        self.robust = RobustAveraging(settings, self.history, self.gate.client_of)
        #: the clients held out of training (``holdout-clients``), evaluated at the end as newcomers
        self.holdout = Holdout(settings.holdout_clients)
        #: what a checkpoint holds of the strategy, and how a resumed run takes it back (strategies/checkpointing.py)
        self.checkpoint = Checkpoint(self)
        #: Flower's round loop over the hooks below (strategies/rounds.py)
        self.loop = RoundLoop(self)

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
        return RecordDict({"arrays": self.exchange.record_of(self.global_state)})

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
        """What each held-out node (``holdout-clients``) gets after the last round, from which its ``newcomer_model``
        builds the model the method gives a client that never trained (strategies/newcomers.py).  Default: its evaluate
        payload.  A method whose newcomer message differs declares it in :meth:`newcomer_receives`."""
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
        """What of this method a resumed run needs, in plain values (numbers, strings, lists, dicts, numpy arrays,
        random generators; task/checkpoint.py), nothing derivable; the base's parts save their own."""
        return {}

    def restore(self, state: Mapping[str, Any]) -> None:
        """Put back what :meth:`state` returned, into a strategy freshly built from the same settings."""

    def results(self) -> RunResults:
        """What the run produced, as the results writer takes it (server_app/results.py; strategies/outcome.py)."""
        out = RunResults(self.history, self.client_eval, self.failures, self.holdout.results, self.holdout.means())
        out.robustness, out.privacy = attack_report.report(self), self.privacy.published()
        out.clustering = self.clustering_outcome() if self.history else None
        if (artifacts := method_spec(self.name).artifacts) is not None:  # strategies/<method>_artifacts.py
            out.write_artifacts = functools.partial(load_object(artifacts), self)
        return out

    # ------------------------------------------------------------------ what a method calls
    @property
    def global_state(self) -> dict[str, np.ndarray]:
        """The shared model (the shared keys of the common initial model until the first aggregation)."""
        if self._global_state is None:
            self._global_state = {k: np.array(self.initial_state[k]) for k in self.shared_keys()}
        return self._global_state

    @global_state.setter
    def global_state(self, value: dict[str, np.ndarray]) -> None:
        self._global_state = value

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

    def client(self, node_id: int) -> int | None:
        """The client id behind ``node_id`` (None until the node has replied once)."""
        return self.gate.client_of.get(node_id)

    def by_client(self, nodes: Iterable[int]) -> list[int]:
        """``nodes`` ordered by client id (nodes not identified yet last, by node id)."""
        return self.gate.by_client(nodes)

    def draw(self, nodes: list[int], k: int) -> list[int]:
        """``k`` of ``nodes`` drawn with the run's generator by client id (all of them when k >= len)."""
        return self.gate.draw(self.rng, nodes, k)

    #: how many of ``available`` nodes a ``fraction`` of them is: rounded, at least one, at most all
    cohort_size = staticmethod(cohort_size)

    def send_query(self, grid: Grid, server_round: int, name: str, payloads: Mapping[int, RecordDict]) -> list[Reply]:
        """Extra phase: send ``query.<name>`` with each node's own payload; return the replies that match
        ``reply_spec(name, node)``, ordered by client id (the others are recorded in failures)."""
        return self.loop.query(grid, server_round, name, payloads)

    def identify(self, grid: Grid, server_round: int, nodes: list[int]) -> list[Reply]:
        """Ask nodes that never replied which client they are (a tiny ``query.identify``); their valid replies."""
        unknown = self.gate.unknown(nodes)
        return self.send_query(grid, server_round, IDENTIFY, {n: RecordDict() for n in unknown}) if unknown else []

    def server_time(self, seconds: float) -> None:
        """Add ``seconds`` of server work to the round's ``server-seconds``."""
        add_seconds(self.history, seconds)

    def sends(self, phase: str, what: Mapping[str, str] | None = None) -> dict[str, Part]:
        """For :meth:`disclosure`: what a reply of ``phase`` carries: the records of its reply spec (``what``: record ->
        in words), the metrics the method's clients send unread (:attr:`unread_metrics`), the optional timing stamps
        and, with a train reply, the optional evaluation of the client's previous model."""
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
        """For :meth:`disclosure`: an ArrayRecord of the model's shared keys derived from other clients; with
        ``count``, that many models stacked."""
        arrays = Arrays.like(self.initial_state, list(self.shared_keys()))
        kw.setdefault("from_peers", True)
        return Part(what, arrays=arrays if count is None else stacked(arrays, count), **kw)

    def config_part(self, **more: bool) -> Part:
        """For :meth:`disclosure`: the ``config`` record every message carries (:meth:`round_config`), and a method's
        ``more`` entries."""
        optional = ("run-key", "state-dir", "model-dir", "evaluate", "evaluate-round", "save-model", "save-best")
        declared = ("dp-noise-multiplier", "dp-clip")  # under DP: the round's noise and clip bound
        return Part(
            "the server's instructions (nothing about other clients)",
            entries={"server-round": True, "phase": True, **dict.fromkeys(optional + declared, False), **more},
        )

    # ------------------------------------------------------------------ Flower's Strategy API: self.loop runs it
    def start(self, *args: Any, **kwargs: Any) -> Result:
        """Flower's ``Strategy.start`` (its arguments and ``Result``) for the rounds after ``rounds_done``."""
        return self.loop.start(*args, **kwargs)

    def configure_train(self, *args: Any, **kwargs: Any) -> Iterable[Message]:
        return self.loop.configure_train(*args, **kwargs)

    def aggregate_train(self, *args: Any, **kwargs: Any) -> tuple[ArrayRecord | None, MetricRecord | None]:
        return self.loop.aggregate_train(*args, **kwargs)

    def configure_evaluate(self, *args: Any, **kwargs: Any) -> Iterable[Message]:
        return self.loop.configure_evaluate(*args, **kwargs)

    def aggregate_evaluate(self, *args: Any, **kwargs: Any) -> MetricRecord | None:
        return self.loop.aggregate_evaluate(*args, **kwargs)

    def summary(self) -> None:
        self.loop.summary()

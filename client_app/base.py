"""What every client method shares (docs/adding-a-method.md, step 4): settings, the node's data, the model (built
once per process: ``reset_model`` returns the process's one network, reset to the common initial weights), training,
evaluation and the handlers.  A method overrides the hooks (``train``, ``personal_model``, ``global_model``,
``evaluation_extras``, ``test_split``, ``newcomer_model``, ``query``, ``release_reference``) and nothing else.

Its one named part is ``self.kept``, the state kept between rounds (``kept.load`` / ``kept.save`` of the names in
``keeps``: client_app/state.py).  The base alone uses the rest: client_app/node.py (the node's data),
client_app/saving.py (the saved model, DP's own BatchNorm statistics), client_app/newcomers.py (a newcomer's scores).
"""

from __future__ import annotations

import contextlib
import copy
import functools
import resource
import time
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord, RecordDict
from torch import nn

from client_app.newcomers import newcomer_scores
from client_app.node import open_node
from client_app.saving import PersonalModelFile, own_norm_statistics
from client_app.state import KeptState
from task.attacks import backdoor_metrics
from task.config import Settings, parse_settings
from task.methods import NEWCOMER
from task.models import SplitModel, body_keys, build_model, head_keys
from task.params import load_record
from task.train import evaluate, train

#: what :meth:`ClientMethod.global_model` returns when the personalized model is the global model
SAME_AS_PERSONAL = object()


@functools.lru_cache(maxsize=8)
def _cached_model(
    model: str, in_channels: int, image_size: int, num_classes: int, seed: int, device: str
) -> tuple[SplitModel, dict]:
    net = build_model(model, in_channels, image_size, num_classes, seed=seed).to(device)
    return net, copy.deepcopy(net.state_dict())


#: what a MetricRecord holds (flwr 1.41)
MetricValue = int | float | list[int] | list[float]


class ClientMethod:
    """Base of the client side of a method: a subclass implements :meth:`train` and overrides the evaluation
    hooks it needs (see the module docstring); the base's :meth:`evaluate` serves every method."""

    #: what this method keeps between rounds: state name -> what it holds (nothing by default)
    keeps: ClassVar[Mapping[str, str]] = {}
    #: the queries whose reply's ``arrays`` leave like a train reply's under differential privacy (clipped, and
    #: under local DP released around :meth:`release_reference`); e.g. pFedLIA's ``lazy``, a model other clients see
    released_queries: ClassVar[tuple[str, ...]] = ()

    def __init__(self, context: Context, settings: Settings | None = None) -> None:
        self.context = context
        self.server_round = 0
        self.config: dict[str, Any] = {}  # the current message's config (per client, never shared between them)
        self.settings = settings or parse_settings(context.run_config)
        self.options = self.settings.options  # the method's own typed options (task.methods)
        # the node's partition, device and data, or the reason it refuses the run (client_app/node.py)
        self.partition_id, self.num_partitions, self.device, self.data = open_node(context, self.settings)
        self.seed = int(self.settings.seed) * 100_003 + self.partition_id
        self.timings: dict[str, float] = {}
        #: what this node keeps between rounds (client_app/state.py): ``self.kept.load(name)``, ``.save(name, ...)``
        self.kept = KeptState(
            context, type(self).__name__, self.keeps, self.partition_id, max(self.settings.checkpoint_every, 1) + 1
        )
        self.model_file = PersonalModelFile(context.node_config, self.settings, self.partition_id)

    # ---------------------------------------------------------------- model and messages
    def reset_model(self) -> SplitModel:
        """The process's model for these settings, reset to the common initial weights."""
        s = self.settings
        net, init = _cached_model(s.model, s.in_channels, s.image_size, s.num_classes, s.seed, str(self.device))
        net.load_state_dict(init)
        net.train()
        for p in net.parameters():
            p.requires_grad_(True)
        return net

    def body_keys(self, model: nn.Module) -> list[str]:
        return body_keys(model)

    def head_keys(self, model: nn.Module) -> list[str]:
        return head_keys(model)

    @staticmethod
    def message_arrays(content: RecordDict, key: str = "arrays") -> ArrayRecord | None:
        return content.array_records.get(key)

    @staticmethod
    def message_config(content: RecordDict) -> dict[str, Any]:
        return dict(content.config_records["config"]) if "config" in content.config_records else {}

    def begin(self, content: RecordDict) -> None:
        """Read what every message's config says (round, where to keep state and models)."""
        self.config = self.message_config(content)
        self.server_round = int(self.config.get("server-round", 0))  # seeds this round's shuffles
        self.kept.begin(self.config)  # where this round's kept state is read and written

    # ---------------------------------------------------------------- training and evaluation
    @contextlib.contextmanager
    def timed(self, phase: str):
        """Accumulate wall time of a phase ("train" for local training, "method" for method-specific
        client work such as influence, masks, bids or the index); reported as ``time-<phase>``."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.timings[phase] = self.timings.get(phase, 0.0) + time.perf_counter() - start

    def fit(self, model: nn.Module, epochs: int | None = None, phase: str = "train", **hooks: Any) -> dict[str, float]:
        """Local training with the run's settings, timed as ``time-<phase>`` (a method's own training, e.g. pFedLIA's
        lazy model, is ``"method"`` work); hooks as in task.train.train."""
        s = self.settings
        with self.timed(phase):
            return train(
                model,
                self.data.x_train,
                self.data.y_train,
                epochs=s.local_epochs if epochs is None else epochs,
                batch_size=s.batch_size,
                lr=s.lr,
                momentum=s.momentum,
                weight_decay=s.weight_decay,
                seed=self.seed + 7919 * self.server_round,
                optimizer=s.optimizer,
                **hooks,
            )

    def test(self, model: nn.Module, split: str = "test", **kw: Any) -> tuple[float, float]:
        x, y = getattr(self.data, f"x_{split}"), getattr(self.data, f"y_{split}")
        return evaluate(model, x, y, **kw)

    def base_metrics(self) -> dict[str, MetricValue]:
        """partition-id, num-examples, the timed phases so far and the process's peak memory (MB)."""
        metrics: dict[str, MetricValue] = {"partition-id": self.partition_id, "num-examples": self.data.num_train}
        metrics.update({f"time-{k}": float(v) for k, v in self.timings.items()})
        metrics["peak-rss-mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
        return metrics

    @staticmethod
    def reply(
        metrics: Mapping[str, MetricValue],
        arrays: ArrayRecord | None = None,
        **records: ArrayRecord | MetricRecord | ConfigRecord,
    ) -> RecordDict:
        """The reply's content: ``metrics`` (MetricRecord), optional ``arrays`` and any further records."""
        content = RecordDict({"metrics": MetricRecord(dict(metrics))})
        if arrays is not None:
            content["arrays"] = arrays
        for k, v in records.items():
            content[k] = v
        return content

    # ---------------------------------------------------------------- evaluation (override the models)
    def personal_model(self, content: RecordDict) -> nn.Module:
        """The model this client uses for its own predictions, from an evaluate (or train) message.
        Default: the model the server sent (``arrays``)."""
        model = self.reset_model()
        load_shared(model, content)
        return model

    def global_model(self, content: RecordDict, personal: nn.Module) -> nn.Module | object | None:
        """The method's global model as this client sees it, :data:`SAME_AS_PERSONAL` when the personalized
        model is the global one, or None when the method has none.  Called after the personalized model was
        scored, so it may rebuild the process's network."""
        return None

    def evaluation_extras(self, content: RecordDict, personal: nn.Module) -> dict[str, Any]:
        """Method-specific evaluation metrics (e.g. tier accuracies); called last."""
        return {}

    def test_split(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The data the personalized and global models are scored on."""
        return self.data.x_test, self.data.y_test

    def newcomer_model(self, content: RecordDict) -> nn.Module:
        """The model this method gives a client that never took part in training, from the ``query.newcomer``
        message the server sends every held-out client after the last round (strategies/newcomers.py).  Default: the
        personalized model built from the message as an evaluation builds it, which for a client with no state of
        its own is the global model, or its own choice among the cluster or tier models the message brings."""
        return self.personal_model(content)

    def evaluation(self, content: RecordDict) -> dict[str, Any]:
        """The evaluation metrics of the models ``content`` gives this client (and the saved model, if asked)."""
        x, y = self.test_split()
        model = self.personal_model(content)
        own_norm_statistics(model, self.settings, self.data.x_train)
        loss, acc = evaluate(model, x, y)
        metrics: dict[str, Any] = {"personal-acc": acc, "personal-loss": loss, "test-examples": len(y)}
        metrics.update(
            backdoor_metrics(self.settings.attacks, model, x, y)
        )  # run-config attack='backdoor' (docs/robustness.md)
        if self.config.get("save-model"):
            self.model_file.save(model, metrics, self.config, self.server_round)
        glob = self.global_model(content, model)
        if glob is SAME_AS_PERSONAL:
            metrics.update({"global-acc": acc, "global-loss": loss})
        elif isinstance(glob, nn.Module):
            own_norm_statistics(glob, self.settings, self.data.x_train)
            metrics["global-loss"], metrics["global-acc"] = evaluate(glob, x, y)
        metrics.update(self.evaluation_extras(content, model))
        return metrics

    # ---------------------------------------------------------------- handlers
    # Handlers take and return a message's content (RecordDict); client_app.app wraps them in Messages,
    # so they can be unit-tested with a hand-built Context and RecordDict.
    def train(self, content: RecordDict) -> RecordDict:  # pragma: no cover - abstract
        raise NotImplementedError

    def evaluate(self, content: RecordDict) -> RecordDict:
        """The evaluate handler: the personalized model's (and the global model's) accuracy on the test split."""
        self.begin(content)
        return self.reply({**self.base_metrics(), **self.evaluation(content)})

    def release_reference(self, content: RecordDict) -> dict[str, np.ndarray]:
        """Under ``dp-mode='local'``: the model the train reply's model (and the model of a reply to one of
        :attr:`released_queries`) is released against (its change from it is clipped and noised).  It must not
        depend on this client's data except through its earlier releases (e.g. its own previous release), otherwise
        the release is not a Gaussian mechanism of the clipped change alone.
        A method declares ``local`` in its registry entry only with this hook overridden."""
        raise NotImplementedError(
            f"method {self.settings.method!r} names no reference for local differential privacy (release_reference)"
        )

    def query(self, name: str, content: RecordDict) -> RecordDict:
        """Extra phases; every method answers ``identify`` (who this client is: its partition id and size) and
        ``newcomer`` (a held-out client's scores of what the method gives a newcomer, :meth:`newcomer_model`, on its
        test split, before and after ``local-epochs`` of fine-tuning: client_app/newcomers.py)."""
        if name == "identify":
            return self.reply(self.base_metrics())
        if name == NEWCOMER:
            x, y = self.test_split()
            scores = newcomer_scores(self.newcomer_model(content), x, y, self.fit)
            return self.reply({**self.base_metrics(), **scores})
        raise ValueError(f"method {self.settings.method!r} does not answer query {name!r}")


def load_shared(model: nn.Module, content: RecordDict, key: str = "arrays") -> bool:
    """Load the arrays the server sent (if any) into ``model``; True when something was loaded."""
    rec = ClientMethod.message_arrays(content, key)
    if rec is None or len(rec) == 0:
        return False
    load_record(model, rec)
    return True

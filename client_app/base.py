"""What every client method shares: settings, data, the model (built once per process) and persisted state.

A handler reads like a recipe: ``model = self.fresh_model()``; load what the message carries and what
``context.state`` kept; ``self.fit(model, ...)``; reply with ``self.reply(...)``.  Data and model are
loaded once per process (cached by settings), not again in every handler.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import resource
import time
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, MetricRecord, RecordDict
from torch import nn

from task.config import Settings, parse_settings
from task.data import ClientData, load_client_data, load_local_file
from task.data.clients import default_cache_dir
from task.models import SplitModel, body_keys, build_model, head_keys
from task.params import load_record, record_to_numpy, to_record
from task.train import evaluate, resolve_device, train


@functools.lru_cache(maxsize=8)
def _cached_model(model: str, in_channels: int, image_size: int, num_classes: int, seed: int, device: str) -> tuple[SplitModel, dict]:
    net = build_model(model, in_channels, image_size, num_classes, seed=seed).to(device)
    return net, copy.deepcopy(net.state_dict())


class ClientMethod:
    """Base of the client side of a method; subclasses implement :meth:`train` and :meth:`evaluate`."""

    def __init__(self, context: Context, settings: Settings | None = None) -> None:
        self.context = context
        self.settings = settings or parse_settings(context.run_config)
        self.options = self.settings.options  # the method's own typed options (task.methods)
        node_cfg = context.node_config
        data_path = str(node_cfg.get("data-path", ""))
        if "partition-id" not in node_cfg or ("num-partitions" not in node_cfg and not data_path):
            raise ValueError(
                "node config needs 'partition-id' and either 'num-partitions' (a partition of the embedded data; "
                "set by the simulation, or --node-config \"partition-id=0 num-partitions=3\" on a SuperNode) or "
                "'data-path' (the node's own .npz file: --node-config \"partition-id=0 data-path='/data/me.npz'\")"
            )
        self.partition_id = int(node_cfg["partition-id"])
        self.num_partitions = int(node_cfg.get("num-partitions", 0))
        self.device = resolve_device(str(node_cfg.get("device", self.settings.device)))
        threads = int(node_cfg.get("num-threads", self.settings.client_threads))
        if threads > 0 and torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        if data_path:
            self.data: ClientData = load_local_file(data_path, self.settings.data, self.partition_id)
        else:  # node config cache-dir: where the node keeps its splits ("" = rebuild them in every process)
            cache = str(node_cfg.get("cache-dir", default_cache_dir()))
            self.data = load_client_data(self.settings.data, self.partition_id, self.num_partitions, cache or None)
        self.seed = int(self.settings.seed) * 100_003 + self.partition_id
        self.timings: dict[str, float] = {}

    # ---------------------------------------------------------------- model and state
    def fresh_model(self) -> SplitModel:
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

    def load_state(self, name: str) -> dict[str, np.ndarray] | None:
        """Arrays this node saved under ``name`` in ``context.state`` (persist across rounds), or None."""
        rec = self.context.state.array_records.get(name) if name in self.context.state.array_records else None
        return record_to_numpy(rec) if rec is not None else None

    def save_state(self, name: str, state: Mapping[str, Any], keys: Iterable[str] | None = None) -> None:
        self.context.state[name] = to_record(state, keys)

    def load_config_state(self, name: str) -> dict[str, Any]:
        return dict(self.context.state.config_records[name]) if name in self.context.state.config_records else {}

    def save_config_state(self, name: str, values: Mapping[str, Any]) -> None:
        self.context.state[name] = ConfigRecord(dict(values))

    @staticmethod
    def message_arrays(content: RecordDict, key: str = "arrays") -> ArrayRecord | None:
        return content.array_records[key] if key in content.array_records else None

    @staticmethod
    def message_config(content: RecordDict) -> dict[str, Any]:
        return dict(content.config_records["config"]) if "config" in content.config_records else {}

    @staticmethod
    def round_of(content: RecordDict) -> int:
        return int(ClientMethod.message_config(content).get("server-round", 0))

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

    def fit(self, model: nn.Module, epochs: int | None = None, **hooks: Any) -> dict[str, float]:
        """Local training with the run's settings (timed as ``time-train``); hooks as in task.train.train."""
        with self.timed("train"):
            return self._fit(model, epochs, **hooks)

    def _fit(self, model: nn.Module, epochs: int | None = None, **hooks: Any) -> dict[str, float]:
        s = self.settings
        return train(
            model, self.data.x_train, self.data.y_train,
            epochs=s.local_epochs if epochs is None else epochs, batch_size=s.batch_size, lr=s.lr,
            momentum=s.momentum, weight_decay=s.weight_decay, seed=self.seed + 7919 * self.round_seed,
            optimizer=s.optimizer, **hooks,
        )

    round_seed = 0

    def test(self, model: nn.Module, split: str = "test", **kw: Any) -> tuple[float, float]:
        x, y = getattr(self.data, f"x_{split}"), getattr(self.data, f"y_{split}")
        return evaluate(model, x, y, **kw)

    def base_metrics(self) -> dict[str, float | int]:
        """partition-id, num-examples, the timed phases so far and the process's peak memory (MB)."""
        metrics: dict[str, float | int] = {"partition-id": self.partition_id, "num-examples": self.data.num_train}
        metrics.update({f"time-{k}": float(v) for k, v in self.timings.items()})
        metrics["peak-rss-mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
        return metrics

    @staticmethod
    def reply(metrics: Mapping[str, float | int], arrays: ArrayRecord | None = None,
              **records: ArrayRecord | MetricRecord | ConfigRecord) -> RecordDict:
        """The reply's content: ``metrics`` (MetricRecord), optional ``arrays`` and any further records."""
        content = RecordDict({"metrics": MetricRecord(dict(metrics))})
        if arrays is not None:
            content["arrays"] = arrays
        for k, v in records.items():
            content[k] = v
        return content

    # ---------------------------------------------------------------- handlers (override)
    # Handlers take and return a message's content (RecordDict); client_app.app wraps them in Messages,
    # so they can be unit-tested with a hand-built Context and RecordDict.
    def train(self, content: RecordDict) -> RecordDict:  # pragma: no cover - abstract
        raise NotImplementedError

    def evaluate(self, content: RecordDict) -> RecordDict:  # pragma: no cover - abstract
        raise NotImplementedError

    def query(self, name: str, content: RecordDict) -> RecordDict:
        """Extra phases; every method answers ``identify`` (who this client is: its partition id and size)."""
        if name == "identify":
            return self.reply(self.base_metrics())
        raise ValueError(f"method {self.settings.method!r} does not answer query {name!r}")


def load_shared(model: nn.Module, content: RecordDict, key: str = "arrays") -> bool:
    """Load the arrays the server sent (if any) into ``model``; True when something was loaded."""
    rec = ClientMethod.message_arrays(content, key)
    if rec is None or len(rec) == 0:
        return False
    load_record(model, rec)
    return True

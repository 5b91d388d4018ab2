"""Run config -> typed settings shared by the ServerApp and the ClientApp.

The run config (pyproject ``[tool.flwr.app.config]`` overridden by ``--run-config``) is the single
source of settings.  Keys are kebab-case as Flower uses them; a method reads its own extra keys with
:meth:`Settings.get`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from task.data import DataSettings, dataset_info
from task.models import MODELS


@dataclass(frozen=True)
class Settings:
    method: str
    data: DataSettings
    model: str
    num_rounds: int
    fraction_train: float
    min_nodes: int
    local_epochs: int
    batch_size: int
    lr: float
    momentum: float
    weight_decay: float
    seed: int
    device: str
    round_timeout: float
    results_dir: str
    eval_every: int = 1
    fraction_evaluate: float = 1.0
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def get(self, key: str, default: Any = None) -> Any:
        """A method-specific run-config key (kebab-case), with a default."""
        return self.raw.get(key, default)

    def require(self, key: str, kind: type, *, minimum: float | None = None, maximum: float | None = None) -> Any:
        """A method-specific key that must exist, converted to ``kind`` and range-checked."""
        if key not in self.raw:
            raise ValueError(f"run-config key {key!r} is required by method {self.method!r}")
        try:
            value = kind(self.raw[key])
        except (TypeError, ValueError) as err:
            raise ValueError(f"run-config key {key!r} must be {kind.__name__}, got {self.raw[key]!r}") from err
        if minimum is not None and value < minimum:
            raise ValueError(f"run-config key {key!r} must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise ValueError(f"run-config key {key!r} must be <= {maximum}, got {value}")
        return value

    @property
    def in_channels(self) -> int:
        return dataset_info(self.data.dataset).in_channels

    @property
    def image_size(self) -> int:
        return dataset_info(self.data.dataset).image_size

    @property
    def num_classes(self) -> int:
        if self.data.dataset == "dialects":
            from task.text import vocab_size

            return vocab_size(self.data.lm_pretrained)
        return dataset_info(self.data.dataset).num_classes


def _num(cfg: Mapping[str, Any], key: str, kind: type, default: Any, minimum: float | None = None) -> Any:
    value = cfg.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        try:
            value = kind(value)
        except (TypeError, ValueError) as err:
            raise ValueError(f"run-config key {key!r} must be a number, got {value!r}") from err
    if kind is int and float(value) != int(value):
        raise ValueError(f"run-config key {key!r} must be an integer, got {value!r}")
    value = kind(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"run-config key {key!r} must be >= {minimum}, got {value}")
    return value


def _fraction(cfg: Mapping[str, Any], key: str) -> float:
    value = _num(cfg, key, float, 1.0)
    if not 0.0 < value <= 1.0:
        raise ValueError(f"run-config key {key!r} must be in (0, 1], got {value}")
    return value


def parse_settings(cfg: Mapping[str, Any]) -> Settings:
    """Validate the run config; every error names the key and what is allowed."""
    from strategies.registry import METHODS  # late import: the registry imports method modules lazily

    method = str(cfg.get("method", "fedavg"))
    if method not in METHODS:
        raise ValueError(f"unknown method {method!r} (run-config key 'method'); allowed: {sorted(METHODS)}")
    dataset = str(cfg.get("dataset", "digits"))
    dataset_info(dataset)
    model = str(cfg.get("model", "auto"))
    lm_pretrained = str(cfg.get("lm-pretrained", ""))
    if model == "auto":
        model = "cnn" if dataset_info(dataset).image_size > 0 else ("gpt2" if dataset == "dialects" else "softmax")
    if lm_pretrained and model == "gpt2":
        model = f"gpt2:{lm_pretrained}"  # the model starts from the local pretrained folder
    if model not in MODELS and not model.startswith("gpt2:"):
        raise ValueError(f"unknown model {model!r} (run-config key 'model'); allowed: {sorted(MODELS)} or 'auto'")
    data = DataSettings(
        dataset=dataset,
        partition=str(cfg.get("partition", "dirichlet")),
        alpha=_num(cfg, "alpha", float, 0.5),
        classes_per_client=_num(cfg, "classes-per-client", int, 2, 1),
        num_clusters=_num(cfg, "num-clusters", int, 5, 1),
        mixture=str(cfg.get("mixture", "10:90")),
        feature_shift=_num(cfg, "feature-shift", int, 0, 0),
        test_fraction=_num(cfg, "test-fraction", float, 0.2, 0.0),
        val_fraction=_num(cfg, "val-fraction", float, 0.1, 0.0),
        noise_std=_num(cfg, "noise-std", float, 0.0, 0.0),
        data_copies=_num(cfg, "data-copies", int, 1, 1),
        data_dir=str(cfg.get("data-dir", "")),
        seed=_num(cfg, "seed", int, 0),
        dialect_mix=_num(cfg, "dialect-mix", float, 0.5, 0.0),
        dialect_sequences=_num(cfg, "dialect-sequences", int, 120, 4),
        lm_pretrained=lm_pretrained,
    )
    fraction = _fraction(cfg, "fraction-train")
    if str(cfg.get("optimizer", "sgd")) not in ("sgd", "adam"):
        raise ValueError(f"unknown optimizer {cfg.get('optimizer')!r} (run-config key 'optimizer'); allowed: ['sgd', 'adam']")
    return Settings(
        method=method,
        data=data,
        model=model,
        num_rounds=_num(cfg, "num-server-rounds", int, 10, 1),
        fraction_train=fraction,
        min_nodes=_num(cfg, "min-nodes", int, 2, 1),
        local_epochs=_num(cfg, "local-epochs", int, 1, 0),
        batch_size=_num(cfg, "batch-size", int, 20, 1),
        lr=_num(cfg, "lr", float, 0.05, 0.0),
        momentum=_num(cfg, "momentum", float, 0.9, 0.0),
        weight_decay=_num(cfg, "weight-decay", float, 0.0, 0.0),
        seed=data.seed,
        device=str(cfg.get("device", "auto")),
        round_timeout=_num(cfg, "round-timeout", float, 3600.0, 1.0),
        results_dir=str(cfg.get("results-dir", "results")),
        eval_every=_num(cfg, "eval-every", int, 1, 1),
        fraction_evaluate=_fraction(cfg, "fraction-evaluate"),
        raw=dict(cfg),
    )

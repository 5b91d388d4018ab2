"""Run config -> typed settings shared by the ServerApp and the ClientApp.

The run config (pyproject ``[tool.flwr.app.config]`` overridden by ``--run-config``) is the single source of
settings.  :class:`Settings` declares the keys every run has, once each, its parts' keys where those are read (the
data's in task/data, the aggregation rule's in task/robust.py, the attack's in task/attacks.py); each method's own
keys are its option set in :mod:`task.methods` (``settings.options``).  :func:`parse_settings` is called with the
same code on both sides: every bad value fails at start-up naming the key and what is allowed, and so does a
combination of values that would make the method's defining step impossible (:class:`~task.options.ConfigConflict`).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import dataclass, field
from difflib import get_close_matches
from typing import Any

from task.attacks import AttackOptions, attack_conflicts
from task.data import DataSettings, dataset_info
from task.methods import METHODS, OPTION_SETS, method_spec
from task.models import IMAGE_ONLY, MODELS, SIGNAL_ONLY
from task.options import ConfigConflict, OptionSet, declared_in, option, part
from task.privacy import MODES as DP_MODES
from task.privacy import SAMPLINGS as DP_SAMPLINGS
from task.privacy import privacy_conflicts
from task.robust import RobustOptions, robust_conflicts


@dataclass(frozen=True)
class Settings(OptionSet):
    """The settings of a run: each field is a run-config key declared here, or a part declared where it is read
    (the data in task/data, the aggregation rule in task/robust.py, the attack in task/attacks.py), and
    ``options``, the method's own (task/methods).  :func:`parse_settings` builds it."""

    method: str = option("method", "fedavg", "the method (see task/methods)", choices=tuple(METHODS))
    data: DataSettings = part(DataSettings)
    #: as declared ('auto' or a name) in the run config; :func:`parse_settings` resolves it to the network's name
    model: str = option(
        "model", "auto", "the network ('auto': cnn for images, cnn1d for mnist1d, gpt2 for dialects, softmax else)"
    )
    num_rounds: int = option("num-server-rounds", 10, "rounds", minimum=1)
    fraction_train: float = option(
        "fraction-train", 1.0, "share of connected nodes trained per round", minimum=1e-9, maximum=1.0
    )
    min_nodes: int = option("min-nodes", 2, "nodes to wait for before a round starts", minimum=1)
    local_epochs: int = option("local-epochs", 1, "local epochs per round", minimum=0)
    batch_size: int = option("batch-size", 20, "mini-batch size", minimum=1)
    lr: float = option("lr", 0.05, "learning rate", minimum=0.0)
    momentum: float = option("momentum", 0.9, "SGD momentum", minimum=0.0, maximum=1.0)
    weight_decay: float = option("weight-decay", 0.0, "weight decay", minimum=0.0)
    seed: int = declared_in(DataSettings, "seed")
    device: str = option("device", "auto", "auto (CUDA if available), cpu, cuda or cuda:N")
    round_timeout: float = option("round-timeout", 3600.0, "seconds to wait for a phase's replies", minimum=1.0)
    results_dir: str = option("results-dir", "results", "where the run's folder goes")
    node_wait_timeout: float = option(
        "node-wait-timeout",
        600.0,
        "seconds to wait for min-nodes nodes before the run gives up (0: no limit)",
        minimum=0.0,
    )
    eval_every: int = option("eval-every", 1, "evaluate every k rounds (and always in the last)", minimum=1)
    fraction_evaluate: float = option(
        "fraction-evaluate", 1.0, "share of connected nodes evaluated", minimum=1e-9, maximum=1.0
    )
    optimizer: str = option("optimizer", "sgd", "local optimizer (a fresh one every round)", choices=("sgd", "adam"))
    client_threads: int = option("client-threads", 1, "torch threads per client (0: torch's default)", minimum=0)
    fault: str = option("fault", "", "fault injection for tests, e.g. nan@1,shape@2,crash@3 (empty: off)")
    save_models: bool = option(
        "save-models", True, "save each client's personalized model (on its node) and the server's models at the end"
    )
    save_every: int = option("save-every", 0, "also save the models every k rounds (0: only at the end)", minimum=0)
    save_history: bool = option(
        "save-history",
        False,
        "keep the server's models of every round it saves under models/server/round-<k>/, beside the latest (an "
        "audit of the models over the rounds, benchmarks/privacy_audit.py)",
    )
    save_best: bool = option(
        "save-best", False, "a client keeps only its best personalized model (by its test accuracy: optimistic)"
    )
    checkpoint_every: int = option("checkpoint-every", 1, "checkpoint the server every k rounds (0: never)", minimum=0)
    resume_from: str = option("resume-from", "", "results folder of an interrupted run to continue (empty: a new run)")
    stop_after: int = option(
        "stop-after",
        0,
        "testing resume: the ServerApp stops as if it crashed after this round's checkpoint (0: off)",
        minimum=0,
    )
    evaluate_split: str = option(
        "evaluate-split",
        "test",
        "what clients score models on: 'test', or 'validation' for selecting settings (the test split is then "
        "dropped on every client, unseen by any method)",
        choices=("test", "validation"),
    )
    holdout_clients: int = option(
        "holdout-clients",
        0,
        "clients held out of training (the largest partition ids): after the last round each scores what the method "
        "gives a newcomer, before and after local-epochs of fine-tuning on its own data (newcomer-acc, "
        "newcomer-finetuned-acc)",
        minimum=0,
    )
    min_coverage: float = option(
        "min-coverage",
        0.5,
        "the least share of the clients asked that a mean over clients in the run's summary may speak for (the final "
        "evaluation, the last round's training, the newcomers): below it the run ends as failed (aborted), and the "
        "summary says over how many of how many clients each mean is",
        minimum=0.0,
        maximum=1.0,
    )
    # client-level differential privacy (docs/privacy.md: which method supports which mode)
    dp_mode: str = option(
        "dp-mode", "off", "differential privacy: off, central (noise on the server's mean) or local", choices=DP_MODES
    )
    dp_clip: float = option(
        "dp-clip", 1.0, "DP: L2 bound on each client's update (0: no clipping, only without noise)", minimum=0.0
    )
    dp_noise_multiplier: float = option(
        "dp-noise-multiplier", 1.0, "DP: noise std over the clip bound (central: on the sum)", minimum=0.0
    )
    dp_delta: float = option("dp-delta", 1e-5, "DP: the delta epsilon is reported at", minimum=0.0, maximum=1.0)
    dp_sampling: str = option(
        "dp-sampling",
        "poisson",
        "central DP with fraction-train < 1: poisson (each client in a round with probability fraction-train) or "
        "fixed (a cohort of fixed size, accounted against the coalition of the other clients, who know who was drawn)",
        choices=DP_SAMPLINGS,
    )
    dp_target_epsilon: float = option(
        "dp-target-epsilon",
        0.0,
        "DP: calibrate the noise multiplier before round 1 so that epsilon after num-server-rounds is this (replaces "
        "dp-noise-multiplier; 0: off)",
        minimum=0.0,
    )
    dp_max_epsilon: float = option(
        "dp-max-epsilon",
        0.0,
        "DP: stop cleanly before a round that would take epsilon above this (0: no limit)",
        minimum=0.0,
    )
    dp_adaptive_clip: bool = option(
        "dp-adaptive-clip",
        False,
        "central DP: adapt the clip bound each round toward a quantile of the update norms (Andrew et al.), starting "
        "at dp-clip and never above it",
    )
    dp_clip_quantile: float = option(
        "dp-clip-quantile", 0.5, "adaptive clipping: the share of updates to leave unclipped", minimum=0.0, maximum=1.0
    )
    dp_clip_lr: float = option("dp-clip-lr", 0.2, "adaptive clipping: the clip bound's learning rate", minimum=0.0)
    dp_clip_count_stddev: float = option(
        "dp-clip-count-stddev",
        0.0,
        "adaptive clipping: noise std on the count of unclipped updates (0: the cohort size / 20, Andrew et al.)",
        minimum=0.0,
    )
    record_messages: bool = option(
        "record-messages",
        False,
        "audit: record every message's records (keys, shapes, dtypes, metric names, list lengths; no values) as JSON "
        "lines: the server's in its results folder, each client's in its own state folder (docs/privacy.md)",
    )
    # watching runs (README: "Watching runs"): written by the ServerApp from the rounds in rounds.json
    tensorboard: bool = option(
        "tensorboard",
        True,
        "write TensorBoard event files into the run's folder, round by round (`tensorboard --logdir results`)",
    )
    mlflow: bool = option(
        "mlflow", False, "also log every round to MLflow (on the ServerApp's machine: pip install -e '.[mlflow]')"
    )
    mlflow_tracking_uri: str = option(
        "mlflow-tracking-uri", "", "MLflow's tracking store (empty: sqlite:///<results-dir>/mlflow.db)"
    )
    mlflow_experiment: str = option("mlflow-experiment", "pflower", "the MLflow experiment runs are logged to")
    #: the aggregation rule (task/robust.py) and the injected attack (task/attacks.py)
    robust: RobustOptions = part(RobustOptions)
    attacks: AttackOptions = part(AttackOptions)
    #: the method's own option set (task.methods), parsed from the same run config
    options: OptionSet = field(default_factory=OptionSet, compare=False)
    raw: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False)

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


def _model_name(model: str, data: Mapping[str, Any]) -> str:
    """The network run-config ``model`` names for the data settings ``data`` (:meth:`OptionSet.read`'s values)."""
    dataset, pretrained = data["dataset"], data["lm_pretrained"]
    if model == "auto":
        info = dataset_info(dataset)
        model = info.auto_model or ("cnn" if info.image_size > 0 else "softmax")
    if pretrained and model == "gpt2":
        model = f"gpt2:{pretrained}"  # the model starts from the local pretrained folder
    if model not in MODELS and not model.startswith("gpt2:"):
        raise ValueError(f"unknown model {model!r} (run-config key 'model'); allowed: {sorted(MODELS)} or 'auto'")
    if dataset_info(dataset).image_size == 0 and model in IMAGE_ONLY:
        raise ValueError(
            f"model {model!r} needs image inputs but dataset {dataset!r} gives vectors; use 'softmax', 'mlp' "
            "or 'cnn1d' (run-config key 'model')"
        )
    if dataset_info(dataset).image_size > 0 and model in SIGNAL_ONLY:
        raise ValueError(
            f"model {model!r} reads vectors as a signal but dataset {dataset!r} gives images; use 'cnn' or "
            "another image model (run-config key 'model')"
        )
    return model


def data_conflicts(settings: Settings) -> list[str]:
    """Data settings that every client would fail on, found before round 1."""
    data = settings.data
    info = dataset_info(data.dataset)
    out = []
    if data.partition == "pathological" and data.classes_per_client > info.num_classes:
        out.append(
            f"classes-per-client={data.classes_per_client} exceeds the {info.num_classes} classes of dataset "
            f"{data.dataset!r} (partition 'pathological'); use at most {info.num_classes}"
        )
    if (
        data.partition.startswith("planted-clusters")
        and data.dataset != "dialects"
        and data.num_clusters > info.num_classes
    ):
        out.append(
            f"num-clusters={data.num_clusters} exceeds the {info.num_classes} labels of dataset {data.dataset!r}: "
            f"every planted group needs its own labels (partition {data.partition!r})"
        )
    if settings.evaluate_split == "validation" and data.val_fraction == 0:
        out.append(
            "evaluate-split='validation' scores on the validation split, but val-fraction=0 leaves it empty; "
            "use val-fraction > 0 (e.g. 0.2)"
        )
    if data.dataset == "dialects":  # every client has dialect-sequences lines, split by the fractions
        lines = data.dialect_sequences
        held = {"test": round(data.test_fraction * lines), "validation": round(data.val_fraction * lines)}
        key = "test-fraction" if settings.evaluate_split == "test" else "val-fraction"
        if held[settings.evaluate_split] == 0:
            out.append(
                f"{key}={data.test_fraction if key == 'test-fraction' else data.val_fraction:g} of "
                f"dialect-sequences={lines} lines holds out no line of a client to score it on; raise {key} or "
                "dialect-sequences"
            )
        elif lines - held["test"] - held["validation"] < 1:
            out.append(
                f"test-fraction and val-fraction leave no line of dialect-sequences={lines} to train on; lower them "
                "or raise dialect-sequences"
            )
    if data.data_copies > 1 and info.image_size == 0:
        more = " (MNIST-1D makes as many samples as asked: mnist1d-samples)" if data.dataset == "mnist1d" else ""
        out.append(
            f"data-copies={data.data_copies} makes shifted copies of images, but dataset {data.dataset!r} has "
            f"vectors; use data-copies=1{more}"
        )
    if data.feature_shift and info.image_size == 0:
        out.append(
            f"feature-shift={data.feature_shift} transforms images, but dataset {data.dataset!r} has vectors; "
            "use feature-shift=0"
        )
    return out


def client_conflicts(settings: Settings, clients: int) -> list[str]:
    """What a run of ``clients`` clients, each a partition of the run's data set (the simulated SuperNodes of a
    simulation), cannot do, found before round 1 by the ServerApp in simulation and by ``python -m server_app.job``:
    held-out clients that leave none to train, and a client left without a training example or an example to be
    scored on (:func:`task.data.capacity.capacity_problem`, where this process can read the data set's labels)."""
    from task.data.capacity import capacity_problem, knowable

    out = []
    if settings.holdout_clients >= clients:
        out.append(
            f"holdout-clients={settings.holdout_clients} holds out every one of the {clients} clients: none would "
            f"train; use holdout-clients < {clients} or more clients"
        )
    if knowable(settings.data) and (problem := capacity_problem(settings.data, clients, settings.evaluate_split)):
        out.append(problem)
    return out


def check_clients(settings: Settings, clients: int) -> None:
    """:func:`client_conflicts` as one :class:`ConfigConflict` (nothing when there is none)."""
    if problems := client_conflicts(settings, clients):
        raise ConfigConflict("; ".join(problems))


@functools.cache
def run_config_keys() -> frozenset[str]:
    """Every key a run config may hold: the keys of every run and those of every method's options (the keys
    pyproject.toml declares, so that Flower passes each run all of them).  Fixed at import: computed once."""
    sets: tuple[type[OptionSet], ...] = (Settings, *OPTION_SETS)
    return frozenset(key for cls in sets for key in cls.declared())


def _check_known_keys(cfg: Mapping[str, Any]) -> None:
    """Flower refuses a key pyproject.toml does not declare before the run starts; a script or test that builds
    settings itself gets the same refusal here, instead of a misspelt key passing silently as its default."""
    known = run_config_keys()
    unknown = sorted(set(cfg) - known)
    if unknown:
        hints = [
            f"{k!r} (did you mean {close[0]!r}?)" if (close := get_close_matches(k, known, 1)) else repr(k)
            for k in unknown
        ]
        raise ConfigConflict(
            f"unknown run-config key(s): {', '.join(hints)}; `python -m task.config` lists every key with its default"
        )


def parse_settings(cfg: Mapping[str, Any]) -> Settings:
    """Validate the run config; every error names the key(s) and what is allowed."""
    _check_known_keys(cfg)
    run = Settings.read(cfg)  # every run's keys, each checked on its own
    spec = method_spec(run["method"])
    options = spec.options.parse(cfg, spec.fixed)
    model = _model_name(run["model"], run["data"])
    settings = Settings.build({**run, "model": model, "options": options, "raw": dict(cfg)})  # the data's checks
    problems = data_conflicts(settings) + options.conflicts(settings)
    problems += spec.conflicts(settings) if spec.conflicts else []
    problems += robust_conflicts(settings.method, settings.robust, settings)
    problems += attack_conflicts(settings.attacks, settings.method, settings)
    problems += privacy_conflicts(settings.method, settings, spec.privacy)
    if problems:
        raise ConfigConflict("; ".join(problems))
    return settings


def describe_options() -> str:
    """Every run-config key: who reads it, its default, what is allowed, one line of help (Markdown table)."""
    from task.methods import METHODS

    owners: dict[type[OptionSet], list[str]] = {Settings: ["every run"]}
    for name, spec in METHODS.items():
        owners.setdefault(spec.options, []).append(name)
    rows, seen = ["| key | default | allowed | used by | help |", "|---|---|---|---|---|"], set()
    for cls in owners:
        for key, opt in cls.declared().items():
            if key in seen:
                continue
            seen.add(key)
            users = ", ".join(m for c, ms in owners.items() if key in c.declared() for m in ms)
            rows.append(f"| `{key}` | `{opt.default!r}` | {opt.allowed()} | {users} | {opt.help} |")
    return "\n".join(rows)


if __name__ == "__main__":  # python -m task.config: the table of every run-config key
    print(describe_options())

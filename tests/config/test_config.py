"""Bad input gets a clear error naming the key and the allowed values."""

import re

import pytest

from task.config import parse_settings
from task.data import DataSettings, load_client_data
from task.methods.pifl import PIFLOptions
from task.options import ConfigConflict


def test_defaults_parse():
    s = parse_settings({})
    assert s.method == "fedavg" and s.model == "cnn" and s.data.dataset == "digits"


@pytest.mark.parametrize(
    "cfg,pattern",
    [
        ({"method": "fedfoo"}, r"run-config key 'method' must be one of \[.*'fedavg'.*\], got 'fedfoo'"),
        ({"dataset": "imagenet"}, r"run-config key 'dataset' must be one of \[.*'digits'.*\], got 'imagenet'"),
        ({"partition": "zipf"}, r"run-config key 'partition' must be one of \[.*'dirichlet'.*\], got 'zipf'"),
        ({"model": "vgg"}, r"unknown model 'vgg' \(run-config key 'model'\); allowed"),
        ({"alpha": 0.0}, r"'alpha' must be a number >= 1e-09, got 0.0"),
        ({"alpha": -1.0}, r"'alpha' must be a number >= 1e-09"),
        ({"partition": "quantity-dirichlet", "size-sigma": -1.0}, r"'size-sigma' must be a number >= 0, got -1.0"),
        ({"partition": "two-source", "mixture": "1:2"}, r"'mixture' must be one of \['10:90'"),
        ({"fraction-train": 0.0}, r"'fraction-train' must be a number in \[1e-09, 1\]"),
        ({"num-server-rounds": 0}, r"'num-server-rounds' must be an integer >= 1"),
        ({"local-epochs": 1.5}, r"'local-epochs' must be an integer"),
        ({"lr": "fast"}, r"'lr' must be a number"),
        ({"fraction-evaluate": 1.5}, r"'fraction-evaluate' must be a number in \[1e-09, 1\]"),
        ({"eval-every": 0}, r"'eval-every' must be an integer >= 1"),
        ({"data-copies": 0}, r"'data-copies' must be an integer >= 1"),
        ({"method": "fedcac", "tau": 1.5}, r"'tau' must be a number in \[0, 1\], got 1.5 \(share of each tensor"),
        ({"method": "fedc2i", "c2i-peers": 1}, r"c2i-peers=1 sends a client only its own model"),
        ({"method": "pfedlia", "warmup-rounds": 20}, r"warmup-rounds=20 is not shorter than num-server-rounds=10"),
        (
            {"method": "oracle", "partition": "planted-clusters", "warmup-rounds": 10},
            r"warmup-rounds=10 is not shorter than num-server-rounds=10",
        ),
        (
            {"method": "oracle"},
            (
                r"method 'oracle' clusters the clients by their planted groups, which only partition "
                r"'planted-clusters' or 'planted-clusters-noisy' has \(got partition='dirichlet'\); set --run-config "
                r"\"method='oracle' partition='planted-clusters'\""
            ),
        ),
        ({"method": "oracle", "partition": "two-source"}, r"planted groups.*\(got partition='two-source'\)"),
        (
            {"method": "pifl", "dataset": "dialects", "partition": "planted-clusters"},
            r"PI-FL's profiler scores every update on a server-side sample of the data set, and dataset 'dialects'",
        ),
        (
            {"method": "pifl-ni", "dataset": "dialects", "partition": "planted-clusters"},
            r"dataset 'dialects' has none",
        ),
        (
            {"method": "client2vec", "dataset": "dialects", "partition": "planted-clusters"},
            r"Client2Vec's client index .* dataset 'dialects' labels every token",
        ),
        (
            {"method": "client2vec", "dataset": "synth-concept"},
            (
                r"c2v-encoder='open-clip' encodes images, but dataset 'synth-concept' has vectors; use "
                r"c2v-encoder='synthetic'"
            ),
        ),
        ({"method": "cfl", "cfl-min-rounds": 11}, r"cfl-min-rounds=11 is after the last round"),
        ({"method": "pifl", "tiers": 3}, r"tiers=3 is more than min-nodes=2"),
        (
            {"method": "fedbn", "model": "mlp"},
            (
                r"model 'mlp' \(run-config key 'model'\) has none.*"
                r"use one that has: \['cnn', 'resnet8', 'resnet10', 'resnet18'\]"
            ),
        ),
        ({"partition": "pathological", "classes-per-client": 11}, r"classes-per-client=11 exceeds the 10 classes"),
        ({"partition": "planted-clusters", "num-clusters": 12}, r"num-clusters=12 exceeds the 10 labels"),
        ({"dataset": "synth-concept", "feature-shift": 2}, r"feature-shift=2 transforms images"),
        (
            {"test-fraction": 0.5, "val-fraction": 0.4},
            r"test-fraction \+ val-fraction must leave at least 10% for training",
        ),
    ],
)
def test_bad_run_config(cfg, pattern):
    with pytest.raises(ValueError, match=pattern):
        parse_settings(cfg)


@pytest.mark.parametrize(
    "cfg",
    [
        {"method": "oracle", "partition": "planted-clusters"},
        {"method": "oracle", "partition": "planted-clusters-noisy"},
        {"method": "oracle", "dataset": "dialects", "partition": "planted-clusters", "num-clusters": 3},
        {"method": "pifl", "dataset": "synth-concept", "partition": "two-source"},
        {"method": "pifl", "partition": "dirichlet"},  # PI-FL needs no two-source data: it only reports the shares
        {"method": "pifl", "slots-performance": 1, "slots-random": 1},
        {"method": "client2vec", "dataset": "synth-concept", "c2v-encoder": "synthetic"},
        {
            "method": "client2vec",
            "dataset": "dialects",
            "partition": "planted-clusters",
            "c2v-sampling": False,
            "c2v-aggregation": False,
            "c2v-local": False,
        },
        {"method": "fedc2i", "feature-shift": 0},  # no method needs feature-shift domains
    ],
)
def test_the_data_a_method_needs_is_accepted(cfg):
    assert parse_settings(cfg).method == cfg["method"]


def test_more_clients_than_samples():
    with pytest.raises(ValueError, match=r"num-partitions=1000 is too many for dataset 'digits' with 1797 samples"):
        load_client_data(DataSettings(partition="iid"), 0, 1000)


def test_partition_id_out_of_range():
    with pytest.raises(ValueError, match="partition-id 5 out of range"):
        load_client_data(DataSettings(partition="iid"), 5, 5)


def test_missing_local_copy():
    with pytest.raises(ValueError, match="data-dir '/nonexistent/mnist' does not exist"):
        load_client_data(DataSettings(dataset="mnist", partition="iid", data_dir="/nonexistent/mnist"), 0, 2)


def test_pifl_ni_runs_with_the_defaults_flower_passes():
    # Flower's run config holds every pyproject key, pifl-incentive = true among them; PI-FL(NI) fixes it to
    # false (a bool fixed to its other value cannot conflict: true is the default, i.e. "not set")
    from task.config import Settings
    from task.methods import method_spec

    defaults = {k: o.default for k, o in Settings.declared().items()}
    defaults.update({k: o.default for k, o in method_spec("pifl-ni").options.declared().items()})
    settings = parse_settings(
        {**defaults, "method": "pifl-ni", "slots-performance": 1, "slots-random": 0, "min-nodes": 4}
    )
    assert isinstance(settings.options, PIFLOptions) and settings.options.incentive is False


def test_a_method_spec_can_refuse_settings_without_an_options_class_of_its_own(monkeypatch):
    from dataclasses import replace

    from task import methods
    from task.models import model_info
    from task.options import ConfigConflict

    def needs_normalisation(settings):
        info = model_info(settings.model, settings.in_channels, settings.image_size, settings.num_classes)
        return [] if info.norm_keys else [f"model {settings.model!r} has no normalisation layer"]

    monkeypatch.setitem(methods.METHODS, "fedavg", replace(methods.METHODS["fedavg"], conflicts=needs_normalisation))
    assert parse_settings({"method": "fedavg", "model": "cnn"}).model == "cnn"
    with pytest.raises(ConfigConflict, match="model 'mlp' has no normalisation layer"):
        parse_settings({"method": "fedavg", "model": "mlp"})


ORACLE_NEEDS = (
    "method 'oracle' clusters the clients by their planted groups, which only partition 'planted-clusters' or "
    "'planted-clusters-noisy' has (got partition={got!r}); set --run-config \"method='oracle' "
    "partition='planted-clusters'\" (num-clusters sets the groups), or use method 'pfedlia' to find clusters in any "
    "data"
)


@pytest.mark.parametrize(
    "cfg,message",
    [
        ({"method": "oracle"}, ORACLE_NEEDS.format(got="dirichlet")),
        ({"method": "oracle", "partition": "iid"}, ORACLE_NEEDS.format(got="iid")),
        (
            {"method": "pifl", "dataset": "dialects", "partition": "planted-clusters"},
            (
                "PI-FL's profiler scores every update on a server-side sample of the data set, and dataset 'dialects' "
                "has none (each client generates its own text); use an image data set or 'synth-concept'"
            ),
        ),
        (
            {"method": "pifl", "slots-performance": 0, "slots-random": 0},
            "slots-performance + slots-random must be >= 1: a tier with no slot never trains",
        ),
        (
            {"method": "client2vec", "dataset": "dialects", "partition": "planted-clusters"},
            (
                "Client2Vec's client index pairs every training sample with the prompt of its one class label, and "
                "dataset 'dialects' labels every token (next-word prediction); use an image data set, or "
                "c2v-sampling=false c2v-aggregation=false c2v-local=false for the plain base algorithm"
            ),
        ),
        (
            {"method": "client2vec", "dataset": "synth-concept"},
            (
                "c2v-encoder='open-clip' encodes images, but dataset 'synth-concept' has vectors; use "
                "c2v-encoder='synthetic' (a fixed random projection) or an image data set"
            ),
        ),
    ],
)
def test_a_method_on_data_it_cannot_use_says_exactly_what_it_needs(cfg, message):
    with pytest.raises(ValueError, match=re.escape(message)) as err:
        parse_settings(cfg)
    assert str(err.value) == message


def test_every_impossible_setting_of_a_run_is_named_at_once():
    cfg = {"method": "pifl", "dataset": "dialects", "partition": "planted-clusters", "tiers": 3}
    with pytest.raises(ValueError, match=r"^slots-performance \+ slots-random must be >= 1") as err:
        parse_settings({**cfg, "slots-random": 0, "slots-performance": 0})
    said = str(err.value)
    assert said.startswith("slots-performance + slots-random must be >= 1")
    assert "; tiers=3 is more than min-nodes=2" in said and "; PI-FL's profiler scores every update" in said


def test_a_key_no_run_config_has_is_refused_with_the_nearest_key_and_where_to_find_them_all():
    """Flower refuses an undeclared key before a run starts; settings built by a script or a test refuse it too,
    instead of running the option's default under a misspelt name."""
    with pytest.raises(ConfigConflict) as err:
        parse_settings({"method": "pifl", "tier": 3, "zzz": 1})
    assert str(err.value) == (
        "unknown run-config key(s): 'tier' (did you mean 'tiers'?), 'zzz'; `python -m task.config` lists every key "
        "with its default"
    )

"""What FedBN's server must do (docs/methods/fedbn.md): average every layer but the normalisation layers by
training examples, never send or accept a normalisation layer, hold no global model, and learn which layers
those are from the model registry (a model without any is refused at start-up, naming the key)."""

import numpy as np
import pytest
from flwr.app import MetricRecord, RecordDict

from server_app.app import build_strategy
from strategies.base import Reply
from task.config import parse_settings
from task.models import build_model, norm_keys
from task.options import ConfigConflict
from task.params import record_to_numpy, to_record
from tests.strategy_harness import strategy

#: the default model's BatchNorm layers (conv.1 and conv.4 of the small CNN), every array of each
CNN_BN = [
    f"conv.{i}.{k}" for i in (1, 4) for k in ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
]


def test_every_batchnorm_array_stays_local_and_every_other_layer_is_shared():
    s = strategy("fedbn")  # the defaults a user gets: model cnn
    assert sorted(s.model_info.norm_keys) == sorted(CNN_BN)
    assert s.shared_keys() == [k for k in s.model_info.keys if k not in CNN_BN]
    assert {"conv.0.weight", "conv.3.weight", "fc.weight", "fc.bias", "head.weight", "head.bias"} == set(
        s.shared_keys()
    )
    assert sorted(s.payload(1, 1, "train")["arrays"].keys()) == sorted(s.shared_keys())
    assert sorted(s.payload(1, 1, "evaluate")["arrays"].keys()) == sorted(s.shared_keys())
    assert not s.has_global_model and s.server_models() == {}


def test_the_local_layers_are_the_models_own_normalisation_layers_for_a_resnet():
    s = strategy("fedbn", model="resnet8")
    model = build_model("resnet8", 1, 8, 10)
    assert (
        list(s.model_info.norm_keys) == norm_keys(model) and len(s.model_info.norm_keys) == 9 * 5
    )  # stem, 2 per block, 2 shortcuts
    assert set(s.shared_keys()) == set(model.state_dict()) - set(norm_keys(model))


def test_the_server_averages_every_shared_layer_by_training_examples():
    s = strategy("fedbn")
    rng = np.random.default_rng(0)
    states = [
        {k: rng.normal(size=s.model_info.shapes[k]).astype(np.float32) for k in s.shared_keys()} for _ in range(3)
    ]
    examples = [10, 30, 5]
    replies = [
        Reply(n, n, e, {"num-examples": e, "partition-id": n}, {"arrays": a})
        for n, (a, e) in enumerate(zip(states, examples, strict=True))
    ]
    s.aggregate(1, replies)
    assert sorted(s.global_state) == sorted(s.shared_keys())
    for k in s.shared_keys():
        expected = sum(e * a[k] for a, e in zip(states, examples, strict=True)) / sum(examples)
        np.testing.assert_allclose(s.global_state[k], expected, rtol=1e-5, atol=1e-6)
    sent = record_to_numpy(s.payload(1, 2, "train")["arrays"])
    assert all(np.array_equal(sent[k], s.global_state[k]) for k in s.shared_keys())


def test_a_reply_carrying_a_normalisation_layer_or_lacking_a_shared_one_is_rejected():
    s = strategy("fedbn")
    shared = {k: np.zeros(s.model_info.shapes[k], np.float32) for k in s.shared_keys()}
    bn = {k: np.zeros(s.model_info.shapes[k], np.float32) for k in CNN_BN if "num_batches" not in k}
    metrics = MetricRecord({"num-examples": 5, "partition-id": 0})

    def check(arrays):
        return s.gate.check(1, 7, RecordDict({"arrays": to_record(arrays), "metrics": metrics}), "train", set())

    assert check({**shared, **bn}) is None and "unexpected ['conv.1.bias'" in s.failures[-1]["reason"]
    assert check({k: v for k, v in shared.items() if k != "fc.bias"}) is None
    assert "missing ['fc.bias']" in s.failures[-1]["reason"]
    assert check(shared) is not None


@pytest.mark.parametrize("model", ["mlp", "softmax", "c2i-small", "lenet"])
def test_a_model_without_normalisation_layers_is_refused_naming_the_key_and_the_models_that_have_some(model):
    with pytest.raises(ConfigConflict) as err:
        parse_settings({"method": "fedbn", "model": model})
    assert str(err.value) == (
        f"method 'fedbn' keeps the normalisation layers (BatchNorm, GroupNorm, LayerNorm) on the clients, but model "
        f"{model!r} (run-config key 'model') has none, so FedBN would be plain FedAvg; use one that has: "
        "['cnn', 'resnet8', 'resnet10', 'resnet18']"
    )


def test_vector_data_is_pointed_at_the_vector_model_with_normalisation_layers():
    refusal = r"model 'softmax' .* has none, so FedBN would be plain FedAvg; use one that has: \['cnn1d'\]$"
    with pytest.raises(ConfigConflict, match=refusal):
        parse_settings({"method": "fedbn", "dataset": "synth-concept"})
    assert parse_settings({"method": "fedbn", "dataset": "mnist1d"}).model == "cnn1d"  # its default model has them


def test_the_next_word_task_is_pointed_at_the_causal_lm_whose_layer_norms_stay_local():
    text = {"method": "fedbn", "dataset": "dialects", "partition": "planted-clusters", "num-clusters": 3}
    with pytest.raises(
        ConfigConflict, match=r"model 'mlp' \(run-config key 'model'\) has none.*use one that has: \['gpt2'\]$"
    ):
        parse_settings({**text, "model": "mlp"})
    s = build_strategy(parse_settings(text))  # model auto: gpt2
    assert list(s.model_info.norm_keys) and all(".ln_" in k for k in s.model_info.norm_keys)
    assert not any(".ln_" in k for k in s.shared_keys()) and "head.weight" in s.shared_keys()


def test_a_checkpoint_restores_the_average_and_leaves_out_what_follows_from_the_settings():
    s = strategy("fedbn")
    s.aggregate(
        1,
        [
            Reply(
                0,
                0,
                4,
                {"num-examples": 4, "partition-id": 0},
                {"arrays": {k: np.full(s.model_info.shapes[k], 2.0, np.float32) for k in s.shared_keys()}},
            )
        ],
    )
    state = s.checkpoint.state()
    assert state["method"] == {}  # nothing of its own: the layers follow from the model, the average is the base's
    resumed = strategy("fedbn")
    resumed.checkpoint.resume(state, 1)
    assert resumed.model_info.norm_keys == s.model_info.norm_keys
    assert all(np.array_equal(resumed.global_state[k], s.global_state[k]) for k in s.shared_keys())

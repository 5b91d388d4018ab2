"""A refused reply is refused with a reason that says exactly what was wrong (the reason lands in the run's
failures and its log): the missing record or metric by name, the array and how its dtype, shape or values are
off, and a method's own cross-field rule in its own words.  Every part of a reply is checked, whatever comes
before it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pytest
from flwr.app import Array, ArrayRecord, MetricRecord, RecordDict

from strategies.gate import parse_reply
from strategies.replies import Arrays, Dim, InvalidReply, Number, ReplySpec, Tensor
from task.params import to_record


def even_count(metrics: Mapping[str, Any], records: Mapping[str, Mapping[str, np.ndarray]]) -> str | None:
    """A cross-field rule: as many rows of ``w`` as the count says, and an even count."""
    rows = len(records["w"]["w"])
    if metrics["n"] % 2:
        return f"n must be even, got {metrics['n']}"
    return None if rows * 2 == metrics["n"] else f"n must be twice the rows of w ({rows}), got {metrics['n']}"


SPEC = ReplySpec(
    metrics={"n": Number(int, 0, 100), "opt": Number(float, 0.0, 1.0, required=False)},
    # the optional record comes first: its absence must not end the checks of the ones after it
    records={"maybe": Arrays({"a": Tensor((2,))}, required=False), "w": Arrays({"w": Tensor((Dim(1, 3), 2))})},
    rules=(even_count,),
    evaluation={"acc": Number(float, 0.0, 1.0)},
)


def reply(
    n: int | None = 4, w: Any = None, evaluation: dict | None = None, drop: tuple[str, ...] = (), **records: Any
) -> RecordDict:
    """A reply that matches SPEC, changed by the arguments (``w``: the array ``w``, or the whole record)."""
    if not isinstance(w, ArrayRecord):
        w = to_record({"w": np.ones((2, 2), np.float32) if w is None else w})
    content = RecordDict(
        {
            "metrics": MetricRecord({} if n is None else {"n": n}),
            "evaluation": MetricRecord({"acc": 0.5} if evaluation is None else evaluation),
            "w": w,
            **records,
        }
    )
    for name in drop:
        del content[name]
    return content


def reason(content: RecordDict) -> str:
    with pytest.raises(InvalidReply) as err:
        parse_reply(content, SPEC)
    return str(err.value)


def test_a_reply_as_declared_is_read_whole():
    metrics, records = parse_reply(reply(n=6, w=np.zeros((3, 2), np.float32)), SPEC)
    assert metrics == {"n": 6, "evaluation": {"acc": 0.5}}
    assert list(records) == ["w"] and records["w"]["w"].shape == (3, 2)


@pytest.mark.parametrize(
    "content, expected",
    [
        (reply(drop=("metrics",)), "reply has no 'metrics' MetricRecord"),
        (reply(n=None), "metric 'n' is missing"),
        (reply(evaluation={}), "evaluation metric 'acc' is missing"),
        (reply(drop=("evaluation",)), "reply has no 'evaluation' MetricRecord (the server asked for one)"),
        (reply(drop=("w",)), "reply has no 'w' ArrayRecord"),
        (reply(w=np.ones((4, 2), np.float32)), "record 'w': array 'w' has shape (4, 2), expected (1..3, 2)"),
        (reply(w=np.ones((0, 2), np.float32)), "record 'w': array 'w' has shape (0, 2), expected (1..3, 2)"),
        (reply(w=np.ones((2, 2), np.float64)), "record 'w': array 'w' has dtype float64, expected float32"),
        (reply(w=np.full((2, 2), np.nan, np.float32)), "record 'w': array 'w' has non-finite values (NaN/inf)"),
        (reply(n=3), "n must be even, got 3"),
        (reply(n=6), "n must be twice the rows of w (2), got 6"),
    ],
)
def test_the_reason_names_what_is_wrong(content, expected):
    assert reason(content) == expected


def test_a_record_with_other_keys_names_three_of_each():
    more = {k: np.ones((2, 2), np.float32) for k in ("p", "q", "r", "s", "w")}
    assert reason(reply(w=to_record(more))) == (
        "record 'w': keys differ from the expected ones (unexpected ['p', 'q', 'r'], missing [])"
    )
    spec = ReplySpec(records={"w": Arrays({k: Tensor((1,)) for k in "abcd"})})
    with pytest.raises(InvalidReply) as err:
        parse_reply(RecordDict({"w": to_record({"z": np.ones(1, np.float32)})}), spec)
    assert (
        str(err.value) == "record 'w': keys differ from the expected ones (unexpected ['z'], missing ['a', 'b', 'c'])"
    )


def test_an_array_that_cannot_be_read_is_named_with_the_error():
    broken = Array(dtype="float32", shape=(2, 2), stype="numpy.ndarray", data=b"not an array")
    try:
        broken.numpy()
    except Exception as err:  # what reading it raises  # noqa: BLE001
        raised = err
    else:
        raise AssertionError("the broken array was read")
    assert reason(reply(w=ArrayRecord({"w": broken}))) == (
        f"record 'w': array 'w' cannot be read ({type(raised).__name__})"
    )


def test_a_model_with_a_negative_running_variance_is_refused_naming_it():
    """A BatchNorm running variance below zero turns every model it is averaged into NaN for every client: a
    model's spec (``Arrays.like``) refuses it, and accepts zero."""
    model = {"bn.running_var": np.ones(3, np.float32), "bn.running_mean": np.zeros(3, np.float32)}
    spec = ReplySpec(records={"arrays": Arrays.like(model)})
    negative = {**model, "bn.running_var": np.array([1.0, -0.5, 0.0], np.float32)}
    with pytest.raises(InvalidReply) as err:
        parse_reply(RecordDict({"arrays": to_record(negative)}), spec)
    assert str(err.value) == (
        "record 'arrays': array 'bn.running_var' has negative values (min -0.5); a variance cannot be negative"
    )
    zero = {"bn.running_var": np.zeros(3, np.float32), "bn.running_mean": np.full(3, -2.0, np.float32)}
    assert parse_reply(RecordDict({"arrays": to_record(zero)}), spec)[1]["arrays"]["bn.running_mean"][0] == -2.0

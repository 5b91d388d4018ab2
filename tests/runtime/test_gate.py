"""The reply gate (strategies/gate.py): of the replies the exchange hands over (attributed to their nodes, the
silent ones named), only those that match their phase's spec and fit the node's identity get through; everything
else, silent nodes included, is recorded with its reason, and a phase in which every reply failed for the same
reason stops the run.  What the gate admitted, and only that, is counted and timed by the exchange.  Nodes are
ordered and drawn by the client id they reported, and the arrays Flower hands the strategy must be exactly its
shared model."""

from __future__ import annotations

import math
import random
from types import SimpleNamespace

import numpy as np
import pytest
from flwr.app import MetricRecord, RecordDict
from flwr.common.constant import SUPERLINK_NODE_ID

from strategies.exchange import MessageExchange, content_bytes
from strategies.gate import (
    ReplyGate,
    RunAborted,
    cohort_size,
    gist,
    parse_reply,
    problem,
    shared_model,
    short_reason,
)
from strategies.replies import BASE, EVALUATE, TRAIN, Arrays, Number, Numbers, Reply, Tensor
from task.params import to_record
from tests.strategy_harness import outgoing_messages

SPEC = TRAIN.with_records(arrays=Arrays({"w": Tensor((2,))}))


def content(client: int, n: int = 10, w=(1.0, 2.0), **metrics) -> RecordDict:
    return RecordDict(
        {
            "metrics": MetricRecord({"num-examples": n, "partition-id": client, **metrics}),
            "arrays": to_record({"w": np.array(w, np.float32)}),
        }
    )


def reply(src: int, body: RecordDict | None = None, error: str | None = None, to: str = "") -> SimpleNamespace:
    return SimpleNamespace(
        metadata=SimpleNamespace(src_node_id=src, reply_to_message_id=to),
        content=body,
        has_error=lambda: error is not None,
        error=SimpleNamespace(reason=error),
    )


def gate() -> ReplyGate:
    return ReplyGate(lambda phase, node: SPEC if phase == "train" else BASE)


def admit(g: ReplyGate, server_round: int, phase: str, replies: list, ex: MessageExchange | None = None) -> list[Reply]:
    """What ``g`` admits of ``replies`` as the exchange ``ex`` hands them over (each attributed to its node, the nodes
    it sent a message that never answered named), with the bytes and timing of the admitted ones accounted in ``ex``,
    as the strategy's ``receive`` does."""
    ex = ex or MessageExchange(60.0)
    admitted = g.admit(server_round, phase, ex.receive(server_round, phase, replies))
    ex.account(server_round, phase, admitted)
    return [r for _, r in admitted]


def test_valid_replies_come_out_ordered_by_client_with_only_what_the_spec_declares():
    g, ex = gate(), MessageExchange(60.0)
    extra = content(2, n=30, **{"train-loss": 0.5, "undeclared": 7.0})
    got = admit(g, 1, "train", [reply(40, extra), reply(11, content(0)), reply(7, content(1))], ex)
    assert [(r.node_id, r.client, r.num_examples) for r in got] == [(11, 0, 10), (7, 1, 10), (40, 2, 30)]
    assert got[2].metrics == {"num-examples": 30, "partition-id": 2, "train-loss": 0.5}
    np.testing.assert_array_equal(got[0].arrays["w"], [1.0, 2.0])
    assert g.failures == [] and g.client_of == {11: 0, 7: 1, 40: 2} and g.node_of == {0: 11, 1: 7, 2: 40}
    assert ex.comm[1]["train-bytes-up"] == content_bytes(extra) + 2 * content_bytes(content(0))


def test_a_reply_that_breaks_the_spec_is_recorded_and_binds_nothing():
    g, ex = gate(), MessageExchange(60.0)
    bad = content(3, w=(math.nan, 1.0))
    assert admit(g, 2, "train", [reply(9, bad), reply(8, content(4))], ex) != []
    (failure,) = g.failures
    assert failure["round"] == 2 and failure["node-id"] == 9 and failure["phase"] == "train"
    assert "non-finite" in failure["reason"] and "client" not in failure  # the node is not bound to anyone
    assert 9 not in g.client_of and 3 not in g.node_of
    assert ex.comm[2]["train-bytes-up"] == content_bytes(content(4))  # only admitted replies count


def test_a_node_keeps_its_client_id_and_a_client_id_keeps_its_node():
    g = gate()
    admit(g, 1, "train", [reply(5, content(0)), reply(6, content(1))])
    assert admit(g, 2, "train", [reply(5, content(1)), reply(7, content(0)), reply(6, content(1))])[0].node_id == 6
    reasons = {f["node-id"]: f["reason"] for f in g.failures}
    assert reasons == {
        5: "reports partition-id 1, but reported 0 before (a node cannot change it)",
        7: "partition-id 0 is already used by node 5 (each node needs its own)",
    }
    assert g.failures[0]["client"] == 0  # a known node's failure names its client
    assert [(f["round"], f["phase"]) for f in g.failures] == [(2, "train"), (2, "train")]
    assert g.client_of == {5: 0, 6: 1} and g.node_of == {0: 5, 1: 6}


def test_a_second_reply_of_the_same_node_in_a_phase_is_a_duplicate():
    g = gate()
    got = admit(g, 1, "train", [reply(5, content(0)), reply(5, content(0, n=99))])
    assert [r.num_examples for r in got] == [10]
    assert [(f["phase"], f["reason"]) for f in g.failures] == [("train", "duplicate reply from the same node")]
    assert admit(g, 2, "train", [reply(5, content(0))]) != []  # a new phase: the node may answer again


def test_error_replies_and_silent_nodes_are_recorded_under_their_own_node():
    g, ex = gate(), MessageExchange(120.0)
    with outgoing_messages():
        sent = ex.address(3, "train", "train", {7: RecordDict(), 8: RecordDict(), 9: RecordDict()})
    m7, m8, _ = (m.metadata.message_id for m in sent)
    replies = [  # the SuperLink's error for the lost node answers the second message, not the first
        reply(7, error="client raised ValueError", to=m7),
        reply(SUPERLINK_NODE_ID, error="Error: Node Unavailable", to=m8),
    ]
    assert admit(g, 3, "train", replies, ex) == []  # two reasons: no abort
    got = {f["node-id"]: f["reason"] for f in g.failures}
    assert got[8] == "error reply: Error: Node Unavailable" and got[7] == "error reply: client raised ValueError"
    assert got[9] == "no reply within 120 s (round-timeout)"
    assert {f["phase"] for f in g.failures} == {"train"}
    unlimited, no_limit = gate(), MessageExchange(0.0)  # no time limit of its own: the phase ended with the round's
    with outgoing_messages():
        no_limit.address(4, "evaluate", "evaluate", {5: RecordDict()})
    admit(unlimited, 4, "evaluate", [], no_limit)
    assert unlimited.failures[0]["reason"] == "no reply within the round's time limit (round-timeout)"


def test_a_phase_whose_every_reply_failed_for_one_reason_stops_the_run():
    g = gate()
    same = [reply(n, error=f"Traceback ...\nMessage: partition {n} of node {n * 1001} has no data") for n in (1, 2)]
    with pytest.raises(RunAborted, match=r"round 4: every train reply failed .*: partition 1 of node 1001 has no"):
        admit(g, 4, "train", same)
    different = [reply(1, error="no data"), reply(2, error="out of memory")]
    assert admit(g, 5, "train", different) == []  # different reasons: the next round may fare better
    assert admit(g, 6, "train", [reply(1, error="no data"), reply(2, content(0))]) != []
    assert admit(g, 7, "train", []) == []  # nobody answered at all: the silent nodes are recorded, no abort
    with pytest.raises(RunAborted, match="round 8: every evaluate reply failed"):  # earlier phases' reasons aside
        admit(g, 8, "evaluate", [reply(1, error="out of memory"), reply(2, error="out of memory")])


def test_a_replys_timing_comes_out_of_its_metrics_and_the_exchange_times_it():
    g, ex = gate(), MessageExchange(60.0)
    body = content(0)
    body["timing"] = MetricRecord({"handler-start": 1.0, "setup-done": 1.5, "handler-end": 3.0})
    ((arrival, got),) = g.admit(1, "train", ex.receive(1, "train", [reply(5, body, to="m1")]))
    assert "timing" not in got.metrics and got.timing == {"handler-start": 1.0, "setup-done": 1.5, "handler-end": 3.0}
    assert ex.account(1, "train", [(arrival, got)]) == {
        "messages": 1.0,
        "setup": 0.5,
        "work": 1.5,
        "fresh-processes": 0.0,
        "handler-sum": 2.0,
    }


def test_failure_reasons_are_compared_without_their_numbers_and_shown_in_one_line():
    assert gist("node 12345 at 0xdeadbeef1 failed") == gist("node 7 at 0xcafebabe2 failed")
    assert gist("no data") != gist("no memory")
    assert gist("process ABCDEF0123 lost") == gist("process FEDCBA9876 lost")  # upper-case hex ids too
    assert short_reason("Traceback (most recent call last):\n  ...\nMessage: the data set is missing'>") == (
        "the data set is missing"
    )
    assert short_reason("  first line\nsecond line") == "first line" and short_reason("") == ""
    nested = "Message: loading failed\nTraceback ...\nMessage: no GPU on node X'>"  # the client's own is the last
    assert short_reason(nested) == "no GPU on node X"
    assert short_reason("Message: a\nMessage: b\nMessage: c") == "c"


def identified(client_of: dict[int, int]) -> ReplyGate:
    """A gate that has admitted one reply from each node of ``client_of`` (node id -> client id)."""
    g = gate()
    admit(g, 1, "train", [reply(node, content(client)) for node, client in client_of.items()])
    return g


def test_nodes_are_ordered_by_client_id_and_the_unknown_ones_come_last_by_node_id():
    g = identified({40: 0, 7: 2, 11: 1})
    assert g.by_client([7, 99, 40, 3, 11]) == [40, 11, 7, 3, 99]
    assert g.unknown([7, 99, 40, 3]) == [99, 3]
    assert gate().unknown([5, 4]) == [5, 4] and gate().by_client([5, 4]) == [4, 5]


def test_a_seed_draws_the_same_clients_whatever_node_ids_they_have():
    clients = list(range(8))
    first = identified({100 + c: c for c in clients})
    second = identified({900 - 7 * c: c for c in clients})  # the same clients on other nodes, another node order
    for k in range(1, len(clients)):
        drawn = first.draw(random.Random(3), list(first.client_of), k)
        again = second.draw(random.Random(3), list(reversed(second.client_of)), k)
        assert [first.client_of[n] for n in drawn] == [second.client_of[n] for n in again]
        assert len(drawn) == k and drawn == first.by_client(drawn)  # k distinct nodes, in client-id order
    seeds = {tuple(first.draw(random.Random(seed), list(first.client_of), 3)) for seed in range(10)}
    assert len(seeds) > 1  # the draw does depend on the seed
    every = list(first.client_of)
    rng = random.Random(3)
    assert first.draw(rng, every, len(every)) == first.by_client(every) == first.draw(rng, every, len(every) + 1)
    assert rng.random() == random.Random(3).random()  # drawing everyone uses nothing of the generator


@pytest.mark.parametrize("available,fraction,size", [(10, 0.25, 2), (10, 0.26, 3), (10, 1.0, 10), (3, 0.01, 1)])
def test_a_cohort_is_the_rounded_fraction_of_the_available_nodes_at_least_one(available, fraction, size):
    assert cohort_size(available, fraction) == size
    assert cohort_size(available, 2.0) == available  # never more than there are


def test_the_arrays_flower_hands_the_strategy_must_be_exactly_its_finite_shared_model():
    model: dict[str, np.ndarray] = {
        "w": np.ones((2, 3), np.float32),
        "b": np.zeros(3, np.float32),
        "steps": np.array(4, np.int64),
    }
    shared = {"w": np.full((2, 3), 0.5, np.float32), "b": np.arange(3, dtype=np.float32)}
    got = shared_model(to_record(shared), model, ["w", "b"])
    assert got.keys() == shared.keys()
    for k, v in shared.items():
        np.testing.assert_array_equal(got[k], v)
        assert got[k].dtype == v.dtype
    assert shared_model(to_record({}), model, []) == {}
    wrong: list[dict[str, np.ndarray]] = [
        {**shared, "steps": model["steps"]},  # more than the shared keys
        {"w": shared["w"]},  # fewer
        {**shared, "w": shared["w"][:1]},  # another shape
        {**shared, "b": shared["b"].astype(np.float64)},  # another dtype
        {**shared, "b": np.array([0.0, math.inf, 1.0], np.float32)},  # not finite
    ]
    for arrays in wrong:
        with pytest.raises(ValueError, match="not this method's shared model"):
            shared_model(to_record(arrays), model, ["w", "b"])


def test_each_reply_is_checked_against_the_spec_of_its_own_node():
    arrays_from = {5}  # only node 5 is asked for arrays (a method may ask each node for something else)
    g = ReplyGate(lambda phase, node: SPEC if node in arrays_from else BASE)
    bare = RecordDict({"metrics": MetricRecord({"num-examples": 3, "partition-id": 1})})
    got = admit(g, 1, "train", [reply(5, content(0)), reply(6, bare), reply(7, content(2))])
    assert [(r.node_id, sorted(r.records)) for r in got] == [(5, ["arrays"]), (6, []), (7, [])]
    assert [r.node_id for r in admit(g, 2, "train", [reply(5, bare), reply(6, bare)])] == [6]
    assert [f["node-id"] for f in g.failures] == [5]  # node 5's reply lacks what its spec asks


def test_a_rejected_reply_is_logged_with_its_round_phase_node_and_reason(caplog):
    g = gate()
    with caplog.at_level("WARNING", logger="flwr.pflower"):
        admit(g, 3, "evaluate", [reply(12, error="disk full"), reply(13, content(0))])
    assert "round 3 evaluate: reply from node 12 rejected: error reply: disk full" in caplog.messages


@pytest.mark.parametrize("key", ["train-loss", "personal-loss", "global-loss"])
def test_an_honest_loss_of_a_far_off_model_passes_and_only_impossible_ones_are_refused(key):
    """A model noised for differential privacy at a small epsilon gives cross-entropies of 1e12 and more: those
    are measurements, so the gate must let them through (it once stopped such runs), while a loss no float32
    model can produce (beyond float32's largest value, infinite, NaN or negative) is refused."""
    spec = TRAIN if key == "train-loss" else EVALUATE
    extra = {} if key == "train-loss" else {"personal-acc": 0.1, "personal-loss": 1.0}

    def sent(loss: float) -> RecordDict:
        return RecordDict({"metrics": MetricRecord({"num-examples": 5, "partition-id": 0, **extra, key: loss})})

    largest = float(np.finfo(np.float32).max)
    for honest in (6.5e12, 1e30, largest):
        metrics, _ = parse_reply(sent(honest), spec)
        assert metrics[key] == honest
    for impossible in (float(np.nextafter(largest, math.inf)), math.inf, math.nan, -1e-3):
        with pytest.raises(ValueError, match=key):
            parse_reply(sent(impossible), spec)


def test_a_metric_out_of_its_range_is_refused_with_the_range_it_must_be_in():
    """A scalar or list metric outside its declared ``[minimum, maximum]`` is refused with both bounds and the
    value it had; the bounds themselves are allowed."""
    acc = Number(float, 0.0, 1.0)
    assert problem(acc, 0.0) is None and problem(acc, 1.0) is None
    assert problem(acc, 1.5) == "must be in [0, 1], got 1.5"
    assert problem(acc, -0.25) == "must be in [0, 1], got -0.25"
    tiers = Numbers(int, 0, 3, length=2)
    assert problem(tiers, [0, 3]) is None
    assert problem(tiers, [1, 4]) == "element 1 must be in [0, 3], got 4"


def test_a_list_metric_is_refused_with_what_was_wrong_with_it():
    """Each way a list metric can break its declaration is refused with its own reason, naming what it got."""
    exact = Numbers(float, 0.0, 1.0, length=3, distinct=True, total=1.0)
    assert problem(exact, [0.2, 0.3, 0.5]) is None
    assert problem(exact, 0.5) == "must be a list, got float"
    assert problem(exact, (0.2, 0.3, 0.5)) == "must be a list, got tuple"
    assert problem(exact, [0.5, 0.5]) == "must have 3 elements, got 2"
    assert problem(exact, [0.2, 0.2, 0.6]) == "must not repeat an element"
    assert problem(exact, [0.2, 0.3, 0.4]) == "must sum to 1, got 0.9"
    assert problem(exact, [-0.5, 0.5, 1.0]) == "element 0 must be in [0, 1], got -0.5"
    capped = Numbers(int, 0, 9, max_length=2)
    assert problem(capped, []) is None and problem(capped, [1, 2]) is None
    assert problem(capped, [1, 2, 3]) == "must have at most 2 elements, got 3"
    assert problem(capped, [1, 2.5]) == "element 1 must be an integer, got 2.5"
    assert problem(capped, [1, 10]) == "element 1 must be in [0, 9], got 10"


def test_a_list_that_must_sum_to_a_total_may_miss_it_by_float32_rounding_only():
    """Clients compute distributions in float32, so a sum within 1e-4 of the total (relative to totals above 1,
    bounds included) passes and anything further off is refused."""
    unit = Numbers(float, 0.0, 1.0, length=2, total=1.0)
    assert problem(unit, [0.5, 0.50005]) is None
    assert problem(unit, [0.5, 0.50015]) is not None  # 1.5e-4 off
    four = Numbers(float, 0.0, 4.0, length=2, total=4.0)
    assert problem(four, [2.0, 2.0002]) is None  # 2e-4 off, within 1e-4 of 4
    assert problem(four, [2.0, 2.0005]) is not None
    zero = Numbers(float, -1.0, 1.0, length=1, total=0.0)
    assert problem(zero, [1e-4]) is None  # exactly the tolerance
    assert problem(zero, [-1e-4]) is None


@pytest.mark.parametrize("kind", ["Number", "Numbers"])
def test_a_metric_declared_without_both_bounds_or_with_them_inverted_is_refused_when_declared(kind):
    """A reply spec's numbers are bounded on both sides (an unbounded metric is a door left open): a declaration
    missing either bound, or with the minimum above the maximum, is refused at once, naming the bounds it got."""

    def declare(low, high):
        return Number(float, low, high) if kind == "Number" else Numbers(float, low, high, length=2)

    declare(0.0, 0.0)  # a single allowed value is a range
    noun = "a Number needs" if kind == "Number" else "Numbers need"
    for low, high in [(None, 1.0), (0.0, None), (None, None), (1.0, 0.0)]:
        with pytest.raises(ValueError, match=rf"^{noun} bounds minimum <= maximum, got \[{low}, {high}\]$"):
            declare(low, high)


def test_a_list_metric_declared_without_a_length_is_refused():
    with pytest.raises(ValueError, match=r"^Numbers need a length or a max_length$"):
        Numbers(float, 0.0, 1.0)


def test_a_metric_that_is_not_a_number_is_refused_naming_the_kind_declared_and_the_type_sent():
    assert problem(Number(int, 0, 9), "3") == "must be an integer, got str"
    assert problem(Number(float, 0.0, 1.0), True) == "must be a number, got bool"
    assert problem(Numbers(int, 0, 9, length=1), [None]) == "element 0 must be an integer, got NoneType"
    assert problem(Numbers(float, 0.0, 1.0, length=1), [b"x"]) == "element 0 must be a number, got bytes"

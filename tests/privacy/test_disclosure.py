"""The check of a message recording against a method's declaration (strategies/disclosure_check.py) catches every way
a client could reveal more than declared: an extra array, an extra metric, an undeclared record (a peer's model),
a bigger or differently typed array, an undeclared message type; and the two sides' recordings must agree."""

import copy

import pytest

from server_app.app import build_strategy
from strategies.disclosure import sent
from strategies.disclosure_check import disagreements, mismatches
from strategies.replies import BASE, PER_CLIENT, PER_PEER, Arrays, Dim, Disclosure, Numbers, Part, ReplySpec, Tensor
from task.config import parse_settings
from tests.strategy_harness import strategy


def _fits(tensor: Tensor) -> list:
    return [[d.low if isinstance(d, Dim) else d for d in tensor.shape], tensor.dtype]


def line(parts, direction: str, kind: str, node: int = 7) -> dict:
    """A recorded line holding every record of ``parts``, as the declaration allows it (lists at their shortest)."""
    content: dict = {"arrays": {}, "metrics": {}, "configs": {}, "lengths": {}}
    for name, part in parts.items():
        if part.arrays is not None:
            content["arrays"][name] = {k: _fits(t) for k, t in part.arrays.tensors.items()}
        else:
            where = "configs" if name in ("config", "peer-clients", "tier", "ledger") else "metrics"
            content[where][name] = sorted(part.entries)
            if part.lengths:
                content["lengths"][name] = {k: n.low if isinstance(n, Dim) else n for k, n in part.lengths.items()}
    return {"direction": direction, "type": kind, "node": node, "round": 1, "content": content}


@pytest.fixture(scope="module")
def fedavg():
    return build_strategy(parse_settings({"method": "fedavg"})).disclosure()


def test_a_recording_that_holds_what_is_declared_matches(fedavg):
    train = fedavg["train"]
    assert mismatches(fedavg, [line(train.sends, "sent", "train"), line(train.receives, "received", "train")]) == []


def test_an_extra_array_in_a_reply_is_caught(fedavg):
    bad = line(fedavg["train"].sends, "pulled", "train")
    bad["content"]["arrays"]["arrays"]["secret"] = [[3], "float32"]
    assert any("undeclared arrays ['secret']" in p for p in mismatches(fedavg, [bad]))


def test_an_extra_metric_in_a_reply_is_caught(fedavg):
    bad = line(fedavg["evaluate"].sends, "sent", "evaluate")
    bad["content"]["metrics"]["metrics"].append("label-histogram")
    assert any("undeclared entries ['label-histogram']" in p for p in mismatches(fedavg, [bad]))


def test_a_peer_model_that_is_not_declared_is_caught(fedavg):
    bad = line(fedavg["train"].receives, "pushed", "train")
    bad["content"]["arrays"]["peers"] = copy.deepcopy(bad["content"]["arrays"]["arrays"])
    assert any("record 'peers' (arrays) is not declared" in p for p in mismatches(fedavg, [bad]))


def test_a_larger_or_retyped_array_is_caught(fedavg):
    bad = line(fedavg["train"].sends, "sent", "train")
    key = next(iter(bad["content"]["arrays"]["arrays"]))
    shape, _ = bad["content"]["arrays"]["arrays"][key]
    bad["content"]["arrays"]["arrays"][key] = [[2, *shape], "float64"]
    problems = mismatches(fedavg, [bad])
    assert any(f"array {key!r} has shape" in p for p in problems)
    assert any(f"array {key!r} has dtype float64" in p for p in problems)


def test_a_missing_required_record_or_entry_is_caught(fedavg):
    bad = line(fedavg["train"].sends, "sent", "train")
    del bad["content"]["arrays"]["arrays"]
    bad["content"]["metrics"]["metrics"].remove("num-examples")
    problems = mismatches(fedavg, [bad])
    assert any("required record 'arrays' is missing" in p for p in problems)
    assert any("lacks required entries ['num-examples']" in p for p in problems)


def test_an_undeclared_message_type_is_caught(fedavg):
    bad = line(fedavg["query.identify"].sends, "sent", "query.lazy")
    assert any("message type 'query.lazy' is not declared" in p for p in mismatches(fedavg, [bad]))


def test_a_metric_record_declared_as_arrays_is_caught():
    declared = {"query.x": Disclosure(sends={"vector": Part("a vector", arrays=Arrays({"v": Tensor((4,))}))})}
    bad = {"direction": "sent", "type": "query.x", "node": 1, "content": {"metrics": {"vector": ["v"]}}}
    assert any("record 'vector' is metrics, declared as arrays" in p for p in mismatches(declared, [bad]))


def test_a_variable_dimension_is_checked_against_its_bounds():
    declared = {"query.x": Disclosure(sends={"rows": Part("rows", arrays=Arrays({"D": Tensor((Dim(1, 8), 2))}))})}
    rec = {"direction": "sent", "type": "query.x", "node": 1}
    assert mismatches(declared, [{**rec, "content": {"arrays": {"rows": {"D": [[8, 2], "float32"]}}}}]) == []
    assert mismatches(declared, [{**rec, "content": {"arrays": {"rows": {"D": [[9, 2], "float32"]}}}}])


def test_a_part_declares_arrays_or_entries():
    with pytest.raises(ValueError, match=r"^a Part declares either arrays or entries, not neither$"):
        Part("nothing")
    with pytest.raises(ValueError, match=r"^a Part declares either arrays or entries, not both$"):
        Part("both", arrays=Arrays({"w": Tensor((1,))}), entries={})


def test_sent_lists_the_reply_spec_metrics_with_their_required_flags():
    parts = sent(BASE)
    assert parts["metrics"].entries == {k: rule.required for k, rule in BASE.metrics.items()}
    assert not parts["timing"].required and "evaluation" not in parts


def test_the_two_sides_must_agree(fedavg):
    pushed = line(fedavg["train"].receives, "pushed", "train")
    received = {**pushed, "direction": "received"}
    pulled = line(fedavg["train"].sends, "pulled", "train")
    replied = {**pulled, "direction": "sent"}
    assert disagreements([pushed, pulled], [received, replied]) == []
    more = copy.deepcopy(replied)
    more["content"]["arrays"]["extra"] = {"x": [[1], "float32"]}
    assert disagreements([pushed, pulled], [received, more])  # the client sent what the server did not record
    assert disagreements([pushed, pulled], [received])  # the server pulled what no client recorded sending
    assert disagreements([pushed, pulled], [received, {**replied, "node": 8}])


def test_options_that_change_the_messages_change_the_declaration():
    from server_app.disclosure import declarations

    plain, _ = declarations("fedcac")
    diagnosed, _ = declarations("fedcac", **{"fedcac-diagnostics": True})
    assert plain["train"].sends["metrics"].entries is not None
    assert "label-histogram" not in plain["train"].sends["metrics"].entries
    assert diagnosed["train"].sends["metrics"].entries == {
        **plain["train"].sends["metrics"].entries,
        "label-histogram": True,
    }
    bounded, _ = declarations("fedc2i", **{"c2i-peers": 2})
    peers = bounded["train"].receives["peers"].arrays
    assert peers is not None
    assert {t.shape[0] for t in peers.tensors.values()} == {Dim(1, 2)}  # at most k models in one message
    p2p, _ = declarations("pfedlia", **{"lia-mode": "p2p"})
    assert (
        p2p["query.lia"].sends["metrics"].entries is not None
        and "beneficial" in p2p["query.lia"].sends["metrics"].entries
    )
    no_local, _ = declarations("client2vec", **{"c2v-local": False})
    assert "c2v" not in no_local["train"].receives


def test_under_central_dp_a_train_reply_declares_no_integer_buffer():
    from server_app.disclosure import declarations

    declared, info = declarations("fedavg", **{"dp-mode": "central"})
    arrays = declared["train"].sends["arrays"].arrays
    assert arrays is not None
    counters = [k for k in info.keys if not info.dtypes[k].startswith("float")]
    assert counters and not set(counters) & set(arrays.tensors)  # num_batches_tracked stays on the client


def test_under_local_dp_fedc2i_declares_released_models_without_counters_and_peers_without_sizes():
    from server_app.disclosure import declarations

    plain, _ = declarations("fedc2i")
    declared, info = declarations("fedc2i", **{"dp-mode": "local"})
    arrays = declared["train"].sends["arrays"].arrays
    assert arrays is not None
    counters = [k for k in info.keys if not info.dtypes[k].startswith("float")]
    assert counters and not set(counters) & set(arrays.tensors)  # num_batches_tracked stays on the client
    assert plain["train"].receives["peer-clients"].entries == {"client-ids": True, "num-examples": True}
    assert declared["train"].receives["peer-clients"].entries == {"client-ids": True}


def test_an_array_missing_from_a_declared_record_is_caught(fedavg):
    bad = line(fedavg["train"].sends, "sent", "train")
    key = min(bad["content"]["arrays"]["arrays"])
    del bad["content"]["arrays"]["arrays"][key]
    assert any(f"lacks declared arrays ['{key}']" in p for p in mismatches(fedavg, [bad]))


def test_a_line_of_unknown_direction_is_reported(fedavg):
    bad = {**line(fedavg["train"].sends, "sent", "train"), "direction": "forwarded"}
    assert mismatches(fedavg, [bad]) == ["forwarded train (round 1, node 7): unknown direction 'forwarded'"]


def test_a_disagreement_says_which_side_recorded_what(fedavg):
    pushed = line(fedavg["train"].receives, "pushed", "train", node=3)
    assert disagreements([pushed], []) == [
        "the server recorded 1 x pushed train to/from node 3 that no client recorded"
    ]
    sent_line = line(fedavg["train"].sends, "sent", "train", node=4)
    assert disagreements([], [sent_line, sent_line]) == [
        "clients recorded 2 x sent train at node 4 that the server did not record"
    ]


# ----------------------------------------------------------------------------- what a failing check says, exactly
ONE = {"direction": "sent", "type": "query.x", "node": 5, "round": 2}
WHERE = "sent query.x (round 2, node 5)"


def _declared(**tensors: Tensor) -> dict[str, Disclosure]:
    return {"query.x": Disclosure(sends={"rows": Part("rows", arrays=Arrays(tensors))})}


def _arrays(**arrays) -> dict:
    return {**ONE, "content": {"arrays": {"rows": arrays}}}


def test_many_undeclared_or_missing_arrays_are_named_five_at_a_time():
    """The first five (sorted) are named, and '...' says there are more; exactly five get no '...'."""
    declared = _declared(**{f"d{i}": Tensor((2,)) for i in range(7)})
    extra = {f"e{i}": [[2], "float32"] for i in range(6)}
    assert mismatches(declared, [_arrays(**extra)]) == [
        f"{WHERE}: record 'rows' has undeclared arrays ['e0', 'e1', 'e2', 'e3', 'e4'] ...",
        f"{WHERE}: record 'rows' lacks declared arrays ['d0', 'd1', 'd2', 'd3', 'd4'] ...",
    ]
    five = {f"d{i}": [[2], "float32"] for i in range(2)} | {f"e{i}": [[2], "float32"] for i in range(5)}
    assert mismatches(declared, [_arrays(**five)]) == [
        f"{WHERE}: record 'rows' has undeclared arrays ['e0', 'e1', 'e2', 'e3', 'e4']",
        f"{WHERE}: record 'rows' lacks declared arrays ['d2', 'd3', 'd4', 'd5', 'd6']",
    ]


def test_a_wrong_shape_or_dtype_is_reported_with_what_was_declared():
    declared = _declared(w=Tensor((Dim(1, 8), 3)), b=Tensor((3,), "int64"))
    assert mismatches(declared, [_arrays(w=[[8, 3], "float32"], b=[[3], "int64"])]) == []
    assert mismatches(declared, [_arrays(w=[[1, 3], "float32"], b=[[3], "int64"])]) == []
    assert mismatches(declared, [_arrays(w=[[0, 3], "float32"], b=[[3], "float32"])]) == [
        f"{WHERE}: record 'rows': array 'b' has dtype float32, declared int64",
        f"{WHERE}: record 'rows': array 'w' has shape (0, 3), declared (1..8, 3)",
    ]
    assert mismatches(declared, [_arrays(w=[[9, 3], "float32"], b=[[3, 1], "int64"])]) == [
        f"{WHERE}: record 'rows': array 'b' has shape (3, 1), declared (3,)",
        f"{WHERE}: record 'rows': array 'w' has shape (9, 3), declared (1..8, 3)",
    ]
    # fewer dimensions than declared: a prefix that fits is not enough
    assert mismatches(declared, [_arrays(w=[[4], "float32"], b=[[], "int64"])]) == [
        f"{WHERE}: record 'rows': array 'b' has shape (), declared (3,)",
        f"{WHERE}: record 'rows': array 'w' has shape (4,), declared (1..8, 3)",
    ]


def test_records_and_entries_are_reported_by_name_kind_and_requirement():
    declared = {
        "query.x": Disclosure(
            sends={
                "rows": Part("rows", arrays=Arrays({"w": Tensor((2,))})),
                "metrics": Part("stats", entries={"a": True, "b": False}),
                "extra": Part("optional", entries={"c": True}, required=False),
            }
        )
    }
    fine = {"arrays": {"rows": {"w": [[2], "float32"]}}, "metrics": {"metrics": ["a"]}}
    assert mismatches(declared, [{**ONE, "content": fine}]) == []
    bad = {"arrays": {"metrics": {"w": [[2], "float32"]}}, "metrics": {"extra": ["d"]}, "configs": {"cfg": ["x"]}}
    assert mismatches(declared, [{**ONE, "content": bad}]) == [
        f"{WHERE}: record 'metrics' is arrays, declared as entries",
        f"{WHERE}: record 'extra' has undeclared entries ['d']",
        f"{WHERE}: record 'extra' lacks required entries ['c']",
        f"{WHERE}: record 'cfg' (configs) is not declared",
        f"{WHERE}: required record 'rows' is missing",
    ]
    assert mismatches(declared, [{**ONE, "type": "query.y", "content": fine}]) == [
        "sent query.y (round 2, node 5): message type 'query.y' is not declared"
    ]


def test_every_direction_is_checked_against_its_own_side():
    """What leaves a client (sent, pulled) is checked against ``sends``, what reaches it (received, pushed)
    against ``receives``."""
    declared = {
        "train": Disclosure(
            sends={"up": Part("up", entries={"u": True})}, receives={"down": Part("down", entries={"d": True})}
        )
    }
    up = {"metrics": {"up": ["u"]}}
    down = {"configs": {"down": ["d"]}}
    for direction, good, wrong in (("sent", up, down), ("pulled", up, down), ("received", down, up)):
        line_ = {"direction": direction, "type": "train", "node": 1, "round": 1}
        assert mismatches(declared, [{**line_, "content": good}]) == [], direction
        assert len(mismatches(declared, [{**line_, "content": wrong}])) == 2, direction
    pushed = {"direction": "pushed", "type": "train", "node": 1, "round": 1}
    assert mismatches(declared, [{**pushed, "content": down}]) == []


def test_the_two_sides_disagree_when_the_same_message_carried_other_content(fedavg):
    """Messages are matched by direction, type, node and what they carried: the same message type to the same
    node with other content is one disagreement each way, and a pull matches a send, not a receive."""
    pushed = line(fedavg["train"].receives, "pushed", "train", node=3)
    received = line(fedavg["train"].receives, "received", "train", node=3)
    assert disagreements([pushed], [received]) == []
    other = copy.deepcopy(received)
    other["content"]["configs"]["config"].append("extra")
    assert disagreements([pushed], [other]) == [
        "the server recorded 1 x pushed train to/from node 3 that no client recorded",
        "clients recorded 1 x received train at node 3 that the server did not record",
    ]
    pulled = {**pushed, "direction": "pulled"}
    assert disagreements([pulled], [received]) == [
        "the server recorded 1 x pulled train to/from node 3 that no client recorded",
        "clients recorded 1 x received train at node 3 that the server did not record",
    ]
    assert disagreements([pushed, pushed], [received]) == [
        "the server recorded 1 x pushed train to/from node 3 that no client recorded"
    ]


def test_an_array_record_is_described_by_the_models_key_sets_or_array_by_array():
    from strategies.disclosure import stacked
    from strategies.disclosure_check import describe_arrays
    from strategies.replies import PER_CLIENT
    from task.models import ModelInfo

    info = ModelInfo(
        shapes={"body.w": (2, 3), "head.w": (4, 2)},
        dtypes={"body.w": "float32", "head.w": "float32"},
        parameter_keys=("body.w", "head.w"),
        norm_keys=(),
        feature_dim=2,
    )
    whole = Arrays({k: Tensor(s) for k, s in info.shapes.items()})
    assert describe_arrays(whole, info, "models") == "the whole model"
    assert describe_arrays(Arrays({"head.w": Tensor((4, 2))}), info, "models") == "the head"
    assert describe_arrays(stacked(whole, PER_CLIENT), info, "models") == "one per client (N) x the whole model"
    assert describe_arrays(stacked(whole, 3), info, "models") == "3 x the whole model"
    mixed = Arrays({"body.w": Tensor((3, 2, 3)), "head.w": Tensor((2, 4, 2))})  # stacked unevenly: no count
    assert describe_arrays(mixed, info, "models") == "`body.w` 3 x 2 x 3 float32, `head.w` 2 x 4 x 2 float32"
    more = Arrays({**whole.tensors, "P": Tensor((PER_CLIENT, 5)), "h": Tensor((), "int64")})
    assert describe_arrays(more, info, "models") == "the whole model and `P` N x 5 float32, `h` scalar int64"
    five = Arrays({f"v{i}": Tensor((i + 1,)) for i in range(5)})
    assert describe_arrays(five, info, "vectors") == "vectors (5 arrays)"
    four = Arrays({f"v{i}": Tensor((i + 1,)) for i in range(4)})
    assert describe_arrays(four, info, "vectors") == "`v0` 1 float32, `v1` 2 float32, `v2` 3 float32, `v3` 4 float32"


def test_sent_describes_every_record_and_keeps_what_is_optional_optional():
    from strategies.disclosure import entries, stacked
    from strategies.replies import Number

    spec = BASE.with_records(arrays=Arrays({"w": Tensor((2,))}), extra=Arrays({"v": Tensor((3,))}, required=False))
    parts = sent(spec, {"arrays": "its model"}, evaluation={"personal-acc": Number(float, 0, 1)})
    assert parts["arrays"].what == "its model" and parts["extra"].what == "extra"  # unnamed: its record's name
    assert all(isinstance(p.what, str) and p.what for p in parts.values())
    assert {n: p.required for n, p in parts.items()} == {
        "metrics": True,
        "timing": False,
        "arrays": True,
        "extra": False,
        "evaluation": False,
    }
    declared = {"train": Disclosure(sends=parts)}
    only_required = {"arrays": {"arrays": {"w": [[2], "float32"]}}, "metrics": {"metrics": sorted(BASE.metrics)}}
    assert mismatches(declared, [{**ONE, "type": "train", "content": only_required}]) == []
    # a rule object without a `required` flag is a required entry
    assert entries({"a": object(), "b": Number(float, 0, 1, required=False)}) == {"a": True, "b": False}
    optional = stacked(Arrays({"c": Tensor((2,), "int64")}, required=False), 3)
    assert optional.required is False and optional.tensors["c"] == Tensor((3, 2), "int64")


def test_one_bad_record_or_line_does_not_hide_the_next():
    """Every problem of a line and of every later line is reported, not only the first one."""
    declared = _declared(w=Tensor((2,)))
    content = {
        "arrays": {"odd": {"x": [[1], "float32"]}, "rows": {"w": [[3], "float32"]}, "zz": {"y": [[1], "float32"]}},
        "metrics": {"m1": ["a"], "m2": ["b"]},
    }
    problems = [
        f"{WHERE}: record 'odd' (arrays) is not declared",
        f"{WHERE}: record 'rows': array 'w' has shape (3,), declared (2,)",
        f"{WHERE}: record 'zz' (arrays) is not declared",
        f"{WHERE}: record 'm1' (metrics) is not declared",
        f"{WHERE}: record 'm2' (metrics) is not declared",
    ]
    assert mismatches(declared, [{**ONE, "content": content}]) == problems
    wrong_kind = {"metrics": {"rows": ["w"]}, "configs": {"rows2": ["w"]}}
    unknown = {**ONE, "type": "query.z", "content": {}}
    lines = [unknown, {**ONE, "direction": "lost", "content": {}}, {**ONE, "content": content}]
    assert mismatches(declared, [*lines, {**ONE, "content": wrong_kind}]) == [
        "sent query.z (round 2, node 5): message type 'query.z' is not declared",
        "lost query.x (round 2, node 5): unknown direction 'lost'",
        *problems,
        f"{WHERE}: record 'rows' is metrics, declared as arrays",
        f"{WHERE}: record 'rows2' (configs) is not declared",
    ]
    six = {f"d{i}": Tensor((2,)) for i in range(6)}
    assert mismatches(_declared(**six), [_arrays()]) == [
        f"{WHERE}: record 'rows' lacks declared arrays ['d0', 'd1', 'd2', 'd3', 'd4'] ..."
    ]


def test_the_two_sides_match_whatever_order_their_recorders_wrote_the_content_in(fedavg):
    pushed = line(fedavg["train"].receives, "pushed", "train", node=3)
    received = line(fedavg["train"].receives, "received", "train", node=3)
    received["content"] = dict(reversed(list(received["content"].items())))
    assert list(received["content"]) != list(pushed["content"])
    assert disagreements([pushed], [received]) == []


def test_a_record_of_the_wrong_kind_does_not_hide_the_records_after_it():
    declared = {
        "query.x": Disclosure(
            sends={"a": Part("a", entries={"x": True}), "b": Part("b", arrays=Arrays({"w": Tensor((2,))}))}
        )
    }
    content = {"metrics": {"b": ["w"], "c": ["y"]}, "configs": {"a": ["x", "z"]}}
    assert mismatches(declared, [{**ONE, "content": content}]) == [
        f"{WHERE}: record 'b' is metrics, declared as arrays",
        f"{WHERE}: record 'c' (metrics) is not declared",
        f"{WHERE}: record 'a' has undeclared entries ['z']",
    ]


# ---------------------------------------------------------------------------------------------- list lengths
SCORES = {
    "query.x": Disclosure(
        sends={"metrics": Part("scores", entries={"row": True, "loss": True, "ids": False}, lengths={"row": 3})},
        receives={"about": Part("peers", entries={"ids": True}, lengths={"ids": PER_PEER})},
    )
}


def _scores(lengths: dict, direction: str = "sent", record: str = "metrics", names=("ids", "loss", "row")) -> dict:
    kind = "metrics" if direction == "sent" else "configs"
    content = {kind: {record: sorted(names)}, "lengths": {record: lengths} if lengths else {}}
    return {**ONE, "direction": direction, "content": content}


def test_a_list_of_the_declared_length_matches():
    assert mismatches(SCORES, [_scores({"row": 3})]) == []


def test_a_list_metric_longer_than_declared_is_caught():
    """A reply whose influence row grows from one score per peer to anything longer (a vector as long as the model,
    say) is told apart by its length alone: the recording never holds values."""
    assert mismatches(SCORES, [_scores({"row": 4})]) == [
        f"{WHERE}: record 'metrics' entry 'row' is a list of 4 values, declared 3"
    ]


def test_a_list_where_a_single_value_is_declared_is_caught_and_the_reverse():
    assert mismatches(SCORES, [_scores({"row": 3, "loss": 2})]) == [
        f"{WHERE}: record 'metrics' entry 'loss' is a list of 2 values, declared a single value"
    ]
    assert mismatches(SCORES, [_scores({})]) == [
        f"{WHERE}: record 'metrics' entry 'row' is a single value, declared a list of 3"
    ]


def test_a_count_bounded_by_the_federation_is_held_to_its_size_when_that_is_known():
    """``PER_PEER``: one per other client.  Checked against a federation of 4 clients, 3 ids pass and 4 do not;
    without the federation's size only the declared bound applies."""
    received = [_scores({"ids": 4}, direction="received", record="about", names=("ids",))]
    assert mismatches(SCORES, received) == []
    assert mismatches(SCORES, received, clients=4) == [
        "received query.x (round 2, node 5): record 'about' entry 'ids' is a list of 4 values, declared 1..N - 1"
    ]
    received[0]["content"]["lengths"]["about"]["ids"] = 3
    assert mismatches(SCORES, received, clients=4) == []


def test_one_model_per_client_is_held_to_the_federations_size():
    declared = {"query.x": Disclosure(sends={"rows": Part("rows", arrays=Arrays({"w": Tensor((PER_CLIENT, 2))}))})}
    lines = [{**ONE, "content": {"arrays": {"rows": {"w": [[5, 2], "float32"]}}}}]
    assert mismatches(declared, lines) == [] and mismatches(declared, lines, clients=5) == []
    assert mismatches(declared, lines, clients=4) == [
        f"{WHERE}: record 'rows': array 'w' has shape (5, 2), declared (1..N, 2)"
    ]


def test_a_part_declares_lengths_only_of_its_entries():
    with pytest.raises(ValueError, match=r"^a Part declares the lengths of entries it does not declare: \['row'\]$"):
        Part("scores", entries={"loss": True}, lengths={"row": 3})


def test_sent_declares_the_length_of_every_list_a_reply_spec_reads():
    spec = ReplySpec(
        metrics={"row": Numbers(float, 0, 1, length=4), "bids": Numbers(int, 0, 9, max_length=2), **BASE.metrics}
    )
    assert sent(spec)["metrics"].lengths == {"row": 4, "bids": Dim(0, 2)}


def _declared_by(method: str, **config) -> dict[str, Disclosure]:
    return strategy(method, **config).disclosure()


def _with_lengths(parts, direction: str, kind: str, record: str, **lengths: int) -> dict:
    out = line(parts, direction, kind)
    out["content"]["lengths"].setdefault(record, {}).update(lengths)
    return out


def test_pifl_declares_bids_from_none_to_max_bids_and_one_value_per_tier():
    """A PI-FL client without tokens bids for nothing; one with tokens for at most ``max-bids`` tiers (1 in this
    version); its evaluation (also the one riding on a train reply) has one accuracy, goal and mixture weight per
    tier."""
    pifl = _declared_by("pifl", tiers=3, **{"min-nodes": 3})
    sends = pifl["query.bid"].sends
    assert mismatches(pifl, [_with_lengths(sends, "sent", "query.bid", "metrics", bid=0, **{"tier-acc": 3})]) == []
    assert mismatches(pifl, [_with_lengths(sends, "sent", "query.bid", "metrics", bid=1, **{"tier-acc": 3})]) == []
    assert mismatches(pifl, [_with_lengths(sends, "sent", "query.bid", "metrics", bid=2, **{"tier-acc": 3})]) == [
        "sent query.bid (round 1, node 7): record 'metrics' entry 'bid' is a list of 2 values, declared 0..1"
    ]
    train = pifl["train"].sends
    per_tier = {"tier-acc": 3, "tier-goal-acc": 3, "mixture-weights": 3}
    assert mismatches(pifl, [_with_lengths(train, "sent", "train", "evaluation", **per_tier)]) == []
    for name in per_tier:
        longer = _with_lengths(train, "sent", "train", "evaluation", **{**per_tier, name: 4})
        assert mismatches(pifl, [longer]) == [
            f"sent train (round 1, node 7): record 'evaluation' entry '{name}' is a list of 4 values, declared 3"
        ]


def test_a_pifl_train_message_without_the_tier_it_won_is_caught():
    pifl = _declared_by("pifl")
    received = line(pifl["train"].receives, "received", "train")
    received["content"]["configs"]["tier"] = []
    assert mismatches(pifl, [received]) == [
        "received train (round 1, node 7): record 'tier' lacks required entries ['tier']"
    ]


def test_a_pfedlia_client_may_find_no_beneficial_peer():
    lia = _declared_by("pfedlia", **{"lia-mode": "p2p"})
    sends = lia["query.lia"].sends
    for n in (0, 3):
        assert mismatches(lia, [_with_lengths(sends, "sent", "query.lia", "metrics", beneficial=n)]) == []
        assert mismatches(lia, [_with_lengths(sends, "sent", "query.lia", "metrics", beneficial=n)], clients=4) == []


def test_fedc2i_with_c2i_peers_declares_one_influence_per_model_sent():
    """``c2i-peers = k``: the client is sent its own model and k - 1 peers' with their k - 1 ids and sizes, and scores
    each model: k influences."""
    c2i = _declared_by("fedc2i", **{"c2i-peers": 3})
    received = c2i["train"].receives
    peers = {"client-ids": 2, "num-examples": 2}
    assert mismatches(c2i, [_with_lengths(received, "received", "train", "peer-clients", **peers)], clients=10) == []
    for name in peers:
        more = _with_lengths(received, "received", "train", "peer-clients", **{**peers, name: 3})
        said = f"received train (round 1, node 7): record 'peer-clients' entry '{name}' is a list of 3 values"
        assert mismatches(c2i, [more], clients=10) == [f"{said}, declared 1..2"]
    sends = c2i["train"].sends
    assert mismatches(c2i, [_with_lengths(sends, "sent", "train", "metrics", influence=3)], clients=10) == []
    assert mismatches(c2i, [_with_lengths(sends, "sent", "train", "metrics", influence=4)], clients=10) == [
        "sent train (round 1, node 7): record 'metrics' entry 'influence' is a list of 4 values, declared 1..3"
    ]


def test_a_client2vec_message_without_its_c2v_local_switch_is_caught():
    """Every Client2Vec message says whether the client trains with its own index term (``c2v-local``)."""
    c2v = _declared_by("client2vec")
    received = line(c2v["train"].receives, "received", "train")
    received["content"]["configs"]["config"].remove("c2v-local")
    assert mismatches(c2v, [received]) == [
        "received train (round 1, node 7): record 'config' lacks required entries ['c2v-local']"
    ]

"""What the FedC2I server must do (fedc2i.md §2.3, §2.5, §6.13, §6.20, §7; docs/methods/fedc2i.md "Messages",
"Options", "Artefacts"): store every client's latest model without averaging, send each client its own stored
model first and then its peers' (all of them, or ``c2i-peers - 1`` drawn per round), check the influence vector
against what was sent, and log the influence rows.  Replies are made by hand, without a client, except in the last
tests, where the real clients answer (round one from the common model, then everyone receives everyone;
``c2i-peers`` bounds the download), and the options the strategy refuses."""

from __future__ import annotations

import json

import numpy as np
import pytest
from flwr.app import ConfigRecord, MetricRecord, RecordDict

from server_app.app import build_strategy
from strategies.fedc2i_artifacts import write_artifacts
from task.config import parse_settings
from task.methods import METHODS, load_object
from task.methods.fedc2i import FedC2IOptions
from task.params import record_to_numpy, to_record
from tests.client_kit import node_contexts
from tests.strategy_harness import strategy

NODE = 100  # node id of client i is NODE + i


def model_of(strat, client, version):
    """A recognisable model: every float entry of client ``client``'s model is ``client + version / 10``."""
    return {
        k: (np.full_like(v, client + version / 10) if np.issubdtype(v.dtype, np.floating) else v.copy())
        for k, v in strat.initial_state.items()
    }


def reply(strat, client, version, influence, size):
    return RecordDict(
        {
            "metrics": MetricRecord({"partition-id": client, "num-examples": size, "influence": influence}),
            "arrays": to_record(model_of(strat, client, version)),
        }
    )


def play_round(strat, rnd, clients, version=None, influence=None):
    """Send every client its train message, answer it by hand (uniform influence unless given), aggregate."""
    payloads, ups = {}, []
    for c in clients:
        payloads[c] = strat.payload(NODE + c, rnd, "train")
        k = payloads[c]["peers"]["head.bias"].numpy().shape[0]
        infl = influence(c, k) if influence else [1.0 / k] * k
        u = strat.gate.check(
            rnd, NODE + c, reply(strat, c, rnd if version is None else version, infl, 10 * (c + 1)), "train", set()
        )
        assert u is not None, strat.failures
        ups.append(u)
    metrics = strat.aggregate(rnd, ups)
    return payloads, metrics


def stack_values(payload):
    """The models of a train message's stack, as the float value that ``model_of`` put in each."""
    peers = record_to_numpy(payload["peers"])
    return [float(v) for v in peers["head.bias"][:, 0]]


def test_the_server_stores_each_clients_latest_model_and_never_averages():
    """fedc2i.md §2.3: the server keeps the latest model of each client and forwards them (own first, §2.5);
    an absent client's stale model is still forwarded (fedc2i.md §6.20); a client not heard from has the initial
    model."""
    strat = strategy("fedc2i", partition="iid")
    clients = [0, 1, 2, 3]
    first, _ = play_round(strat, 1, clients)
    init = float(strat.initial_state["head.bias"][0])
    assert all(stack_values(first[c]) == [init] for c in clients)  # round 1: only its own (initial) model
    play_round(strat, 2, [0, 1, 2])  # client 3 absent in round 2
    third, _ = play_round(strat, 3, clients)
    np.testing.assert_allclose(stack_values(third[0]), [0.2, 1.2, 2.2, 3.1])
    np.testing.assert_allclose(stack_values(third[3]), [3.1, 0.2, 1.2, 2.2])
    assert list(third[3]["peer-clients"]["client-ids"]) == [0, 1, 2]
    assert list(third[3]["peer-clients"]["num-examples"]) == [10, 20, 30]
    stored = record_to_numpy(strat.payload(NODE + 1, 3, "evaluate")["arrays"])
    for k, v in model_of(strat, 1, 3).items():  # round 3's reply replaced round 2's
        np.testing.assert_array_equal(stored[k], v)
    never = record_to_numpy(strat.payload(NODE + 9, 3, "evaluate")["arrays"])
    for k, v in strat.initial_state.items():
        np.testing.assert_array_equal(never[k], v)


def test_a_client_never_heard_from_gets_the_initial_model_and_all_known_peers():
    """fedc2i.md §6.13: a newcomer starts from the common initial model; clients that never replied are no peers."""
    strat = strategy("fedc2i", partition="iid")
    play_round(strat, 1, [0, 1])
    p = strat.payload(NODE + 5, 2, "train")
    init = float(strat.initial_state["head.bias"][0])
    np.testing.assert_allclose(stack_values(p), [init, 0.1, 1.1])
    assert list(p["peer-clients"]["client-ids"]) == [0, 1]


def test_a_client_known_but_never_trained_gets_the_initial_model():
    """fedc2i.md §6.13 / §6.20: with partial participation a client can be known to the server (it answered an
    evaluation) before any of its train replies was stored; its own model is then the common initial model."""
    strat = strategy("fedc2i", partition="iid")
    play_round(strat, 1, [0, 1])
    evaluated = RecordDict(
        {"metrics": MetricRecord({"partition-id": 4, "num-examples": 10, "personal-acc": 0.5, "personal-loss": 1.0})}
    )
    assert strat.gate.check(1, NODE + 4, evaluated, "evaluate", set()) is not None
    init = float(strat.initial_state["head.bias"][0])
    np.testing.assert_allclose(stack_values(strat.payload(NODE + 4, 2, "train")), [init, 0.1, 1.1])
    own = record_to_numpy(strat.payload(NODE + 4, 2, "evaluate")["arrays"])
    for k, v in strat.initial_state.items():
        np.testing.assert_array_equal(own[k], v)


@pytest.mark.parametrize("k", [2, 3])
def test_c2i_peers_sends_itself_and_k_minus_1_peers_drawn_afresh_each_round(k):
    """docs Options: ``c2i-peers = k`` sends the client itself plus k - 1 others, drawn per round with a
    generator seeded by (seed, round, client): the same seed repeats the draw, rounds and clients differ."""
    n = 6
    strat = strategy("fedc2i", partition="iid", **{"c2i-peers": k})
    play_round(strat, 1, range(n))
    drawn = {}
    for rnd in range(2, 12):
        for c in range(n):
            ids = list(strat.payload(NODE + c, rnd, "train")["peer-clients"]["client-ids"])
            assert len(ids) == k - 1 and c not in ids and ids == sorted(ids) and len(set(ids)) == k - 1
            assert strat.payload(NODE + c, rnd, "train")["peers"]["head.bias"].numpy().shape[0] == k
            drawn[rnd, c] = ids
    assert len({tuple(drawn[r, 0]) for r in range(2, 12)}) > 1  # drawn afresh each round
    assert len({tuple(drawn[5, c]) for c in range(n)}) > 1  # and per client
    again = strategy("fedc2i", partition="iid", **{"c2i-peers": k})
    play_round(again, 1, range(n))
    assert all(
        list(again.payload(NODE + c, r, "train")["peer-clients"]["client-ids"]) == drawn[r, c] for (r, c) in drawn
    )
    other_seed = strategy("fedc2i", partition="iid", **{"c2i-peers": k, "seed": 1})
    play_round(other_seed, 1, range(n))
    assert any(
        list(other_seed.payload(NODE + c, r, "train")["peer-clients"]["client-ids"]) != drawn[r, c] for (r, c) in drawn
    )


def test_each_client_draws_its_own_peers():
    """docs Options: the peers are drawn per round *and client* (the seed includes the client id), so clients do
    not all take the peers at the same rank among their candidates; a node that has not replied yet (a
    newcomer) gets its k - 1 peers too (fedc2i.md §6.13)."""
    n, k = 6, 2
    strat = strategy("fedc2i", partition="iid", **{"c2i-peers": k})
    play_round(strat, 1, range(n))
    same_rank_rounds = 0
    for rnd in range(2, 12):
        ranks = set()
        for c in range(n):
            (peer,) = strat.payload(NODE + c, rnd, "train")["peer-clients"]["client-ids"]
            ranks.add([o for o in range(n) if o != c].index(peer))
        same_rank_rounds += len(ranks) == 1
    assert same_rank_rounds < 5
    newcomer = strat.payload(NODE + 50, 2, "train")
    assert len(newcomer["peer-clients"]["client-ids"]) == k - 1
    assert newcomer["peers"]["head.bias"].numpy().shape[0] == k


def test_c2i_peers_above_the_known_clients_sends_all_of_them():
    """docs Options: k is an upper bound; with fewer known clients every one of them is sent."""
    strat = strategy("fedc2i", partition="iid", **{"c2i-peers": 3})
    play_round(strat, 1, [0, 1, 2])
    assert list(strat.payload(NODE + 1, 2, "train")["peer-clients"]["client-ids"]) == [0, 2]


def test_the_influence_vector_must_cover_exactly_what_was_sent():
    """docs Messages: ``influence`` has one weight in [0, 1] per model sent (itself first), summing to 1."""
    strat = strategy("fedc2i", partition="iid")
    play_round(strat, 1, [0, 1, 2])
    for c in (0, 1, 2):
        strat.payload(NODE + c, 2, "train")
    good = [0.5, 0.3, 0.2]
    assert strat.gate.check(2, NODE + 0, reply(strat, 0, 2, good, 10), "train", set()) is not None
    for bad in ([0.5, 0.5], [0.4, 0.3, 0.2, 0.1], [0.5, 0.3, 0.3], [1.2, -0.1, -0.1]):
        assert strat.gate.check(2, NODE + 1, reply(strat, 1, 2, bad, 10), "train", set()) is None
    assert "influence" in strat.failures[-1]["reason"]


def test_influence_rows_are_logged_per_round_client_and_peer():
    """fedc2i.md §2.3 / docs Artefacts: the server logs each client's influence row, keyed by the peer's client id
    (round -> client -> peer -> weight), and the mean self-influence; the rows are not symmetric (fedc2i.md §7 test
    12)."""
    strat = strategy("fedc2i", partition="iid")
    play_round(strat, 1, [0, 1, 2])
    rows = {0: [0.7, 0.2, 0.1], 1: [0.1, 0.6, 0.3], 2: [0.05, 0.15, 0.8]}
    _, metrics = play_round(strat, 2, [0, 1, 2], influence=lambda c, k: rows[c])
    assert strat.influence[2] == {
        0: {0: 0.7, 1: 0.2, 2: 0.1},
        1: {1: 0.1, 0: 0.6, 2: 0.3},
        2: {2: 0.05, 0: 0.15, 1: 0.8},
    }
    assert metrics["fedc2i"]["self-influence-mean"] == pytest.approx((0.7 + 0.1 + 0.05) / 3)
    assert metrics["fedc2i"]["peers-per-client"] == 3.0
    assert strat.influence[1] == {c: {c: 1.0} for c in (0, 1, 2)}
    assert strat.sizes == {0: 10, 1: 20, 2: 30}


def test_the_influence_artefact_holds_every_round_client_and_peer(tmp_path, monkeypatch):
    """docs Artefacts: ``fedc2i_influence.json`` (round -> client -> peer -> weight) and the heat map of the
    client x client influence at the first, middle and last round (rows = client m, columns = peer i, like the
    paper's Figure 3), on one colour scale [0, 1]; a peer a client was not sent is blank."""
    import matplotlib.pyplot as plt
    from matplotlib.image import imread

    import strategies.fedc2i_artifacts as module
    from tests.strategy_harness import kept_figures

    figures = kept_figures(monkeypatch, module)  # pyplot, but the figure is kept for inspection instead of closed
    strat = strategy("fedc2i", partition="iid", **{"c2i-peers": 2})
    ids = [0, 2, 5]  # client ids are not positions: the ticks must name the ids
    play_round(strat, 1, ids)
    for rnd in range(2, 7):  # client 5 misses the last round: its row is blank there
        play_round(
            strat,
            rnd,
            ids if rnd < 6 else ids[:2],
            influence=lambda c, k, rnd=rnd: [0.1 * c + 0.05 * rnd, 1 - 0.1 * c - 0.05 * rnd],
        )
    write_artifacts(strat, tmp_path)
    logged = json.loads((tmp_path / "fedc2i_influence.json").read_text())
    assert logged == {
        str(r): {str(c): {str(p): w for p, w in row.items()} for c, row in rows.items()}
        for r, rows in strat.influence.items()
    }
    assert logged["1"] == {"0": {"0": 1.0}, "2": {"2": 1.0}, "5": {"5": 1.0}}
    assert (tmp_path / "fedc2i_influence.png").stat().st_size > 0
    (fig,) = figures
    panels = [ax for ax in fig.axes if ax.get_images()]
    assert len(panels) == 3 and len(fig.axes) == 6  # one panel per chosen round, each with its colour bar
    assert np.isnan(np.ma.filled(panels[2].get_images()[0].get_array(), np.nan)[2]).all()
    for ax, rnd in zip(panels, (1, 4, 6), strict=True):  # first, middle and last round
        assert f"round {rnd}" in ax.get_title()
        assert "peer" in ax.get_xlabel() and "client" in ax.get_ylabel()
        (image,) = ax.get_images()
        assert image.get_clim() == (0, 1)
        expected = np.full((3, 3), np.nan)
        for c, row in strat.influence[rnd].items():
            for p, w in row.items():
                expected[ids.index(c), ids.index(p)] = w
        np.testing.assert_allclose(np.ma.filled(image.get_array(), np.nan), expected)
        assert list(ax.get_xticks()) == [0, 1, 2] and list(ax.get_yticks()) == [0, 1, 2]  # on its column / row
        assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "2", "5"]
        assert [t.get_text() for t in ax.get_yticklabels()] == ["0", "2", "5"]
    readable_heat_maps(fig, panels)
    png = imread(tmp_path / "fedc2i_influence.png")  # a valid image: the figure as drawn, pixel for pixel
    width, height = fig.get_size_inches() * fig.dpi
    assert png.shape[:2] == (round(height), round(width))
    weights = sum(len(row) for rows in strat.influence.values() for row in rows.values())
    assert len((tmp_path / "fedc2i_influence.json").read_text().splitlines()) > weights  # one weight per line
    plt.close(fig)


def readable_heat_maps(fig, panels):
    """docs Artefacts (the paper's Figure 3): the axes say what they hold (rows the client m whose influence
    vector it is, columns the peer i it weighs); each panel's colour bar explains that panel's colours (the
    image's own [0, 1] scale) and is a narrow strip as tall as the heat map beside it (``fig`` was saved, i.e.
    drawn, at its own resolution)."""
    for ax in panels:
        assert ax.get_xlabel() == "peer client i" and ax.get_ylabel() == "client m"
        (image,) = ax.get_images()
        bar = image.colorbar
        assert bar is not None and bar.mappable is image and bar.ax in fig.axes
        assert bar.cmap.name == image.get_cmap().name and (bar.norm.vmin, bar.norm.vmax) == (0, 1)
        heat, strip = ax.get_window_extent(), bar.ax.get_window_extent()
        assert strip.height == pytest.approx(heat.height, rel=0.05)
        assert strip.width < heat.width / 4 and strip.x0 >= heat.x1


def test_the_heat_map_ticks_are_client_ids_also_for_many_clients(tmp_path, monkeypatch):
    """docs Artefacts: the axes of the client x client heat map are client ids: up to 20 clients each row and
    column carries its id; with more (21 here) the labels would overlap, so only some ids are shown, and those
    are whole numbers (matplotlib's own choice would put a tick at client 2.5).  The figure grows with the
    panels (one per chosen round), so each panel keeps the size a one-round run gets."""
    import matplotlib.pyplot as plt

    import strategies.fedc2i_artifacts as module
    from tests.strategy_harness import kept_figures

    figures = kept_figures(monkeypatch, module)
    twenty = strategy("fedc2i", partition="iid")
    play_round(twenty, 1, range(20))
    write_artifacts(twenty, tmp_path)
    many = strategy("fedc2i", partition="iid", **{"c2i-peers": 2})
    for rnd in (1, 2, 3):
        play_round(many, rnd, range(21))
    (tmp_path / "many").mkdir()
    write_artifacts(many, tmp_path / "many")
    fig20, fig21 = figures
    (ax20,) = [a for a in fig20.axes if a.get_images()]
    assert list(ax20.get_xticks()) == list(range(20)) and list(ax20.get_yticks()) == list(range(20))
    assert [t.get_text() for t in ax20.get_yticklabels()] == [str(c) for c in range(20)]
    panels = [a for a in fig21.axes if a.get_images()]
    assert len(panels) == 3
    for ax in panels:
        for ticks in (ax.get_xticks(), ax.get_yticks()):
            inside = [t for t in ticks if -0.5 <= t <= 20.5]
            assert 2 <= len(inside) < 21 and all(float(t).is_integer() for t in inside)
    (w1, h1), (w3, h3) = fig20.get_size_inches(), fig21.get_size_inches()
    assert w3 == pytest.approx(3 * w1) and h3 == pytest.approx(h1) and w1 >= h1
    for fig in figures:
        plt.close(fig)


def test_c2i_peers_of_one_is_refused_with_the_values_that_work():
    """docs Options: ``c2i-peers=1`` would send a client only its own model (nothing to mix); the start-up check
    says why and which values to use instead."""
    with pytest.raises(ValueError, match="c2i-peers=1 sends a client only its own model") as err:
        strategy("fedc2i", partition="iid", **{"c2i-peers": 1})
    assert (
        "c2i-peers=1 sends a client only its own model, so there is nothing to mix: "
        "use 0 (every client) or a number >= 2"
    ) in str(err.value)
    for ok in (0, 2, 5):
        strategy("fedc2i", partition="iid", **{"c2i-peers": ok})


def test_no_influence_weight_may_exceed_one():
    """docs Messages: every influence weight lies in [0, 1].  The sum check alone (within 1e-4, float32 clients)
    would let a weight of 1 + 5e-5 through; the per-weight bound refuses it."""
    strat = strategy("fedc2i", partition="iid")
    play_round(strat, 1, [0, 1])
    for c in (0, 1):
        strat.payload(NODE + c, 2, "train")
    assert strat.gate.check(2, NODE + 0, reply(strat, 0, 2, [1.0, 0.0], 10), "train", set()) is not None
    assert strat.gate.check(2, NODE + 1, reply(strat, 1, 2, [1.0 + 5e-5, 0.0], 10), "train", set()) is None
    assert "influence" in strat.failures[-1]["reason"]


# ---------------------------------------------------------------- strategy + client without Flower's runtime
def run(cfg, rounds=2, n=4):
    settings = parse_settings(cfg)
    strat = build_strategy(settings)
    ctxs = node_contexts(cfg, n)
    cls = load_object(METHODS["fedc2i"].client)
    replies = {}
    for rnd in range(1, rounds + 1):
        ups = []
        for i, ctx in enumerate(ctxs):
            payload = strat.payload(10 + i, rnd, "train")
            payload["config"] = ConfigRecord({"server-round": rnd})
            replies[(rnd, i)] = payload
            u = strat.gate.check(rnd, 10 + i, cls(ctx, settings).train(payload), "train", set())
            assert u is not None, strat.failures
            ups.append(u)
        strat.aggregate(rnd, ups)
    return strat, replies


def test_round_one_starts_from_the_common_model_then_everyone_receives_everyone():
    strat, payloads = run({"method": "fedc2i", "partition": "iid", "feature-shift": 4})
    assert payloads[(1, 0)]["peers"]["head.bias"].shape[0] == 1
    assert payloads[(2, 0)]["peers"]["head.bias"].shape[0] == 4
    assert list(payloads[(2, 2)]["peer-clients"]["client-ids"]) == [0, 1, 3]  # the others, by client id
    assert list(payloads[(2, 2)]["peer-clients"]["num-examples"]) == [strat.sizes[c] for c in (0, 1, 3)]
    row = strat.influence[2]
    assert len(row) == 4 and all(abs(sum(r.values()) - 1) < 1e-5 for r in row.values())


def test_peer_sampling_bounds_the_download():
    _strat, payloads = run({"method": "fedc2i", "partition": "iid", "c2i-peers": 2}, rounds=2, n=5)
    assert payloads[(2, 0)]["peers"]["head.bias"].shape[0] == 2
    full, _ = run({"method": "fedc2i", "partition": "iid"}, rounds=2, n=5)
    assert payloads[(2, 0)]["peers"].count_bytes() < 0.5 * full.payload(10, 3, "train")["peers"].count_bytes()


def test_bad_fedc2i_config():
    with pytest.raises(ValueError, match="c2i-peers"):
        strategy("fedc2i", **{"c2i-peers": 1})
    with pytest.raises(ValueError, match="c2i-variant"):
        strategy("fedc2i", **{"c2i-variant": "both"})
    with pytest.raises(ValueError, match="gamma"):
        strategy("fedc2i", gamma=-2.0)


@pytest.mark.parametrize(
    "old,new",
    [
        ("lambda-only", "client-level"),
        ("Lambda-only", "class-level-averaged-extractor"),
        ("Lambda-local", "class-level-own-extractor"),
    ],
)
def test_the_variants_old_spellings_still_run_with_a_deprecation_warning(old, new):
    with pytest.warns(FutureWarning, match=f"'c2i-variant': '{old}' is deprecated, use '{new}'"):
        options = parse_settings({"method": "fedc2i", "c2i-variant": old}).options
    assert isinstance(options, FedC2IOptions) and options.variant == new
    with pytest.raises(ValueError, match="c2i-variant"):  # only the exact old spelling is an alias
        parse_settings({"method": "fedc2i", "c2i-variant": old.swapcase()})

"""What Client2Vec's server records about the index (client2vec.md §8; docs/methods/client2vec.md
"Artefacts"): each client's domain, the index quality, client2vec_index.npz, client2vec.json and the similarity
plot."""

import json

import numpy as np
import pytest

from strategies.client2vec_artifacts import write_artifacts
from strategies.client2vec_math import (
    C2VServerState,
)
from tests.client2vec.server_kit import ARMS_OFF, NODES, c2v, cos_loop
from tests.strategy_harness import drive
from tests.strategy_harness import kept_figures as harness_kept_figures


def test_domain_of_a_client_is_its_feature_shift_transform():
    """Data: with feature-shift = s, partition p gets transform p mod s (its domain); without, one domain."""
    assert [c2v(**{"feature-shift": 3}).domain_of(p) for p in range(7)] == [0, 1, 2, 0, 1, 2, 0]
    assert {c2v().domain_of(p) for p in range(7)} == {0}


def test_index_quality_is_the_same_minus_cross_domain_mean_feature_cosine():
    """client2vec.md §8 acceptance check 1 (the Fig. 2 block structure): mean cos(beta_f) over pairs of distinct clients
    of the same domain minus the mean over pairs from different domains; undefined (left out) without both."""
    rng = np.random.default_rng(3)
    pids = [5, 0, 3, 1, 4, 2, 7]  # registry rows in arrival order, not sorted
    bf, bl = rng.normal(size=(7, 5)), rng.normal(size=(7, 5))
    strat = c2v(**{"feature-shift": 3})
    assert strat.index_quality() == {}  # no index yet
    strat.c2v, strat.index_clients = C2VServerState(bf, bl, np.full(7, 5.0)), pids
    same = [cos_loop(bf[i], bf[j]) for i in range(7) for j in range(7) if i != j and pids[i] % 3 == pids[j] % 3]
    cross = [cos_loop(bf[i], bf[j]) for i in range(7) for j in range(7) if pids[i] % 3 != pids[j] % 3]
    q = strat.index_quality()
    assert q == pytest.approx(
        {
            "beta-f-same-domain": np.mean(same),
            "beta-f-cross-domain": np.mean(cross),
            "beta-f-block-gap": np.mean(same) - np.mean(cross),
        }
    )
    one_domain = c2v()
    one_domain.c2v, one_domain.index_clients = C2VServerState(bf, bl, np.full(7, 5.0)), pids
    assert one_domain.index_quality() == {}  # no cross-domain pair
    own_domains = c2v(**{"feature-shift": 7})
    own_domains.c2v, own_domains.index_clients = C2VServerState(bf[:6], bl[:6], np.full(6, 5.0)), pids[:6]
    assert own_domains.index_quality() == {}  # no same-domain pair
    two = c2v(**{"feature-shift": 2})
    two.c2v, two.index_clients = C2VServerState(bf[:2], bl[:2], np.full(2, 5.0)), [0, 1]
    assert two.index_quality() == {}  # fewer than two in a domain
    single = c2v(**{"feature-shift": 2})
    single.c2v, single.index_clients = C2VServerState(bf[:1], bl[:1], np.full(1, 5.0)), [0]
    assert single.index_quality() == {}


def kept_figures(monkeypatch):
    """pyplot for strategies.client2vec, except that closed figures are kept for inspection."""
    import strategies.client2vec_artifacts as module

    return harness_kept_figures(monkeypatch, module)


def test_the_similarity_plot_marks_a_domain_of_one_client_first(tmp_path, monkeypatch):
    """A domain boundary after the very first row too (here domain 0 is client 0 alone): thin black lines between
    domains, across both heat maps."""
    figures = kept_figures(monkeypatch)
    strat = c2v(**{"fraction-train": 0.5, "feature-shift": 2, "min-nodes": 3, "num-server-rounds": 1})
    drive(strat, {7: 0, 8: 1, 9: 3}, 1)  # partitions 0 (domain 0), 1 and 3 (domain 1)
    write_artifacts(strat, tmp_path)
    (fig,) = figures
    panels = [ax for ax in fig.axes if ax.get_images()]
    for ax in panels:
        assert [ln.get_ydata()[0] for ln in ax.lines if ln.get_ydata()[0] == ln.get_ydata()[1]] == [0.5]
        assert [ln.get_xdata()[0] for ln in ax.lines if ln.get_xdata()[0] == ln.get_xdata()[1]] == [0.5]
        assert all(ln.get_color() == "k" and ln.get_linewidth() == 0.6 for ln in ax.lines)


def test_the_artefacts_hold_the_index_by_domain_the_runs_record_and_the_similarity_plot(tmp_path, monkeypatch):
    """docs Artefacts: client2vec_index.npz (the registry ordered by feature-shift domain, then partition id),
    client2vec.json (options, index-phase seconds, index quality, best-round global accuracy, DSA-IGN losses,
    cohorts, aggregation weights) and client2vec_similarity.png (cos of both halves in that order, from -1 to 1,
    domain boundaries marked)."""
    import dataclasses

    import matplotlib.pyplot as plt

    figures = kept_figures(monkeypatch)
    strat = c2v(**{"fraction-train": 0.5, "feature-shift": 2, "num-server-rounds": 3})
    drive(strat, NODES, 3)
    write_artifacts(strat, tmp_path)
    order = [0, 2, 4, 1, 3, 5]  # domain p % 2, then partition id; registry row r is partition r here
    assert strat.index_clients == list(range(6))
    with np.load(tmp_path / "client2vec_index.npz") as npz:
        assert npz["partition_id"].tolist() == order and npz["domain"].tolist() == [0, 0, 0, 1, 1, 1]
        np.testing.assert_array_equal(npz["beta_f"], strat.c2v.beta_f[order])
        np.testing.assert_array_equal(npz["beta_l"], strat.c2v.beta_l[order])
        np.testing.assert_array_equal(npz["num_examples"], strat.c2v.n[order])
    record = json.loads((tmp_path / "client2vec.json").read_text())
    assert record["options"] == dataclasses.asdict(strat.opts)
    assert record["index-seconds"] == strat.index_seconds > 0
    assert record["index-quality"] == strat.index_quality() and "beta-f-block-gap" in record["index-quality"]
    accs = [h.evaluate["global-acc"] for h in strat.history]
    assert len(accs) == 3 and record["best-global-acc"] == max(accs)
    assert record["dsa-ign-losses"] == strat.ign_history and len(record["dsa-ign-losses"]) == 2
    assert record["cohorts"] == {str(t): c for t, c in strat.cohorts.items()} and len(record["cohorts"]) == 3
    assert record["aggregation-weights"] == {
        str(t): {str(c): w for c, w in ws.items()} for t, ws in strat.agg_weights.items()
    }
    (fig,) = figures
    panels = [ax for ax in fig.axes if ax.get_images()]
    assert len(panels) == 2 and len(fig.axes) == 4  # two heat maps, each with its colour bar
    left, right = (ax.get_position() for ax in panels)
    assert left.x1 < right.x0 and left.y0 == pytest.approx(right.y0)  # side by side
    for ax, sim, half in zip(
        panels, (strat.c2v.sim_f, strat.c2v.sim_l), ("feature half cos(beta_f)", "label half cos(beta_l)"), strict=False
    ):
        assert ax.get_title() == half and ax.get_xlabel() == "client (ordered by domain)"
        (image,) = ax.get_images()
        np.testing.assert_allclose(image.get_array(), sim[np.ix_(order, order)])
        assert image.get_clim() == (-1, 1) and image.get_cmap().name == "RdBu_r"  # cosines, 0 in the middle
        assert [ln.get_ydata()[0] for ln in ax.lines if ln.get_ydata()[0] == ln.get_ydata()[1]] == [2.5]
        assert [ln.get_xdata()[0] for ln in ax.lines if ln.get_xdata()[0] == ln.get_xdata()[1]] == [2.5]
    gap = strat.index_quality()["beta-f-block-gap"]
    assert fig.get_suptitle() == (
        f"Client2Vec pairwise index similarity (6 clients; same - cross domain beta_f cos {gap:.2f})"
    )
    assert plt.imread(tmp_path / "client2vec_similarity.png").shape[:2] == (500, 1100)  # 11 x 5 in at 100 dpi
    plt.close(fig)


def test_artefacts_of_a_run_without_an_evaluated_round_or_domains(tmp_path, monkeypatch):
    """Before any evaluation the best accuracy is null (an accuracy of 0 is a result, not a missing one); with one
    domain there is no boundary and no gap; client axes show whole clients only (strategies/plots.py)."""
    import matplotlib.pyplot as plt

    figures = kept_figures(monkeypatch)
    three = {12: 0, 4: 1, 60: 2}
    strat = c2v(**{"num-server-rounds": 3, "min-nodes": 3})  # full participation: round 1 is evaluated in round 2
    drive(strat, three, 1)
    write_artifacts(strat, tmp_path)
    record = json.loads((tmp_path / "client2vec.json").read_text())
    assert record["best-global-acc"] is None and record["index-quality"] == {}
    (fig,) = figures
    assert all(not ax.lines for ax in fig.axes)
    assert fig.get_suptitle() == "Client2Vec pairwise index similarity (3 clients)"
    for ax in (ax for ax in fig.axes if ax.get_images()):
        lo, hi = sorted(ax.get_ylim())
        ticks = [t for t in list(ax.get_xticks()) + list(ax.get_yticks()) if lo <= t <= hi]
        assert ticks and all(float(t).is_integer() for t in ticks)
    plt.close(fig)
    strat.history[0].evaluate["global-acc"] = 0.0
    write_artifacts(strat, tmp_path)
    assert json.loads((tmp_path / "client2vec.json").read_text())["best-global-acc"] == 0.0
    strat.history.clear()  # a run stopped before any round was recorded: no best accuracy either
    write_artifacts(strat, tmp_path)
    assert json.loads((tmp_path / "client2vec.json").read_text())["best-global-acc"] is None
    for fig in figures[1:]:
        plt.close(fig)


def test_without_an_index_there_are_no_artefacts(tmp_path):
    write_artifacts(c2v(**ARMS_OFF), tmp_path)
    assert list(tmp_path.iterdir()) == []

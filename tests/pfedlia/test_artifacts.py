"""What pFedLIA's server writes (docs/methods/pfedlia.md "Artefacts"): pfedlia_clusters.json,
pfedlia_influence.json and the heat map of the influence matrix in cluster order, for central, peer-to-peer and
Oracle runs, and for runs that never clustered or have a single client."""

import json

import numpy as np

from strategies.pfedlia_artifacts import write_artifacts
from tests.pfedlia.server_kit import CLIENTS, P2P_SETS, PLANTED, Federation, influence


def _figure_of(strategy, folder, monkeypatch):
    """write_artifacts with plt.close kept from closing the figure, which is returned for inspection."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    kept = []
    monkeypatch.setattr(plt, "close", lambda fig=None: kept.append(fig))
    write_artifacts(strategy, folder)
    return kept[-1] if kept else None


def test_artifacts_hold_the_clustering_and_the_influence_matrix_in_cluster_order(central, tmp_path, monkeypatch):
    """docs "Artefacts": pfedlia_clusters.json (clustering, assignment, planted groups), pfedlia_influence.json
    (rows = scoring clients, columns = lazy models) and a heatmap of the matrix ordered by cluster."""
    s = central.strategy
    fig = _figure_of(s, tmp_path, monkeypatch)
    clusters = json.loads((tmp_path / "pfedlia_clusters.json").read_text())
    assert clusters["clustering"] == json.loads(json.dumps(s.clustering))
    assert clusters["assignment"] == {str(c): s.assignment[c] for c in CLIENTS}
    assert clusters["planted"] == {str(c): PLANTED[c] for c in CLIENTS} and "beneficial-sets" not in clusters
    infl = json.loads((tmp_path / "pfedlia_influence.json").read_text())
    assert infl["rows (scoring client)"] == CLIENTS and infl["columns (lazy model of client)"] == CLIENTS
    np.testing.assert_allclose(infl["matrix"], s.matrix)
    from PIL import Image

    with Image.open(tmp_path / "pfedlia_influence.png") as img:
        assert img.size == (600, 500)
    ax = fig.axes[0]
    order = sorted(CLIENTS, key=lambda c: (s.assignment[c], c))
    shown = np.asarray(ax.images[0].get_array())
    np.testing.assert_allclose(shown, [[influence(i, j) for j in order] for i in order])
    lim = np.abs(s.matrix).max()
    assert ax.images[0].get_clim() == (-lim, lim) and ax.images[0].get_cmap().name == "RdBu"
    # one horizontal and one vertical line between the two clusters
    boundary = sum(1 for c in CLIENTS if s.assignment[c] == s.assignment[order[0]]) - 0.5
    lines = [(tuple(ln.get_xdata()), tuple(ln.get_ydata())) for ln in ax.lines]
    assert sorted(lines) == sorted([((0, 1), (boundary, boundary)), ((boundary, boundary), (0, 1))])
    assert all(ln.get_color() == "k" and ln.get_linewidth() == 0.6 for ln in ax.lines)
    assert "ARI 1.0" in ax.get_title() and ax.get_title().startswith("lazy influence (rows: scoring client)")
    assert ax.get_xlabel() == "lazy model of client" and ax.get_ylabel() == "client"
    assert len(fig.axes) == 2  # the colour bar


def test_p2p_artifacts_list_the_beneficial_sets(p2p, tmp_path, monkeypatch):
    _figure_of(p2p.strategy, tmp_path, monkeypatch)
    clusters = json.loads((tmp_path / "pfedlia_clusters.json").read_text())
    assert clusters["beneficial-sets"] == {str(c): P2P_SETS[c] for c in CLIENTS}


def test_p2p_late_joiner_is_listed_with_minus_one_after_the_sets_of_the_clustering_round(tmp_path, monkeypatch):
    """docs "Artefacts": in p2p the assignment numbers the distinct sets of the clustering round 0, 1, ...; a late
    joiner, whose set is formed after them, is listed with -1."""
    late = 20
    fed = Federation(**{"lia-mode": "p2p"}, silent={(2, "lazy", late)}).run()
    _figure_of(fed.strategy, tmp_path, monkeypatch)
    assignment = json.loads((tmp_path / "pfedlia_clusters.json").read_text())["assignment"]
    assert assignment[str(late)] == -1
    others = {assignment[str(c)] for c in CLIENTS if c != late}
    assert others == set(range(len(others)))
    assert (
        json.loads((tmp_path / "pfedlia_clusters.json").read_text())["beneficial-sets"][str(late)]
        == fed.strategy.sets[late]
    )


def test_heatmap_colours_are_symmetric_around_zero_when_the_largest_magnitude_is_negative(tmp_path, monkeypatch):
    """The influence heatmap's diverging colour scale is centred on 0: [-L, L] with L the largest |I|, also when
    that largest value is a negative one (here every cross-group score is -9, the within-group ones 2)."""
    fed = Federation(influence=lambda i, j: 2.0 if PLANTED[i] == PLANTED[j] else -9.0).run()
    ax = _figure_of(fed.strategy, tmp_path, monkeypatch).axes[0]
    assert ax.images[0].get_clim() == (-9.0, 9.0)


def test_heatmap_of_an_all_zero_matrix_still_has_a_colour_scale(tmp_path, monkeypatch):
    """Nobody helps or hurts anybody: the matrix is all zeros and the scale falls back to [-1, 1] (not [0, 0])."""
    fed = Federation(influence=lambda i, j: 0.0, **{"optics-min-samples": 2}).run()
    ax = _figure_of(fed.strategy, tmp_path, monkeypatch).axes[0]
    assert ax.images[0].get_clim() == (-1.0, 1.0)


def test_heatmap_separates_a_cluster_of_one_first_row_and_says_ari_n_a_without_planted_groups(tmp_path, monkeypatch):
    """The heatmap draws a line between every two neighbouring rows of different clusters, also after the first row
    (here client 3, whose beneficial set is itself alone, is cluster 0 on its own); without planted groups the
    title says the ARI is not available."""

    def beneficial(i, lazy_ids):
        if i == 3:
            return []
        return [k for k, j in enumerate(lazy_ids) if PLANTED[j] == PLANTED[i] and j not in (i, 3)]

    fed = Federation(**{"lia-mode": "p2p"}, beneficial=beneficial, planted=False).run()
    s = fed.strategy
    assert s.assignment[3] == 0 and sorted(s.assignment.values()).count(0) == 1
    ax = _figure_of(s, tmp_path, monkeypatch).axes[0]
    horizontal = sorted(ln.get_ydata()[0] for ln in ax.lines if tuple(ln.get_xdata()) == (0, 1))
    order = sorted(CLIENTS, key=lambda c: (s.assignment[c], c))
    labels = [s.assignment[c] for c in order]
    assert horizontal == [k - 0.5 for k in range(1, len(labels)) if labels[k] != labels[k - 1]]
    assert horizontal[0] == 0.5
    assert ax.get_title().endswith("; ARI n/a")


def test_heatmap_of_two_clients_has_whole_number_ticks_and_a_colour_bar_of_its_image(tmp_path, monkeypatch):
    """Rows and columns are clients: both axes tick at whole numbers only (matplotlib would put half-way ticks on a
    2 x 2 heatmap); the colour bar belongs to the heatmap's image."""
    fed = Federation(clients=[3, 8]).run()
    fig = _figure_of(fed.strategy, tmp_path, monkeypatch)
    ax = fig.axes[0]
    for axis, (lo, hi) in ((ax.xaxis, ax.get_xlim()), (ax.yaxis, sorted(ax.get_ylim()))):
        inside = [t for t in axis.get_ticklocs() if lo <= t <= hi]
        assert inside and all(float(t).is_integer() for t in inside), inside
    assert ax.images[0].colorbar is not None and ax.images[0].colorbar.ax is fig.axes[1]


def test_a_run_that_never_clustered_writes_an_empty_clustering_and_no_matrix(tmp_path, monkeypatch):
    """Nobody answered the lazy query in the last round, so the clustering never happened: pfedlia_clusters.json
    says so (empty clustering and assignment, the planted groups as reported) and there is no influence matrix."""
    fed = Federation(rounds=2, silent={(2, "lazy", c) for c in CLIENTS}).run()
    assert _figure_of(fed.strategy, tmp_path, monkeypatch) is None
    clusters = json.loads((tmp_path / "pfedlia_clusters.json").read_text())
    assert clusters == {"clustering": {}, "assignment": {}, "planted": {str(c): PLANTED[c] for c in CLIENTS}}
    assert not (tmp_path / "pfedlia_influence.json").exists() and not (tmp_path / "pfedlia_influence.png").exists()


def test_oracle_artifacts_have_no_influence_matrix(tmp_path, monkeypatch):
    fed = Federation(method="oracle").run()
    assert _figure_of(fed.strategy, tmp_path, monkeypatch) is None
    assert (tmp_path / "pfedlia_clusters.json").exists() and not (tmp_path / "pfedlia_influence.json").exists()
    assert not (tmp_path / "pfedlia_influence.png").exists()


def test_a_single_client_is_its_own_cluster_and_its_bytes_are_per_client(tmp_path, monkeypatch):
    fed = Federation(rounds=2, clients=[8]).run()
    s = fed.strategy
    info, comm = s.clustering, s.history[1].extra["comm"]
    assert s.assignment == {8: 0} and info["clusters"] == 1 and info["clients-asked"] == 1
    assert info["bytes-down-per-client"] == comm["lazy-bytes-down"] + comm["lia-bytes-down"]
    assert info["bytes-up-per-client"] == comm["lazy-bytes-up"] + comm["lia-bytes-up"]
    _figure_of(s, tmp_path, monkeypatch)  # a 1 x 1 influence matrix is still written and drawn
    assert json.loads((tmp_path / "pfedlia_influence.json").read_text())["matrix"] == [[influence(8, 8)]]
    assert (tmp_path / "pfedlia_influence.png").exists()

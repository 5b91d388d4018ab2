"""What FedCAC's server writes (docs/methods/fedcac.md "Artefacts"): every round's diagnostics, the mask
overlaps at the first round, round beta and the last with their heat maps, the collaborators plot and the mask's
communication cost."""

import numpy as np
import pytest

from strategies.fedcac import FedCACStrategy
from strategies.fedcac_artifacts import write_artifacts
from task.config import parse_settings
from tests.fedcac.server_kit import NODES, Sent, kept_figures, play
from tests.strategy_harness import build_as


def test_the_artefacts_hold_every_rounds_diagnostics_the_overlaps_at_first_beta_and_last_round_and_the_mask_cost(
    tmp_path, monkeypatch
):
    """docs Artefacts: ``fedcac_rounds.json`` is every round's diagnostics; ``fedcac_overlap.json`` / ``.png`` the
    overlap matrix at the first round, round beta and the last (ordered by client id); the collaborators plot
    shows mean |C_i|, the threshold and the mean overlap per round with a line at beta;
    ``fedcac_communication.json`` the packed mask bytes against the float32 model."""
    import json

    import matplotlib.pyplot as plt

    figures = kept_figures(monkeypatch)
    beta, rounds = 2, 4
    strat = build_as(
        FedCACStrategy,
        parse_settings({"method": "fedcac", "model": "mlp", "min-nodes": 4, "beta": beta, "num-server-rounds": rounds}),
    )
    sent: Sent = {}
    play(strat, NODES, rounds, sent)
    write_artifacts(strat, tmp_path)

    logged = json.loads((tmp_path / "fedcac_rounds.json").read_text())
    diags = [h.extra["fedcac"] for h in strat.history]
    assert [r["round"] for r in logged] == list(range(1, rounds + 1))
    assert logged == json.loads(json.dumps([{"round": r + 1, **d} for r, d in enumerate(diags)]))

    n = sum(int(np.prod(s)) for s in strat.param_shapes.values())
    assert json.loads((tmp_path / "fedcac_communication.json").read_text()) == {
        "parameters": n,
        "float32-model-bytes": 4 * n,
        "packed-mask-bytes": -(-n // 8),
        "mask-to-model-ratio": pytest.approx(-(-n // 8) / (4 * n)),
    }

    overlaps = json.loads((tmp_path / "fedcac_overlap.json").read_text())
    assert list(overlaps) == ["1", str(beta), str(rounds)]
    assert overlaps == {str(r): strat.overlaps[r] for r in (1, beta, rounds)}

    assert len(figures) == 2
    heat, lines = figures
    panels = [ax for ax in heat.axes if ax.get_images()]
    assert len(panels) == 3 and len(heat.axes) == 6  # one panel per chosen round, each with its colour bar
    for ax, rnd in zip(panels, (1, beta, rounds), strict=False):
        assert f"round {rnd}" in ax.get_title() and "overlap" in ax.get_title()
        assert ax.get_xlabel() == "client" and ax.get_ylabel() == "client"
        (image,) = ax.get_images()
        assert image.get_clim() == (0, 1)
        entry = strat.overlaps[rnd]
        order = np.argsort(entry["partition-ids"])
        np.testing.assert_allclose(image.get_array(), np.array(entry["overlap"])[np.ix_(order, order)])
    assert tuple(heat.get_size_inches()) == pytest.approx((4.2 * 3, 3.8))
    for ax in panels:  # client ids are whole numbers: no tick at client 0.5
        for ticks in (ax.get_xticks(), ax.get_yticks()):
            inside = [t for t in ticks if -0.5 <= t <= 3.5]
            assert len(inside) >= 2 and all(float(t).is_integer() for t in inside)
    bars = [ax for ax in heat.axes if not ax.get_images()]
    for ax, bar in zip(panels, bars, strict=False):  # each colour bar is a thin strip beside its panel
        assert bar.get_position().width < 0.1 * ax.get_position().width
        assert bar.get_position().x0 >= ax.get_position().x1
    assert plt.imread(tmp_path / "fedcac_overlap.png").shape[:2] == (380, 1260)  # 100 dpi

    main = next(ax for ax in lines.axes if ax.get_ylabel() == "collaborators per client")
    twin = next(ax for ax in lines.axes if ax is not main)
    assert main.get_xlabel() == "round" and twin.get_ylabel() == "overlap"
    assert all(float(t).is_integer() for t in main.get_xticks())  # rounds are whole numbers
    xs = list(range(1, rounds + 1))
    series = {ln.get_label(): ln for ln in main.lines + twin.lines}
    for label, key in (
        ("mean |C_i|", "collaborators-mean"),
        ("threshold", "threshold"),
        ("mean overlap", "overlap-mean"),
    ):
        assert list(series[label].get_xdata()) == xs
        np.testing.assert_allclose(series[label].get_ydata(), [d[key] for d in diags])
    assert series["mean |C_i|"] in main.lines and series["threshold"] in twin.lines
    (vline,) = [ln for ln in main.lines if ln.get_label().startswith("_")]
    assert list(vline.get_xdata()) == [beta, beta]
    # the three series and the beta line are told apart by colour, and by line style in black and white too;
    # the count is marked at every round
    names = ("mean |C_i|", "threshold", "mean overlap")
    assert len({series[k].get_color() for k in names} | {vline.get_color()}) == 4
    assert len({series[k].get_linestyle() for k in names}) == 3
    assert series["mean |C_i|"].get_marker() not in (None, "None", "", " ")
    (legend,) = lines.legends
    assert sorted(t.get_text() for t in legend.get_texts()) == ["mean overlap", "mean |C_i|", "threshold"]
    assert tuple(lines.get_size_inches()) == pytest.approx((6, 3.5))
    assert plt.imread(tmp_path / "fedcac_collaborators.png").shape[:2] == (350, 600)
    for fig in figures:
        plt.close(fig)


def test_a_run_shorter_than_beta_shows_its_first_and_last_round_and_one_without_rounds_only_the_cost(
    tmp_path, monkeypatch
):
    """docs Artefacts: with fewer rounds than beta, round beta never came, so the overlap record and plot hold the
    first and the last round; before any aggregation there is nothing to plot and no mask was sent."""
    import json

    import matplotlib.figure

    figures = kept_figures(monkeypatch)
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda *a, **k: None)  # the content is what counts here
    strat = build_as(FedCACStrategy, parse_settings({"method": "fedcac", "model": "mlp", "min-nodes": 4, "beta": 5}))
    write_artifacts(strat, tmp_path)
    assert json.loads((tmp_path / "fedcac_rounds.json").read_text()) == []
    comm = json.loads((tmp_path / "fedcac_communication.json").read_text())
    assert comm["packed-mask-bytes"] is None and comm["mask-to-model-ratio"] is None
    assert not (tmp_path / "fedcac_overlap.json").exists() and not figures
    play(strat, NODES, 3, {})
    write_artifacts(strat, tmp_path)
    assert list(json.loads((tmp_path / "fedcac_overlap.json").read_text())) == ["1", "3"]
    panels = [ax for ax in figures[0].axes if ax.get_images()]
    assert [ax.get_title() for ax in panels] == ["mask overlap, round 1", "mask overlap, round 3"]

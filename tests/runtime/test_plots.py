"""What every plot of a run shares (strategies/plots.py): whole-number ticks where asked, PNGs at 100 dpi."""

import matplotlib.image
from matplotlib.ticker import MaxNLocator

from strategies.plots import integer_ticks, pyplot, save


def test_whole_number_ticks_go_on_the_x_axis_and_on_the_y_axis_only_when_asked():
    plt = pyplot()
    fig, (rounds, both) = plt.subplots(1, 2)
    y_before = type(rounds.yaxis.get_major_locator())
    integer_ticks(rounds)
    integer_ticks(both, y=True)
    assert isinstance(rounds.xaxis.get_major_locator(), MaxNLocator)
    assert type(rounds.yaxis.get_major_locator()) is y_before and y_before is not MaxNLocator
    assert isinstance(both.yaxis.get_major_locator(), MaxNLocator)
    plt.close(fig)


def test_a_plot_is_saved_at_100_dpi_whatever_the_figures_own_dpi(tmp_path):
    plt = pyplot()
    fig = plt.figure(figsize=(3, 2), dpi=40)
    fig.add_subplot().plot([1, 2, 3])
    save(plt, fig, tmp_path / "plot.png")
    assert matplotlib.image.imread(tmp_path / "plot.png").shape[:2] == (200, 300)
    assert fig.number not in plt.get_fignums()

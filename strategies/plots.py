"""What every plot of a run shares: matplotlib without a screen, and whole-number ticks on round and client
axes (a round 2.5 or a client 7.5 does not exist)."""

from __future__ import annotations


def pyplot():
    """matplotlib.pyplot on the Agg backend (imported only when a run writes its plots)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def integer_ticks(*axes, x: bool = True, y: bool = False) -> None:
    """Whole-number ticks on the x (and optionally y) axis of each of ``axes``."""
    from matplotlib.ticker import MaxNLocator

    for ax in axes:
        if x:
            ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        if y:
            ax.yaxis.set_major_locator(MaxNLocator(integer=True))


def save(plt, fig, path) -> None:
    """Write ``fig`` as a PNG at ``path`` (tight layout, 100 dpi) and close it with ``plt`` (the pyplot that made
    it)."""
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)

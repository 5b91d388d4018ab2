"""How many clients a run's reported means speak for, and the least share they may (run-config ``min-coverage``).

A mean over clients in a run's summary is taken over the valid replies of one phase: the personalized and global
accuracy and loss, their spread over clients and the honest clients' accuracy over the final evaluation's, the
accuracy after local training over the last round's train replies, the newcomers' accuracies over the held-out
clients' replies.  A client whose replies were rejected (failures.json says why) or that never answered is not in
them.  :func:`coverage` says of each how many clients of those asked it covers; when any covers fewer than
``min-coverage`` of them the ServerApp ends the run as failed (:func:`shortfall`; aborted, exit 5 from
``python -m server_app.job``), and the summary says "over k of N clients" wherever a mean covers fewer than all.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from strategies.outcome import RoundLog

#: what each part of the coverage speaks for, in the words of the summary
WHAT = {
    "evaluation": "the final evaluation (personalized and global accuracy and loss, their spread over clients)",
    "training": "the last round's training (the accuracy after local training)",
    "newcomers": "the newcomers' evaluation (held-out clients)",
}


@dataclass(frozen=True)
class Covered:
    """``covered`` of the ``total`` clients asked sent a valid reply to the phase a mean is taken over."""

    covered: int
    total: int

    @property
    def share(self) -> float:
        return self.covered / self.total

    def as_dict(self) -> dict[str, Any]:
        return {"covered": self.covered, "total": self.total}


def _counted(metrics: Mapping[str, Any]) -> Covered | None:
    replied, asked = metrics.get("num-replies"), metrics.get("num-asked")
    if replied is None or not asked:  # not asked (or a round recorded before num-asked was)
        return None
    return Covered(int(replied), int(asked))


def coverage(history: Sequence[RoundLog]) -> dict[str, Covered]:
    """Each mean's coverage at the end of a run (:data:`WHAT` names them): only those the run has."""
    if not history:
        return {}
    last, out = history[-1], {}
    if (evaluated := _counted(last.evaluate)) is not None:
        out["evaluation"] = evaluated
    if (trained := _counted(last.train)) is not None:
        out["training"] = trained
    newcomers = last.extra.get("newcomers")
    if isinstance(newcomers, Mapping) and newcomers.get("asked"):
        out["newcomers"] = Covered(len(newcomers.get("clients", [])), len(newcomers["asked"]))
    return out


def shortfall(covered: Mapping[str, Covered], min_share: float) -> str | None:
    """Why the run fails: each mean that covers less than ``min_share`` of the clients asked (None: none does)."""
    short = [f"{WHAT[k]} covers {c.covered} of {c.total} clients" for k, c in covered.items() if c.share < min_share]
    if not short:
        return None
    return (
        f"{'; '.join(short)}: less than min-coverage={min_share:g} of the clients asked, too few for a mean over "
        "clients (failures.json says why each other client's reply was rejected)"
    )


def summary_entry(covered: Mapping[str, Covered], min_share: float) -> dict[str, Any]:
    """``summary.json``'s ``coverage``: the final evaluation's ``covered`` / ``total`` (what the headline accuracy
    speaks for; None without one), whether every mean ``met`` ``min-share``, and each mean's own (``by-mean``)."""
    evaluated = covered.get("evaluation")
    return {
        "covered": evaluated.covered if evaluated else None,
        "total": evaluated.total if evaluated else None,
        "min-share": min_share,
        "met": shortfall(covered, min_share) is None,
        "by-mean": {k: c.as_dict() for k, c in covered.items()},
    }

"""Held-out clients (newcomers): clients that never take part in training, and what a method gives them at the end.

Run-config ``holdout-clients`` = k holds out the k clients with the largest partition ids among those connected when
the run's first round starts (in simulation every node is connected then: the last k partition ids; in deployment
start every node first, ``min-nodes`` = all of them).  A held-out client never trains: the base leaves its node out
of the nodes of every round before the method sees them, so it is never in a cohort, a query, an evaluation or an
aggregate, and its data influences nothing (the base only asks it once who it is, ``query.identify``, to know that
it is held out).  A client that connects later with a partition id at or above the smallest held-out one is held
out too.

After the last round every held-out client gets a ``query.newcomer`` message carrying what the method gives a client
that never trained (the strategy's :meth:`~strategies.base.PersonalizedStrategy.newcomer_payloads`; by default what
an evaluate message gives a client the server knows nothing about: the global model where there is one, every
cluster or tier model where the client chooses).  The client builds from it the model the method gives a newcomer
(:meth:`client_app.base.ClientMethod.newcomer_model`), scores it on its test split (``newcomer-acc``), trains it for
``local-epochs`` on its own training split with the run's optimiser and scores it again
(``newcomer-finetuned-acc``).  :func:`evaluate_newcomers` runs that phase and :class:`Holdout` keeps which clients are
held out and what they replied; the run's summary reports the means over the held-out clients and ``clients.csv``
each one's.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.app import MessageType

from strategies.exchange import RunAborted
from strategies.outcome import NEWCOMER_METRICS
from strategies.replies import ACCURACY, BASE, COUNT, LOSS, Disclosure, Part
from task.methods import NEWCOMER

if TYPE_CHECKING:
    from flwr.serverapp import Grid

#: what a newcomer's reply carries: the accuracy (and loss) of the model the method gives it, before and after
#: fine-tuning, on its test split
NEWCOMER_SPEC = BASE.with_metrics(
    **{
        "newcomer-acc": ACCURACY,
        "newcomer-loss": LOSS,
        "newcomer-finetuned-acc": ACCURACY,
        "newcomer-finetuned-loss": LOSS,
        "test-examples": replace(COUNT, required=False),
    }
)


class Holdout:
    """Which clients are held out of training (``holdout-clients``), and what each replied as a newcomer."""

    def __init__(self, count: int) -> None:
        self.count = count
        #: the smallest held-out client id, fixed by the first round's clients (-1: not yet, or nothing held out)
        self.first = -1
        #: held-out client id -> its newcomer reply's metrics
        self.results: dict[int, dict[str, float]] = {}

    def state(self) -> dict[str, Any]:
        """What a checkpoint keeps: which clients are held out (fixed once, by the first round's clients)."""
        return {"holdout-first": self.first}

    def restore(self, state: Mapping[str, Any]) -> None:
        self.first = int(state.get("holdout-first", -1))  # a checkpoint from before holdouts: not fixed yet

    def fix(self, clients: Iterable[int]) -> None:
        """Hold out the ``count`` largest of ``clients`` (the first clients known), unless that is already done or
        no client is known yet; raises :class:`RunAborted` when no client would be left to train."""
        known = sorted(set(clients))
        if not self.count or self.first >= 0 or not known:
            return
        if len(known) <= self.count:
            raise RunAborted(
                f"holdout-clients={self.count} holds out every one of the {len(known)} clients connected at the start "
                f"(partition ids {known}): none would train; use holdout-clients < {len(known)} or start more nodes"
            )
        self.first = known[-self.count]

    def held_out(self, client: int) -> bool:
        return self.first >= 0 and client >= self.first

    def training(self, nodes: Iterable[int], client_of: Mapping[int, int]) -> list[int]:
        """``nodes`` without the held-out ones (and without nodes whose client is unknown, which cannot be told
        apart); all of ``nodes`` when nothing is held out."""
        nodes = list(nodes)
        if not self.count:
            return nodes
        self.fix(client_of[n] for n in nodes if n in client_of)
        return [n for n in nodes if n in client_of and not self.held_out(client_of[n])]

    def newcomers(self, nodes: Iterable[int], client_of: Mapping[int, int]) -> list[int]:
        """The held-out nodes among ``nodes``."""
        return [n for n in nodes if n in client_of and self.held_out(client_of[n])]

    def means(self) -> dict[str, float]:
        """Each newcomer metric's mean over the held-out clients that replied."""
        return {
            key: float(np.mean([m[key] for m in self.results.values()]))
            for key in NEWCOMER_METRICS
            if any(key in m for m in self.results.values())
        }


class SameAsEvaluate(Mapping[str, Part]):
    """What a ``query.newcomer`` message brings when it is what an evaluate message brings: the records of the
    declaration's ``evaluate`` entry, read when asked, so a method that declares its own evaluate message (after the
    base's declaration) declares its newcomer message with it."""

    def __init__(self, declared: Mapping[str, Disclosure]) -> None:
        self._declared = declared

    def _parts(self) -> Mapping[str, Part]:
        return self._declared[MessageType.EVALUATE].receives

    def __getitem__(self, key: str) -> Part:
        return self._parts()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._parts())

    def __len__(self) -> int:
        return len(self._parts())


def newcomer_disclosure(strategy: Any, declared: Mapping[str, Disclosure]) -> Disclosure:
    """The ``query.newcomer`` entry of ``strategy``'s declaration (a :class:`strategies.base.PersonalizedStrategy`,
    which imports this module): its reply's metrics, and what the message brings
    (the method's :meth:`newcomer_receives`, by default what its evaluate message brings)."""
    receives = strategy.newcomer_receives()
    return Disclosure(
        strategy.sends(NEWCOMER),
        receives if receives is not None else SameAsEvaluate(declared),
        "how well the model the federation gives a newcomer fits its data, before and after fine-tuning on it",
    )


def evaluate_newcomers(strategy: Any, grid: Grid, server_round: int) -> dict[str, Any]:
    """After the last round (``server_round``): every connected held-out client scores what the method gives a
    newcomer (``query.newcomer``); their metrics go into ``strategy.holdout.results`` and the means, with each client's
    and the phase's bytes, into the last round's history entry (``newcomers``), which this returns."""
    nodes = strategy.loop.available_nodes(grid)
    strategy.identify(grid, server_round, nodes)  # a held-out node that connected late is known only now
    newcomers = strategy.holdout.newcomers(nodes, strategy.client_of)
    if not newcomers:
        entry: dict[str, Any] = {"clients": []}
    else:
        payloads = strategy.newcomer_payloads(grid, server_round, newcomers)
        for reply in strategy.send_query(grid, server_round, NEWCOMER, payloads):
            strategy.holdout.results[reply.client] = {
                k: float(v) for k, v in reply.metrics.items() if isinstance(v, (int, float))
            }
        entry = {"clients": sorted(strategy.holdout.results), **strategy.holdout.means()}
        entry["per-client"] = {c: strategy.holdout.results[c] for c in sorted(strategy.holdout.results)}
    entry["asked"] = sorted(strategy.client_of[n] for n in newcomers)
    entry["comm"] = strategy.exchange.comm.pop(server_round, {})
    if strategy.history:
        strategy.history[-1].extra["newcomers"] = entry
    return entry

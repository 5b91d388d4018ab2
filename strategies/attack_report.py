"""What a run reports under an injected attack or a robust aggregation rule (docs/robustness.md): the honest
clients' accuracy (the attackers' own left out), the backdoor's success on honest clients, and whether the method's
own mechanism isolated the attackers: their cluster or tier, the influence weight peers gave them, whether they were
chosen as collaborators, whether the aggregation rule kept or clipped their models.

The server knows which clients attack from the run config alone (:func:`task.attacks.is_attacker`): an experiment's
bookkeeping, which no method reads.  Everything here reads a strategy's history and the state it keeps anyway; it
changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from typing import Any

import numpy as np

from strategies.outcome import BACKDOOR
from strategies.replies import ACCURACY, ReplySpec
from task.attacks import BACKDOOR_ATTACKS, attackers


def with_attack_metrics(spec: ReplySpec, settings: Any) -> ReplySpec:
    """An evaluate reply's spec with ``backdoor-success`` (a share in [0, 1]; absent on a client with no test input
    of another class than the target) under ``attack='backdoor'``."""
    if settings.attacks.attack not in BACKDOOR_ATTACKS:
        return spec
    return spec.with_metrics(**{BACKDOOR: replace(ACCURACY, required=False)})


def _mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return float(np.mean(values)) if values else None


def honest_metrics(settings: Any, updates: Sequence[Any]) -> dict[str, float]:
    """A round's evaluation means over the honest clients' replies (and the attackers' personalized accuracy
    apart): ``honest-personal-acc``, ``honest-global-acc``, ``attackers-personal-acc``, ``backdoor-success``; nothing
    without an attack."""
    if not settings.attacks.active:
        return {}
    bad = set(attackers(settings.attacks, [u.client for u in updates]))
    honest = [u for u in updates if u.client not in bad]
    out = {
        "honest-personal-acc": _mean(u.metrics["personal-acc"] for u in honest if "personal-acc" in u.metrics),
        "honest-global-acc": _mean(u.metrics["global-acc"] for u in honest if "global-acc" in u.metrics),
        "attackers-personal-acc": _mean(
            u.metrics["personal-acc"] for u in updates if u.client in bad and "personal-acc" in u.metrics
        ),
        BACKDOOR: _mean(u.metrics[BACKDOOR] for u in honest if BACKDOOR in u.metrics),
    }
    out["honest-replies"] = float(len(honest))
    return {k: v for k, v in out.items() if v is not None}


# ---------------------------------------------------------------------------------------------- the method's mechanism
def grouping(groups: Mapping[int, Any], bad: set[int]) -> dict[str, Any]:
    """Clusters or tiers (client -> group): each attacker's group, how many honest clients share a group with an
    attacker, and whether none does (``isolated``)."""
    attacker_groups = {a: groups[a] for a in sorted(bad) if a in groups}
    honest = [c for c in groups if c not in bad]
    exposed = sorted(c for c in honest if groups[c] in set(attacker_groups.values()))
    return {
        "of-attackers": {str(a): g for a, g in attacker_groups.items()},
        "honest-with-an-attacker": len(exposed),
        "honest": len(honest),
        "isolated": bool(attacker_groups) and not exposed,
    }


def _collaborators(history: Sequence[Any], bad: set[int]) -> dict[str, Any]:
    """FedCAC: per round, the honest clients that chose an attacker as a collaborator, and how many times each
    attacker was chosen by an honest client."""
    rounds = {}
    for r in history:
        chosen = r.extra.get("fedcac", {}).get("collaborators")
        if chosen is None:
            continue
        pairs = [(int(i), int(j)) for i, js in chosen.items() for j in js if int(i) not in bad and int(j) in bad]
        rounds[str(r.server_round)] = {
            "honest-choosing-an-attacker": len({i for i, _ in pairs}),
            "times-attackers-chosen": len(pairs),
        }
    return {
        "by-round": rounds,
        "isolated": bool(rounds) and all(v["honest-choosing-an-attacker"] == 0 for v in rounds.values()),
    }


def _influence(influence: Mapping[int, Mapping[int, Mapping[int, float]]], bad: set[int]) -> dict[str, Any]:
    """FedC2I: per round, the mean influence weight honest clients gave an attacker's model and an honest peer's
    (their own weight left out)."""
    rounds = {}
    for r, rows in sorted(influence.items()):
        to_attackers: list[float] = []
        to_honest: list[float] = []
        for client, row in rows.items():
            if client in bad:
                continue
            for peer, weight in row.items():
                if peer != client:
                    (to_attackers if peer in bad else to_honest).append(weight)
        rounds[str(r)] = {"to-an-attacker": _mean(to_attackers), "to-an-honest-peer": _mean(to_honest)}
    return {"mean-weight-by-round": rounds}


def _pifl(strategy: Any, bad: set[int]) -> dict[str, Any]:
    """PI-FL: the tiers the attackers won in the last round, their Shapley scores and tokens against the honest
    clients', and how often each kind won a slot."""
    scores = [(c, s) for tier in strategy.scores.values() for c, s in tier.items()]
    wins: dict[int, int] = {}
    for entry in strategy.ledger_log:
        for tier in entry["tiers"].values():
            for c in tier["members"]:
                wins[c] = wins.get(c, 0) + 1
    balances = strategy.ledger.balances if strategy.ledger is not None else {}
    return {
        "last-tiers": grouping(dict(strategy.tier_of), bad),
        "mean-shapley-score": {
            "attackers": _mean(s for c, s in scores if c in bad),
            "honest": _mean(s for c, s in scores if c not in bad),
        },
        "mean-tokens": {
            "attackers": _mean(b for c, b in balances.items() if c in bad),
            "honest": _mean(b for c, b in balances.items() if c not in bad),
        },
        "mean-slots-won": {
            "attackers": _mean(wins.get(c, 0) for c in balances if c in bad),
            "honest": _mean(wins.get(c, 0) for c in balances if c not in bad),
        },
    }


def _client2vec(strategy: Any, bad: set[int]) -> dict[str, Any]:
    """Client2Vec: per round, the attackers' share of the aggregation weight against their share of the cohort."""
    rounds = {}
    for r, weights in sorted(strategy.agg_weights.items()):
        total = sum(weights.values()) or 1.0
        rounds[str(r)] = {
            "attackers-weight-share": sum(w for c, w in weights.items() if c in bad) / total,
            "attackers-cohort-share": sum(1 for c in weights if c in bad) / max(1, len(weights)),
        }
    return {"by-round": rounds}


def mechanism(strategy: Any, bad: set[int]) -> dict[str, Any]:
    """What the method's own mechanism did with the attackers (empty for a method without one: the FedAvg family)."""
    method = strategy.name
    if method == "cfl":
        return {"clusters": grouping(dict(strategy.cluster_of), bad)}
    if method in ("pfedlia", "oracle") and strategy.clustered:
        if strategy.mode == "p2p":
            exposed = sorted(c for c, members in strategy.sets.items() if c not in bad and set(members) & bad)
            return {"beneficial-sets": {"honest-with-an-attacker": len(exposed), "isolated": not exposed}}
        return {"clusters": grouping(dict(strategy.assignment), bad)}
    if method == "ifca" and strategy.choices:
        return {"clusters": grouping(strategy.choices[max(strategy.choices)], bad)}
    if method == "fedsoft" and strategy.u:
        return {"favoured-centres": grouping({c: int(np.argmax(u)) for c, u in strategy.u.items()}, bad)}
    if method in ("pifl", "pifl-ni"):
        return {"tiers": _pifl(strategy, bad)}
    if method == "fedcac":
        return {"collaborators": _collaborators(strategy.history, bad)}
    if method == "fedc2i":
        return {"influence": _influence(strategy.influence, bad)}
    if method == "client2vec" and strategy.enabled:
        return {"index-weights": _client2vec(strategy, bad)}
    return {}


def rule_outcome(history: Sequence[Any], bad: set[int]) -> dict[str, Any]:
    """What the aggregation rule did over the run (the rounds' ``robust`` entries): of every attacker's and every
    honest client's models offered to it, the share Multi-Krum or Bulyan kept, the share norm-bound clipped and the
    mean trust FLTrust gave them; and in how many averages more clients lied than the rule's guarantee allows."""
    offered = {"attackers": 0, "honest": 0}
    kept = {"attackers": 0, "honest": 0}
    clipped = {"attackers": 0, "honest": 0}
    trust: dict[str, list[float]] = {"attackers": [], "honest": []}
    entries = [e for r in history for e in r.extra.get("robust", [])]
    for entry in entries:
        scores = dict(zip(entry["clients"], entry["trust"], strict=True)) if "trust" in entry else {}
        for c in entry["clients"]:
            kind = "attackers" if c in bad else "honest"
            offered[kind] += 1
            kept[kind] += int("selected" in entry and c in entry["selected"])
            clipped[kind] += int("clipped" in entry and c in entry["clipped"])
            if c in scores:
                trust[kind].append(scores[c])
    if not any(offered.values()):
        return {}
    share = {k: (v / offered[k] if offered[k] else None) for k, v in kept.items()}
    out: dict[str, Any] = {"models-offered": offered}
    if any("selected" in e for e in entries):
        out["share-kept"] = share
        out["isolated"] = offered["attackers"] > 0 and kept["attackers"] == 0
    if any("clipped" in e for e in entries):
        out["share-clipped"] = {k: (v / offered[k] if offered[k] else None) for k, v in clipped.items()}
    if any("trust" in e for e in entries):
        out["mean-trust"] = {k: _mean(v) for k, v in trust.items()}
    judged = [e for e in entries if "outside-assumption" in e]
    if judged:
        out["outside-assumption"] = {
            "averages": sum(bool(e["outside-assumption"]) for e in judged),
            "of": len(judged),
            "most-liars": max(e["liars"] for e in judged),
        }
    return out


def report(strategy: Any) -> dict[str, Any]:
    """The run's robustness record (``robustness.json``): the attack and the rule, the attackers, each round's honest
    means, what the method's mechanism and the rule did with the attackers.  Empty for a run with neither."""
    settings = strategy.settings
    rule, attack = settings.robust, settings.attacks
    if not attack.active and rule.aggregator == "mean":
        return {}
    clients = sorted(set(strategy.client_of.values()))
    bad = set(attackers(attack, clients))
    out: dict[str, Any] = {
        "attack": attack.attack,
        "aggregator": rule.aggregator,
        "clients": clients,
        "attackers": sorted(bad),
    }
    if attack.active:
        out.update({"attack-share": attack.attack_share, "attack-start": attack.attack_start})
        if attack.attack_num_examples:  # the size lie
            out["claimed-examples"] = attack.attack_num_examples
    keys = ("honest-personal-acc", "honest-global-acc", "attackers-personal-acc", BACKDOOR)
    out["by-round"] = {
        str(r.server_round): {k: r.evaluate[k] for k in keys if k in r.evaluate} for r in strategy.history
    }
    out["mechanism"] = mechanism(strategy, bad)
    out["rule"] = rule_outcome(strategy.history, bad)
    return out

"""The attacks of run-config ``attack`` (task/attacks.py), applied by the ClientApp of an attacking partition as
faults: its training data at set-up, its train reply's model, its side channel, its evaluation.  Honest clients
measure the backdoor (:func:`task.attacks.backdoor_metrics`).  docs/robustness.md states each change; tests/robust
pin them.

Every function returns what it was given unless the client attacks in this round (:func:`task.attacks.attacking`),
so an honest client's replies are exactly what they would be without this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from flwr.app import ConfigRecord, MetricRecord, RecordDict

from client_app.attack_math import alie, min_max, min_sum
from client_app.privacy import VARIANCE_SUFFIX
from task.attacks import (
    DATA_ATTACKS,
    KNOWING_ATTACKS,
    MODEL_ATTACKS,
    AttackOptions,
    attack_rng,
    attackers,
    attacking,
    poisoned_data,
)
from task.params import load_record, record_to_numpy, to_record

if TYPE_CHECKING:
    from client_app.base import ClientMethod

#: FedSoft's floor under every importance weight (client_app/fedsoft.py's SIGMA): a forged vector keeps it, so it
#: is a distribution the server accepts
FEDSOFT_FLOOR = 1e-4


def _attacks(method: ClientMethod) -> bool:
    return attacking(method.settings.attacks, method.partition_id, method.server_round)


# ---------------------------------------------------------------------------------------------- data
def poison(method: ClientMethod) -> None:
    """label-flip / backdoor / model-replacement: the attacker's training split is poisoned
    (task.attacks.poisoned_data) for this message, from round ``attack-start`` on."""
    options = method.settings.attacks
    if options.attack in DATA_ATTACKS and _attacks(method):
        s = method.settings
        method.data = poisoned_data(method.data, options, s.num_classes, s.seed, method.partition_id)


# ---------------------------------------------------------------------------------------------- the model sent back
def _floating(a: np.ndarray) -> bool:
    return bool(np.issubdtype(a.dtype, np.floating))


def _stacked(message: RecordDict, key: str) -> dict[str, np.ndarray]:
    if key not in message.array_records:
        raise ValueError(f"the train message carries no {key!r} record to attack against")
    return record_to_numpy(message.array_records[key])


def received_model(method: str, message: RecordDict, reply: RecordDict) -> dict[str, np.ndarray]:
    """The model a client received that its train reply's ``arrays`` replace (the reference of a model attack):

    - IFCA: the cluster model it chose (the reply's ``cluster``);
    - FedSoft: the mix of the centres by the importance weights the message brought (what its training is pulled to);
    - FedCAC: the global average (``global``);
    - FedC2I: its own latest model as the server holds it (the first of ``peers``);
    - every other method: the model the message brought (``arrays``).
    """
    if method == "ifca":
        reported: Mapping[str, Any] = reply.metric_records["metrics"]
        cluster = int(reported["cluster"])
        return {k: v[cluster] for k, v in _stacked(message, "tiers").items()}
    if method == "fedsoft":
        centres = _stacked(message, "tiers")
        k = next(iter(centres.values())).shape[0]
        soft = message.config_records.get("fedsoft")
        u = np.asarray(soft["u"] if soft is not None else np.full(k, 1.0 / k), dtype=np.float64)
        u = u / u.sum()
        return {
            name: np.tensordot(u, v.astype(np.float64), axes=1).astype(v.dtype) if _floating(v) else v[int(u.argmax())]
            for name, v in centres.items()
        }
    if method == "fedcac":
        return _stacked(message, "global")
    if method == "fedc2i":
        return {k: v[0] for k, v in _stacked(message, "peers").items()}
    return _stacked(message, "arrays")


def poisoned_model(
    kind: str,
    trained: Mapping[str, np.ndarray],
    received: Mapping[str, np.ndarray],
    options: AttackOptions,
    rng: np.random.Generator,
) -> dict[str, np.ndarray]:
    """The model a model attack sends instead of ``trained``, against ``received`` (``r``), array by array:

    - ``sign-flip``: ``r - attack-scale * (w - r)`` on floating arrays;
    - ``model-replacement``: ``r + attack-scale * (w - r)`` on floating arrays (``w`` trained on backdoored data);
    - ``noise``: ``r + N(0, attack-noise^2)`` on floating arrays, drawn from ``rng`` in the arrays' order;
    - ``free-rider``: ``r`` on every array.

    An array ``received`` lacks, and an integer array under sign-flip and noise, is sent as trained; a BatchNorm
    running variance is kept >= 0 (``max(v, 0)``), so the reply stays one the server accepts.
    """
    out = {}
    for name, value_trained in trained.items():
        w = np.asarray(value_trained)
        if name not in received or (kind != "free-rider" and not _floating(w)):
            out[name] = np.array(w)
            continue
        r = np.asarray(received[name])
        if kind in ("sign-flip", "model-replacement"):
            sign = -1.0 if kind == "sign-flip" else 1.0
            value = r.astype(np.float64) + sign * options.attack_scale * (w.astype(np.float64) - r.astype(np.float64))
        elif kind == "noise":
            value = r.astype(np.float64) + rng.normal(0.0, options.attack_noise, size=w.shape)
        elif kind == "free-rider":
            value = r
        else:
            raise ValueError(f"{kind!r} is not a model attack ({MODEL_ATTACKS})")
        if name.endswith(VARIANCE_SUFFIX):  # a well-formed lie: a variance stays >= 0, as the server requires
            value = np.maximum(value, 0)
        out[name] = np.asarray(value).astype(w.dtype)
    return out


def all_ones_mask(method: ClientMethod) -> np.ndarray:
    """FedCAC's packed critical mask with every parameter marked critical."""
    from task.methods.fedcac import pack_masks

    model = method.reset_model()
    keys = [n for n, _ in model.named_parameters()]
    return pack_masks({n: torch.ones_like(p, dtype=torch.bool) for n, p in model.named_parameters()}, keys)


def floating_keys(trained: Mapping[str, np.ndarray], received: Mapping[str, np.ndarray]) -> list[str]:
    """The arrays a crafted update moves: the floating arrays of the reply that the received model has too."""
    return [k for k, v in trained.items() if k in received and _floating(np.asarray(v))]


def benign_updates(method: ClientMethod, received: Mapping[str, np.ndarray], keys: list[str]) -> np.ndarray:
    """The honest updates an attack that knows them estimates (k x d, the ``keys`` flattened): from ``received``, one
    local training on each client's training split as that client trains in this round (the run's optimizer and
    local epochs, the client's own seed), every partition of the embedded data set.  This is the strongest attacker
    of Shejwalkar and Houmansadr's taxonomy, who knows every client's data (an attacker who knew less would estimate
    worse); it needs the partitions (node config ``num-partitions``)."""
    from task.data import load_client_data
    from task.data.clients import default_cache_dir
    from task.train import train

    s, n = method.settings, method.num_partitions
    if n < 1:
        raise ValueError(
            f"attack={s.attacks.attack!r} estimates the honest updates from every client's training split of the "
            "embedded data set; this node has its own data file and no node config 'num-partitions'"
        )
    cache = str(method.context.node_config.get("cache-dir", default_cache_dir())) or None
    rows = []
    for pid in range(n):
        data = load_client_data(s.data, pid, n, cache)
        model = method.reset_model()
        load_record(model, {k: np.asarray(v) for k, v in received.items() if k in model.state_dict()})
        train(
            model,
            data.x_train,
            data.y_train,
            epochs=s.local_epochs,
            batch_size=s.batch_size,
            lr=s.lr,
            momentum=s.momentum,
            weight_decay=s.weight_decay,
            seed=int(s.seed) * 100_003 + pid + 7919 * method.server_round,  # as partition pid seeds its own
            optimizer=s.optimizer,
        )
        state = model.state_dict()
        rows.append(
            np.concatenate(
                [
                    (state[k].detach().cpu().numpy().astype(np.float64) - np.asarray(received[k], np.float64)).ravel()
                    for k in keys
                ]
            )
        )
    return np.stack(rows)


def crafted_model(
    kind: str,
    trained: Mapping[str, np.ndarray],
    received: Mapping[str, np.ndarray],
    benign: np.ndarray,
    keys: list[str],
    clients: int,
    liars: int,
) -> dict[str, np.ndarray]:
    """The model an attack that knows the honest updates sends: ``received`` plus the update
    client_app/attack_math.py crafts from ``benign`` (ALIE with ``clients`` and ``liars``, min-max, min-sum) on the
    ``keys``; every other array as trained (a BatchNorm running variance kept >= 0)."""
    if kind == "alie":
        update = alie(benign, clients, liars)
    elif kind == "min-max":
        update = min_max(benign)[0]
    elif kind == "min-sum":
        update = min_sum(benign)[0]
    else:
        raise ValueError(f"{kind!r} is not an attack that knows the honest updates ({KNOWING_ATTACKS})")
    out = {k: np.array(v) for k, v in trained.items()}
    pos = 0
    for k in keys:
        r = np.asarray(received[k])
        value = r.astype(np.float64) + update[pos : pos + r.size].reshape(r.shape)
        pos += r.size
        if k.endswith(VARIANCE_SUFFIX):
            value = np.maximum(value, 0)
        out[k] = value.astype(np.asarray(trained[k]).dtype)
    return out


def worst_cluster(method: ClientMethod, message: RecordDict) -> int:
    """IFCA: the cluster model with the highest loss on the client's training split (the first such)."""
    from client_app.ifca import cluster_losses

    losses = cluster_losses(method, message, method.data.x_train, method.data.y_train)
    return int(np.argmax(losses))


def train_reply(method: ClientMethod, message: RecordDict, reply: RecordDict) -> RecordDict:
    """An attacker's train reply: its model replaced (the model attacks: :func:`poisoned_model` against
    :func:`received_model`, or :func:`crafted_model` from :func:`benign_updates`), FedCAC's mask set to all ones or
    IFCA's chosen cluster set to the one that fits it worst (side-channel), and its claimed size set to
    ``attack-num-examples`` (the size lie, with any attack)."""
    if not _attacks(method):
        return reply
    options, s = method.settings.attacks, method.settings
    if options.attack in MODEL_ATTACKS and "arrays" in reply.array_records:
        trained = record_to_numpy(reply.array_records["arrays"])
        received = received_model(s.method, message, reply)
        if options.attack in KNOWING_ATTACKS:
            keys = floating_keys(trained, received)
            benign = benign_updates(method, received, keys)
            clients = method.num_partitions
            liars = len(attackers(options, range(clients)))
            reply["arrays"] = to_record(crafted_model(options.attack, trained, received, benign, keys, clients, liars))
        else:
            rng = attack_rng(s.seed, method.partition_id, method.server_round)
            reply["arrays"] = to_record(poisoned_model(options.attack, trained, received, options, rng))
    if options.attack == "side-channel" and s.method == "fedcac" and "mask" in reply.array_records:
        reply["mask"] = to_record({"bits": all_ones_mask(method)})
    if options.attack == "side-channel" and "evaluation" in reply.metric_records:
        reply["evaluation"] = MetricRecord(evaluation_metrics(method, dict(reply.metric_records["evaluation"])))
    metrics = dict(reply.metric_records["metrics"]) if "metrics" in reply.metric_records else None
    if metrics is not None and options.attack == "side-channel" and s.method == "ifca" and "cluster" in metrics:
        metrics["cluster"] = worst_cluster(method, message)
    if metrics is not None and options.attack_num_examples and "num-examples" in metrics:
        metrics["num-examples"] = options.attack_num_examples
    if metrics is not None and metrics != dict(reply.metric_records["metrics"]):
        reply["metrics"] = MetricRecord(metrics)
    return reply


# ---------------------------------------------------------------------------------------------- side channels
def evaluation_metrics(method: ClientMethod, metrics: dict[str, Any]) -> dict[str, Any]:
    """An attacker's evaluation under side-channel: PI-FL's tier accuracies all 1 (they set the tiers' utility)."""
    if (
        _attacks(method)
        and method.settings.attacks.attack == "side-channel"
        and method.settings.method in ("pifl", "pifl-ni")
        and "tier-acc" in metrics
    ):
        metrics["tier-acc"] = [1.0] * len(metrics["tier-acc"])
    return metrics


def evaluate_reply(method: ClientMethod, reply: RecordDict) -> RecordDict:
    """An attacker's evaluate reply (:func:`evaluation_metrics`)."""
    if _attacks(method) and method.settings.attacks.attack == "side-channel" and "metrics" in reply.metric_records:
        reply["metrics"] = MetricRecord(evaluation_metrics(method, dict(reply.metric_records["metrics"])))
    return reply


def misplaced_bid(true_accuracies: list[float], balance: int, price: int, max_bids: int) -> list[int]:
    """PI-FL: the ``max_bids`` tiers with the lowest true accuracy (ties to the lower tier), whenever the client can
    pay, whatever the bid threshold says: its updates land in the tiers of the clients least like it."""
    if balance < price:
        return []
    order = sorted(range(len(true_accuracies)), key=lambda t: (true_accuracies[t], t))
    return sorted(order[:max_bids])


def inflated_row(row: list[float], scale: float) -> list[float]:
    """pFedLIA: every entry ``scale`` times the row's largest magnitude (``scale`` when the row is all zeros)."""
    top = max((abs(v) for v in row), default=0.0) or 1.0
    return [float(scale * top)] * len(row)


def forged_importance(u: list[float]) -> list[float]:
    """FedSoft: all weight on the centre the client's honest weights rank lowest (the first such), the others at
    the floor, normalised."""
    forged = np.full(len(u), FEDSOFT_FLOOR)
    forged[int(np.argmin(u))] = 1.0
    return [float(x) for x in forged / forged.sum()]


def forged_index(beta: np.ndarray) -> np.ndarray:
    """Client2Vec: a uniform vector with the norm of the honest index half ``beta``."""
    beta = np.asarray(beta)
    return (np.full(beta.shape, np.linalg.norm(beta) / np.sqrt(beta.size))).astype(beta.dtype)


def query_reply(method: ClientMethod, name: str, message: RecordDict, reply: RecordDict) -> RecordDict:
    """An attacker's reply to ``query.<name>`` under side-channel: PI-FL's bid, pFedLIA's influence row (and
    beneficial peers), FedSoft's importance weights, Client2Vec's index."""
    if not (_attacks(method) and method.settings.attacks.attack == "side-channel"):
        return reply
    s, options = method.settings, method.settings.attacks
    metrics: dict[str, Any] = dict(reply.metric_records["metrics"]) if "metrics" in reply.metric_records else {}
    if name == "bid" and s.method in ("pifl", "pifl-ni"):
        ledger: Mapping[str, Any] = message.config_records.get("ledger") or ConfigRecord()
        true = [float(v) for v in metrics["tier-acc"]]
        max_bids = int(getattr(method.options, "max_bids", 1))
        metrics["bid"] = misplaced_bid(true, int(ledger.get("balance", 0)), int(ledger.get("price", 1)), max_bids)
        metrics["tier-acc"] = [1.0] * len(true)
    elif name == "lia" and s.method == "pfedlia":
        row = [float(v) for v in metrics["lia-row"]]
        metrics["lia-row"] = inflated_row(row, options.attack_scale)
        if "beneficial" in metrics:
            about: Mapping[str, Any] = message.config_records.get("lazy-clients") or ConfigRecord()
            me = int(about.get("self-index", -1))
            metrics["beneficial"] = [i for i in range(len(row)) if i != me]
    elif name == "fedsoft_u" and s.method == "fedsoft":
        metrics["fedsoft-u"] = forged_importance([float(v) for v in metrics["fedsoft-u"]])
    elif name == "c2v_index" and s.method == "client2vec":
        arrays = record_to_numpy(reply.array_records["arrays"])
        reply["arrays"] = to_record({k: forged_index(v) for k, v in arrays.items()})
        return reply
    else:
        return reply
    reply["metrics"] = MetricRecord(metrics)
    return reply


# ---------------------------------------------------------------------------------------------- measuring the backdoor

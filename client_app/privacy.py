"""The client's half of client-level differential privacy (docs/privacy.md, task/privacy.py).

- ``dp-mode='central'``: a train reply's ``arrays`` leave the client clipped: ``w_ref + clip(w - w_ref, C)``, with
  ``w_ref`` the shared model the message brought (``arrays`` of the message), so what the server averages has norm
  at most ``dp-clip`` around a model it sent itself.  The noise is the server's (once, on the mean).  Only the
  model's trained parameters leave: its buffers (BatchNorm's running means and variances, statistics of the client's
  inputs) stay home, and the client recomputes them on its own data before it scores a model
  (:func:`task.train.norm_statistics`).
- ``dp-mode='local'``: a train reply's ``arrays`` are a local release, ``w_ref + clip(w - w_ref, C) + N(0, (sigma
  C)^2 I)``, sigma the noise multiplier the message declares (the server calibrates and keeps it), with ``w_ref``
  what the method names as its release reference (:meth:`ClientMethod.release_reference`, e.g. FedC2I's own
  previous release, which the message brought back).  The noise is drawn from a generator seeded by the operating
  system's CSPRNG (:func:`task.privacy.noise_source`), never from the run's ``seed``: the run config travels to the
  server and to every client, so noise seeded by it could be regenerated and subtracted by anyone who sees the
  release.  BatchNorm's running variances are set to ``max(v, 0)`` after the noise (post-processing: it costs no
  privacy).

In both modes integer arrays (BatchNorm's ``num_batches_tracked``, which counts the batches the client trained)
stay home, and an update that is not finite (training diverged) leaves as the zero update: nothing of a release
says where it overflowed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, cast

import numpy as np
from flwr.app import RecordDict

from client_app.floor import node_floor
from task.models import model_info
from task.params import record_to_numpy, to_record
from task.privacy import PrivacyConfigError, clip_bound, clip_update, local_release, model_delta, noise_source

#: the suffix of the arrays that are variances (BatchNorm's running variances): kept >= 0 after the noise
VARIANCE_SUFFIX = "running_var"


def _floating(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v for k, v in arrays.items() if np.issubdtype(v.dtype, np.floating)}


def clipped_reply(
    reply: RecordDict, message: RecordDict, clip: float, home: frozenset[str] = frozenset()
) -> RecordDict:
    """``reply`` with its ``arrays`` clipped to L2 distance ``clip`` from the message's ``arrays``, integer arrays and
    the keys in ``home`` (the model's buffers) left out; a reply without arrays is returned as it is."""
    if "arrays" not in reply.array_records:
        return reply
    if "arrays" not in message.array_records:
        raise PrivacyConfigError("central DP clips the reply against the model the message brought, but it had none")
    arrays = record_to_numpy(reply.array_records["arrays"])
    floating = _floating({k: v for k, v in arrays.items() if k not in home})
    reference = record_to_numpy(message.array_records["arrays"])
    change = clip_update(model_delta(floating, reference), clip)
    reply["arrays"] = to_record({k: (reference[k] + change[k]).astype(v.dtype) for k, v in floating.items()})
    return reply


def buffers(settings: Any) -> frozenset[str]:
    """The run's model's buffers (BatchNorm's running statistics and counters): under central DP they stay home."""
    info = model_info(settings.model, settings.in_channels, settings.image_size, settings.num_classes)
    return frozenset(info.buffer_keys)


def released_reply(
    reply: RecordDict,
    reference: Mapping[str, np.ndarray],
    noise_multiplier: float,
    clip: float,
    rng: np.random.Generator,
) -> RecordDict:
    """``reply`` with its ``arrays`` replaced by their local release around ``reference`` (``local_release``):
    floating-point arrays only, running variances kept >= 0; a reply without arrays is returned as it is."""
    if "arrays" not in reply.array_records:
        return reply
    floating = _floating(record_to_numpy(reply.array_records["arrays"]))
    released = local_release(floating, reference, noise_multiplier, clip, rng)
    for k in released:
        if k.endswith(VARIANCE_SUFFIX):
            released[k] = np.maximum(released[k], 0).astype(released[k].dtype)
    reply["arrays"] = to_record(released)
    return reply


def declared(message: RecordDict, mode: str) -> tuple[float, float]:
    """(noise multiplier, clip bound) the message declares for its round under DP (``dp-noise-multiplier``,
    ``dp-clip`` in its config; strategies/privacy.py: ``ServerPrivacy.declared``): central, what the server applies;
    local, what this client must.  A DP message without them is refused: the run's settings alone do not say what
    the server calibrated or kept."""
    config = message.config_records.get("config")
    if config is None or "dp-noise-multiplier" not in config or "dp-clip" not in config:
        raise PrivacyConfigError(
            f"dp-mode={mode!r}: the message declares no noise multiplier and clip bound (config dp-noise-multiplier, "
            "dp-clip), so this node cannot know the noise of what it releases; nothing leaves"
        )
    return float(cast(float, config["dp-noise-multiplier"])), float(cast(float, config["dp-clip"]))


def private_reply(method: Any, reply: RecordDict, message: RecordDict) -> RecordDict:
    """What of the train ``reply`` of ``method`` (a ClientMethod) may leave under the run's ``dp-mode``; nothing
    leaves with less privacy than the node's own floor (:class:`client_app.floor.RunRefused`), checked against the
    noise multiplier and clip bound the message declares for the round (central: the server's; local: this
    client's own noise)."""
    settings = method.settings
    if settings.dp_mode == "off":
        node_floor(method.context.node_config).check_release("off", 0.0, math.inf)
        return reply
    clip = clip_bound(settings.dp_clip)
    sigma, declared_clip = declared(message, settings.dp_mode)
    node_floor(method.context.node_config).check_release(settings.dp_mode, sigma, max(clip, declared_clip))
    if settings.dp_mode == "central":  # the update leaves clipped; the server adds the noise
        return clipped_reply(reply, message, clip, buffers(settings))
    # local: clipped and noised here, before it leaves, with the declared noise multiplier
    reference = method.release_reference(message)
    return released_reply(reply, reference, sigma, clip, noise_source())

"""What both halves of FedBN share: no run-config keys of its own, and the one rule its model must meet.

FedBN (Li et al., ICLR 2021) keeps every normalisation layer on the client (``task.models.norm_keys``) and
averages everything else as FedAvg does; with a model that has no normalisation layer it would be FedAvg, so
such a run is refused at start-up.  See docs/methods/fedbn.md.
"""

from __future__ import annotations

from typing import Any

from task.models import IMAGE_ONLY, MODELS, SIGNAL_ONLY, model_norm_keys


def models_with_norm_layers(settings: Any) -> list[str]:
    """The registry's models that have normalisation layers and take this run's inputs (images: every model but
    the causal LM and the signal models; the next-word task: the causal LM; other vectors: the vector models)."""
    if settings.image_size > 0:
        fitting = [m for m in MODELS if m != "gpt2" and m not in SIGNAL_ONLY]
    elif settings.data.dataset == "dialects":
        fitting = ["gpt2"]
    else:
        fitting = [m for m in MODELS if m not in IMAGE_ONLY and m != "gpt2"]
    return [m for m in fitting if model_norm_keys(m, settings.in_channels, settings.image_size, settings.num_classes)]


def conflicts(settings: Any) -> list[str]:
    """The run's model must have normalisation layers (the registry entry's ``conflicts``: FedBN has no run-config
    keys of its own, so no options class)."""
    s = settings
    if model_norm_keys(s.model, s.in_channels, s.image_size, s.num_classes):
        return []
    fitting = models_with_norm_layers(s)
    allowed = f"use one that has: {fitting}" if fitting else f"no model here for dataset {s.data.dataset!r} has one"
    why = (
        f"method 'fedbn' keeps the normalisation layers (BatchNorm, GroupNorm, LayerNorm) on the clients, but "
        f"model {s.model!r} (run-config key 'model') has none, so FedBN would be plain FedAvg; {allowed}"
    )
    return [why]

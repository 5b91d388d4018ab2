"""Feature-shift domains: one visual transform per client, applied on top of any label partition."""

from __future__ import annotations

import numpy as np
import torch

from task.data.catalogue import DOMAINS
from task.data.sources import NOISE_SEED


def apply_domain(x: np.ndarray, domain: str, seed: int = 0) -> np.ndarray:
    """One visual transform of a batch of images (N, C, H, W) in [0, 1], standing in for Digit-5 domains."""
    if domain == "original":
        return x
    if domain == "inverted":
        return 1.0 - x
    if domain == "rotated":
        return np.ascontiguousarray(np.rot90(x, k=1, axes=(2, 3)))
    if domain == "noisy":
        return (x + np.random.default_rng(NOISE_SEED + 1 + seed).normal(0, 0.3, x.shape)).astype(np.float32)
    if domain == "shifted":
        return np.roll(x, shift=(1, 1), axis=(2, 3))
    if domain == "thickened":
        t = torch.from_numpy(np.ascontiguousarray(x))
        return torch.nn.functional.max_pool2d(t, 3, stride=1, padding=1).numpy()
    if domain == "blurred":
        t = torch.from_numpy(np.ascontiguousarray(x))
        return torch.nn.functional.avg_pool2d(t, 3, stride=1, padding=1, count_include_pad=False).numpy()
    raise ValueError(f"unknown domain {domain!r}; allowed: {list(DOMAINS)}")


def domain_of(partition_id: int, num_domains: int) -> str:
    if not 1 <= num_domains <= len(DOMAINS):
        raise ValueError(f"feature-shift must be between 1 and {len(DOMAINS)} domains, got {num_domains}")
    return DOMAINS[partition_id % num_domains]

"""CLIP encoders for Client2Vec, offline: open_clip models (local weights or random init) and a synthetic one.

Client2Vec (client2vec.md §2.1) embeds every training image with CLIP's image encoder and every label
as the text prompt "A photo of a/an {class}" with CLIP's text encoder.  Nothing is downloaded here:

- ``open-clip`` encoder: any open_clip architecture (``c2v-clip-model``; ``pflower-tiny`` is a 3.4M-parameter
  architecture registered below, sized for CPU tests) with weights from ``c2v-clip-weights``:
  ``random`` (random initialisation, for tests and the offline demo), a path to a local checkpoint file, or
  a pretrained tag (e.g. ``openai``) that open_clip finds in the local cache.  Weights that are asked for
  but absent raise :class:`MissingWeights`, naming the key and how to supply them; there is no silent
  fallback to random weights.
- ``synthetic`` encoder: a fixed random projection of the pixels and a seeded Gaussian vector per prompt
  (seeded with hashlib, not ``hash()``, which differs between processes).  Random CLIP text towers map
  prompts that differ in one word to strongly correlated vectors, which blurs the label half of the index;
  the synthetic encoder keeps class prompts distinct and is what the CPU reproduction (client2vec.md §8) uses.

Embeddings of a client's training split are computed once and cached on disk (``.npy``, keyed by the
encoder and the data settings), so CLIP runs once per client, not once per round.

See docs/methods/client2vec.md; its last section says where each section number cited here is explained.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

log = logging.getLogger("flwr.pflower")

TINY_MODEL = "pflower-tiny"
TINY_CONFIG = {
    "embed_dim": 512,
    "vision_cfg": {"image_size": 32, "layers": 2, "width": 64, "patch_size": 8, "head_width": 32},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 64, "heads": 2, "layers": 2},
}
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)

DIGIT_NAMES = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
CLASS_NAMES: dict[str, list[str]] = {
    "digits": DIGIT_NAMES,
    "mnist": DIGIT_NAMES,
    "usps": DIGIT_NAMES,
    "svhn": DIGIT_NAMES,
    "fashion-mnist": [
        "t-shirt",
        "trouser",
        "pullover",
        "dress",
        "coat",
        "sandal",
        "shirt",
        "sneaker",
        "bag",
        "ankle boot",
    ],
    "cifar10": ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"],
}
ENCODERS = ("open-clip", "synthetic")


class MissingWeights(RuntimeError):
    """CLIP weights were asked for (``c2v-clip-weights``) but are not available offline."""


def class_names(dataset: str, num_classes: int) -> list[str]:
    names = CLASS_NAMES.get(dataset)
    if names is not None and len(names) == num_classes:
        return list(names)
    return [f"class {c}" for c in range(num_classes)]


def label_prompt(name: str) -> str:
    """The paper's label prompt: "A photo of a {name}", with "an" before a vowel."""
    article = "an" if name[:1].lower() in "aeiou" else "a"
    return f"A photo of {article} {name}"


def _seed_of(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")


class SyntheticEncoder:
    """Fixed random projection of pixels (images) and hashed Gaussian vectors (prompts), L2-normalised."""

    name = "synthetic"

    def __init__(self, dim: int = 512, seed: int = 0) -> None:
        self.dim, self.seed = int(dim), int(seed)

    def encode_images(self, x: torch.Tensor) -> np.ndarray:
        flat = x.reshape(len(x), -1).double()
        gen = torch.Generator().manual_seed(_seed_of(f"image:{self.seed}:{flat.shape[1]}") % (2**63))
        proj = torch.randn(flat.shape[1], self.dim, generator=gen, dtype=torch.float64) / np.sqrt(flat.shape[1])
        return F.normalize(flat @ proj, dim=1).float().numpy()

    def encode_texts(self, texts: list[str]) -> np.ndarray:
        out = np.stack(
            [np.random.default_rng(_seed_of(f"text:{self.seed}:{t}")).standard_normal(self.dim) for t in texts]
        )
        return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)

    def describe(self) -> str:
        return f"synthetic-{self.dim}-{self.seed}"


class OpenClipEncoder:
    """An open_clip model, built offline; ``weights`` is ``random``, a local file, or a cached pretrained tag."""

    def __init__(self, model_name: str = TINY_MODEL, weights: str = "random", normalize: bool = True) -> None:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")  # no network: never wait on retries to the Hub
        import huggingface_hub.constants as hf_constants
        import open_clip

        offline = hf_constants.HF_HUB_OFFLINE
        if model_name == TINY_MODEL:
            _register_tiny(open_clip)
        if model_name not in open_clip.list_models():
            raise ValueError(
                f"unknown open_clip model {model_name!r} (run-config key 'c2v-clip-model'); "
                f"allowed: {TINY_MODEL!r} or one of open_clip.list_models(), e.g. 'ViT-B-32'"
            )
        self.model_name, self.weights, self.normalize = model_name, weights, normalize
        pretrained: str | None
        if weights in ("", "random"):
            pretrained = None
        elif os.path.sep in weights or weights.endswith((".pt", ".pth", ".bin", ".safetensors")):
            if not Path(weights).expanduser().is_file():
                raise MissingWeights(
                    f"CLIP weights file {weights!r} (run-config key 'c2v-clip-weights') does not exist; give the "
                    f"path of a local open_clip checkpoint for {model_name!r}, a pretrained tag already in the "
                    "local open_clip/Hugging Face cache, or 'random' for random initialisation"
                )
            pretrained = str(Path(weights).expanduser())
        else:
            pretrained = weights
        torch.manual_seed(0)  # random init is the same in every process
        try:
            hf_constants.HF_HUB_OFFLINE = True
            model, _, _ = open_clip.create_model_and_transforms(model_name, pretrained=pretrained)
        except RuntimeError as exc:
            raise MissingWeights(
                f"CLIP weights {weights!r} for {model_name!r} (run-config key 'c2v-clip-weights') are not available "
                f"offline ({exc}). Download them once on a machine with internet (open_clip caches them under "
                "~/.cache/huggingface) or pass the path of a checkpoint file; 'random' builds a randomly initialised "
                "model"
            ) from exc
        finally:
            hf_constants.HF_HUB_OFFLINE = offline
        self.model = model.eval()
        self.tokenizer = open_clip.get_tokenizer(model_name)
        size = self.model.visual.image_size
        self.image_size = int(size[0] if isinstance(size, (tuple, list)) else size)

    def describe(self) -> str:
        return describe_open_clip(self.model_name, self.weights, self.normalize)

    @torch.no_grad()
    def encode_images(self, x: torch.Tensor, batch_size: int = 256) -> np.ndarray:
        """Images (N, C, H, W) in [0, 1]: to 3 channels, resized to the model's size, CLIP-normalised."""
        out = []
        mean = torch.tensor(CLIP_MEAN).view(1, 3, 1, 1)
        std = torch.tensor(CLIP_STD).view(1, 3, 1, 1)
        for start in range(0, len(x), batch_size):
            xb = x[start : start + batch_size].float()
            if xb.shape[1] == 1:
                xb = xb.expand(-1, 3, -1, -1)
            xb = F.interpolate(xb, size=(self.image_size, self.image_size), mode="bilinear", align_corners=False)
            emb = self.model.encode_image((xb - mean) / std)
            out.append(F.normalize(emb, dim=1) if self.normalize else emb)
        return torch.cat(out).numpy().astype(np.float32)

    @torch.no_grad()
    def encode_texts(self, texts: list[str]) -> np.ndarray:
        emb = self.model.encode_text(self.tokenizer(texts))
        return (F.normalize(emb, dim=1) if self.normalize else emb).numpy().astype(np.float32)


def _register_tiny(open_clip) -> None:
    if TINY_MODEL in open_clip.list_models():
        return
    # open_clip reads the file when it is added and keeps the config: the folder can go (one per process had
    # been left in the temporary directory)
    with tempfile.TemporaryDirectory(prefix="pflower-clip-cfg-") as folder:
        (Path(folder) / f"{TINY_MODEL}.json").write_text(json.dumps(TINY_CONFIG))
        open_clip.add_model_config(folder)


def describe_open_clip(model_name: str, weights: str, normalize: bool) -> str:
    """What an open_clip encoder's embeddings are, for the cache key (without building the model)."""
    # the normalisation is part of what the cached embeddings are (c2v-normalize must not reuse the other kind)
    norm = "l2" if normalize else "raw"
    return f"open_clip-{model_name}-{Path(weights).name if weights else 'random'}-{norm}"


@functools.lru_cache(maxsize=4)
def build_encoder(kind: str, model_name: str, weights: str, normalize: bool, seed: int):
    if kind == "synthetic":
        return SyntheticEncoder(512, seed)
    if kind == "open-clip":
        return OpenClipEncoder(model_name, weights, normalize)
    raise ValueError(f"unknown encoder {kind!r} (run-config key 'c2v-encoder'); allowed: {list(ENCODERS)}")


class DeferredEncoder:
    """An encoder that is built (:func:`build_encoder`) only when something must be encoded.

    It describes itself without building, so a client whose embeddings are already cached never imports
    open_clip (3 s per process on an idle 2-core machine, 13 s on a loaded one) nor loads its weights.
    """

    def __init__(self, kind: str, model_name: str, weights: str, normalize: bool, seed: int) -> None:
        if kind not in ENCODERS:
            raise ValueError(f"unknown encoder {kind!r} (run-config key 'c2v-encoder'); allowed: {list(ENCODERS)}")
        self.args = (kind, model_name, weights, normalize, seed)

    def describe(self) -> str:
        kind, model_name, weights, normalize, seed = self.args
        return (
            SyntheticEncoder(512, seed).describe()
            if kind == "synthetic"
            else describe_open_clip(model_name, weights, normalize)
        )

    def encode_images(self, x: torch.Tensor) -> np.ndarray:
        return build_encoder(*self.args).encode_images(x)

    def encode_texts(self, texts: list[str]) -> np.ndarray:
        return build_encoder(*self.args).encode_texts(texts)


def default_cache_dir() -> Path:
    base = os.environ.get("PFLOWER_CACHE_DIR") or os.environ.get("PFLOWER_CACHE")  # the latter: older name
    return Path(base or Path.home() / ".cache" / "pflower").expanduser() / "clip-embeddings"


def cached_embeddings(
    encoder, key: str, x: torch.Tensor, y: torch.Tensor, names: list[str], cache_dir: str | Path | None = None
) -> tuple[np.ndarray, np.ndarray, bool]:
    """(D, L, from_cache) for one client's training split: D = image embeddings, L = T[y] (label prompts).

    ``key`` identifies the data (settings and partition); the encoder's description is added to it.  Files
    are written atomically, so concurrent processes of one machine can share the cache.
    """
    folder = Path(cache_dir).expanduser() if cache_dir else default_cache_dir()
    digest = hashlib.sha256(f"{encoder.describe()}|{key}|{len(y)}".encode()).hexdigest()[:24]
    path = folder / f"{digest}.npz"
    if path.is_file():
        try:
            with np.load(path) as f:
                return f["D"], f["L"], True
        except (OSError, ValueError, KeyError):
            log.warning("ignoring unreadable embedding cache %s", path)
    texts = encoder.encode_texts([label_prompt(n) for n in names])
    D = encoder.encode_images(x)
    L = texts[y.numpy()] if len(y) else np.zeros((0, texts.shape[1]), np.float32)
    folder.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp.npz")
    os.close(fd)
    np.savez(tmp, D=D, L=L)
    Path(tmp).replace(path)
    return D, L, False

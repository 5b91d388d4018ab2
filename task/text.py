"""Next-word prediction on synthetic "dialects" (pFedLIA's text task, stand-in for the paper's Nordic OSCAR
corpus; pfedlia.md §4 / §8); the model is :class:`task.models.CausalLM` (a transformers GPT-2 config).

The language: a fixed vocabulary of pseudo-words (made from syllables, independent of the run's seed) and a
word-level Markov chain.  Dialect l follows P_l = (1 - mix) P_base + mix P'_l: every dialect shares the base
successor table and has its own preferred successors; each dialect also says a few words its own way
(``DIALECT_WORDS`` variants of shared words), so the dialects share most of their vocabulary.  Client i
speaks dialect ``i % num-clusters`` (the planted group, as pFedLIA's image partitions).

Tokenisation is offline: a ``tokenizers`` WordLevel tokenizer over the known vocabulary (whitespace
split, ``[UNK]`` for anything else).  With ``lm-pretrained`` pointing at a local GPT-2 folder (model +
tokenizer files, as ``save_pretrained`` writes them) the text is tokenised with that folder's tokenizer and
the model starts from those weights; nothing is downloaded.
"""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np

LANGUAGE_SEED = 2_024
NUM_WORDS = 150
DIALECT_WORDS = 12  # words each dialect replaces by its own variant
SUCCESSORS = 4
SEQ_LEN = 16
SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "te", "vo", "pi", "da", "gu", "fe", "ho", "ja", "bi", "ze"]


MAX_DIALECTS = 8


@functools.lru_cache(maxsize=1)
def language() -> dict:
    """The fixed language: shared words, MAX_DIALECTS dialects' variants, base and dialect successor tables."""
    num_dialects = MAX_DIALECTS
    rng = np.random.default_rng(LANGUAGE_SEED)
    words: list[str] = []
    while len(words) < NUM_WORDS:
        w = "".join(rng.choice(SYLLABLES, size=int(rng.integers(1, 4))))
        if w not in words:
            words.append(w)
    variants = []
    for d in range(num_dialects):
        replaced = rng.choice(NUM_WORDS, size=DIALECT_WORDS, replace=False)
        variants.append({int(i): f"{words[i]}{'xyq'[d % 3]}{d}" for i in replaced})
    base = rng.integers(0, NUM_WORDS, size=(NUM_WORDS, SUCCESSORS))
    own = rng.integers(0, NUM_WORDS, size=(num_dialects, NUM_WORDS, SUCCESSORS))
    vocab = ["[UNK]", *words, *sorted({v for var in variants for v in var.values()})]
    return {"words": words, "variants": variants, "base": base, "own": own, "vocab": vocab}


def generate(dialect: int, num_sequences: int, mix: float, seed: int) -> list[str]:
    """``num_sequences`` lines of SEQ_LEN + 1 words in ``dialect``."""
    if not 0 <= dialect < MAX_DIALECTS:
        raise ValueError(f"dialect {dialect} out of range: num-clusters for 'dialects' must be 1..{MAX_DIALECTS}")
    if not 0.0 <= mix <= 1.0:
        raise ValueError(f"run-config key 'dialect-mix' must be in [0, 1], got {mix}")
    lang = language()
    rng = np.random.default_rng([seed, dialect, 77])
    lines = []
    for _ in range(num_sequences):
        w = int(rng.integers(NUM_WORDS))
        out = []
        for _ in range(SEQ_LEN + 1):
            out.append(lang["variants"][dialect].get(w, lang["words"][w]))
            table = lang["own"][dialect] if rng.random() < mix else lang["base"]
            w = int(table[w, rng.integers(SUCCESSORS)])
        lines.append(" ".join(out))
    return lines


@functools.lru_cache(maxsize=4)
def tokenizer(pretrained: str = ""):
    """The WordLevel tokenizer of the synthetic language, or a local pretrained folder's tokenizer."""
    if pretrained:
        from transformers import AutoTokenizer

        if not Path(pretrained).expanduser().is_dir():
            raise ValueError(
                f"lm-pretrained {pretrained!r} is not a folder; give a local GPT-2 folder "
                "(config.json, weights and tokenizer files, as save_pretrained writes them) or ''"
            )
        return AutoTokenizer.from_pretrained(str(Path(pretrained).expanduser()), local_files_only=True)
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import WhitespaceSplit

    vocab = language()["vocab"]
    tok = Tokenizer(WordLevel({w: i for i, w in enumerate(vocab)}, unk_token="[UNK]"))
    tok.pre_tokenizer = WhitespaceSplit()
    return tok


def vocab_size(pretrained: str = "") -> int:
    tok = tokenizer(pretrained)
    return len(tok) if pretrained else tok.get_vocab_size()


def encode(lines: list[str], pretrained: str = "") -> np.ndarray:
    """Token ids (N, SEQ_LEN + 1): the first SEQ_LEN + 1 tokens of each line (lines are long enough)."""
    tok = tokenizer(pretrained)
    ids = [tok(line)["input_ids"] for line in lines] if pretrained else [e.ids for e in tok.encode_batch(lines)]
    rows = [r[: SEQ_LEN + 1] for r in ids if len(r) >= SEQ_LEN + 1]
    return np.asarray(rows, dtype=np.int64)


def client_tokens(
    partition_id: int,
    num_dialects: int,
    num_sequences: int,
    mix: float,
    seed: int,
    pretrained: str = "",
    iid: bool = False,
) -> tuple[np.ndarray, int]:
    """(token ids, dialect) of one client; ``iid`` mixes all dialects line by line."""
    if iid:
        rng = np.random.default_rng([seed, partition_id, 5])
        lines = []
        for d in rng.integers(0, num_dialects, size=num_sequences):
            lines += generate(int(d), 1, mix, int(rng.integers(2**31)))
        return encode(lines, pretrained), -1
    dialect = partition_id % num_dialects
    return encode(generate(dialect, num_sequences, mix, seed * 100_003 + partition_id), pretrained), dialect

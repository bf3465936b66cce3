"""Token files and tokenizers: how many token ids a corpus needs, and text turned into tokens.

Pre-tokenized files (docs/data.md). `NAME.npy` (a 1-D integer array) or `NAME.bin` (raw little-endian
integers, uint16 unless the sidecar says otherwise), each with an optional *sidecar* `NAME.json`:

    {"vocab_size": 50257, "dtype": "uint16"}

`vocab_size` (required) is the number of token ids the tokenizer that wrote the file has, so every id is
`< vocab_size`; `dtype` (optional) is one of `_DTYPES`, and for `.npy` must match the array's own. Other
keys are ignored (a tool may note its tokenizer there). Without a sidecar the vocabulary is inferred as
`max(token) + 1`, read in chunks of a memory-mapped file, once per process and file (cached by path, size
and modification time), and logged, since a tokenizer's unused top ids make it smaller than the truth.

Tokenizers. A `tokenizer.json` file of the HuggingFace `tokenizers` library (trained with
`diloco-tokenizer train`, or any the user has): loaded from that file only, nothing is downloaded. Its
identity is the SHA-256 of the file's bytes (`tokenizer_hash`), which every node of a run must share.
`encode_text` turns UTF-8 text into tokens and, per token, the bytes of text it stands for (each token
owns the bytes from its start to the next token's start, from the tokenizer's offsets): so a window's
byte count is exact to within one character at its two edges, and a document's is exact.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from node.island.config import ConfigError

if TYPE_CHECKING:  # the tokenizers library is imported only when a tokenizer is used
    from tokenizers import Tokenizer

__all__ = ["DataError", "Sidecar", "TOKEN_SUFFIXES", "encode_text", "file_vocab", "load_tokenizer", "open_tokens",
           "read_sidecar", "sidecar_path", "tokenizer_hash", "train_tokenizer", "write_tokens"]

TOKEN_SUFFIXES = (".npy", ".bin")
_DTYPES = ("uint8", "uint16", "uint32", "int32", "int64")
_CHUNK = 1 << 24  # tokens per read when inferring a vocabulary (16 Mi: 32-128 MB)
_PIECE_CHARS = 1 << 20  # text is encoded in pieces of about this many characters, cut after a newline
_BATCH_CHARS = 1 << 24  # characters encoded at once

log = logging.getLogger("node.island.tokens")


class DataError(Exception):
    """A data source is missing, unreadable, empty, malformed, or too small for one sequence."""


# ---- pre-tokenized files -------------------------------------------------------------------------


@dataclass(frozen=True)
class Sidecar:
    """What a token file's `NAME.json` says: its vocabulary and (optionally) its element type."""

    vocab_size: int
    dtype: str | None = None


def sidecar_path(path: str) -> str:
    """`NAME.json` for `NAME.npy` / `NAME.bin`."""
    return os.path.splitext(path)[0] + ".json"


def read_sidecar(path: str) -> Sidecar | None:
    """The sidecar of token file `path`, None if it has none. Raises `DataError` if it is malformed."""
    side = sidecar_path(path)
    if not os.path.isfile(side):
        return None
    try:
        with open(side, "rb") as f:
            meta = json.loads(f.read())
    except (OSError, ValueError) as e:
        raise DataError(f"cannot read the sidecar {side!r} of {path!r}: {e}") from None
    if not isinstance(meta, dict):
        raise DataError(f"sidecar {side!r}: expected a JSON object like {{\"vocab_size\": 50257}}")
    vocab, dtype = meta.get("vocab_size"), meta.get("dtype")
    if not isinstance(vocab, int) or isinstance(vocab, bool) or vocab <= 0:
        raise DataError(f"sidecar {side!r}: vocab_size must be a positive integer, got {vocab!r}")
    if dtype is not None and dtype not in _DTYPES:
        raise DataError(f"sidecar {side!r}: dtype must be one of {', '.join(_DTYPES)}, got {dtype!r}")
    return Sidecar(vocab, dtype)


def open_tokens(path: str) -> np.ndarray:
    """The tokens of a `.npy` / `.bin` file, memory-mapped (read lazily). Raises `DataError` if the file
    is unreadable, not a 1-D integer array, or disagrees with its sidecar's dtype."""
    side = read_sidecar(path)
    try:
        if path.endswith(".npy"):
            tokens = np.load(path, mmap_mode="r", allow_pickle=False)
            if side is not None and side.dtype is not None and tokens.dtype != np.dtype(side.dtype):
                raise DataError(f"{path!r} holds {tokens.dtype} but its sidecar says {side.dtype}")
        else:
            dtype = np.dtype(side.dtype if side is not None and side.dtype is not None else "uint16").newbyteorder("<")
            size = os.path.getsize(path)
            if size % dtype.itemsize:
                raise DataError(f"{path!r}: {size} bytes is not a whole number of {dtype.name} tokens "
                                f"({dtype.itemsize} bytes each); a sidecar {sidecar_path(path)!r} names the dtype")
            tokens = np.memmap(path, dtype=dtype, mode="r") if size else np.zeros(0, dtype)
    except (OSError, ValueError) as e:
        raise DataError(f"cannot read tokens from {path!r}: {e}") from e
    if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
        raise DataError(f"{path!r}: expected a 1-D integer token array, got {tokens.dtype} {tokens.shape}")
    return tokens


def file_vocab(path: str) -> tuple[int, str]:
    """(vocabulary, how it is known) of token file `path`: its sidecar's `vocab_size`, else inferred as
    `max(token) + 1` ("inferred": logged once; 0 for an empty file). Raises `DataError` for a negative
    token id or an unreadable file."""
    side = read_sidecar(path)
    if side is not None:
        return side.vocab_size, "sidecar"
    stat = os.stat(path)
    return _inferred_vocab(os.path.abspath(path), stat.st_size, stat.st_mtime_ns), "inferred"


@functools.lru_cache(maxsize=256)
def _inferred_vocab(path: str, size: int, mtime_ns: int) -> int:
    tokens = open_tokens(path)
    low, high = 0, -1
    for start in range(0, len(tokens), _CHUNK):
        chunk = tokens[start : start + _CHUNK]
        low, high = min(low, int(chunk.min())), max(high, int(chunk.max()))
    if low < 0:
        raise DataError(f"{path!r} holds the negative token id {low}")
    if not len(tokens):
        return 0
    log.info("%s has no sidecar %s: vocabulary inferred as max(token)+1 = %d from %d tokens", path,
             os.path.basename(sidecar_path(path)), high + 1, len(tokens))
    return high + 1


def write_tokens(path: str, tokens: np.ndarray, vocab_size: int, **extra: object) -> None:
    """Write `tokens` to `path` (`.bin`: raw little-endian; `.npy`) and its sidecar; the element type is the
    smallest unsigned one holding `vocab_size` ids. `extra` keys go into the sidecar too."""
    if not path.endswith(TOKEN_SUFFIXES):
        raise ValueError(f"token file {path!r} must end in .npy or .bin")
    tokens = np.asarray(tokens)
    if len(tokens) and (int(tokens.min()) < 0 or int(tokens.max()) >= vocab_size):
        raise ValueError(f"token ids must be in [0, {vocab_size})")
    dtype = next(np.dtype(d) for d in ("uint8", "uint16", "uint32") if vocab_size <= np.iinfo(d).max + 1)
    if path.endswith(".npy"):
        np.save(path, tokens.astype(dtype), allow_pickle=False)
    else:
        tokens.astype(dtype.newbyteorder("<")).tofile(path)
    with open(sidecar_path(path), "w") as f:
        json.dump({"vocab_size": int(vocab_size), "dtype": dtype.name, **extra}, f)
        f.write("\n")


# ---- tokenizers ----------------------------------------------------------------------------------


def tokenizer_hash(path: str) -> str:
    """Hex SHA-256 of the tokenizer file's bytes ("" for no tokenizer): what peers compare. Raises
    ConfigError (the file is a `--set tokenizer=` setting) if it cannot be read."""
    if not path:
        return ""
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read()).hexdigest()
    except OSError as e:
        raise ConfigError(f"tokenizer={path}: cannot read it: {e.strerror or e}") from None


def load_tokenizer(path: str) -> Tokenizer:
    """The tokenizer in `path` (a `tokenizers` JSON file), loaded once per content. Raises ConfigError."""
    return _load(path, tokenizer_hash(path))


@functools.lru_cache(maxsize=8)
def _load(path: str, digest: str) -> Tokenizer:
    from tokenizers import Tokenizer

    try:
        return Tokenizer.from_file(path)
    except Exception as e:  # the library raises a bare Exception for a malformed file
        raise ConfigError(f"tokenizer={path}: not a tokenizers JSON file: {e}") from None


def _pieces(text: str) -> list[str]:
    """`text` cut after a newline about every `_PIECE_CHARS` characters (parallel, bounded encoding)."""
    pieces, start = [], 0
    while len(text) - start > _PIECE_CHARS:
        cut = text.find("\n", start + _PIECE_CHARS)
        if cut < 0:
            break
        pieces.append(text[start : cut + 1])
        start = cut + 1
    pieces.append(text[start:])
    return pieces


def _utf8_offsets(text: str) -> np.ndarray:
    """Byte offset of each character of `text` in its UTF-8 encoding, plus the total at the end."""
    points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
    widths = 1 + (points >= 0x80).astype(np.int64) + (points >= 0x800) + (points >= 0x10000)
    return np.concatenate([[0], np.cumsum(widths)])


def encode_text(tokenizer: Tokenizer, texts: Sequence[str]) -> list[tuple[np.ndarray, np.ndarray]]:
    """(tokens, bytes per token) of each text: tokens as the smallest unsigned dtype for the tokenizer's
    vocabulary, bytes as uint32 summing to the text's UTF-8 length (see the module docstring). Encodes
    pieces of the texts in parallel, `_BATCH_CHARS` characters at a time (the library's per-token
    records take ~40 bytes per character of text)."""
    dtype = np.uint16 if tokenizer.get_vocab_size() <= 1 << 16 else np.uint32
    pieces = [(i, piece) for i, text in enumerate(texts) for piece in _pieces(text)]
    tokens: list[list[np.ndarray]] = [[] for _ in texts]
    sizes: list[list[np.ndarray]] = [[] for _ in texts]
    start = 0
    while start < len(pieces):
        end, chars = start, 0
        while end < len(pieces) and (end == start or chars + len(pieces[end][1]) <= _BATCH_CHARS):
            chars, end = chars + len(pieces[end][1]), end + 1
        batch = pieces[start:end]
        for (i, piece), enc in zip(batch, tokenizer.encode_batch([p for _, p in batch], add_special_tokens=False)):
            starts = np.array([s for s, _ in enc.offsets] + [len(piece)], dtype=np.int64)
            starts[0] = 0
            starts = np.maximum.accumulate(_utf8_offsets(piece)[starts])
            tokens[i].append(np.asarray(enc.ids, dtype=dtype))
            sizes[i].append(np.diff(starts).astype(np.uint32))
        start = end
    return [(np.concatenate(t) if t else np.zeros(0, dtype), np.concatenate(b) if b else np.zeros(0, np.uint32))
            for t, b in zip(tokens, sizes)]


def train_tokenizer(texts: Iterable[str], vocab_size: int, *, min_frequency: int = 2) -> Tokenizer:
    """A byte-level BPE tokenizer (GPT-2's scheme: every byte is a token, so any text encodes) trained on
    `texts`, with at most `vocab_size` tokens (>= 256)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 256:
        raise ValueError(f"a byte-level tokenizer needs vocab_size >= 256, got {vocab_size}")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, min_frequency=min_frequency, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=[])
    tokenizer.train_from_iterator(texts, trainer)
    return tokenizer

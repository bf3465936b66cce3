"""Token data for a node: the corpus, its train/held-out split, this node's shard, and batches.

Corpus. By default the *embedded corpus*: text that every machine with Python already has, the standard
library's own sources (`*.py` under `sysconfig.get_paths()["stdlib"]`, skipping `test`/`tests`/`idle_test`
folders and `site-packages`) plus the documentation topics bundled in `pydoc_data.topics`. Read raw as
bytes (vocabulary 256). Reading it takes ~50 ms warm on the development machine, so there is no cache.
Otherwise `DataConfig.sources` names text files, folders (every non-hidden file below, recursively),
globs, or pre-tokenized `.npy` (1-D integer array) / `.bin` (raw little-endian uint16) files; text and
pre-tokenized sources cannot be mixed.

Split. Each document is cut into *units* of `split_unit_tokens` tokens named `"<document>#<index>"`,
where a document's name is its path relative to its source (so it is the same on every machine). A unit
is held out iff `h("split", name) < heldout_fraction`, with `h` the first 8 bytes of SHA-256 as a
fraction of 2**64: a fixed rule per unit, independent of file order, so every machine agrees on every
unit it has. Small files are one unit, i.e. the stdlib is split by file.

Shard. A node keeps the train units with `h("shard:" + shard_key, name) < shard_fraction` (the whole
train split when `shard_key` is ""). Different keys give different shards without coordination.

Batches. A `Batcher` draws batch number `k` as `batch_size` windows of `seq_len + 1` tokens at offsets
drawn from `np.random.default_rng([data_seed, h64(shard_key), k])` over the shard's units laid end to
end: deterministic, and resumable from the single integer `position`.
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
import sysconfig
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from node.island.config import DataConfig

__all__ = ["Batcher", "DataError", "Dataset", "Document", "MultiBatcher", "TokenStream", "Unit",
           "check_sources", "embedded_documents", "load_corpus", "units_of"]

_SKIP_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"})
_TOKEN_SUFFIXES = (".npy", ".bin")
_SNIFF_BYTES = 8192

log = logging.getLogger("node.island.data")


class DataError(Exception):
    """A data source is missing, unreadable, empty, malformed, or too small for one sequence."""


@dataclass(frozen=True)
class Document:
    """A named run of tokens (uint8 for text, uint16/other integers for pre-tokenized files)."""

    name: str
    tokens: np.ndarray


def _hash_fraction(salt: str, name: str) -> float:
    digest = hashlib.sha256(salt.encode() + b"\0" + name.encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def _hash64(text: str) -> int:
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big")


# ---- reading sources -----------------------------------------------------------------------------


def _read_bytes(path: str) -> np.ndarray:
    try:
        with open(path, "rb") as f:
            return np.frombuffer(f.read(), dtype=np.uint8)
    except OSError as e:
        raise DataError(f"cannot read {path!r}: {e.strerror or e}") from e


def _read_tokens(path: str) -> np.ndarray:
    try:
        if path.endswith(".npy"):
            tokens = np.load(path, mmap_mode="r", allow_pickle=False)
        else:
            if os.path.getsize(path) % 2:
                raise DataError(f"{path!r}: a .bin file must hold uint16 tokens (even byte count)")
            tokens = np.memmap(path, dtype="<u2", mode="r") if os.path.getsize(path) else np.zeros(0, "<u2")
    except (OSError, ValueError) as e:
        raise DataError(f"cannot read tokens from {path!r}: {e}") from e
    if tokens.ndim != 1 or not np.issubdtype(tokens.dtype, np.integer):
        raise DataError(f"{path!r}: expected a 1-D integer token array, got {tokens.dtype} {tokens.shape}")
    return tokens


def _walk(folder: str) -> list[str]:
    found = []
    for parent, dirs, files in os.walk(folder, onerror=_raise_walk_error):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found.extend(os.path.join(parent, f) for f in sorted(files) if not f.startswith("."))
    return found


def _raise_walk_error(error: OSError) -> None:
    raise DataError(f"cannot read folder {error.filename!r}: {error.strerror or error}")


def _expand(source: str) -> list[tuple[str, str]]:
    """(path, name) pairs for one source; names are relative to the source's own root."""
    if glob.has_magic(source):
        paths = sorted(p for p in glob.glob(source, recursive=True) if os.path.isfile(p))
        if not paths:
            raise DataError(f"glob {source!r} matches no files")
        root = source[: min(source.find(c) for c in "*?[" if c in source)]
        root = root if root.endswith(os.sep) else os.path.dirname(root)
        return [(p, os.path.relpath(p, root or ".")) for p in paths]
    if os.path.isdir(source):
        paths = _walk(source)
        if not paths:
            raise DataError(f"folder {source!r} holds no files")
        return [(p, os.path.relpath(p, source)) for p in paths]
    if os.path.isfile(source):
        return [(source, os.path.basename(source))]
    if os.path.lexists(source):
        raise DataError(f"data source {source!r} is neither a file nor a folder")
    raise DataError(f"data source {source!r} does not exist")


def _looks_binary(path: str) -> bool:
    """A NUL byte in the first `_SNIFF_BYTES` (the rule git and grep use): not text."""
    try:
        with open(path, "rb") as f:
            return b"\0" in f.read(_SNIFF_BYTES)
    except OSError as e:
        raise DataError(f"cannot read {path!r}: {e.strerror or e}") from e


def _text_only(source: str, pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """`pairs` of one source without binary files passed as text: a source of binary files only is a
    `DataError`; binary files beside text ones (a folder, a glob) are skipped with a warning."""
    binary = [path for path, _ in pairs if not path.endswith(_TOKEN_SUFFIXES) and _looks_binary(path)]
    if not binary:
        return pairs
    if len(binary) == len(pairs):
        what = "is not text" if len(pairs) == 1 else f"holds no text ({len(pairs)} binary files)"
        raise DataError(f"data source {source!r} {what}: NUL bytes in the first {_SNIFF_BYTES} bytes; "
                        "pass text files, or pre-tokenized .npy/.bin token files")
    log.warning("data source %r: skipping %d binary file(s) (not text): %s%s", source, len(binary),
                ", ".join(binary[:5]), " ..." if len(binary) > 5 else "")
    skip = set(binary)
    return [pair for pair in pairs if pair[0] not in skip]


def embedded_documents() -> list[Document]:
    """The standard library's sources and the bundled pydoc topics, as byte documents sorted by name."""
    root = sysconfig.get_paths()["stdlib"]
    docs = []
    for parent, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        for f in sorted(files):
            path = os.path.join(parent, f)
            name = os.path.relpath(path, root).replace(os.sep, "/")
            if f.endswith(".py") and name != "pydoc_data/topics.py":
                docs.append(Document("stdlib/" + name, _read_bytes(path)))
    try:
        from pydoc_data.topics import topics
    except ImportError:  # some distributions strip the docs; the sources alone still make a corpus
        topics = {}
    for key in sorted(topics):
        docs.append(Document("pydoc/" + key, np.frombuffer(topics[key].encode(), dtype=np.uint8)))
    return docs


def _listed(sources: Sequence[str]) -> list[tuple[str, str]]:
    """(path, name) of every file the sources name, binary files passed as text left out (`_text_only`).
    Raises `DataError` for a missing or empty source, a binary-only one, or text mixed with token files."""
    pairs = [pair for source in sources for pair in _text_only(source, _expand(source))]
    if len({path.endswith(_TOKEN_SUFFIXES) for path, _ in pairs}) > 1:
        raise DataError("cannot mix text files with pre-tokenized .npy/.bin files in one corpus")
    return pairs


def check_sources(sources: Sequence[str]) -> None:
    """Raise `DataError` for what `load_corpus(sources)` would refuse before it reads a whole file: a
    source that does not exist, a folder holding no files, a glob matching nothing, a binary file passed
    as text, text mixed with token files, or only empty files. Cheap: lists files, sniffs their starts."""
    if not sources:
        return
    pairs = _listed(sources)
    try:
        empty = not any(os.path.getsize(path) for path, _ in pairs)
    except OSError as e:
        raise DataError(f"cannot read {e.filename!r}: {e.strerror or e}") from None
    if empty:
        raise DataError(f"every file is empty (sources: {', '.join(sources)})")


def load_corpus(sources: Sequence[str]) -> list[Document]:
    """Documents from `sources` (the embedded corpus when empty). Raises `DataError` for a missing,
    unreadable or empty source, for mixing text with pre-tokenized files, or for an empty corpus."""
    if not sources:
        docs = embedded_documents()
    else:
        pairs = _listed(sources)
        read = _read_tokens if pairs and pairs[0][0].endswith(_TOKEN_SUFFIXES) else _read_bytes
        docs = [Document(name.replace(os.sep, "/"), read(path)) for path, name in pairs]
    docs = [d for d in docs if len(d.tokens)]
    if not docs:
        raise DataError(f"the corpus is empty (sources: {list(sources) or 'embedded'})")
    return docs


# ---- split, shard, stream ------------------------------------------------------------------------


@dataclass(frozen=True)
class Unit:
    """Piece `index` of document `doc`: the granularity of the split and of shards."""

    doc: str
    index: int
    tokens: np.ndarray

    @property
    def name(self) -> str:
        return f"{self.doc}#{self.index}"


def units_of(docs: Sequence[Document], unit_tokens: int) -> list[Unit]:
    """Cut every document into consecutive units of at most `unit_tokens` tokens."""
    return [Unit(d.name, i // unit_tokens, d.tokens[i : i + unit_tokens])
            for d in docs for i in range(0, len(d.tokens), unit_tokens)]


class TokenStream:
    """Units laid end to end in (document, index) order, read by offset without copying the whole."""

    def __init__(self, units: Sequence[Unit]) -> None:
        self.units = sorted(units, key=lambda u: (u.doc, u.index))
        self.offsets = np.cumsum([0] + [len(u.tokens) for u in self.units])

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def take(self, start: int, length: int) -> np.ndarray:
        """Tokens `[start, start + length)` as int64."""
        if not 0 <= start <= len(self) - length:
            raise IndexError(f"window [{start}, {start + length}) outside a stream of {len(self)} tokens")
        out = np.empty(length, dtype=np.int64)
        i, filled = int(np.searchsorted(self.offsets, start, side="right")) - 1, 0
        while filled < length:
            begin = start + filled - int(self.offsets[i])
            piece = self.units[i].tokens[begin : begin + length - filled]
            out[filled : filled + len(piece)] = piece
            filled, i = filled + len(piece), i + 1
        return out


class Batcher:
    """Deterministic training batches of shape `[batch_size, seq_len + 1]` (int32) from one stream.

    Batch `k` depends only on (seed, key, k); `position` is the number of batches drawn so far and
    `seek(position)` resumes exactly. Raises `DataError` if a token is `>= vocab_size`.
    """

    def __init__(self, stream: TokenStream, *, batch_size: int, seq_len: int, seed: int, key: str,
                 vocab_size: int) -> None:
        if len(stream) < seq_len + 1:
            raise DataError(f"the train shard holds {len(stream)} tokens, fewer than one sequence "
                            f"of {seq_len + 1}")
        self.stream, self.batch_size, self.seq_len, self.vocab_size = stream, batch_size, seq_len, vocab_size
        self._seed = [seed, _hash64(key)]
        self.position = 0

    def seek(self, position: int) -> None:
        self.position = int(position)

    def batch_at(self, k: int) -> np.ndarray:
        rng = np.random.default_rng([*self._seed, k])
        starts = rng.integers(0, len(self.stream) - self.seq_len, size=self.batch_size)
        batch = np.stack([self.stream.take(int(s), self.seq_len + 1) for s in starts])
        return _check_vocab(batch, self.vocab_size)

    def next_batch(self) -> np.ndarray:
        batch = self.batch_at(self.position)
        self.position += 1
        return batch


class MultiBatcher:
    """N batchers drawn in lockstep and concatenated: the global batch of synchronous data parallelism."""

    def __init__(self, batchers: Sequence[Batcher]) -> None:
        self.batchers = list(batchers)
        self.batch_size = sum(b.batch_size for b in self.batchers)
        self.seq_len = self.batchers[0].seq_len
        self.position = 0

    def seek(self, position: int) -> None:
        self.position = int(position)

    def next_batch(self) -> np.ndarray:
        batch = np.concatenate([b.batch_at(self.position) for b in self.batchers])
        self.position += 1
        return batch


def _check_vocab(batch: np.ndarray, vocab_size: int) -> np.ndarray:
    low, high = int(batch.min()), int(batch.max())
    if low < 0 or high >= vocab_size:
        bad = low if low < 0 else high
        raise DataError(f"token id {bad} is outside the model's vocabulary [0, {vocab_size}); "
                        "set vocab_size to match the tokenizer")
    return batch.astype(np.int32)


class Dataset:
    """A loaded corpus, split into train and held-out units; hands out shard batchers and eval batches."""

    def __init__(self, cfg: DataConfig, *, seq_len: int, vocab_size: int,
                 documents: Sequence[Document] | None = None) -> None:
        self.cfg, self.seq_len, self.vocab_size = cfg, seq_len, vocab_size
        docs = load_corpus(cfg.sources) if documents is None else list(documents)
        units = units_of(docs, cfg.split_unit_tokens)
        held = [_hash_fraction("split", u.name) < cfg.heldout_fraction for u in units]
        self.train_units = [u for u, h in zip(units, held) if not h]
        self.heldout = TokenStream([u for u, h in zip(units, held) if h])
        total = sum(len(u.tokens) for u in units)
        for part, size in (("train", sum(len(u.tokens) for u in self.train_units)), ("held-out", len(self.heldout))):
            if size < seq_len + 1:
                raise DataError(
                    f"the {part} split holds {size} tokens (corpus: {total} tokens in {len(units)} units), "
                    f"fewer than one sequence of {seq_len + 1}; add data, or lower split_unit_tokens "
                    f"({cfg.split_unit_tokens}) or seq_len")

    def shard(self, key: str | None = None) -> TokenStream:
        """The train units of shard `key` (default: `cfg.shard_key`; "" means all train units)."""
        key = self.cfg.shard_key if key is None else key
        if not key:
            return TokenStream(self.train_units)
        salt = "shard:" + key
        return TokenStream([u for u in self.train_units if _hash_fraction(salt, u.name) < self.cfg.shard_fraction])

    def batcher(self, key: str | None = None, *, batch_size: int | None = None) -> Batcher:
        """Training batches for shard `key` (default `cfg.shard_key`) of `batch_size` (default cfg's)."""
        key = self.cfg.shard_key if key is None else key
        return Batcher(self.shard(key), batch_size=batch_size or self.cfg.batch_size, seq_len=self.seq_len,
                       seed=self.cfg.data_seed, key=key, vocab_size=self.vocab_size)

    def heldout_batches(self, n_batches: int, batch_size: int | None = None) -> list[np.ndarray]:
        """`n_batches` fixed evaluation batches, windows evenly spaced over the held-out split.

        The same on every node whatever its shard (they depend on the corpus and the config only).
        """
        batch_size = batch_size or self.cfg.batch_size
        n_windows = n_batches * batch_size
        starts = np.linspace(0, len(self.heldout) - self.seq_len - 1, n_windows).astype(np.int64)
        windows = np.stack([self.heldout.take(int(s), self.seq_len + 1) for s in starts])
        return [_check_vocab(w, self.vocab_size) for w in np.split(windows, n_batches)]

"""Token data for a node: the corpus, its train/held-out split, this node's shard, and batches.

Corpus. By default the *embedded corpus*: text that every machine with Python already has, the standard
library's own sources (`*.py` under `sysconfig.get_paths()["stdlib"]`, skipping `test`/`tests`/`idle_test`
folders and `site-packages`) plus the documentation topics bundled in `pydoc_data.topics`. Read raw as
bytes (vocabulary 256). Reading it takes ~50 ms warm on the development machine, so there is no cache.
Otherwise `DataConfig.sources` names text files, folders (every non-hidden file below, recursively),
globs, or pre-tokenized `.npy` (1-D integer array) / `.bin` (raw little-endian, uint16 by default) files
with their optional `.json` sidecars (`node.island.tokens`, docs/data.md); text and pre-tokenized sources
cannot be mixed. With `DataConfig.tokenizer` (a `tokenizers` JSON file) text, the embedded corpus too, is
encoded with it, and each token remembers how many bytes of text it stands for, so that held-out losses
stay bits per *byte* (`HeldOut.n_bytes`). `resolve_vocab` gives the model the vocabulary the data needs.

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
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from node.island.config import Config, ConfigError, DataConfig, overridden_fields
from node.island.tokens import TOKEN_SUFFIXES as _TOKEN_SUFFIXES
from node.island.tokens import DataError, encode_text, file_vocab, load_tokenizer, open_tokens, sidecar_path

__all__ = ["Batcher", "DataError", "Dataset", "Document", "HeldOut", "MultiBatcher", "TokenStream", "Unit",
           "check_sources", "data_vocab", "embedded_documents", "load_corpus", "resolve_vocab", "token_files",
           "units_of"]

_SKIP_DIRS = frozenset({"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"})
_SNIFF_BYTES = 8192

log = logging.getLogger("node.island.data")


@dataclass(frozen=True)
class Document:
    """A named run of tokens (uint8 for bytes of text, other integers for tokenized text or token files).
    `token_bytes[i]`: bytes of text token i stands for (tokenized text only; None: unknown, or 1 each)."""

    name: str
    tokens: np.ndarray
    token_bytes: np.ndarray | None = None


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


def _without_sidecars(pairs: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """`pairs` without the `.json` sidecars of the token files among them."""
    sidecars = {sidecar_path(path) for path, _ in pairs if path.endswith(_TOKEN_SUFFIXES)}
    return [pair for pair in pairs if pair[0] not in sidecars]


def _listed(sources: Sequence[str]) -> list[tuple[str, str]]:
    """(path, name) of every file the sources name, binary files passed as text and the sidecars of token
    files left out. Raises `DataError` for a missing or empty source, a binary-only one, or text mixed
    with token files."""
    pairs = _without_sidecars([pair for source in sources for pair in _text_only(source, _expand(source))])
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


def token_files(sources: Sequence[str]) -> list[str]:
    """The pre-tokenized files `sources` name (empty for text or the embedded corpus). Touches only the
    folders, globs and token files among them: a text file is not opened."""
    maybe = [s for s in sources if s.endswith(_TOKEN_SUFFIXES) or glob.has_magic(s) or os.path.isdir(s)]
    return [path for source in maybe for path, _ in _expand(source) if path.endswith(_TOKEN_SUFFIXES)]


def load_corpus(sources: Sequence[str], tokenizer: str = "") -> list[Document]:
    """Documents from `sources` (the embedded corpus when empty), text encoded with the `tokenizer` file
    if one is given. Raises `DataError` for a missing, unreadable or empty source, for mixing text with
    pre-tokenized files, for a tokenizer with pre-tokenized files, or for an empty corpus."""
    if not sources:
        docs = embedded_documents()
    else:
        pairs = _listed(sources)
        read = open_tokens if pairs and pairs[0][0].endswith(_TOKEN_SUFFIXES) else _read_bytes
        docs = [Document(name.replace(os.sep, "/"), read(path)) for path, name in pairs]
        if tokenizer and read is open_tokens:
            raise DataError(f"tokenizer {tokenizer!r} encodes text, but the sources are pre-tokenized files")
    docs = [d for d in docs if len(d.tokens)]
    if tokenizer and docs:
        docs = [d for d in _tokenized(docs, tokenizer) if len(d.tokens)]
    if not docs:
        raise DataError(f"the corpus is empty (sources: {list(sources) or 'embedded'})")
    return docs


def _tokenized(docs: Sequence[Document], path: str) -> list[Document]:
    """Byte documents encoded with the tokenizer in `path` (text that is not UTF-8 is read with U+FFFD
    for its bad bytes, and counted as the re-encoded text's bytes)."""
    tokenizer = load_tokenizer(path)
    started = time.perf_counter()
    texts = [d.tokens.tobytes().decode("utf-8", errors="replace") for d in docs]
    encoded = encode_text(tokenizer, texts)
    n_bytes, n_tokens = sum(int(b.sum()) for _, b in encoded), sum(len(t) for t, _ in encoded)
    log.info("encoded %d documents (%.1f MB of text) into %d tokens with tokenizer %s (vocabulary %d, "
             "%.2f bytes per token) in %.1f s", len(docs), n_bytes / 1e6, n_tokens, path,
             tokenizer.get_vocab_size(), n_bytes / max(n_tokens, 1), time.perf_counter() - started)
    return [Document(d.name, tokens, sizes) for d, (tokens, sizes) in zip(docs, encoded)]


def data_vocab(cfg: DataConfig) -> tuple[int, str]:
    """(the vocabulary the data needs, where that figure comes from): the tokenizer's size, 256 for bytes
    of text, or the largest of the token files' (sidecar or inferred, `node.island.tokens.file_vocab`)."""
    if cfg.tokenizer:  # (pre-tokenized sources with a tokenizer: `load_corpus` refuses them)
        return load_tokenizer(cfg.tokenizer).get_vocab_size(), f"the tokenizer {cfg.tokenizer}"
    files = token_files(cfg.sources)
    if not files:
        return 256, "one token per byte of text"
    (vocab, how), path = max((file_vocab(path), path) for path in files)
    if not vocab:
        raise DataError(f"every token file is empty (sources: {', '.join(cfg.sources)})")
    return vocab, f"the {how} vocabulary of {path}" + (f", the largest of {len(files)} files" if len(files) > 1 else "")


def resolve_vocab(cfg: Config, overrides: Iterable[str] = ()) -> Config:
    """`cfg` with the model's vocabulary fitted to its data (`data_vocab`): taken from the data unless
    `overrides` (the `key=value` strings `cfg` was built with) set `vocab_size`, which must then be at least
    the data's (a larger one is kept: padded vocabularies are common). Raises ConfigError for one too
    small, DataError for unreadable data. Same data and tokenizer, same result on every node."""
    need, source = data_vocab(cfg.data)
    if "vocab_size" in overridden_fields(overrides):
        if cfg.model.vocab_size < need:
            raise ConfigError(f"vocab_size={cfg.model.vocab_size} is too small for the data, which needs {need} "
                              f"({source}): drop --set vocab_size to take the data's, or set one >= {need}")
        return cfg
    if need != cfg.model.vocab_size:
        log.info("vocab_size %d from the data (%s)", need, source)
    return cfg.with_overrides(vocab_size=need)


# ---- split, shard, stream ------------------------------------------------------------------------


@dataclass(frozen=True)
class Unit:
    """Piece `index` of document `doc`: the granularity of the split and of shards."""

    doc: str
    index: int
    tokens: np.ndarray
    token_bytes: np.ndarray | None = None  # as `Document.token_bytes`

    @property
    def name(self) -> str:
        return f"{self.doc}#{self.index}"


def units_of(docs: Sequence[Document], unit_tokens: int) -> list[Unit]:
    """Cut every document into consecutive units of at most `unit_tokens` tokens."""
    return [Unit(d.name, i // unit_tokens, d.tokens[i : i + unit_tokens],
                 None if d.token_bytes is None else d.token_bytes[i : i + unit_tokens])
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


class HeldOut(list):
    """Evaluation batches (a list of `[batch, seq_len + 1]` int32 arrays) and `n_bytes`, the bytes of text
    their predicted tokens (all but each window's first) stand for: None when a token is a byte (plain
    text) or unknown (pre-tokenized files). `InnerLoop.evaluate` divides the summed loss by it."""

    def __init__(self, batches: Iterable[np.ndarray], n_bytes: int | None = None) -> None:
        super().__init__(batches)
        self.n_bytes = n_bytes


class Dataset:
    """A loaded corpus, split into train and held-out units; hands out shard batchers and eval batches."""

    def __init__(self, cfg: DataConfig, *, seq_len: int, vocab_size: int,
                 documents: Sequence[Document] | None = None) -> None:
        self.cfg, self.seq_len, self.vocab_size = cfg, seq_len, vocab_size
        docs = load_corpus(cfg.sources, cfg.tokenizer) if documents is None else list(documents)
        units = units_of(docs, cfg.split_unit_tokens)
        held = [_hash_fraction("split", u.name) < cfg.heldout_fraction for u in units]
        self.train_units = [u for u, h in zip(units, held) if not h]
        self.heldout = TokenStream([u for u, h in zip(units, held) if h])
        sized = all(u.token_bytes is not None for u in self.heldout.units)
        self._heldout_bytes = TokenStream([Unit(u.doc, u.index, u.token_bytes) for u in self.heldout.units
                                           if u.token_bytes is not None]) if sized else None
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

    def heldout_batches(self, n_batches: int, batch_size: int | None = None) -> HeldOut:
        """`n_batches` fixed evaluation batches, windows evenly spaced over the held-out split, with the
        bytes of text they predict when the text was tokenized (`HeldOut`).

        The same on every node whatever its shard (they depend on the corpus and the config only).
        """
        batch_size = batch_size or self.cfg.batch_size
        n_windows = n_batches * batch_size
        starts = np.linspace(0, len(self.heldout) - self.seq_len - 1, n_windows).astype(np.int64)
        windows = np.stack([self.heldout.take(int(s), self.seq_len + 1) for s in starts])
        sizes = self._heldout_bytes
        n_bytes = None if sizes is None else sum(int(sizes.take(int(s) + 1, self.seq_len).sum()) for s in starts)
        return HeldOut((_check_vocab(w, self.vocab_size) for w in np.split(windows, n_batches)), n_bytes)

"""Which values of the model make up each shard, and where a shard's bytes sit in an update's payload.

The model's tensors in sorted-name order (the payload's record order), each cut at the aggregate's chunk
boundaries (``protocol.ledger.chunks.CHUNK`` elements), give the run's *pieces*; the pieces, in that order,
are dealt into ``S`` contiguous shards of about equal element count. A piece is the unit a contributor
commits to (its norm² in the header), an aggregator reduces and a checker samples.

A piece of a built-in codec's record is a contiguous run of the record: fp32 and bf16 values, or int4/int8
block scales then codes, each starting at a block boundary (``CHUNK`` is a multiple of the block). The bytes
of a piece are therefore exactly the record the codec would write for that piece's values alone, so a
shard's bytes (its pieces' ranges, concatenated) decode with ``decode_tensors`` under :meth:`ShardPlan.keys`,
and a reduced shard is encoded the same way. A registered codec lays out its record its own way: a reduced
run needs a built-in one.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from protocol.compression import Codec, decode_tensors, encode_tensors, record_offsets
from protocol.compression.formats import BLOCK_SIZE, as_codec_local, num_blocks, tensor_bytes
from protocol.errors import LocalProtocolError
from protocol.ledger.chunks import CHUNK, spans

__all__ = ["ModelPiece", "ShardPlan"]


@dataclass(frozen=True)
class ModelPiece:
    """Elements ``[start, stop)`` of tensor ``name``'s flat view; ``index`` is its place among the run's pieces."""

    index: int
    name: str
    start: int
    stop: int

    @property
    def size(self) -> int:
        return self.stop - self.start

    @property
    def key(self) -> str:
        """The piece's name in a shard's payload (sorted like the pieces)."""
        return f"{self.index:09d}"


def _byte_ranges(piece: ModelPiece, numel: int, offset: int, codec: Codec) -> list[tuple[int, int]]:
    """``(offset, length)`` of ``piece`` in a record of ``numel`` elements at byte ``offset``."""
    if codec is Codec.FP32:
        return [(offset + 4 * piece.start, 4 * piece.size)]
    if codec is Codec.BF16:
        return [(offset + 2 * piece.start, 2 * piece.size)]
    first, count = piece.start // BLOCK_SIZE, num_blocks(piece.stop) - piece.start // BLOCK_SIZE
    codes = offset + 2 * num_blocks(numel)
    if codec is Codec.INT8:
        return [(offset + 2 * first, 2 * count), (codes + piece.start, piece.size)]
    return [(offset + 2 * first, 2 * count), (codes + piece.start // 2, (piece.size + 1) // 2)]


@dataclass(frozen=True)
class ShardPlan:
    """The pieces of a model of ``shapes`` and their deal into ``shards`` shards (at most one per piece)."""

    shapes: Mapping[str, tuple[int, ...]]
    shards: int

    def __post_init__(self) -> None:
        if CHUNK % BLOCK_SIZE:
            raise LocalProtocolError("pieces must start at a codec block boundary")
        object.__setattr__(self, "shapes", {n: tuple(self.shapes[n]) for n in sorted(self.shapes)})
        object.__setattr__(self, "shards", max(1, min(int(self.shards), len(self.pieces))))

    @cached_property
    def pieces(self) -> list[ModelPiece]:
        out: list[ModelPiece] = []
        for name, shape in self.shapes.items():
            for s in spans(math.prod(shape)):
                out.append(ModelPiece(len(out), name, s.start, s.stop))
        return out

    @cached_property
    def bounds(self) -> list[int]:
        """Shard ``k`` holds pieces ``bounds[k]:bounds[k + 1]``: the cut after the piece where the running
        element count first reaches ``k / S`` of the model (every shard holds at least one piece)."""
        sizes = np.cumsum([p.size for p in self.pieces])
        total, count = int(sizes[-1]) if len(sizes) else 0, len(self.pieces)
        cuts = [0]
        for k in range(1, self.shards):
            at = int(np.searchsorted(sizes, total * k / self.shards)) + 1
            cuts.append(min(max(at, cuts[-1] + 1), count - (self.shards - k)))
        return cuts + [count]

    def shard(self, k: int) -> list[ModelPiece]:
        return self.pieces[self.bounds[k]:self.bounds[k + 1]]

    def shard_of(self, piece: ModelPiece) -> int:
        return int(np.searchsorted(self.bounds, piece.index, side="right")) - 1

    def keys(self, pieces: Sequence[ModelPiece]) -> dict[str, tuple[int, ...]]:
        """The shapes under which ``pieces``' bytes decode (``decode_tensors``)."""
        return {p.key: (p.size,) for p in pieces}

    def byte_ranges(self, pieces: Sequence[ModelPiece], codec: Codec | str) -> list[tuple[int, int]]:
        """``(offset, length)`` of each of ``pieces``' runs in a payload of ``codec``, in order."""
        codec = _built_in(codec)
        offsets = record_offsets(self.shapes, codec)
        return [r for p in pieces for r in _byte_ranges(p, math.prod(self.shapes[p.name]), offsets[p.name], codec)]

    def cut(self, payload: bytes | memoryview, pieces: Sequence[ModelPiece], codec: Codec | str) -> bytes:
        """The bytes of ``pieces`` in ``payload``: what a ranged fetch of them returns."""
        view = memoryview(payload)
        return b"".join(view[o:o + n] for o, n in self.byte_ranges(pieces, codec))

    def piece_bytes(self, payload: bytes | memoryview, codec: Codec | str) -> list[bytes]:
        """The bytes of each of the run's pieces in ``payload``, in order (what the commitment's leaves hash)."""
        codec = _built_in(codec)
        offsets, view = record_offsets(self.shapes, codec), memoryview(payload)
        return [b"".join(view[o:o + n] for o, n in _byte_ranges(p, math.prod(self.shapes[p.name]), offsets[p.name], codec))
                for p in self.pieces]

    def split(self, data: bytes, pieces: Sequence[ModelPiece], codec: Codec | str) -> list[bytes]:
        """``data``, the bytes of ``pieces`` (a shard's), cut into each piece's."""
        codec = _built_in(codec)
        offsets = record_offsets(self.keys(pieces), codec)
        return [data[offsets[p.key]:offsets[p.key] + tensor_bytes(p.size, codec)] for p in pieces]

    def within(self, data: bytes, pieces: Sequence[ModelPiece], wanted: Sequence[ModelPiece], codec: Codec | str) -> bytes:
        """The bytes of ``wanted`` (some of ``pieces``) in ``data``, the bytes of ``pieces`` (a shard's): each
        piece is a whole record there."""
        codec = _built_in(codec)
        offsets = record_offsets(self.keys(pieces), codec)
        return b"".join(data[offsets[p.key]:offsets[p.key] + tensor_bytes(p.size, codec)] for p in wanted)

    def decode(self, data: bytes, pieces: Sequence[ModelPiece], codec: Codec | str) -> dict[int, np.ndarray]:
        """``pieces``' float32 values from their bytes, by piece index (``RemoteProtocolError`` for bytes no
        encoder writes)."""
        values = decode_tensors(data, _built_in(codec), self.keys(pieces))
        return {p.index: values[p.key] for p in pieces}

    def encode(self, values: Mapping[int, np.ndarray], pieces: Sequence[ModelPiece], codec: Codec | str) -> bytes:
        """``pieces``' float32 ``values`` (by piece index) in ``codec``: the bytes :meth:`decode` reads."""
        return encode_tensors({p.key: values[p.index] for p in pieces}, _built_in(codec))

    def piece_values(self, tensors: Mapping[str, np.ndarray], pieces: Sequence[ModelPiece]) -> dict[int, np.ndarray]:
        """``pieces`` of full ``tensors`` (views of their flat float32 arrays)."""
        return {p.index: np.asarray(tensors[p.name]).reshape(-1)[p.start:p.stop] for p in pieces}


def _built_in(codec: Codec | str) -> Codec:
    codec = as_codec_local(codec)
    if not isinstance(codec, Codec):
        raise LocalProtocolError(f"a reduced run needs a built-in codec; {codec!r} lays out its records itself")
    return codec

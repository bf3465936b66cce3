"""What a node holds of the reduced slot it is closing, and what it asks its driver to do
(:mod:`protocol.reduced.participant` is the node that owns them)."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from protocol.ledger.aggregate import SlotEntry
from protocol.reduced.plan import ModelPiece, ShardPlan
from protocol.reduced.records import Record
from protocol.reduced.seal import Seal
from protocol.reduced.slot import Commitment, PartialScreen, PiecePartials

__all__ = ["FetchPieces", "MissingPartials", "NeedPartials", "PieceValues", "Publish", "SlotState", "flat_partials",
           "piece_runs", "screened_key"]


@dataclass(frozen=True)
class FetchPieces:
    """``pieces`` (contiguous) of update ``update_id`` from its ``origin``, for ``kind`` ("raw shards",
    "checks", "fraud proofs": what the bytes are for)."""

    kind: str
    origin: str
    update_id: bytes
    pieces: tuple[ModelPiece, ...]


@dataclass(frozen=True)
class NeedPartials:
    """The screen partials of ``pieces`` (indices) of tensor ``name`` for the screened set ``key``."""

    name: str
    key: bytes
    pieces: tuple[int, ...]


@dataclass(frozen=True)
class Publish:
    """``record`` to gossip; ``data``: a reduction's bytes, which every peer fetches as ``kind``."""

    record: Record
    data: bytes | None = None
    kind: str = ""


class MissingPartials(Exception):
    """Raised inside the screen when partials it needs have not come: the node asks for them and retries."""

    def __init__(self, need: NeedPartials) -> None:
        super().__init__(need)
        self.need = need


def screened_key(terms: Sequence[tuple[bytes, float]]) -> bytes:
    """The key of a screened set ``(update id, c)`` in id order: what a partials record names it by."""
    return hashlib.sha256(b"".join(i + struct.pack(">d", c) for i, c in terms)).digest()


class PieceValues(Mapping[int, np.ndarray]):
    """The pieces of one update a node fetched, by piece index: kept as their bytes in the run's codec (int4: an
    eighth of their float32 values) and decoded when read."""

    def __init__(self, plan: ShardPlan, codec: str) -> None:
        self.plan, self.codec = plan, codec
        self.encoded: dict[int, bytes] = {}

    def __getitem__(self, index: int) -> np.ndarray:
        piece = self.plan.pieces[index]
        return self.plan.decode(self.encoded[index], [piece], self.codec)[index]

    def __contains__(self, index: object) -> bool:
        return index in self.encoded

    def __iter__(self) -> Iterator[int]:
        return iter(self.encoded)

    def __len__(self) -> int:
        return len(self.encoded)


@dataclass
class SlotState:
    """The slot a node is closing: its seal and, per shard, who is expected to reduce it and what stands."""

    number: int
    eligible: list[str]
    seal: Seal | None = None
    sealed: dict[bytes, Commitment] = field(default_factory=dict)
    roles: dict[int, list[str]] = field(default_factory=dict)
    at: dict[int, int] = field(default_factory=dict)  # shard -> place in its order of the reducer expected
    raw: dict[bytes, PieceValues] = field(default_factory=dict)  # the pieces fetched, by update id
    asked: set[tuple[bytes, int]] = field(default_factory=set)
    partials: dict[tuple[str, bytes], dict[int, tuple[float, ...]]] = field(default_factory=dict)
    outbox: list[Publish] = field(default_factory=list)
    screened: set[tuple[str, bytes]] = field(default_factory=set)
    terms: dict[str, tuple[dict[bytes, float], float]] = field(default_factory=dict)
    standing: dict[int, tuple[int, bytes, Record | None]] = field(default_factory=dict)  # (place, bytes, record)
    draws: dict[tuple[int, int], list[ModelPiece]] = field(default_factory=dict)
    checked: set[tuple[int, int]] = field(default_factory=set)
    frauds: dict[int, tuple[Record, ModelPiece]] = field(default_factory=dict)
    replacing: set[int] = field(default_factory=set)
    passed: set[int] = field(default_factory=set)
    applied: bool = False
    caught: list[tuple[int, str]] = field(default_factory=list)
    refused: list[tuple[int, str]] = field(default_factory=list)
    false_accusations: list[tuple[int, str]] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)  # why a message was refused, for the log
    early: list[tuple[Record, bytes | None]] = field(default_factory=list)  # may count once the node catches up
    screen: PartialScreen | None = None
    unheard: Record | None = None  # a seal that holds updates whose headers have not come yet
    entries: list[SlotEntry] = field(default_factory=list)
    bounds: dict[str, float] = field(default_factory=dict)


def piece_runs(pieces: Sequence[ModelPiece]) -> list[list[ModelPiece]]:
    """``pieces`` (ascending) cut into runs of consecutive indices."""
    out: list[list[ModelPiece]] = []
    for p in pieces:
        if out and out[-1][-1].index + 1 == p.index:
            out[-1].append(p)
        else:
            out.append([p])
    return out


def flat_partials(partials: PiecePartials) -> tuple[float, ...]:
    square, along, pair = partials
    return (square, *along) + (() if pair is None else (pair,))

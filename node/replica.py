"""The node's replica of the outer optimizer: the one owner of its `Ledger` on the trio side.

Contract:
- Every ledger operation runs in a worker thread (`trio.to_thread.run_sync`) under one `trio.Lock`, so
  the ledger (not thread-safe) has one user at a time and its numpy work never blocks the trio loop.
- Catch-up: after every add, while an update is held for a slot past the open one, the open slot is
  closed. An update for slot t proves its sender closed slot t-1, so this node is behind; closing
  never runs ahead of the updates it holds (invariant: `slot <= max target slot of any update held`).
- `set_hash` is an order-independent hash of the set of update ids the ledger has seen (applied, held
  or dropped). Two replicas with the same set have the same hash; the drain compares them.
- `changed()` fires after every operation that changed the ledger (for waiters such as the slot-close
  wait and the drain).
"""

from __future__ import annotations

import hashlib
import logging
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

import numpy as np
import trio

from protocol.ledger import ClosedSlot, Ledger, LedgerSnapshot, Outcome, UpdateMeta

__all__ = ["APPLIED", "IdSetHash", "Replica"]

log = logging.getLogger("node.replica")
T = TypeVar("T")

APPLIED = frozenset({Outcome.APPLIED_OPEN, Outcome.FOLDED_LATE, Outcome.APPLIED_STALE})
_NEW_IDS = APPLIED | {Outcome.HELD_FUTURE, Outcome.DROPPED_STALE}  # outcomes that add the id to `seen`


class IdSetHash:
    """Sum modulo 2^256 of SHA-256("diloco/idset/v1\\0" || id) over a set of 32-byte ids."""

    _MOD = 1 << 256

    def __init__(self, ids: Iterable[bytes] = ()) -> None:
        self.value = 0
        self.count = 0
        for i in ids:
            self.add(i)

    def add(self, update_id: bytes) -> None:
        h = hashlib.sha256(b"diloco/idset/v1\0" + update_id).digest()
        self.value = (self.value + int.from_bytes(h, "big")) % self._MOD
        self.count += 1

    def hex(self, chars: int = 64) -> str:
        return self.value.to_bytes(32, "big").hex()[:chars]


class Replica:
    """Owner of one `Ledger` (see the module docstring). Read-only properties are cheap and current."""

    def __init__(self, ledger: Ledger, seen_ids: Iterable[bytes] = ()) -> None:
        """`seen_ids`: the ledger's seen set (from its snapshot), empty for a fresh ledger."""
        self._lock = trio.Lock()
        self._changed = trio.Event()
        self.outcomes: Counter[str] = Counter()  # this process's add outcomes
        self.released = 0  # held updates moved into a newly opened slot by this process
        self.closed_here = 0  # slots this process closed
        self.version = 0  # +1 per change
        self._install(ledger, seen_ids)

    def _install(self, ledger: Ledger, seen_ids: Iterable[bytes]) -> None:
        self._ledger = ledger
        self.set_hash = IdSetHash(seen_ids)
        self._digests: tuple[bytes, bytes] | None = None
        self._refresh()

    # ---- cheap views ------------------------------------------------------------------------------
    def _refresh(self) -> None:
        led = self._ledger
        self.slot = led.slot
        self.base_slot = led.base_slot
        self.open_count = led.updates_in_open_slot()
        self.held = led.held_future()
        self.shapes = led.shapes
        self.config = led.config

    @property
    def max_known_slot(self) -> int:
        """Highest slot any held update belongs to (or the open slot if it has updates, else `slot`)."""
        top = self.slot + 1 if self.open_count else self.slot
        return max([top, *self.held])

    @property
    def updates_applied(self) -> int:
        """Updates this process put into the ledger's slots (own and peers'), released ones included."""
        return sum(self.outcomes[o.value] for o in APPLIED) + self.released

    def has_seen(self, update_id: bytes) -> bool:
        return self._ledger.has_seen(update_id)

    async def changed(self) -> None:
        """Return after the next change of the ledger."""
        await self._changed.wait()

    def _notify(self) -> None:
        self.version += 1
        self._digests = None
        self._changed.set()
        self._changed = trio.Event()

    async def _run(self, fn: Callable[[], T]) -> T:
        """Run `fn` on the ledger in a worker thread under the lock; refresh the views there too (even
        when `fn` raises), so they never see a half-done operation."""

        def work() -> T:
            try:
                return fn()
            finally:
                self._refresh()

        async with self._lock:
            return await trio.to_thread.run_sync(work)

    # ---- operations -------------------------------------------------------------------------------
    async def add(self, meta: UpdateMeta, deltas: Mapping[str, np.ndarray]) -> tuple[Outcome, list[ClosedSlot]]:
        """`Ledger.add`, then catch-up closes. Raises `RemoteProtocolError` (nothing changed) for a bad
        update; returns the outcome and the slots closed by catch-up."""

        def work() -> tuple[Outcome, list[ClosedSlot]]:
            outcome = self._ledger.add(meta, deltas)
            return outcome, self._catch_up()

        outcome, closed = await self._run(work)
        self.outcomes[outcome.value] += 1
        if outcome in _NEW_IDS:
            self.set_hash.add(meta.update_id)
        self._count(closed)
        self._notify()
        return outcome, closed

    def _catch_up(self) -> list[ClosedSlot]:
        closed = []
        while self._ledger.held_future() and max(self._ledger.held_future()) > self._ledger.slot + 1:
            closed.append(self._ledger.close_slot())
        return closed

    def _count(self, closed: list[ClosedSlot], why: str = "catch-up") -> None:
        for i, c in enumerate(closed):
            self.closed_here += 1
            self.released += c.released
            log.info("closed slot %d (%s): %d updates, %d released", c.slot, why if i == 0 else "catch-up",
                     c.updates, c.released)

    async def close_open(self, why: str = "policy") -> ClosedSlot:
        """Close the open slot (an outer step), then catch up. `why` is for the log line."""
        closed = await self._run(lambda: [self._ledger.close_slot(), *self._catch_up()])
        self._count(closed, why)
        self._notify()
        return closed[0]

    async def close_known(self) -> list[ClosedSlot]:
        """Close every slot that holds updates (open or held): the end of a drain."""

        def work() -> list[ClosedSlot]:
            out = []
            while self._ledger.updates_in_open_slot() or self._ledger.held_future():
                out.append(self._ledger.close_slot())
            return out

        closed = await self._run(work)
        self._count(closed, "end of run")
        if closed:
            self._notify()
        return closed

    async def params(self) -> dict[str, np.ndarray]:
        """The global parameters θ_slot (float32 copies)."""
        return await self._run(self._ledger.params)

    async def digests(self) -> tuple[bytes, bytes]:
        """(ledger digest, params digest) of the current state; cached until the next change."""
        if self._digests is None:
            version = self.version
            digests = await self._run(lambda: (self._ledger.ledger_digest(), self._ledger.params_digest()))
            if version != self.version:
                return digests  # changed meanwhile: valid for the moment it was taken, not cached
            self._digests = digests
        return self._digests

    @property
    def cached_digests(self) -> tuple[bytes, bytes] | None:
        return self._digests

    async def snapshot(self) -> tuple[LedgerSnapshot, bytes, bytes]:
        """A consistent (snapshot, ledger digest, params digest) triple."""

        def work() -> tuple[LedgerSnapshot, bytes, bytes]:
            return self._ledger.snapshot(), self._ledger.ledger_digest(), self._ledger.params_digest()

        return await self._run(work)

    async def snapshot_bytes(self) -> bytes:
        """The canonical snapshot encoding (for checkpoints)."""
        return await self._run(lambda: self._ledger.snapshot().to_bytes())

    async def replace(self, ledger: Ledger, seen_ids: Iterable[bytes]) -> None:
        """Adopt another ledger (a state sync); outcome counters of this process are kept."""
        async with self._lock:
            await trio.to_thread.run_sync(self._install, ledger, seen_ids)
        self._notify()

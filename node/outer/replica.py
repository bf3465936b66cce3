"""The node's replica of the outer optimizer: the one owner of its `Ledger` on the trio side.

Contract:
- Every ledger operation runs in a worker thread (`trio.to_thread.run_sync`) under one `trio.Lock`, so
  the ledger (not thread-safe) has one user at a time and its numpy work never blocks the trio loop.
- Catch-up: after every add and close, while updates are held for a slot past the open one, the open
  slot is closed — as far as `protocol.ledger.catchup` allows: at once to a slot that two origins (or
  every connected peer, if fewer) are at or past, but on the word of one origin by one slot at most and
  no sooner than `pace()`'s gap after the last close, so no single node moves the replica faster than
  the run's rounds. Closing never runs ahead of the updates it holds (`slot <= max held target slot`).
- `set_hash` is an order-independent hash of the set of update ids the ledger has seen (applied, held,
  dropped or orphaned). `agreement_hex()` combines it with the ledger's placement sum (which update sits
  at which slot, `protocol.ledger.fork`): two replicas with the same seen ids and the same placements
  (equal after closing the same slots) have the same agreement hash, whatever order things arrived in and
  however many slots each has closed; the drain compares it, so replicas whose histories forked keep
  differing there until the fork choice has reconciled them.
- Fork choice (`node.sync.repair` decides): `propose` stores a verified heavier peer state; `adopt_pending`
  installs it *between rounds* (the runtime calls it where no round is in flight, and resets the error
  feedback when it returns a result), re-adds this replica's own updates the new state can place at their
  target slot, and marks the rest of its seen ids as seen there (orphaned). It first takes the verdict
  again against this replica's state of the moment, and drops the proposal if that no longer says adopt
  (or if the caller knows the origin has moved on): every adoption moves to a heavier state, so replicas
  only grow heavier and the comparisons end, even with snapshots that were stale when compared. `guard`
  (`node.outer.forkguard`) remembers whose states a vet refused and which peers were adopted from lately.
- `changed()` fires after every operation that changed the ledger (for waiters such as the slot-close
  wait and the drain).
- The window bottom: a close leaves the step of the bottom's arrays (about half its work) to
  `Ledger.advance_bottom`, which `keep_bottom` (a task of the runtime) runs after the closes, as an
  operation of its own: the tasks a close wakes (a round taking its new base, an arriving update) get the
  lock first, and a catch-up of several slots steps the bottom in one sweep. Nothing depends on when it
  runs: the ledger's readers of the bottom (digests, snapshots) advance it themselves.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
import trio

from node.outer.agreement import IdSetHash, agreement_hex
from node.outer.forkguard import ForkGuard
from node.outer.outer_files import payload_blob
from protocol.ledger import (BottomStore, ClosedSlot, Ledger, LedgerSnapshot, LedgerView, Outcome, Payload,
                             SnapshotEntry, UpdateMeta, catch_up_target, reconcile)
from protocol.ledger.digest import Row
from protocol.ledger.proof import UpdateProof

__all__ = ["APPLIED", "Adopted", "Proposal", "Replica", "ServedState"]

log = logging.getLogger("node.outer.replica")

T = TypeVar("T")

APPLIED = frozenset({Outcome.APPLIED_OPEN, Outcome.FOLDED_LATE, Outcome.APPLIED_STALE})
_NEW_IDS = APPLIED | {Outcome.HELD_FUTURE, Outcome.DROPPED_STALE, Outcome.DROPPED_SURPLUS}  # they add the id to `seen`


@dataclass(frozen=True)
class Proposal:
    """A heavier peer state the fork choice decided to adopt (loaded and checked against its manifest).
    `view` is that state's view (the verdict is taken again against ours when adopting), `agreement`
    its agreement hash (what its origin announces while draining, if it still holds that state);
    `vouched`: a second peer signed a manifest of the same state (`ForkGuard.holds_off`)."""

    ledger: Ledger
    origin: str
    why: str
    view: LedgerView
    agreement: str
    proofs: Mapping[bytes, UpdateProof]  # its entries' (verified when its meta was: `node.sync.statefetch`)
    vouched: bool = False

    @classmethod
    def of(cls, ledger: Ledger, origin: str, why: str, view: LedgerView,
           proofs: Mapping[bytes, UpdateProof], vouched: bool = False) -> Proposal:
        agreement = agreement_hex(IdSetHash(view.seen), view.totals().placement)
        return cls(ledger, origin, why, view, agreement, proofs, vouched)


@dataclass(frozen=True)
class ServedState:
    """What `Replica.served_state` returns: `snapshot` has empty bottom arrays; `bottom` is the window
    bottom (parameters, momentum) when it was asked for."""

    snapshot: LedgerSnapshot
    ledger_digest: bytes
    params_digest: bytes
    bottom_digest: bytes
    bottom_rows: list[Row]  # the bottom's piece hashes (`Ledger.bottom_rows`)
    bottom: tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]] | None


@dataclass(frozen=True)
class Adopted:
    """What `Replica.adopt_pending` did: whose state, own updates re-added, own ids orphaned."""

    origin: str
    carried: int
    orphaned: int
    slot: int


def _catch_up(ledger: Ledger) -> list[ClosedSlot]:
    """Close slots until no update is held past the open slot (an adopted state; no pace rule)."""
    closed = []
    while ledger.held_future() and max(ledger.held_future()) > ledger.slot + 1:
        closed.append(ledger.close_slot())
    return closed


def _paced_catch_up(ledger: Ledger, peers: int, now: float, last_close_at: float | None,
                    min_gap_s: float) -> list[ClosedSlot]:
    """Close slots up to `protocol.ledger.catchup.catch_up_target` (see the module docstring)."""
    target = catch_up_target(ledger.slot + 1, ledger.held_future_origins(), peers=peers, now=now,
                             last_close_at=last_close_at, min_gap_s=min_gap_s, open_origins=ledger.open_origins())
    return [ledger.close_slot() for _ in range(target - ledger.slot - 1)]


class Replica:
    """Owner of one `Ledger` (see the module docstring). Read-only properties are cheap and current."""

    def __init__(self, ledger: Ledger, seen_ids: Iterable[bytes] = ()) -> None:
        """`seen_ids`: the ledger's seen set (from its snapshot), empty for a fresh ledger."""
        self._lock = trio.Lock()
        self._changed = trio.Event()
        self.outcomes: Counter[str] = Counter()  # this process's add outcomes (and entries evicted, forks adopted)
        self.released = 0  # held updates moved into a newly opened slot by this process
        self.closed_here = 0  # slots this process closed
        self.version = 0  # +1 per change
        self.pending: Proposal | None = None  # a peer state to adopt between rounds (fork choice)
        self.state_download = trio.Lock()  # held by the one whole-state download for a proposal (node.sync.repair)
        self.forked_with: set[str] = set()  # peers whose state forked from ours at the last comparison
        self.guard = ForkGuard(ledger.config.window, lambda: self.slot)  # whose heavier states not to adopt now
        # (connected peers, minimum seconds between closes on one origin's word): set by the runtime
        self.pace: Callable[[], tuple[int, float]] = lambda: (1, 0.0)
        self._last_close_at: float | None = None  # trio time of the last slot close
        # each window entry's signed-header proof, served with the state so peers can check it (protocol.ledger.proof)
        self.proofs: dict[bytes, UpdateProof] = {}
        # payloads the ledger no longer holds (an origin's surplus updates: `protocol.ledger.bound.surplus`):
        # `_unused` from the worker thread, turned into blob names on the trio thread for the clean-up
        self._unused: list[Payload] = []
        self._dropped_blobs: list[str] = []
        self._install(ledger, seen_ids)

    def _install(self, ledger: Ledger, seen: Iterable[bytes] | IdSetHash) -> None:
        """Make `ledger` the replica's (trio thread; `seen`: its seen ids, or their hash already made)."""
        self._ledger = ledger
        self.set_hash = seen if isinstance(seen, IdSetHash) else IdSetHash(seen)
        self._digests: tuple[bytes, bytes] | None = None
        self._refresh()

    # ---- cheap views ------------------------------------------------------------------------------
    def _refresh(self) -> None:
        led = self._ledger
        self.slot = led.slot
        self.base_slot = led.base_slot
        self.bottom_behind = led.bottom_behind
        self.open_count = led.updates_in_open_slot()
        self.held = led.held_future()
        self.shapes = led.shapes
        self.config = led.config
        self.placement = led.totals().placement
        evicted = led.take_evicted()
        if evicted:  # for a smaller id of their origin (`protocol.ledger.bound.surplus`)
            self.outcomes["evicted"] += len(evicted)
        unused = [*self._unused, *(e.payload for e in evicted if e.payload is not None)]
        if unused:
            self._unused = []
            live = {payload_blob(e.payload) for e in led.entries() if e.payload is not None}
            self._dropped_blobs.extend(b for p in unused if (b := payload_blob(p)) is not None and b not in live)

    def take_dropped_blobs(self) -> list[str]:
        """The payload blobs of updates the ledger left out since the last call (an origin's updates beyond
        the few a slot keeps of it, and copies of updates it had seen: e.g. fetched while the node was syncing
        a state that had seen them) and no update it holds uses: the clean-up may delete them now."""
        out, self._dropped_blobs = self._dropped_blobs, []
        return out

    @property
    def bottom_store(self) -> BottomStore:
        """Where the ledger keeps its window bottom (ledgers loaded to replace it should use the same)."""
        return self._ledger.bottom_store

    def agreement_hex(self) -> str:
        """Hash of (seen-id set, placement sum): see the module docstring."""
        return agreement_hex(self.set_hash, self.placement)

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
        """Run `fn` on the ledger in a worker thread under the lock, then refresh the views on the trio
        thread (even when `fn` raises). Thread-safety: only the worker thread touches the ledger, one
        operation at a time (the lock); the views (`slot`, `held`, ...) are written and read on the trio
        thread only, so a trio task sees them as of the last finished operation, never half-done."""
        async with self._lock:
            try:
                return await trio.to_thread.run_sync(fn)
            finally:
                self._refresh()

    # ---- operations -------------------------------------------------------------------------------
    async def add(self, meta: UpdateMeta, deltas: Mapping[str, np.ndarray], payload: Payload | None = None,
                  proof: UpdateProof | None = None) -> tuple[Outcome, list[ClosedSlot]]:
        """`Ledger.add` (`payload`: the encoded update `deltas` decode from, kept for snapshots; `proof`: what
        lets peers check its signature when they are sent this state), then catch-up closes. Raises
        `RemoteProtocolError` (nothing changed) for a bad update; returns the outcome and the slots closed by
        catch-up."""

        catch_up = self._catch_up_now()

        def work() -> tuple[Outcome, list[ClosedSlot]]:
            outcome = self._ledger.add(meta, deltas, payload=payload)
            if outcome in (Outcome.DROPPED_SURPLUS, Outcome.DUPLICATE) and payload is not None:
                self._unused.append(payload)  # a blob no entry uses (`_refresh` keeps those an entry holds)
            return outcome, catch_up()

        outcome, closed = await self._run(work)
        self.outcomes[outcome.value] += 1
        if outcome in _NEW_IDS:
            self.set_hash.add(meta.update_id)
            if proof is not None:
                self.proofs[meta.update_id] = proof
        self._count(closed)
        self._notify()
        return outcome, closed

    def _catch_up_now(self) -> Callable[[], list[ClosedSlot]]:
        """The paced catch-up, with the pace read now (on the trio thread), to run in the worker thread."""
        peers, gap = self.pace()
        now, last = trio.current_time(), self._last_close_at
        return lambda: _paced_catch_up(self._ledger, peers, now, last, gap)

    def _count(self, closed: list[ClosedSlot], why: str = "catch-up") -> None:
        if closed:
            self._last_close_at = trio.current_time()
        for i, c in enumerate(closed):
            self.closed_here += 1
            self.released += c.released
            log.info("closed slot %d (%s): %d updates, %d released", c.slot, why if i == 0 else "catch-up",
                     c.updates, c.released)

    async def close_open(self, why: str = "policy") -> ClosedSlot:
        """Close the open slot (an outer step), then catch up. `why` is for the log line."""
        catch_up = self._catch_up_now()
        closed = await self._run(lambda: [self._ledger.close_slot(), *catch_up()])
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

    async def keep_bottom(self) -> None:
        """Forever: once slots have left the window, step the bottom's arrays (`Ledger.advance_bottom`),
        after the tasks woken by the same change (see the module docstring)."""
        while True:
            while not self.bottom_behind:
                await self.changed()
            await trio.lowlevel.checkpoint()
            stepped = await self._run(self._ledger.advance_bottom)
            log.debug("window bottom stepped through %d slot(s)", stepped)

    async def params(self) -> dict[str, np.ndarray]:
        """The global parameters θ_slot (float32 copies)."""
        return await self._run(self._ledger.params)

    async def updates_of(self, origin: str) -> list[UpdateMeta]:
        """The headers of `origin`'s updates in the window, the open slot and the future slots."""
        return await self._run(lambda: [e.meta for e in self._ledger.entries() if e.meta.origin == origin])

    async def params_at(self) -> tuple[int, dict[str, np.ndarray]]:
        """(slot, θ_slot) taken together: the slot the parameters belong to, whatever closes meanwhile."""
        return await self._run(lambda: (self._ledger.slot, self._ledger.params()))

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

    async def checkpoint_state(self) -> tuple[LedgerSnapshot, tuple[dict[str, np.ndarray], dict[str, np.ndarray]], list[Row]]:
        """A snapshot, the working state and the bottom's rows taken with it (`Ledger.working_state`: copies in
        the bottom store's files): what a checkpoint holds (`node.outer.resume`), so that a restore resumes
        without replaying the window."""
        return await self._run(lambda: (self._ledger.snapshot(), self._ledger.working_state(), self._ledger.bottom_rows()))

    async def served_state(self, frozen: Callable[[bytes], bool]) -> ServedState:
        """A consistent view of the state for the state server (`node.sync.stateserve`): the snapshot's fields
        with empty bottom arrays, the digests, and the window bottom's arrays (a copy) only when
        `frozen(bottom digest)` is false, i.e. when the server has not written that bottom to a file yet.
        `frozen` runs in the worker thread."""

        def work() -> ServedState:
            led = self._ledger
            bottom_digest, rows = led.bottom_digest(), led.bottom_rows()
            full = None if frozen(bottom_digest) else led.snapshot()
            view = led.view()
            snap = LedgerSnapshot(
                slot=led.slot, base_slot=led.base_slot, config=led.config.fingerprint(), shapes=led.shapes,
                base_params={}, base_momentum={},
                entries=tuple(SnapshotEntry(e.meta, e.slot, e.deltas, e.payload) for e in led.entries()),
                chain=view.chain, seen=tuple(sorted(view.seen)), counters=led.counters,
                applied_tokens=view.final.tokens, applied_sum=view.final.placement)
            return ServedState(snap, led.ledger_digest(), led.params_digest(), bottom_digest, rows,
                               None if full is None else (full.base_params, full.base_momentum))

        served = await self._run(work)
        self.prune_proofs(e.meta.update_id for e in served.snapshot.entries)
        return served

    def prune_proofs(self, window: Iterable[bytes]) -> None:
        """Forget the proofs of updates no longer in the window (`window`: the ids still in it)."""
        keep = set(window)
        self.proofs = {i: p for i, p in self.proofs.items() if i in keep}

    async def prune_proofs_to_window(self) -> None:
        """`prune_proofs` with the ledger's window now (once a round: the proofs stay bounded by the window)."""
        self.prune_proofs(await self._run(lambda: [e.meta.update_id for e in self._ledger.entries()]))

    async def snapshot_bytes(self) -> bytes:
        """The canonical snapshot encoding (for checkpoints)."""
        return await self._run(lambda: self._ledger.snapshot().to_bytes())

    async def replace(self, ledger: Ledger, seen_ids: Iterable[bytes],
                      proofs: Mapping[bytes, UpdateProof] | None = None) -> None:
        """Adopt another ledger (a state sync, with its entries' `proofs`); outcome counters of this process
        are kept."""
        self.pending = None
        async with self._lock:
            set_hash = await trio.to_thread.run_sync(IdSetHash, seen_ids)  # hashing every id: off the loop
            self._install(ledger, set_hash)
            self.proofs.update(proofs or {})
        self._notify()

    # ---- fork choice (protocol.ledger.fork) --------------------------------------------------------
    async def view(self) -> LedgerView:
        return await self._run(self._ledger.view)

    async def ignore(self, update_ids: Iterable[bytes]) -> int:
        """Mark ids as seen without applying them (`Ledger.ignore`); returns how many were new."""
        wanted = set(update_ids)

        def work() -> list[bytes]:
            new = [i for i in wanted if not self._ledger.has_seen(i)]
            self._ledger.ignore(new)
            return new

        new = await self._run(work) if wanted else []
        for update_id in new:
            self.set_hash.add(update_id)
        if new:
            self.outcomes["orphaned"] += len(new)
            self._notify()
        return len(new)

    def take_rechecks(self) -> list[str]:
        """Peers to compare with again (the last comparison found a fork), once each: a comparison that
        finds the fork again puts the peer back. Verdicts taken while the updates of a partition were
        still in a window can differ between the two sides once; comparing until compatible settles it."""
        peers, self.forked_with = sorted(self.forked_with), set()
        return peers

    def propose(self, proposal: Proposal) -> None:
        """Adopt `proposal` at the next `adopt_pending` (a later proposal replaces an earlier one)."""
        self.pending = proposal

    async def adopt_pending(self, current: Callable[[Proposal], bool] | None = None,
                            vet: Callable[[Proposal], Awaitable[bool]] | None = None) -> Adopted | None:
        """Install the pending proposal, if any (call only where no round is in flight: the caller then
        resets its error feedback). Own updates the new state has not seen are re-added if it can place
        them at their target slot (above its window bottom), the rest of the own seen ids are marked seen
        there (orphaned).

        The proposal is dropped instead when `current(proposal)` says its origin no longer holds that
        state (the drain knows: draining peers announce their agreement hash), or when the verdict, taken
        again against this replica's state *now*, no longer says adopt (this replica changed since the
        comparison: pulled, adopted from another peer, or received updates). So an adoption always moves
        this replica to a state heavier than the one it leaves, by the order of `protocol.ledger.fork`,
        whatever the age of the snapshot: the replicas' weights only grow, and the comparisons end.

        `vet(proposal)` (the runtime's: `node.outer.upkeep.BetweenRounds.vet`, a held-out comparison of the
        two models) may refuse it: counted (`fork-refused`), and none of its origin's states is downloaded
        for a while (`node.outer.forkguard`, which also drops a proposal of a peer adopted from lately)."""
        proposal, self.pending = self.pending, None
        if proposal is None:
            return None
        if current is not None and not current(proposal):
            log.info("dropped the proposed state of %s: it has moved on since", proposal.origin)
            return None
        held_off = self.guard.holds_off(proposal.origin, vouched=proposal.vouched)
        if held_off is not None:
            log.warning("dropped the proposed state of %s: %s", proposal.origin, held_off)
            return None
        vouch_lifted = self.guard.adopted_recently(proposal.origin)  # only its vouch let it through
        if vet is not None and not await vet(proposal):
            self.guard.refuse(proposal.origin)
            self.outcomes["fork-refused"] += 1
            return None

        def work() -> tuple[int, int, list[ClosedSlot], Ledger, IdSetHash] | None:
            if not reconcile(self._ledger.view(), proposal.view).adopt:
                return None
            new = proposal.ledger
            carried, orphaned = new.carry_from(self._ledger)
            closed = _catch_up(new)
            return carried, orphaned, closed, new, IdSetHash(new.seen_ids())

        done = await self._run(work)
        if done is None:
            log.info("dropped the proposed state of %s: ours has changed and is no lighter now", proposal.origin)
            return None
        carried, orphaned, closed, new, set_hash = done
        self._install(new, set_hash)  # on the trio thread, before any other operation can start
        self.proofs.update(proposal.proofs)
        self._count(closed, "adoption")
        self.outcomes["fork-adopted"] += 1
        self.outcomes["orphaned"] += orphaned
        self.guard.adopted(proposal.origin, vouched=vouch_lifted)
        self._notify()
        log.warning("adopted the state of %s (%s): now at slot %d; %d own updates re-added, %d orphaned",
                    proposal.origin, proposal.why, self.slot, carried, orphaned)
        return Adopted(proposal.origin, carried, orphaned, self.slot)

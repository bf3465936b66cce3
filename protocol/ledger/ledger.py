"""The slot ledger: one node's replica of the replicated outer optimizer (owner of its state machine).

Slots. Slot 0 is the initial state. A replica that has *closed* ``n`` slots holds ``θ_n, v_n`` and has one
*open* slot ``n+1`` collecting updates. An update is assigned to slot ``publish_slot + 1`` (see
:mod:`protocol.ledger.weights`); on :meth:`Ledger.add` it is, by that slot ``r``:

* ``r > n+1``: held (``HELD_FUTURE``) until slot ``r`` opens here;
* ``r = n+1``: added to the open slot (``APPLIED_OPEN``);
* ``n−W < r ≤ n`` (the window): added to closed slot ``r``; the change ``δ`` of its aggregate is folded
  into ``θ_n, v_n`` in closed form (``FOLDED_LATE``, see :mod:`protocol.ledger.outer`), or the window is
  replayed from its bottom under an outer rule that has no closed form (:mod:`protocol.ledger.rules`);
* ``r ≤ n−W``: applied at the open slot with staleness ``n − base_slot`` (``APPLIED_STALE``) or dropped
  (``DROPPED_STALE``), by ``config.stale_policy``;
* an id seen before: ignored (``DUPLICATE``).

A slot (or a future slot's held list) keeps at most ``K + 1`` updates of one origin
(``config.max_updates_per_origin``, :func:`~protocol.ledger.bound.surplus`): one whose id is larger than
those it holds is dropped (``DROPPED_SURPLUS``, remembered); one with a smaller id joins and the largest
leaves (*evicted*: :meth:`Ledger.take_evicted` hands it to the owner, whose blob store may let its payload
go). An origin with that many counts for nothing in the slot, so neither changes an aggregate.

Central invariant. Two replicas with the same config and initial state, that have closed the same number
of slots and received the same set of updates — each one while its slot was open, in the window, or in
the future, never after it left the window — hold the same parameters and momentum, whatever the arrival
order and whenever they closed their slots. Precisely:

* the *canonical* state (:meth:`canonical_state`; :meth:`params_digest` and :meth:`snapshot` describe it
  by the window bottom and the window's sets) is bit-identical: the state at the bottom of the
  window is only ever stepped with canonical aggregates (each recomputed from its set in ``update_id`` order), and
  the window is replayed from it the same way (bits are guaranteed between replicas on the same numpy
  build; norms use numpy's pairwise summation, whose rounding could differ in another build);
* the *working* state (:meth:`params`, :meth:`momentum`) is what :meth:`close_slot` and the fold update.
  A close steps it with the closing slot's canonical aggregate, exactly as the canonical replay does, so
  it *is* the canonical state bit for bit until a late update is folded in; a fold applies the change in
  closed form, whose rounding (float32, the state's dtype) depends on the arrival order: the working
  state then equals the canonical one up to float32 rounding (checked by the property tests).
  :meth:`resync` replaces it by the canonical state (W outer steps of work).

Deduplication: every update id accepted (applied, held or dropped) is remembered for the life of the
replica and travels in snapshots (32 bytes each), so an update is applied once however late a copy
arrives. Validation failures raise before any state changes.

Totals and forks. The ledger also keeps the *totals* of its finalized slots (tokens, placement sum: see
:mod:`protocol.ledger.fork`), so :meth:`view` can describe the whole history to the fork choice, which
decides between replicas whose histories can no longer be merged (a partition longer than the window):
:meth:`ignore` marks a losing side's ids as seen (orphaned), :meth:`carry_from` re-adds a replaced
replica's updates to the state that replaced it.

Updates that arrived after their slot left the window break the invariant by design (where they land
depends on when they arrived); they are counted.

Memory, per parameter (docs/outer-memory.md has the node's budget): every update of the window, open slot
and future as its encoded payload (int4: ~0.53 B; a memory-mapped blob in a node; without a payload its
float32 deltas), decoded span by span when a slot's aggregate is computed; float32 working θ, v (8 B); the
newest closed slot's sum, float32 (4 B, :mod:`protocol.ledger.slot`); the float32 window bottom (8 B,
:mod:`protocol.ledger.bottom`) in a :class:`~protocol.ledger.storage.BottomStore` (a node's: memory-mapped
files, resident only during a pass); a float64 temporary per radial tensor in flight; float64 arithmetic
rounded once into the state.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from protocol.errors import LocalProtocolError, Reason, RemoteProtocolError
from protocol.ledger import digest as dg
from protocol.ledger.aggregate import SlotEntry
from protocol.ledger.bottom import WindowBottom
from protocol.ledger.bound import check_claim, counted, surplus
from protocol.ledger.entry import make_entry
from protocol.ledger.config import EVICTED, ORPHANED, RELEASED, LedgerConfig, Outcome, StalePolicy, UpdateMeta
from protocol.ledger.fork import LedgerView, Placed, Totals, weigh
from protocol.ledger.outer import fold_change, step_slots
from protocol.ledger.rules import outer_rule
from protocol.ledger.payload import Payload
from protocol.ledger.slot import LiveSlot
from protocol.ledger.restore import restored, snapshot_of
from protocol.ledger.snapshot import LedgerSnapshot
from protocol.ledger.storage import STATE_DTYPE, BottomStore
from protocol.ledger.weights import check_meta, update_weight
from protocol.parallel import parallel_map

__all__ = ["ClosedSlot", "Ledger"]



@dataclass(frozen=True)
class ClosedSlot:
    """What :meth:`Ledger.close_slot` did: the slot closed, how many updates it held, how many held
    future updates the newly opened slot received."""

    slot: int
    updates: int
    released: int


class Ledger:
    """One replica of the slot ledger. Pure and synchronous; not thread-safe (one owner)."""

    def __init__(
        self,
        params: Mapping[str, np.ndarray],
        config: LedgerConfig,
        momentum: Mapping[str, np.ndarray] | None = None,
        *,
        bottom: BottomStore | None = None,
    ) -> None:
        """Start at slot 0 from ``params`` (and ``momentum``, zeros by default). Arrays are copied; the
        window bottom's into arrays of ``bottom`` (:mod:`protocol.ledger.storage`, default in memory)."""
        if not params:
            raise LocalProtocolError("params must name at least one tensor")
        self.config = config
        self._rule = outer_rule(config)
        self._shapes: dict[str, tuple[int, ...]] = {n: tuple(np.shape(params[n])) for n in sorted(params)}
        if momentum is None:
            momentum = {n: np.zeros((), dtype=STATE_DTYPE) for n in self._shapes}  # broadcast: no model-sized zeros
        elif sorted(momentum) != list(self._shapes) or any(
            np.shape(momentum[n]) != s for n, s in self._shapes.items()
        ):
            raise LocalProtocolError("momentum must have the same names and shapes as params")
        self._restore(0, 0, WindowBottom(self._shapes, params, momentum, bottom), dg.GENESIS, Totals(), [], set(),
                      Counter(), None)

    def _restore(
        self,
        n: int,
        base: int,
        bottom: WindowBottom,
        chain: bytes,
        final: Totals,
        entries: list[SlotEntry],
        seen: set[bytes],
        counters: Counter,
        working: tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]] | None,
    ) -> None:
        """(Re)build every field from the persistent state; shared by ``__init__`` and snapshots. The
        working state is ``working`` (adopted, see :meth:`from_snapshot`) or replayed from the bottom."""
        self._n = n
        self._base = base
        self._bottom = bottom
        self._chain = chain
        self._final = final  # totals of the finalized slots (protocol.ledger.fork)
        self._seen = seen
        self._counters: Counter = counters
        self._evicted: list[SlotEntry] = []
        self._held: dict[int, list[SlotEntry]] = {}
        live: dict[int, list[SlotEntry]] = {s: [] for s in range(base + 1, n + 2)}
        for e in entries:
            (live if e.slot <= n + 1 else self._held).setdefault(e.slot, []).append(e)
        self._slots = {s: LiveSlot(s, self._shapes, self.config, es) for s, es in live.items()}
        if n in self._slots:
            self._slots[n].keep()  # the newest closed slot keeps its sums (the first fold into it computes them)
        self._theta, self._v = self.canonical_state() if working is None else working

    # -- read-only views ----------------------------------------------------------------------------
    @property
    def slot(self) -> int:
        """Number of closed slots ``n`` (the open slot is ``n + 1``)."""
        return self._n

    @property
    def base_slot(self) -> int:
        """Bottom of the window: slots ``≤ base_slot`` are final."""
        return self._base

    @property
    def bottom_behind(self) -> int:
        """Final slots not yet stepped into the window bottom's arrays (:meth:`advance_bottom`)."""
        return self._bottom.behind

    @property
    def bottom_store(self) -> BottomStore:
        """Where the window bottom's arrays (and :meth:`working_state`'s copies) live."""
        return self._bottom.store

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return dict(self._shapes)

    @property
    def counters(self) -> dict[str, int]:
        """Outcome counts of :meth:`add` (by ``Outcome`` value), ``"released"`` and ``"orphaned"``."""
        return {**{o.value: 0 for o in Outcome}, RELEASED: 0, ORPHANED: 0, EVICTED: 0, **self._counters}

    def updates_in_open_slot(self) -> int:
        return len(self._slots[self._n + 1].entries)

    def open_origins(self) -> frozenset[str]:
        """The origins of the updates in the open slot."""
        return frozenset(e.meta.origin for e in self._slots[self._n + 1].entries)

    def held_future(self) -> dict[int, int]:
        """Number of held updates per future slot."""
        return {s: len(es) for s, es in sorted(self._held.items())}

    def held_future_origins(self) -> dict[int, frozenset[str]]:
        """The origins of the updates held per future slot (the evidence `protocol.ledger.catchup` weighs)."""
        return {s: frozenset(e.meta.origin for e in es) for s, es in sorted(self._held.items())}

    def has_seen(self, update_id: bytes) -> bool:
        return update_id in self._seen

    def seen_ids(self) -> frozenset[bytes]:
        return frozenset(self._seen)

    def entries(self) -> list[SlotEntry]:
        """Every update of the window, the open slot and the future slots, by (target slot, id)."""
        live = [e for es in (*(s.entries for s in self._slots.values()), *self._held.values()) for e in es]
        return sorted(live, key=lambda e: (e.meta.target_slot, e.meta.update_id))

    def totals(self) -> Totals:
        """Tokens (of the updates that count) and placement sum of every update applied or held since genesis
        (``protocol.ledger.fork``): a function of the applied (id, slot) pairs, whatever the arrival order
        and slot closing."""
        return self._final.plus(self._weigh(self.entries()))

    def view(self) -> LedgerView:
        """This state as the fork choice sees it (no tensors)."""
        placed = tuple(map(_placed, self.entries()))
        return LedgerView(self._n, self._base, self._chain, self._final, placed, frozenset(self._seen),
                          self.config.max_updates_per_origin)

    def _weigh(self, entries: Iterable[SlotEntry]) -> Totals:
        return weigh(map(_placed, entries), self.config.max_updates_per_origin)

    def applied_ids(self, slot: int) -> list[bytes]:
        """Sorted ids applied at a live slot (window or open)."""
        if slot not in self._slots:
            raise LocalProtocolError(f"slot {slot} is not live (live: {self._base + 1}..{self._n + 1})")
        return sorted(self._slots[slot].ids())

    def params(self, dtype: type = np.float32) -> dict[str, np.ndarray]:
        """Copy of the working parameters ``θ_n`` (float32 by default)."""
        return {n: self._theta[n].astype(dtype) for n in self._shapes}

    def momentum(self, dtype: type = np.float32) -> dict[str, np.ndarray]:
        """Copy of the working momentum ``v_n``."""
        return {n: self._v[n].astype(dtype) for n in self._shapes}

    def working_state(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """Copies of the working ``θ_n, v_n`` in arrays of the bottom store (a node's: memory-mapped files,
        no resident memory once written out): with a :meth:`snapshot` taken in the same operation, what
        :meth:`from_snapshot` resumes from without replaying the window (a node's checkpoint)."""
        return self._bottom.copy_of(self._theta), self._bottom.copy_of(self._v)

    # -- the state machine --------------------------------------------------------------------------
    def add(self, meta: UpdateMeta, deltas: Mapping[str, np.ndarray], payload: Payload | None = None) -> Outcome:
        """Apply, fold, hold or drop one update (see the module docstring); returns and counts the outcome.

        ``deltas`` are the float32 dequantized pseudo-gradients ``θ_base − θ_local``. Arrays that own their
        memory and are C-contiguous are *adopted*, not copied: the ledger keeps them and marks them
        read-only (a later write by the caller raises). Others (views, strided) are copied.
        ``payload``, if given, is the encoded update that ``deltas`` are the exact decode of (the caller's
        contract; only its codec and size are checked, ``LocalProtocolError``): kept with the entry, and
        what snapshots store. Raises ``RemoteProtocolError`` (bad slot, schema, shape, non-finite)
        without changing any state.
        """
        check_meta(meta)
        check_claim(meta, self.config)
        if meta.update_id in self._seen:
            return self._count(Outcome.DUPLICATE)
        n, target = self._n, meta.target_slot
        if target > n + 1 + self.config.max_future_slots:
            raise RemoteProtocolError(Reason.BAD_SLOT, f"slot {target} is too far ahead of open slot {n + 1}")
        stale = target <= self._base
        end = self.config.end_slot
        if end is not None and (n + 1 if stale else target) > end:
            raise RemoteProtocolError(Reason.PAST_END, f"it would enter slot {n + 1 if stale else target}, after the "
                                                       f"run's last slot {end}")
        if stale and self.config.stale_policy is StalePolicy.DROP:
            self._seen.add(meta.update_id)
            return self._count(Outcome.DROPPED_STALE)
        applied_at = n + 1 if stale else target
        place = self._held.get(target, []) if target > n + 1 else self._slots[applied_at].entries
        over = surplus(place, meta, self.config.max_updates_per_origin)
        if over is meta:
            self._seen.add(meta.update_id)
            return self._count(Outcome.DROPPED_SURPLUS)
        entry, now = self._make_entry(meta, applied_at, deltas, payload)
        self._seen.add(meta.update_id)
        outcome = self._place(entry, now, stale)
        if over is not None:
            place.remove(over)  # its origin counted for nothing before and after: no aggregate changed
            self._evicted.append(over)
            self._counters[EVICTED] += 1
        return self._count(outcome)

    def take_evicted(self) -> list[SlotEntry]:
        """The entries that left their slot since the last call, each for a smaller id of its origin (see
        :func:`~protocol.ledger.bound.surplus`): their payloads are no longer part of the state."""
        out, self._evicted = self._evicted, []
        return out

    def _place(self, entry: SlotEntry, now: Mapping[str, np.ndarray], stale: bool) -> Outcome:
        """Put a new ``entry`` where it belongs: held, into the open slot, or folded into a closed one."""
        n, target = self._n, entry.meta.target_slot
        if target > n + 1:
            self._held.setdefault(target, []).append(entry)
            return Outcome.HELD_FUTURE
        slot = self._slots[entry.slot]
        if entry.slot == n + 1:
            slot.add(entry)  # summed when the slot closes
            return Outcome.APPLIED_STALE if stale else Outcome.APPLIED_OPEN
        limit = self.config.max_updates_per_origin
        if [e.meta.update_id for e in counted(slot.entries, limit)] == [
            e.meta.update_id for e in counted([*slot.entries, entry], limit)
        ]:  # it does not count and takes nobody's place: every coefficient stays (the bound reads only these)
            slot.add(entry)
            return Outcome.FOLDED_LATE
        if not self._rule.linear:  # no closed form: replay the window from its bottom with the new set
            slot.add(entry)
            self.resync()
            return Outcome.FOLDED_LATE
        v_coef, theta_coef = self._rule.fold_coefficients(entry.slot, n, self.config.eta)

        def fold(name: str) -> None:
            u, change = slot.fold(name, entry, now)
            if change.terms or change.s_new != change.s_old:  # else the aggregate did not change: no pass
                fold_change(self._theta[name], self._v[name], u, name, change, v_coef, theta_coef)  # and u += Σ c·x
            self._settle_payloads([*slot.entries, entry])
            slot.took(name, u, change)

        parallel_map(fold, self._shapes)
        slot.add(entry)
        return Outcome.FOLDED_LATE

    def ignore(self, update_ids: Iterable[bytes]) -> int:
        """Mark ids as seen without applying them (a fork's orphaned updates, or ids a compatible peer
        never applied); later copies are ``DUPLICATE``. Returns how many were new; counted as orphaned."""
        new = set(update_ids) - self._seen
        for update_id in new:
            if not isinstance(update_id, bytes) or len(update_id) != 32:
                raise LocalProtocolError("update ids are 32 bytes")
        self._seen |= new
        self._counters[ORPHANED] += len(new)
        return len(new)

    def carry_from(self, old: Ledger) -> tuple[int, int]:
        """After this ledger replaced ``old`` (fork choice: ``old`` lost): re-add ``old``'s updates this one
        has not seen and can place at their target slot (above its window bottom; a future one is held),
        then mark every other id ``old`` has seen as orphaned here. Returns (re-added, orphaned)."""
        carried = 0
        for e in old.entries():
            target = e.meta.target_slot
            if e.meta.update_id in self._seen or not self._base < target <= self._n + 1 + self.config.max_future_slots:
                continue
            self.add(e.meta, e.deltas, payload=e.payload)
            carried += 1
        return carried, self.ignore(old.seen_ids())

    def close_slot(self) -> ClosedSlot:
        """Close the open slot ``n+1``: aggregate its set, take one outer step, open ``n+2`` (moving held
        updates for it in), and finalize the slot that leaves the window. When to call is the node's
        (and :class:`~protocol.ledger.policy.SlotClosePolicy`'s) business; the state never depends on it.

        The finalized slot's step of the window bottom's arrays is left for :meth:`advance_bottom` (about
        half a close's work): the bottom is *logically* at ``base_slot`` at once (the window, the chain and
        the totals move now), and every reader of its arrays (digests, snapshots, the canonical state)
        advances them first, so no result depends on when that happens.
        """
        s = self._n + 1
        if self.config.end_slot is not None and s > self.config.end_slot:
            raise LocalProtocolError(f"slot {s} is after the run's last slot {self.config.end_slot}: nothing to close")
        newest = self._slots.get(s - 1)  # the newest closed slot until now hands its kept sums over
        self._slots[s].keep(newest.release() if newest is not None else None)
        self._canonical_step(self._theta, self._v, [self._slots[s]])
        self._n = s
        count = len(self._slots[s].entries)
        while self._n - self._base > self.config.window:
            self._finalize()
        released = self._held.pop(s + 1, [])
        self._slots[s + 1] = LiveSlot(s + 1, self._shapes, self.config, released)
        self._counters[RELEASED] += len(released)
        return ClosedSlot(slot=s, updates=count, released=len(released))

    # -- canonical state, digests -------------------------------------------------------------------
    def canonical_state(self) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
        """``(θ_n, v_n)`` replayed from the window bottom with the window's canonical aggregates: a pure
        function of the closed-slot count and the applied sets (bit-identical across replicas)."""
        self.advance_bottom()
        theta, v = self._bottom.state()
        for s in range(self._base + 1, self._n + 1):
            self._canonical_step(theta, v, [self._slots[s]])
        return theta, v

    def resync(self) -> None:
        """Replace the working state by the canonical one (drops accumulated fold rounding)."""
        self._theta, self._v = self.canonical_state()

    def ledger_digest(self) -> bytes:
        """SHA-256 of (closed-slot count, chain, finalized totals, ids applied per slot for every slot up to the
        open one)."""
        live = (dg.slot_digest(s, self._slots[s].ids()) for s in range(self._base + 1, self._n + 2))
        return dg.ledger_digest(self._n, self._chain, self._final.tokens, self._final.placement_bytes(), live)

    def bottom_digest(self) -> bytes:
        """Tree digest of the window bottom's θ and v (float32) (:mod:`protocol.ledger.digest`), from its rows
        (:meth:`bottom_rows`)."""
        return dg.tree_digest_of_hashes(self.bottom_rows(), dg.BOTTOM_DOMAIN)

    def bottom_rows(self) -> list[dg.Row]:
        """The bottom digest's rows (each array's piece hashes: what a state server's piece index holds):
        hashed by the sweep that advanced the bottom, or on the first call after a restore, then kept."""
        self.advance_bottom()
        return self._bottom.rows()

    def params_digest(self) -> bytes:
        """Digest of the canonical state ``θ_n, v_n`` (what a node announces for its parameters): of the
        window bottom and the ledger digest, which together determine that state, so equal digests mean
        equal canonical parameters and momentum, bit for bit (:mod:`protocol.ledger.digest`, "state
        digest"). No replay: the bottom is hashed by the sweep that advances it (:meth:`advance_bottom`)."""
        return dg.state_digest(self.bottom_digest(), self.ledger_digest())

    # -- snapshots (protocol.ledger.restore) --------------------------------------------------------
    def snapshot(self) -> LedgerSnapshot:
        """The full persistent state as plain data (arrays are copies, the bottom's in arrays of the bottom
        store / read-only deltas)."""
        return snapshot_of(self)

    @classmethod
    def from_snapshot(
        cls,
        snap: LedgerSnapshot,
        config: LedgerConfig,
        shapes: Mapping[str, tuple[int, ...]] | None = None,
        *,
        bottom: BottomStore | None = None,
        working: tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]] | None = None,
    ) -> Ledger:
        """A replica that continues exactly from ``snap`` (its window bottom in ``bottom``'s arrays). Its
        working state is the canonical one, replayed from the bottom through the window (W outer steps of
        work), or ``working``: the ``(θ_n, v_n)`` of :meth:`working_state` taken with ``snap`` by this
        node itself (its own checkpoint: equal to the canonical state up to the float32 rounding of the late
        folds, as before the restart). Arrays of ``working`` that are float32, C-contiguous, writable and own
        their memory are taken over (the ledger writes them from now on), others copied.

        Checks that ``snap`` was made under the same config (fingerprint) and, if given, for a model of
        these ``shapes``, and that its entries are consistent (:mod:`protocol.ledger.snapshot_check`);
        ``RemoteProtocolError(BAD_STATE)`` if not.
        """
        return restored(cls, snap, config, shapes, bottom, working)

    # -- internals ----------------------------------------------------------------------------------
    def _count(self, outcome: Outcome) -> Outcome:
        self._counters[outcome.value] += 1
        return outcome

    def _make_entry(
        self, meta: UpdateMeta, slot: int, deltas: Mapping[str, np.ndarray], payload: Payload | None
    ) -> tuple[SlotEntry, Mapping[str, np.ndarray]]:
        return make_entry(meta, slot, deltas, payload, self._shapes, update_weight(meta, slot, self.config))

    def _canonical_step(self, theta: dict, v: dict, slots: list[LiveSlot], rows: dict[str, dg.Row] | None = None) -> None:
        """:func:`~protocol.ledger.outer.step_slots` by the run's rule, payload pages let go after each pass.
        ``rows`` (the window bottom's sweep): the arrays are the bottom store's; each stepped tensor is hashed
        into ``rows`` (its tree-digest rows, ``"theta/<name>"`` and ``"momentum/<name>"``) while it is still
        in memory, then settled."""

        def hashed(name: str) -> None:
            rows["theta/" + name] = dg.tree_row("theta/" + name, theta[name])
            rows["momentum/" + name] = dg.tree_row("momentum/" + name, v[name])
            self.bottom_store.settle((theta[name], v[name]))

        step_slots(self._rule, self.config, self._shapes, theta, v, slots, self._settle_payloads,
                   None if rows is None else hashed)

    def _settle_payloads(self, entries: Iterable[SlotEntry]) -> None:
        """A pass over these entries' payloads (or one tensor of them) is over: the store may let their
        pages go (a node's drops their mapped pages; another thread still reading faults them back in)."""
        self.bottom_store.settle([e.payload.data for e in entries if e.payload is not None])

    def _finalize(self) -> None:
        """Slot ``base+1`` leaves the window: its set is final; chain it, count its totals, and queue it for
        the bottom's arrays (:meth:`advance_bottom`)."""
        s = self._base + 1
        retired = self._slots.pop(s)
        self._chain = dg.chain_next(self._chain, dg.slot_digest(s, retired.ids()))
        self._final = self._final.plus(self._weigh(retired.entries))
        self._bottom.queue(retired)
        self._base = s

    def advance_bottom(self) -> int:
        """Step the window bottom's arrays with every slot that left the window since the last call, in one
        sweep over them (each tensor read, stepped slot after slot, hashed and written back once: the
        bottom digest is current when this returns). Returns how many slots it stepped (0: nothing to do).
        A node calls it after its closes, off the path of the new parameters; the readers of the bottom call
        it themselves."""
        return self._bottom.advance(self._canonical_step)


def _placed(e: SlotEntry) -> Placed:
    return Placed(e.meta.update_id, e.meta.target_slot, e.slot, e.meta.tokens, e.meta.origin)

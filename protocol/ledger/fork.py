"""Fork choice: what two replicas do when one's history cannot be merged into the other's.

Within the window, replicas converge by exchanging updates (the ledger folds late ones in exactly). A
partition longer than the window ``W`` breaks that: each side *finalizes* slots (they leave its window)
with a set of updates the other side never saw, and no later exchange can change a finalized slot. The
two histories have forked. This module decides, purely and identically on every node, which one wins.

**Views.** A :class:`LedgerView` is the part of a ledger state the decision needs (no tensors): closed
slots ``n``, window bottom ``base``, the chain digest of the finalized slots, the *totals* of the
finalized slots, every update of the window, open slot and future slots with the slot it sits at, and
the seen ids. ``Ledger.view()`` makes one of a live ledger, :meth:`LedgerView.of_snapshot` of a peer's
snapshot.

**Compatible** (:func:`compatible`): each replica can reach a common state by adding the other's
updates. With ``k = max(base_a, base_b)``: the two chains extended through slot ``k`` (the lower side
folds its live slots ``base+1..k`` in, future slots included) are equal — the same ids at the same slots
up to ``k`` — and every update either side holds above ``k`` sits at the same slot on the other side, or
is unseen there and sits at its own target slot (so adding it there puts it at the same slot). Symmetric.

**Merge** (:func:`mergeable`): the updates of ``theirs`` that ``ours`` has not seen and can place at
their target slot (target above our window bottom) — what anti-entropy adds.

**The order** (:func:`fork_key`): when two states are incompatible, each side computes, for both states,
the *totals of the state merged with what it can take from the other*: ``(tokens, placement)``, where
``tokens`` is the number of tokens trained on by the updates that *count* (``protocol.ledger.bound``:
per slot, one per origin, none of an origin over the run's ``max_updates_per_origin`` there) among those
the state applied (or holds) since genesis, and ``placement`` the (unreduced) sum of ``SHA-256(id ‖
slot)`` over all of them. Only updates that count move the model, so only they weigh: a peer that
publishes many updates per slot adds no weight to the states that hold them. The heavier state wins (more tokens: the larger side of a partition), the placement sum breaks ties, the
ledger digest breaks a tie of both (only possible for equal id placements, i.e. never between
incompatible states). The updates both hold, or can merge, count on both sides: the comparison reduces
to the tokens of the updates each side *cannot* give the other — the work done apart during the
partition. That set is fixed once the partition has healed, so two nodes that compare at different
moments (each with its own current state and the other's slightly older snapshot) reach the same
verdict: antisymmetric, deterministic, and stable in time, which is what keeps adoptions from
flip-flopping.

**Verdict** (:func:`reconcile`): compatible — pull their mergeable updates, and mark the ids they have
seen but never applied (theirs to drop) as seen without applying them; incompatible and ours wins —
pull what we can, and mark the rest of their ids as seen (*orphaned*: never applied here); incompatible
and theirs wins — adopt their state, then re-add our own updates it can place at their target slot, and
orphan the rest of ours (see ``node.outer.replica.Replica.adopt_pending``).

Trust: the totals of the finalized slots come from the peer's signed snapshot and cannot be recomputed
(the finalized updates are gone); like the updates themselves, they are trusted from honest peers.
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass

from protocol.ledger import digest as dg
from protocol.ledger.bound import counting_ids

__all__ = ["LedgerView", "Placed", "Totals", "Verdict", "compatible", "fork_key", "mergeable", "placement_term",
           "reconcile", "weigh"]

PLACEMENT_DOMAIN = b"diloco/placement/v1\0"
SUM_BYTES = 40  # an unreduced sum of up to 2^64 SHA-256 values fits in 320 bits


def placement_term(update_id: bytes, slot: int) -> int:
    """The placement sum's term for an update applied (or held) at ``slot``."""
    return int.from_bytes(hashlib.sha256(PLACEMENT_DOMAIN + update_id + slot.to_bytes(8, "big")).digest(), "big")


@dataclass(frozen=True)
class Totals:
    """Tokens and placement sum over a set of applied updates (see the module docstring)."""

    tokens: int = 0
    placement: int = 0

    def plus(self, other: Totals) -> Totals:
        return Totals(self.tokens + other.tokens, self.placement + other.placement)

    def placement_bytes(self) -> bytes:
        return self.placement.to_bytes(SUM_BYTES, "big")


@dataclass(frozen=True)
class Placed:
    """One update a view holds above its window bottom: ``target`` = publish slot + 1, ``slot`` where it
    sits (the target, or the open slot of the moment for one applied stale)."""

    update_id: bytes
    target: int
    slot: int
    tokens: int
    origin: str


def weigh(placed: Iterable[Placed], limit: int | None) -> Totals:
    """Totals over updates at their slots: the tokens of those that count in their slot
    (:func:`protocol.ledger.bound.counting_ids` with ``limit`` = ``max_updates_per_origin``), the
    placement terms of all. A function of the set of (update, slot) pairs."""
    by_slot: dict[int, list[Placed]] = defaultdict(list)
    for p in placed:
        by_slot[p.slot].append(p)
    tokens = placement = 0
    for slot, group in by_slot.items():
        counts = counting_ids(((p.origin, p.update_id) for p in group), limit)
        tokens += sum(p.tokens for p in group if p.update_id in counts)
        placement += sum(placement_term(p.update_id, slot) for p in group)
    return Totals(tokens, placement)


@dataclass(frozen=True)
class LedgerView:
    """What the fork choice needs of a ledger state. ``entries`` are the live and held updates; ``limit``
    is the run's ``max_updates_per_origin`` (which updates count, :func:`weigh`)."""

    slot: int
    base_slot: int
    chain: bytes
    final: Totals
    entries: tuple[Placed, ...]
    seen: frozenset[bytes]
    limit: int | None

    @classmethod
    def of_snapshot(cls, snap) -> LedgerView:  # snap: LedgerSnapshot (not imported: no cycle)
        placed = (Placed(e.meta.update_id, e.meta.target_slot, e.slot, e.meta.tokens, e.meta.origin)
                  for e in snap.entries)
        entries = tuple(sorted(placed, key=lambda p: (p.target, p.update_id)))  # as Ledger.view() orders them
        limit = snap.config["max_updates_per_origin"]  # a snapshot's fingerprint is checked before it is read
        return cls(snap.slot, snap.base_slot, snap.chain, Totals(snap.applied_tokens, snap.applied_sum), entries,
                   frozenset(snap.seen), limit)

    def totals(self) -> Totals:
        """Totals of every update applied or held, since genesis (tokens: those that count)."""
        return self.final.plus(weigh(self.entries, self.limit))

    def _ids_by_slot(self) -> dict[int, list[bytes]]:
        by_slot: dict[int, list[bytes]] = defaultdict(list)
        for e in self.entries:
            by_slot[e.slot].append(e.update_id)
        return by_slot

    def chain_through(self, k: int) -> bytes:
        """The chain digest this state reaches once slots up to ``k`` (≥ base) are final, if nothing more
        arrives for them: the live slots' (and future slots') current sets folded in."""
        if k < self.base_slot:
            raise ValueError(f"slot {k} is below the window bottom {self.base_slot}")
        by_slot, chain = self._ids_by_slot(), self.chain
        for s in range(self.base_slot + 1, k + 1):
            chain = dg.chain_next(chain, dg.slot_digest(s, by_slot.get(s, ())))
        return chain

    def ledger_digest(self) -> bytes:
        """Equal to ``Ledger.ledger_digest()`` of the state this view was made of."""
        by_slot = self._ids_by_slot()
        live = (dg.slot_digest(s, by_slot.get(s, ())) for s in range(self.base_slot + 1, self.slot + 2))
        return dg.ledger_digest(self.slot, self.chain, self.final.tokens, self.final.placement_bytes(), live)


def mergeable(theirs: LedgerView, ours: LedgerView) -> list[Placed]:
    """Their updates ours has not seen and can place at their target slot, by (target, id)."""
    out = [e for e in theirs.entries if e.update_id not in ours.seen and e.target > ours.base_slot]
    return sorted(out, key=lambda e: (e.target, e.update_id))


def _placeable(src: LedgerView, dst: LedgerView, k: int) -> bool:
    """Every update ``src`` holds above slot ``k`` sits, or would sit once added, at the same slot in ``dst``."""
    dst_slot = {e.update_id: e.slot for e in dst.entries}
    for e in src.entries:
        if e.slot <= k:
            continue
        if e.update_id in dst.seen:
            if dst_slot.get(e.update_id) != e.slot:
                return False
        elif e.slot != e.target:
            return False
    return True


def compatible(a: LedgerView, b: LedgerView) -> bool:
    """Whether adding each other's updates brings ``a`` and ``b`` to one state (symmetric)."""
    k = max(a.base_slot, b.base_slot)
    return a.chain_through(k) == b.chain_through(k) and _placeable(a, b, k) and _placeable(b, a, k)


def fork_key(state: LedgerView, other: LedgerView) -> tuple[int, int, bytes]:
    """The order's key of ``state`` merged with what it can take from ``other``: larger wins."""
    pulled = (Placed(e.update_id, e.target, e.target, e.tokens, e.origin) for e in mergeable(other, state))
    t = state.final.plus(weigh((*state.entries, *pulled), state.limit))
    return (t.tokens, t.placement, state.ledger_digest())


@dataclass(frozen=True)
class Verdict:
    """What ``ours`` does about ``theirs`` (see the module docstring).

    compatible: no fork. adopt: theirs wins, replace our state by theirs (``pull``/``drop`` are empty).
    pull: ids of their updates to add, in this order. drop: their ids to mark seen without applying
    (``orphaned`` says whether it is a fork's losing side, else ids the peer itself never applied).
    keys: (ours, theirs) order keys, for logs; None when compatible."""

    compatible: bool
    adopt: bool
    pull: tuple[bytes, ...]
    drop: frozenset[bytes]
    orphaned: bool
    keys: tuple[tuple[int, int, bytes], tuple[int, int, bytes]] | None


def reconcile(ours: LedgerView, theirs: LedgerView) -> Verdict:
    """The verdict for ``ours`` after seeing ``theirs``. Pure; ``reconcile(b, a)`` is the mirror image of
    ``reconcile(a, b)``: at most one side adopts, and exactly one does when they are incompatible."""
    pull = mergeable(theirs, ours)
    pull_ids = tuple(e.update_id for e in pull)
    if compatible(ours, theirs):
        applied = {e.update_id for e in theirs.entries}
        return Verdict(True, False, pull_ids, frozenset(theirs.seen - ours.seen - applied), False, None)
    keys = (fork_key(ours, theirs), fork_key(theirs, ours))
    if keys[1] > keys[0]:
        return Verdict(False, True, (), frozenset(), True, keys)
    return Verdict(False, False, pull_ids, frozenset(theirs.seen - ours.seen - set(pull_ids)), True, keys)

"""A ledger to and from its :class:`~protocol.ledger.snapshot.LedgerSnapshot`: :meth:`Ledger.snapshot` and
:meth:`Ledger.from_snapshot` (:class:`~protocol.ledger.ledger.Ledger` owns the fields; this module, its
companion, reads them into a snapshot and rebuilds them from one)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np

from protocol.ledger.bottom import WindowBottom
from protocol.ledger.config import COUNTERS, LedgerConfig
from protocol.ledger.fork import Totals
from protocol.ledger.rules import outer_rule
from protocol.ledger.snapshot import LedgerSnapshot, SnapshotEntry
from protocol.ledger.snapshot_check import check_snapshot
from protocol.ledger.storage import BottomStore, owned_working_state

if TYPE_CHECKING:
    from protocol.ledger.ledger import Ledger

__all__ = ["restored", "snapshot_of"]


def snapshot_of(ledger: Ledger) -> LedgerSnapshot:
    """``ledger``'s full persistent state (its window bottom advanced first)."""
    ledger.advance_bottom()
    live = [e for s in sorted(ledger._slots) for e in ledger._slots[s].entries]
    held = [e for s in sorted(ledger._held) for e in ledger._held[s]]
    base_params, base_momentum = ledger._bottom.store_copies()
    return LedgerSnapshot(
        slot=ledger._n,
        base_slot=ledger._base,
        config=ledger.config.fingerprint(),
        shapes=dict(ledger._shapes),
        base_params=base_params,
        base_momentum=base_momentum,
        entries=tuple(SnapshotEntry(e.meta, e.slot, e.deltas, e.payload) for e in live + held),
        chain=ledger._chain,
        seen=tuple(sorted(ledger._seen)),
        counters=dict(ledger._counters),
        applied_tokens=ledger._final.tokens,
        applied_sum=ledger._final.placement,
    )


def restored(cls: type[Ledger], snap: LedgerSnapshot, config: LedgerConfig,
             shapes: Mapping[str, tuple[int, ...]] | None, bottom: BottomStore | None,
             working: tuple[Mapping[str, np.ndarray], Mapping[str, np.ndarray]] | None) -> Ledger:
    """The ledger :meth:`Ledger.from_snapshot` describes."""
    check_snapshot(snap, config, shapes, list(COUNTERS))
    if working is not None:
        working = tuple(owned_working_state(part, snap.shapes, what) for part, what in zip(working, ("θ", "v")))
    ledger = cls.__new__(cls)
    ledger.config = config
    ledger._rule = outer_rule(config)
    ledger._shapes = {name: tuple(snap.shapes[name]) for name in sorted(snap.shapes)}
    entries = [ledger._make_entry(e.meta, e.slot, e.deltas, e.payload)[0] for e in snap.entries]
    ledger._restore(
        snap.slot,
        snap.base_slot,
        WindowBottom(ledger._shapes, snap.base_params, snap.base_momentum, bottom),
        snap.chain,
        Totals(snap.applied_tokens, snap.applied_sum),
        entries,
        set(snap.seen),
        Counter(snap.counters),
        working,
    )
    return ledger

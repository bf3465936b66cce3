"""The outer-step ledger: slots, aggregates, the replicated Nesterov outer optimizer, snapshots, and the
slot-closing policy. Pure numpy, no I/O, no clock (time is an argument).

Start with :class:`Ledger` (the state machine and its invariant) and :class:`SlotClosePolicy` (when to close
the open slot); :func:`reconcile` is the fork choice between replicas whose histories cannot be
merged. Its benchmarks and demo are scripts under ``testnet/benchmarks/``.
"""

from protocol.ledger.aggregate import aggregate
from protocol.ledger.catchup import catch_up_target
from protocol.ledger.config import Aggregation, LedgerConfig, Outcome, StalePolicy, UpdateMeta, Weighting
from protocol.ledger.fork import LedgerView, Totals, Verdict, compatible, reconcile
from protocol.ledger.ledger import ClosedSlot, Ledger
from protocol.ledger.outer import fold_coefficients
from protocol.ledger.payload import Payload, PayloadDeltas
from protocol.ledger.policy import CloseDecision, ClosePolicyConfig, SlotClosePolicy
from protocol.ledger.snapshot import LedgerSnapshot, SnapshotEntry
from protocol.ledger.storage import STATE_DTYPE, BottomStore, InMemory
from protocol.ledger.weights import staleness, update_weight

__all__ = [
    "Aggregation",
    "BottomStore",
    "CloseDecision",
    "ClosePolicyConfig",
    "ClosedSlot",
    "Ledger",
    "LedgerConfig",
    "LedgerView",
    "LedgerSnapshot",
    "InMemory",
    "Outcome",
    "Payload",
    "PayloadDeltas",
    "SlotClosePolicy",
    "SnapshotEntry",
    "StalePolicy",
    "Totals",
    "UpdateMeta",
    "Verdict",
    "STATE_DTYPE",
    "Weighting",
    "aggregate",
    "catch_up_target",
    "compatible",
    "fold_coefficients",
    "reconcile",
    "staleness",
    "update_weight",
]

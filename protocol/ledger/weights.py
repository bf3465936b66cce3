"""Slot assignment and update weights, computed only from the signed header.

An update is assigned to slot ``publish_slot + 1``. If it is applied at a slot ``s`` (its own slot, or the
open slot when it arrived after its slot left the window), its staleness is ``s − 1 − base_slot`` — for an
update applied at its own slot that is ``publish_slot − base_slot``. The weight is a pure function of the
header and ``s``, so every replica that applies an update at the same slot gives it the same weight.
"""

from __future__ import annotations

from protocol.errors import LocalProtocolError, Reason, RemoteProtocolError
from protocol.ledger.config import ID_BYTES, LedgerConfig, UpdateMeta, Weighting
from protocol.ledger.fields import MAX_COUNT

__all__ = ["check_meta", "staleness", "update_weight"]


def check_meta(meta: UpdateMeta) -> None:
    """Refuse a header whose ledger fields cannot be right (a remote error: the sender signed it)."""
    if not isinstance(meta.update_id, bytes) or len(meta.update_id) != ID_BYTES:
        raise RemoteProtocolError(Reason.BAD_SCHEMA, f"update_id must be {ID_BYTES} bytes")
    for name in ("base_slot", "publish_slot", "tokens", "inner_steps"):
        if type(getattr(meta, name)) is not int:
            raise RemoteProtocolError(Reason.BAD_SCHEMA, f"{name} must be an int")
        if getattr(meta, name) > MAX_COUNT:
            raise RemoteProtocolError(Reason.BAD_SCHEMA, f"{name} must be at most 2^53")
    if meta.base_slot < 0 or meta.publish_slot < meta.base_slot:
        raise RemoteProtocolError(
            Reason.BAD_SLOT, f"need 0 ≤ base_slot ≤ publish_slot, got {meta.base_slot}, {meta.publish_slot}"
        )
    if meta.tokens <= 0 or meta.inner_steps <= 0:
        raise RemoteProtocolError(Reason.BAD_SCHEMA, "tokens and inner_steps must be > 0")


def staleness(meta: UpdateMeta, applied_slot: int) -> int:
    """Staleness of ``meta`` when applied at ``applied_slot``: ``applied_slot − 1 − base_slot`` (≥ 0)."""
    value = applied_slot - 1 - meta.base_slot
    if value < 0:
        raise LocalProtocolError(f"slot {applied_slot} is before the update's base slot {meta.base_slot}")
    return value


def update_weight(meta: UpdateMeta, applied_slot: int, config: LedgerConfig) -> float:
    """Weight of ``meta`` applied at ``applied_slot``: token part × ``(1 + staleness)^-α``. Always > 0."""
    if config.weighting is Weighting.TOKENS:
        base = float(meta.tokens)
    elif config.weighting is Weighting.TOKENS_PER_STEP:
        base = float(meta.tokens) * (float(meta.tokens) / float(meta.inner_steps))
    else:
        base = 1.0
    alpha = config.staleness_alpha
    if alpha == 0.0:
        return base
    return base * (1.0 + staleness(meta, applied_slot)) ** -alpha

"""Whether a :class:`~protocol.ledger.snapshot.LedgerSnapshot` is one a replica under a given config can
continue from: made under the same config, for the local model's tensors, its window where its slot puts
it, its ids unique and remembered, its counters known, and every entry's header valid and placed where the
ledger could have placed it (at its own slot, in the window or open; stale ones applied at a later slot;
future ones held within the look-ahead; no more of one origin in a slot than the ledger keeps). Raises
``RemoteProtocolError(BAD_STATE)`` naming what is wrong; a snapshot comes from a peer during a state sync,
so nothing in it is trusted. Pure."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from protocol.errors import RemoteProtocolError
from protocol.ledger.bound import check_claim, check_origin_places
from protocol.ledger.config import LedgerConfig
from protocol.ledger.fields import bad_state
from protocol.ledger.snapshot import LedgerSnapshot
from protocol.ledger.weights import check_meta

__all__ = ["check_snapshot"]


def check_snapshot(snap: LedgerSnapshot, config: LedgerConfig, shapes: Mapping[str, tuple[int, ...]] | None,
                   counters: Iterable[str]) -> None:
    """Check ``snap`` against ``config``, the local model's ``shapes`` (if given) and the ``counters`` a
    ledger keeps (see the module docstring)."""
    if dict(snap.config) != config.fingerprint():
        raise bad_state(f"config differs: snapshot {dict(snap.config)} vs local {config.fingerprint()}")
    if shapes is not None and {n: tuple(s) for n, s in shapes.items()} != dict(snap.shapes):
        raise bad_state("tensor names or shapes differ from the local model")
    n, base = snap.slot, snap.base_slot
    if config.end_slot is not None and n > config.end_slot:
        raise bad_state(f"slot {n} is after the run's last slot {config.end_slot}")
    if base != max(0, n - config.window):
        raise bad_state(f"base_slot {base} is not max(0, slot − window) for slot {n}")
    ids = [e.meta.update_id for e in snap.entries]
    if len(set(ids)) != len(ids) or not set(snap.seen).issuperset(ids):
        raise bad_state("entry ids must be unique and listed in seen")
    known = set(counters)
    if not known.issuperset(snap.counters):
        raise bad_state(f"unknown counters {sorted(set(snap.counters) - known)}")
    for e in snap.entries:
        try:
            check_meta(e.meta)
            check_claim(e.meta, config)
        except RemoteProtocolError as exc:
            raise bad_state(f"entry: {exc}") from None
        if config.end_slot is not None and e.slot > config.end_slot:
            raise bad_state(f"entry in slot {e.slot}, after the run's last slot {config.end_slot}")
        target, live = e.meta.target_slot, base < e.slot <= n + 1
        held = e.slot > n + 1 and e.slot == target and e.slot <= n + 1 + config.max_future_slots
        if not (held or (live and target <= e.slot and (target == e.slot or target <= e.slot - 1 - config.window))):
            raise bad_state(f"entry for slot {target} cannot sit at slot {e.slot} (closed {n}, base {base})")
    check_origin_places(((e.slot, e.meta) for e in snap.entries), config.max_updates_per_origin)

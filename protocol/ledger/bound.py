"""Bounded influence of any one update on a slot's aggregate (a pure function of the slot's set).

A validly signed update can carry any values. Three rules keep one hostile update, or one hostile node
publishing every round, from moving the model more than an honest update would:

* **Claimed work is checked** (:func:`check_claim`): ``inner_steps ≤ max_inner_steps`` and
  ``tokens ≤ tokens_per_step × inner_steps`` when the run configures them, so a token-weighted update
  cannot outweigh an honest full round.
* **One update per origin per slot** (:func:`counted`): of the updates one origin has in a slot, only the
  one with the smallest ``update_id`` counts; the others stay in the set (so every replica still holds
  the same set and digests) with no weight. Arrival order cannot matter: the smallest id of a set is a
  function of the set. An origin with more than ``K`` updates in a slot (``max_updates_per_origin``)
  counts for nothing there, and the slot keeps only its ``K + 1`` smallest ids (:func:`surplus`): the
  rest are remembered as seen and dropped. Ids are hashes a peer can grind and publish in decreasing
  order; without the limit each one would displace the counted one (a late fold that reads every payload
  of the slot) and be kept, on every node's disk and in every snapshot. With it, one origin changes a
  slot's aggregate at most ``K`` times after its first update (displaced, then left out), and holds at
  most ``K + 1`` places. Both are functions of the set of ids received, whatever their order: an origin
  left out never counts again in that slot, and the ``K + 1`` smallest ids of a set are the set's.
* **Norms are clipped to a robust bound** (:func:`norm_bound`): per tensor, ``τ = norm_clip ×`` the
  lower median of the counted updates' norms (the ``⌈m/2⌉``-th smallest of ``m``). An update larger than
  ``τ`` enters with norm ``τ``. While hostile updates are fewer than half the slot's origins, the median
  is an honest norm, so a ×10⁴ update counts as at most ``norm_clip`` honest ones in norm, and its
  direction at its (capped) token weight. The median counts origins, not tokens: a weighted median
  would let a hostile update that claims a full round outweigh an honest short round (measured: with two
  updates in a slot at close, the hostile one set ``τ`` and every honest replica took a ×10⁴ step).

* **Directions that disagree are screened out** (``protocol.ledger.aggregate``, ``direction_screen`` κ):
  with three or more counted updates, one whose cosine with the sum of the others is at most κ (0.05) is
  left out of that tensor's aggregate — a negated update's cosine is negative, a random direction's about
  ``1/sqrt(size)`` — unless that would leave out more than half (then there is no majority to judge by).
  It needs ``‖U‖²`` and each update's inner product with ``U``, taken in the pass that sums ``U``
  (``ScreenSums``); each further round of the screen, only when one was screened out, one more pass.

``norm_clip = 0`` disables all of it (the aggregate is then the unbounded one of earlier versions).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING

import numpy as np

from protocol.errors import RemoteProtocolError, Reason
from protocol.ledger.config import LedgerConfig, UpdateMeta

if TYPE_CHECKING:
    from protocol.ledger.aggregate import SlotEntry

__all__ = ["check_claim", "check_origin_places", "counted", "counting_ids", "distinct", "norm_bound", "surplus"]


def check_claim(meta: UpdateMeta, config: LedgerConfig) -> None:
    """Refuse a header that claims more work than the run allows (``BAD_CLAIM``; the sender signed it)."""
    if config.max_inner_steps is not None and meta.inner_steps > config.max_inner_steps:
        raise RemoteProtocolError(
            Reason.BAD_CLAIM, f"inner_steps {meta.inner_steps} > the run's {config.max_inner_steps}"
        )
    if config.tokens_per_step is not None and meta.tokens > config.tokens_per_step * meta.inner_steps:
        raise RemoteProtocolError(
            Reason.BAD_CLAIM,
            f"tokens {meta.tokens} > {config.tokens_per_step} per step × {meta.inner_steps} steps",
        )


def counting_ids(pairs: Iterable[tuple[str, bytes]], limit: int | None) -> set[bytes]:
    """Of one slot's updates, given as ``(origin, update_id)``, the ids that count: per origin the smallest,
    unless the origin has more than ``limit`` updates there (None: no limit), then none of its."""
    by_origin: dict[str, list[bytes]] = {}
    for origin, update_id in pairs:
        by_origin.setdefault(origin, []).append(update_id)
    return {min(ids) for ids in by_origin.values() if limit is None or len(ids) <= limit}


def counted(entries: Sequence[SlotEntry], limit: int | None = None) -> list[SlotEntry]:
    """The entries that count, in ascending ``update_id`` order: per origin the one :func:`counting_ids`
    names, and of those whose deltas are bit-identical (colluding origins publishing one payload) only the
    one with the smallest id (:func:`distinct`)."""
    ids = counting_ids(((e.meta.origin, e.meta.update_id) for e in entries), limit)
    return distinct(sorted((e for e in entries if e.meta.update_id in ids), key=lambda e: e.meta.update_id))


def distinct(entries: Sequence[SlotEntry]) -> list[SlotEntry]:
    """``entries`` (in ascending id order) without those whose deltas are bit for bit an earlier one's. Only
    entries whose norms agree in every tensor are compared (honest updates never do), and they are compared
    by their decoded binary32 bits, so the rule reads the deltas, not how they were encoded or sent."""
    out: list[SlotEntry] = []
    by_norms: dict[tuple[float, ...], list[SlotEntry]] = {}
    for e in entries:
        same = by_norms.setdefault(e.norms_key, [])
        if not any(_same_deltas(e, other) for other in same):
            same.append(e)
            out.append(e)
    return out


def _same_deltas(a: SlotEntry, b: SlotEntry) -> bool:
    """Whether ``a`` and ``b`` (of equal norms) hold the same binary32 bits: equal payloads at once, else
    decoded tensor by tensor. Remembered on ``a`` (every tensor's terms ask again)."""
    known = a.__dict__.setdefault("_same_deltas", {})  # a frozen dataclass's own dict: a cache, not a field
    key = b.meta.update_id
    if key not in known:
        if a.commitment is not None or b.commitment is not None:  # header entries: what their origins signed
            known[key] = a.commitment == b.commitment
        elif a.payload is not None and b.payload is not None and a.payload.codec == b.payload.codec \
                and a.payload.data == b.payload.data:
            known[key] = True
        else:
            known[key] = all(np.array_equal(np.asarray(a.deltas[n]).view(np.uint32), np.asarray(b.deltas[n]).view(np.uint32))
                             for n in sorted(a.norms))
    return known[key]


def surplus(entries: Sequence[SlotEntry], meta: UpdateMeta, limit: int | None) -> SlotEntry | UpdateMeta | None:
    """Where the update ``meta`` would go over the ``limit + 1`` updates a slot holding ``entries`` keeps of
    its origin: ``meta`` itself when its id is larger than all of them (it is dropped), else the entry of
    that origin with the largest id (it leaves the slot when ``meta`` joins); None while there is room."""
    if limit is None:
        return None
    same = [e for e in entries if e.meta.origin == meta.origin]
    if len(same) <= limit:
        return None
    largest = max(same, key=lambda e: e.meta.update_id)
    return meta if meta.update_id > largest.meta.update_id else largest


def check_origin_places(placed: Iterable[tuple[int, UpdateMeta]], limit: int | None) -> None:
    """Refuse a state (``BAD_STATE``) whose (slot, update) pairs hold more of one origin in a slot than a
    ledger keeps (``limit + 1``; None: no limit): a donor's meta, before its payloads are fetched, or a
    snapshot."""
    if limit is None:
        return
    places = Counter((slot, meta.origin) for slot, meta in placed)
    for (slot, origin), count in sorted(places.items()):
        if count > limit + 1:
            raise RemoteProtocolError(Reason.BAD_STATE, f"{count} updates of {origin} at slot {slot}: a slot keeps "
                                                        f"at most {limit + 1} of one origin")


def norm_bound(entries: Sequence[SlotEntry], name: str, config: LedgerConfig) -> float:
    """``τ`` of tensor ``name`` over the *counted* ``entries`` (``inf`` when the clip is off or there are
    none): ``norm_clip ×`` their lower median norm, ties in norm ordered by ``update_id``."""
    if config.norm_clip == 0.0 or not entries:
        return math.inf
    ranked = sorted(entries, key=lambda e: (e.norms[name], e.meta.update_id))
    return config.norm_clip * ranked[(len(ranked) - 1) // 2].norms[name]

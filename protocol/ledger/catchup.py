"""When a replica follows updates held for a later slot (catch-up), and when it lets them wait.

An update is assigned to slot ``publish_slot + 1``: the slot its sender had reached, plus one. A replica
whose open slot is lower *holds* it, and catching up means closing slots until that slot is open. Every
close is an outer step, momentum included, so slots must follow the run's *work*: if one node could move
every replica ahead by publishing quickly (a restarted node's burst of one-step rounds, or a signed
header that jumps ``publish_slot`` ahead), each of its publications would add a momentum step to every
replica, and the model would be pushed far along a stale direction in seconds. Measured: a dozen extra
momentum steps in two seconds took every node's held-out loss from ~3 to ~5.2 bits/byte.

The rule (`catch_up_target`). The *evidence* for slot ``r`` is the set of distinct origins of the updates
held for slots ``≥ r``.

* Quorum: ``min(2, peers)`` origins (``peers``: the node's connected peers; a run of two nodes follows
  its one peer). The replica catches up at once to the highest slot with a quorum of evidence: several
  nodes being there means the run is there.
* A single origin ahead moves the replica by at most one slot, and only when the replica's last slot
  close (of any kind) was at least ``min_gap_s`` ago (the caller passes half the run's measured round
  time), and only when the open slot already holds an update of another origin. Healthy runs close about
  one slot per round, so this never delays them; a node that publishes faster than the run moves nobody
  faster than about two slots per round; and it cannot make a replica close a slot that holds nothing but
  its own update (measured: an honest node closed such a slot on a hostile node's word, nobody published
  into it afterwards, and the slot's final set was the hostile update alone, which no median can bound;
  every honest node took its ×10⁴ step). The slot then closes by the node's own policy, with its own
  update in it.

Deferred updates stay held and are released when the replica's own close policy opens their slot (or
a later catch-up does): nothing is dropped and nothing stalls. The rule decides *when* slots close,
never what a closed slot holds, so replica agreement (same closed-slot count and sets → same bits) is
untouched.

Pure: time is an argument.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping

__all__ = ["catch_up_target"]

QUORUM_ORIGINS = 2


def catch_up_target(open_slot: int, held_origins: Mapping[int, Collection[str]], *, peers: int, now: float,
                    last_close_at: float | None, min_gap_s: float, open_origins: Collection[str] = ()) -> int:
    """The slot that should be open after catching up (``open_slot`` itself: close nothing).

    ``held_origins``: future slot → origins of the updates held for it. ``last_close_at``: when this
    replica last closed a slot (None: never). ``open_origins``: origins of the updates in the open slot."""
    future = sorted((s for s in held_origins if s > open_slot), reverse=True)
    if not future:
        return open_slot
    quorum = max(1, min(QUORUM_ORIGINS, peers))
    evidence: set[str] = set()
    for slot in future:  # highest first: evidence for `slot` is every origin held at or above it
        evidence |= set(held_origins[slot])
        if len(evidence) >= quorum:
            return slot
    if not set(open_origins) - evidence:
        return open_slot  # the open slot holds only the origin ahead (or nothing): it would close thin
    if last_close_at is None or now - last_close_at >= min_gap_s:
        return open_slot + 1
    return open_slot

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

* Quorum: a majority of the run as this node sees it, ``⌊(peers + 1) / 2⌋ + 1`` origins of its ``peers +
  1`` nodes (``peers``: its connected peers; at most ``peers``, so a run of two follows its one peer and a
  run of three follows two). The replica catches up at once to the highest slot with a quorum of evidence:
  most of the run being there means the run is there. A fixed quorum of two let two colluding members of
  a larger run move every honest replica to any slot they published for (measured in a run of two honest
  nodes and two colluders: the honest nodes reached the run's last slot after 10 of their rounds instead
  of ~24); a minority now moves a replica only by the one-slot rule below.
* Fewer origins ahead than a quorum (a single one, or colluders) move the replica by at most one slot,
  and only when the replica's last slot close (of any kind) was at least ``min_gap_s`` ago (the caller
  passes the run's measured round time), and only when the open slot already holds an update of an origin
  that is not ahead. Healthy runs close about one slot per round by their own policy, so this never delays
  them, and nodes that publish faster than the run do not hurry it: a close of either kind waits a round
  for the next one by this rule. (With half a round, in a run of two honest nodes and two colluders, an
  honest node ran 15 rounds to the run's end against 22 for an honest pair.) Nor can they make a replica
  close a slot that holds nothing but their own updates (measured: an honest node closed such a slot on a hostile node's word, nobody published
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

__all__ = ["catch_up_target", "quorum"]



def quorum(peers: int) -> int:
    """Origins whose evidence moves a replica at once: a majority of ``peers + 1`` nodes, at most ``peers``."""
    return max(1, min(peers, (peers + 1) // 2 + 1))


def catch_up_target(open_slot: int, held_origins: Mapping[int, Collection[str]], *, peers: int, now: float,
                    last_close_at: float | None, min_gap_s: float, open_origins: Collection[str] = ()) -> int:
    """The slot that should be open after catching up (``open_slot`` itself: close nothing).

    ``held_origins``: future slot → origins of the updates held for it. ``last_close_at``: when this
    replica last closed a slot (None: never). ``open_origins``: origins of the updates in the open slot."""
    future = sorted((s for s in held_origins if s > open_slot), reverse=True)
    if not future:
        return open_slot
    needed = quorum(peers)
    evidence: set[str] = set()
    for slot in future:  # highest first: evidence for `slot` is every origin held at or above it
        evidence |= set(held_origins[slot])
        if len(evidence) >= needed:
            return slot
    if not set(open_origins) - evidence:
        return open_slot  # the open slot holds only the origin ahead (or nothing): it would close thin
    if last_close_at is None or now - last_close_at >= min_gap_s:
        return open_slot + 1
    return open_slot

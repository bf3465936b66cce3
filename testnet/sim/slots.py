"""Ours: each learner's slot counter and open slot, closed by the node's own :class:`SlotClosePolicy`.

Slots follow the node's ledger (:mod:`protocol.ledger.ledger`): a learner that has closed ``n`` slots has
slot ``n+1`` open; its update carries ``s = n`` (the latest slot it knew) and is assigned to slot ``s+1``.
At a receiver that has closed ``n'`` slots the update is *open* (``s+1 = n'+1``: counts toward the quorum
of the open slot), *held* (``s+1 > n'+1``: counts once that slot opens), *late* (folded into a closed slot
inside the ledger window W) or *stale* (older than the window). A learner's own update is available to it
at once, a peer's ``transfer_seconds`` after publication.

When a learner's round ends it holds (no training: non-useful time) and asks the policy; it asks again at
the policy's ``wake_at`` and whenever a peer's update arrives. Once the policy says close, applying the
outer step takes ``sync_seconds`` (also held), then the next round starts. The policy is fed what a node
measures: the mean inner-step time of the round just done, each arrival's transfer latency, the
outer-step time. A learner that crashed (non-elastic) restarts from the most advanced peer's state.

Slot counters drift apart: each learner closes one slot per round, and learners lose different amounts
of time to failures. With ``slot_catch_up`` (default) a learner that has seen a peer's update tagged
``s`` knows slot ``s`` was closed, and fast-forwards to it when it publishes or closes (closing the skipped
slots with the updates it held for them), so its update is tagged with the latest slot it knows — our
reading of "the slot its sender had reached" (docs/design.md, "The ledger and its slots"; PROTOCOL.md §11c,
"Slots"). Without it, laggards' updates go stale.

Contract: :meth:`round_done` / :meth:`poll` are called only for a group in HOLD, after it was advanced
to ``now``; the engine then reschedules the group (its wake is :meth:`wake_at`).
"""

from __future__ import annotations

import math
from collections import Counter

from protocol.ledger.config import LedgerConfig
from protocol.ledger.policy import ClosePolicyConfig, SlotClosePolicy
from testnet.sim.config import SimConfig
from testnet.sim.group import Group

__all__ = ["SlotCloser"]


class SlotCloser:
    """Slot state of all learners of one run (ours only)."""

    def __init__(self, config: SimConfig, learners: int) -> None:
        self.config = config
        policy = ClosePolicyConfig(
            quorum=config.quorum, gamma=config.grace_gamma, max_hold_steps=config.max_hold_steps, ema=config.policy_ema
        )
        self.policies = [SlotClosePolicy(policy) for _ in range(learners)]
        self.window = LedgerConfig().window
        self.closed = [0] * learners  # n: slots closed by each learner
        self.arrived = [Counter() for _ in range(learners)]  # s → updates tagged s, available, not yet closed
        self.outcomes: Counter[str] = Counter()  # late / stale receptions (open ones are counted at close)
        self.known = [0] * learners  # the highest slot tag each learner has seen from a peer
        self.done_at = [math.nan] * learners  # when its round ended (valid while waiting)
        self.waiting = [False] * learners  # round done, slot not closed yet
        self.closing_until: list[float | None] = [None] * learners
        self.wake = [math.inf] * learners
        self.rounds = [0] * learners
        self.closed_slots = 0
        self.closed_updates = 0
        self.closed_by: dict[str, int] = {}  # CloseDecision.why → count
        self.hold_max = 0.0  # longest time held between a round's end and its slot's close (pauses excluded)

    def wake_at(self, i: int) -> float:
        until = self.closing_until[i]
        return until if until is not None else self.wake[i]

    def round_done(self, g: Group, now: float) -> int:
        """Learner ``g`` finished H steps and published; returns the update's slot tag ``s``."""
        i = g.gid
        self.rounds[i] += 1
        self.policies[i].observe_step(g.round_run_seconds / self.config.inner_steps)
        self._catch_up(i)
        tag = self.closed[i]
        self.arrived[i][tag] += 1
        self.done_at[i] = now
        self.waiting[i] = True
        self.poll(g, now)
        return tag

    def arrival(self, sender: int, tag: int) -> list[int]:
        """``sender``'s update tagged ``tag`` is now available at every other learner; returns those
        waiting on a slot (their quorum may now be met)."""
        waiting = []
        for i in range(len(self.closed)):
            if i == sender:
                continue
            self.policies[i].observe_transfer(self.config.transfer_seconds)
            self.known[i] = max(self.known[i], tag)
            self._receive(i, tag)
            if self.waiting[i]:
                waiting.append(i)
        return waiting

    def _receive(self, i: int, tag: int) -> None:
        if tag >= self.closed[i]:
            self.arrived[i][tag] += 1  # open now, or held until its slot opens
        elif tag + 1 > self.closed[i] - self.window:
            self.outcomes["late"] += 1
        else:
            self.outcomes["stale"] += 1

    def poll(self, g: Group, now: float) -> None:
        """Ask the policy (or finish the outer step) for learner ``g``, in HOLD at ``now``."""
        i = g.gid
        until = self.closing_until[i]
        if until is not None:
            if now >= until:
                self.closing_until[i] = None
                g.start_round()
            return
        if not self.waiting[i]:
            return
        in_slot = self.arrived[i][self.closed[i]]
        decision = self.policies[i].decide(
            now=now, round_done_at=self.done_at[i], updates_in_slot=in_slot, inner_steps=self.config.inner_steps
        )
        if not decision.close:
            self.wake[i] = decision.wake_at
            return
        self.closed_slots += 1
        self.closed_updates += in_slot
        self.closed_by[decision.why] = self.closed_by.get(decision.why, 0) + 1
        self.hold_max = max(self.hold_max, g.round_hold_seconds)
        del self.arrived[i][self.closed[i]]
        self.closed[i] += 1
        self._catch_up(i)
        self.waiting[i] = False
        self.wake[i] = math.inf
        self.policies[i].observe_sync(self.config.sync_seconds)
        if self.config.sync_seconds > 0:
            self.closing_until[i] = now + self.config.sync_seconds
        else:
            g.start_round()

    def _catch_up(self, i: int) -> None:
        """Close, at once, the slots a peer is known to have closed already (``slot_catch_up``)."""
        if not self.config.slot_catch_up:
            return
        while self.closed[i] < self.known[i]:
            self.closed_slots += 1
            self.closed_updates += self.arrived[i].pop(self.closed[i], 0)
            self.closed[i] += 1

    def restarted(self, i: int) -> None:
        """Learner ``i`` crashed (non-elastic): it restarts from the most advanced peer's state (its slot
        counter jumps there; updates it held for the skipped slots are now late) with a fresh round."""
        target = max(self.closed)
        for tag in [t for t in self.arrived[i] if t < target]:
            n = self.arrived[i].pop(tag)
            self.outcomes["late" if tag + 1 > target - self.window else "stale"] += n
        self.closed[i] = target
        self.waiting[i] = False
        self.closing_until[i] = None
        self.wake[i] = math.inf

    def updates_mean(self) -> float:
        """Mean updates in a slot when its learner closed it (own included)."""
        return self.closed_updates / self.closed_slots if self.closed_slots else math.nan

    def reception_shares(self) -> dict[str, float]:
        """Of all updates received (own included): share in the open slot at close, late, stale."""
        total = self.closed_updates + self.outcomes["late"] + self.outcomes["stale"]
        if not total:
            return {}
        return {"open": self.closed_updates / total, "late": self.outcomes["late"] / total,
                "stale": self.outcomes["stale"] / total}

"""When to close the open slot: quorum, an adaptive grace window, and a hard deadline.

A node whose own round is done may close slot ``s+1`` (apply its aggregate and start the next round) at
once, or wait a little so that more peers' updates for the slot land in it (sample efficiency: an update
that misses its slot is folded in later anyway, so waiting is never needed for correctness, only for
quality). This module decides, purely, how long to wait. Nothing here reads a clock: the caller measures
durations and passes ``now``.

The grace window follows Decoupled DiLoCo's bound ``ξ_grace ≤ γ (τ ξ_step − ξ_quorum − ξ_sync)``: the
slack a node has in one round of ``τ`` inner steps, minus the time it takes to gather a quorum (estimated
by the peer transfer latency) and to apply the outer step, scaled by ``γ``. It is further capped by
``max_hold_steps`` inner-step times, so a node is never held back by more than about one step.

Contract of :meth:`SlotClosePolicy.decide` (with ``hold = max_hold_steps · step_ema``):

* before ``round_done_at`` it never closes (the round is still running);
* it closes as soon as ``updates_in_slot ≥ quorum`` and ``now ≥ round_done_at + grace``;
* it closes at once when the slot already holds every update it can expect (``expected_updates``: one
  per live node, this one included): waiting longer cannot fill the slot any further;
* it ALWAYS closes once ``now ≥ round_done_at + hold``, quorum or not (dead peers never stall a node);
* otherwise it answers ``close=False`` with ``wake_at``, the time to ask again if nothing else happens.
  The caller also asks again whenever an update for the slot arrives (the quorum may now be met).

Before any inner step has been observed the step time is unknown; the hold is then zero, so the policy
closes as soon as the round is done (it never waits on a guess).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from protocol.errors import LocalProtocolError

__all__ = ["CloseDecision", "ClosePolicyConfig", "SlotClosePolicy"]

# Values of CloseDecision.why (stable: they may appear in logs and metrics).
WHY_ROUND_RUNNING = "round-running"
WHY_GRACE = "grace"
WHY_AWAIT_QUORUM = "await-quorum"
WHY_QUORUM = "quorum"
WHY_DEADLINE = "deadline"
WHY_COMPLETE = "complete"


@dataclass(frozen=True)
class ClosePolicyConfig:
    """Knobs of the slot-closing policy.

    quorum: K updates assigned to the slot (the node's own counts); K=1 never blocks.
    gamma: fraction of the round's slack usable as grace.
    max_hold_steps: never hold a node back more than this many inner-step times past its round's end.
    ema: weight of a new observation in the exponential moving averages (0 < ema ≤ 1).
    """

    quorum: int = 1
    gamma: float = 0.5
    max_hold_steps: float = 1.0
    ema: float = 0.2

    def __post_init__(self) -> None:
        if not isinstance(self.quorum, int) or self.quorum < 1:
            raise LocalProtocolError(f"quorum must be an int ≥ 1, got {self.quorum!r}")
        if not (0.0 <= self.gamma <= 1.0):
            raise LocalProtocolError(f"gamma must be in [0, 1], got {self.gamma!r}")
        if not (0.0 <= self.max_hold_steps < math.inf):
            raise LocalProtocolError(f"max_hold_steps must be finite and ≥ 0, got {self.max_hold_steps!r}")
        if not (0.0 < self.ema <= 1.0):
            raise LocalProtocolError(f"ema must be in (0, 1], got {self.ema!r}")


@dataclass(frozen=True)
class CloseDecision:
    """Close the slot now (``close=True``, ``wake_at=None``), or ask again at ``wake_at``."""

    close: bool
    wake_at: float | None
    why: str


class _Ema:
    """Exponential moving average; the first observation is taken as is."""

    __slots__ = ("alpha", "value")

    def __init__(self, alpha: float) -> None:
        self.alpha = alpha
        self.value: float | None = None

    def observe(self, x: float, what: str) -> None:
        if not (math.isfinite(x) and x >= 0.0):
            raise LocalProtocolError(f"{what} duration must be finite and ≥ 0, got {x!r}")
        self.value = x if self.value is None else (1.0 - self.alpha) * self.value + self.alpha * x


class SlotClosePolicy:
    """Adaptive, pure slot-closing policy of one node (see the module docstring for the contract).

    Owns three moving averages: the inner-step time, the publish→payload-available latency of peers'
    updates, and the time one outer step takes. Unobserved averages count as zero.
    """

    def __init__(self, config: ClosePolicyConfig) -> None:
        self.config = config
        self._step = _Ema(config.ema)
        self._transfer = _Ema(config.ema)
        self._sync = _Ema(config.ema)

    # -- measurements -------------------------------------------------------------------------------
    def observe_step(self, seconds: float) -> None:
        """Record the duration of one inner step."""
        self._step.observe(seconds, "step")

    def observe_transfer(self, seconds: float) -> None:
        """Record the publish→payload-available latency of one peer update."""
        self._transfer.observe(seconds, "transfer")

    def observe_sync(self, seconds: float) -> None:
        """Record the time one outer step (close + apply) took."""
        self._sync.observe(seconds, "sync")

    @property
    def step_ema(self) -> float:
        return self._step.value or 0.0

    @property
    def transfer_ema(self) -> float:
        return self._transfer.value or 0.0

    @property
    def sync_ema(self) -> float:
        return self._sync.value or 0.0

    # -- the decision -------------------------------------------------------------------------------
    def hold_seconds(self) -> float:
        """The most a node is held past the end of its round: ``max_hold_steps · step_ema``."""
        return self.config.max_hold_steps * self.step_ema

    def grace_seconds(self, inner_steps: int) -> float:
        """Grace window after the round ends: ``min(γ · max(0, τ·step − transfer − sync), hold)``."""
        if inner_steps < 0:
            raise LocalProtocolError(f"inner_steps must be ≥ 0, got {inner_steps}")
        slack = inner_steps * self.step_ema - self.transfer_ema - self.sync_ema
        return min(self.config.gamma * max(0.0, slack), self.hold_seconds())

    def decide(
        self,
        *,
        now: float,
        round_done_at: float,
        updates_in_slot: int,
        inner_steps: int,
        expected_updates: int | None = None,
    ) -> CloseDecision:
        """Close the open slot now, or say when to ask again. Pure given the moving averages.

        ``round_done_at`` is when this node's own round finished (or will finish); ``updates_in_slot``
        counts the updates assigned to the open slot so far, the node's own included;
        ``expected_updates``, if known, is how many the slot can hold at most (live nodes, this one
        included) — once they are all in, the slot closes without waiting out the grace window.
        """
        if updates_in_slot < 0:
            raise LocalProtocolError(f"updates_in_slot must be ≥ 0, got {updates_in_slot}")
        if expected_updates is not None and expected_updates < 1:
            raise LocalProtocolError(f"expected_updates must be ≥ 1, got {expected_updates}")
        if now < round_done_at:
            return CloseDecision(False, round_done_at, WHY_ROUND_RUNNING)
        if expected_updates is not None and updates_in_slot >= expected_updates:
            return CloseDecision(True, None, WHY_COMPLETE)
        deadline = round_done_at + self.hold_seconds()
        grace_end = round_done_at + self.grace_seconds(inner_steps)
        quorum_met = updates_in_slot >= self.config.quorum
        if quorum_met and now >= grace_end:
            return CloseDecision(True, None, WHY_QUORUM)
        if now >= deadline:
            return CloseDecision(True, None, WHY_DEADLINE)
        if quorum_met:
            return CloseDecision(False, grace_end, WHY_GRACE)
        return CloseDecision(False, deadline, WHY_AWAIT_QUORUM)

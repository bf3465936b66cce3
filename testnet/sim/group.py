"""One synchronous group (a data-parallel job, or one learner of ours): its states and its time ledger.

States (the only place their rules live):

========  ==========  ============  =============================================================
state     progress    interrupted?  left by
========  ==========  ============  =============================================================
RUNNING   yes         yes           failure → PAUSED (elastic, slices left) or DOWN; round end →
                                    HOLD (ours); slice return → PAUSED (elastic scale-up)
HOLD      no          yes           slot closed and outer step applied → RUNNING; failure, return
                                    as in RUNNING (and back to HOLD after the pause)
PAUSED    no          no            ``resume_at`` passes → RUNNING or HOLD (``after_pause``);
                                    a return while PAUSED joins that resize (no extra pause)
DOWN      no          no            the needed slices returned → PAUSED (restart / scale-up)
========  ==========  ============  =============================================================

Interruptions arrive only in service (RUNNING, HOLD): a group being resized or restarted is being
re-provisioned, and an interruption then is absorbed by that re-provisioning (the paper's DP column
decays as ``1/(1+λ·stall)``, which is this renewal model, and not ``exp(−λ·stall)``).

Time ledger, in chip-seconds, summing to ``chips × elapsed`` (checked by :meth:`Group.ledger_total`):
``useful`` (banked: DP/elastic at every step, ours when a round is published) + ``pending`` (ours: the
running round) + ``lost`` (in-flight steps and unpublished rounds destroyed by failures) + ``straggle``
(fast slices waiting for the slowest) + ``hold`` + ``stalled`` (PAUSED, DOWN) + ``out`` (chips of
slices that are out while the group goes on).
"""

from __future__ import annotations

import enum
import math

import numpy as np

from protocol.errors import LocalProtocolError
from testnet.sim.layout import GroupLayout

__all__ = ["Group", "GroupState"]


class GroupState(enum.Enum):
    RUNNING = "running"
    HOLD = "hold"
    PAUSED = "paused"
    DOWN = "down"


IN_SERVICE = (GroupState.RUNNING, GroupState.HOLD)


class Group:
    """Pure state and accounting of one group. The engine owns time and calls, in order,
    :meth:`advance` (to ``now``) and then one transition. Transitions never schedule anything; the engine
    reads :attr:`state`, :attr:`resume_at` and :meth:`seconds_to_round_end` afterwards."""

    def __init__(self, gid: int, layout: GroupLayout, *, elastic: bool, step_seconds: float, rounds: bool) -> None:
        self.gid = gid
        self.chips = layout.chips
        self.speeds = layout.speeds
        self.active = np.ones(len(self.chips), dtype=bool)
        self.total_chips = layout.total_chips
        self.elastic = elastic
        self.step_seconds = step_seconds
        self.rounds = rounds  # ours: progress is banked per published round, not per step
        self.state = GroupState.RUNNING
        self.after_pause = GroupState.RUNNING
        self.resume_at = 0.0
        self.version = 0
        self.since = 0.0
        self.progress = 0.0  # steps into the current round (rounds) or since the start
        self.round_run_seconds = 0.0
        self.round_hold_seconds = 0.0  # ours: time held since the round ended (pauses excluded)
        self.useful = self.pending = self.lost = self.straggle = 0.0
        self.hold = self.stalled = self.out = 0.0
        self.failures = self.absorbed = self.resizes = 0
        self._repace()

    # -- derived -----------------------------------------------------------------------------------
    def _repace(self) -> None:
        """Step duration and useful rate (chip-seconds per second) of the active slices."""
        act = self.active
        self.active_chips = int(self.chips[act].sum())
        if self.active_chips == 0:
            self.step_duration, self.useful_rate = math.inf, 0.0
            return
        vmin = float(self.speeds[act].min())
        self.step_duration = self.step_seconds / vmin
        self.useful_rate = float((self.chips[act] * (vmin / self.speeds[act])).sum())

    @property
    def in_service(self) -> bool:
        return self.state in IN_SERVICE

    def seconds_to_round_end(self, inner_steps: int) -> float:
        """From now, the running time left until ``inner_steps`` steps are done (RUNNING only)."""
        return (inner_steps - self.progress) * self.step_duration

    def ledger_total(self) -> float:
        return self.useful + self.pending + self.lost + self.straggle + self.hold + self.stalled + self.out

    # -- accounting --------------------------------------------------------------------------------
    def advance(self, now: float) -> None:
        """Accrue the ledger from the last call up to ``now`` in the current state."""
        dt = now - self.since
        if dt < 0:
            raise LocalProtocolError(f"time went backwards for group {self.gid}: {self.since} → {now}")
        self.since = now
        if dt == 0:
            return
        self.out += (self.total_chips - self.active_chips) * dt
        if self.state is GroupState.RUNNING:
            gained = self.useful_rate * dt
            if self.rounds:
                self.pending += gained
            else:
                self.useful += gained
            self.straggle += (self.active_chips - self.useful_rate) * dt
            self.progress += dt / self.step_duration
            self.round_run_seconds += dt
        elif self.state is GroupState.HOLD:
            self.hold += self.active_chips * dt
            self.round_hold_seconds += dt
        else:
            self.stalled += self.active_chips * dt

    def _lose_in_flight(self) -> None:
        """The step running when a failure hits is lost (its all-reduce never completed)."""
        if self.state is not GroupState.RUNNING:
            return
        partial = self.progress - math.floor(self.progress + 1e-9)
        if partial <= 0:
            return
        lost = partial * self.step_duration * self.useful_rate
        self.progress -= partial
        self.lost += lost
        if self.rounds:
            self.pending -= lost
        else:
            self.useful -= lost

    # -- transitions -------------------------------------------------------------------------------
    def fail(self, now: float, slice_index: int, resize_seconds: float) -> None:
        """A chip of ``slice_index`` was interrupted. Only call when :attr:`in_service`."""
        if not self.in_service or not self.active[slice_index]:
            raise LocalProtocolError(f"group {self.gid}: failure while {self.state.value} / slice inactive")
        self.failures += 1
        self._lose_in_flight()
        resume_state = self.state
        self.active[slice_index] = False
        self._repace()
        if self.elastic and self.active_chips > 0:
            self._pause(now, resize_seconds, resume_state)
            return
        self._go_down()

    def crash(self) -> list[int]:
        """The whole group goes down at once (a killed node): every active slice is out until it
        returns. Returns the slices taken out. Only call when :attr:`in_service`."""
        if not self.in_service:
            raise LocalProtocolError(f"group {self.gid}: crash while {self.state.value}")
        self.failures += 1
        self._lose_in_flight()
        taken = [int(i) for i in np.flatnonzero(self.active)]
        self.active[:] = False
        self._repace()
        self._go_down()
        return taken

    def _go_down(self) -> None:
        if self.rounds:  # the learner restarts from the global state with a fresh round
            self.lost += self.pending  # an unpublished round dies with it
            self.pending = 0.0
            self.progress = 0.0
            self.round_run_seconds = 0.0
        self.after_pause = GroupState.RUNNING
        self.state = GroupState.DOWN

    def slice_returned(self, now: float, slice_index: int, resize_seconds: float) -> None:
        """The failed slice is back in service."""
        self.active[slice_index] = True
        self._repace()
        if self.state is GroupState.PAUSED:
            return  # joins the resize under way
        if self.state is GroupState.DOWN:
            if self.elastic or self.active.all():
                self._pause(now, resize_seconds, self.after_pause)  # restart
            return
        self._pause(now, resize_seconds, self.state)  # scale back up; the in-flight step is kept

    def resume(self) -> GroupState:
        """``resume_at`` has passed: back to the state the pause interrupted."""
        if self.state is not GroupState.PAUSED:
            raise LocalProtocolError(f"group {self.gid}: resume while {self.state.value}")
        self.state = self.after_pause
        return self.state

    def round_done(self) -> None:
        """H steps done (ours): bank the round (it is published) and hold for the slot to close."""
        if self.state is not GroupState.RUNNING:
            raise LocalProtocolError(f"group {self.gid}: round end while {self.state.value}")
        self.useful += self.pending
        self.pending = 0.0
        self.round_hold_seconds = 0.0
        self.state = GroupState.HOLD

    def start_round(self) -> None:
        """The slot closed and the outer step was applied: start the next round."""
        if self.state is not GroupState.HOLD:
            raise LocalProtocolError(f"group {self.gid}: start_round while {self.state.value}")
        self.progress = 0.0
        self.round_run_seconds = 0.0
        self.state = GroupState.RUNNING

    def _pause(self, now: float, seconds: float, then: GroupState) -> None:
        self.resizes += 1
        self.state = GroupState.PAUSED
        self.after_pause = then
        self.resume_at = now + seconds

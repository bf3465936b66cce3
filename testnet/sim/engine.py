"""The discrete-event loop: one heap, exact event order, one seeded generator per run.

Failures are a Poisson process per group (rate = chips in service / MTBI), redrawn whenever the group's
state or size changes (memoryless, so redrawing is exact); the failed slice is drawn by chip count among
the active ones. Ties in time are broken by event kind (returns and planned faults first), then by
insertion order, so a run is a pure function of ``(policy, chips, config, seed, faults)``. Ours' slot
closing is delegated to :mod:`testnet.sim.slots`, which drives the node's own ``SlotClosePolicy``.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field

import numpy as np

from protocol.errors import LocalProtocolError
from testnet.sim.config import SimConfig
from testnet.sim.faults import Fault, SimPlan
from testnet.sim.group import Group, GroupState
from testnet.sim.layout import DP, OURS, Policy, build_groups
from testnet.sim.slots import SlotCloser

__all__ = ["GroupStats", "SimResult", "simulate"]

# event kinds, in the order they win a tie in time: returns and faults before the group moves on
_RETURN, _FAULT, _FAIL, _RESUME, _ROUND_END, _ARRIVAL, _WAKE, _HORIZON = range(8)


@dataclass(frozen=True)
class GroupStats:
    """One group's ledger at the horizon, chip-seconds (see :mod:`testnet.sim.group`)."""

    chips: int
    useful: float
    lost: float
    straggle: float
    hold: float
    stalled: float
    out: float
    failures: int
    absorbed: int
    resizes: int
    rounds: int


@dataclass(frozen=True)
class SimResult:
    """Goodput = useful chip-seconds ÷ (chips × horizon), over all groups."""

    policy: str
    chips: int
    seed: int
    horizon_seconds: float
    goodput: float
    groups: tuple[GroupStats, ...]
    slot_updates_mean: float = math.nan  # ours: updates in a slot when it closed
    hold_per_round_max: float = math.nan  # ours: longest policy wait, round end → slot close (pauses excluded)
    closed_by: dict[str, int] = field(default_factory=dict)  # ours: slot closes per CloseDecision.why
    receptions: dict[str, float] = field(default_factory=dict)  # ours: shares open / late / stale
    events: int = 0

    @property
    def failures(self) -> int:
        return sum(g.failures for g in self.groups)

    @property
    def hold_per_round_mean(self) -> float:
        """Ours: mean seconds a learner is held per round (policy wait + outer step)."""
        rounds = sum(g.rounds for g in self.groups)
        return sum(g.hold / g.chips for g in self.groups) / rounds if rounds else math.nan


class _Sim:
    def __init__(self, policy: Policy, chips: int, config: SimConfig, seed: int, faults: SimPlan) -> None:
        self.policy, self.config, self.seed = policy, config, seed
        self.rng = np.random.default_rng(np.random.SeedSequence([seed, chips, policy.learners, _KIND[policy.kind]]))
        layouts = build_groups(policy, chips, config, self.rng)
        elastic = policy.kind != DP and (policy.kind != OURS or config.learner_elastic)
        rounds = policy.kind == OURS
        self.groups = [
            Group(g, lay, elastic=elastic, step_seconds=config.step_seconds, rounds=rounds)
            for g, lay in enumerate(layouts)
        ]
        self.chips = chips
        self.heap: list[tuple] = []
        self.seq = 0
        self.events = 0
        self.slots = SlotCloser(config, len(self.groups)) if rounds else None
        for f in faults:
            if f.group >= len(self.groups) or f.slice_index >= len(self.groups[f.group].chips):
                raise LocalProtocolError(f"fault {f!r} names a group or slice that does not exist")
            self.push(f.time, _FAULT, f.group, f)
        self.push(config.horizon_seconds, _HORIZON, -1)
        for g in self.groups:
            self.reschedule(g, 0.0)

    def push(self, t: float, kind: int, gid: int, data: object = None, version: int = -1) -> None:
        heapq.heappush(self.heap, (t, kind, self.seq, gid, data, version))
        self.seq += 1

    def reschedule(self, g: Group, now: float) -> None:
        """Drop the group's pending timed events (version bump) and schedule those of its new state."""
        g.version += 1
        if g.in_service and g.active_chips > 0 and math.isfinite(self.config.mtbi_seconds):
            wait = self.rng.exponential(self.config.mtbi_seconds / g.active_chips)
            self.push(now + wait, _FAIL, g.gid, None, g.version)
        if g.state is GroupState.RUNNING and self.slots is not None:
            self.push(now + g.seconds_to_round_end(self.config.inner_steps), _ROUND_END, g.gid, None, g.version)
        elif g.state is GroupState.PAUSED:
            self.push(g.resume_at, _RESUME, g.gid, None, g.version)
        elif g.state is GroupState.HOLD and self.slots is not None and math.isfinite(self.slots.wake_at(g.gid)):
            self.push(self.slots.wake_at(g.gid), _WAKE, g.gid, None, g.version)

    def pick_slice(self, g: Group) -> int:
        idx = np.flatnonzero(g.active)
        cum = np.cumsum(g.chips[idx])
        return int(idx[np.searchsorted(cum, self.rng.random() * cum[-1], side="right")])

    def run(self) -> SimResult:
        cfg = self.config
        while True:
            t, kind, _, gid, data, version = heapq.heappop(self.heap)
            self.events += 1
            if kind == _HORIZON:
                break
            g = self.groups[gid]
            if version >= 0 and version != g.version:
                continue
            g.advance(t)
            if kind == _FAIL:
                self.fail(g, t, self.pick_slice(g))
            elif kind == _FAULT:
                if not (g.in_service and (data.whole_group or g.active[data.slice_index])):
                    g.absorbed += 1
                    continue
                self.planned(g, t, data)
            elif kind == _RETURN:
                g.slice_returned(t, data, cfg.resize_seconds)
            elif kind == _RESUME:
                if g.resume() is GroupState.HOLD:
                    self.slots.poll(g, t)
            elif kind == _ROUND_END:
                g.round_done()
                tag = self.slots.round_done(g, t)
                self.push(t + cfg.transfer_seconds, _ARRIVAL, gid, tag)
            elif kind == _ARRIVAL:
                for other in self.slots.arrival(gid, data):
                    h = self.groups[other]
                    if h.state is GroupState.HOLD:
                        h.advance(t)
                        self.slots.poll(h, t)
                        self.reschedule(h, t)
                continue
            elif kind == _WAKE:
                self.slots.poll(g, t)
            self.reschedule(g, t)
        for g in self.groups:
            g.advance(cfg.horizon_seconds)
        return self.result()

    def fail(self, g: Group, t: float, slice_index: int, downtime: float | None = None) -> None:
        g.fail(t, slice_index, self.config.resize_seconds)
        self.push(t + (self.config.return_seconds if downtime is None else downtime), _RETURN, g.gid, slice_index)
        self.went_down(g)

    def planned(self, g: Group, t: float, fault: Fault) -> None:
        if not fault.whole_group:
            self.fail(g, t, fault.slice_index, fault.downtime)
            return
        back = t + (self.config.return_seconds if fault.downtime is None else fault.downtime)
        for slice_index in g.crash():
            self.push(back, _RETURN, g.gid, slice_index)
        self.went_down(g)

    def went_down(self, g: Group) -> None:
        if self.slots is not None and g.state is GroupState.DOWN:
            self.slots.restarted(g.gid)

    def result(self) -> SimResult:
        cfg = self.config
        useful = sum(g.useful + g.pending for g in self.groups)
        stats = tuple(
            GroupStats(
                chips=g.total_chips, useful=g.useful + g.pending, lost=g.lost, straggle=g.straggle, hold=g.hold,
                stalled=g.stalled, out=g.out, failures=g.failures, absorbed=g.absorbed, resizes=g.resizes,
                rounds=self.slots.rounds[g.gid] if self.slots else 0,
            )
            for g in self.groups
        )
        return SimResult(
            policy=self.policy.key, chips=self.chips, seed=self.seed, horizon_seconds=cfg.horizon_seconds,
            goodput=useful / (self.chips * cfg.horizon_seconds), groups=stats,
            slot_updates_mean=self.slots.updates_mean() if self.slots else math.nan,
            hold_per_round_max=self.slots.hold_max if self.slots else math.nan,
            closed_by=dict(self.slots.closed_by) if self.slots else {},
            receptions=self.slots.reception_shares() if self.slots else {}, events=self.events,
        )


_KIND = {"dp": 1, "elastic": 2, "ours": 3}


def simulate(
    policy: Policy, chips: int, config: SimConfig, *, seed: int = 0, faults: SimPlan = SimPlan()
) -> SimResult:
    """Run one cell: ``policy`` on ``chips`` chips for ``config.horizon_seconds``; pure in its arguments."""
    if chips < 1:
        raise LocalProtocolError(f"chips must be ≥ 1, got {chips}")
    return _Sim(policy, int(chips), config, int(seed), SimPlan(faults)).run()

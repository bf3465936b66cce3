"""Declarative fault plans: "interrupt slice s of group g at time t", or "kill group g at t for d s".

The simulator honours a plan on top of (or, with ``mtbi_seconds=inf``, instead of) the Poisson failure
process, so tests can place one failure where its cost is computable by hand. A planned fault that hits
a group not in service (paused or down) is absorbed, exactly like a random one would never have been
drawn there, and counted as such.

:func:`from_testnet_plan` reads the real testnet's plan (:class:`testnet.faults.SimPlan`), so one
plan drives both (STYLE.md #11): a kill of node ``n`` becomes a whole-group crash of learner ``n`` for
the kill's downtime, a slow factor ``f`` becomes island speed ``1/f``. Partitions and misbehaving nodes
have no counterpart here (the simulator's network is a fixed transfer time) and are refused.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from protocol.errors import LocalProtocolError

if TYPE_CHECKING:
    from testnet.faults import FaultPlan as TestnetPlan

__all__ = ["Fault", "SimPlan", "from_testnet_plan"]


@dataclass(frozen=True, order=True)
class Fault:
    """Interrupt slice ``slice_index`` of group ``group`` (0-based; learner index for ours) at ``time``;
    with ``whole_group``, every slice of the group (a killed node). The slices return after
    ``downtime`` seconds, or the config's ``return_seconds`` when it is None."""

    time: float
    group: int = 0
    slice_index: int = 0
    downtime: float | None = None
    whole_group: bool = False

    def __post_init__(self) -> None:
        bad_downtime = self.downtime is not None and not self.downtime >= 0
        if not self.time >= 0 or self.group < 0 or self.slice_index < 0 or bad_downtime:
            raise LocalProtocolError(f"invalid fault {self!r}")


class SimPlan(tuple):
    """An ordered, immutable set of :class:`Fault` s. ``SimPlan.fail_at(t, group, slice)`` builds one."""

    def __new__(cls, faults: tuple[Fault, ...] | list[Fault] = ()) -> SimPlan:
        return super().__new__(cls, sorted(faults))

    @classmethod
    def fail_at(cls, time: float, group: int = 0, slice_index: int = 0) -> SimPlan:
        return cls([Fault(time, group, slice_index)])

    def __add__(self, other: tuple) -> SimPlan:  # type: ignore[override]
        return SimPlan(list(self) + list(other))


def from_testnet_plan(plan: TestnetPlan) -> tuple[SimPlan, tuple[float, ...]]:
    """The simulator's faults and ``island_speeds`` for a testnet plan of ``plan.nodes`` nodes (run it
    with ``Policy("ours", plan.nodes)`` and ``mtbi_seconds=inf`` to replay exactly that plan)."""
    if plan.partitions or plan.misbehave:
        raise LocalProtocolError("the simulator has no network model for partitions or misbehaving nodes")
    faults = SimPlan([Fault(k.at, k.node, downtime=k.downtime, whole_group=True) for k in plan.kills])
    speeds = tuple(1.0 / plan.slow_factor(n) for n in range(plan.nodes)) if plan.slow else ()
    return faults, speeds

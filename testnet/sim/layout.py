"""Training policies and how each cuts the chips into synchronous groups of slices.

A *group* is a set of chips that steps in lock-step (one data-parallel job, or one learner of ours). It
is cut into slices of ``slice_chips`` (the last one smaller when the count does not divide), the unit a
failure takes out. Chips are numbered 0..N-1; group ``g`` of ``G`` holds the contiguous range
``[g·N/G, (g+1)·N/G)``, so hardware islands (``island_speeds``) line up with learners when ``M`` equals
the number of islands.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from protocol.errors import LocalProtocolError
from testnet.sim.config import SimConfig

__all__ = ["DP", "ELASTIC", "OURS", "GroupLayout", "Policy", "build_groups"]

DP = "dp"
ELASTIC = "elastic"
OURS = "ours"


@dataclass(frozen=True)
class Policy:
    """``dp``: one group, any failure stalls it until repaired. ``elastic``: one group that resizes.
    ``ours``: ``learners`` independent groups that publish every H steps and close slots with the
    node's SlotClosePolicy."""

    kind: str
    learners: int = 1

    def __post_init__(self) -> None:
        if self.kind not in (DP, ELASTIC, OURS):
            raise LocalProtocolError(f"unknown policy kind {self.kind!r}")
        if self.learners < 1 or (self.kind != OURS and self.learners != 1):
            raise LocalProtocolError(f"{self.kind} takes learners=1; ours takes ≥ 1, got {self.learners}")

    @property
    def name(self) -> str:
        return {DP: "data-parallel", ELASTIC: "elastic DP"}.get(self.kind, f"ours M={self.learners}")

    @property
    def key(self) -> str:
        return self.kind if self.kind != OURS else f"ours-m{self.learners}"

    @classmethod
    def parse(cls, key: str) -> Policy:
        """Inverse of :attr:`key`: ``dp``, ``elastic``, ``ours-m8``."""
        if key.startswith("ours-m") and key[6:].isdigit():
            return cls(OURS, int(key[6:]))
        return cls(key)


@dataclass(frozen=True)
class GroupLayout:
    """One group's slices: chip counts and persistent speed multipliers (nominal 1.0)."""

    chips: np.ndarray
    speeds: np.ndarray

    @property
    def total_chips(self) -> int:
        return int(self.chips.sum())


def build_groups(policy: Policy, chips: int, config: SimConfig, rng: np.random.Generator) -> list[GroupLayout]:
    """Cut ``chips`` into the policy's groups and each group into slices; draw slice speeds from ``rng``."""
    groups = policy.learners if policy.kind == OURS else 1
    if chips < groups:
        raise LocalProtocolError(f"{chips} chips cannot form {groups} groups")
    bounds = [round(g * chips / groups) for g in range(groups + 1)]
    islands = config.island_speeds or (1.0,)
    layouts = []
    for g in range(groups):
        lo, hi = bounds[g], bounds[g + 1]
        starts = np.arange(lo, hi, config.slice_chips)
        sizes = np.minimum(starts + config.slice_chips, hi) - starts
        island = np.minimum((starts * len(islands)) // chips, len(islands) - 1)
        speeds = np.asarray(islands, dtype=np.float64)[island]
        if config.speed_sigma > 0:
            speeds = speeds * np.exp(rng.normal(0.0, config.speed_sigma, size=len(starts)))
        layouts.append(GroupLayout(chips=sizes.astype(np.int64), speeds=speeds))
    return layouts

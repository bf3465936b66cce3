"""The simulator's knobs: one frozen dataclass, every constant with its reason.

The paper (Decoupled DiLoCo, arXiv 2604.21428) publishes its goodput table but not the constants of the
simulator behind it. Those we cannot take from the paper are chosen here, explicitly:

* Two are **calibrated**, each against one cell of the paper's 1.2M-chip column (its headline column),
  by ``python -m testnet.sim calibrate`` (bisection with the simulator itself, fixed seed):
  ``return_seconds`` against data-parallel = 27 % and ``resize_seconds`` against elastic = 58 %.
  Nothing else is fitted: the other 28 cells, all of "ours" included, follow from the model.
* The rest are set from public facts or by argument (see each field).

Times are seconds, sizes are chips. :meth:`SimConfig.replace` is the one way to override fields (CLI
``--set name=value`` goes through it), and it rejects unknown names and wrong types.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from protocol.errors import LocalProtocolError

__all__ = ["SECONDS_PER_YEAR", "SimConfig", "parse_override"]

SECONDS_PER_YEAR = 365.0 * 86400.0


@dataclass(frozen=True)
class SimConfig:
    """Failure model, hardware layout and "ours" round/policy settings of one simulation.

    mtbi_seconds: per-chip mean time between interruptions. The paper's default: one chip-year. A group
        of ``c`` chips in service is interrupted as a Poisson process of rate ``c / mtbi_seconds``.
    return_seconds: time for a failed (interrupted) chip's slice to come back into service. CALIBRATED
        (data-parallel @ 1.2M = 27 %). The paper's DP column decays as ``1/(1 + λ·stall)`` with
        ``stall ≈ 70 s`` — interruptions in its model are transient (a host restart), not hardware
        replacements, or DP at 150k chips (a failure every 210 s) could not reach 72 %.
    resize_seconds: pause of a whole synchronous group to scale down (after a failure) or back up (when
        a slice returns; a non-elastic job's restart is one such pause). CALIBRATED (elastic @ 1.2M =
        58 %). One value for down and up: the paper gives no reason to split them.
    slice_chips: elasticity granularity: a failure takes its whole slice out. 256 = one TPU v5e pod, a
        common multislice unit. The result is insensitive to it while ``slice_chips · return_seconds ≪
        mtbi_seconds`` (here 256·~60 s vs 3.2e7 s: < 0.1 % of chips out at any time).
    step_seconds: inner-step time at nominal speed. 1 s: the order of a large model's step. It enters the
        goodput only through the in-flight step lost at each failure (≈ step/2) and the grace hold (≤ one
        step per round).
    speed_sigma: chip-speed variance: each slice's speed is ``exp(N(0, σ²))`` times its island's speed,
        drawn once (persistent: a slow host stays slow). A synchronous group steps at the pace of its
        slowest active slice; faster slices' waiting is not useful. 0 for the paper's table (its columns
        vary only the chip count); see the speed ablation.
    island_speeds: mixed hardware: chips are cut into ``len(island_speeds)`` equal contiguous islands with
        these speed multipliers (learner ``i`` of ``M = len(island_speeds)`` learners is island ``i``).
    inner_steps: H, inner steps per round (ours). 100, Streaming DiLoCo's H. Costs ≤ 1/(H+1) for the hold.
    transfer_seconds: publish → payload available at peers (ours). 5 s: a 2.5e9-parameter pseudo-gradient
        at 4 bits is 10 Gbit; ~2 s on a 5 Gbit/s WAN plus gossip hops.
    sync_seconds: applying the outer step (ours): merge ≤ M decoded updates + Nesterov, sharded over the
        island, HBM-bound: well under 0.1 s; 0.1 s is a conservative bound.
    quorum, grace_gamma, max_hold_steps, policy_ema: the node's ClosePolicyConfig (same defaults as the
        node: K=1, γ=0.5, hold ≤ one inner step, EMA 0.2).
    learner_elastic: True: a learner is itself an elastic data-parallel island (a failure takes only its
        slice out, after a resize pause; the round goes on). False: a failure takes the whole learner down
        until the slice returns, plus a restart pause, and its unpublished round is lost. True is our
        model of the paper: its table has ours(N, M) ≈ elastic(N/M) (e.g. M=8 @ 1.2M = elastic @ 150k =
        88 %), which is what elastic learners give.
    slot_catch_up: a learner that saw a peer's update tagged ``s`` fast-forwards its slot counter to ``s``
        at its next publish or close (see :mod:`testnet.sim.slots`). Without it, slot counters drift apart
        by the spread of failure time across learners and laggards' updates leave the ledger window.
    horizon_seconds: simulated time per cell. 2 days: ≥ 600 failures per cell at 150k chips.
    """

    mtbi_seconds: float = SECONDS_PER_YEAR
    return_seconds: float = 59.1
    resize_seconds: float = 10.4
    slice_chips: int = 256
    step_seconds: float = 1.0
    speed_sigma: float = 0.0
    island_speeds: tuple[float, ...] = ()
    inner_steps: int = 100
    transfer_seconds: float = 5.0
    sync_seconds: float = 0.1
    quorum: int = 1
    grace_gamma: float = 0.5
    max_hold_steps: float = 1.0
    policy_ema: float = 0.2
    learner_elastic: bool = True
    slot_catch_up: bool = True
    horizon_seconds: float = 2 * 86400.0

    def __post_init__(self) -> None:
        positive = ("mtbi_seconds", "step_seconds", "horizon_seconds")
        for name in positive:
            if not getattr(self, name) > 0:
                raise LocalProtocolError(f"{name} must be > 0, got {getattr(self, name)!r}")
        non_negative = ("return_seconds", "resize_seconds", "speed_sigma", "transfer_seconds", "sync_seconds")
        for name in non_negative:
            value = getattr(self, name)
            if not (value >= 0 and math.isfinite(value)):
                raise LocalProtocolError(f"{name} must be finite and ≥ 0, got {value!r}")
        if self.slice_chips < 1 or self.inner_steps < 1 or self.quorum < 1:
            raise LocalProtocolError("slice_chips, inner_steps and quorum must be ≥ 1")
        if any(not (s > 0 and math.isfinite(s)) for s in self.island_speeds):
            raise LocalProtocolError(f"island_speeds must be finite and > 0, got {self.island_speeds!r}")

    def replace(self, **changes: object) -> SimConfig:
        """A copy with ``changes`` applied; unknown names and wrong types raise LocalProtocolError."""
        fields = {f.name: f for f in dataclasses.fields(self)}
        for name, value in changes.items():
            if name not in fields:
                raise LocalProtocolError(f"unknown config key {name!r}; known: {sorted(fields)}")
            expected = type(getattr(self, name))
            if expected is float and isinstance(value, int) and not isinstance(value, bool):
                changes[name] = float(value)
            elif not isinstance(value, expected) or (expected is not bool and isinstance(value, bool)):
                raise LocalProtocolError(f"{name} must be {expected.__name__}, got {value!r}")
        return dataclasses.replace(self, **changes)


def parse_override(text: str, config: SimConfig) -> tuple[str, object]:
    """Parse one CLI ``name=value`` against ``config``'s field types (``inf`` allowed for floats)."""
    name, sep, raw = text.partition("=")
    if not sep:
        raise LocalProtocolError(f"expected name=value, got {text!r}")
    name = name.strip().replace("-", "_")
    if name not in {f.name for f in dataclasses.fields(config)}:
        raise LocalProtocolError(f"unknown config key {name!r}")
    kind = type(getattr(config, name))
    try:
        if kind is bool:
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(raw)
            return name, raw.lower() in ("true", "1")
        if kind is tuple:
            return name, tuple(float(x) for x in raw.split(",") if x.strip())
        return name, kind(raw)
    except ValueError as exc:
        raise LocalProtocolError(f"{name} expects {kind.__name__}, got {raw!r}") from exc

"""Where the inner learning-rate schedule ends in a run bounded by wall time.

A real training sets its cosine to end with the run; a testnet run of `--minutes` does not know in
advance how many inner steps its nodes will take, and the preset's horizon (10,000 steps for `tiny`)
leaves a few-minute run at nearly the peak rate to its end, which says more about the schedule than
about the method (BENCHMARKS.md, "Quality, third pass"). When the testnet has measured the nodes' pace
(its solo run: every node alone, all at once, so the machine is as loaded as in the testnet), the
schedule spans the run: `total_steps = steps/s × (run seconds − start-up seconds)`, both medians over
the solo run's nodes. A run sized in inner steps (`--steps`, the demo's default) needs no pace: it ends
when the nodes have taken the steps (`testnet.supervisor`) and its schedule spans them; the pace only
estimates how long that takes (`run_seconds`). Pure.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

__all__ = ["Pace", "horizon_steps", "run_seconds"]


@dataclasses.dataclass(frozen=True)
class Pace:
    """The nodes' measured pace: inner steps/s while training, and seconds from launch to training."""

    steps_per_second: float
    startup_s: float

    @classmethod
    def of(cls, rates: Sequence[float], startups: Sequence[float]) -> Pace | None:
        """Medians over the measured nodes (a slowed node does not set the run's pace); None if nothing
        was measured."""
        if not rates:
            return None
        return cls(statistics.median(rates), statistics.median(startups) if startups else 0.0)


def horizon_steps(pace: Pace, run_seconds: float) -> int:
    """Inner steps a node takes in `run_seconds` from its launch at `pace` (at least 1)."""
    return max(1, round(pace.steps_per_second * max(0.0, run_seconds - pace.startup_s)))


def run_seconds(pace: Pace, steps: int) -> float:
    """Seconds from launch in which a node takes `steps` inner steps at `pace` (`horizon_steps`' inverse)."""
    return pace.startup_s + steps / pace.steps_per_second

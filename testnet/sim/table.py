"""The goodput table: run a grid of cells (in parallel processes), format it next to the paper, dump JSON.

A cell is ``(label, policy, chips, config)``; its seed is the run's seed (the engine mixes in the chip
count and policy), so a cell's result does not depend on which process ran it or in what order, and
variants of one cell (ablations) share their random failures (common random numbers).
"""

from __future__ import annotations

import dataclasses
import math
import multiprocessing
import os
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from testnet.sim.config import SimConfig
from testnet.sim.engine import simulate
from testnet.sim.layout import Policy
from testnet.sim.paper import PAPER_CHIPS, PAPER_GOODPUT

__all__ = [
    "DEFAULT_POLICIES",
    "Cell",
    "CellSpec",
    "ablation_specs",
    "format_ablations",
    "format_table",
    "run_cells",
    "table_specs",
]

DEFAULT_POLICIES = ("dp", "elastic", "ours-m2", "ours-m4", "ours-m8", "ours-m16")


@dataclass(frozen=True)
class CellSpec:
    label: str
    policy: str
    chips: int
    config: SimConfig


@dataclass(frozen=True)
class Cell:
    """One simulated cell; ``paper`` is the published goodput (%) where the settings match, else None."""

    label: str
    policy: str
    chips: int
    goodput: float
    paper: float | None
    failures: int
    slot_updates_mean: float
    hold_mean_seconds: float
    hold_max_seconds: float
    deadline_share: float
    late_share: float
    stale_share: float
    events: int
    seconds: float

    @property
    def delta_points(self) -> float | None:
        return None if self.paper is None else 100.0 * self.goodput - self.paper

    def as_json(self) -> dict:
        d = dataclasses.asdict(self)
        for k, v in d.items():
            if isinstance(v, float) and not math.isfinite(v):
                d[k] = None
        d["delta_points"] = self.delta_points
        return d


def table_specs(config: SimConfig, policies: Sequence[str] = DEFAULT_POLICIES,
                chips: Sequence[int] = PAPER_CHIPS) -> list[CellSpec]:
    return [CellSpec(Policy.parse(p).name, p, c, config) for p in policies for c in chips]


def ablation_specs(config: SimConfig, chips: int = 1_200_000, learners: int = 8) -> list[CellSpec]:
    """What our slot policy, learner elasticity and hardware speed change, at one column."""
    ours = f"ours-m{learners}"
    mixed = tuple([1.0] * (learners // 2) + [0.6] * (learners - learners // 2))
    variants: list[tuple[str, str, dict]] = [
        ("ours: close at once (hold 0)", ours, {"max_hold_steps": 0.0}),
        ("ours: node policy (K=1, hold ≤ 1 step)", ours, {}),
        (f"ours: K={learners}, hold ≤ 1 step", ours, {"quorum": learners}),
        (f"ours: K={learners}, hold ≤ 8 steps", ours, {"quorum": learners, "max_hold_steps": 8.0}),
        ("ours: no slot catch-up", ours, {"slot_catch_up": False}),
        ("ours: non-elastic learners", ours, {"learner_elastic": False}),
        ("ours: H=30", ours, {"inner_steps": 30}),
        ("DP: slice speed σ=5%", "dp", {"speed_sigma": 0.05}),
        ("elastic: slice speed σ=5%", "elastic", {"speed_sigma": 0.05}),
        ("ours: slice speed σ=5%", ours, {"speed_sigma": 0.05}),
        ("DP: half the islands at 0.6×", "dp", {"island_speeds": mixed}),
        ("elastic: half the islands at 0.6×", "elastic", {"island_speeds": mixed}),
        ("ours: half the islands at 0.6×", ours, {"island_speeds": mixed}),
    ]
    return [CellSpec(label, p, chips, config.replace(**changes)) for label, p, changes in variants]


def _paper_value(spec: CellSpec, reference: SimConfig) -> float | None:
    """The paper's figure if ``spec`` runs the reference settings (any horizon), else None."""
    if spec.config.replace(horizon_seconds=reference.horizon_seconds) != reference:
        return None
    return PAPER_GOODPUT.get(spec.policy, {}).get(spec.chips)


def _run_one(args: tuple[CellSpec, int, SimConfig]) -> Cell:
    spec, seed, reference = args
    t0 = time.perf_counter()
    r = simulate(Policy.parse(spec.policy), spec.chips, spec.config, seed=seed)
    closes = sum(r.closed_by.values())
    return Cell(
        label=spec.label, policy=spec.policy, chips=spec.chips, goodput=r.goodput,
        paper=_paper_value(spec, reference), failures=r.failures, slot_updates_mean=r.slot_updates_mean,
        hold_mean_seconds=r.hold_per_round_mean, hold_max_seconds=r.hold_per_round_max,
        deadline_share=r.closed_by.get("deadline", 0) / closes if closes else math.nan,
        late_share=r.receptions.get("late", math.nan), stale_share=r.receptions.get("stale", math.nan),
        events=r.events, seconds=time.perf_counter() - t0,
    )


def run_cells(specs: Iterable[CellSpec], *, seed: int, reference: SimConfig | None = None,
              workers: int = 1) -> list[Cell]:
    """Run every spec; results in the order given. Cells whose config equals ``reference`` (default: the
    calibrated defaults, i.e. the paper's settings; horizon aside) carry the paper's value.
    ``workers > 1`` uses that many processes (largest cells first)."""
    reference = SimConfig() if reference is None else reference
    specs = list(specs)
    jobs = [(s, seed, reference) for s in specs]
    if workers <= 1:
        return [_run_one(j) for j in jobs]
    order = sorted(range(len(jobs)), key=lambda i: -jobs[i][0].chips * Policy.parse(jobs[i][0].policy).learners)
    # spawn, not fork: the caller may have JAX (multithreaded) loaded, and forking it can deadlock
    spawn = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(workers, os.cpu_count() or 1), mp_context=spawn) as pool:
        done = dict(zip(order, pool.map(_run_one, [jobs[i] for i in order])))
    return [done[i] for i in range(len(jobs))]


def _chips_label(c: int) -> str:
    return f"{c / 1e6:g}M" if c >= 1_000_000 else f"{c // 1000}k"


def format_table(cells: Sequence[Cell], chips: Sequence[int] = PAPER_CHIPS) -> str:
    """Rows = policies, columns = chip counts; each entry ``ours (paper)``, goodput in %."""
    rows: dict[str, dict[int, Cell]] = {}
    for c in cells:
        rows.setdefault(c.label, {})[c.chips] = c
    width = max(len(r) for r in rows) + 2
    head = "policy".ljust(width) + "".join(_chips_label(c).rjust(14) for c in chips)
    lines = [head, "-" * len(head)]
    for label, row in rows.items():
        parts = []
        for c in chips:
            cell = row.get(c)
            if cell is None:
                parts.append("".rjust(14))
                continue
            paper = f" ({cell.paper:.0f})" if cell.paper is not None else ""
            parts.append(f"{100 * cell.goodput:.1f}{paper}".rjust(14))
        lines.append(label.ljust(width) + "".join(parts))
    deltas = [abs(c.delta_points) for c in cells if c.delta_points is not None]
    if deltas:
        lines.append(f"(paper's value in parentheses; max |ours − paper| = {max(deltas):.1f} points "
                     f"over {len(deltas)} cells)")
    return "\n".join(lines)


def format_ablations(cells: Sequence[Cell]) -> str:
    width = max(len(c.label) for c in cells) + 2
    cols = ("goodput", "updates/slot", "late", "stale", "hold/round (s)", "max hold (s)", "by deadline")
    lines = ["variant".ljust(width) + "".join(c.rjust(15) for c in cols)]

    def fmt(x: float, spec: str, unit: str = "") -> str:
        return format(x, spec) + unit if math.isfinite(x) else "-"

    for c in cells:
        vals = (fmt(100 * c.goodput, ".1f", "%"), fmt(c.slot_updates_mean, ".2f"), fmt(100 * c.late_share, ".1f", "%"),
                fmt(100 * c.stale_share, ".1f", "%"), fmt(c.hold_mean_seconds, ".2f"), fmt(c.hold_max_seconds, ".2f"),
                fmt(100 * c.deadline_share, ".0f", "%"))
        lines.append(c.label.ljust(width) + "".join(v.rjust(15) for v in vals))
    return "\n".join(lines)

"""Held-out loss of the nodes against data-parallel, at equal tokens and at equal wall time.

Pure functions on the report's curves (`testnet.report.compute`): node curves
`{node: [[tokens_all_nodes, seconds_since_launch, bpb], ...]}` and the baseline's measured points
`[[step, tokens, bpb], ...]` (`baseline.json`, trained without faults).

- At equal tokens: every honest node's evaluation made when all nodes together had trained between
  (1 − width)·T and T tokens, T being the count up to which every honest node has evaluations, is paired
  with the baseline's bpb at the same tokens (linear between its points). Data-parallel under faults
  computes the same thing per token as without (a failure only stalls it), so this is measured, not
  modelled.
- At equal wall time, data-parallel under the run's faults is *modelled*, not run: it starts when every
  node trains (`start`, as goodput's window), makes no progress while any worker is down or partitioned
  (`stalls`, as `baseline_goodput.stalled_s`), and otherwise steps as the fault-free baseline does, one
  step per `step_s` (the nodes' measured step time, the slowest worker's pace). At wall time t it has
  trained what the baseline trains in `t − start − (stalled time in [start, t])` seconds
  (`dp_bpb_at`). Every honest node's evaluation in the report's late window (the last 20% of the run)
  is paired with the model's bpb at the same moment; one where the model would have gone past the baseline's last point
  (it trained only as many tokens as the nodes) cannot be compared and is left out.

A ratio is nodes ÷ data-parallel (below 1: the nodes' loss is lower); `None` when nothing could be paired.
"""

from __future__ import annotations

import bisect
import statistics
from collections.abc import Iterable, Sequence
from typing import Any

from testnet.faults import merge_intervals
from testnet.timeline import clip_length

__all__ = ["at_equal_tokens", "at_equal_wall_time", "bpb_near_tokens", "dp_bpb_at", "dp_curve", "dp_work_at",
           "honest_token_points", "interpolate", "last_eval_tokens", "stretch"]

MODEL_BASIS = ("model, not run: the fault-free baseline's curve, stalled whenever a worker was down or partitioned "
               "in this run, at the nodes' measured step time")


def interpolate(x: float, xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """`ys` at `x`, linear between the points (`xs` ascending); None outside `[xs[0], xs[-1]]`."""
    if not xs or x < xs[0] or x > xs[-1]:
        return None
    i = bisect.bisect_left(xs, x)
    if xs[i] == x:
        return ys[i]
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (x - x0) / (x1 - x0)


def dp_work_at(t: float, start: float, stalls: list[tuple[float, float]]) -> float:
    """Seconds of fault-free work data-parallel has done by wall time `t` (see module doc)."""
    return max(0.0, (t - start) - clip_length(stalls, start, t))


def dp_bpb_at(t: float, points: Sequence[Sequence[float]], start: float, stalls: list[tuple[float, float]],
              step_s: float) -> float | None:
    """Modelled held-out bpb of data-parallel at wall time `t` under `stalls` (module doc); `points` are
    the baseline's `[step, tokens, bpb]`. None past its last point."""
    return interpolate(dp_work_at(t, start, stalls) / step_s, [p[0] for p in points], [p[2] for p in points])


def dp_curve(points: Sequence[Sequence[float]], start: float, stalls: list[tuple[float, float]],
             step_s: float) -> list[tuple[float, float]]:
    """The model as `[(wall_time, bpb)]`: at each baseline point and at each edge of a stall (flat
    during stalls), so that straight lines between them draw it exactly."""
    times = {stretch(p[0] * step_s, start, stalls) for p in points}
    times.update(t for stall in merge_intervals(stalls) for t in stall if t >= start)
    return [(t, bpb) for t in sorted(times) if (bpb := dp_bpb_at(t, points, start, stalls, step_s)) is not None]


def stretch(compute_s: float, start: float, stalls: list[tuple[float, float]]) -> float:
    """The wall time at which `compute_s` seconds of work started at `start` finish, if no work happens
    during `stalls` (the inverse of `dp_work_at`)."""
    t, remaining = start, compute_s
    for a, b in merge_intervals(stalls):
        if b <= t:
            continue
        if a > t:
            if remaining <= a - t:
                return t + remaining
            remaining -= a - t
        t = max(t, b)
    return t + remaining


def _mean(values: list[float]) -> float | None:
    return statistics.mean(values) if values else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _honest_points(nodes: dict[str, list], honest: Iterable[int]) -> list[list[float]]:
    return [p for n in honest for p in nodes.get(str(n), [])]


def last_eval_tokens(nodes: dict[str, list], honest: Iterable[int]) -> float:
    """The token count up to which every honest node with evaluations has them (0 without any)."""
    lasts = [pts[-1][0] for n in honest if (pts := nodes.get(str(n)))]
    return min(lasts) if lasts else 0.0


def honest_token_points(report: dict[str, Any]) -> dict[str, list[list[float]]]:
    """The honest nodes' curves with each point's tokens those of the honest nodes alone (a hostile node's
    work is not the run's progress), `[tokens_honest_nodes, seconds, bpb]`; reports made before
    `honest_tokens` was written keep all nodes' tokens."""
    curves, out = report["curves"], {}
    counts = curves.get("honest_tokens") or {}
    for n in report["run"]["honest_nodes"]:
        points = curves["nodes"].get(str(n), [])
        tokens = counts.get(str(n)) or [p[0] for p in points]
        out[str(n)] = [[t, p[1], p[2]] for t, p in zip(tokens, points, strict=True)]
    return out


def bpb_near_tokens(report: dict[str, Any], tokens: float, width: float = 0.2, *,
                    all_tokens: bool = False) -> float | None:
    """Mean held-out bpb of the honest nodes' evaluations made when the honest nodes (with `all_tokens`: all
    nodes) together had trained between (1 - width) x tokens and tokens (a window, since single evaluations
    are noisy)."""
    points = _honest_points(report["curves"]["nodes"], report["run"]["honest_nodes"]) if all_tokens else \
        [p for pts in honest_token_points(report).values() for p in pts]
    return _mean([p[2] for p in points if (1 - width) * tokens <= p[0] <= tokens])


def at_equal_tokens(nodes: dict[str, list], honest: Sequence[int], points: Sequence[Sequence[float]],
                    width: float = 0.2) -> dict[str, Any]:
    """Nodes against the measured baseline at the same tokens (module doc)."""
    tokens = last_eval_tokens(nodes, honest)
    xs, ys = [p[1] for p in points], [p[2] for p in points]
    ours, theirs = [], []
    for p in _honest_points(nodes, honest):
        dp = interpolate(p[0], xs, ys) if (1 - width) * tokens <= p[0] <= tokens and tokens > 0 else None
        if dp is not None:
            ours.append(p[2])
            theirs.append(dp)
    nodes_bpb, dp_bpb = _mean(ours), _mean(theirs)
    return {"tokens_from": round((1 - width) * tokens), "tokens_to": round(tokens), "evaluations": len(ours),
            "nodes_bpb": nodes_bpb, "dp_bpb": dp_bpb, "ratio": _ratio(nodes_bpb, dp_bpb),
            "basis": "measured: the baseline trained without faults (faults only stall data-parallel)"}


def at_equal_wall_time(evals: Sequence[tuple[float, float]], points: Sequence[Sequence[float]], *, start: float,
                       stalls: list[tuple[float, float]], step_s: float | None) -> dict[str, Any]:
    """The honest nodes' evaluations `evals` = `[(t, bpb)]` (those of the window) against modelled
    data-parallel under `stalls` at the same moments (module doc)."""
    ours, same = [], []
    for t, bpb in evals:
        dp = dp_bpb_at(t, points, start, stalls, step_s) if step_s and points else None
        if dp is not None:
            ours.append(bpb)
            same.append(dp)
    nodes_bpb, dp_bpb = _mean(ours), _mean(same)
    return {"evaluations": len(ours), "left_out": len(evals) - len(ours), "nodes_bpb": nodes_bpb,
            "dp_same_failures_bpb": dp_bpb, "ratio": _ratio(nodes_bpb, dp_bpb), "basis": MODEL_BASIS}

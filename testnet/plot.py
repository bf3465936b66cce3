"""`loss.png`: held-out bits per byte against tokens and against wall time, every node and the baseline,
and the gap itself: each node's loss over data-parallel's at the same tokens.

Input is the `curves` section of the report (`testnet.report.compute`): node curves as
`[tokens_all_nodes, seconds_since_launch, bpb]`, baseline as
`[tokens, seconds_no_failures, seconds_same_failures, bpb]` (seconds may be null), data-parallel under the
same failures as `dp_same_failures` `[seconds_since_launch, bpb]` (flat through the stalls), restarts as
`[tokens_all_nodes, seconds_since_launch, node]`, and the run's `duration_s`.

- Left, against tokens: the baseline is measured. Middle, against wall time: data-parallel is *modelled*
  (its measured curve at the nodes' step time, stalled by the run's failures), and its legend says so;
  when the run had no failure to stall it, the two models are one curve and one legend entry, not two
  lines drawn on top of each other. Right: each node's bpb ÷ data-parallel's at the same tokens
  (measured), with the method's promise (`testnet.report_md.PROMISE`) as a line.
- The loss axes are logarithmic and clipped: the first evaluations of a run (bpb 7-8 at step 0) would
  otherwise squeeze the curves that matter into the bottom strip. The top of each loss axis is the highest
  bpb seen after the first 15% of that axis' range; a note in the panel says what was cut off.
- Each node has its own marker, so a node whose curve lies on another's still shows.
- Restarts are grey vertical lines; `jumps` (`[seconds, bpb]`, the report's loss jumps after restarts)
  are red rings on the wall-time panel. The wall-time axis ends with the run.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import numpy as np  # noqa: E402
from matplotlib.ticker import FormatStrFormatter, NullFormatter  # noqa: E402

from testnet.quality import interpolate  # noqa: E402
from testnet.report_md import PROMISE  # noqa: E402

__all__ = ["clipped_top", "gap_curves", "plot_loss"]

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "<", ">", "*")
CLIP_AFTER = 0.15  # the loss axis' top: the highest bpb after this share of the x range


def clipped_top(curves: Sequence[Sequence[tuple[float, float]]], after: float = CLIP_AFTER) -> float | None:
    """The top of a clipped loss axis: the highest y among points whose x is past `after` of the x range
    (margin added); None with no such point."""
    xs = [x for c in curves for x, _ in c]
    if not xs:
        return None
    lo, hi = min(xs), max(xs)
    late = [y for c in curves for x, y in c if x >= lo + after * (hi - lo)]
    return max(late) * 1.04 if late else None


def gap_curves(curves: dict[str, Any]) -> dict[str, list[tuple[float, float]]]:
    """Per node, `(tokens, bpb ÷ data-parallel's bpb at the same tokens)` wherever the measured baseline
    reaches those tokens (linear between its points)."""
    base = curves["baseline"]
    xs, ys = [p[0] for p in base], [p[3] for p in base]
    out = {}
    for node, points in curves["nodes"].items():
        pairs = [(p[0], p[2] / dp) for p in points if (dp := interpolate(p[0], xs, ys))]
        if pairs:
            out[node] = pairs
    return out


def tick_step(span: float, ticks: int = 8) -> float:
    """The smallest of 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, 20, … that puts at most `ticks` ticks in `span`
    (a run whose held-out loss went to thousands of bits per byte needs the large ones)."""
    for exponent in itertools.count(-2):
        for mantissa in (1, 2, 5):
            step = mantissa * 10.0**exponent
            if step >= 0.05 and span / step <= ticks:
                return step
    raise AssertionError("unreachable")


def _log_axis(ax, series: list[list[tuple[float, float]]]) -> None:
    ys = [y for s in series for _, y in s]
    if not ys:
        return
    ax.set_yscale("log")
    top, low = clipped_top(series) or max(ys) * 1.04, min(ys) * 0.97
    ax.set_ylim(low, top)
    step = tick_step(top - low)
    ax.set_yticks(np.arange(np.ceil(low / step) * step, top, step))
    ax.yaxis.set_major_formatter(FormatStrFormatter("%.2f" if step < 0.1 else "%.1f" if step < 5 else "%.0f"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    if max(ys) > top:
        ax.text(0.01, 0.02, f"axis clipped at {top:.2f}: the first evaluations (up to {max(ys):.2f}) lie above",
                transform=ax.transAxes, ha="left", va="bottom", fontsize=7, color="0.35")


def plot_loss(curves: dict[str, Any], path: Path, *, title: str = "",
              jumps: Sequence[Sequence[float]] = ()) -> dict[str, list[str]]:
    """Draw the three panels into `path` (PNG); return each panel's legend entries (`tokens`, `time`,
    `gap`). Empty curves give empty panels, not an error."""
    fig, (by_tokens, by_time, gap) = plt.subplots(1, 3, figsize=(17, 4.8), constrained_layout=True)
    token_series, time_series = [], []
    colors = {}
    for i, (node, points) in enumerate(sorted(curves["nodes"].items(), key=lambda kv: int(kv[0]))):
        if not points:
            continue
        tokens, seconds, bpb = zip(*points)
        style = dict(marker=MARKERS[i % len(MARKERS)], markersize=3.5, linewidth=1, alpha=0.9, label=f"node {node}")
        colors[node] = by_tokens.plot(tokens, bpb, **style)[0].get_color()
        by_time.plot(seconds, bpb, color=colors[node], **style)
        token_series.append(list(zip(tokens, bpb)))
        time_series.append(list(zip(seconds, bpb)))
    base = curves["baseline"]
    dp = dict(color="black", linewidth=2, zorder=4)
    if base:
        measured = [(p[0], p[3]) for p in base]
        by_tokens.plot(*zip(*measured), "--", label="data-parallel (measured)", **dp)
        token_series.append(measured)
        no_failures = [(p[1], p[3]) for p in base if p[1] is not None]
        same = curves.get("dp_same_failures") or []
        if no_failures and all(p[1] == p[2] for p in base):  # nothing stalled it: one model, one line
            by_time.plot(*zip(*no_failures), "--", **dp,
                         label="data-parallel (modelled: its measured curve\nat the nodes' pace; no failure stalled it)")
        elif no_failures:
            by_time.plot(*zip(*no_failures), "--", color="0.55", linewidth=1.5, zorder=3,
                         label="data-parallel, no failures (modelled)")
        if same and not all(p[1] == p[2] for p in base):
            by_time.plot(*zip(*same), ":", marker="x", markersize=4, markevery=max(1, len(same) // 15),
                         label="data-parallel, same failures (modelled)", **dp)
        time_series += [no_failures, [(t, b) for t, b in same if t <= (curves.get("duration_s") or t)]]
    for node, pairs in sorted(gap_curves(curves).items(), key=lambda kv: int(kv[0])):
        gap.plot(*zip(*pairs), marker=MARKERS[int(node) % len(MARKERS)], markersize=3.5, linewidth=1,
                 color=colors.get(node), label=f"node {node}")
    if gap.lines:
        gap.axhline(1.0, color="black", linewidth=1.5, label="data-parallel (= 1)")
        gap.axhline(PROMISE, color="tab:red", linestyle="--", linewidth=1.2,
                    label=f"the method's promise ({PROMISE:g})")
        ratios = [(x, y) for line in gap.lines[:-2] for x, y in zip(*line.get_data())]
        x0, x1 = min(x for x, _ in ratios), max(x for x, _ in ratios)
        late = [y for x, y in ratios if x >= x0 + CLIP_AFTER * (x1 - x0)] or [y for _, y in ratios]
        low, top = min(0.98, min(late) * 0.99), max(PROMISE * 1.02, max(late) * 1.02)
        gap.set_ylim(low, top)
        if any(not low <= y <= top for _, y in ratios):
            gap.text(0.01, 0.98, f"axis clipped: the first {CLIP_AFTER:.0%} of the tokens reach "
                     f"{min(y for _, y in ratios):.2f}..{max(y for _, y in ratios):.2f}", transform=gap.transAxes,
                     ha="left", va="top", fontsize=7, color="0.35")
    else:
        gap.text(0.5, 0.5, "no data-parallel baseline to compare with", transform=gap.transAxes, ha="center")
    for i, (tokens, seconds, _node) in enumerate(curves.get("restarts", [])):
        label = "restart" if i == 0 else None
        for ax, x in ((by_tokens, tokens), (by_time, seconds), (gap, tokens)):
            ax.axvline(x, color="grey", linestyle="-", linewidth=0.8, alpha=0.6, label=label)
    if jumps:
        by_time.plot([j[0] for j in jumps], [j[1] for j in jumps], "o", markersize=10, markerfacecolor="none",
                     markeredgecolor="red", markeredgewidth=1.5, label="loss jump after restart", zorder=5)
    if curves.get("duration_s"):
        by_time.set_xlim(0, curves["duration_s"] * 1.02)
    _log_axis(by_tokens, token_series)
    _log_axis(by_time, [s for s in time_series if s])
    by_tokens.set_xlabel("tokens trained (all nodes)")
    by_time.set_xlabel("seconds since launch")
    gap.set_xlabel("tokens trained (all nodes)")
    by_tokens.set_title("held-out loss against tokens", fontsize=10)
    by_time.set_title("held-out loss against wall time", fontsize=10)
    gap.set_title("the gap: node ÷ data-parallel at equal tokens (lower is better)", fontsize=10)
    gap.set_ylabel("held-out bpb ÷ data-parallel's")
    for ax in (by_tokens, by_time, gap):
        if ax is not gap:
            ax.set_ylabel("held-out bits per byte (log scale)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7.5, loc="lower right" if ax is gap else "upper right", ncol=2 if ax is gap else 1)
    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return {name: ax.get_legend_handles_labels()[1] for name, ax in (("tokens", by_tokens), ("time", by_time),
                                                                      ("gap", gap))}

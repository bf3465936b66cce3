"""`loss.png`: held-out bits per byte against tokens and against wall time, every node and the baseline.

Input is the `curves` section of the report (`testnet.report.compute`): node curves as
`[tokens_all_nodes, seconds_since_launch, bpb]`, baseline as
`[tokens, seconds_no_failures, seconds_same_failures, bpb]` (seconds may be null), data-parallel under the
same failures as `dp_same_failures` `[seconds_since_launch, bpb]` (flat through the stalls), restarts as
`[tokens_all_nodes, seconds_since_launch, node]`, and the run's `duration_s`. Against tokens the baseline
is measured; against wall time both data-parallel curves are modelled from it (labelled so). Restarts
are grey vertical lines on both panels; `jumps` (`[seconds, bpb]`, the report's loss jumps after
restarts) are red rings on the wall-time panel. The wall-time axis ends with the run: modelled
data-parallel under the same failures usually finishes the baseline's tokens long after.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

__all__ = ["plot_loss"]


def plot_loss(curves: dict[str, Any], path: Path, *, title: str = "",
              jumps: Sequence[Sequence[float]] = ()) -> None:
    """Draw both panels into `path` (PNG). Empty curves give empty panels, not an error."""
    fig, (by_tokens, by_time) = plt.subplots(1, 2, figsize=(12, 4.5), constrained_layout=True)
    for node, points in sorted(curves["nodes"].items(), key=lambda kv: int(kv[0])):
        if not points:
            continue
        tokens, seconds, bpb = zip(*points)
        by_tokens.plot(tokens, bpb, marker=".", linewidth=1, label=f"node {node}")
        by_time.plot(seconds, bpb, marker=".", linewidth=1, label=f"node {node}")
    base = curves["baseline"]
    if base:
        by_tokens.plot([p[0] for p in base], [p[3] for p in base], "k--", linewidth=2, label="data-parallel (measured)")
        pts = [(p[1], p[3]) for p in base if p[1] is not None]
        if pts:
            by_time.plot(*zip(*pts), "k--", linewidth=2, label="data-parallel, no failures (modelled)")
    if curves.get("dp_same_failures"):
        by_time.plot(*zip(*curves["dp_same_failures"]), "k:", linewidth=2,
                     label="data-parallel, same failures (modelled)")
    for i, (tokens, seconds, _node) in enumerate(curves.get("restarts", [])):
        label = "restart" if i == 0 else None
        by_tokens.axvline(tokens, color="grey", linestyle="-", linewidth=0.8, alpha=0.6, label=label)
        by_time.axvline(seconds, color="grey", linestyle="-", linewidth=0.8, alpha=0.6, label=label)
    if jumps:
        by_time.plot([j[0] for j in jumps], [j[1] for j in jumps], "o", markersize=10, markerfacecolor="none",
                     markeredgecolor="red", markeredgewidth=1.5, label="loss jump after restart")
    if curves.get("duration_s"):
        by_time.set_xlim(0, curves["duration_s"] * 1.02)
    by_tokens.set_xlabel("tokens trained (all nodes)")
    by_time.set_xlabel("seconds since launch")
    for ax in (by_tokens, by_time):
        ax.set_ylabel("held-out bits per byte")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.savefig(path, dpi=110)
    plt.close(fig)

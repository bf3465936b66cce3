"""`loss.png`: held-out bits per byte against tokens and against wall time, every node and the baseline.

Input is the `curves` section of the report (`testnet.report.compute`): node curves as
`[tokens_all_nodes, seconds_since_launch, bpb]`, baseline as
`[tokens, seconds_no_failures, seconds_same_failures, bpb]` (seconds may be null).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)

__all__ = ["plot_loss"]


def plot_loss(curves: dict[str, Any], path: Path, *, title: str = "") -> None:
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
        by_tokens.plot([p[0] for p in base], [p[3] for p in base], "k--", linewidth=2, label="data-parallel")
        for col, style, label in ((1, "k--", "data-parallel, no failures"), (2, "k:", "data-parallel, same failures")):
            pts = [(p[col], p[3]) for p in base if p[col] is not None]
            if pts:
                by_time.plot(*zip(*pts), style, linewidth=2, label=label)
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

"""PNG plot of the goodput table: simulated lines, the paper's values as hollow markers (Agg backend)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (the backend must be chosen first)

from testnet.sim.paper import PAPER_GOODPUT  # noqa: E402
from testnet.sim.table import Cell  # noqa: E402

__all__ = ["plot_table"]


def plot_table(
    cells: Sequence[Cell], path: Path, *, title: str = "Goodput vs chips (1 interruption per chip-year)"
) -> Path:
    """Write the plot of ``cells`` (one line per policy) to ``path`` (PNG) and return the path."""
    series: dict[str, list[Cell]] = {}
    for c in cells:
        series.setdefault(c.policy, []).append(c)
    fig, ax = plt.subplots(figsize=(7.5, 4.8), dpi=120)
    for i, (policy, row) in enumerate(series.items()):
        row = sorted(row, key=lambda c: c.chips)
        color = f"C{i}"
        ax.plot([c.chips for c in row], [100 * c.goodput for c in row], "-o", color=color, label=row[0].label)
        paper = PAPER_GOODPUT.get(policy)
        if paper:
            xs = sorted(paper)
            ax.plot(xs, [paper[x] for x in xs], "--", marker="s", mfc="none", color=color, alpha=0.6,
                    label=f"{row[0].label} (paper)")
    ax.set_xscale("log")
    ticks = sorted({c.chips for c in cells} | {x for p in series if p in PAPER_GOODPUT for x in PAPER_GOODPUT[p]})
    ax.set_xticks(ticks, [f"{t / 1e6:g}M" if t >= 1e6 else f"{t / 1e3:g}k" for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("total chips")
    ax.set_ylabel("goodput (%)")
    ax.set_ylim(0, 101)
    ax.set_title(title)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, ncol=2, loc="lower left")
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    plt.close(fig)
    return path

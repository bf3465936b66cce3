"""Published figures of Decoupled DiLoCo (Douillard, Rush, Donchev et al., arXiv 2604.21428, 2026) that
the simulator and the bandwidth model are checked against. Data, cited; nothing here is computed."""

from __future__ import annotations

__all__ = ["PAPER_BANDWIDTH", "PAPER_CHIPS", "PAPER_GOODPUT"]

# Columns of the paper's goodput table: total chips.
PAPER_CHIPS: tuple[int, ...] = (150_000, 300_000, 600_000, 1_200_000, 2_400_000)

# Goodput (%) per policy key (testnet.sim.layout.Policy.key) and chip count, one interruption per chip-year.
PAPER_GOODPUT: dict[str, dict[int, float]] = {
    "dp": dict(zip(PAPER_CHIPS, (72.0, 57.0, 38.0, 27.0, 18.0))),
    "elastic": dict(zip(PAPER_CHIPS, (88.0, 80.0, 69.0, 58.0, 40.0))),
    "ours-m8": dict(zip(PAPER_CHIPS, (98.0, 96.0, 94.0, 88.0, 80.0))),
    "ours-m16": dict(zip(PAPER_CHIPS, (99.0, 98.0, 96.0, 93.0, 86.0))),
}

# The bandwidth example: 8 datacenters, data-parallel 198 Gbit/s against 0.84 Gbit/s (~235×).
PAPER_BANDWIDTH = {"islands": 8, "dp_gbps": 198.0, "ours_gbps": 0.84}

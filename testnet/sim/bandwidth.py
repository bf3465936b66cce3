"""Cross-island bandwidth: synchronous data-parallel against ours, per island (node), in closed form.

Data-parallel all-reduces the full gradient every inner step with a ring over the ``N`` islands: each
island sends (and receives) ``2 (N−1)/N · params · dp_bits/8`` bytes per step (the definition of
docs/design.md, "Figures"; fp32 by default). Ours moves one ``bits``-bit pseudo-gradient per island per
``H`` inner steps:

* ``ring``: all-reduced like DP (the paper's syncer, which all-reduces fragments):
  ``2 (N−1)/N · params · bits/8 / H`` bytes per island per step;
* ``gossip``: our protocol — every node fetches every other node's blob once (it needs each update, not
  only their sum, for per-update staleness weights), and serves as much as it fetches on average:
  ``(N−1) · params · bits/8 / H`` bytes, i.e. ``N/2`` times the ring.

The required rate is those bytes divided by the step time (no overlap with compute assumed for either).
So ``dp / ours = (dp_bits / bits) · H`` for the ring, whatever the model size and step time.
"""

from __future__ import annotations

from dataclasses import dataclass

from protocol.errors import LocalProtocolError

__all__ = [
    "BandwidthEstimate",
    "BandwidthSetting",
    "MeasuredComparison",
    "compare_measured",
    "estimate",
    "paper_example",
]

RING = "ring"
GOSSIP = "gossip"


@dataclass(frozen=True)
class BandwidthSetting:
    """Model size (parameters), inner-step time (s), H, ours' bits per element, islands, DP gradient
    bits, and ours' topology (``ring`` or ``gossip``)."""

    params: float
    step_seconds: float
    inner_steps: int
    bits: float = 4.0
    islands: int = 8
    dp_bits: float = 32.0
    topology: str = GOSSIP

    def __post_init__(self) -> None:
        if not (self.params > 0 and self.step_seconds > 0 and self.bits > 0 and self.dp_bits > 0):
            raise LocalProtocolError(f"params, step_seconds, bits and dp_bits must be > 0: {self!r}")
        if self.inner_steps < 1 or self.islands < 2:
            raise LocalProtocolError(f"need inner_steps ≥ 1 and islands ≥ 2: {self!r}")
        if self.topology not in (RING, GOSSIP):
            raise LocalProtocolError(f"topology must be {RING!r} or {GOSSIP!r}, got {self.topology!r}")


@dataclass(frozen=True)
class BandwidthEstimate:
    """Bytes each island sends per inner step, and the rate (Gbit/s) that needs, for DP and ours."""

    dp_bytes_per_step: float
    ours_bytes_per_step: float
    dp_gbps: float
    ours_gbps: float

    @property
    def ratio(self) -> float:
        return self.dp_bytes_per_step / self.ours_bytes_per_step


def estimate(s: BandwidthSetting) -> BandwidthEstimate:
    """Per-island bytes per inner step and required Gbit/s for data-parallel and ours (module doc)."""
    n = s.islands
    ring = 2.0 * (n - 1) / n
    dp = ring * s.params * s.dp_bits / 8.0
    blob = s.params * s.bits / 8.0
    ours = (ring if s.topology == RING else float(n - 1)) * blob / s.inner_steps
    to_gbps = 8.0 / s.step_seconds / 1e9
    return BandwidthEstimate(dp, ours, dp * to_gbps, ours * to_gbps)


def paper_example(params: float = 2.5e9, *, dp_gbps: float = 198.0, ours_gbps: float = 0.84,
                  bits: float = 4.0, dp_bits: float = 32.0, islands: int = 8) -> tuple[BandwidthSetting, float]:
    """Settings under which the ring model gives the paper's DP rate exactly and ours' as closely as an
    integer H allows. The paper states neither its model size, step time nor H; assumed here: fp32 DP
    gradients, 4-bit outer gradients, both all-reduced over the 8 datacenters. The step time follows from
    ``params`` and 198 Gbit/s; H from the ratio ``dp_gbps / ours_gbps = (dp_bits/bits)·H``. Returns the
    setting and the unrounded H."""
    ring = 2.0 * (islands - 1) / islands
    step = ring * params * dp_bits / (dp_gbps * 1e9)
    h_exact = (dp_gbps / ours_gbps) * bits / dp_bits
    return BandwidthSetting(params, step, max(1, round(h_exact)), bits, islands, dp_bits, RING), h_exact


@dataclass(frozen=True)
class MeasuredComparison:
    """Measured bytes per node per inner step (transport counters) against the model's prediction."""

    measured_bytes_per_step: float
    predicted_bytes_per_step: float
    dp_bytes_per_step: float

    @property
    def measured_over_predicted(self) -> float:
        return self.measured_bytes_per_step / self.predicted_bytes_per_step

    @property
    def measured_ratio_vs_dp(self) -> float:
        """The communication ratio (docs/design.md, "Figures"): DP ring all-reduce bytes ÷ bytes actually sent."""
        return self.dp_bytes_per_step / self.measured_bytes_per_step


def compare_measured(measured_bytes_per_node_per_step: float, setting: BandwidthSetting) -> MeasuredComparison:
    """Compare a testnet measurement (bytes sent per node per inner step, payloads and control together)
    with :func:`estimate`'s prediction for the same setting (use ``topology="gossip"`` for our testnet).
    Framing, headers, signatures and heartbeats make ``measured_over_predicted`` a little above 1; much
    more means a node received blobs more than once."""
    if not measured_bytes_per_node_per_step > 0:
        raise LocalProtocolError(f"measured bytes must be > 0, got {measured_bytes_per_node_per_step!r}")
    e = estimate(setting)
    return MeasuredComparison(measured_bytes_per_node_per_step, e.ours_bytes_per_step, e.dp_bytes_per_step)

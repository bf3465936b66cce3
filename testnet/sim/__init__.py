"""Discrete-event goodput simulator and bandwidth model for Decoupled DiLoCo at datacenter scale.

Learners made of chips, the paper's failure model (per-chip MTBI, slices, resize pauses, returns), three
policies (data-parallel, elastic data-parallel, ours with M learners closing slots through the node's own
``SlotClosePolicy``), the goodput table against the paper's, and the cross-island bandwidth model.
Entry point: ``diloco-sim`` (``python -m testnet.sim``).
"""

from testnet.sim.bandwidth import (
    BandwidthEstimate,
    BandwidthSetting,
    MeasuredComparison,
    compare_measured,
    estimate,
    paper_example,
)
from testnet.sim.config import SimConfig
from testnet.sim.engine import GroupStats, SimResult, simulate
from testnet.sim.faults import Fault, SimPlan
from testnet.sim.layout import Policy

__all__ = [
    "BandwidthEstimate",
    "BandwidthSetting",
    "Fault",
    "SimPlan",
    "GroupStats",
    "MeasuredComparison",
    "Policy",
    "SimConfig",
    "SimResult",
    "compare_measured",
    "estimate",
    "paper_example",
    "simulate",
]

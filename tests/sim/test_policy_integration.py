"""Ours closes slots with the node's own SlotClosePolicy: slow learners never hold fast ones back for more
than the max hold, and the quorum/grace knobs act as the policy's contract says."""

import pytest

from protocol.ledger.policy import SlotClosePolicy
from testnet.sim import Policy, SimConfig, simulate
from testnet.sim import slots as slots_module

# 4 learners, the last one on hardware at half speed; no failures; 10-step rounds of 1 s steps.
SLOW = SimConfig(
    mtbi_seconds=float("inf"), slice_chips=64, step_seconds=1.0, inner_steps=10, transfer_seconds=0.5,
    sync_seconds=0.0, island_speeds=(1.0, 1.0, 1.0, 0.5), horizon_seconds=2200.0,
)


def test_the_simulator_drives_the_nodes_policy_class():
    assert slots_module.SlotClosePolicy is SlotClosePolicy


def test_slow_learner_holds_fast_ones_back_at_most_the_max_hold():
    r = simulate(Policy("ours", 4), 1024, SLOW.replace(quorum=4, max_hold_steps=1.0))
    fast, slow = r.groups[:3], r.groups[3]
    for g in fast:
        held_per_round = g.hold / g.chips / g.rounds
        assert held_per_round <= 1.0 + 1e-9  # one of its own 1 s steps
        assert g.rounds >= 199  # 2200 s / (10 s + ≤ 1 s): the slow learner does not set the pace
        assert g.useful / (g.chips * SLOW.horizon_seconds) >= 10 / 11 - 1e-3
    assert slow.rounds <= 2200 / 20 + 1
    assert r.hold_per_round_max <= 2.0 + 1e-9  # the slow learner's own step is 2 s
    assert r.closed_by.get("deadline", 0) > 0  # quorum 4 is not met in time: the deadline closes


def test_without_a_hold_nobody_waits():
    r = simulate(Policy("ours", 4), 1024, SLOW.replace(quorum=4, max_hold_steps=0.0))
    assert r.goodput == pytest.approx(1.0, abs=1e-12)
    assert r.hold_per_round_max == 0.0


def test_a_longer_hold_lets_the_quorum_fill():
    # Equal speeds, 0.5 s transfer: a hold of 1 step closes before peers' updates of the same round
    # arrive only if it ends first; with 2 steps of hold, quorum M is met and the slot is full.
    cfg = SLOW.replace(island_speeds=(), quorum=4, max_hold_steps=2.0, grace_gamma=1.0)
    full = simulate(Policy("ours", 4), 1024, cfg)
    assert full.slot_updates_mean == pytest.approx(4.0, abs=0.05)
    assert full.closed_by.get("quorum", 0) > 0
    eager = simulate(Policy("ours", 4), 1024, cfg.replace(max_hold_steps=0.0))
    assert eager.slot_updates_mean < 1.5  # closes on its own update alone
    assert eager.goodput > full.goodput

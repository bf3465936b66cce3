"""Goodput on configurations small enough to compute by hand: no failures, and one planned failure."""

import pytest

from testnet.sim import Fault, SimPlan, Policy, SimConfig, simulate

POLICIES = [Policy("dp"), Policy("elastic"), Policy("ours", 1), Policy("ours", 2), Policy("ours", 4)]

# 1024 chips in slices of 256; no random failures; 1 s steps; no hold, no outer-step time.
BASE = SimConfig(
    mtbi_seconds=float("inf"), return_seconds=50.0, resize_seconds=10.0, slice_chips=256, step_seconds=1.0,
    inner_steps=10, transfer_seconds=0.5, sync_seconds=0.0, max_hold_steps=0.0, horizon_seconds=1000.0,
)


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: p.key)
def test_no_failures_is_full_goodput(policy):
    r = simulate(policy, 1024, BASE)
    assert r.goodput == pytest.approx(1.0, abs=1e-12)
    assert r.failures == 0


def test_no_failures_with_the_node_hold_costs_one_step_per_round():
    # K=1, hold ≤ 1 step: each learner trains 10 s then holds exactly 1 s (grace = min(γ·slack, hold)).
    cfg = BASE.replace(max_hold_steps=1.0, horizon_seconds=1100.0)
    r = simulate(Policy("ours", 2), 1024, cfg)
    assert r.goodput == pytest.approx(10 / 11, abs=1e-12)
    assert [g.rounds for g in r.groups] == [100, 100]
    assert r.hold_per_round_max == pytest.approx(1.0)


def test_one_failure_data_parallel():
    # Fails at 100.5 s: the half-done step is lost, everything stalls 50 s (return) + 10 s (restart).
    r = simulate(Policy("dp"), 1024, BASE, faults=SimPlan.fail_at(100.5, 0, 1))
    assert r.goodput == pytest.approx(1 - (0.5 + 50 + 10) / 1000, abs=1e-12)
    assert r.failures == 1


def test_one_failure_elastic():
    # Lost half step on all 1024 chips, 10 s scale-down pause, slice of 256 out until 150.5 s,
    # 10 s scale-up pause.
    r = simulate(Policy("elastic"), 1024, BASE, faults=SimPlan.fail_at(100.5, 0, 1))
    wasted = 1024 * (0.5 + 10 + 10) + 256 * (150.5 - 110.5)
    assert r.goodput == pytest.approx(1 - wasted / (1024 * 1000), abs=1e-12)
    g = r.groups[0]  # the same waste, by cause: in-flight step, pauses (768 then 1024 chips), slice out
    assert (g.lost, g.stalled, g.out) == pytest.approx((512.0, 768 * 10 + 1024 * 10, 256 * 50.0))


def test_one_failure_ours_elastic_learner():
    # Learner 0 (512 chips) loses half a step, pauses 10 s, trains on 256 chips until the slice is back,
    # pauses 10 s again; learner 1 never notices.
    r = simulate(Policy("ours", 2), 1024, BASE, faults=SimPlan.fail_at(100.5, 0, 0))
    useful0 = 512 * 100 + 256 * 40 + 512 * (1000 - 160.5)
    assert r.goodput == pytest.approx((useful0 + 512 * 1000) / (1024 * 1000), abs=1e-12)
    assert r.groups[1].useful == pytest.approx(512 * 1000)


def test_one_failure_ours_non_elastic_learner_loses_its_round():
    # The round started at 100 s (rounds of 10 steps, no hold); the crash at 105.5 s loses all 5.5 steps,
    # the learner is down 50 s, restarts in 10 s and begins a fresh round at 165.5 s.
    cfg = BASE.replace(learner_elastic=False)
    r = simulate(Policy("ours", 2), 1024, cfg, faults=SimPlan.fail_at(105.5, 0, 0))
    useful0 = 512 * (100 + (1000 - 165.5))
    assert r.goodput == pytest.approx((useful0 + 512 * 1000) / (1024 * 1000), abs=1e-12)
    assert r.groups[0].lost == pytest.approx(512 * 5.5)


def test_fault_on_a_stalled_group_is_absorbed():
    plan = SimPlan.fail_at(100.5, 0, 1) + SimPlan.fail_at(120.0, 0, 2)  # second one lands in the stall
    r = simulate(Policy("dp"), 1024, BASE, faults=plan)
    assert r.goodput == pytest.approx(1 - 60.5 / 1000, abs=1e-12)
    assert (r.failures, r.groups[0].absorbed) == (1, 1)


def test_fault_outside_the_layout_is_refused():
    from protocol.errors import LocalProtocolError

    with pytest.raises(LocalProtocolError):
        simulate(Policy("ours", 2), 1024, BASE, faults=SimPlan.fail_at(1.0, 2, 0))


def test_killed_learner_loses_its_round_and_is_down_for_the_kill():
    # Learner 0 is killed at 105.5 s for 30 s: its 5.5-step round is lost, it restarts (10 s) at 135.5 s
    # and trains again from 145.5 s; learner 1 never notices.
    plan = SimPlan([Fault(105.5, 0, downtime=30.0, whole_group=True)])
    r = simulate(Policy("ours", 2), 1024, BASE, faults=plan)
    assert r.goodput == pytest.approx((512 * (100 + 1000 - 145.5) + 512 * 1000) / (1024 * 1000), abs=1e-12)
    assert r.groups[0].lost == pytest.approx(512 * 5.5)


def test_the_testnet_fault_plan_drives_the_simulator():
    from testnet.faults import FaultPlan as TestnetPlan
    from testnet.faults import Kill
    from testnet.sim.faults import from_testnet_plan

    plan = TestnetPlan(nodes=2, duration=1000.0, kills=(Kill(105.5, 0, 30.0),), slow=((1, 2.0),))
    faults, speeds = from_testnet_plan(plan)
    assert speeds == (1.0, 0.5)
    r = simulate(Policy("ours", 2), 1024, BASE.replace(island_speeds=speeds), faults=faults)
    assert r.goodput == pytest.approx((512 * (100 + 1000 - 145.5) + 512 * 1000) / (1024 * 1000), abs=1e-12)
    assert r.groups[1].rounds == 50  # 10 steps of 2 s per round on the slowed node, nobody waits

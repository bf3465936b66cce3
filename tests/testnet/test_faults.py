"""Tier (a): the fault plan is a pure, seeded, valid value."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from testnet.faults import FaultPlan, Kill, Partition, PlanError, make_plan, parse_misbehave, parse_partition, parse_slow
from testnet.sim.faults import from_testnet_plan


def test_same_seed_same_plan_and_different_seed_differs() -> None:
    a = make_plan(nodes=6, duration=600, seed=7, kill_every=30, downtime=15)
    b = make_plan(nodes=6, duration=600, seed=7, kill_every=30, downtime=15)
    c = make_plan(nodes=6, duration=600, seed=8, kill_every=30, downtime=15)
    assert a == b and a.fingerprint() == b.fingerprint() and a.describe() == b.describe()
    assert [k.node for k in a.kills] != [k.node for k in c.kills]
    assert [k.at for k in a.kills] == [k.at for k in c.kills]  # the schedule is periodic, the victim random


@settings(max_examples=60)
@given(nodes=st.integers(1, 8), minutes=st.floats(0.5, 20), every=st.floats(2, 120), downtime=st.floats(0, 200),
       seed=st.integers(0, 2**32))
def test_kill_schedule_respects_downtime_settle_and_ordering(nodes, minutes, every, downtime, seed) -> None:
    duration = minutes * 60
    plan = make_plan(nodes=nodes, duration=duration, seed=seed, kill_every=every, downtime=downtime)
    settle = min(60.0, max(10.0, 0.2 * duration))
    assert list(plan.kills) == sorted(plan.kills)
    for k in plan.kills:
        assert k.downtime == downtime and k.restart_at <= duration - settle + 1e-6
    for node in range(nodes):  # never killed while down
        downs = plan.downtime(node)
        assert all(a[1] <= b[0] for a, b in zip(downs, downs[1:]))
    for k in plan.kills:  # on the period's grid (a tick with every node down is skipped)
        ticks = (k.at - every) / every
        assert ticks == pytest.approx(round(ticks), abs=1e-6)
    actions = plan.actions()
    assert [a.at for a in actions] == sorted(a.at for a in actions)
    assert sum(a.kind == "kill" for a in actions) == sum(a.kind == "restart" for a in actions) == len(plan.kills)
    assert FaultPlan.from_dict(plan.to_dict()) == plan


def test_kills_skip_nodes_that_are_down() -> None:
    # two nodes, downtime longer than the period: the second kill must hit the other node
    plan = make_plan(nodes=2, duration=100, seed=0, kill_every=10, downtime=15, settle=10)
    for first, second in zip(plan.kills, plan.kills[1:]):
        if second.at < first.restart_at:
            assert second.node != first.node


def test_a_single_node_that_is_down_is_not_killed_again() -> None:
    plan = make_plan(nodes=1, duration=100, seed=0, kill_every=10, downtime=15, settle=10)
    assert [k.at for k in plan.kills] == [10, 30, 50, 70]


def test_actions_order_restart_before_kill_and_heal_before_partition() -> None:
    plan = FaultPlan(nodes=3, duration=100, kills=(Kill(10, 0, 5), Kill(15, 1, 5)),
                     partitions=(Partition(20, 30, (0,), (1, 2)), Partition(30, 40, (1,), (0, 2))))
    kinds = [(a.at, a.kind) for a in plan.actions()]
    assert kinds == [(10, "kill"), (15, "restart"), (15, "kill"), (20, "restart"), (20, "partition"),
                     (30, "heal"), (30, "partition"), (40, "heal")]
    assert plan.all_up_after() == 40
    assert not plan.is_up(0, 12) and plan.is_up(0, 15)


def test_validation_errors_name_the_problem() -> None:
    with pytest.raises(PlanError, match="node 5 does not exist"):
        FaultPlan(nodes=3, duration=10, slow=((5, 2.0),))
    with pytest.raises(PlanError, match="while still down"):
        FaultPlan(nodes=3, duration=100, kills=(Kill(10, 0, 20), Kill(20, 0, 5)))
    with pytest.raises(PlanError, match="does not fit"):
        FaultPlan(nodes=3, duration=100, kills=(Kill(90, 0, 20),))
    with pytest.raises(PlanError, match="disjoint"):
        FaultPlan(nodes=3, duration=100, partitions=(Partition(1, 2, (0, 1), (1, 2)),))
    with pytest.raises(PlanError, match=">= 1"):
        FaultPlan(nodes=3, duration=100, slow=((1, 0.5),))
    with pytest.raises(PlanError, match="misbehave mode"):
        FaultPlan(nodes=3, duration=100, misbehave=((1, "evil"),))


def test_flag_parsers() -> None:
    assert parse_slow("2:4") == (2, 4.0)
    assert parse_misbehave("1") == (1, "bad-updates") and parse_misbehave("1:garbage") == (1, "garbage")
    assert parse_partition("40:60:0,1", 4) == Partition(40, 60, (0, 1), (2, 3))
    assert parse_partition("40:60:0/2,3", 4) == Partition(40, 60, (0,), (2, 3))
    for bad, fn in (("2", parse_slow), ("x:4", parse_slow), ("a:b", lambda t: parse_partition(t, 3)),
                    ("1:2:0/1/2", lambda t: parse_partition(t, 3))):
        with pytest.raises(PlanError):
            fn(bad)


def test_plan_feeds_the_simulator() -> None:
    plan = make_plan(nodes=4, duration=300, seed=3, kill_every=30, downtime=15)
    faults, speeds = from_testnet_plan(plan)
    assert [(f.time, f.group, f.downtime, f.whole_group) for f in faults] == [
        (k.at, k.node, k.downtime, True) for k in plan.kills]
    assert speeds == ()


def test_describe_mentions_every_fault() -> None:
    plan = make_plan(nodes=4, duration=120, seed=1, kill_every=30, downtime=10, slow={2: 4.0},
                     misbehave={3: "garbage"}, partitions=[Partition(40, 50, (0,), (1, 2, 3))])
    text = "\n".join(plan.describe())
    assert "node 2 is 4x slower" in text and "node 3 misbehaves (garbage)" in text
    assert text.count("kill node") == len(plan.kills) and "partition [0] | [1, 2, 3]" in text

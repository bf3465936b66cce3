"""The slot-closing policy: hand-computed timelines and the never-stall contract."""

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.errors import LocalProtocolError
from protocol.ledger import CloseDecision, ClosePolicyConfig, SlotClosePolicy


def make(quorum=1, gamma=0.5, max_hold_steps=1.0, step=None, transfer=None, sync=None):
    policy = SlotClosePolicy(ClosePolicyConfig(quorum=quorum, gamma=gamma, max_hold_steps=max_hold_steps))
    if step is not None:
        policy.observe_step(step)
    if transfer is not None:
        policy.observe_transfer(transfer)
    if sync is not None:
        policy.observe_sync(sync)
    return policy


def test_nothing_observed_closes_as_soon_as_the_round_is_done():
    policy = make(quorum=3)
    assert policy.grace_seconds(100) == 0.0
    assert policy.decide(now=4.0, round_done_at=5.0, updates_in_slot=9, inner_steps=100) == CloseDecision(
        False, 5.0, "round-running"
    )
    # quorum not met, but the hold is 0 without a step estimate: never wait on a guess
    assert policy.decide(now=5.0, round_done_at=5.0, updates_in_slot=0, inner_steps=100) == CloseDecision(
        True, None, "deadline"
    )
    assert make().decide(now=5.0, round_done_at=5.0, updates_in_slot=1, inner_steps=100) == CloseDecision(
        True, None, "quorum"
    )


def test_timeline_quorum_two_grace_capped_by_one_step():
    # step 1.0 s, transfer 0.4 s, sync 0.1 s, τ=10: slack = 10 − 0.4 − 0.1 = 9.5, γ·slack = 4.75, hold = 1 s
    policy = make(quorum=2, step=1.0, transfer=0.4, sync=0.1)
    assert policy.grace_seconds(10) == pytest.approx(1.0)
    done = 100.0
    assert policy.decide(now=100.0, round_done_at=done, updates_in_slot=1, inner_steps=10) == CloseDecision(
        False, 101.0, "await-quorum"
    )
    assert policy.decide(now=100.5, round_done_at=done, updates_in_slot=2, inner_steps=10) == CloseDecision(
        False, 101.0, "grace"
    )
    assert policy.decide(now=101.0, round_done_at=done, updates_in_slot=2, inner_steps=10) == CloseDecision(
        True, None, "quorum"
    )
    # the peer never came: closed anyway at round end + one step
    assert policy.decide(now=101.0, round_done_at=done, updates_in_slot=1, inner_steps=10) == CloseDecision(
        True, None, "deadline"
    )


def test_timeline_grace_limited_by_slack():
    # τ=2 steps of 1 s, transfer 1.5 s, sync 0.1 s: slack 0.4 s, γ=0.5 → grace 0.2 s (< hold 1 s)
    policy = make(quorum=1, step=1.0, transfer=1.5, sync=0.1)
    assert policy.grace_seconds(2) == pytest.approx(0.2)
    d = policy.decide(now=10.1, round_done_at=10.0, updates_in_slot=1, inner_steps=2)
    assert d.close is False and d.why == "grace" and d.wake_at == pytest.approx(10.2)
    assert policy.decide(now=10.2, round_done_at=10.0, updates_in_slot=1, inner_steps=2).close
    # no slack at all: no grace
    assert make(step=1.0, transfer=5.0).grace_seconds(2) == 0.0


def test_moving_averages():
    policy = make()  # ema 0.2
    policy.observe_step(1.0)
    policy.observe_step(2.0)
    assert policy.step_ema == pytest.approx(1.2)
    policy.observe_step(2.0)
    assert policy.step_ema == pytest.approx(1.36)
    assert policy.hold_seconds() == pytest.approx(1.36)
    with pytest.raises(LocalProtocolError):
        policy.observe_transfer(-1.0)
    with pytest.raises(LocalProtocolError):
        policy.observe_sync(math.nan)


@pytest.mark.parametrize(
    "kwargs", [{"quorum": 0}, {"gamma": 1.5}, {"max_hold_steps": -1.0}, {"max_hold_steps": math.inf}, {"ema": 0.0}]
)
def test_config_is_validated(kwargs):
    with pytest.raises(LocalProtocolError):
        ClosePolicyConfig(**kwargs)


durations = st.floats(min_value=0.0, max_value=100.0, allow_nan=False)


@given(
    quorum=st.integers(1, 8),
    gamma=st.floats(0.0, 1.0),
    hold=st.floats(0.0, 4.0),
    steps=st.lists(durations, max_size=4),
    transfers=st.lists(durations, max_size=4),
    tau=st.integers(0, 1000),
    updates=st.integers(0, 10),
    done=st.floats(-1e6, 1e6),
    after=st.floats(0.0, 1e3),
)
def test_never_stalls_and_always_makes_progress(quorum, gamma, hold, steps, transfers, tau, updates, done, after):
    policy = SlotClosePolicy(ClosePolicyConfig(quorum=quorum, gamma=gamma, max_hold_steps=hold))
    for s in steps:
        policy.observe_step(s)
    for t in transfers:
        policy.observe_transfer(t)
    now = done + after
    deadline = done + hold * policy.step_ema
    d = policy.decide(now=now, round_done_at=done, updates_in_slot=updates, inner_steps=tau)
    assert 0.0 <= policy.grace_seconds(tau) <= policy.hold_seconds()
    if now >= deadline:
        assert d.close
    if d.close:
        assert d.wake_at is None
    else:
        assert now < d.wake_at <= deadline
    if updates >= quorum and now >= done + policy.grace_seconds(tau):
        assert d == CloseDecision(True, None, "quorum")


def test_closes_without_grace_once_every_expected_update_is_in():
    # step 1 s, τ=10 → grace 1 s (the hold); 3 live nodes
    policy = make(quorum=1, step=1.0)
    assert policy.decide(now=5.0, round_done_at=5.0, updates_in_slot=2, inner_steps=10, expected_updates=3) == (
        CloseDecision(False, 6.0, "grace")
    )
    assert policy.decide(now=5.0, round_done_at=5.0, updates_in_slot=3, inner_steps=10, expected_updates=3) == (
        CloseDecision(True, None, "complete")
    )
    # never before the node's own round is done
    assert policy.decide(now=4.0, round_done_at=5.0, updates_in_slot=3, inner_steps=10, expected_updates=3) == (
        CloseDecision(False, 5.0, "round-running")
    )
    with pytest.raises(LocalProtocolError):
        policy.decide(now=5.0, round_done_at=5.0, updates_in_slot=1, inner_steps=10, expected_updates=0)

"""Tier (a): whose heavier states the fork choice holds off (`node.outer.forkguard.ForkGuard`):

- a peer whose state a vet refused, for `ADOPTION_COOLDOWN_WINDOWS` windows of slots, doubled with each
  refusal, then its states are downloaded and vetted again — so an honest heavier side that once evaluated
  worse is not shut out for good; a second peer vouching for its state does not lift a refusal;
- a peer this process adopted from lately, for `ADOPTION_COOLDOWN_WINDOWS` windows of slots, unless a second
  peer vouches for the state it offers now — once per such period, whoever the peers.

The replica's slot is the guard's clock (`Replica.guard`)."""

from __future__ import annotations

import numpy as np

from node.outer.forkguard import ADOPTION_COOLDOWN_WINDOWS, ForkGuard, refusal_slots
from node.outer.replica import Replica
from protocol.ledger import Ledger, LedgerConfig


class Clock:
    def __init__(self) -> None:
        self.slot = 100

    def __call__(self) -> int:
        return self.slot


def test_a_refusal_lasts_four_windows_and_doubles_with_each_next_one() -> None:
    assert [refusal_slots(n, 8) for n in (1, 2, 3)] == [32, 64, 128]
    assert ADOPTION_COOLDOWN_WINDOWS == 4


def test_a_refused_peer_is_held_off_until_its_refusal_has_passed_whoever_vouches() -> None:
    clock = Clock()
    guard = ForkGuard(2, clock)
    assert guard.holds_off("p") is None and guard.refused_from == frozenset()
    guard.refuse("p")
    assert guard.refused_recently("p") and guard.refused_from == {"p"} and guard.holds_off("q") is None
    assert "refused as a worse model at slot 100" in guard.holds_off("p", vouched=True)
    clock.slot += refusal_slots(1, 2) - 1  # one slot less than its term
    assert guard.holds_off("p") is not None
    clock.slot += 1  # its term has passed
    assert guard.holds_off("p") is None and guard.refused_from == frozenset()
    guard.refuse("p")  # refused again: twice as long
    assert guard.refusals["p"] == (clock.slot, 2)
    clock.slot += refusal_slots(1, 2)
    assert guard.refused_recently("p"), "the second refusal lasts twice the first"
    clock.slot += refusal_slots(1, 2)
    assert not guard.refused_recently("p")


def test_a_peer_adopted_from_lately_is_held_off_unless_a_second_peer_vouches() -> None:
    clock = Clock()
    guard = ForkGuard(8, clock)
    guard.adopted("p")
    assert guard.adopted_recently("p") and not guard.adopted_recently("q")
    assert "adopted at slot 100, less than 4 windows ago" in guard.holds_off("p")
    assert guard.holds_off("p", vouched=True) is None
    assert guard.refused_from == frozenset(), "an adoption is not a refusal"
    clock.slot += ADOPTION_COOLDOWN_WINDOWS * 8 - 1
    assert guard.holds_off("p") is not None
    clock.slot += 1
    assert guard.holds_off("p") is None


def test_the_replicas_guard_counts_in_its_slots() -> None:
    replica = Replica(Ledger({"w": np.zeros((4,), np.float32)}, LedgerConfig(window=2)))
    replica.guard.refuse("p")
    assert replica.guard.refusals["p"] == (replica.slot, 1)
    assert replica.guard.window == 2 and replica.guard.refused_from == {"p"}


def test_a_vouch_lifts_a_hold_off_once_per_period_whoever_the_peers() -> None:
    clock = Clock()
    guard = ForkGuard(8, clock)
    guard.adopted("p")
    guard.adopted("q")
    clock.slot += 1
    assert guard.holds_off("p", vouched=True) is None
    guard.adopted("p", vouched=True)  # the vouch let it through
    clock.slot += 1
    reason = guard.holds_off("q", vouched=True)
    assert reason is not None and "a vouched state was adopted at slot 101" in reason
    clock.slot += ADOPTION_COOLDOWN_WINDOWS * 8 - 1
    guard.adopted("q")  # adopted lately again, without a vouch
    assert guard.holds_off("q", vouched=True) is None, "a period after the last vouch, a vouch lifts again"

"""Tier (a): how long a peer whose state a vet refused stays refused (`Replica.refuse`, `refusal_slots`):
`ADOPTION_COOLDOWN_WINDOWS` windows of slots, doubled with each refusal, then its states are downloaded and
vetted again — so an honest heavier side that once evaluated worse is not shut out for good."""

from __future__ import annotations

import numpy as np

from node.outer.replica import ADOPTION_COOLDOWN_WINDOWS, Replica, refusal_slots
from protocol.ledger import Ledger, LedgerConfig


def test_a_refusal_lasts_four_windows_and_doubles_with_each_next_one() -> None:
    assert [refusal_slots(n, 8) for n in (1, 2, 3)] == [32, 64, 128]
    assert ADOPTION_COOLDOWN_WINDOWS == 4


def test_a_refused_peer_is_left_out_until_its_refusal_has_passed() -> None:
    replica = Replica(Ledger({"w": np.zeros((4,), np.float32)}, LedgerConfig(window=2)))
    assert not replica.refused_recently("p") and replica.refused_from == frozenset()
    replica.refuse("p")
    assert replica.refused_recently("p") and replica.refused_from == {"p"} and not replica.refused_recently("q")
    at = replica.slot
    replica.refusals["p"] = (at - refusal_slots(1, 2) + 1, 1)  # refused one slot less than its term ago
    assert replica.refused_recently("p")
    replica.refusals["p"] = (at - refusal_slots(1, 2), 1)  # its term has passed
    assert not replica.refused_recently("p") and replica.refused_from == frozenset()
    replica.refuse("p")  # refused again: twice as long
    assert replica.refusals["p"] == (at, 2)
    replica.refusals["p"] = (at - refusal_slots(1, 2), 2)
    assert replica.refused_recently("p"), "the second refusal lasts twice the first"

"""Tier (a): the catch-up pace (`protocol.ledger.catchup`): slots follow the run's work, and no single node
moves a replica faster than the run's rounds; the ledger's agreement does not depend on the pace."""

from __future__ import annotations

import numpy as np

from protocol.ledger import Ledger, LedgerConfig, UpdateMeta, catch_up_target
from protocol.ledger.catchup import quorum

GAP = 5.0  # the run's round time


def target(held: dict[int, set[str]], *, peers: int = 5, now: float = 100.0, last: float | None = 99.0,
           open_origins: frozenset[str] = frozenset({"me"})) -> int:
    return catch_up_target(10, held, peers=peers, now=now, last_close_at=last, min_gap_s=GAP,
                           open_origins=open_origins)


def test_a_majority_of_the_run_ahead_moves_the_replica_at_once() -> None:
    assert target({13: {"a"}, 12: {"b"}}, peers=2) == 12, "two of a run of three at or past 12: the run is at 12"
    assert target({13: {"a", "b"}}, peers=2) == 13
    assert target({}) == 10 and target({11: {"a", "b"}}, peers=2) == 11
    assert target({13: {"a", "b"}, 12: {"c"}, 11: {"d"}}, peers=5) == 11, "four of six at or past 11"
    assert [quorum(p) for p in (1, 2, 3, 4, 5, 7, 15)] == [1, 2, 3, 3, 4, 5, 9]


def test_colluders_short_of_a_majority_move_the_replica_one_slot_per_gap_at_most() -> None:
    """Two colluding members of a run of four publish for slots far ahead: the two honest nodes follow
    them no faster than the one-slot rule, not to the slot they named."""
    ahead = {11: {"x", "y"}, 12: {"x", "y"}, 30: {"x", "y"}}
    assert target(ahead, peers=3, last=99.0) == 10
    assert target(ahead, peers=3, last=94.0) == 11
    assert target({**ahead, 12: {"x", "y", "honest"}}, peers=3, last=99.0) == 12, "with an honest peer: a majority"


def test_one_origin_ahead_moves_the_replica_one_slot_per_gap_at_most() -> None:
    burst = {11: {"x"}, 12: {"x"}, 13: {"x"}, 40: {"x"}}  # a burst of short rounds, or a publish_slot jump
    assert target(burst, last=99.0) == 10, "closed a slot 1 s ago: wait"
    assert target(burst, last=94.0) == 11, "a round since the last close: one slot"
    assert target(burst, last=None) == 11


def test_one_origin_ahead_never_closes_a_slot_holding_only_its_updates() -> None:
    """A slot closed on one origin's word while it holds nothing else may never get another update (the
    others moved on): its final set would be that origin's alone, which no median bounds."""
    ahead = {11: {"x"}}
    assert target(ahead, last=None, open_origins=frozenset({"x"})) == 10
    assert target(ahead, last=None, open_origins=frozenset()) == 10
    assert target(ahead, last=None, open_origins=frozenset({"x", "me"})) == 11
    assert target({11: {"x"}, 12: {"y"}}, peers=2, open_origins=frozenset({"x"})) == 11, "a quorum still moves it"


def test_a_run_of_two_follows_its_one_peer() -> None:
    assert target({14: {"a"}}, peers=1) == 14


def _meta(i: int, origin: str, publish_slot: int) -> UpdateMeta:
    return UpdateMeta(bytes([i]) * 32, origin, publish_slot, publish_slot, 100, 10)


def test_held_origins_are_what_the_ledger_holds_and_paced_closes_keep_agreement() -> None:
    params = {"w": np.zeros(4, dtype=np.float32)}
    config = LedgerConfig(window=8)
    rng = np.random.default_rng(0)
    updates = [(_meta(i, o, s), {"w": rng.normal(size=4).astype(np.float32)})
               for i, (o, s) in enumerate([("a", 0), ("x", 1), ("x", 2), ("b", 0), ("x", 3)])]
    fast, paced = Ledger(params, config), Ledger(params, config)
    for meta, deltas in updates:
        fast.add(meta, deltas)
        paced.add(meta, deltas)
        while fast.held_future() and max(fast.held_future()) > fast.slot + 1:  # the old rule: follow anyone
            fast.close_slot()
    assert paced.held_future_origins() == {2: frozenset({"x"}), 3: frozenset({"x"}), 4: frozenset({"x"})}
    assert paced.slot == 0 and fast.slot == 3, "one origin ahead dragged the old replica three slots"
    while paced.slot < fast.slot:  # the paced replica gets there at the run's pace
        paced.close_slot()
    assert paced.params_digest() == fast.params_digest() and paced.ledger_digest() == fast.ledger_digest()

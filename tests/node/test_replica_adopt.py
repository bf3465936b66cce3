"""Tier (b), no network: `Replica.adopt_pending` adopts a heavier forked state, and drops a proposal that
went stale (this replica changed and is no lighter now, or the caller knows the origin moved on), so an
adoption always moves a replica to a heavier state whatever the age of the snapshot it came from."""

from __future__ import annotations

import hashlib

import numpy as np
import trio

from node.outer.replica import Proposal, Replica
from protocol.ledger import Ledger, LedgerConfig, UpdateMeta, reconcile

SHAPES = {"emb": (3,), "w": (2, 2)}


def genesis() -> Ledger:
    return Ledger({k: np.ones(s, np.float32) for k, s in SHAPES.items()}, LedgerConfig(window=2))


def update(tag: str, base: int, publish: int, tokens: int = 100):
    rng = np.random.default_rng(int.from_bytes(hashlib.sha256(tag.encode()).digest()[:4], "big"))
    meta = UpdateMeta(hashlib.sha256(tag.encode()).digest(), tag, base, publish, tokens, 4)
    return meta, {k: rng.standard_normal(s).astype(np.float32) for k, s in SHAPES.items()}


def train(led: Ledger, side: str, slots: int, per_slot: int) -> None:
    for _ in range(slots):
        for i in range(per_slot):
            led.add(*update(f"{side}{i}@{led.slot}", led.slot, led.slot))
        led.close_slot()


def forked(light_slots: int = 5) -> tuple[Ledger, Ledger]:
    """(heavy, light): two nodes apart for longer than the window of 2, against one."""
    heavy, light = genesis(), genesis()
    train(heavy, "h", 5, 2)
    train(light, "l", light_slots, 1)
    return heavy, light


def proposal_of(led: Ledger, origin: str = "heavy") -> Proposal:
    copy = Ledger.from_snapshot(led.snapshot(), led.config)
    return Proposal.of(copy, origin, "test", copy.view(), {})


async def test_a_heavier_forked_state_is_adopted_and_the_agreement_hashes_then_match() -> None:
    heavy, light = forked()
    replica = Replica(light, light.seen_ids())
    assert reconcile(light.view(), heavy.view()).adopt
    proposal = proposal_of(heavy)
    replica.propose(proposal)
    adopted = await replica.adopt_pending(lambda p: True)
    assert adopted is not None and adopted.origin == "heavy" and replica.pending is None
    assert replica.outcomes["fork-adopted"] == 1 and replica.outcomes["orphaned"] >= 1
    assert proposal.agreement != replica.agreement_hex()  # the light side's leftovers are now seen here too
    assert Replica(heavy, heavy.seen_ids()).agreement_hex() == proposal.agreement


async def test_a_proposal_whose_origin_moved_on_is_dropped() -> None:
    heavy, light = forked()
    replica = Replica(light, light.seen_ids())
    replica.propose(proposal_of(heavy))
    before = replica.agreement_hex()
    assert await replica.adopt_pending(lambda p: False) is None
    assert replica.pending is None and replica.agreement_hex() == before and not replica.outcomes["fork-adopted"]


async def test_a_proposal_is_dropped_when_this_replica_became_heavier_since_the_comparison() -> None:
    heavy, light = forked()
    replica = Replica(light, light.seen_ids())
    replica.propose(proposal_of(heavy))  # decided while light was lighter
    # Then updates of a third node arrive for slot 2, past both windows: light applies them stale (the
    # heavy state can never take them), and now outweighs the proposal.
    for i in range(3):
        meta, deltas = update(f"late{i}", 1, 1, tokens=1000)
        await replica.add(meta, deltas)
    assert replica.outcomes["applied-stale"] == 3
    before = replica.agreement_hex()
    with trio.fail_after(10):
        assert await replica.adopt_pending() is None
    assert replica.agreement_hex() == before and not replica.outcomes["fork-adopted"]

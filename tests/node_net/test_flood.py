"""Tier (b): a peer that floods each slot with validly signed updates (`--misbehave flood`: 6 more per round,
each a random direction) among two honest nodes, three node runtimes in one trio process. Each honest node
keeps at most K + 1 of the flooder's updates per slot (`max_updates_per_origin`, `protocol.ledger.bound`),
counts none of them where it sent more than K, deletes the payload blobs of the rest, and all three stop
with equal digests."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
import trio

from node.chaos import Misbehave
from node.outer.outer_files import payload_blob
from node.runtime import NodeRuntime
from node.settings import NodeSettings
from protocol.ledger.bound import counting_ids
from waiting import wait_for

SMALL = ("seq_len=32", "d_model=32", "n_heads=2", "d_ff=64", "batch_size=8", "lr=1e-2", "warmup_steps=5")
ROUNDS = 4


def settings(tmp: Path, name: str, peers: tuple[str, ...] = (), **extra) -> NodeSettings:
    return NodeSettings(run_id="flood", key_path=tmp / name / "key", checkpoint_dir=tmp / name / "ckpt",
                        peers=peers, overrides=SMALL, inner_steps=5, max_rounds=ROUNDS, eval_every=0,
                        heartbeat_s=0.2, drain_timeout_s=30.0, **extra)


@pytest.mark.slow
async def test_a_flooding_peer_counts_for_nothing_and_leaves_a_few_payloads_per_slot(tmp_path: Path,
                                                                                      jax_persistent_cache) -> None:
    with trio.fail_after(150):
        async with trio.open_nursery() as nursery:
            a = NodeRuntime(settings(tmp_path, "a"))
            await nursery.start(a.run)
            peers = (a.host.gossip_addr,)
            b = NodeRuntime(settings(tmp_path, "b", peers))
            f = NodeRuntime(settings(tmp_path, "f", peers, misbehave="flood"))
            for node in (b, f):
                await nursery.start(node.run)
            await wait_for(lambda: all(n.result is not None for n in (a, b, f)), 140, "the three nodes done")
    results = {node.peer_id: node.result for node in (a, b, f)}
    assert all(r.reason == "max-rounds reached" for r in results.values()), results
    assert len({r.line() for r in results.values()}) == 1, results  # equal digests, the flooder's too

    flooded = set(f.rounds.chaos.misbehave.flooded)
    assert len(flooded) == f.stats.round * Misbehave.FLOOD and f.stats.round >= 1
    limit = a.ledger_config.max_updates_per_origin
    for honest in (a, b):
        outcomes = honest.replica.outcomes
        assert outcomes["dropped-surplus"] + outcomes["evicted"] >= 1, outcomes
        snap, _, _ = await honest.replica.snapshot()
        per_slot = Counter(e.slot for e in snap.entries if e.meta.origin == f.peer_id)
        assert per_slot and max(per_slot.values()) <= limit + 1, per_slot
        for slot, count in per_slot.items():  # past the limit the flooder counts for nothing in the slot
            entries = [e for e in snap.entries if e.slot == slot]
            counting = counting_ids(((e.meta.origin, e.meta.update_id) for e in entries), limit)  # the origin rule
            kept_origins = {e.meta.origin for e in entries if e.meta.update_id in counting}
            assert (f.peer_id in kept_origins) == (count <= limit), (slot, count)
        honest.upkeep.collect_garbage()  # the last round's surplus, as between rounds
        held = {payload_blob(e.payload) for e in snap.entries if e.payload is not None}
        on_disk = {blob for blob in flooded if honest.host.store.has(blob)}
        assert on_disk <= held, f"{len(on_disk - held)} payloads of left-out updates still on disk"

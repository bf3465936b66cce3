"""Tier (b): a partition longer than the ledger window, then healed, with three real node runtimes in one
trio process. Node `a` (an island three times slower: `slowdown`) is cut off from `b` and `c`
(`Host.block`, what `POST /chaos` does) until both sides have finalized slots the other never saw and the
`b`+`c` side has clearly done more work apart. After the heal the sides find their histories forked, both
pick the heavier one, the lighter side adopts it (usually `a`), and all three stop with equal ledger and
parameter digests, every one of them having seen both sides' work apart: carried into the heavier history,
folded in with its staleness, or orphaned (seen, not applied, counted), as timing has it.

With a window of 2 and rounds of milliseconds, gossip also often delivers an update after its slot left a
receiver's window (applied stale: a small fork of its own, reconciled the same way), so this is also the
stress test of the fork choice converging under churn. Every wait is on a condition, bounded."""

from __future__ import annotations

from pathlib import Path

import pytest
import trio

from node.runtime import NodeRuntime
from node.settings import NodeSettings
from waiting import wait_for

SMALL = ("seq_len=32", "d_model=32", "n_heads=2", "d_ff=64", "batch_size=8", "lr=1e-2", "warmup_steps=5")
WINDOW = 2


def settings(tmp: Path, name: str, peers: tuple[str, ...] = (), slowdown: float = 1.0,
             max_rounds: int = 48) -> NodeSettings:
    # Heartbeats of 0.4 s: with 0.2 s, a process starved by other jobs on 2 cores missed 5 of them and the
    # nodes took each other for gone (a drain then ends "alone"). Four held-out batches (the node's default)
    # for the vet of the heavier side's state: with one (256 bytes), an honest side once evaluated 13% worse
    # than the lighter one, past the 10% tolerance, and the sides stayed forked. Even with four, this test's
    # model (lr 1e-2, rounds of milliseconds, outer steps through the churn's small forks) left honest heavier
    # states 15% and 30% worse than the lighter side's (5.37 and 6.12 against 4.69 bits per byte, the suite on
    # two workers), so the vet's tolerance here is 50%: this test is about the fork choice converging, and a
    # forger's garbage, which the vet is for, evaluates tens of times worse (263 against 3.9 bits per byte in
    # BENCHMARKS.md's forge bench; tests/node_net/test_forged_state.py).
    return NodeSettings(run_id="fork", key_path=tmp / name / "key", peers=peers, overrides=SMALL, inner_steps=2,
                        max_rounds=max_rounds, eval_every=0, eval_batches=4, heartbeat_s=0.4, drain_timeout_s=30.0,
                        window=WINDOW, slowdown=slowdown, fork_tolerance=0.5)


@pytest.mark.slow
async def test_sides_of_a_partition_longer_than_the_window_converge_after_it_heals(tmp_path: Path,
                                                                                   jax_persistent_cache) -> None:
    with trio.fail_after(90):
        async with trio.open_nursery() as nursery:
            # `a` trains alone while `b` and `c` sync from it (a second or more on a busy machine: tens of its
            # rounds); the run ends at slot 48: it must still be training when the partition heals.
            a = NodeRuntime(settings(tmp_path, "a", slowdown=3.0))
            await nursery.start(a.run)
            b = NodeRuntime(settings(tmp_path, "b", (a.host.gossip_addr,)))
            c = NodeRuntime(settings(tmp_path, "c", (a.host.gossip_addr,)))
            for node in (b, c):
                await nursery.start(node.run)
            nodes = (a, b, c)
            await wait_for(lambda: all(len(n.host.connected_peers()) == 2 and n.stats.round >= 1 for n in nodes), 60,
                           "three connected nodes training")
            a.host.block([b.peer_id, c.peer_id], 3600)
            for node in (b, c):
                node.host.block([a.peer_id], 3600)
            cut = max(n.replica.slot for n in nodes)
            published = {n.peer_id: n.stats.updates_published for n in nodes}

            def apart(n: NodeRuntime) -> int:
                return n.stats.updates_published - published[n.peer_id]

            # Both sides finalize slots apart (past cut + window, neither can fold the other's updates in),
            # and b and c together do more work apart than a: theirs is the heavier history.
            await wait_for(lambda: min(n.replica.base_slot for n in nodes) > cut + 1
                           and apart(b) + apart(c) >= apart(a) + 2, 60, "both sides past the window")
            assert max(n.replica.slot for n in nodes) < a.settings.max_rounds, "a partition that outlasted the run"
            # each side's work apart that is still in its window: the other side has never seen it
            a_apart = [m.update_id for m in await a.replica.updates_of(a.peer_id)
                       if not b.replica.has_seen(m.update_id) and not c.replica.has_seen(m.update_id)]
            bc_apart = [m.update_id for n in (b, c) for m in await n.replica.updates_of(n.peer_id)
                        if not a.replica.has_seen(m.update_id)]
            assert a_apart and bc_apart, "both sides have work apart in their windows"
            a.host.block([b.peer_id, c.peer_id], 0.01)  # heal: the blocks end now
            for node in (b, c):
                node.host.block([a.peer_id], 0.01)
    results = {n.peer_id: n.result for n in nodes}
    assert all(r is not None and r.reason == "max-rounds reached" for r in results.values()), results
    assert len({r.line() for r in results.values()}) == 1, results
    # A forked state was adopted somewhere. Usually by `a`, but with a window of 2 the churn's small forks go
    # on after the heal, and `a` can end on the heavy history through them: `b` or `c` adopting a merge
    # that `a` then pulls as compatible (seen in 2 of 7 full-suite runs, and on the code before too).
    adopted = {n.peer_id: n.replica.outcomes["fork-adopted"] for n in nodes}
    assert sum(adopted.values()) >= 1, adopted
    # Neither side's work apart is lost from sight: every replica has seen all of it, applied (at its slot,
    # or at an open one with its staleness) or orphaned; which of these is timing, and the digests above
    # say the replicas agree on it.
    missing = {n.peer_id: sum(not n.replica.has_seen(i) for i in a_apart + bc_apart) for n in nodes}
    assert not any(missing.values()), f"updates of the partition some replica never saw: {missing}"

"""Tier (b): the round in flight survives its process (`node.outer.inflight`). Two node runtimes in one trio
process, on loopback, with the real ledger, inner loop and p2p host. While node b trains a long round its
journal appears in its checkpoint directory with the steps done so far; b is stopped in the middle of a
round (the stop journals the round's last state); a new runtime of b on the same directory publishes that
round after its start, as a late update of b with the steps and tokens it really trained, from the base it
followed; node a applies it; the journal is gone. (The same after a SIGKILL, on real processes:
`test_restart_learning`.)"""

from __future__ import annotations

from pathlib import Path

import trio

from node.outer.inflight import InflightJournal
from node.runtime import NodeRuntime
from node.settings import NodeSettings
from test_inprocess import SMALL, compile_once
from waiting import wait_for

H = 40


def settings(tmp: Path, name: str, peers: tuple[str, ...] = (), **extra) -> NodeSettings:
    return NodeSettings(run_id="inflight", key_path=tmp / name / "key", checkpoint_dir=tmp / name / "ckpt",
                        peers=peers, overrides=SMALL, inner_steps=H, eval_every=0, heartbeat_s=0.2,
                        inflight_every_s=0.2, adaptive_steps=False, drain_timeout_s=30.0,
                        window=32,  # the founder may run many slots ahead while b restarts on a loaded machine
                        **extra)


async def test_a_round_stopped_mid_way_is_published_by_the_next_start(tmp_path: Path, jax_persistent_cache) -> None:
    await trio.to_thread.run_sync(compile_once, settings(tmp_path, "warm-up"))
    with trio.fail_after(150):
        async with trio.open_nursery() as nursery:
            a = NodeRuntime(settings(tmp_path, "a", slowdown=4.0))
            await nursery.start(a.run)
            peers = (a.host.gossip_addr,)
            b = NodeRuntime(settings(tmp_path, "b", peers, slowdown=10.0))  # long rounds: stopped in one
            await nursery.start(b.run)
            journal = InflightJournal(tmp_path / "b" / "ckpt", every_s=1.0)

            def journaled() -> bool:  # b's round in progress is on disk
                j = journal.load(run_id="inflight", peer_id=b.peer_id, shapes=b.shapes) if journal.path.exists() else None
                return j is not None and j.round == b.stats.round + 1 and 5 <= j.steps < H

            await wait_for(lambda: b.stats.round >= 1 and journaled(), 120, "b's second round journaled", interval=0.05)
            b.request_stop("test: stop in the middle of a round")
            await wait_for(lambda: b.result is not None, 60, "b stopped")
            stopped = journal.load(run_id="inflight", peer_id=b.peer_id, shapes=b.shapes)
            assert stopped is not None and stopped.round == b.stats.round + 1 and 5 <= stopped.steps < H
            published_before = b.stats.updates_published

            again = NodeRuntime(settings(tmp_path, "b", peers, slowdown=10.0))
            await nursery.start(again.run)
            await wait_for(lambda: again.stats.recovered_rounds == 1, 60, "the round recovered")
            assert again.stats.updates_published == published_before + 1
            assert again.stats.recovered_step_seconds == stopped.seconds
            ours = []

            async def a_applied() -> bool:
                nonlocal ours
                ours = [m for m in await a.replica.updates_of(b.peer_id) if m.inner_steps == stopped.steps]
                return bool(ours)

            with trio.fail_after(30):
                while not await a_applied():
                    await a.replica.changed()
            (meta,) = ours
            assert meta.base_slot == stopped.base_slot and meta.tokens == stopped.tokens
            assert again.loop.batches.position >= stopped.data_position, "its batches are not trained again"
            for node in (a, again):
                node.request_stop("test done")

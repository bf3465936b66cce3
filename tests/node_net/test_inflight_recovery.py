"""Tier (b): the round in flight outlives its process. Two node runtimes in one trio process, on loopback, with
the real ledger, inner loop and p2p host; node b trains long rounds.

- A crash (`node.outer.inflight`): while b trains a round its journal appears in its checkpoint directory
  with the steps done so far; b vanishes in the middle of that round (its host aborted without a goodbye and
  its tasks cancelled, nothing published; the checkpoint directory is left as a kill leaves it, the journal
  as it was at that moment); a new runtime of b on the same directory publishes that round after its start,
  as a late update of b with the steps and tokens it really trained, from the base it followed; node a
  applies it; the journal is gone. (The same after a SIGKILL, on real processes: `test_restart_learning`.)
- A graceful stop (`Rounds.run_round`, `NodeRuntime._hand_over`): b is stopped in the middle of a round that
  has the steps an update needs; b publishes the round as it stands before it leaves, hands its payload to a
  (a fetched it from b), a applies it, no journal is left for a next start to publish twice, and its last
  `/status` object is in its checkpoint directory (`node.status.write_last_status`)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
from pathlib import Path

import pytest
import trio

from node.outer.inflight import InflightJournal
from node.runtime import NodeRuntime
from node.settings import NodeSettings
from node.status import LAST_STATUS
from test_inprocess import SMALL, compile_once
from waiting import wait_for

H = 40


def settings(tmp: Path, name: str, peers: tuple[str, ...] = (), heartbeat_s: float = 0.2, **extra) -> NodeSettings:
    return NodeSettings(run_id="inflight", key_path=tmp / name / "key", checkpoint_dir=tmp / name / "ckpt",
                        peers=peers, overrides=SMALL, inner_steps=H, eval_every=0, heartbeat_s=heartbeat_s,
                        inflight_every_s=0.2, adaptive_steps=False, drain_timeout_s=30.0,
                        window=32,  # the founder may run many slots ahead while b restarts on a loaded machine
                        **extra)


def _journal_of(tmp_path: Path, b: NodeRuntime) -> tuple[InflightJournal, object]:
    """b's journal, and a predicate: b's round in progress is on disk, with 5..H-1 steps."""
    journal = InflightJournal(tmp_path / "b" / "ckpt", every_s=1.0)

    def journaled() -> bool:
        j = journal.load(run_id="inflight", peer_id=b.peer_id, shapes=b.shapes) if journal.path.exists() else None
        return j is not None and j.round == b.stats.round + 1 and 5 <= j.steps < H

    return journal, journaled


async def _applied_by(a: NodeRuntime, origin: str, steps: int) -> list:
    """Wait until `a` holds an update of `origin` with `steps` inner steps; those updates."""
    with trio.fail_after(30):
        while not (ours := [m for m in await a.replica.updates_of(origin) if m.inner_steps == steps]):
            await a.replica.changed()
    return ours


async def _crash_in_a_round(tmp_path: Path, peers: tuple[str, ...]):
    """Start b, let it crash in the middle of its second round; (b's peer id, its journal, the round it holds)."""
    b = NodeRuntime(settings(tmp_path, "b", peers, slowdown=10.0))  # long rounds: crashed in one
    journal, journaled = _journal_of(tmp_path, b)
    async with trio.open_nursery() as b_scope:
        await b_scope.start(b.run)
        await wait_for(lambda: b.stats.round >= 1 and journaled(), 120, "b's second round journaled", interval=0.05)
        at_crash = journal.path.read_bytes()  # what a kill at this moment leaves on disk
        published_before = b.stats.updates_published
        b.host.abort()  # gone without a goodbye; its round's thread ends, its result is dropped
        b_scope.cancel_scope.cancel()
    assert b.stats.updates_published == published_before, "a crashed process publishes nothing more"
    journal.path.write_bytes(at_crash)  # the round's own end may have removed it: the kill came first
    crashed = journal.load(run_id="inflight", peer_id=b.peer_id, shapes=b.shapes)
    assert crashed is not None and crashed.round == b.stats.round + 1 and 5 <= crashed.steps < H
    return b.peer_id, journal, crashed


@contextlib.asynccontextmanager
async def _b_crashed_beside_a(tmp_path: Path, timeout_s: float):
    """Node a training, and b crashed in a round: (a nursery, a, b's peer id, b's journal, the round it holds)."""
    await trio.to_thread.run_sync(compile_once, settings(tmp_path, "warm-up"))
    with trio.fail_after(timeout_s):
        async with trio.open_nursery() as nursery:
            a = NodeRuntime(settings(tmp_path, "a", slowdown=4.0))
            await nursery.start(a.run)
            yield nursery, a, *await _crash_in_a_round(tmp_path, (a.host.gossip_addr,))


@pytest.mark.slow
async def test_a_round_in_flight_at_a_crash_is_published_by_the_next_start(tmp_path: Path,
                                                                           jax_persistent_cache) -> None:
    async with _b_crashed_beside_a(tmp_path, 150) as (nursery, a, b_id, journal, crashed):
        again = NodeRuntime(settings(tmp_path, "b", (a.host.gossip_addr,), slowdown=10.0))
        await nursery.start(again.run)
        await wait_for(lambda: again.stats.recovered_rounds == 1, 60, "the round recovered")
        assert again.stats.recovered_step_seconds == crashed.seconds
        assert not journal.path.exists(), "published once: the journal is gone"
        (meta,) = await _applied_by(a, b_id, crashed.steps)
        assert meta.base_slot == crashed.base_slot and meta.tokens == crashed.tokens
        assert again.loop.batches.position >= crashed.data_position, "its batches are not trained again"
        for node in (a, again):
            node.request_stop("test done")


@pytest.mark.slow
async def test_a_round_whose_base_slot_the_new_process_has_not_closed_waits_for_it(tmp_path: Path, caplog,
                                                                                    jax_persistent_cache) -> None:
    """The killed process closed the round's base slot after its last checkpoint, and the run had not closed it
    yet (seen in test_restart_learning: the round was dropped as "ahead of this replica's slot"): the new
    process trains, and publishes the round once its replica has closed that slot."""
    async with _b_crashed_beside_a(tmp_path, 200) as (nursery, a, b_id, journal, crashed):
        # a slot no replica has closed yet, and a won't before b's new process has started
        ahead = dataclasses.replace(crashed, base_slot=a.replica.slot + 4)
        assert journal.write(ahead)
        caplog.set_level(logging.INFO, logger="node.outer.rounds")
        again = NodeRuntime(settings(tmp_path, "b", (a.host.gossip_addr,), slowdown=10.0))
        await nursery.start(again.run)
        await wait_for(lambda: again.stats.recovered_rounds == 1, 120, "the round recovered")
        assert f"waits for this replica to close its base slot {ahead.base_slot}" in caplog.text, "it waited"
        assert again.replica.slot >= ahead.base_slot and again.stats.updates_published > 1, "after rounds of its own"
        (meta,) = await _applied_by(a, b_id, crashed.steps)
        assert meta.base_slot == ahead.base_slot and meta.tokens == crashed.tokens
        assert not journal.path.exists()
        for node in (a, again):
            node.request_stop("test done")


@pytest.mark.slow
async def test_a_graceful_stop_publishes_the_round_in_flight_and_hands_it_to_the_peers(
        tmp_path: Path, jax_persistent_cache) -> None:
    await trio.to_thread.run_sync(compile_once, settings(tmp_path, "warm-up"))
    with trio.fail_after(150):
        async with trio.open_nursery() as nursery:
            a = NodeRuntime(settings(tmp_path, "a", heartbeat_s=0.5, slowdown=4.0))
            await nursery.start(a.run)
            b = NodeRuntime(settings(tmp_path, "b", (a.host.gossip_addr,), heartbeat_s=0.5, slowdown=10.0))
            journal, journaled = _journal_of(tmp_path, b)
            await nursery.start(b.run)
            await wait_for(lambda: b.stats.round >= 1 and journaled(), 120, "b in the middle of a round",
                           interval=0.05)
            published_before, steps_before = b.stats.updates_published, b.stats.inner_steps
            b.request_stop("test: stop in the middle of a round")
            await wait_for(lambda: b.result is not None, 60, "b stopped")
            assert b.stats.updates_published == published_before + 1, "the round cut short was published"
            cut_short = b.stats.inner_steps - steps_before
            assert 5 <= cut_short < H, f"{cut_short} steps: the round as it stood, not a whole one"
            blob = b.rounds.published_at_stop
            assert blob is not None and a.peer_id in b.host.blobs.served_to(blob), "handed over before leaving"
            assert not journal.path.exists(), "nothing left for a next start to publish twice"
            assert len(await _applied_by(a, b.peer_id, cut_short)) == 1
            last = json.loads((tmp_path / "b" / "ckpt" / LAST_STATUS).read_text())  # readable after its server is gone
            assert last["state"] == "stopped" and last["inner_steps"] == b.stats.inner_steps
            assert last["contributed_step_seconds"] == b.stats.contributed_step_seconds
            a.request_stop("test done")

"""Tier (a)/(b): what a node does between rounds (`node.outer.upkeep`) — evaluations within their time
budget, checkpoints by rounds and elapsed time, written in the background and always landing in order, the
blob clean-up — and the parts of a round (`node.outer.rounds`) that need no network: the peers' round clock
and the recovery of a round in flight. With a small numpy ledger and a fake inner loop (no JAX, no
network)."""

from __future__ import annotations

import logging
import time
import types
from pathlib import Path

import numpy as np
import pytest
import trio
import trio.testing

from node.checkpoint import CheckpointDir
from node.outer.inflight import InflightRound
from node.outer.replica import Replica
from node.outer.peerclock import PeerRoundClock
from node.outer.parts import NodeParts
from node.outer.rounds import Rounds
from node.outer.upkeep import BetweenRounds, HeldBlobs
from node.settings import NodeSettings
from node.status import NodeStats
from p2p.blobstore import BlobStore
from protocol.compression import ErrorFeedback
from protocol.ledger import ClosePolicyConfig, Ledger, LedgerConfig, SlotClosePolicy, UpdateMeta
from protocol.ledger.proof import UpdateProof

SHAPES = {"b": (3,), "w": (4, 4)}


class FakeLoop:
    """The parts of `InnerLoop` a checkpoint and an evaluation use; `evaluate` returns a fixed loss."""

    def __init__(self) -> None:
        self.step = 0
        self.model = types.SimpleNamespace(metric="bits/byte")  # what the evaluation's log line names

    def state_dict(self) -> dict[str, np.ndarray]:
        return {"step": np.asarray(self.step, np.int64)}

    def evaluate(self, batches, params=None) -> float:
        return 1.5


def _parts(tmp: Path, settings: dict) -> NodeParts:
    """What `Rounds` and `BetweenRounds` share, as the runtime hands it to both."""
    settings.setdefault("window", 4)
    s = NodeSettings(run_id="r", key_path=tmp / "key", checkpoint_dir=tmp / "ckpt", **settings)
    ledger = Ledger({n: np.ones(sh, np.float32) for n, sh in SHAPES.items()}, LedgerConfig(window=s.window))
    checkpoints = CheckpointDir(tmp / "ckpt", keep=10, expect={"run_id": "r", "peer_id": "p"})
    # the parts of the host a checkpoint uses: its blob store (the window's payloads stay there) and config
    store = BlobStore(tmp / "blobs")
    host = types.SimpleNamespace(store=store, config=types.SimpleNamespace(run_config=""), remove_blob=store.remove)
    return NodeParts(s, host, Replica(ledger), FakeLoop(), ErrorFeedback("int4"), NodeStats("p"),
                     SlotClosePolicy(ClosePolicyConfig()), SHAPES, HeldBlobs(), checkpoints)


def make_rounds(tmp: Path, **settings) -> Rounds:
    return Rounds(_parts(tmp, settings), stop_requested=lambda: False, wait_change=None)


def make_upkeep(tmp: Path, **settings) -> BetweenRounds:
    return BetweenRounds(_parts(tmp, settings))


async def test_the_clean_up_spares_the_payloads_the_newest_checkpoint_refers_to(tmp_path: Path) -> None:
    """Payload blobs more than two windows below the slot go, except those a checkpoint refers to (a restart
    from it needs them: node.outer.resume); once a newer checkpoint no longer refers to them, they go too."""
    upkeep = make_upkeep(tmp_path)
    for _ in range(12):  # slot 12, window 4: blobs of slots <= 4 are due for the clean-up
        await upkeep.replica.close_open()
    store, blobs = upkeep.host.store, upkeep.blobs
    old, pinned, recent = (store.put(f"payload {i}".encode()) for i in range(3))
    blobs.hold_all([(2, old), (3, pinned)])
    blobs.hold(10, recent)
    blobs.pinned = frozenset({pinned})
    upkeep.collect_garbage()
    assert not store.has(old) and store.has(pinned) and store.has(recent)
    blobs.pinned = frozenset()  # a newer checkpoint was written
    upkeep.collect_garbage()
    assert not store.has(pinned) and store.has(recent) and blobs.held == [(10, recent)]


async def test_a_checkpoint_keeps_its_payload_blobs_until_a_newer_one_replaces_it(tmp_path: Path) -> None:
    """Whoever removes a blob the newest checkpoint refers to (a failed state download that had fetched it),
    its file stays until a newer checkpoint no longer needs it, so a restart never finds it missing."""
    upkeep = make_upkeep(tmp_path)
    meta = UpdateMeta(update_id=b"\x01" * 32, origin="q", base_slot=0, publish_slot=0, tokens=64, inner_steps=1)
    await upkeep.replica.add(meta, {n: np.full(sh, 0.01, np.float32) for n, sh in SHAPES.items()})
    upkeep.stats.round = 1
    await upkeep.checkpoint()
    (blob,) = upkeep.blobs.pinned  # the entry's fp32 deltas, put into the store
    store = upkeep.host.store
    store.remove(blob)
    assert not store.has(blob) and (store.directory / blob).exists()
    for _ in range(6):  # the entry leaves the window of 4
        await upkeep.replica.close_open()
    upkeep.stats.round = 2
    await upkeep.checkpoint()
    assert upkeep.blobs.pinned == frozenset() and not (store.directory / blob).exists()


def test_evaluations_are_due_every_n_rounds_within_their_share_of_the_time(tmp_path: Path) -> None:
    upkeep = make_upkeep(tmp_path, eval_every=2, eval_budget=0.02)
    stats = upkeep.stats
    stats.started_at = time.time() - 100.0  # 100 s of wall time: a budget of 2 s
    stats.round = 1
    assert not upkeep.evaluation_due(), "every 2 rounds"
    stats.round = 2
    assert upkeep.evaluation_due()
    stats.time_s["evaluate"] = 2.5  # over the budget: postponed ...
    stats.round = 4
    assert not upkeep.evaluation_due()
    stats.started_at -= 100.0  # ... until the share is below 2% again, even between multiples of 2
    stats.round = 5
    assert upkeep.evaluation_due()
    assert not make_upkeep(tmp_path / "never", eval_every=0).evaluation_due()


async def test_evaluate_records_the_point_and_its_time(tmp_path: Path) -> None:
    upkeep = make_upkeep(tmp_path, eval_every=1, eval_budget=1.0)
    upkeep.stats.round = 3
    assert await upkeep.evaluate() == 1.5
    assert upkeep.stats.eval_history[-1][2] == 1.5 and upkeep.stats.time_s["evaluate"] > 0
    assert not upkeep.evaluation_due(), "evaluated at this round already"


def test_checkpoints_follow_rounds_and_seconds_and_land_in_order(tmp_path: Path) -> None:
    clock = trio.testing.MockClock()
    upkeep = make_upkeep(tmp_path, checkpoint_every=2, checkpoint_interval_s=30.0)
    stats, directory = upkeep.stats, upkeep.checkpoints

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            stats.round = 1
            assert upkeep.checkpoint_due(), "the first one right after the first round"
            await upkeep.checkpoint(background=nursery)
            await trio.testing.wait_all_tasks_blocked()  # the write task holds the lock now ...
            async with upkeep._write_lock:  # ... until its file is written
                pass
            assert [p.name for p in directory.paths()] == ["ckpt-00000001.dlc"]
            stats.round = 3
            assert not upkeep.checkpoint_due(), "2 rounds but not 30 s"
            clock.jump(31.0)
            stats.round = 2
            assert not upkeep.checkpoint_due(), "30 s but not 2 rounds"
            stats.round = 3
            assert upkeep.checkpoint_due()
            await upkeep.checkpoint(background=nursery)  # in flight ...
            stats.round = 4
            await upkeep.checkpoint()  # ... the final one waits for it and lands last
            assert not upkeep._writing
        assert [p.name for p in directory.paths()] == ["ckpt-00000004.dlc", "ckpt-00000003.dlc", "ckpt-00000001.dlc"]
        newest = directory.latest()
        assert newest.round == 4 and newest.meta["slot"] == 0 and int(newest.inner["step"]) == 0
        assert stats.time_s["checkpoint"] > 0

    trio.run(main, clock=clock)


def test_peers_due_are_those_whose_next_update_may_land_before_the_deadline() -> None:
    clock = PeerRoundClock()
    assert clock.due(0.0, 1.0) == 0, "no peer known: nothing to wait for"
    clock.observe("new", 0.0)
    assert clock.due(1.0, 2.0) == 1, "seen once, round time unknown: may come"
    for t in (0.0, 10.0, 20.0):
        clock.observe("a", t)  # next expected at 30
        clock.observe("b", t + 5.0)  # next expected at 35
    assert clock.due(29.0, 30.5) == 1, "a is due, b is not yet"
    assert clock.due(29.0, 36.0) == 2
    assert clock.due(44.0, 45.0) == 0, "both overdue by more than half a round: late or gone"
    assert clock.due(24.0, 26.0) == 0, "'new' was seen too long ago (more than two typical rounds)"


def _inflight(rounds: Rounds, **changes) -> InflightRound:
    fields = dict(run_id="r", peer_id="p", round=rounds.stats.round + 1, base_slot=rounds.replica.slot, steps=30,
                  tokens=30 * 64, seconds=3.0, mean_loss=2.0, data_position=90, started_at=990.0,
                  delta={n: np.full(sh, 0.01, np.float32) for n, sh in SHAPES.items()})
    fields.update(changes)
    return InflightRound(**fields)


async def _own_update(rounds: Rounds, base_slot: int, published_at: float) -> None:
    """Put an update of this node ('p') into its ledger, with its proof (seqno: the publication time in
    microseconds), as a previous process of it published one."""
    update_id = int(published_at).to_bytes(32, "big")
    meta = UpdateMeta(update_id=update_id, origin="p", base_slot=base_slot, publish_slot=rounds.replica.slot,
                      tokens=64, inner_steps=1)
    await rounds.replica.add(meta, {n: np.zeros(sh, np.float32) for n, sh in SHAPES.items()})
    rounds.replica.proofs[update_id] = UpdateProof(seqno=int(published_at * 1e6), signature=b"")


@pytest.mark.parametrize("case", ["too few steps", "left the window", "published since"])
async def test_a_round_in_flight_that_cannot_stand_as_an_update_is_dropped(tmp_path: Path, caplog, case) -> None:
    """`Rounds.recover` publishes nothing (no host is needed: it never reaches it) and removes the journal
    when the journaled round has fewer steps than a round's minimum (H/8), a base below the window, or when
    the run holds an update this node published after that round started (the journal came from a restored
    copy: published already). An update of this node published before the round started, from the same
    base (a round that trained through an open slot), is no such reason."""
    rounds = make_rounds(tmp_path, inner_steps=50)
    for _ in range(6):
        await rounds.replica.close_open()
    await _own_update(rounds, base_slot=6, published_at=980.0)  # the round before the journaled one
    if case == "published since":
        await _own_update(rounds, base_slot=6, published_at=1000.0)
    inflight = _inflight(rounds, **{"too few steps": {"steps": 6}, "left the window": {"base_slot": 1},
                                    "published since": {}}[case])
    rounds.journal.write(inflight)
    with caplog.at_level(logging.WARNING, logger="node.outer.rounds"):
        assert not await rounds.recover(inflight)
    expected = {"too few steps": "fewer than a round's minimum of 7", "left the window": "has left the window (bottom 2)",
                "published since": "1 update(s) this node published after that round started"}[case]
    assert expected in caplog.text, caplog.text
    assert not rounds.journal.path.exists() and rounds.stats.recovered_rounds == 0
    assert rounds.stats.updates_published == 0


async def test_a_round_in_flight_whose_base_is_ahead_waits_for_the_replica_and_is_dropped_once_out_of_the_window(
        tmp_path: Path, caplog) -> None:
    """A journaled round whose base slot the replica has not closed (the killed process closed it after its
    last checkpoint) is kept in memory, not published, and its journal removed (the new rounds journal to the
    same file); `recover_deferred` leaves it while the base is still ahead, and drops it with its reason if
    the replica jumped past the base's window before a round boundary saw it. (Its publication once the
    replica reaches the base: tests/node_net/test_inflight_recovery.py.)"""
    rounds = make_rounds(tmp_path, inner_steps=50)
    for _ in range(6):
        await rounds.replica.close_open()
    inflight = _inflight(rounds, base_slot=7)
    rounds.journal.write(inflight)
    with caplog.at_level(logging.INFO, logger="node.outer.rounds"):
        assert not await rounds.recover(inflight)
        assert rounds.deferred is inflight and not rounds.journal.path.exists()
        assert "waits for this replica to close its base slot 7 (now 6)" in caplog.text
        assert not await rounds.recover_deferred() and rounds.deferred is inflight, "slot 6: still ahead"
        for _ in range(6):  # slot 12, window 4: the base, 7, is below the window's bottom, 8
            await rounds.replica.close_open()
        assert not await rounds.recover_deferred() and rounds.deferred is None
    assert "has left the window (bottom 8)" in caplog.text, caplog.text
    assert rounds.stats.recovered_rounds == 0 and rounds.stats.updates_published == 0


def test_the_journal_is_on_only_with_a_checkpoint_directory_and_an_interval(tmp_path: Path) -> None:
    assert make_rounds(tmp_path).journal.path == tmp_path / "ckpt" / "inflight.dlc"
    assert make_rounds(tmp_path / "off", inflight_every_s=0.0).journal is None

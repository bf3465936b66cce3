"""What a node does between rounds (the runtime calls it after each `Rounds.run_round`): held-out evaluation
within its share of the time, checkpoints, and the clean-up of payload blobs.

- `evaluate` when `evaluation_due`: every `--eval-every` rounds, postponed while the evaluations of this
  process took more than `--eval-budget` of its wall time (logged once per postponement), but never for more
  than `MAX_POSTPONED` times `--eval-every` rounds: a node's held-out figure is never stale for the whole run.
- `vet` a forked state the fork choice would adopt (`Replica.adopt_pending`): its model on the held-out
  batches against ours, the same batches for both. Its weight (the tokens of its finalized slots) is its
  server's word, which no peer can check without the history; its parameters are checked against its
  manifest, which the same server signs. So one hostile key could claim a heavier history and replace every
  replica's model. A state whose held-out loss is above ``(1 + --fork-tolerance) ×`` the lower of ours now
  and our last evaluations is refused: the heavier side of an honest partition trained as much as ours or
  more, on the same data. `held_out_pair` is that comparison; the runtime vets a state it joins from with
  it too, against its own starting model (`node.sync.join`).
- `checkpoint` when `checkpoint_due` (`--checkpoint-every` rounds and `--checkpoint-interval` seconds): the
  state is taken at once, between rounds, so its parts agree; the file is written in a worker thread, in the
  background while the next round trains; one write at a time, so the final checkpoint lands last.
- `collect_garbage`: payload blobs (`HeldBlobs`) more than two windows below the slot are deleted, except
  those the newest checkpoint refers to (a restart from it reads them: `node.outer.resume`). Those are also
  kept in the blob store (`BlobStore.keep`), so no other remover (a failed state download) deletes them.

Threads: everything here runs on the trio thread, except the checkpoint writer, which replaces
`HeldBlobs.pinned` whole (a reader sees the old or the new set, never a mix).
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Iterable

import trio

from node.checkpoint import Checkpoint
from node.island.train import InnerLoop
from node.outer.parts import NodeParts
from node.outer.replica import Proposal, Replica
from node.outer.resume import encode_ledger_part
from node.settings import NodeSettings
from node.status import NodeStats
from node.sync.join import Choice
from protocol.ledger import Ledger
from protocol.ledger.proof import proofs_doc

__all__ = ["BetweenRounds", "HeldBlobs", "held_out_pair", "vet_synced_state"]

log = logging.getLogger("node.outer.upkeep")

DISK_LOG_EVERY_S = 60.0  # a full disk under the blobs is logged as an error at most this often
MAX_POSTPONED = 4  # an evaluation the budget postpones is taken anyway this many --eval-every rounds late


async def held_out_pair(loop: InnerLoop, heldout: list, stats: NodeStats, ours, theirs) -> tuple[float, float]:
    """The held-out losses of two sets of parameters on the same batches, in a worker thread (timed as
    `evaluate`)."""

    def both() -> tuple[float, float]:
        return loop.evaluate(heldout, params=ours), loop.evaluate(heldout, params=theirs)

    with stats.timed("evaluate"):
        return await trio.to_thread.run_sync(both)


async def vet_synced_state(settings: NodeSettings, loop: InnerLoop, heldout: list, stats: NodeStats,
                           replica: Replica, warm: trio.Event, choice: Choice, ledger: Ledger) -> bool:
    """Whether a state downloaded to join (`node.sync.join`) may be taken: its held-out loss no more than
    `--fork-tolerance` above the node's own starting model's (fresh, or its checkpoint's). A joiner has
    nothing better to compare with; a run's state, trained, is better than a fresh model, and garbage
    parameters are not. Refusals are counted (`state-refused`). Waits for `warm` (the evaluation step
    compiled, concurrently with the sync). Passes without held-out batches or with `--fork-tolerance inf`."""
    tolerance = settings.fork_tolerance
    if not heldout or math.isinf(tolerance):
        return True
    await warm.wait()
    ours_loss, theirs_loss = await held_out_pair(loop, heldout, stats, await replica.params(), ledger.params())
    ok = math.isfinite(theirs_loss) and theirs_loss <= ours_loss * (1.0 + tolerance)
    log.log(logging.INFO if ok else logging.WARNING,
            "the state of slot %d from %s: held-out %.4f %s against our starting model's %.4f: %s",
            choice.manifest.slot, ", ".join(choice.confirmed_by), theirs_loss, loop.model.metric, ours_loss,
            "taking it" if ok else f"more than {tolerance:.0%} worse, refused")
    if not ok:
        replica.outcomes["state-refused"] += 1
    return ok


class HeldBlobs:
    """The payload blobs this node holds (own updates, peers' updates, those a state download fetched), by
    target slot, for the clean-up; and those the newest checkpoint refers to (`pinned`), never cleaned up."""

    def __init__(self) -> None:
        self.held: list[tuple[int, str]] = []  # (target slot, blob)
        self.pinned: frozenset[str] = frozenset()

    def hold(self, slot: int, blob: str) -> None:
        self.held.append((slot, blob))

    def hold_all(self, blobs: Iterable[tuple[int, str]]) -> None:
        self.held.extend(blobs)

    def due(self, floor: int) -> list[str]:
        """Take the blobs of slots `<= floor` out (those the newest checkpoint pins stay); returns them."""
        keep, gone, pinned = [], [], self.pinned
        for slot, blob in self.held:
            (gone if slot <= floor and blob not in pinned else keep).append((slot, blob))
        self.held = keep
        return [blob for _, blob in gone]


class BetweenRounds:
    """Evaluation, checkpoints and blob clean-up between rounds (see the module docstring). trio thread."""

    def __init__(self, parts: NodeParts) -> None:
        self.settings, self.host, self.replica, self.loop = parts.settings, parts.host, parts.replica, parts.loop
        self.feedback, self.stats, self.heldout = parts.feedback, parts.stats, parts.heldout
        self.checkpoints, self.blobs = parts.checkpoints, parts.blobs
        self._eval_s = 0.0  # duration of the last evaluation
        self._eval_round = parts.stats.round  # round of the last evaluation (or of the start)
        self._postponed_at: int | None = None  # the round an evaluation was first postponed at (logged then)
        self._last_checkpoint: tuple[int, float] | None = None  # (round, trio time) of the last one taken
        self._write_lock = trio.Lock()
        self._writing = False  # a background checkpoint write is in flight
        self._disk_logged_at = -math.inf  # the last error logged about a full disk under the blobs

    # ---- evaluation -------------------------------------------------------------------------------
    def evaluation_due(self) -> bool:
        """After a round: `--eval-every` rounds after the last evaluation, postponed while the evaluations
        of this process took more than `--eval-budget` of its time (so that they cost at most that share)."""
        every = self.settings.eval_every
        since = self.stats.round - self._eval_round
        if not every or since < every:
            return False
        spent = self.stats.time_s["evaluate"]
        wall = time.time() - self.stats.started_at
        if spent + self._eval_s <= self.settings.eval_budget * wall or since >= MAX_POSTPONED * every:
            return True
        if self._postponed_at is None:
            self._postponed_at = self.stats.round
            log.info("held-out evaluation postponed at round %d: evaluations took %.1f s of this process's %.0f s, "
                     "over --eval-budget %.0f%% (taken anyway by round %d)", self.stats.round, spent, wall,
                     100 * self.settings.eval_budget, self._eval_round + MAX_POSTPONED * every)
        return False

    async def evaluate(self, what: str = "") -> float:
        """Held-out loss of the global parameters (the model's metric: bits per byte for the byte-level
        model); recorded in the stats with the slot it was taken at. `what` names it in the log line (the
        final model's, at the end of a run)."""
        started = time.perf_counter()
        with self.stats.timed("evaluate"):
            slot, params = await self.replica.params_at()
            bpb = await trio.to_thread.run_sync(functools.partial(self.loop.evaluate, self.heldout, params=params))
        self._eval_s, self._eval_round, self._postponed_at = time.perf_counter() - started, self.stats.round, None
        if math.isfinite(bpb):
            self.stats.eval_loss, self.stats.eval_slot = bpb, slot
            self.stats.eval_history.append([self.stats.tokens, time.time(), bpb])
        log.info("held-out %.4f %s at slot %d (round %d)%s", bpb, self.loop.model.metric, slot, self.stats.round,
                 f": {what}" if what else "")
        return bpb

    async def vet(self, proposal: Proposal) -> bool:
        """Whether the forked state `proposal` may replace ours (see the module docstring); logged either way.
        Without held-out batches, or with `--fork-tolerance inf`, every proposal passes."""
        tolerance = self.settings.fork_tolerance
        if not self.heldout or math.isinf(tolerance):
            return True
        ours = await self.replica.params()
        theirs = proposal.ledger.params()  # not shared: the proposal's ledger is this replica's only once adopted
        ours_loss, theirs_loss = await held_out_pair(self.loop, self.heldout, self.stats, ours, theirs)
        recent = [p[2] for p in self.stats.eval_history[-3:]]
        reference = min([ours_loss, *recent])
        ok = math.isfinite(theirs_loss) and theirs_loss <= reference * (1.0 + tolerance)
        log.log(logging.INFO if ok else logging.WARNING,
                "the forked state of %s: held-out %.4f %s against ours %.4f (recent best %.4f): %s",
                proposal.origin, theirs_loss, self.loop.model.metric, ours_loss, reference,
                f"within {tolerance:.0%}, adopting it" if ok else f"more than {tolerance:.0%} worse, refused")
        return ok

    # ---- checkpoints ------------------------------------------------------------------------------
    def checkpoint_due(self) -> bool:
        """After a round: `--checkpoint-every` rounds and `--checkpoint-interval` seconds after the last
        checkpoint of this process (the first one right after the first round)."""
        if self.checkpoints is None or self._last_checkpoint is None:
            return self.checkpoints is not None
        last_round, last_at = self._last_checkpoint
        return (self.stats.round - last_round >= self.settings.checkpoint_every
                and trio.current_time() - last_at >= self.settings.checkpoint_interval_s)

    async def checkpoint(self, background: trio.Nursery | None = None) -> None:
        """Write a checkpoint (no-op without a checkpoint directory); I/O errors are logged, not raised.

        The state (the ledger's snapshot, working state and bottom rows, inner loop state, error-feedback
        residual, counters) is taken here, between rounds, so the parts agree; encoding (the ledger part of
        `node.outer.resume`: the window's payloads stay in the blob store, pinned against the clean-up) and
        writing (fsync included) run in a worker thread.
        With `background`, that thread runs in a task of that nursery while the next round trains (skipped
        if the previous write is still running); without, it is awaited. One write at a time, so the last
        call (the final checkpoint) waits for a background write in flight and lands last.
        """
        if self.checkpoints is None or (background is not None and self._writing):
            return
        if self.host.store.spilled_bytes:  # its blobs are not all on disk: a restart could not load it
            self.stats.disk_errors["checkpoint"] = "postponed: blobs are held in memory until the disk has room"
            return
        with self.stats.timed("checkpoint"):
            snapshot, working, rows = await self.replica.checkpoint_state()
            proofs = dict(self.replica.proofs)
            meta = {"round": self.stats.round, "run_id": self.settings.run_id, "peer_id": self.stats.peer_id,
                    "slot": snapshot.slot, "updates_published": self.stats.updates_published,
                    "contributed_step_seconds": self.stats.contributed_step_seconds, "written_at": time.time(),
                    # what `diloco-export`/`diloco-sample` rebuild the model from
                    "run_config": self.host.config.run_config,
                    "proofs": proofs_doc(self.replica.proofs, (e.meta.update_id for e in snapshot.entries))}
            inner, feedback = await trio.to_thread.run_sync(lambda: (self.loop.state_dict(), self.feedback.state_dict()))
        self._last_checkpoint = (self.stats.round, trio.current_time())
        checkpoints, store, blobs = self.checkpoints, self.host.store, self.blobs

        def work() -> None:
            part = encode_ledger_part(snapshot, working, rows, store, proofs)  # the payloads stay in the blob store
            previous = blobs.pinned
            blobs.pinned = previous | part.blobs  # spared by the clean-up while the file is written
            path = None
            try:
                path = checkpoints.save(Checkpoint(meta, part.data, inner, feedback, part.outer))  # streamed
            finally:  # written: what it needs is pinned and the older one's may go; else the older one counts
                newest, released = (part.blobs, previous) if path is not None else (previous, part.blobs)
                blobs.pinned = newest
                store.release(released)
            if path is not None:
                log.info("checkpoint %s written (slot %d)", path.name, meta["slot"])

        def report() -> None:  # trio thread: the stats are read by /status
            if checkpoints.last_error is None:
                self.stats.disk_errors.pop("checkpoint", None)
            else:
                self.stats.disk_errors["checkpoint"] = checkpoints.last_error

        async def write(phase: str) -> None:
            try:
                async with self._write_lock:
                    with self.stats.timed(phase):
                        await trio.to_thread.run_sync(work)
                    report()
            finally:
                self._writing = False

        if background is None:
            await write("checkpoint")
        else:
            self._writing = True
            background.start_soon(write, "checkpoint_write_bg")

    # ---- blob clean-up ----------------------------------------------------------------------------
    async def tend_disk(self) -> None:
        """After a round: blobs the store spilled to memory on a full disk (`p2p.blobstore`) are moved back once
        the disk has room; until then `/status` says how many are held (`disk_errors["blobs"]`) and
        checkpoints wait (a checkpoint refers to blobs on disk)."""
        store = self.host.store
        if store.disk_error is not None:
            moved = await trio.to_thread.run_sync(store.unspill)  # with nothing spilled: the next write tries the disk
            if moved:
                log.info("%d spilled blobs moved back to disk", moved)
        if store.disk_error is None:
            if self.stats.disk_errors.pop("blobs", None) is not None:
                log.warning("blobs are written to disk again")
            return
        self.stats.disk_errors["blobs"] = (f"{store.spilled_bytes / 1e6:.1f} MB of blobs held in memory "
                                           f"({store.disk_error}); checkpoints wait for the disk")
        now = trio.current_time()
        loud = now - self._disk_logged_at >= DISK_LOG_EVERY_S  # a nearly full disk comes and goes: not every round
        if loud:
            self._disk_logged_at = now
        log.log(logging.ERROR if loud else logging.DEBUG, "the disk under the blobs is full: %s",
                self.stats.disk_errors["blobs"])

    def collect_garbage(self) -> None:
        """Delete payload blobs of updates more than two windows below the current slot, and those of updates
        the ledger left out (an origin's surplus in a slot: `Replica.take_dropped_blobs`) unless the newest
        checkpoint refers to them."""
        with self.stats.timed("blob_gc"):
            surplus = [b for b in self.replica.take_dropped_blobs() if b not in self.blobs.pinned]
            for blob in [*self.blobs.due(self.replica.slot - 2 * self.replica.config.window), *surplus]:
                self.host.remove_blob(blob)

"""The training node: one `NodeRuntime` per process (or several in one trio process, for tests).

Lifecycle (`NodeRuntime.run`), one owner per step:

    data        the task opens its data (`node.island.task.Task.open`; the CLI's reads and splits the corpus,
                `node.island.data`): a bad `--data` fails here, before listening
    listening   the p2p host is up (gossip + HTTP: /status, /metrics, /state, /blobs, /chaos);
                `task_status.started(runtime)` — the CLI prints LISTENING here
    prepare     inner loop (JAX compiles), and the ledger: from the latest valid checkpoint, else
                from the seed's initial parameters (`node.start`, a worker thread)
    syncing     with bootstrap peers: the best peer state if fresher than ours (`node.sync.join`)
    training    rounds (`node.outer.rounds`) and what comes between them (`node.outer.upkeep`: evaluation,
                checkpoints, blob clean-up), while `node.outer.intake` adds peers' updates as they arrive
    draining    after `--max-rounds`: wait for the peers (`node.sync.drain`), close every slot with updates
    stopped     signed goodbye, final checkpoint; `run` returns the `Stopped` line

A stop request (SIGTERM/SIGINT through the CLI, or `request_stop`) skips to `stopped` at the next step
boundary: an inner round ends after its current step and, if it has the steps an update needs (H/8), is
published as it stands, and the node waits (bounded: `_hand_over`) until its peers have fetched the
payload; no drain.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import trio

import p2p
from node.checkpoint import Checkpoint
from node.chaos import ChaosRoute, ForgeState, Tarpit
from node.sync.drain import DrainTracker, PeerView, drain_state
from node.sync.forkhint import ForkHintRoute
from node.sync.join import NoPeerState, StateServer, bootstrap_peers, sync_state
from node.logs import PEER
from node.metrics import MetricsSink, metrics_record
from node.sync.repair import pull_missing
from node.hostconfig import host_config
from node.outer.intake import Intake
from node.outer.parts import NodeParts
from node.outer.replica import Replica
from node.outer.rounds import Rounds
from node.outer.upkeep import BetweenRounds, HeldBlobs, vet_synced_state
from node.outer.outer_files import MappedBottom, remove_old_blobs, scratch_dir
from node.outer.resume import newest_checkpoint
from node.island.mesh import describe_layout
from node.start import start_state
from node.settings import (NodeSettings, ledger_config, load_admission, load_identity, open_checkpoints,
                           run_configuration)
from node.status import NodeStats, StatusRoutes, status_fields, write_last_status
from node.island.task import Task
from protocol import kernels
from protocol.compression import ErrorFeedback
from protocol.identity import Identity
from protocol.ledger import ClosePolicyConfig, SlotClosePolicy
from protocol.ledger.proof import proofs_of_doc

__all__ = ["NodeRuntime", "Stopped"]

log = logging.getLogger("node.runtime")

RESYNC_TIMEOUT_HEARTBEATS = 30  # a running node that fell behind looks this long for a state, then trains on
# A stopped node waits at most this many heartbeats, or transfer times of an update (the longer), for its peers
# to fetch the payload of the round the stop cut short
HAND_OVER_HEARTBEATS, HAND_OVER_TRANSFERS = 5, 4


@dataclass(frozen=True)
class Stopped:
    """How the run ended: the final slot and digests (the `STOPPED` line), and why."""

    slot: int
    ledger_digest: bytes
    params_digest: bytes
    reason: str

    def line(self) -> str:
        return f"STOPPED {self.slot} {self.ledger_digest.hex()} {self.params_digest.hex()}"


class NodeRuntime:
    """One node (see the module docstring). Create, then `await nursery.start(runtime.run)`. It trains `task`
    (`node.island.task`; default: the CLI's byte-level model of `settings`, `NodeSettings.byte_lm_task`)."""

    def __init__(self, settings: NodeSettings, identity: Identity | None = None, task: Task | None = None,
                 on_metrics: Callable[[dict], object] | None = None) -> None:
        self.settings = settings
        self.metrics = MetricsSink(on_metrics, settings.metrics_file)  # off unless asked for
        self.identity = identity if identity is not None else load_identity(settings)
        self.peer_id = self.identity.peer_id
        self.custom_task = task is not None
        self.task = task if task is not None else settings.byte_lm_task()
        self.shapes = self.task.model.shapes
        self.ledger_config = ledger_config(settings, self.task)
        self.admission = load_admission(settings, self.peer_id)
        self.run_config = run_configuration(settings, self.task, self.ledger_config.fingerprint(), self.admission.founder,
                                            self.peer_id)
        name = self.task.model.name if self.custom_task else settings.model
        self.stats = NodeStats(self.peer_id, run_id=settings.run_id, inner_lr=self.task.model.lr,
                               max_rounds=settings.max_rounds, model=f"{name}, {self.task.model.param_count:,} parameters")
        # the outer passes compiled for real model sizes (the same bits; numba costs a small model more than it saves)
        kernels.use_compiled(self.task.model.param_count >= kernels.COMPILED_FROM_PARAMS)
        # The slot of a round's update is closed while the next round trains (`node.outer.rebase`), so holding it
        # open for due peers costs no compute: up to half a round.
        self.policy = SlotClosePolicy(ClosePolicyConfig(quorum=settings.quorum,
                                                        max_hold_steps=max(1.0, 0.5 * settings.inner_steps)))
        self.feedback = ErrorFeedback(settings.compression)
        self.checkpoints = open_checkpoints(settings, self.peer_id)
        self.host: p2p.Host
        self.replica: Replica | None = None
        self.rounds: Rounds | None = None
        self.upkeep: BetweenRounds | None = None
        self._forger: ForgeState | None = None  # --misbehave forge-state
        self.blobs = HeldBlobs()  # payload blobs held (own, peers', downloaded), for the clean-up
        self.result: Stopped | None = None
        self._stop_reason: str | None = None
        self._stop_event = trio.Event()
        self._sync_scope: trio.CancelScope | None = None
        self._repaired: set[tuple[str, str]] = set()  # (peer, drain state) pulled from at the end
        self._repairing: set[str] = set()  # peers a comparison (`_repair`) is running with
        self._seen_peers: set[str] = set()  # peers connected at some point in this process
        self._connected: set[str] = set()  # peers connected at the last check between rounds
        self._resume_from: Checkpoint | None = None  # the checkpoint `_prepare` restores, read first in `run`
        self._resume_blobs: frozenset[str] = frozenset()  # the payload blobs it refers to
        self._resume_seen: frozenset[bytes] = frozenset()  # the update ids its ledger had seen

    # ---- stopping ---------------------------------------------------------------------------------
    def request_stop(self, reason: str) -> None:
        """Stop at the next step boundary: goodbye, checkpoint, `Stopped` (no drain). Idempotent."""
        if self._stop_reason is None:
            self._stop_reason = reason
            log.info("stop requested: %s", reason)
            self._stop_event.set()
            if self._sync_scope is not None:
                self._sync_scope.cancel()

    def stop_requested(self) -> bool:
        return self._stop_reason is not None

    async def wait_change(self, deadline: float | None) -> None:
        """Sleep until the ledger changes, a stop is requested, or `deadline` (trio time) passes."""
        with trio.move_on_at(math.inf if deadline is None else deadline):
            async with trio.open_nursery() as nursery:
                async def first(fn) -> None:
                    await fn()
                    nursery.cancel_scope.cancel()

                if self.replica is not None:
                    nursery.start_soon(first, self.replica.changed)
                nursery.start_soon(first, self._stop_event.wait)

    def _progress(self, state: str) -> None:
        slot = self.replica.slot if self.replica is not None else 0
        self.host.set_progress(slot, self.stats.round, state)

    # ---- the lifecycle ----------------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[NodeRuntime] = trio.TASK_STATUS_IGNORED) -> Stopped:
        PEER.set(self.peer_id)
        # the data first: a wrong --data is a one-line error before the node listens
        self.batches, self.heldout = await trio.to_thread.run_sync(self.task.open, self.peer_id)
        if not self.heldout and self.settings.eval_every:
            log.info("no held-out batches: evaluation off")
            self.settings = dataclasses.replace(self.settings, eval_every=0)
        with scratch_dir() as scratch:
            data_dir = self.settings.checkpoint_dir or Path(scratch)
            # the checkpoint first: the window's payload blobs it refers to stay, the rest goes
            self._resume_from, self._resume_blobs, self._resume_seen = await trio.to_thread.run_sync(
                newest_checkpoint, self.checkpoints)
            removed, freed = await trio.to_thread.run_sync(remove_old_blobs, data_dir / "blobs", self._resume_blobs)
            if removed:
                log.info("removed %d blobs (%.1f MB) left by a previous run of this node", removed, freed / 1e6)
            self.bottom_store = MappedBottom(data_dir / "outer")  # the ledger's window bottom, on disk
            async with trio.open_nursery() as nursery:
                self.host = await nursery.start(p2p.run, host_config(self.settings, self.identity, data_dir, self.shapes,
                                                                      self.ledger_config, self.run_config, self.admission,
                                                                      seen=self._in_ledger))
                self._background = await nursery.start(self._background_tasks)
                self._nursery = nursery  # background checkpoint writes: `_finish` waits for them
                self.status = StatusRoutes(self.stats, self.host)
                self.status.mount()
                self.state_server = StateServer(self.host)
                self.state_server.mount()
                ForkHintRoute(self.host, self._peers_to_compare).mount()
                if self.settings.allow_chaos:
                    ChaosRoute(self.host).mount()
                if self.settings.misbehave == "tarpit":
                    Tarpit(self.host).mount()
                self._progress("syncing")
                task_status.started(self)
                with self.stats.timed("prepare"):
                    await self._prepare()
                warm = trio.Event()
                nursery.start_soon(self._warm_up, warm)  # compiles while the sync waits on the network
                synced_slot = None
                if self.settings.peers and not self.stop_requested():
                    with self.stats.timed("sync"):
                        synced_slot = await self._join(self.settings.sync_timeout_s, warm)
                with self.stats.timed("warm_up"):
                    await warm.wait()
                self._follow_run_schedule(synced_slot)  # after the warm-up: one thread at a time on the loop
                self._start_training()
                await self._recover_inflight()
                drained = False
                while not self.stop_requested() and not self.rounds.last_round:
                    await self._one_round()
                if self.rounds.published_at_stop is not None:
                    await self._hand_over(self.rounds.published_at_stop)
                if not self.stop_requested():
                    with self.stats.timed("drain"):
                        drained = await self._drain()
                self.result = await self._finish(drained)
                nursery.cancel_scope.cancel()
        return self.result

    @staticmethod
    async def _background_tasks(task_status: trio.TaskStatus[trio.Nursery] = trio.TASK_STATUS_IGNORED) -> None:
        """A nursery for the intake of peers' updates and for repairs; `_finish` cancels it first, so the
        ledger does not change between the final digests and the final checkpoint."""
        async with trio.open_nursery() as nursery:
            task_status.started(nursery)
            await trio.sleep_forever()

    async def _prepare(self) -> None:
        """Inner loop and ledger: from the latest valid checkpoint, else from the seed (`node.start`)."""
        ckpt, self._resume_from = self._resume_from, None
        start = await trio.to_thread.run_sync(functools.partial(
            start_state, self.task, self.batches, self.settings.seed, ckpt, self.ledger_config, self.shapes,
            self.bottom_store, self.host.store, self.feedback, self._resume_blobs, mesh=self.settings.mesh, remat=self.settings.remat))
        self.loop, ckpt, snap = start.loop, start.checkpoint, start.snapshot
        self._resume_blobs = self._resume_blobs if ckpt is not None else frozenset()  # unusable: removed
        self.blobs.hold_all(start.blobs)
        self.replica = Replica(start.ledger, snap.seen if snap is not None else ())
        if ckpt is not None:
            self.stats.round = self.stats.resumed_round = ckpt.round
            self.stats.updates_published = int(ckpt.meta.get("updates_published", 0))
            self.replica.proofs.update(proofs_of_doc(ckpt.meta.get("proofs")))  # served with the state
            log.info("resumed from checkpoint of round %d (slot %d)", ckpt.round, snap.slot)
        self.status.replica = self.replica
        self.stats.island = self.loop.layout()
        log.info("model ready: %d tensors on %s; ledger at slot %d", len(self.shapes), describe_layout(self.stats.island),
                 self.replica.slot)

    async def _warm_up(self, done: trio.Event) -> None:
        """Compile the train and evaluation steps (`InnerLoop.warm_up`) in a worker thread; sets `done`."""
        try:
            batches = self.heldout if self.settings.eval_every else ()
            seconds = await trio.to_thread.run_sync(self.loop.warm_up, batches)
            log.info("train and evaluation steps compiled in %.2f s", seconds)
        finally:
            done.set()

    async def _join(self, timeout_s: float | None, warm: trio.Event) -> int | None:
        """Sync the peers' state if fresher than ours (`node.sync.join`), vetted (`vet_synced_state`, once
        the evaluation is compiled: `warm`); returns the slot taken, or None. Raises `NoPeerState` after
        `timeout_s` (None: waits until a peer state comes or a stop)."""
        replica = self.replica
        own_digest, _ = await replica.digests()
        result = None

        def waiting(what: str | None) -> None:
            self.stats.waiting_for = what

        with trio.CancelScope() as self._sync_scope:
            result = await sync_state(self.host, self.settings.run_id, self.ledger_config, self.shapes,
                                      own=(replica.slot, own_digest), bottom=replica.bottom_store, timeout_s=timeout_s,
                                      retry_s=self.settings.heartbeat_s, waiting=waiting,
                                      vet=functools.partial(vet_synced_state, self.settings, self.loop, self.heldout,
                                                            self.stats, replica, warm),
                                      bootstrap=functools.partial(bootstrap_peers, self.host))
        self._sync_scope = None
        if result is None:
            return None
        for peer in result.refused:  # their states are not downloaded for a while
            replica.guard.refuse(peer)
        await replica.replace(result.ledger, result.seen, result.proofs)
        self.blobs.hold_all(result.payloads)
        self.feedback.reset()  # the residual belonged to the parameters we had
        m = result.choice.manifest
        self.stats.sync = {"slot": m.slot, "ledger_digest": m.ledger_digest.hex(),
                           "params_digest": m.params_digest.hex(), "confirmed_by": list(result.choice.confirmed_by)}
        return m.slot

    def _follow_run_schedule(self, synced_slot: int | None) -> None:
        """A node that synced a running training's state — a joiner, or a node restarted from a checkpoint
        older than the run — takes the run's position in the learning-rate schedule instead of going on
        from step 0 or from its checkpoint's step (its pseudo-gradients would dwarf those of nodes further
        down the cosine). The run's inner step is estimated as `slot * inner_steps`: a slot closes about
        once per round of the run. Only moves forward. Call only between rounds."""
        if synced_slot is None:
            return
        run_step = synced_slot * self.settings.inner_steps
        if self.loop.has_schedule and run_step > self.loop.schedule_step:
            self.loop.set_schedule_step(run_step)
            log.info("joined at slot %d: learning-rate schedule moved to step %d (lr %.3g)", synced_slot, run_step,
                     self.loop.learning_rate())

    def _start_training(self) -> None:
        parts = NodeParts(self.settings, self.host, self.replica, self.loop, self.feedback, self.stats, self.policy,
                          self.shapes, self.blobs, self.checkpoints, self.heldout)
        self.rounds = Rounds(parts, stop_requested=self.stop_requested, wait_change=self.wait_change)
        self.upkeep = BetweenRounds(parts)
        self.host.store.keep(self._resume_blobs)  # until a newer checkpoint is written, the one resumed from counts
        self.blobs.pinned = self._resume_blobs
        self.state_server.serve(self.replica)
        if self.settings.misbehave == "forge-state":
            self._forger = ForgeState(self.host, self.state_server)
        self.replica.pace = self._catch_up_pace
        self.stats.state = "training"
        self._progress("training")
        self.intake = Intake(parts, peer_clock=self.rounds.peer_clock,
                             compare=lambda origin: self._background.start_soon(self._repair, origin))
        self._background.start_soon(self.intake.run)
        self._background.start_soon(self.replica.keep_bottom)

    def _in_ledger(self, update_id: bytes) -> bool:
        """The host's check before it fetches an update's payload (trio thread): the replica has it already —
        or, while the replica is being restored, the checkpoint it is restored from had (the peers announce
        their history as soon as they connect)."""
        if self.replica is None:
            return update_id in self._resume_seen
        return self.replica.has_seen(update_id)

    async def _recover_inflight(self) -> None:
        """Publish the round a previous process of this node had in flight, if it journaled one
        (`node.outer.inflight`): after the state sync, before the first round."""
        journal = self.rounds.journal
        if journal is None:
            return
        load = functools.partial(journal.load, run_id=self.settings.run_id, peer_id=self.peer_id, shapes=self.shapes)
        inflight = await trio.to_thread.run_sync(load)
        if inflight is not None:
            await self.rounds.recover(inflight)

    def _catch_up_pace(self) -> tuple[int, float]:
        """For `Replica.pace`: connected peers, and the least time between slot closes on one origin's
        word — the run's measured round (`protocol.ledger.catchup`)."""
        round_s = self.rounds.peer_clock.target_seconds() if self.rounds is not None else None
        return len(self.host.connected_peers()), round_s or 0.0

    async def _repair(self, peer: str) -> None:
        """Pull the updates `peer` holds and we missed (see `node.sync.repair`); one comparison per peer at a
        time (a request while one runs is dropped: the running one looks at our state after its fetch)."""
        http = {p.peer_id: p.http_addr for p in self.host.peers()}.get(peer)
        if http and peer not in self._repairing:
            self._repairing.add(peer)
            try:
                repaired = await pull_missing(self.host, self.replica, self.settings.run_id, peer, http)
                if repaired is not None:
                    self.blobs.hold_all(repaired.payloads)
            finally:
                self._repairing.discard(peer)

    def _peers_to_compare(self) -> set[str] | None:
        """The replica's set of peers to compare with before the next round (None before it exists)."""
        return None if self.replica is None else self.replica.forked_with

    def _returned_peers(self) -> list[str]:
        """Peers that were connected before in this process, then gone, and are back since the last call."""
        now = set(self.host.connected_peers())
        back = sorted((now - self._connected) & self._seen_peers)
        self._seen_peers |= now
        self._connected = now
        return back

    async def _one_round(self) -> None:
        if self.intake.resync:
            self.intake.resync = False
            log.warning("far behind the peers: syncing their state again")
            try:
                self._follow_run_schedule(await self._join(RESYNC_TIMEOUT_HEARTBEATS * self.settings.heartbeat_s))
            except NoPeerState as exc:
                log.warning("resync: %s; training on from our own state", exc)
        # a heavier forked state (node.sync.repair), unless its model is worse than ours (upkeep.vet)
        if await self.replica.adopt_pending(vet=self.upkeep.vet) is not None:
            self.feedback.reset()  # the residual belonged to the parameters we had
        # the vet evaluates in a worker thread, which a cancellation waits for: if one came meanwhile, the
        # background nursery is closed already, and starting a repair in it would raise instead
        await trio.lowlevel.checkpoint_if_cancelled()
        for peer in self._returned_peers():
            log.info("%s is back: pulling what it holds and we missed", peer)
            self._background.start_soon(self._repair, peer)
        for peer in self.replica.take_rechecks():  # forked at the last comparison: compare again
            self._background.start_soon(self._repair, peer)
        upkeep = self.upkeep
        if self.settings.eval_every and not self.stats.eval_history:
            await upkeep.evaluate()  # the starting point of the curve (compiled by the warm-up)
        await self.rounds.recover_deferred()
        if not await self.rounds.run_round() or self.stop_requested():  # a stop: the final checkpoint follows
            return
        self._progress("training")
        if self._forger is not None:
            await self._forger.act(self.replica)
        if upkeep.evaluation_due():
            await upkeep.evaluate()
        await upkeep.tend_disk()
        if upkeep.checkpoint_due():
            await upkeep.checkpoint(background=self._nursery)  # written while the next round trains
        upkeep.collect_garbage()
        await self._emit_metrics("round")

    async def _emit_metrics(self, event: str) -> None:
        """The round's figures to the tracker (`--metrics-file`, `on_metrics`), in a worker thread."""
        if self.metrics.active:
            record = metrics_record(event, status_fields(self.stats, self.replica, self.host),
                                    self.task.model.metric, self.task.tokens_per_batch)
            await trio.to_thread.run_sync(self.metrics.emit, record)

    # ---- the end ----------------------------------------------------------------------------------
    async def _hand_over(self, blob: str) -> None:
        """After a stop that published the round in flight: wait until every connected peer has fetched its
        payload from us, bounded (`HAND_OVER_HEARTBEATS`, `HAND_OVER_TRANSFERS`; a peer may have it from
        another), so its steps reach the run after this process is gone."""
        started = trio.current_time()
        limit = max(HAND_OVER_HEARTBEATS * self.settings.heartbeat_s, HAND_OVER_TRANSFERS * self.policy.transfer_ema)
        with trio.move_on_after(limit) as bound:
            await self.host.blobs.wait_served(blob, lambda: set(self.host.connected_peers()),
                                              recheck_s=self.settings.heartbeat_s)
        log.info("the round cut short by the stop %s its peers in %.1f s", "did not reach all of" if
                 bound.cancelled_caught else "reached", trio.current_time() - started)

    async def _drain(self) -> bool:
        """Wait for the peers (see `node.sync.drain`); True when they agreed (or none is left)."""
        s = self.settings
        self.stats.draining = True
        round_s = self.stats.contributed_step_seconds / max(1, self.stats.updates_published)
        quiet = s.drain_timeout_s or max(6 * s.heartbeat_timeout_s, 3 * (round_s + (self.rounds.overhead_s or 0)))
        tracker = DrainTracker(trio.current_time(), quiet)
        log.info("draining: waiting for the peers (gives up after %.0f s without progress, %.0f s in all)",
                 quiet, tracker.limit_s)
        with trio.move_on_at(tracker.started_at + tracker.limit_s):  # a repair in flight is cut short too
            return await self._wait_for_peers(tracker)
        log.warning("drain done (time-limit, during a repair)")
        return False

    async def _wait_for_peers(self, tracker: DrainTracker) -> bool:
        s = self.settings
        while not self.stop_requested():
            states = {p.peer_id: p.state for p in self.host.peers()}
            # a heavier forked state (node.sync.repair), if its origin still announces it (else it moved on)
            if await self.replica.adopt_pending(lambda p: states.get(p.origin) == drain_state(p.agreement),
                                                self.upkeep.vet):
                self.feedback.reset()
            own = drain_state(self.replica.agreement_hex())
            self._progress(own)
            # peers we no longer gossip with (graylisted) are not waited for
            peers = [PeerView(p.peer_id, p.state, p.slot, p.round) for p in self.host.gossip_peers()]
            decision = tracker.update(trio.current_time(), own, peers)
            for peer, state in tracker.diverged(trio.current_time(), 3 * s.heartbeat_s):
                if (peer, state) not in self._repaired:
                    self._repaired.add((peer, state))
                    await self._repair(peer)
            if decision.done:
                log.log(logging.INFO if decision.agreed else logging.WARNING, "%s", decision.describe())
                return decision.agreed
            await self.wait_change(trio.current_time() + s.heartbeat_s / 2)
        return False

    async def _finish(self, drained: bool) -> Stopped:
        """Close known slots (after a drain), goodbye, final checkpoint."""
        replica = self.replica
        self._background.cancel_scope.cancel()
        if drained or not self.stop_requested():
            await replica.close_known()
        ledger_digest, params_digest = await replica.digests()
        if self.upkeep is not None and self.heldout and self.settings.eval_every:
            await self.upkeep.evaluate("the final model of this node")  # what an export of it holds
        self.stats.state = "stopped"
        self.stats.draining = False
        self._progress("stopped")
        await self._emit_metrics("stopped")
        if self.checkpoints is not None:
            await trio.to_thread.run_sync(write_last_status, self.checkpoints.directory,
                                          status_fields(self.stats, replica, self.host, (ledger_digest, params_digest)))
        reason = self._stop_reason or "max-rounds reached"
        peer_slots = {p.peer_id: p.slot for p in self.host.peers()}
        await self.host.close(reason)
        if self.upkeep is not None:
            await self.upkeep.checkpoint()
        ahead = {p: slot for p, slot in peer_slots.items() if slot is not None and slot > replica.slot}
        log.info("stopped at slot %d, ledger %s, params %s%s%s", replica.slot, ledger_digest.hex()[:16],
                 params_digest.hex()[:16], f", held-out {self.stats.eval_loss:.4f} {self.task.model.metric}"
                 if self.stats.eval_slot == replica.slot and self.stats.eval_loss is not None else "",
                 f"; peers further on (export from one of them): {ahead}" if ahead else "")
        return Stopped(replica.slot, ledger_digest, params_digest, reason)

"""A node of a reduced run (`diloco-node --traffic reduced --roster FILE`): slots sealed, each shard of the
model reduced by one aggregator and checked, so that a node moves a small constant times one update per
round instead of N − 1 updates (docs/design.md, "Traffic that does not grow with the run"; PROTOCOL.md §15).

Lifecycle (`ReducedRuntime.run`), each round on every node alike:

    data        the task opens its data (as `node.runtime.NodeRuntime`)
    listening   the p2p host is up (gossip + HTTP: /status, /metrics and the reduced routes, `node.reduced.plane`)
    prepare     the inner loop from the seed's initial parameters, compiled; the replica `θ, v` at them
    meeting     until every contributor of the roster is known (connected, or named by peer exchange), or
                `--sync-timeout` (then the slots go on without the absent: sealers wait `--slot-patience`)
    training    a round: H inner steps from the replica's `θ`, the pseudo-gradient compressed with error
                feedback, its commitment published, the slot closed (`node.reduced.driver.SlotDriver`:
                sealed, reduced, checked, applied), evaluation every `--eval-every` rounds; the next round
                trains while the slot finishes, and is trained again if a fraud proof then replaces a shard
                of the `θ` it began from (`/status` `traffic.rounds_retrained`)
    stopped     at the run's last slot (`--max-rounds`) or a stop request; the `STOPPED` line holds the slot,
                the replica's digest of `θ, v` and of `θ`

What this version does not do (written down in docs/design.md): a node that restarts, or joins a run that
has moved on, cannot catch up (there is no state sync of a reduced run yet): it sees the peers' slots
ahead of its own and stops with an error saying so; checkpoints are not written; the roster is fixed when
the run starts.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import numpy as np
import trio

import p2p
from node.hostconfig import host_config
from node.island.config import ConfigError
from node.island.mesh import describe_layout
from node.island.task import Task
from node.island.train import InnerLoop
from node.logs import PEER
from node.metrics import MetricsSink, metrics_record
from node.outer.outer_files import scratch_dir
from node.reduced.chaos import LIE_FACTOR, LyingNode, ReducedPoison, unbounded
from node.reduced.driver import SlotClock, SlotDriver
from node.runtime import Stopped
from node.settings import (REDUCED_CHECK_SHARE, NodeSettings, ledger_config, load_admission, load_identity,
                           load_roster, run_configuration)
from node.status import NodeStats, StatusRoutes, status_fields, write_last_status
from protocol.compression import ErrorFeedback
from protocol.errors import LocalProtocolError
from protocol.identity import Identity
from protocol.reduced import ShardPlan
from protocol.reduced.participant import ReducedNode
from protocol.reduced.slot_state import SlotState

__all__ = ["ReducedBehind", "ReducedRuntime", "ReducedView"]

log = logging.getLogger("node.reduced")

AHEAD_SLOTS = 2  # a peer this many slots ahead of this node: the run moved on without it
MEET_TIMEOUT_S = 120.0  # without --sync-timeout: how long to wait for the roster before the first slot
SLOT_TIMEOUT_FACTOR = 20  # a slot not closed in this many times (patience + ξ) is a failure


class ReducedBehind(Exception):
    """The run is further on than this node and a reduced run cannot sync a state yet: a user error."""


@dataclasses.dataclass(frozen=True)
class _NoForks:
    refused_from: frozenset[str] = frozenset()


class ReducedView:
    """What `/status` reads of a reduced node, under the names the all-to-all replica gives them: its slot,
    digests (of the last finished slot), updates applied (the sealed ones), and per-slot outcomes. A reduced
    run has no fork choice (every replica applies the same sealed slots), so nothing is held or refused."""

    held: dict[int, int] = {}
    guard = _NoForks()

    def __init__(self, node: ReducedNode, driver: SlotDriver) -> None:
        self.node, self._driver = node, driver
        self.updates_applied = 0
        self.outcomes: Counter[str] = Counter()
        self.cached_digests: tuple[bytes, bytes] | None = None
        self.last_slot: dict[str, object] = {}

    @property
    def slot(self) -> int:
        """The last slot finished here and recorded (`finished`): what the digests and outcomes describe."""
        return int(self.last_slot.get("slot", 0))

    async def digests(self) -> tuple[bytes, bytes]:
        return self.cached_digests if self.cached_digests is not None else (b"", b"")

    async def params(self) -> dict[str, np.ndarray]:
        """The replica's ``θ`` (float32 copies), taken between the participant's steps."""
        return await self._driver._locked(self.node.replica.params)

    def finished(self, s: SlotState, digests: tuple[bytes, bytes]) -> None:
        """Slot `s` is finished here, and the replica's digests are now `digests`."""
        self.cached_digests = digests
        self.updates_applied += len(s.seal.ids)
        self.outcomes["sealed"] += len(s.seal.ids)
        self.outcomes["shards_passed_over"] += len(s.passed)
        self.outcomes["aggregators_caught"] += len(s.caught)
        self.outcomes["records_rejected"] += len(s.rejected)
        self.last_slot = {"slot": s.number, "sealed": len(s.seal.ids), "passed_over": len(s.passed),
                          "caught": [peer for _, peer in s.caught]}


class ReducedRuntime:
    """One node of a reduced run (see the module docstring); used as `node.runtime.NodeRuntime` is: create,
    then `await nursery.start(runtime.run)`."""

    def __init__(self, settings: NodeSettings, identity: Identity | None = None, task: Task | None = None,
                 on_metrics: Callable[[dict], object] | None = None) -> None:
        self.settings = settings
        self.metrics = MetricsSink(on_metrics, settings.metrics_file)
        self.identity = identity if identity is not None else load_identity(settings)
        self.peer_id = self.identity.peer_id
        self.task = task if task is not None else settings.byte_lm_task()
        self.shapes = self.task.model.shapes
        self.ledger_config = ledger_config(settings, self.task)
        self.admission = load_admission(settings, self.peer_id)
        self.roster = load_roster(settings, self.peer_id)
        self.run_config = run_configuration(settings, self.task, self.ledger_config.fingerprint(),
                                            self.admission.founder, self.peer_id, roster=self.roster)
        try:
            self.plan = ShardPlan(self.shapes, len(self.roster))
        except LocalProtocolError as exc:
            raise ConfigError(f"--traffic reduced: {exc}") from None
        name = self.task.model.name if task is not None else settings.model
        self.stats = NodeStats(self.peer_id, run_id=settings.run_id, inner_lr=self.task.model.lr,
                               max_rounds=settings.max_rounds, model=f"{name}, {self.task.model.param_count:,} parameters")
        # rounds_retrained: rounds trained from a θ a fraud proof then corrected, trained again
        self.stats.traffic = {"mode": "reduced", "roster": len(self.roster), "shards": self.plan.shards,
                              "rounds_retrained": 0}
        self.feedback = ErrorFeedback(settings.compression)
        self.result: Stopped | None = None
        self.node: ReducedNode | None = None
        self.poison: ReducedPoison | None = None  # --misbehave poison:KIND
        self.replica: ReducedView | None = None
        self._stop_reason: str | None = None
        self._stop_event = trio.Event()
        self._closing: trio.CancelScope | None = None  # the slot being closed, left at a stop
        self._closed: trio.Event | None = None  # set once the slot being closed is finished here
        self._close_failure: str | None = None

    # ---- stopping ---------------------------------------------------------------------------------
    def request_stop(self, reason: str) -> None:
        """Stop at the next step boundary (a slot being closed is left: the peers pass this node over)."""
        if self._stop_reason is None:
            self._stop_reason = reason
            log.info("stop requested: %s", reason)
            self._stop_event.set()
            if self._closing is not None:
                self._closing.cancel()

    def stop_requested(self) -> bool:
        return self._stop_reason is not None

    def _progress(self, state: str) -> None:
        self.host.set_progress(self.node.slot if self.node is not None else 0, self.stats.round, state)

    # ---- the lifecycle ----------------------------------------------------------------------------
    async def run(self, *, task_status: trio.TaskStatus[ReducedRuntime] = trio.TASK_STATUS_IGNORED) -> Stopped:
        PEER.set(self.peer_id)
        s = self.settings
        self.batches, self.heldout = await trio.to_thread.run_sync(self.task.open, self.peer_id)
        with scratch_dir() as scratch:
            data_dir = s.checkpoint_dir or Path(scratch)
            config = host_config(s, self.identity, data_dir, self.shapes, self.ledger_config, self.run_config,
                                 self.admission)
            config = dataclasses.replace(config, gossip=dataclasses.replace(config.gossip, reduced_records=True))
            async with trio.open_nursery() as nursery:
                self.host = await nursery.start(p2p.run, config)
                self.status = StatusRoutes(self.stats, self.host)
                self.status.mount()
                self._progress("syncing")
                task_status.started(self)
                with self.stats.timed("prepare"):
                    await self._prepare()
                await nursery.start(self.driver.run)
                if not self.stop_requested():
                    await self._meet_roster()
                self.stats.state = "training"
                self._progress("training")
                self._nursery = nursery
                reason = None
                while reason is None and not self.stop_requested() and not self._last_round():
                    reason = await self._one_round()
                reason = reason or await self._previous_slot()
                self.result = await self._finish(reason)
                nursery.cancel_scope.cancel()
        return self.result

    async def _prepare(self) -> None:
        """The inner loop from the seed's initial parameters (compiled), the participant and its replica."""
        s = self.settings
        model, tokens = self.task.model, self.task.tokens_per_batch
        self.loop = await trio.to_thread.run_sync(functools.partial(
            InnerLoop, model, self.batches, seed=s.seed, tokens_per_batch=tokens, mesh=s.mesh, remat=s.remat))
        seconds = await trio.to_thread.run_sync(self.loop.warm_up, self.heldout if s.eval_every else ())
        params = {n: np.asarray(v, np.float32) for n, v in self.loop.params.items()}
        mode = s.misbehave or ""
        participant = LyingNode if mode == "lie" else ReducedNode
        # a node poisoning the claim does not hold its own to the run's bound (the honest nodes do)
        config = unbounded(self.ledger_config) if mode == "poison:tokens" else self.ledger_config
        if mode.startswith("poison:"):
            self.poison = ReducedPoison(mode.removeprefix("poison:"), self.shapes, s.compression, tokens, s.inner_steps)
        self.node = participant(self.identity, self.roster, self.plan, config, run_id=s.run_id,
                                codec=s.compression, q=REDUCED_CHECK_SHARE, params=params, seed=s.seed)
        if mode == "lie":
            self.node.factor = LIE_FACTOR
        self.driver = SlotDriver(self.host, self.node, SlotClock(s.slot_patience_s, s.slot_step_s))
        self.replica = ReducedView(self.node, self.driver)  # what /status and the library's handle read
        self.replica.cached_digests = (self.node.replica.digest(), self.node.replica.params_digest())
        self.status.replica = self.replica
        self.stats.island = self.loop.layout()
        log.info("model ready: %d tensors on %s, compiled in %.2f s; reduced run of %d contributors, %d shards",
                 len(self.shapes), describe_layout(self.stats.island), seconds, len(self.roster), self.plan.shards)

    def _unknown(self, peers: set[str]) -> set[str]:
        return {p for p in peers if not self.host.knows_peer(p)}

    async def _meet_roster(self) -> None:
        """Wait until every other contributor is known here (bounded), so the first slot is sealed with all."""
        others = set(self.roster) - {self.peer_id}
        limit = self.settings.sync_timeout_s or MEET_TIMEOUT_S
        with trio.move_on_after(limit):
            while self._unknown(others) and not self.stop_requested():
                self.stats.waiting_for = f"{len(self._unknown(others))} of the roster's {len(others)} other contributors"
                with trio.move_on_after(self.settings.heartbeat_s / 2):
                    await self._stop_event.wait()
        with trio.move_on_after(3 * self.settings.heartbeat_s):  # the peers' slots, for `_check_not_behind`
            while any(p.slot is None for p in self.host.peers()) and not self.stop_requested():
                await trio.sleep(self.settings.heartbeat_s / 4)
        missing = self._unknown(others)
        self.stats.waiting_for = None
        if missing:
            log.warning("starting without %d of the roster (%s): the sealers wait --slot-patience for them",
                        len(missing), ", ".join(sorted(p[:12] for p in missing)))

    def _last_round(self) -> bool:
        """Whether the slot this node closes (or closed) last is the run's last (`--max-rounds`)."""
        closing = self.node.slot + (self._closed is not None and not self._closed.is_set())
        return self.settings.max_rounds is not None and closing >= self.settings.max_rounds

    def _check_not_behind(self) -> None:
        ahead = {p.peer_id: p.slot for p in self.host.peers() if p.slot is not None and p.slot >= self.node.slot + AHEAD_SLOTS}
        if ahead:
            peer, slot = max(ahead.items(), key=lambda kv: kv[1])
            raise ReducedBehind(f"the run is at slot {slot} ({peer[:12]}), this node at slot {self.node.slot}: a node of a "
                                "reduced run cannot sync a state yet (issue 49), so it cannot take part once the run has "
                                "moved on: start every contributor of the roster together")

    async def _one_round(self) -> str | None:
        """Train a round from the newest applied slot's ``θ`` while that slot finishes (its finish wait, checks
        and proofs: `_close`), then publish its update and close its slot up to the point where it is applied;
        returns why the node stops, if it must (else None)."""
        s, node, stats = self.settings, self.node, self.stats
        self._check_not_behind()
        with stats.timed("round_start"):
            theta, replaced = await self.driver._locked(lambda: (node.replica.params(), node.replica.replaced))
            # while the slot `θ` comes from is unfinished, a fraud proof may still replace one of its shards:
            # the inner loop's state (AdamW moments, step, data position) is kept on the host to start again
            unchecked = self._closed is not None and not self._closed.is_set()
            before = await trio.to_thread.run_sync(self.loop.state_dict) if unchecked else None
            await trio.to_thread.run_sync(self.loop.set_params, theta)

        def stale() -> bool:  # a fraud proof replaced a shard of the slot this round started from
            return node.replica.replaced != replaced

        with stats.timed("inner_steps"):
            result = await trio.to_thread.run_sync(functools.partial(
                self.loop.run, s.inner_steps, should_stop=lambda: self.stop_requested() or stale()))
        stats.observe_round(result.steps, result.seconds, result.tokens, result.mean_loss)
        failure = await self._previous_slot()
        if failure is not None or self.stop_requested():
            return failure  # a stop cut the round short, or left the slot: the peers go on without it
        if stale():
            # Its Δ, and the AdamW moments of its steps, would carry the lie's repair into a θ already repaired:
            # the inner loop goes back to where the round began and trains again from the proven θ (the error
            # feedback untouched), once per aggregator caught after its slot was applied.
            log.warning("slot %d: a shard was replaced after this round started from it: the round (%d steps) "
                        "is trained again from the corrected θ", node.slot, result.steps)
            await trio.to_thread.run_sync(self.loop.load_state_dict, before)
            stats.traffic["rounds_retrained"] += 1
            return None
        stats.contributed_step_seconds += result.seconds
        with stats.timed("compress"):
            delta = {n: np.asarray(theta[n] - result.params[n], np.float32) for n in theta}
            payload, _ = await trio.to_thread.run_sync(self.feedback.compress, delta)
        tokens, steps = result.tokens, result.steps
        if self.poison is not None:  # --misbehave poison:KIND: the hostile update instead of this one
            payload, tokens, steps = await trio.to_thread.run_sync(self.poison.apply, payload, node.slot + 1)
        with stats.timed("publish"):
            await self.driver.publish(payload, node.slot, tokens, steps)
        stats.updates_published += 1
        stats.first_update_at = stats.first_update_at or time.time()
        applied, self._closed = trio.Event(), trio.Event()
        self._nursery.start_soon(self._close, applied, self._closed)
        with stats.timed("close_wait"):
            await applied.wait()  # the next round trains from here, while the slot finishes
        return None

    async def _previous_slot(self) -> str | None:
        """Wait until the slot being closed is finished here; then evaluate when due. Returns its failure."""
        if self._closed is None:
            return None
        with self.stats.timed("close_wait"):
            await self._closed.wait()
        self._closed = None
        failure, self._close_failure = self._close_failure, None
        if failure is None and not self.stop_requested():
            if self.settings.eval_every and self.heldout and self.stats.round % self.settings.eval_every == 0:
                await self._evaluate()
            await self._emit_metrics("round")
        return failure

    async def _close(self, applied: trio.Event, closed: trio.Event) -> None:
        """Close the slot this node published into: `applied` once its reduced shards are applied, `closed` once
        it is finished here (or failed: `_close_failure`, or left at a stop)."""
        s, node = self.settings, self.node
        limit = SLOT_TIMEOUT_FACTOR * (s.slot_patience_s + s.slot_step_s)
        try:
            with trio.CancelScope() as self._closing:
                if self.stop_requested():
                    return
                try:
                    state = await self.driver.close(timeout=limit, applied=applied)
                except trio.TooSlowError as exc:
                    log.error("%s", exc)
                    self._close_failure = f"slot {node.slot + 1} not closed: {exc}"
                    return
            if self._closing.cancelled_caught:
                return
            digests = await self.driver._locked(lambda: (node.replica.digest(), node.replica.params_digest()))
            self.replica.finished(state, digests)
            self.stats.round += 1
            self.stats.traffic["last_slot"] = self.replica.last_slot
            self.stats.traffic["records_dropped"] = dict(self.driver.dropped)
            self._progress("training")
            log.info("slot %d closed: %d updates sealed, %d shards passed over%s", state.number, len(state.seal.ids),
                     len(state.passed), f", aggregators caught {state.caught}" if state.caught else "")
        finally:
            self._closing = None
            applied.set()
            closed.set()

    async def _evaluate(self, what: str = "") -> None:
        with self.stats.timed("evaluate"):
            slot, params = self.node.slot, await self.replica.params()
            loss = await trio.to_thread.run_sync(functools.partial(self.loop.evaluate, self.heldout, params=params))
        if np.isfinite(loss):
            self.stats.eval_loss, self.stats.eval_slot = loss, slot
            self.stats.eval_history.append([self.stats.tokens, time.time(), loss])
        log.info("held-out %.4f %s at slot %d%s", loss, self.loop.model.metric, slot, f": {what}" if what else "")

    async def _emit_metrics(self, event: str) -> None:
        if self.metrics.active:
            record = metrics_record(event, status_fields(self.stats, self.replica, self.host), self.task.model.metric,
                                    self.task.tokens_per_batch)
            await trio.to_thread.run_sync(self.metrics.emit, record)

    async def _finish(self, failure: str | None) -> Stopped:
        """Goodbye and the `Stopped` line (the replica's digests of its last finished slot)."""
        digests = self.replica.cached_digests or (b"", b"")
        if self.heldout and self.settings.eval_every and failure is None:
            await self._evaluate("the final model of this node")
        self.stats.state = "stopped"
        self._progress("stopped")
        await self._emit_metrics("stopped")
        if self.settings.checkpoint_dir is not None:
            await trio.to_thread.run_sync(write_last_status, self.settings.checkpoint_dir,
                                          status_fields(self.stats, self.replica, self.host, digests))
        reason = failure or self._stop_reason or "max-rounds reached"
        await self.host.close(reason)
        log.info("stopped at slot %d, replica %s, params %s: %s", self.node.slot, digests[0].hex()[:16],
                 digests[1].hex()[:16], reason)
        return Stopped(self.node.slot, digests[0], digests[1], reason)

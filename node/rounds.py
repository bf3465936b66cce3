"""One node's rounds: train from the global parameters, publish the compressed pseudo-gradient, add it to
the ledger, close the slot when the policy says so; held-out evaluation and checkpoints between rounds.

A round, in order (`Rounds.run_round`):
1. base slot b = the replica's slot; θ_base = its parameters; the inner loop starts from them.
2. H inner steps in a worker thread (`trio.to_thread.run_sync`): the trio loop keeps serving gossip,
   HTTP and heartbeats, and updates that arrive are added (and slots caught up) meanwhile. With
   `--adaptive-steps` the round ends when the peers' measured round time is used up (at least one
   step), so a slow node does fewer steps instead of arriving late. A stop request ends it after the
   current step; an interrupted round publishes nothing.
3. Δ = θ_base − θ_local, compressed with error feedback; signed header with base_slot = b and
   publish_slot = the replica's slot *now* (slots may have been caught up during the round); published;
   the dequantized Δ (exactly what receivers decode) is added to the own ledger.
4. Unless it was the last round: wait until the update's slot is closed — by catch-up, or by this node
   when `SlotClosePolicy.decide` says so (quorum, grace, deadline of about one inner step).
"""

from __future__ import annotations

import functools
import logging
import math
import statistics
import time
from collections.abc import Awaitable, Callable

import trio

from node.chaos import Misbehave, Slowdown
from node.checkpoint import Checkpoint, CheckpointDir
from node.replica import Replica
from node.settings import NodeSettings
from node.status import NodeStats
from node.train import InnerLoop, RoundResult
from node.updates import Shapes, compress, make_delta, shapes_field, update_meta
from p2p import Host
from protocol.compression import ErrorFeedback
from protocol.ledger import SlotClosePolicy

__all__ = ["PeerRoundClock", "Rounds", "ShouldStop"]

log = logging.getLogger("node.rounds")


class PeerRoundClock:
    """Peers' round durations, measured as the time between two updates of the same origin."""

    def __init__(self) -> None:
        self._last: dict[str, float] = {}
        self._interval: dict[str, float] = {}

    def observe(self, origin: str, now: float) -> None:
        last = self._last.get(origin)
        self._last[origin] = now
        if last is not None and now > last:
            old = self._interval.get(origin)
            self._interval[origin] = now - last if old is None else 0.7 * old + 0.3 * (now - last)

    def target_seconds(self) -> float | None:
        """Median of the peers' round durations (None before two updates of one peer)."""
        return statistics.median(self._interval.values()) if self._interval else None


class ShouldStop:
    """`InnerLoop.run`'s should_stop for one round (called in the worker thread before each step)."""

    def __init__(self, stop: Callable[[], bool], slowdown: Slowdown, budget_s: float | None) -> None:
        self.stop, self.slowdown = stop, slowdown
        self.deadline = None if budget_s is None else time.monotonic() + budget_s
        self.calls = 0

    def __call__(self) -> bool:
        self.slowdown.before_step()
        self.calls += 1
        if self.stop():
            return True
        return self.calls > 1 and self.deadline is not None and time.monotonic() >= self.deadline


class Rounds:
    """The round loop's state and steps; the runtime calls `run_round` until done. trio thread only."""

    def __init__(self, *, settings: NodeSettings, host: Host, replica: Replica, loop: InnerLoop,
                 feedback: ErrorFeedback, stats: NodeStats, policy: SlotClosePolicy, shapes: Shapes,
                 heldout: list, checkpoints: CheckpointDir | None, stop_requested: Callable[[], bool],
                 wait_change: Callable[[float | None], Awaitable[None]]) -> None:
        self.settings, self.host, self.replica, self.loop = settings, host, replica, loop
        self.feedback, self.stats, self.policy, self.shapes = feedback, stats, policy, dict(shapes)
        self.heldout, self.checkpoints = heldout, checkpoints
        self.stop_requested, self.wait_change = stop_requested, wait_change
        self.slowdown = Slowdown(settings.slowdown)
        self.misbehave = Misbehave(settings.misbehave, host, shapes) if settings.misbehave else None
        self.peer_clock = PeerRoundClock()
        self.overhead_s: float | None = None  # own round time outside the inner steps (moving average)
        self.payloads: list[tuple[int, str]] = []  # (target slot, blob) of updates held, for clean-up

    @property
    def last_round(self) -> bool:
        return self.settings.max_rounds is not None and self.stats.round >= self.settings.max_rounds

    def _budget(self) -> float | None:
        if not self.settings.adaptive_steps:
            return None
        target = self.peer_clock.target_seconds()
        if target is None:
            return None
        return max(0.0, target - (self.overhead_s or 0.0))

    def _train(self, steps: int, should_stop: ShouldStop) -> RoundResult:
        result = self.loop.run(steps, should_stop=should_stop)
        self.slowdown.end_round()
        return result

    async def run_round(self) -> bool:
        """One round (see the module docstring). False if it was interrupted (nothing published)."""
        started = trio.current_time()
        base_slot = self.replica.slot
        base = await self.replica.params()
        await trio.to_thread.run_sync(self.loop.set_params, base)
        should_stop = ShouldStop(self.stop_requested, self.slowdown, self._budget())
        result = await trio.to_thread.run_sync(functools.partial(self._train, self.settings.inner_steps, should_stop))
        if result.steps == 0 or (self.stop_requested() and result.steps < self.settings.inner_steps):
            log.info("round %d interrupted after %d steps: not published", self.stats.round + 1, result.steps)
            return False
        payload, dequantized = await trio.to_thread.run_sync(
            lambda: compress(self.feedback, make_delta(base, result.params)))
        publish_slot = self.replica.slot
        signed = await self.host.publish_update(
            payload, base_slot=base_slot, publish_slot=publish_slot, tokens=result.tokens, inner_steps=result.steps,
            codec=self.settings.compression, shapes=shapes_field(self.shapes))
        meta = update_meta(signed)
        outcome, _ = await self.replica.add(meta, dequantized)
        self.payloads.append((meta.target_slot, signed.body.payload_sha256.hex()))
        self._count(result)
        log.info("round %d: %d steps, loss %.4f, %.2f s; published %s (base %d, slot %d, %d bytes): %s",
                 self.stats.round, result.steps, result.mean_loss, result.seconds, signed.message_id.hex()[:16],
                 base_slot, meta.target_slot, len(payload), outcome.value)
        if self.misbehave is not None:
            await self.misbehave.act(base_slot, publish_slot)
        if not self.last_round:
            await self.close_wait(meta.target_slot, result.steps)
        elapsed = trio.current_time() - started
        overhead = max(0.0, elapsed - result.seconds)
        self.overhead_s = overhead if self.overhead_s is None else 0.7 * self.overhead_s + 0.3 * overhead
        return True

    def _count(self, result: RoundResult) -> None:
        stats = self.stats
        stats.round += 1
        stats.updates_published += 1
        stats.contributed_step_seconds += result.seconds
        stats.observe_round(result.steps, result.seconds, result.tokens, result.mean_loss)
        if stats.first_update_at is None:
            stats.first_update_at = time.time()
        self.policy.observe_step(result.seconds / result.steps)

    async def close_wait(self, target: int, steps: int) -> None:
        """Wait until slot `target` is closed: by catch-up, or here when the policy says so."""
        done_at = trio.current_time()
        while self.replica.slot < target and not self.stop_requested():
            now = trio.current_time()
            decision = self.policy.decide(now=now, round_done_at=done_at, updates_in_slot=self.replica.open_count,
                                          inner_steps=steps)
            if decision.close:
                await self.replica.close_open(decision.why)
                self.policy.observe_sync(trio.current_time() - now)
                break
            await self.wait_change(decision.wake_at)

    # ---- between rounds ---------------------------------------------------------------------------
    async def evaluate(self) -> float:
        """Held-out bits per byte of the global parameters; recorded in the stats."""
        params = await self.replica.params()
        bpb = await trio.to_thread.run_sync(functools.partial(self.loop.evaluate, self.heldout, params=params))
        if math.isfinite(bpb):
            self.stats.eval_loss = bpb
            self.stats.eval_history.append([self.stats.tokens, time.time(), bpb])
        log.info("held-out %.4f bits/byte at slot %d (round %d)", bpb, self.replica.slot, self.stats.round)
        return bpb

    async def checkpoint(self) -> None:
        """Write a checkpoint (no-op without a checkpoint directory); I/O errors are logged, not raised."""
        if self.checkpoints is None:
            return
        ledger = await self.replica.snapshot_bytes()
        meta = {"round": self.stats.round, "run_id": self.settings.run_id, "peer_id": self.stats.peer_id,
                "slot": self.replica.slot, "updates_published": self.stats.updates_published,
                "contributed_step_seconds": self.stats.contributed_step_seconds, "written_at": time.time()}

        def work() -> None:
            ckpt = Checkpoint(meta, ledger, self.loop.state_dict(), self.feedback.state_dict())
            path = self.checkpoints.save(ckpt)
            if path is not None:
                log.info("checkpoint %s written (slot %d)", path.name, meta["slot"])

        await trio.to_thread.run_sync(work)

    def collect_garbage(self) -> None:
        """Delete payload blobs of updates more than two windows below the current slot."""
        floor = self.replica.slot - 2 * self.replica.config.window
        keep = []
        for slot, blob in self.payloads:
            if slot <= floor:
                self.host.store.remove(blob)
                self.host.router.forget_blob(blob)
            else:
                keep.append((slot, blob))
        self.payloads = keep

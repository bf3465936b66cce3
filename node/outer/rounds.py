"""One node's rounds: train from the global parameters, publish the compressed pseudo-gradient, add it to
the ledger, close the slot when the policy says so. What happens between rounds (evaluation, checkpoints,
blob clean-up) is `node.outer.upkeep`'s.

A round, in order (`Rounds.run_round`):
1. θ_base = the replica's global parameters (slot b), minus this node's previous update while its slot
   is still open (see 2); the inner loop starts from them.
2. H inner steps in a worker thread (`trio.to_thread.run_sync`): the trio loop keeps serving gossip,
   HTTP and heartbeats, and updates that arrive are added (and slots caught up) meanwhile. Meanwhile the
   slot of the *previous* round's update is closed on the trio side, when `SlotClosePolicy.decide` says
   so (every peer update that is due is in, or the hold of about half a round is over; only peers whose
   update is due are waited for, `PeerRoundClock.due`), or by catch-up; whenever θ moves (a close, a
   late update folded in) the round follows it (`node.outer.rebase`: train through the slot close, so no node
   idles while a slot fills). If that slot is still open when the round ends, it is closed then. With
   `--adaptive-steps` (the default) the round ends when the peers' measured round time is used up (at
   least H/8 steps, `MIN_ROUND_FRACTION`), so a slow node does fewer steps instead of arriving late. A stop request ends it after the
   current step; the round is then published as it stands if it has those H/8 steps (the runtime waits,
   bounded, for the peers to fetch its payload before it leaves), else nothing is.
3. Δ = θ_base (moved) − θ_local, compressed with error feedback; signed header with base_slot = the slot
   the round last followed and publish_slot = the replica's slot *now*; published; the dequantized Δ
   (exactly what receivers decode) is added to the own ledger. Its slot stays open into the next round
   (after the last round, the drain closes it).

Every phase's wall time goes to `NodeStats.time_s` and one `round N timing:` log line.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Awaitable, Callable, Mapping

import numpy as np
import trio

from node.chaos import RoundChaos, Slowdown
from node.outer.inflight import InflightJournal, InflightRound, unpublishable, waits_for_base
from node.outer.outer_files import map_blob
from node.outer.peerclock import PeerRoundClock
from node.outer.rebase import BaseShift
from node.outer.parts import NodeParts
from node.island.train import Progress, RoundResult
from node.outer.updates import compress, make_delta, shapes_field, update_meta
from protocol.compression import Codec
from protocol.compression.formats import as_codec_local
from protocol.errors import LocalProtocolError, RemoteProtocolError
from protocol.ledger import Outcome, Payload, PayloadDeltas, UpdateMeta
from protocol.ledger.proof import proof_of

__all__ = ["MIN_ROUND_FRACTION", "Rounds", "ShouldStop"]

log = logging.getLogger("node.outer.rounds")


MIN_ROUND_FRACTION = 1 / 8  # an adaptive round never ends before this share of H steps


class ShouldStop:
    """`InnerLoop.run`'s should_stop for one round (called in the worker thread before each step): a stop
    request ends the round before the next step; the time budget (`--adaptive-steps`) only once
    `min_steps` ran, so that an update always stands for real work (a node whose budget came out near
    zero would otherwise publish a burst of one-step rounds). `ended()` (the run reached its last slot, so
    this round's update could enter no slot) ends it too."""

    def __init__(self, stop: Callable[[], bool], slowdown: Slowdown, budget_s: float | None,
                 min_steps: int = 1, ended: Callable[[], bool] = lambda: False) -> None:
        self.stop, self.slowdown, self.ended = stop, slowdown, ended
        self.deadline = None if budget_s is None else time.monotonic() + budget_s
        self.min_steps = max(1, min_steps)
        self.calls = 0

    def __call__(self) -> bool:
        self.slowdown.before_step()
        self.calls += 1
        if self.stop() or self.ended():
            return True
        return self.calls > self.min_steps and self.deadline is not None and time.monotonic() >= self.deadline


@dataclasses.dataclass(frozen=True)
class PendingUpdate:
    """This node's last published update: its slot, steps and dequantized Δ (what its ledger holds; its
    payload, decoded when read)."""

    slot: int
    steps: int
    delta: Mapping[str, np.ndarray]


def _subtract(params: dict[str, np.ndarray], delta: Mapping[str, np.ndarray]) -> None:
    for name, d in delta.items():
        params[name] -= d


class _PhaseClock:
    """Wall time between successive `lap` calls, added to `phases[name]`."""

    def __init__(self, phases: dict[str, float]) -> None:
        self.phases, self.last = phases, time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.phases[name] = self.phases.get(name, 0.0) + now - self.last
        self.last = now


def _dropped(inflight: InflightRound, why: str) -> bool:
    """Log why a previous process's round is not published; False (nothing published)."""
    log.warning("round %d of the previous process (%d steps in flight) not published: %s", inflight.round,
                inflight.steps, why)
    return False


class Rounds:
    """The round loop's state and steps; the runtime calls `run_round` until done. trio thread only."""

    def __init__(self, parts: NodeParts, *, stop_requested: Callable[[], bool],
                 wait_change: Callable[[float | None], Awaitable[None]]) -> None:
        settings, host, loop, shapes, checkpoints = parts.settings, parts.host, parts.loop, parts.shapes, parts.checkpoints
        self.settings, self.host, self.replica, self.loop = settings, host, parts.replica, loop
        self.feedback, self.stats, self.policy, self.shapes = parts.feedback, parts.stats, parts.policy, dict(shapes)
        self.blobs, self.checkpoints = parts.blobs, checkpoints  # blobs: this node's payloads, for the clean-up
        # the round in flight, kept on disk while it trains (node.outer.inflight): only with a checkpoint dir
        every = settings.inflight_every_s
        self.journal = InflightJournal(checkpoints.directory, every_s=every) if checkpoints and every else None
        self.stop_requested, self.wait_change = stop_requested, wait_change
        self.chaos = RoundChaos(settings, host, shapes, loop)  # hooks; an honest node's do nothing
        self.peer_clock = PeerRoundClock()
        self.overhead_s: float | None = None  # own round time outside the inner steps (moving average)
        self._published_here = 0  # rounds this process published (the first one also measures start-up)
        self.pending: PendingUpdate | None = None  # this node's last update while its slot may be open
        self._round_started_at = 0.0  # the host's clock when the round in progress started (its journal)
        self.published_at_stop: str | None = None  # the payload blob of the round a stop cut short, once published
        self.deferred: InflightRound | None = None  # a previous process's round whose base slot is still ahead
        self.end_slot = settings.max_rounds  # the run's last slot (its configuration's outer.end_slot)
        self._last_target = 0  # the slot this process's last update entered

    @property
    def last_round(self) -> bool:
        """The run has reached its end (`--max-rounds`, the run's last slot): the replica closed that slot, or
        this node's last update entered it (a later round's update could enter no slot). A fact of the run,
        so a late joiner and a restarted node stop where the others do."""
        end = self.end_slot
        return end is not None and (self.replica.slot >= end or self._last_target >= end)

    def _past_end(self, publish_slot: int) -> bool:
        """An update published now would enter a slot after the run's last: nobody would take it."""
        return self.end_slot is not None and publish_slot + 1 > self.end_slot

    def _budget(self) -> float | None:
        if not self.settings.adaptive_steps:
            return None
        target = self.peer_clock.target_seconds()
        if target is None:
            return None
        return max(0.0, target - (self.overhead_s or 0.0))

    def _train(self, shift: BaseShift, should_stop: ShouldStop,
               phases: dict[str, float]) -> tuple[RoundResult, tuple[bytes, dict[str, float]] | None]:
        """Worker thread: start from the round's base, run the round (following the moves of the global
        parameters that `shift` hands over), and, unless it was interrupted, compress its Δ against the
        moved base (with error feedback). One thread hop for the three; their times go to `phases`."""
        started = time.perf_counter()
        self.loop.set_params(shift.applied)
        phases["round_start"] += time.perf_counter() - started
        journal = self._journal_hook(shift, should_stop.min_steps) if self.journal is not None else None
        result = self.loop.run(self.settings.inner_steps, should_stop=should_stop, shift=shift.take,
                               progress=journal)
        self.chaos.slowdown.end_round()
        if self._interrupted(result, should_stop.min_steps):
            return result, None
        if self.journal is not None:
            self.journal.clear()  # before the update is published: a round is never published twice
        started = time.perf_counter()
        try:
            compressed = compress(self.feedback, make_delta(shift.applied, result.params))
        except LocalProtocolError as exc:  # a diverged round (a non-finite Δ): nothing anyone could apply
            log.error("round %d diverged, not published: %s", self.stats.round + 1, exc)
            self.feedback.reset()
            return result, None
        phases["compress"] = time.perf_counter() - started
        return result, compressed

    def _journal_hook(self, shift: BaseShift, min_steps: int) -> Callable[[Progress], None]:
        """`InnerLoop.run`'s progress hook (worker thread): journal the round when its cadence says so, once
        it has the steps an update needs."""
        cadence = self.journal.cadence()

        def progress(p: Progress) -> None:
            if p.steps >= min_steps and cadence.due():
                started = cadence.clock()
                losses = p.losses()
                self._write_journal(shift, self.loop.params, p.steps, p.seconds, float(np.mean(losses)))
                cadence.wrote(started)

        return progress

    def _write_journal(self, shift: BaseShift, local: Mapping[str, np.ndarray], steps: int, seconds: float,
                       mean_loss: float) -> None:
        """Worker thread: journal the round as it stands (Δ against the base it follows now)."""
        self.journal.write(InflightRound(
            run_id=self.settings.run_id, peer_id=self.stats.peer_id, round=self.stats.round + 1,
            base_slot=shift.applied_slot, steps=steps, tokens=steps * self.loop.tokens_per_batch, seconds=seconds,
            mean_loss=mean_loss, data_position=self.loop.batches.position,
            started_at=self._round_started_at,
            delta=make_delta(shift.applied, local)))

    async def recover(self, inflight: InflightRound) -> bool:
        """Publish the round a previous process of this node had in flight when it ended (`node.outer.inflight`),
        as a late update from the base it followed: call once, after the state sync and before the first
        round. Its batches are not drawn again. Dropped (logged) for the reasons of `inflight.unpublishable`;
        kept for `recover_deferred` while its base is ahead of the replica. True if it was published."""
        own = await self.replica.updates_of(self.stats.peer_id)
        seqnos = [proof.seqno for m in own if (proof := self.replica.proofs.get(m.update_id)) is not None]
        why = unpublishable(inflight, slot=self.replica.slot, window=self.settings.window, own_seqnos=seqnos,
                            min_steps=math.ceil(MIN_ROUND_FRACTION * self.settings.inner_steps))
        self.journal.clear()  # a round in memory only from here: the new rounds journal to the same file
        if why is not None:
            return _dropped(inflight, why)
        if waits_for_base(inflight, self.replica.slot):
            self.deferred = inflight
            log.info("round %d of the previous process (%d steps in flight) waits for this replica to close its "
                     "base slot %d (now %d)", inflight.round, inflight.steps, inflight.base_slot, self.replica.slot)
            return False
        return await self._publish_recovered(inflight)

    async def recover_deferred(self) -> bool:
        """Between rounds: publish the previous process's round that `recover` kept, once the replica has closed
        its base slot (dropped, logged, if its base has left the window by then). True if it was published."""
        inflight = self.deferred
        if inflight is None or waits_for_base(inflight, self.replica.slot):
            return False
        self.deferred = None
        # the checks on own updates and steps passed in `recover`; this process's own rounds came after it
        why = unpublishable(inflight, slot=self.replica.slot, window=self.settings.window, own_seqnos=(),
                            min_steps=0)
        if why is not None:
            return _dropped(inflight, why)
        return await self._publish_recovered(inflight)

    async def _publish_recovered(self, inflight: InflightRound) -> bool:
        if self._past_end(self.replica.slot):
            return _dropped(inflight, f"the run has reached its last slot {self.end_slot}")
        self.loop.batches.seek(max(self.loop.batches.position, inflight.data_position))
        payload, norms = await trio.to_thread.run_sync(compress, self.feedback, dict(inflight.delta))
        try:
            signed, meta, _, outcome = await self._publish(payload, norms, inflight.base_slot, inflight.tokens,
                                                           inflight.steps)
        except OSError as exc:
            log.error("round %d of the previous process not published: %s", inflight.round, exc)
            self.feedback.reset()
            return False
        stats = self.stats
        stats.round += 1
        stats.updates_published += 1
        stats.contributed_step_seconds += inflight.seconds
        stats.recovered_rounds += 1
        stats.recovered_step_seconds += inflight.seconds
        stats.observe_round(inflight.steps, inflight.seconds, inflight.tokens, inflight.mean_loss)
        log.info("round %d recovered from the previous process: %d steps, loss %.4f, %.2f s; published %s "
                 "(base %d, slot %d): %s", stats.round, inflight.steps, inflight.mean_loss, inflight.seconds,
                 signed.message_id.hex()[:16], inflight.base_slot, meta.target_slot,
                 outcome.value if outcome else "refused")
        return True

    async def _publish(self, payload: bytes, norms: dict[str, float], base_slot: int, tokens: int, steps: int,
                       lap: Callable[[str], None] = lambda phase: None):
        """Sign and publish an update of this node (publish slot: the replica's now), and add it to the own
        ledger from its stored blob (kept mapped, not in memory). Returns (signed, meta, deltas, outcome).
        Raises OSError when the blob cannot be stored (a full disk: peers could not fetch it). `lap` is told
        when the "publish" and "ledger_add" phases end."""
        signed = await self.host.publish_update(
            payload, base_slot=base_slot, publish_slot=self.replica.slot, tokens=tokens, inner_steps=steps,
            codec=self.settings.compression, shapes=shapes_field(self.shapes))
        lap("publish")
        meta = update_meta(signed)
        stored = Payload(self.feedback.codec, map_blob(self.host.blob_path(signed.body.payload_sha256.hex())))
        stored_deltas = PayloadDeltas.measured(stored, self.shapes, norms)  # measured while compressing
        outcome, _ = await self.replica.add(meta, stored_deltas, stored, proof_of(signed))
        lap("ledger_add")
        await self._track(meta, signed)
        return signed, meta, stored_deltas, outcome

    async def _track(self, meta: UpdateMeta, signed) -> None:
        """After an own update was added: keep the proofs bounded by the window, and its blob for clean-up."""
        await self.replica.prune_proofs_to_window()
        self.blobs.hold(meta.target_slot, signed.body.payload_sha256.hex())

    async def _base(self, pending: PendingUpdate | None) -> tuple[int, dict[str, np.ndarray]]:
        """(slot, parameters) a round trains from: the global ones at that slot, minus this node's own
        update while that update's slot is open (`node.outer.rebase`: its own progress stands in for the slot's
        aggregate). The subtraction runs in a worker thread: it is a pass over every parameter."""
        slot, params = await self.replica.params_at()  # not `replica.slot` after: a close may come between
        if pending is not None and slot < pending.slot:
            await trio.to_thread.run_sync(_subtract, params, pending.delta)
        return slot, params

    async def _follow(self, shift: BaseShift, pending: PendingUpdate | None) -> None:
        """Trio side of `shift`: post the new base whenever a slot closes or a late update is folded in,
        until cancelled (the round's end)."""
        seen = (self.replica.slot, self.replica.outcomes[Outcome.FOLDED_LATE.value])
        while True:
            await self.replica.changed()
            now = (self.replica.slot, self.replica.outcomes[Outcome.FOLDED_LATE.value])
            if now != seen:
                seen = now
                slot, base = await self._base(pending)
                shift.post(base, slot)

    async def _train_through_close(self, shift: BaseShift, should_stop: ShouldStop, phases: dict[str, float],
                                   ) -> tuple[RoundResult, tuple[bytes, dict[str, float]] | None]:
        """Run the round in a worker thread while, on the trio side, the slot of the previous round's update
        is closed (`close_wait`) and the round follows the global parameters (`_follow`). If the slot is
        still open when the round ends, it is closed then (before this round's update is published)."""
        pending, self.pending = self.pending, None
        async with trio.open_nursery() as nursery:
            if pending is not None:
                nursery.start_soon(self.close_wait, pending.slot, pending.steps)
            nursery.start_soon(self._follow, shift, pending)
            outcome = await trio.to_thread.run_sync(self._train, shift, should_stop, phases)
            nursery.cancel_scope.cancel()
        if pending is not None and self.replica.slot < pending.slot and outcome[1] is not None:
            await self.replica.close_open("round end")
        return outcome

    def _interrupted(self, result: RoundResult, min_steps: int) -> bool:
        """Nothing to publish: no step, or a stop before the round had the steps an update needs. A stop
        after them publishes the round as it stands, like an adaptive round cut short: its steps are not
        lost with the process (the journal is for a kill, which leaves no time to publish)."""
        return result.steps == 0 or (self.stop_requested() and result.steps < min_steps)

    async def run_round(self) -> bool:
        """One round (see the module docstring). False if it was interrupted (nothing published)."""
        started = trio.current_time()
        phases: dict[str, float] = {}
        clock = _PhaseClock(phases)
        slot, base = await self._base(self.pending)
        shift = BaseShift(base, slot)
        self._round_started_at = self.host.now()
        clock.lap("round_start")
        round_start = phases["round_start"]  # the thread adds set_params to it
        should_stop = ShouldStop(self.stop_requested, self.chaos.slowdown, self._budget(),
                                 min_steps=math.ceil(MIN_ROUND_FRACTION * self.settings.inner_steps),
                                 ended=lambda: self._past_end(self.replica.slot))
        result, compressed = await self._train_through_close(shift, should_stop, phases)
        base_slot = shift.applied_slot
        clock.lap("train_hop")
        phases["inner_steps"] = result.seconds
        phases["train_hop"] -= result.seconds + phases["round_start"] - round_start + phases.get("compress", 0.0)
        if compressed is None:
            log.info("round %d interrupted after %d steps: not published", self.stats.round + 1, result.steps)
            return False
        payload, norms = compressed
        publish_slot = self.replica.slot
        if self._past_end(publish_slot):
            log.info("round %d (%d steps) not published: the run reached its last slot %d while it trained",
                     self.stats.round + 1, result.steps, self.end_slot)
            self.feedback.reset()
            return False
        if (signed := await self.chaos.publish_instead(payload, self.feedback.codec, base_slot, publish_slot)) is not None:
            outcome = await self._add_own(signed, as_codec_local(signed.body.codec))  # counted here as by every peer
            stored_deltas = PayloadDeltas.measured(Payload(self.feedback.codec, payload), self.shapes, norms)  # honest
            meta = update_meta(signed)
            clock.lap("publish")
            await self._track(meta, signed)
        else:
            try:
                signed, meta, stored_deltas, outcome = await self._publish(payload, norms, base_slot, result.tokens,
                                                                           result.steps, clock.lap)
            except OSError as exc:  # the blob could not be stored (a full disk): peers could not fetch it
                first = "update_blob" not in self.stats.disk_errors
                self.stats.disk_errors["update_blob"] = f"round {self.stats.round + 1} not published: {exc}"
                log.log(logging.ERROR if first else logging.DEBUG, "%s; training goes on and every round tries "
                        "again (logged once until it works)", self.stats.disk_errors["update_blob"])
                self.feedback.reset()  # its residual belongs to an update nobody will apply
                self.stats.observe_round(result.steps, result.seconds, result.tokens, result.mean_loss)  # trained
                return False
            if self.stats.disk_errors.pop("update_blob", None) is not None:
                log.warning("update blobs are written again: round %d published", self.stats.round + 1)
        self._count(result)
        self._last_target = meta.target_slot
        if self.stop_requested():  # the runtime hands it over to the peers before it leaves
            self.published_at_stop = signed.body.payload_sha256.hex()
        log.info("round %d: %d steps%s, loss %.4f, %.2f s; published %s (base %d, slot %d, %d bytes, blob %s): %s",
                 self.stats.round, result.steps, " (cut short by the stop)" if self.published_at_stop else "",
                 result.mean_loss, result.seconds, signed.message_id.hex()[:16],
                 base_slot, meta.target_slot, len(payload), signed.body.payload_sha256.hex()[:12],
                 outcome.value if outcome else "refused")
        honest = (payload, self.feedback.codec, result.tokens, result.steps)
        for extra in await self.chaos.after_publish(base_slot, publish_slot, honest):
            await self._add_own(extra, as_codec_local(extra.body.codec))
            self.blobs.hold(extra.body.publish_slot + 1, extra.body.payload_sha256.hex())
        if not self.last_round:  # closed while the next round trains (`_train_through_close`)
            # Its Δ is read once, when the next round's base subtracts it: decoded then from the mapped blob.
            self.pending = PendingUpdate(meta.target_slot, result.steps, stored_deltas)
        elapsed = trio.current_time() - started
        overhead = max(0.0, elapsed - result.seconds)
        self._published_here += 1
        if self._published_here > 1:
            # Not the process's first round: that one also waits out start-up (compiling, the first
            # evaluation, catching up after a state sync: seconds), and as the overhead of every round it
            # would cut the next rounds to their minimum of steps, each one a slot (measured after a
            # restart with a wiped checkpoint directory: five 2-step rounds, the survivors' loss +15%).
            self.overhead_s = overhead if self.overhead_s is None else 0.7 * self.overhead_s + 0.3 * overhead
        self.stats.time_s.update(phases)
        log.info("round %d timing: %s", self.stats.round, " ".join(f"{k} {v:.3f}" for k, v in phases.items()))
        return True

    async def _add_own(self, signed, codec: Codec) -> Outcome | None:
        """Add an update this node published besides or instead of its round's (`RoundChaos`) from its stored
        blob, as every peer does; a refusal (e.g. poison:tokens' claim, refused here as by every peer) is logged."""
        meta = update_meta(signed)
        stored = Payload(codec, map_blob(self.host.blob_path(signed.body.payload_sha256.hex())))
        try:
            outcome, _ = await self.replica.add(meta, PayloadDeltas(stored, self.shapes), stored, proof_of(signed))
        except RemoteProtocolError as exc:
            log.warning("chaos: own update %s refused here too: %s", meta.update_id.hex()[:16], exc)
            return None
        return outcome

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
        """Wait until slot `target` is closed: by catch-up, or here when the policy says so. The grace
        window is only waited out while a peer's update may still land in it (`PeerRoundClock.due`):
        with none due, or all due ones in, the slot closes at once."""
        done_at, offset = trio.current_time(), self.host.now() - trio.current_time()
        until = offset + done_at + self.policy.hold_seconds() + self.policy.transfer_ema  # Unix time
        while self.replica.slot < target and not self.stop_requested():
            now = trio.current_time()
            in_slot = self.replica.open_count
            expected = in_slot + self.peer_clock.due(offset + now, until)  # no peer due: close at once
            decision = self.policy.decide(now=now, round_done_at=done_at, updates_in_slot=in_slot,
                                          inner_steps=steps, expected_updates=max(1, expected))
            if decision.close:
                await self.replica.close_open(decision.why)
                self.policy.observe_sync(trio.current_time() - now)
                break
            await self.wait_change(decision.wake_at)

"""Peers' updates into the ledger: the node's intake (`Intake.run`, one trio task for the node's life).

Every verified message from the overlay (`p2p.Host.inbox`): a goodbye is logged; an update's payload is
decoded in a worker thread and added to the replica, which places it (open slot, late fold, stale, held
for the future, ...). Each added update feeds the slot-close policy's transfer time and the peers' round
clock, and its payload blob is held for the clean-up. A refused one is counted by reason. Two outcomes
reach outside: an update placed differently than its origin placed it (stale) asks for a comparison with
that origin right away (`compare`, the fork choice), and updates of two origins (or of every peer, if fewer)
refused as too far ahead set `resync`, which the runtime reads between rounds to sync the state again — two,
so that one signed header that jumps ahead cannot send a node to download the whole state (the quorum of
the catch-up rule). trio thread only.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from node.outer.peerclock import PeerRoundClock
from node.outer.parts import NodeParts
from node.outer.updates import decode_update, update_meta
from p2p import Delivery
from protocol.errors import Reason, RemoteProtocolError
from protocol.ledger import Outcome
from protocol.ledger.proof import proof_of
from protocol.messages import Goodbye, UpdateHeader

__all__ = ["Intake"]

log = logging.getLogger("node.outer.intake")


class Intake:
    """See the module docstring."""

    def __init__(self, parts: NodeParts, *, peer_clock: PeerRoundClock, compare: Callable[[str], None]) -> None:
        """``peer_clock``: the rounds' clock of peers' rounds; ``compare(origin)``: start a comparison with it."""
        self.host, self.replica, self.shapes, self.stats = parts.host, parts.replica, parts.shapes, parts.stats
        self.policy, self.blobs, self.inner_steps = parts.policy, parts.blobs, parts.settings.inner_steps
        self.peer_clock, self.compare = peer_clock, compare
        self.resync = False  # set when peers' updates are too far ahead to hold; the runtime clears it
        self._far_ahead: set[str] = set()  # origins of updates refused as too far ahead since the last resync

    async def run(self) -> None:
        """Add every verified update from the overlay to the ledger, until cancelled."""
        async for delivery in self.host.inbox:
            body = delivery.body
            if isinstance(body, Goodbye):
                log.info("goodbye from %s: %s", body.origin, body.reason)
            elif isinstance(body, UpdateHeader):
                await self.add(delivery)

    async def add(self, delivery: Delivery) -> None:
        header: UpdateHeader = delivery.body
        meta = update_meta(delivery.message)
        try:
            deltas, payload = await trio.to_thread.run_sync(decode_update, header, delivery.blob, self.shapes)
            outcome, closed = await self.replica.add(meta, deltas, payload, proof_of(delivery.message))
        except FileNotFoundError:  # the blob clean-up removed its payload first (a slot that left the window)
            log.info("update %s from %s: its payload was removed before it was read; skipped",
                     meta.update_id.hex()[:16], header.origin)
            return
        except RemoteProtocolError as exc:
            self.stats.rejections[exc.reason.value] += 1
            log.warning("refused update %s from %s (via %s): %s", meta.update_id.hex()[:16], header.origin,
                        delivery.source, exc)
            if exc.reason is Reason.BAD_SLOT and meta.target_slot > self.replica.slot:  # too far behind
                self._far_ahead.add(header.origin)
                if len(self._far_ahead) >= min(2, max(1, len(self.host.connected_peers()))):
                    self.resync, self._far_ahead = True, set()
            return
        now = self.host.now()
        self.policy.observe_transfer(min(60.0, max(0.0, now - header.seqno / 1e6)))
        self.peer_clock.observe(header.origin, header.seqno / 1e6, header.inner_steps, self.inner_steps)
        self.blobs.hold(meta.target_slot, header.payload_sha256.hex())
        stale = outcome in (Outcome.APPLIED_STALE, Outcome.DROPPED_STALE)
        loud = stale or outcome is Outcome.DROPPED_SURPLUS  # placed unlike its origin did, or a flood
        log.log(logging.WARNING if loud else logging.INFO, "update %s from %s (base %d, slot %d, %d steps): %s%s",
                meta.update_id.hex()[:16], header.origin, header.base_slot, meta.target_slot, header.inner_steps,
                outcome.value, f"; caught up to slot {self.replica.slot}" if closed else "")
        if stale:  # our placement of it now differs from its origin's: compare (fork choice) right away
            self.compare(header.origin)

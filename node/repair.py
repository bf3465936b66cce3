"""Anti-entropy: pull the updates a peer holds and this node missed (a partition, a crash of the only
other holder, gossip that gave up), from the peer's state snapshot, which carries every update of its
window with its deltas.

`pull_missing` adds each update of the snapshot that this replica has not seen, through the ordinary
`Replica.add` (so it lands in its own slot: folded late, held, or in the open slot, exactly as if gossip
had delivered it). An update whose slot is already below this replica's window cannot be folded exactly
any more; it is skipped and counted (`too_stale`), since applying it at the open slot would make this
replica differ from the peer's anyway.

When it runs (`node.runtime`): at the end of a run, when a draining peer keeps announcing another set of
updates for a few heartbeats; and between rounds, after a peer that had been disconnected comes back.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import httpx
import trio

from node.join import LEDGER_BLOB, PeerSyncing, fetch_manifest
from node.replica import Replica
from p2p import Host, TransportError
from protocol.errors import Reason, RemoteProtocolError
from protocol.ledger import LedgerSnapshot

__all__ = ["RepairResult", "pull_missing"]

log = logging.getLogger("node.repair")


@dataclass(frozen=True)
class RepairResult:
    added: int  # updates this replica had missed, now added
    too_stale: int  # missed, but below the window: skipped


async def pull_missing(host: Host, replica: Replica, run_id: str, peer: str, http_addr: str) -> RepairResult | None:
    """Add every update `peer`'s snapshot holds that `replica` has not seen. None if the peer's state
    could not be fetched or verified (logged; a bad one is counted against the peer)."""
    async with httpx.AsyncClient(timeout=httpx.Timeout(30.0, connect=5.0)) as client:
        try:
            manifest = await fetch_manifest(client, host, run_id, peer, http_addr)
        except PeerSyncing:
            manifest = None
    if manifest is None:
        return None
    refs = {name: (sha.hex(), size) for name, sha, size in manifest.blobs}
    if LEDGER_BLOB not in refs:
        host.counters.rejected(peer, Reason.BAD_STATE)
        return None
    blob, size = refs[LEDGER_BLOB]
    try:
        path = await host.fetch_blob(blob, size, [peer])
        snap = await trio.to_thread.run_sync(lambda: LedgerSnapshot.from_bytes(path.read_bytes()))
        if dict(snap.shapes) != dict(replica.shapes):
            raise RemoteProtocolError(Reason.BAD_STATE, "snapshot of another model")
    except TransportError as exc:
        log.info("repair from %s: %s", peer, exc)
        return None
    except RemoteProtocolError as exc:
        log.warning("repair from %s: refused its snapshot: %s", peer, exc)
        host.counters.rejected(peer, exc.reason)
        return None
    finally:
        host.store.remove(blob)
        host.router.forget_blob(blob)
    added = stale = 0
    for entry in sorted(snap.entries, key=lambda e: (e.meta.target_slot, e.meta.update_id)):
        if replica.has_seen(entry.meta.update_id):
            continue
        if entry.meta.target_slot <= replica.base_slot:
            stale += 1
            continue
        try:
            await replica.add(entry.meta, dict(entry.deltas))
        except RemoteProtocolError as exc:
            log.warning("repair from %s: update %s refused: %s", peer, entry.meta.update_id.hex()[:16], exc)
            continue
        added += 1
    level = logging.WARNING if stale else logging.INFO
    log.log(level, "repair from %s (its slot %d): %d missed updates added, %d too old for the window", peer,
            manifest.slot, added, stale)
    return RepairResult(added, stale)

"""Anti-entropy and fork choice: reconcile this replica with a peer's state snapshot (which carries every
update of the peer's window with its deltas, its seen ids and the totals of its finalized slots).

`pull_missing` compares the two states with `protocol.ledger.reconcile` (the rule is written there):

- compatible (the usual case: the peer only holds updates this replica missed, within the window):
  every such update is added through the ordinary `Replica.add`, so it lands in its own slot (folded
  late, held, or in the open slot) exactly as if gossip had delivered it; ids the peer saw but never
  applied are marked seen here too;
- forked, and this state is heavier: the same, for the peer's updates this replica can place at their
  target slot; the rest of the peer's ids are marked seen without being applied (orphaned, counted);
- forked, and the peer's state is heavier: its snapshot is loaded and checked against the peer's signed
  manifest, and proposed to the replica, which adopts it between rounds (`Replica.adopt_pending`).

After a fork in which ours is heavier, the peer is sent a fork hint (`node.forkhint`), so that it compares
with us too and gives way; otherwise only the side that noticed the fork would know of it.

When it runs (`node.runtime`, one comparison per peer at a time): at the end of a run, when a draining
peer keeps announcing another agreement hash for a few heartbeats; between rounds, after a peer that had
been disconnected comes back (a healed partition, a restart), with a peer whose state forked from ours
at the last comparison, and with a peer that sent a fork hint; and at once with the origin of a gossip
update that arrived after its slot left our window (applied stale or dropped: our history now differs
from the origin's).

The snapshot blob is fetched for this one use and removed again, unless this node held it already
(`node.join.read_peer_blob`: equal states can have equal snapshot bytes, and that blob is then our own
served snapshot).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import httpx
import trio

from node.forkhint import send_fork_hint
from node.join import LEDGER_BLOB, PeerSyncing, fetch_manifest, read_peer_blob
from node.replica import Proposal, Replica
from p2p import Host, TransportError
from protocol.errors import Reason, RemoteProtocolError
from protocol.ledger import Ledger, LedgerSnapshot, LedgerView, reconcile
from protocol.messages import StateManifest

__all__ = ["RepairResult", "pull_missing"]

log = logging.getLogger("node.repair")


@dataclass(frozen=True)
class RepairResult:
    added: int  # updates this replica had missed, now added
    too_stale: int  # the peer's updates this replica cannot place at their slot (orphaned, or it adopts)
    ignored: int = 0  # the peer's ids marked seen here without being applied
    fork: str = "none"  # "none" (compatible), "kept" (ours is heavier) or "adopt" (theirs is, proposed)


async def _fetch_snapshot(host: Host, run_id: str, peer: str, http_addr: str,
                          shapes: dict) -> tuple[StateManifest, LedgerSnapshot, LedgerView] | None:
    """`peer`'s verified manifest, its snapshot and the snapshot's view (whose ledger digest must be the
    manifest's), or None (logged; a bad one is counted against the peer)."""
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

    def decode(data: bytes) -> tuple[LedgerSnapshot, LedgerView]:
        snap = LedgerSnapshot.from_bytes(data)
        if dict(snap.shapes) != shapes:
            raise RemoteProtocolError(Reason.BAD_STATE, "snapshot of another model")
        view = LedgerView.of_snapshot(snap)
        if view.ledger_digest() != manifest.ledger_digest:
            raise RemoteProtocolError(Reason.BAD_STATE, "snapshot does not match the manifest's ledger digest")
        return snap, view

    try:
        data = await read_peer_blob(host, blob, size, peer)
        snap, view = await trio.to_thread.run_sync(decode, data)
    except TransportError as exc:
        log.info("repair from %s: %s", peer, exc)
        return None
    except RemoteProtocolError as exc:
        log.warning("repair from %s: refused its snapshot: %s", peer, exc)
        host.counters.rejected(peer, exc.reason)
        return None
    return manifest, snap, view


def _load(snap: LedgerSnapshot, manifest: StateManifest, replica: Replica) -> Ledger:
    ledger = Ledger.from_snapshot(snap, replica.config, replica.shapes, bottom=replica.bottom_store)
    if ledger.ledger_digest() != manifest.ledger_digest or ledger.params_digest() != manifest.params_digest:
        raise RemoteProtocolError(Reason.BAD_STATE, "loaded state does not match the manifest's digests")
    return ledger


def _key(key: tuple[int, int, bytes]) -> str:
    return f"{key[0]} tokens, placement sum {key[1]:x}"[:48] + "…"


async def pull_missing(host: Host, replica: Replica, run_id: str, peer: str, http_addr: str) -> RepairResult | None:
    """Reconcile `replica` with `peer`'s state (see the module docstring). None if the peer's state could
    not be fetched or verified (logged; a bad one is counted against the peer)."""
    fetched = await _fetch_snapshot(host, run_id, peer, http_addr, dict(replica.shapes))
    if fetched is None:
        return None
    manifest, snap, theirs = fetched
    ours = await replica.view()
    verdict = reconcile(ours, theirs)
    if verdict.compatible:
        replica.forked_with.discard(peer)
    else:
        replica.forked_with.add(peer)  # compare again next round, until compatible
    unplaced = sum(1 for e in theirs.entries if e.update_id not in ours.seen) - len(verdict.pull)
    if verdict.adopt:
        try:
            ledger = await trio.to_thread.run_sync(_load, snap, manifest, replica)
        except RemoteProtocolError as exc:
            log.warning("repair from %s: refused its state: %s", peer, exc)
            host.counters.rejected(peer, exc.reason)
            return None
        ours_key, theirs_key = verdict.keys
        why = f"fork: theirs {_key(theirs_key)} > ours {_key(ours_key)}"
        replica.propose(Proposal.of(ledger, peer, why, theirs))
        log.warning("repair from %s (its slot %d): histories forked and its state is heavier (%s vs %s): "
                    "adopting it before the next round", peer, manifest.slot, _key(theirs_key), _key(ours_key))
        return RepairResult(0, unplaced, fork="adopt")
    entries = {e.meta.update_id: e for e in snap.entries}
    added = 0
    for update_id in verdict.pull:
        entry = entries[update_id]
        if replica.has_seen(update_id):
            continue
        try:
            await replica.add(entry.meta, dict(entry.deltas), entry.payload)
        except RemoteProtocolError as exc:
            log.warning("repair from %s: update %s refused: %s", peer, update_id.hex()[:16], exc)
            continue
        added += 1
    ignored = await replica.ignore(verdict.drop)
    if verdict.compatible:
        log.info("repair from %s (its slot %d): %d missed updates added, %d ids it never applied marked seen",
                 peer, manifest.slot, added, ignored)
        return RepairResult(added, 0, ignored, "none")
    ours_key, theirs_key = verdict.keys
    log.warning("repair from %s (its slot %d): histories forked and ours is heavier (%s vs %s): keeping ours; "
                "%d of its updates added, %d of its ids orphaned; asking it to compare with us", peer,
                manifest.slot, _key(ours_key), _key(theirs_key), added, ignored)
    await send_fork_hint(http_addr, host.peer_id)  # the lighter side must adopt ours (node.forkhint)
    return RepairResult(added, unplaced, ignored, "kept")

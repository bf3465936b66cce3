"""Anti-entropy and fork choice: reconcile this replica with a peer's state (its meta lists every update
of the peer's window with its payload blob, its seen ids and the totals of its finalized slots).

`pull_missing` compares the two states with `protocol.ledger.reconcile` (the rule is written there):

- compatible (the usual case: the peer only holds updates this replica missed, within the window):
  every such update is added through the ordinary `Replica.add`, so it lands in its own slot (folded
  late, held, or in the open slot) exactly as if gossip had delivered it; ids the peer saw but never
  applied are marked seen here too;
- forked, and this state is heavier: the same, for the peer's updates this replica can place at their
  target slot; the rest of the peer's ids are marked seen without being applied (orphaned, counted);
- forked, and the peer's state is heavier: its snapshot is loaded and checked against the peer's signed
  manifest, and proposed to the replica, which adopts it between rounds (`Replica.adopt_pending`) unless
  its model is worse than ours (`node.outer.upkeep.BetweenRounds.vet`). Not downloaded at all from a peer
  the replica's `ForkGuard` holds off (`node.outer.forkguard`): one whose state a vet refused lately, or
  one adopted from lately, unless another connected peer vouches for the same state (signs a manifest of
  the same slot and ledger digest; the state is then downloaded from all of them). One
  such download at a time (`Replica.state_download`): comparisons with several peers run at once, and two
  whole-state downloads would cost twice the disk and bandwidth (at 10⁹ parameters, ~10 GB each). The one
  that waited downloads only if its peer's state is heavier than the state proposed meanwhile, and a peer
  whose state is proposed already is not downloaded from again until that proposal is adopted or refused.

After a fork in which ours is heavier, the peer is sent a fork hint (`node.sync.forkhint`), so that it compares
with us too and gives way; otherwise only the side that noticed the fork would know of it.

When it runs (`node.runtime`, one comparison per peer at a time): at the end of a run, when a draining
peer keeps announcing another agreement hash for a few heartbeats; between rounds, after a peer that had
been disconnected comes back (a healed partition, a restart), with a peer whose state forked from ours
at the last comparison, and with a peer that sent a fork hint; and at once with the origin of a gossip
update that arrived after its slot left our window (applied stale or dropped: our history now differs
from the origin's).

What is fetched (`node.sync.statefetch`): the peer's meta (its state without arrays and payload bytes,
verified against its signed manifest) to compare; then only the payload blobs of the updates to add
(handed back in `RepairResult.payloads` for the node's blob clean-up), or, to adopt, the whole state
(the bottom in verified pieces). The meta blob is removed again unless this node held it already.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import httpx
import trio

from node.sync.forkhint import send_fork_hint
from node.sync.join import PeerSyncing, fetch_manifest, fetch_manifests
from node.outer.outer_files import drop_pages, map_blob
from node.outer.replica import Proposal, Replica
from node.sync.statefetch import download_state, fetch_meta, fetch_payloads
from p2p import Host, TransportError
from protocol.errors import RemoteProtocolError
from protocol.ledger import LedgerView, Payload, reconcile
from protocol.ledger.payload import decode_snapshot_payload
from protocol.ledger.statesync import MetaEntry, StateMeta
from protocol.messages import StateManifest

__all__ = ["RepairResult", "pull_missing"]

log = logging.getLogger("node.sync.repair")


@dataclass(frozen=True)
class RepairResult:
    added: int  # updates this replica had missed, now added
    too_stale: int  # the peer's updates this replica cannot place at their slot (orphaned, or it adopts)
    ignored: int = 0  # the peer's ids marked seen here without being applied
    fork: str = "none"  # "none" (compatible), "kept" (ours is heavier), "adopt" (theirs is, proposed) or
    # "refused" (theirs is, but a state of that peer was refused before, or adopted recently: not downloaded)
    payloads: tuple[tuple[int, str], ...] = ()  # (target slot, blob) fetched into the store, for clean-up


async def _fetch_meta(host: Host, replica: Replica, run_id: str, peer: str,
                      http_addr: str) -> tuple[StateManifest, StateMeta, LedgerView] | None:
    """`peer`'s verified manifest, its verified meta and the meta's view, or None (logged; a bad one is
    counted against the peer)."""
    async with host.http_client(httpx.Timeout(30.0, connect=5.0)) as client:
        try:
            manifest = await fetch_manifest(client, host, run_id, peer, http_addr)
        except PeerSyncing:
            manifest = None
    if manifest is None:
        return None
    try:
        meta = await fetch_meta(host, manifest, replica.config, replica.shapes)
    except TransportError as exc:
        log.info("repair from %s: %s", peer, exc)
        return None
    except RemoteProtocolError as exc:
        log.warning("repair from %s: refused its state meta: %s", peer, exc)
        host.counters.rejected(peer, exc.reason)
        return None
    return manifest, meta, meta.view()


def _decode(entry: MetaEntry, path: Path, shapes: dict) -> tuple[dict, Payload]:
    """An entry's float32 deltas and payload from its fetched blob (blocking)."""
    data = map_blob(path)
    payload, deltas = decode_snapshot_payload(str(entry.codec), data, shapes)
    out = dict(deltas)
    drop_pages(data)
    return out, payload


async def _add_pulled(host: Host, replica: Replica, peer: str, meta: StateMeta,
                      pull: list[bytes]) -> tuple[int, tuple[tuple[int, str], ...]]:
    """Fetch the payloads of the `pull` ids from `peer` (or any peer) and add them; (added, fetched)."""
    entries = {e.meta.update_id: e for e in meta.entries}
    wanted = [entries[i] for i in pull if not replica.has_seen(i)]
    if not wanted:
        return 0, ()
    added = 0
    with host.kept_blobs(e.blob for e in wanted):  # readable until each is decoded (mapped)
        try:
            paths, fetched = await fetch_payloads(host, wanted, [peer, *(p for p in host.connected_peers()
                                                                         if p != peer)])
        except TransportError as exc:
            log.info("repair from %s: %s", peer, exc)
            return 0, ()
        for entry in wanted:
            if replica.has_seen(entry.meta.update_id):
                continue
            try:
                deltas, payload = await trio.to_thread.run_sync(_decode, entry, paths[entry.blob],
                                                                dict(replica.shapes))
                await replica.add(entry.meta, deltas, payload, entry.proof)  # checked with the meta (fetch_meta)
            except RemoteProtocolError as exc:
                log.warning("repair from %s: update %s refused: %s", peer, entry.meta.update_id.hex()[:16], exc)
                continue
            added += 1
    return added, tuple(sorted({(e.meta.target_slot, e.blob) for e in wanted if e.blob in fetched}))


async def _vouchers(host: Host, replica: Replica, run_id: str, manifest: StateManifest) -> list[StateManifest]:
    """The verified manifests of the other connected peers (none held off for a refused state) that sign
    the state of `manifest`: the same slot and ledger digest (which covers the whole state)."""
    async with host.http_client(httpx.Timeout(30.0, connect=5.0)) as client:
        manifests, _ = await fetch_manifests(client, host, run_id)
    return [m for m in manifests if m.origin != manifest.origin and not replica.guard.refused_recently(m.origin)
            and (m.slot, m.ledger_digest) == (manifest.slot, manifest.ledger_digest)]


def _key(key: tuple[int, int, bytes]) -> str:
    return f"{key[0]} tokens, placement sum {key[1]:x}"[:48] + "…"


async def pull_missing(host: Host, replica: Replica, run_id: str, peer: str, http_addr: str) -> RepairResult | None:
    """Reconcile `replica` with `peer`'s state (see the module docstring). None if the peer's state could
    not be fetched or verified (logged; a bad one is counted against the peer)."""
    fetched = await _fetch_meta(host, replica, run_id, peer, http_addr)
    if fetched is None:
        return None
    manifest, meta, theirs = fetched
    ours = await replica.view()
    verdict = reconcile(ours, theirs)
    if verdict.compatible:
        replica.forked_with.discard(peer)
    else:
        replica.forked_with.add(peer)  # compare again next round, until compatible
    unplaced = sum(1 for e in theirs.entries if e.update_id not in ours.seen) - len(verdict.pull)
    vouchers: list[StateManifest] = []
    if verdict.adopt and replica.guard.holds_off(peer) is not None:
        if replica.guard.holds_off(peer, vouched=True) is None:  # a vouch would lift it: does a second peer?
            vouchers = await _vouchers(host, replica, run_id, manifest)
        held_off = replica.guard.holds_off(peer, vouched=bool(vouchers))
        if held_off is not None:
            log.log(logging.INFO if replica.guard.refused_recently(peer) else logging.WARNING,
                    "repair from %s: its state is heavier, but %s: not downloading it", peer, held_off)
            return RepairResult(0, unplaced, fork="refused")
        log.info("repair from %s: a state of it was adopted lately, and %s sign this one too", peer,
                 [m.origin for m in vouchers])
    if verdict.adopt:
        async with replica.state_download:
            pending = replica.pending
            if pending is not None and pending.origin == peer:  # one of its states waits for the next round
                log.info("repair from %s: a state of it is already proposed (adopted or refused between rounds): "
                         "not downloading another", peer)
                return RepairResult(0, unplaced, fork="adopt")
            if pending is not None and not reconcile(pending.view, theirs).adopt:
                log.info("repair from %s: the state proposed meanwhile (from %s) is at least as heavy as its own: "
                         "not downloading it", peer, pending.origin)
                return RepairResult(0, unplaced, fork="adopt")
            try:
                loaded = await download_state(host, [manifest, *vouchers], replica.config, replica.shapes,
                                              replica.bottom_store)
            except (TransportError, OSError) as exc:  # a refused state is counted and logged by download_state
                log.warning("repair from %s: could not load its state: %s", peer, exc)
                return None
        ledger = loaded.ledger
        ours_key, theirs_key = verdict.keys
        why = f"fork: theirs {_key(theirs_key)} > ours {_key(ours_key)}"
        replica.propose(Proposal.of(ledger, peer, why, theirs, loaded.proofs(), vouched=bool(vouchers)))
        log.warning("repair from %s (its slot %d): histories forked and its state is heavier (%s vs %s): "
                    "adopting it before the next round", peer, manifest.slot, _key(theirs_key), _key(ours_key))
        return RepairResult(0, unplaced, fork="adopt", payloads=tuple(loaded.fetched_payloads()))
    added, payloads = await _add_pulled(host, replica, peer, meta, list(verdict.pull))
    ignored = await replica.ignore(verdict.drop)
    if verdict.compatible:
        log.info("repair from %s (its slot %d): %d missed updates added, %d ids it never applied marked seen",
                 peer, manifest.slot, added, ignored)
        return RepairResult(added, 0, ignored, "none", payloads)
    ours_key, theirs_key = verdict.keys
    log.warning("repair from %s (its slot %d): histories forked and ours is heavier (%s vs %s): keeping ours; "
                "%d of its updates added, %d of its ids orphaned; asking it to compare with us", peer,
                manifest.slot, _key(ours_key), _key(theirs_key), added, ignored)
    await send_fork_hint(host, http_addr)  # the lighter side must adopt ours (node.sync.forkhint)
    return RepairResult(added, unplaced, ignored, "kept", payloads)

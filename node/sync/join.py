"""State sync: joining from other nodes' states (serving them: `node.sync.stateserve`).

Serving (`node.sync.stateserve.StateServer`). `GET /state` answers the canonical bytes of this node's latest
signed `StateManifest` (run id, origin, slot, ledger and params digests, and one blob, `meta`: the state
without its arrays and payload bytes, with the piece index of the window bottom). The bottom is served
piece by piece (`GET /state/bottom/<bottom digest>/<piece>`), the window's payloads as blobs. 503 while
this node has no state. The formats and checks are PROTOCOL.md's "State sync".

Joining (`sync_state`). Ask every connected peer for its manifest (each one is verified like a gossiped
message: schema, run id, signature, and its origin must be the peer asked), then `choose`: the freshest
state confirmed by two peers (same slot, same ledger and params digests); else the freshest one, with a
logged warning; a state one of the user's own bootstrap peers (`--peers`) vouches for before any other
(fresh keys cost nothing in an open run: two of them could confirm a forged fresher state). Download it with `node.sync.statefetch.download_state`: the meta from one vouching donor (the
next if it fails or does not verify against its manifest), the bottom's pieces from *all* of them in
parallel, each piece checked against the signed params digest's hash tree before it is written to disk
(a donor that dies mid-way costs only its in-flight pieces; one that sends a bad piece is refused with
`bad_chunk` and dropped; verified pieces survive for the next attempt), the payloads from any peer. The
loaded ledger's digests must equal the manifest's (`bad_state` if not, and the next candidate is
tried). A node whose own state is as fresh keeps it.

A state is then vetted (`vet`, the runtime's: its model against the node's own on its held-out batches):
a state refused there is not taken, and the peers that served it are not asked again during this join for a
state of that slot or older (`SyncResult.refused`): a fresher one is vetted again, since an honest run's early
state can be worse than a fresh model (one outer step of a node alone can overshoot) and its next slots are
not. So a forging peer costs at most one download per slot the run advances. Its weight and its slot are the
donors' word, its parameters only hash to what they signed, so a peer could otherwise hand a joiner garbage
parameters with the freshest claim.

A node given bootstrap peers never starts a run of its own: while no peer is connected (a wrong or not
yet started `--peers` address) it keeps waiting, its dials retried with backoff and each failure logged
(`p2p.Host.dial_failures`); what it waits for is in `/status` (`waiting_for`). Only when every connected
peer is waiting too (a run whose nodes all start or restart at once) do they start from their own states.
"""

from __future__ import annotations

import logging
from collections import defaultdict
import math
from collections.abc import Awaitable, Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field

import httpx
import trio

from node.sync.statefetch import PieceHook, download_state
from node.sync.stateserve import STATE_PATH, StateServer
from p2p import Host, TransportError
from protocol.errors import Reason, RemoteProtocolError
from protocol.ledger import BottomStore, Ledger, LedgerConfig
from protocol.ledger.proof import UpdateProof
from protocol.messages import Signed, StateManifest
from protocol.validation import Validator

__all__ = ["Choice", "NoPeerState", "PeerSyncing", "StateServer", "StateVet", "SyncResult", "bootstrap_peers",
           "choose", "fetch_manifest", "fetch_manifests", "sync_state"]

log = logging.getLogger("node.sync.join")


@dataclass(frozen=True)
class Choice:
    """Manifests of one state (same slot and digests), one per origin: its donors. Meta bytes may differ
    between origins (they carry per-replica counters), so each origin's meta is fetched from that origin;
    the bottom's pieces are the same bytes on every donor."""

    manifests: tuple[StateManifest, ...]

    @property
    def manifest(self) -> StateManifest:
        return self.manifests[0]

    @property
    def confirmed_by(self) -> tuple[str, ...]:
        return tuple(m.origin for m in self.manifests)

    @property
    def confirmed(self) -> bool:
        return len(self.confirmed_by) >= 2


def choose(manifests: Sequence[StateManifest], bootstrap: Collection[str] = ()) -> list[Choice]:
    """Candidates, best first: states a `bootstrap` peer (one the user named) vouches for, then confirmed
    states (two or more origins agree on slot and both digests) before unconfirmed ones, then by slot
    (freshest first), then by number of confirmations. Keys are free in an open run: two fresh ones can
    confirm a fresher forged state, but not make the user's own bootstrap peer sign it."""
    groups: dict[tuple[int, bytes, bytes], dict[str, StateManifest]] = defaultdict(dict)
    for m in manifests:
        groups[(m.slot, m.ledger_digest, m.params_digest)].setdefault(m.origin, m)
    choices = [Choice(tuple(ms[o] for o in sorted(ms))) for ms in groups.values()]
    return sorted(choices, key=lambda c: (not set(c.confirmed_by) & set(bootstrap), not c.confirmed,
                                          -c.manifest.slot, -len(c.confirmed_by), c.manifest.ledger_digest))


def bootstrap_peers(host: Host) -> set[str]:
    """The connected peers at an address the user gave (`--peers`: the host's bootstrap list), by the gossip
    address they advertise."""
    given = set(host.config.bootstrap)
    return {p.peer_id for p in host.peers() if p.gossip_addr in given}


class NoPeerState(Exception):
    """No usable peer state within the sync timeout."""


class PeerSyncing(Exception):
    """The peer has no state to give yet (it is syncing itself): HTTP 503 on `/state`."""


async def fetch_manifest(client: httpx.AsyncClient, host: Host, run_id: str, peer: str,
                         http_addr: str) -> StateManifest | None:
    """`peer`'s verified manifest (schema, run id, signature, origin = `peer`), or None (logged).
    Raises `PeerSyncing` if the peer answers that it has no state yet."""
    try:
        response = await client.get(f"{host.peer_url(http_addr)}{STATE_PATH}")
    except httpx.HTTPError as exc:
        log.info("state of %s: %s", peer, exc)
        return None
    if response.status_code == 503:
        raise PeerSyncing(peer)
    if response.status_code != 200:
        log.info("state of %s: HTTP %d", peer, response.status_code)
        return None
    try:
        message = Validator(run_id).validate(response.content, host.now())
        if not isinstance(message, Signed) or not isinstance(message.body, StateManifest):
            raise RemoteProtocolError(Reason.BAD_STATE, "not a state manifest")
        if message.origin != peer:
            raise RemoteProtocolError(Reason.BAD_IDENTITY, f"manifest signed by {message.origin}")
    except RemoteProtocolError as exc:
        log.warning("refused the state manifest of %s: %s", peer, exc)
        host.counters.rejected(peer, exc.reason)
        return None
    return message.body


async def fetch_manifests(client: httpx.AsyncClient, host: Host, run_id: str) -> tuple[list[StateManifest], bool]:
    """The verified manifests of every connected peer that answers `GET /state` (others are skipped),
    and whether at least one peer was asked and every one answered that it is syncing itself."""
    out: list[StateManifest] = []
    asked = [p for p in host.peers() if p.http_addr]
    syncing: list[str] = []

    async def one(peer: str, http_addr: str) -> None:
        try:
            manifest = await fetch_manifest(client, host, run_id, peer, http_addr)
        except PeerSyncing:
            log.info("state of %s: it is syncing too", peer)
            syncing.append(peer)
            return
        if manifest is not None:
            out.append(manifest)

    async with trio.open_nursery() as nursery:
        for p in asked:
            nursery.start_soon(one, p.peer_id, p.http_addr)
    return out, bool(asked) and len(syncing) == len(asked)


@dataclass(frozen=True)
class SyncResult:
    """The state taken: its ledger, its seen ids, the candidate it came from, and the payload blobs the
    download added to the store, as (target slot, blob), for the node's blob clean-up."""

    ledger: Ledger
    seen: tuple[bytes, ...]
    choice: Choice
    payloads: tuple[tuple[int, str], ...] = ()
    proofs: Mapping[bytes, UpdateProof] = field(default_factory=dict)  # its entries' (checked)
    refused: frozenset[str] = frozenset()  # peers whose states the vet refused during this join


StateVet = Callable[[Choice, Ledger], Awaitable[bool]]  # whether the downloaded state may be taken


async def sync_state(host: Host, run_id: str, config: LedgerConfig, shapes: Mapping[str, tuple[int, ...]], *,
                     own: tuple[int, bytes] | None, timeout_s: float | None, retry_s: float,
                     bottom: BottomStore | None = None,
                     waiting: Callable[[str | None], None] = lambda what: None,
                     on_piece: PieceHook | None = None, vet: StateVet | None = None,
                     bootstrap: Callable[[], Collection[str]] = frozenset) -> SyncResult | None:
    """Join: the best peer state, loaded and verified, or None to keep `own` = (slot, ledger digest):
    no peer is fresher than ours, every connected peer asked three times in a row had no state either
    (all syncing, e.g. a whole run starting or restarting at once: they start together).
    Raises `NoPeerState` when `timeout_s` passes (None: never; a node with bootstrap peers waits until
    it is stopped rather than train alone).
    Waits `retry_s` between asks; asks up to three times for a confirmed state before settling for an
    unconfirmed one. `waiting(what)` is told what it waits for (None once it stops waiting); `on_piece(peer,
    index)` of every verified bottom piece (`node.sync.statefetch`). `vet(choice, ledger)` may refuse a
    downloaded state (module doc): its donors' states are then left out of the rest of this join.
    `bootstrap()` names the connected peers the user gave (`--peers`): a state one of them vouches for
    comes first (`choose`)."""
    started = trio.current_time()
    deadline = math.inf if timeout_s is None else started + timeout_s
    unconfirmed_tries = empty_asks = 0
    refused: dict[str, int] = {}  # peer -> the newest slot of a state of it the vet refused
    try:
        with trio.move_on_at(deadline):  # a download in flight at the deadline is cut short too
            async with host.http_client(httpx.Timeout(30.0, connect=5.0)) as client:
                while trio.current_time() < deadline:
                    if not host.connected_peers():
                        waiting(_no_peer(host))
                        await trio.sleep(retry_s)
                        continue
                    manifests, all_syncing = await fetch_manifests(client, host, run_id)
                    empty_asks = empty_asks + 1 if all_syncing else 0
                    if empty_asks >= 3 and own is not None:
                        log.warning("every peer is syncing too: starting from our own state (slot %d)", own[0])
                        return None
                    choices = choose([m for m in manifests if m.slot > refused.get(m.origin, -1)], bootstrap())
                    if choices and (choices[0].confirmed or unconfirmed_tries >= 2 or len(host.connected_peers()) < 2):
                        best = choices[0]
                        if own is not None and (best.manifest.slot < own[0] or
                                                (best.manifest.slot == own[0] and best.manifest.ledger_digest == own[1])):
                            log.info("own state (slot %d) is as fresh as the peers' (slot %d): keeping it", own[0],
                                     best.manifest.slot)
                            return None
                        if not best.confirmed:
                            log.warning("state of slot %d is vouched for by %s only (no second peer agrees)",
                                        best.manifest.slot, best.confirmed_by[0])
                        for choice in choices:
                            what = f"the download of the state of slot {choice.manifest.slot}"
                            waiting(what)
                            verified = 0

                            def progress(peer: str, index: int) -> None:
                                nonlocal verified
                                verified += 1
                                waiting(f"{what}: {verified} pieces of its parameters verified")
                                if on_piece is not None:
                                    on_piece(peer, index)

                            try:
                                loaded = await download_state(host, choice.manifests, config, shapes, bottom,
                                                              on_piece=progress)
                            except (RemoteProtocolError, TransportError, OSError) as exc:
                                log.warning("state of slot %d from %s unusable: %s", choice.manifest.slot,
                                            choice.confirmed_by, exc)
                                continue
                            if vet is not None and not await vet(choice, loaded.ledger):
                                for peer in choice.confirmed_by:
                                    refused[peer] = max(refused.get(peer, -1), choice.manifest.slot)
                                continue
                            log.info("synced state of slot %d (ledger %s) confirmed by %d peer(s)", choice.manifest.slot,
                                     choice.manifest.ledger_digest.hex()[:16], len(choice.confirmed_by))
                            return SyncResult(loaded.ledger, loaded.meta.seen, choice,
                                              tuple(loaded.fetched_payloads()), loaded.proofs(), frozenset(refused))
                    if choices:
                        unconfirmed_tries += 1
                        waiting("a second peer to confirm the state of slot "
                                f"{choices[0].manifest.slot} (try {unconfirmed_tries} of 3)")
                    else:
                        why = "all syncing too" if all_syncing else "none served one yet" if not refused else \
                            f"the states of {len(refused)} refused by the vet"
                        waiting(f"a usable state from {len(host.connected_peers())} connected peer(s) ({why})")
                    await trio.sleep(retry_s)
    finally:
        waiting(None)
    raise NoPeerState(f"no usable peer state in {trio.current_time() - started:.0f} s (--sync-timeout {timeout_s:g}); "
                      + (_no_peer(host) if not host.connected_peers() else
                         f"{len(host.connected_peers())} peer(s) connected but none served a usable state"))


def _no_peer(host: Host) -> str:
    """What a node with no connected peer is waiting for, and why its dials failed."""
    failures = [f"{addr}: {why}" for addr, why in host.dial_failures.describe().items()]
    return "a connection to a peer" + (f"; failed dials: {'; '.join(failures)}" if failures else "")

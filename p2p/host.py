"""The p2p host: executes the gossip router's decisions over TCP connections and the HTTP blob plane.

    async with trio.open_nursery() as nursery:
        host = await nursery.start(p2p.run, config)     # listening; host.gossip_addr, host.http_addr
        await host.publish_update(payload, base_slot=..., ...)
        async for delivery in host.inbox: ...           # verified header + stored blob path
        await host.close("done")                        # signed goodbye, then everything stops

Contract:
- All router calls happen on the trio thread, one at a time ("decide"); `_execute` then does the I/O
  ("do"): queue frames, start dials and blob fetches, deliver, disconnect, count rejections.
- Every task (listener, HTTP server, heartbeat, one reader + one writer per connection, dials,
  fetches) lives in the host's nursery. `close()` says goodbye and returns once `run` has stopped;
  `abort()` (or cancelling the caller's scope) stops without a goodbye, like a crash.
- The inbox is unbounded: the application must keep reading it.
- Every refusal is counted in `counters.rejections` by `Reason` and logged on one line with the peer.
- When every connection slot (`max_connections`) is taken, a newcomer replaces a connection that
  `p2p.connection.choose_eviction` names (another host's idle handshake, or one silent for more than half the
  heartbeat timeout), else it is refused (`refused_connections`).
"""

from __future__ import annotations

import dataclasses
from functools import partial
import logging
import math
import os
import random
from collections.abc import Iterable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path

import httpx
import trio

from p2p.advertise import choose_advertise_host
from p2p.blobfetch import BlobClient, LocalBackoff
from p2p.access import HEALTH_PATH, guard_for, health
from p2p.blobserve import BlobService
from p2p.blobstore import BlobStore, default_spill_dir
from p2p.config import HostConfig
from p2p.connection import Connection
from p2p.counters import Counters
from p2p.dials import DialFailures
from p2p.errors import AddressError, TransportError
from p2p.http import HttpApp, serve_http
from p2p.httpclient import http_client
from p2p.outreach import Outreach
from p2p.tls import Credentials
from p2p.fetching import BlobFetching
from p2p.links import PeerLinks
from p2p.transport import format_addr, listener_addr, open_listener
from protocol import signing
from protocol.errors import LocalProtocolError, Reason
from protocol.gossip import Action, Deliver, Dial, Disconnect, Fetch, Reject, Router, Send
from protocol.messages import Goodbye, PeerInfo, ReducedRecord, Signed, StateManifest, UpdateHeader
from protocol.seen import SeqnoSource

log = logging.getLogger("p2p.host")


@dataclass(frozen=True)
class Delivery:
    """A verified signed message from the overlay; for an update, `blob` is the stored payload file."""

    message: Signed
    blob: Path | None
    source: str  # the peer we got it (and its blob) from

    @property
    def body(self) -> UpdateHeader | Goodbye | StateManifest | ReducedRecord:
        return self.message.body


@dataclass(frozen=True)
class PeerStatus:
    peer_id: str
    gossip_addr: str
    http_addr: str
    outbound: bool
    in_mesh: bool
    score: float
    connected_for_s: float
    slot: int | None
    round: int | None
    state: str | None


class Host(PeerLinks, BlobFetching):
    """Create through `run(config)`; the methods below are the node's API."""

    def __init__(self, config: HostConfig) -> None:
        self.config = config
        self.identity = config.identity
        self.peer_id = config.identity.peer_id
        self.counters = Counters()
        self.tls = None if config.insecure else Credentials(config.identity)  # None: cleartext (--insecure)
        blobs = Path(config.data_dir) / "blobs"
        self.store = BlobStore(blobs, default_spill_dir(blobs), config.blob_spill_bytes)
        self._local_backoff = LocalBackoff()
        self.http = HttpApp(total=config.http_total or None)
        self.blobs = BlobService(self.store, self.counters, chunk_bytes=config.blob_chunk_bytes,
                                 known=lambda peer: peer in self.router.peers)
        self.blobs.mount(self.http)
        self.http.route("GET", HEALTH_PATH, health)
        self.http.guard = guard_for(config.admission, tls=self.tls is not None)
        self.outreach = Outreach(self)  # nodes nobody can dial: reachability, blob pushes (p2p.outreach)
        self.outreach.mount()
        self.gossip_addr = ""
        self.http_addr = ""
        self.router: Router  # set in _serve, once the addresses are known
        self._seqnos = SeqnoSource()
        self.dial_failures = DialFailures(config.bootstrap)  # the last failed dial per address, until one works
        self._conns: dict[int, Connection] = {}
        self._next_conn = 0
        self._inbox_send, self.inbox = trio.open_memory_channel[Delivery](math.inf)
        self._fetch_slots = trio.Semaphore(config.max_parallel_fetches)
        self._stop = trio.Event()
        self._stopped = trio.Event()
        self._closing = False
        self._nursery: trio.Nursery
        self._client: BlobClient

    # ---- the node's API ---------------------------------------------------------------------------

    def now(self) -> float:
        return self.config.clock()

    @property
    def scheme(self) -> str:
        """The HTTP plane's URL scheme: https, or http for a node started with --insecure."""
        return "http" if self.tls is None else "https"

    @property
    def http_url(self) -> str:
        return self.peer_url(self.http_addr)

    def http_client(self, timeout: httpx.Timeout | float = 30.0, **kwargs: object) -> httpx.AsyncClient:
        """An httpx client for peers' HTTP planes (`peer_url`): our certificate, and our membership in a closed run."""
        return http_client(self.tls, membership=self.config.admission.credential, timeout=timeout, **kwargs)  # type: ignore[arg-type]

    def peer_url(self, http_addr: str) -> str:
        """The base URL of a peer's HTTP plane ("host:port" as advertised)."""
        return f"{self.scheme}://{http_addr}"

    async def add_blob(self, data: bytes | memoryview) -> str:
        """Store `data` (hashed and written in a worker thread), serve it, return its hex SHA-256."""
        name = await trio.to_thread.run_sync(self.store.put, data)
        self._execute(self.router.blob_stored(name, self.now()))
        return name

    async def add_blob_file(self, path: str | os.PathLike[str]) -> str:
        """Copy a file (e.g. a checkpoint shard) into the store without reading it whole; serve it."""
        name = await trio.to_thread.run_sync(self.store.put_file, path)
        self._execute(self.router.blob_stored(name, self.now()))
        return name

    def remove_blob(self, name: str) -> None:
        """Delete a blob and stop serving and announcing it: the one way a blob leaves this node (absent
        ones are ignored; one kept by a reader goes at its release, `BlobStore.remove`)."""
        self.store.remove(name)
        self.router.forget_blob(name)

    def holds_blob(self, name: str) -> bool:
        return self.store.has(name)

    def blob_path(self, name: str) -> Path:
        """The file of a stored blob (raises KeyError when it is not stored)."""
        return self.store.path(name)

    def kept_blobs(self, names: Iterable[str]) -> AbstractContextManager[None]:
        """Blobs `names` stay readable while the block runs, even if removed meanwhile."""
        return self.store.kept(names)

    def awaits_blob(self, name: str) -> bool:
        """Whether the gossip router is fetching this blob for a header it holds."""
        return self.router.pending.get(name) is not None

    def check_accepted(self, signed: Signed) -> None:
        """Raise as the router would refuse `signed` arriving by gossip (the run's admission: PROTOCOL.md §7b)."""
        if self.router.accept is not None:
            self.router.accept(signed)

    def gossip_peers(self) -> list[PeerStatus]:
        """The peers we still gossip with: scored above the graylist (`peers`, less the graylisted)."""
        graylist = self.router.config.score.graylist
        return [p for p in self.peers() if p.score >= graylist]

    async def publish_update(
        self,
        payload: bytes | memoryview,
        *,
        base_slot: int,
        publish_slot: int,
        tokens: int,
        inner_steps: int,
        codec: str,
        shapes: tuple[tuple[str, tuple[int, ...]], ...],
        membership: bytes | None = None,
    ) -> Signed:
        """Store the payload blob, sign an UpdateHeader for it (origin, seqno, hash, size filled in
        here) and push it into the overlay. Returns the signed header (its `message_id` is the
        update id). `membership`: field 11 (default: this host's credential; chaos tests leave it out)."""
        name = await self.add_blob(payload)
        await self.outreach.before_publish(name, len(payload))  # pushed first if no one can dial us
        body = UpdateHeader(
            run_id=self.config.run_id,
            origin=self.peer_id,
            seqno=self._seqnos.next(self.now()),
            base_slot=base_slot,
            publish_slot=publish_slot,
            tokens=tokens,
            inner_steps=inner_steps,
            codec=codec,
            shapes=shapes,
            payload_sha256=bytes.fromhex(name),
            payload_size=len(payload),
            membership=self.config.admission.credential if membership is None else membership,
        )
        return self._publish(body)

    async def publish_manifest(
        self, slot: int, ledger_digest: bytes, params_digest: bytes, blobs: Sequence[tuple[str, str]]
    ) -> Signed:
        """Announce our state at `slot`. `blobs` are (name, hex) of blobs already stored here
        (`add_blob`); they are listed sorted by name with their sizes."""
        refs = []
        for name, h in sorted(blobs):
            if not self.store.has(h):
                raise LocalProtocolError(f"manifest blob {name} ({h[:12]}) is not stored")
            refs.append((name, bytes.fromhex(h), self.store.size(h)))
        body = StateManifest(
            self.config.run_id, self.peer_id, self._seqnos.next(self.now()), slot, ledger_digest, params_digest, tuple(refs)
        )
        return self._publish(body)

    def publish_reduced(self, kind: bytes, fields: bytes, signature: bytes, header: bytes = b"") -> Signed:
        """Gossip a record of a reduced run this host's identity signed (``protocol.reduced.records``: its kind,
        its msgpack fields, its signature); a commitment with its update's signed header, wire-encoded."""
        body = ReducedRecord(self.config.run_id, self.peer_id, self._seqnos.next(self.now()), kind.decode(), fields,
                             signature, header, self.config.admission.credential)
        return self._publish(body)

    def _publish(self, body: UpdateHeader | StateManifest | Goodbye | ReducedRecord) -> Signed:
        signed = signing.sign(self.identity, body)
        self._execute(self.router.publish(signed, self.now()))
        log.info("published %s %s", body.KIND, signed.message_id.hex()[:16])
        return signed

    def block(self, peers: Sequence[str], seconds: float) -> None:
        """Drop the connections to `peers` and refuse them (inbound and dials) for `seconds`: an
        emulated network partition (the node's `POST /chaos`)."""
        now = self.now()
        scores = self.router.scores
        for peer in peers:
            # a ban lasts config.ban_s from the time given: shift it so that it ends at now + seconds
            scores.ban(peer, now + seconds - scores.config.ban_s)
            state = self.router.peers.get(peer)
            if state is not None:
                self._execute([Disconnect(peer, state.conn, f"blocked for {seconds:g} s")])

    def set_progress(self, slot: int, round_: int, state: str) -> None:
        """What our heartbeats tell peers (slot, round, a short state word such as "training")."""
        self.router.set_progress(slot, round_, state)

    @property
    def open_connections(self) -> int:
        """TCP connections open now (handshaking ones included), of at most `config.max_connections`."""
        return len(self._conns)

    def connected_peers(self) -> list[str]:
        return sorted(self.router.peers)

    def known_http_addr(self, peer: str) -> str | None:
        """`peer`'s HTTP address as it said on connecting, else as peer exchange told; None if unknown."""
        st = self.router.peers.get(peer)
        if st is not None and st.info.http_addr:
            return st.info.http_addr
        known = self.router.table.get(peer)
        return known.info.http_addr if known is not None and known.info.http_addr else None

    def knows_peer(self, peer: str) -> bool:
        """Whether `peer` is connected, or named by peer exchange."""
        return peer in self.router.peers or peer in self.router.table

    def peers(self) -> list[PeerStatus]:
        now = self.now()
        out = []
        for peer, st in sorted(self.router.peers.items()):
            hb = st.heartbeat
            out.append(
                PeerStatus(
                    peer, st.info.gossip_addr, st.info.http_addr, st.outbound, peer in self.router.mesh,
                    self.router.scores.score(peer), now - st.since,
                    hb.slot if hb else None, hb.round if hb else None, hb.state if hb else None,
                )
            )
        return out

    def status(self) -> dict[str, object]:
        """JSON-ready view for `/status`: addresses, peers, mesh, counters."""
        return {
            "peer_id": self.peer_id,
            "gossip_addr": self.gossip_addr,
            "http_addr": self.http_addr,
            "peers": [dataclasses.asdict(p) for p in self.peers()],
            "mesh": sorted(self.router.mesh),
            "known_peers": len(self.router.table),
            "pending_blobs": len(self.router.pending),
            "dial_failures": self.dial_failures.describe(),
            "reachable": self.outreach.reach.describe(),
            "blobs_leave": self.outreach.blobs_leave,
            "counters": self.counters.snapshot(),
        }

    async def close(self, reason: str = "shutdown") -> None:
        """Send a signed goodbye to every peer, wait (bounded) for it to be written, stop `run`."""
        if self._closing:
            await self._stopped.wait()
            return
        self._closing = True
        goodbye = Goodbye(self.config.run_id, self.peer_id, self._seqnos.next(self.now()), reason[:256])
        self._publish(goodbye)
        with trio.move_on_after(self.config.goodbye_flush_s):
            for conn in list(self._conns.values()):
                await conn.flush()
        self._stop.set()
        await self._stopped.wait()

    def abort(self) -> None:
        """Stop at once, without a goodbye (what a crash looks like to the peers)."""
        self._closing = True
        self._stop.set()

    # ---- running ----------------------------------------------------------------------------------

    async def _serve(self, task_status: trio.TaskStatus[Host]) -> None:
        cfg = self.config
        try:
            async with BlobClient(
                self.store, self.counters, local_peer=self.peer_id, read_bytes=cfg.blob_read_bytes,
                timeout=cfg.fetch_timeout_s, min_rate=cfg.blob_min_rate, grace=cfg.blob_grace_s,
                credentials=self.tls, membership=cfg.admission.credential,
            ) as client, trio.open_nursery() as nursery:
                self._client = client
                self._nursery = nursery
                advertise = await trio.to_thread.run_sync(
                    choose_advertise_host, cfg.listen_host, cfg.advertise_host, cfg.bootstrap)
                try:
                    listener = await open_listener(cfg.listen_host, cfg.gossip_port)
                except TransportError as exc:
                    raise AddressError("gossip", str(exc)) from None
                try:
                    _, http_port = await nursery.start(
                        partial(serve_http, tls=self.tls.http_server if self.tls else None),
                        self.http, cfg.listen_host, cfg.http_port)
                except TransportError as exc:
                    raise AddressError("http", str(exc)) from None
                self.gossip_addr = format_addr(advertise.host, cfg.advertise_gossip_port or listener_addr(listener)[1])
                self.http_addr = cfg.advertise_http or format_addr(advertise.host, http_port)
                log.info("advertising %s (gossip) and %s (http): %s", self.gossip_addr, self.http_addr, advertise.why)
                rng = random.Random(cfg.seed if cfg.seed is not None else os.urandom(16))
                self.router = Router(
                    cfg.gossip_config, PeerInfo(self.peer_id, self.gossip_addr, self.http_addr), rng=rng,
                    bootstrap=cfg.bootstrap, accept=cfg.admission.accept_hook(cfg.accept), known=cfg.known,
                )
                for name in self.store.names():
                    self.router.blob_stored(name, self.now())
                await nursery.start(trio.serve_listeners, self._on_inbound, [listener])
                nursery.start_soon(self._heartbeats)
                log.info("%s listening: gossip %s, http %s", self.peer_id, self.gossip_addr, self.http_addr)
                task_status.started(self)
                await self._stop.wait()
                nursery.cancel_scope.cancel()
        finally:
            self._stopped.set()
            log.info("%s stopped", self.peer_id)

    async def _heartbeats(self) -> None:
        interval = self.router.config.heartbeat_s
        while True:
            now = self.now()
            given_up = self.router.pending.given_up
            self._execute(self.router.heartbeat(now))
            if self.router.pending.given_up > given_up:
                self.counters.events["blob_given_up"] += self.router.pending.given_up - given_up
                log.warning("gave up %d blob(s): no holder served them in time", self.router.pending.given_up - given_up)
            self.outreach.tend(self._nursery)
            for conn in list(self._conns.values()):
                if conn.congested_since is not None and now - conn.congested_since > self.router.config.heartbeat_timeout_s:
                    conn.close("send queue full for too long (slow peer)")
            await trio.sleep(interval)

    def _execute(self, actions: list[Action]) -> None:
        now = self.now()
        for action in actions:
            if isinstance(action, Send):
                self._send(action, now)
            elif isinstance(action, Fetch):
                self._nursery.start_soon(self._fetch, action)
            elif isinstance(action, Deliver):
                if action.blob is not None:
                    self.outreach.delivered(action.blob)
                path = self.store.path(action.blob) if action.blob is not None else None
                self._inbox_send.send_nowait(Delivery(action.message, path, action.source))
            elif isinstance(action, Disconnect):
                conn = self._conns.get(action.conn)
                if conn is not None:
                    conn.close(action.reason)
            elif isinstance(action, Dial):
                if not self._closing:
                    self._nursery.start_soon(self._dial, action)
            elif isinstance(action, Reject):
                self.counters.rejected(action.peer, action.reason)
                level = logging.DEBUG if action.reason is Reason.DUPLICATE else logging.WARNING
                log.log(level, "rejected from %s: %s %s", action.peer, action.reason.value, action.detail)
            else:
                raise LocalProtocolError(f"unknown action {action!r}")

    def _send(self, action: Send, now: float) -> None:
        state = self.router.peers.get(action.peer)
        conn_id = action.conn if action.conn is not None else state.conn if state is not None else None
        conn = self._conns.get(conn_id) if conn_id is not None else None
        if conn is None:
            return
        data = conn.encode(action.message)
        kind = action.message.kind if isinstance(action.message, Signed) else action.message.KIND
        if conn.enqueue(data, now):
            self.counters.queued_by_kind[kind] += len(data)
        else:
            log.debug("dropped a %s frame to %s: send queue full", kind, action.peer)



async def run(config: HostConfig, *, task_status: trio.TaskStatus[Host] = trio.TASK_STATUS_IGNORED) -> None:
    """Run a host until `host.close()` / `host.abort()` or cancellation. `task_status.started(host)`
    is called once it listens: `host = await nursery.start(run, config)`; the listen addresses are
    `host.gossip_addr` and `host.http_addr`."""
    host = Host(config)
    await host._serve(task_status)


__all__ = ["Delivery", "Host", "PeerStatus", "run"]

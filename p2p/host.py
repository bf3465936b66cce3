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
from collections.abc import Sequence
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
from p2p.connection import Connection, choose_eviction, handshaking_from
from p2p.counters import Counters
from p2p.dials import DialFailures
from p2p.errors import AddressError, BlobGone, LocalStoreError, TransportError
from p2p.http import HttpApp, serve_http
from p2p.httpclient import http_client
from p2p.outreach import Outreach
from p2p.tls import Credentials, TlsStream, connect
from p2p.transport import dial, format_addr, listener_addr, open_listener
from protocol import signing
from protocol.errors import LocalProtocolError, Reason, RemoteProtocolError
from protocol.gossip import Action, Deliver, Dial, Disconnect, Fetch, Handshake, Reject, Router, Send, State
from protocol.messages import Goodbye, Hello, PeerInfo, Signed, StateManifest, UpdateHeader, split_addr
from protocol.seen import SeqnoSource

log = logging.getLogger("p2p.host")


@dataclass(frozen=True)
class Delivery:
    """A verified signed message from the overlay; for an update, `blob` is the stored payload file."""

    message: Signed
    blob: Path | None
    source: str  # the peer we got it (and its blob) from

    @property
    def body(self) -> UpdateHeader | Goodbye | StateManifest:
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


class Host:
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

    def _publish(self, body: UpdateHeader | StateManifest | Goodbye) -> Signed:
        signed = signing.sign(self.identity, body)
        self._execute(self.router.publish(signed, self.now()))
        log.info("published %s %s", body.KIND, signed.message_id.hex()[:16])
        return signed

    async def fetch_blob(self, name: str, size: int, peers: Sequence[str] | None = None) -> Path:
        """Download blob `name` (e.g. state listed in a manifest) from `peers` (default: every
        connected peer) in order until one serves the right bytes; it is then served onward.
        Raises TransportError if nobody could. The path stays readable only while the caller `keep`s the
        blob in the store (`BlobStore.keep`): anyone may remove it once this returns."""
        if self.store.has(name):
            return self.store.path(name)
        candidates = list(peers) if peers is not None else sorted(self.router.peers)
        for peer in candidates:
            if await self._fetch_from(peer, name, size):
                try:
                    return self.store.path(name)
                except KeyError:  # removed here while this task waited for the stored blob (not kept)
                    raise TransportError(f"blob {name[:12]}: removed here as soon as it was fetched") from None
        raise TransportError(f"blob {name[:12]}: no peer of {len(candidates)} served it")

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

    # ---- connections ------------------------------------------------------------------------------

    async def _on_inbound(self, stream: trio.SocketStream) -> None:
        remote = format_addr(*stream.socket.getpeername()[:2])
        # the TLS handshake runs inside the gossip handshake's deadline (the first send or receive starts it)
        link = stream if self.tls is None else TlsStream(stream, self.tls.gossip_server, server_side=True)
        await self._run_connection(link, outbound=False, remote=remote)

    async def _dial(self, action: Dial) -> None:
        self.counters.events["dials"] += 1
        try:
            if self.tls is None:
                stream: trio.abc.Stream = await dial(action.address, self.config.dial_timeout_s)
            else:
                stream = await connect(action.address, self.tls.gossip_client, self.config.dial_timeout_s,
                                       expected_peer=action.peer)
        except (TransportError, RemoteProtocolError) as exc:
            if isinstance(exc, RemoteProtocolError):
                self._execute([Reject(action.peer or split_addr(action.address)[0], exc.reason, f"dial {action.address}: {exc.detail}")])
            self.dial_failures.failed(action.address, str(exc), self.now())
            self._execute(self.router.dial_failed(action.address, self.now()))
            return
        await self._run_connection(stream, outbound=True, remote=action.address, dialed=action.address, expected=action.peer)

    async def _run_connection(
        self, stream: trio.abc.Stream, *, outbound: bool, remote: str, dialed: str | None = None, expected: str | None = None
    ) -> None:
        refusal = self._admit(outbound, remote)
        if refusal is not None:
            self.counters.events[refusal] += 1
            await stream.aclose()
            if dialed is not None:
                self._execute(self.router.dial_failed(dialed, self.now()))
            return
        self._next_conn += 1
        cfg = self.config
        conn = Connection(
            stream, self._next_conn, self.counters, remote=remote, outbound=outbound,
            max_frame_size=cfg.max_frame_size, queue_frames=cfg.queue_frames, queue_bytes=cfg.queue_bytes,
        )
        self._conns[conn.id] = conn
        hello: Hello | None = None
        refused = False
        try:
            with conn.cancel_scope:
                hello = await self._handshake(conn, expected)
                if hello is None:
                    return
                self._execute(self.router.connected(hello, conn.id, outbound, self.now(), dialed, remote))
                if conn.cancel_scope.cancel_called:
                    hello, refused = None, True  # refused (duplicate, banned, full): not a disconnect of a peer
                    return
                self.counters.events["connects"] += 1
                if dialed is not None:
                    self.dial_failures.succeeded(dialed)
                log.info("connected %s %s %s (conn %d)", hello.peer_id, "to" if outbound else "from", remote, conn.id)
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._write_loop, conn)
                    await self._read_loop(conn)
                    nursery.cancel_scope.cancel()
        finally:
            del self._conns[conn.id]
            try:
                if refused:
                    await self._last_words(conn)
            finally:
                await conn.aclose()
            if hello is not None:
                self.counters.events["disconnects"] += 1
                log.info("disconnected %s (conn %d): %s", hello.peer_id, conn.id, conn.close_reason or "closed")
                self._execute(self.router.disconnected(hello.peer_id, conn.id, self.now()))

    def _admit(self, outbound: bool, remote: str) -> str | None:
        """Room for a new connection from `remote` (making it by eviction when every slot is taken), or the
        counter of the refusal."""
        if self._closing:
            return "refused_connections"
        conns = self._conns.values()
        if not outbound and handshaking_from(conns, remote) >= self.config.max_handshakes_per_host:
            return "refused_handshakes_per_host"
        if sum(1 for c in conns if not c.closing) < self.config.max_connections:
            return None
        now = trio.current_time()
        chosen = choose_eviction(conns, "" if outbound else remote, now, self.router.config.heartbeat_timeout_s / 2)
        if chosen is None:
            return "refused_connections"
        victim, why = chosen
        self.counters.events["evicted_handshakes" if victim.handshaking else "evicted_silent"] += 1
        log.debug("%s (conn %d, %s) for a connection from %s", why, victim.id, victim.remote, remote)
        victim.close(why)
        return None

    async def _last_words(self, conn: Connection) -> None:
        """A peer refused for room was sent a `peer_exchange` (queued; its writer never ran): write it, bounded."""
        with trio.move_on_after(self.config.goodbye_flush_s):
            try:
                await conn.write_queued()
            except TransportError as exc:
                log.debug("last frames to %s not written: %s", conn.remote, exc)

    async def _handshake(self, conn: Connection, expected: str | None) -> Hello | None:
        handshake = Handshake(
            self.identity, self.router.validator, gossip_addr=self.gossip_addr, http_addr=self.http_addr,
            challenge=signing.new_challenge(), expected_peer=expected, agent=self.config.agent,
            remote_host=split_addr(conn.remote)[0] if conn.remote else None, run_config=self.config.run_config,
            admission=self.config.admission, speaks_first=conn.outbound or not self.config.admission.closed,
        )
        try:
            with trio.fail_after(self.config.handshake_timeout_s):
                for message in handshake.first_messages():
                    await conn.send_direct(message)
                while handshake.state is not State.DONE:
                    frame = await conn.next_frame()
                    for message in handshake.receive_frame(frame, self.now()):
                        await conn.send_direct(message)
        except RemoteProtocolError as exc:
            # before the Hello, only the remote host is known (not the port: bounded counter keys)
            who = handshake.peer.peer_id if handshake.peer is not None else conn.remote.rpartition(":")[0]
            if self.tls is None and conn.first_bytes_look_like_tls():
                exc = RemoteProtocolError(Reason.TLS_PEER, "the peer speaks TLS; this node was started with --insecure")
            self._execute([Reject(who, exc.reason, f"handshake: {exc.detail}")])
            if handshake.hello_owed:  # an admitted member with other settings: it may still read ours (node.adopt)
                await self._owed_hello(conn, handshake.hello)
            conn.close(f"handshake refused: {exc.reason.value}")
            if conn.outbound:
                self.dial_failures.failed(conn.remote, f"handshake refused: {exc}", self.now())
        except (TransportError, trio.TooSlowError) as exc:
            log.debug("handshake with %s failed: %r", conn.remote, exc)
            conn.close("handshake failed")
            if conn.outbound:
                self.dial_failures.failed(conn.remote, f"handshake failed: {exc or 'no answer in time'}", self.now())
        else:
            assert handshake.peer is not None
            proven = conn.stream.peer_id if isinstance(conn.stream, TlsStream) else handshake.peer.peer_id
            if proven != handshake.peer.peer_id:
                self._execute([Reject(handshake.peer.peer_id, Reason.BAD_IDENTITY,
                                      f"handshake: the hello is of {handshake.peer.peer_id}, the TLS certificate of {proven}")])
                conn.close("handshake refused: bad_identity")
                return None
            conn.authenticated(handshake.peer.peer_id)
            return handshake.peer
        if conn.outbound and conn.remote:
            self._execute(self.router.dial_failed(conn.remote, self.now()))
        return None

    async def _owed_hello(self, conn: Connection, hello: Hello) -> None:
        with trio.move_on_after(self.config.goodbye_flush_s):
            try:
                await conn.send_direct(hello)
            except TransportError as exc:
                log.debug("the owed hello to %s not sent: %s", conn.remote, exc)

    async def _read_loop(self, conn: Connection) -> None:
        while True:
            try:
                frame = await conn.next_frame()
            except TransportError as exc:
                conn.close_reason = conn.close_reason or str(exc)
                return
            except RemoteProtocolError as exc:
                conn.close_reason = f"stream error: {exc.reason.value}"
                self._execute(self.router.stream_error(conn.peer, conn.id, exc.reason, self.now()))
                return
            self._execute(self.router.received(conn.peer, conn.id, frame, self.now()))

    async def _write_loop(self, conn: Connection) -> None:
        try:
            await conn.run_writer()
        except TransportError as exc:
            conn.close(str(exc))

    # ---- blobs ------------------------------------------------------------------------------------

    async def _fetch(self, action: Fetch) -> None:
        await trio.sleep_until(self._local_backoff.until)  # the local store failed a write: wait, not the holders
        async with self._fetch_slots:
            stored = await self._fetch_from(action.peer, action.blob, action.size)
        pending = self.router.pending.get(action.blob)
        if not stored and pending is not None:
            if pending.fetching == action.peer:  # _fetch_from could not even start (no address)
                self._execute(self.router.fetch_failed(action.blob, action.peer, None, "peer gone", self.now()))

    def _range_sources(self, peer: str, url: str, name: str) -> list[tuple[str, str]]:
        """`peer` (the holder the router chose) first, then the blob's other connected holders, at most
        `fetch_streams` in all."""
        sources = [(peer, url)]
        pending = self.router.pending.get(name)
        for holder in pending.holders if pending is not None else ():
            state = self.router.peers.get(holder)
            if holder != peer and state is not None and state.info.http_addr and \
                    len(sources) < self.config.fetch_streams:
                sources.append((holder, self.peer_url(state.info.http_addr)))
        return sources

    async def _download(self, peer: str, url: str, name: str, size: int) -> None:
        """Blob `name` into the store: in byte ranges from several holders when it is large (`fetch_ranges`),
        else whole from `peer`. A ranged blob that fails its hash is fetched again whole from `peer` alone, so
        that a wrong blob is always blamed on the holder that sent it."""
        cfg = self.config
        if cfg.fetch_streams < 2 or size < cfg.range_fetch_bytes:
            await self._client.fetch_once(peer, url, name, size)
            return
        sources = self._range_sources(peer, url, name)
        try:
            failed = await self._client.fetch_ranges(sources, name, size, cfg.fetch_streams)
        except RemoteProtocolError as exc:
            if exc.reason != Reason.HASH_MISMATCH or len(sources) == 1:
                raise
            log.warning("blob %s from %d holders failed its hash; fetching it whole from %s to find the holder "
                        "at fault", name[:12], len(sources), peer)
            await self._client.fetch_once(peer, url, name, size)
            return
        for other, exc in failed.items():
            log.info("blob %s: holder %s failed a range (%s); the others served it", name[:12], other, exc)

    async def _fetch_from(self, peer: str, name: str, size: int) -> bool:
        """One attempt; reports the outcome to the router. True if the blob is now stored."""
        state = self.router.peers.get(peer)
        if state is None or not state.info.http_addr:
            return False
        try:
            await self._download(peer, self.peer_url(state.info.http_addr), name, size)
        except RemoteProtocolError as exc:
            self.counters.blob_fetch_failures += 1
            self.counters.events[f"blob_fetch_failed:{exc.reason.value}"] += 1
            self._execute(self.router.fetch_failed(name, peer, exc.reason, exc.detail, self.now()))
            return False
        except LocalStoreError as exc:  # not the holder's fault: the same holder is asked again after a wait
            self.counters.blob_fetch_failures += 1
            self.counters.events["blob_fetch_failed:local_store"] += 1
            wait = self._local_backoff.failed(trio.current_time())
            log.log(logging.WARNING if wait <= LocalBackoff.FIRST else logging.DEBUG,
                    "blob %s not stored here (%s); fetches wait %.0f s", name[:12], exc, wait)
            self._execute(self.router.fetch_failed(name, peer, None, str(exc), self.now()))
            return False
        except TransportError as exc:
            self.counters.blob_fetch_failures += 1
            self.counters.events["blob_fetch_failed:transport"] += 1
            log.info("fetch of blob %s from %s failed (the next holder is tried): %s", name[:12], peer, exc)
            gone = isinstance(exc, BlobGone)  # not asked again for it
            self._execute(self.router.fetch_failed(name, peer, None, str(exc), self.now(), gone=gone))
            return False
        self._local_backoff.succeeded()
        log.info("fetched blob %s (%d bytes) from %s", name[:12], size, peer)
        self._execute(self.router.blob_stored(name, self.now(), source=peer))
        return True


async def run(config: HostConfig, *, task_status: trio.TaskStatus[Host] = trio.TASK_STATUS_IGNORED) -> None:
    """Run a host until `host.close()` / `host.abort()` or cancellation. `task_status.started(host)`
    is called once it listens: `host = await nursery.start(run, config)`; the listen addresses are
    `host.gossip_addr` and `host.http_addr`."""
    host = Host(config)
    await host._serve(task_status)


__all__ = ["Delivery", "Host", "PeerStatus", "run"]

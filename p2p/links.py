"""The host's peer connections: accepting and dialling them, the room for them, the gossip handshake, and each
connection's reader and writer. A part of `p2p.host.Host` (a mixin: it works on the host's router, config,
counters and connection table), in a module of its own so that each file reads as one concern.

Contract (the host's): every router call happens on the trio thread, one at a time; each connection's tasks
live in the host's nursery; when every slot (`max_connections`) is taken, a newcomer replaces a connection
that `p2p.connection.choose_eviction` names, else it is refused (`refused_connections`).
"""

from __future__ import annotations

import logging

import trio

from p2p.connection import Connection, choose_eviction, handshaking_from
from p2p.errors import TransportError
from p2p.tls import TlsStream, connect
from p2p.transport import dial, format_addr
from protocol import signing
from protocol.errors import Reason, RemoteProtocolError
from protocol.gossip import Dial, Handshake, Reject, State
from protocol.messages import Hello, split_addr

__all__ = ["PeerLinks"]

log = logging.getLogger("p2p.host")


class PeerLinks:
    """(part of `Host`) The connections to peers."""


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

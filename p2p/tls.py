"""TLS 1.3 on trio with libp2p certificates, mutual where it must be (PROTOCOL.md section 1a).

Python's `ssl` cannot take a self-signed peer certificate and check it by its libp2p extension (it has no
verify callback: an unknown client certificate aborts the handshake), so the TLS object is pyOpenSSL's, over
the connection's own socket: OpenSSL reads and writes the file descriptor itself (no memory BIO, no copy
through Python), and a call that would block waits on trio for the socket instead. One stream may be used by
one sending and one receiving task at once (gossip connections are).

- `Credentials(identity)`: the node's one certificate (`p2p.tlscert`), and the TLS contexts made from it:
  gossip (ALPN `diloco/1`, client certificate required) and HTTP (ALPN `http/1.1`, client certificate
  optional: anonymous clients reach `/health`, and what an open run serves).
- `TlsStream`: a `trio.abc.Stream`; `do_handshake()` runs the handshake, checks the peer's certificate
  (`peer_id`: the peer id it proves; None for an anonymous HTTP client) and raises `RemoteProtocolError`
  (`BAD_CERTIFICATE`, `CLEARTEXT_PEER`: the first byte the peer sent is no TLS record) or `TransportError`.
  `receive_into` and `peek` serve the blob client's zero-copy path.
- `TlsListener`: accepts TLS streams (hypercorn drives the handshake) and keeps, for each open connection,
  the peer id its certificate proved (`peer_of(client address)`), which the HTTP plane's access checks read.
- `connect(address, context, timeout)`: dial, handshake, and return the stream.
"""

from __future__ import annotations

import datetime
import logging
import socket as stdlib_socket
from collections.abc import Callable

import trio
from cryptography.hazmat.primitives.serialization import Encoding
from OpenSSL import SSL

from p2p.errors import LinkBroken, TransportError
from p2p.tlscert import make_certificate, peer_id_of
from p2p.transport import dial, format_addr
from protocol.errors import Reason, RemoteProtocolError
from protocol.identity import Identity

log = logging.getLogger("p2p.tls")

GOSSIP_ALPN = b"diloco/1"
HTTP_ALPN = b"http/1.1"
TLS_RECORD_TYPES = frozenset({0x14, 0x15, 0x16, 0x17})  # change_cipher_spec, alert, handshake, application_data
# a fatal TLS alert (protocol_version), what a node that requires TLS answers cleartext with before closing
PROTOCOL_VERSION_ALERT = bytes.fromhex("15030300020246")
_RECEIVE = 1 << 16
# OpenSSL's words for records that are no TLS (a cleartext peer's bytes read before `_check_first_byte` could look)
_CLEARTEXT_ERRORS = ("wrong version number", "packet length too long", "http request", "record layer failure")


class Credentials:
    """A node's TLS identity: one certificate for `identity`, reused for every connection."""

    def __init__(self, identity: Identity) -> None:
        self.peer_id = identity.peer_id
        self.certificate, self._key = make_certificate(identity)
        self.gossip_server = self._context(GOSSIP_ALPN, server=True, client_certificate=True)
        self.gossip_client = self._context(GOSSIP_ALPN, server=False)
        self.http_server = self._context(HTTP_ALPN, server=True, client_certificate=False)
        self.http_client = self._context(HTTP_ALPN, server=False)

    def _context(self, alpn: bytes, *, server: bool, client_certificate: bool = True) -> SSL.Context:
        context = SSL.Context(SSL.TLS_METHOD)
        context.set_min_proto_version(SSL.TLS1_3_VERSION)
        context.use_certificate(self.certificate)
        context.use_privatekey(self._key)
        context.check_privatekey()
        mode = SSL.VERIFY_PEER | (SSL.VERIFY_FAIL_IF_NO_PEER_CERT if server and client_certificate else 0)
        context.set_verify(mode, _accept_for_now)  # `peer_id_of` checks the certificate after the handshake
        context.set_options(SSL.OP_NO_TICKET)
        if server:
            context.set_alpn_select_callback(lambda _conn, offered: alpn if alpn in offered else SSL.NO_OVERLAPPING_PROTOCOLS)
        else:
            context.set_alpn_protos([alpn])
        return context


def _accept_for_now(_conn: SSL.Connection, _cert: object, _errno: int, _depth: int, _ok: int) -> bool:
    """OpenSSL's chain check cannot pass a self-signed certificate: let the handshake finish and check the
    certificate by the libp2p rules afterwards (`TlsStream._check_peer`), before a byte of data is used."""
    return True


class TlsStream(trio.abc.Stream):
    def __init__(self, transport: trio.SocketStream, context: SSL.Context, *, server_side: bool) -> None:
        self.transport_stream = transport
        self.socket = transport.socket
        self._conn = SSL.Connection(context, self.socket)
        if server_side:
            self._conn.set_accept_state()
        else:
            self._conn.set_connect_state()
        self.server_side = server_side
        self.peer_id: str | None = None
        self.handshake_done = False
        self._first_byte_seen = False
        self._send_lock = trio.StrictFIFOLock()

    # ---- the handshake ----------------------------------------------------------------------------

    async def do_handshake(self) -> None:
        """Run the TLS handshake and check the peer's certificate (idempotent)."""
        if self.handshake_done:
            return
        if self.server_side:
            await self._check_first_byte()  # before OpenSSL reads: a cleartext peer is named, and answered
        await self._retry(self._conn.do_handshake)
        self._check_peer()
        self.handshake_done = True

    def _check_peer(self) -> None:
        leaf = self._conn.get_peer_certificate(as_cryptography=True)
        if leaf is None:
            if not self.server_side:
                raise RemoteProtocolError(Reason.BAD_CERTIFICATE, "the server sent no certificate")
            self.peer_id = None  # an anonymous client of the HTTP plane (the gossip context requires one)
            return
        chain = self._conn.get_peer_cert_chain(as_cryptography=True) or []
        if any(c != leaf for c in chain):
            raise RemoteProtocolError(Reason.BAD_CERTIFICATE, f"a chain of {len(chain)} certificates (one is allowed)")
        self.peer_id = peer_id_of(leaf.public_bytes(Encoding.DER), datetime.datetime.now(datetime.timezone.utc))

    def selected_alpn_protocol(self) -> str | None:
        chosen = self._conn.get_alpn_proto_negotiated()
        return chosen.decode("ascii", "replace") if chosen else None

    async def _check_first_byte(self) -> None:
        """Before OpenSSL reads anything: a peer whose first byte is no TLS record speaks cleartext."""
        if self._first_byte_seen:
            return
        try:
            first = await self.socket.recv(1, stdlib_socket.MSG_PEEK)
        except OSError as exc:
            raise LinkBroken(f"TLS handshake: {exc.strerror or exc}") from exc
        if not first:
            raise LinkBroken("the peer closed the connection during the TLS handshake "
                                 "(a node started with --insecure closes on TLS)")
        self._first_byte_seen = True
        if first[0] not in TLS_RECORD_TYPES:
            if self.server_side:
                await self._answer_cleartext()
            raise RemoteProtocolError(Reason.CLEARTEXT_PEER, "the peer speaks cleartext, not TLS (is it started with --insecure?)")

    async def _answer_cleartext(self) -> None:
        """Send the alert, then read what the peer already sent (bounded): a close with unread bytes would reset
        the connection, and the peer might lose the alert."""
        with trio.move_on_after(1):
            try:
                await self.transport_stream.send_all(PROTOCOL_VERSION_ALERT)
                await self.transport_stream.send_eof()
                with trio.move_on_after(0.2):
                    for _ in range(16):
                        if not await self.transport_stream.receive_some(_RECEIVE):
                            break
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                pass

    # ---- data -------------------------------------------------------------------------------------

    async def _retry(self, operation: Callable[[], object]) -> object:
        """Call a non-blocking OpenSSL operation until it completes, waiting on the socket as it asks."""
        while True:
            try:
                return operation()
            except SSL.WantReadError:
                await (self._wait_readable() if self._first_byte_seen else self._check_first_byte())
            except SSL.WantWriteError:
                await self._wait_writable()
            except SSL.ZeroReturnError:
                if not self.handshake_done:
                    raise LinkBroken("the peer closed the connection during the TLS handshake") from None
                return b""
            except SSL.SysCallError as exc:
                if self.handshake_done and exc.args and exc.args[0] == -1:
                    return b""  # EOF without close_notify: a peer that went away
                raise self._ended(exc) from None
            except SSL.Error as exc:
                raise self._failure(exc) from None

    async def _wait_readable(self) -> None:
        try:
            await trio.lowlevel.wait_readable(self.socket)
        except trio.BusyResourceError:  # the other task waits to read: let it, then try again
            await trio.sleep(0.001)
        except (trio.ClosedResourceError, OSError) as exc:
            raise LinkBroken(f"TLS read: {exc!r}") from exc

    async def _wait_writable(self) -> None:
        try:
            await trio.lowlevel.wait_writable(self.socket)
        except trio.BusyResourceError:
            await trio.sleep(0.001)
        except (trio.ClosedResourceError, OSError) as exc:
            raise LinkBroken(f"TLS write: {exc!r}") from exc

    def _ended(self, exc: SSL.SysCallError) -> LinkBroken:
        why = exc.args[1] if len(exc.args) > 1 else str(exc)
        if self.handshake_done:
            return LinkBroken(f"TLS: {why}")
        return LinkBroken(f"the connection ended during the TLS handshake ({why}; "
                              "a node started with --insecure closes on TLS)")

    def _failure(self, exc: SSL.Error) -> Exception:
        detail = "; ".join(str(part[2]) if isinstance(part, tuple) and len(part) > 2 else str(part)
                           for part in (exc.args[0] if exc.args and isinstance(exc.args[0], list) else exc.args))
        if not self.handshake_done and any(m in detail for m in _CLEARTEXT_ERRORS):
            return RemoteProtocolError(Reason.CLEARTEXT_PEER, f"the peer answered in cleartext, not TLS ({detail}); "
                                       "is it started with --insecure?")
        if not self.handshake_done and "no application protocol" in detail:
            return RemoteProtocolError(Reason.BAD_HANDSHAKE, "no common ALPN protocol (the wrong port?)")
        if not self.handshake_done and "certificate" in detail:
            return RemoteProtocolError(Reason.BAD_CERTIFICATE, f"TLS handshake refused: {detail}")
        return LinkBroken(f"TLS {'handshake ' if not self.handshake_done else ''}error: {detail or exc!r}")

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
        await self.do_handshake()
        return await self._retry(lambda: self._conn.recv(max_bytes or _RECEIVE))  # type: ignore[no-any-return]

    async def receive_into(self, view: memoryview) -> int:
        """Decrypt into `view` every record that has arrived (at least one byte: OpenSSL hands out one
        16 KiB record per call, so one call per record would make the caller loop per record); 0 at the end
        of the stream."""
        await self.do_handshake()
        got = await self._retry(lambda: self._conn.recv_into(view, len(view)))
        n = 0 if got == b"" else int(got)  # type: ignore[arg-type]
        while 0 < n < len(view):
            try:
                more = self._conn.recv_into(view[n:], len(view) - n)
            except SSL.Error:  # nothing more yet, the end, or a failure: the next call sees it
                break
            if not more:
                break
            n += more
        return n

    async def peek(self, max_bytes: int) -> bytes:
        """The next decrypted bytes without consuming them (at least one, unless the stream ended)."""
        await self.do_handshake()
        return await self._retry(lambda: self._conn.recv(max_bytes, stdlib_socket.MSG_PEEK))  # type: ignore[no-any-return]

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        await self.do_handshake()
        view = memoryview(data).cast("B")
        async with self._send_lock:
            sent = 0
            while sent < len(view):
                n = await self._retry(lambda: self._conn.send(view[sent:]))
                sent += int(n)  # type: ignore[arg-type]

    async def wait_send_all_might_not_block(self) -> None:
        await trio.lowlevel.wait_writable(self.socket)

    async def aclose(self) -> None:
        try:
            if self.handshake_done:
                try:
                    self._conn.shutdown()  # close_notify, best effort (never waits)
                except SSL.Error:
                    pass
        finally:
            await self.transport_stream.aclose()


class TlsListener(trio.abc.Listener[TlsStream]):
    """TLS streams from a TCP listener, and the peer id each open connection's certificate proved."""

    def __init__(self, transport: trio.SocketListener, context: SSL.Context) -> None:
        self.transport_listener = transport
        self.context = context
        self._peers: dict[tuple[str, int], _ListenedStream] = {}

    async def accept(self) -> TlsStream:
        stream = await self.transport_listener.accept()
        host, port = stream.socket.getpeername()[:2]
        tls = _ListenedStream(stream, self.context, self, (host, port))
        self._peers[(host, port)] = tls
        return tls

    def peer_of(self, client: tuple[str, int] | None) -> str | None:
        """The peer id the certificate of the connection from `client` proved (None: anonymous, or unknown)."""
        stream = self._peers.get(tuple(client)) if client else None  # type: ignore[arg-type]
        return stream.peer_id if stream is not None and stream.handshake_done else None

    def forget(self, client: tuple[str, int]) -> None:
        self._peers.pop(client, None)

    async def aclose(self) -> None:
        await self.transport_listener.aclose()


class _ListenedStream(TlsStream):
    def __init__(self, transport: trio.SocketStream, context: SSL.Context, listener: TlsListener,
                 client: tuple[str, int]) -> None:
        super().__init__(transport, context, server_side=True)
        self._listener = listener
        self._client = client

    async def do_handshake(self) -> None:
        try:
            await super().do_handshake()
        except RemoteProtocolError as exc:
            log.info("TLS refused from %s: %s", format_addr(*self._client), exc)
            raise trio.BrokenResourceError(str(exc)) from exc  # what hypercorn expects of a failed handshake
        except TransportError as exc:
            log.debug("TLS handshake from %s failed: %s", format_addr(*self._client), exc)
            raise trio.BrokenResourceError(str(exc)) from exc

    async def aclose(self) -> None:
        self._listener.forget(self._client)
        await super().aclose()


async def connect(address: str, context: SSL.Context, timeout: float, *, expected_peer: str | None = None) -> TlsStream:
    """Dial `address`, run the TLS handshake within `timeout`, and check the server's peer id when one is
    expected (a mismatch: `RemoteProtocolError(BAD_IDENTITY)`)."""
    transport = await dial(address, timeout)
    stream = TlsStream(transport, context, server_side=False)
    try:
        with trio.fail_after(timeout):
            await stream.do_handshake()
    except trio.TooSlowError:
        await transport.aclose()
        raise LinkBroken(f"TLS handshake with {address}: no answer within {timeout} s") from None
    except BaseException:
        await transport.aclose()
        raise
    if expected_peer is not None and stream.peer_id != expected_peer:
        await stream.aclose()
        raise RemoteProtocolError(Reason.BAD_IDENTITY, f"{address} proved {stream.peer_id}, not {expected_peer}")
    return stream

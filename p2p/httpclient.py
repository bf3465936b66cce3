"""HTTP clients of the node's HTTP plane, over TLS with the node's own certificate (`p2p.tls`).

httpx and httpcore do the HTTP; this module gives httpcore a network backend (its documented extension
point) whose streams are ours: a TCP connection from `p2p.transport.dial`, upgraded by `start_tls` to a
`p2p.tls.TlsStream` with the node's certificate (httpcore calls it for https URLs; the `ssl.SSLContext` it
passes is not used: Python's ssl cannot check libp2p certificates). So an https request to a peer presents
our certificate, and the response's network stream says which peer id the server's certificate proved
(`get_extra_info("peer_id")`). Without credentials (a node started with --insecure) URLs are http and
streams stay cleartext; an https URL then fails clearly.

- `http_client(credentials, membership=..., timeout=...)`: an `httpx.AsyncClient` for any request to a peer;
  in a closed run it sends our membership in `x-diloco-membership` (p2p.access).
- `LinkStream.stop_at_head`: a read never returns bytes past the end of a message head (the blob client's
  zero-copy body path, `p2p.blobfetch`); `peek`, `recv` and `recv_into` read the link directly.
"""

from __future__ import annotations

import math
import socket
import ssl
from collections.abc import AsyncIterator, Mapping
from typing import Any

import httpcore
import httpx
import trio

from p2p.access import MEMBERSHIP_HEADER
from p2p.errors import TransportError
from p2p.tls import Credentials, TlsStream
from p2p.transport import dial, format_addr
from protocol.errors import RemoteProtocolError
from protocol.identity import Identity

_UNUSED_SSL_CONTEXT = ssl.create_default_context()  # httpcore wants one for https; `LinkStream.start_tls` ignores it


class LinkStream(httpcore.AsyncNetworkStream):
    """One connection for httpcore: cleartext TCP, or TLS after `start_tls`."""

    def __init__(self, transport: trio.SocketStream, credentials: Credentials | None, *, stop_at_head: bool) -> None:
        self.transport = transport
        self.link: trio.SocketStream | TlsStream = transport
        self._credentials = credentials
        self._stop_at_head = stop_at_head
        self._tail = b""  # the last bytes returned since the last head end (at most 2)

    # ---- the link, directly -----------------------------------------------------------------------

    async def peek(self, max_bytes: int) -> bytes:
        if isinstance(self.link, TlsStream):
            return await self.link.peek(max_bytes)
        return await self.link.socket.recv(max_bytes, socket.MSG_PEEK)

    async def recv(self, max_bytes: int) -> bytes:
        if isinstance(self.link, TlsStream):
            return await self.link.receive_some(max_bytes)
        return await self.link.socket.recv(max_bytes)

    async def recv_into(self, view: memoryview) -> int:
        if isinstance(self.link, TlsStream):
            return await self.link.receive_into(view)
        return await self.link.socket.recv_into(view)

    # ---- httpcore's interface ---------------------------------------------------------------------

    async def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        try:
            with trio.fail_after(math.inf if timeout is None else timeout):
                if not self._stop_at_head:
                    return await self.recv(max_bytes)
                # take what the link holds only up to the first blank line (h11's rule: \n\n or \n\r\n, looking
                # across the previous read's last bytes too): every body byte stays for `recv_into`
                peeked = await self.peek(max_bytes)
                end = _head_end(self._tail + peeked)
                want = len(peeked) if end is None else end - len(self._tail)
                data = await self.recv(want)
        except trio.TooSlowError as exc:
            raise httpcore.ReadTimeout(str(exc)) from exc
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, TransportError) as exc:
            raise httpcore.ReadError(f"{type(exc).__name__}: {exc}") from exc
        self._tail = b"" if end is not None and len(data) == want else (self._tail + data)[-2:]
        return data

    async def write(self, buffer: bytes, timeout: float | None = None) -> None:
        if not buffer:
            return
        try:
            with trio.fail_after(math.inf if timeout is None else timeout):
                await self.link.send_all(buffer)
        except trio.TooSlowError as exc:
            raise httpcore.WriteTimeout(str(exc)) from exc
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, TransportError) as exc:
            raise httpcore.WriteError(f"{type(exc).__name__}: {exc}") from exc

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            try:
                await self.link.aclose()
            except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, TransportError):
                pass

    async def start_tls(self, ssl_context: ssl.SSLContext, server_hostname: str | None = None,
                        timeout: float | None = None) -> httpcore.AsyncNetworkStream:
        if self._credentials is None:
            raise httpcore.ConnectError("an https URL, but this node was started with --insecure (no TLS)")
        tls = TlsStream(self.transport, self._credentials.http_client, server_side=False)
        try:
            with trio.fail_after(math.inf if timeout is None else timeout):
                await tls.do_handshake()
        except trio.TooSlowError as exc:
            raise httpcore.ConnectTimeout(f"TLS handshake: {exc}") from exc
        except (TransportError, RemoteProtocolError) as exc:
            raise httpcore.ConnectError(f"TLS handshake: {exc}") from exc
        self.link = tls
        return self

    def get_extra_info(self, info: str) -> Any:
        if info == "socket":
            return self.transport.socket
        if info == "peer_id":
            return self.link.peer_id if isinstance(self.link, TlsStream) else None
        if info == "is_readable":
            return False
        return None


def _head_end(data: bytes) -> int | None:
    """The index just past the first blank line in `data` (`\\n\\n` or `\\n\\r\\n`), or None."""
    ends = [i + len(sep) for sep in (b"\n\n", b"\n\r\n") if (i := data.find(sep)) >= 0]
    return min(ends) if ends else None


class LinkBackend(httpcore.AsyncNetworkBackend):
    def __init__(self, credentials: Credentials | None, *, stop_at_head: bool = False) -> None:
        self._credentials = credentials
        self._stop_at_head = stop_at_head

    async def connect_tcp(self, host: str, port: int, timeout: float | None = None, local_address: str | None = None,
                          socket_options: Any = None) -> httpcore.AsyncNetworkStream:
        try:
            transport = await dial(format_addr(host, port), math.inf if timeout is None else timeout)
        except TransportError as exc:
            raise httpcore.ConnectError(str(exc)) from exc
        return LinkStream(transport, self._credentials, stop_at_head=self._stop_at_head)

    async def connect_unix_socket(self, *args: Any, **kwargs: Any) -> httpcore.AsyncNetworkStream:
        raise httpcore.UnsupportedProtocol("the node's HTTP plane is TCP")

    async def sleep(self, seconds: float) -> None:
        await trio.sleep(seconds)


class LinkTransport(httpx.AsyncBaseTransport):
    """httpx transport over an httpcore pool of `LinkStream`s (public APIs only). `respond` turns httpcore's
    response into httpx's (the blob client wraps its body)."""

    def __init__(self, credentials: Credentials | None, *, max_connections: int = 16, stop_at_head: bool = False) -> None:
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=_UNUSED_SSL_CONTEXT, max_connections=max_connections,
            network_backend=LinkBackend(credentials, stop_at_head=stop_at_head),
        )

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        core_request = httpcore.Request(
            method=request.method,
            url=httpcore.URL(scheme=request.url.raw_scheme, host=request.url.raw_host, port=request.url.port,
                             target=request.url.raw_path),
            headers=request.headers.raw,
            content=request.stream,
            extensions=request.extensions,
        )
        try:
            response = await self._pool.handle_async_request(core_request)
        except httpcore.TimeoutException as exc:
            raise httpx.TimeoutException(str(exc)) from exc
        except (httpcore.NetworkError, httpcore.ProtocolError, httpcore.UnsupportedProtocol) as exc:
            raise httpx.TransportError(str(exc)) from exc
        return self.respond(response)

    def respond(self, response: httpcore.Response) -> httpx.Response:
        return httpx.Response(status_code=response.status, headers=response.headers,
                              stream=CoreBody(response.stream), extensions=response.extensions)

    async def aclose(self) -> None:
        await self._pool.aclose()


class CoreBody(httpx.AsyncByteStream):
    """httpcore's response body as httpx's, its errors as httpx's."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._inner:
                yield chunk
        except httpcore.TimeoutException as exc:
            raise httpx.TimeoutException(str(exc)) from exc
        except (httpcore.NetworkError, httpcore.ProtocolError) as exc:
            raise httpx.TransportError(str(exc)) from exc

    async def aclose(self) -> None:
        await self._inner.aclose()


def membership_headers(membership: bytes) -> dict[str, str]:
    """What a client of a closed run's HTTP plane shows besides its certificate (nothing in an open run)."""
    return {MEMBERSHIP_HEADER: membership.hex()} if membership else {}


def http_client(credentials: Credentials | None, *, membership: bytes = b"", timeout: httpx.Timeout | float = 30.0,
                headers: Mapping[str, str] | None = None, max_connections: int = 16) -> httpx.AsyncClient:
    """An httpx client for peers' HTTP planes: TLS with `credentials` (https URLs), cleartext without."""
    return httpx.AsyncClient(
        transport=LinkTransport(credentials, max_connections=max_connections),
        timeout=timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout),
        headers={**membership_headers(membership), **(headers or {})},
    )


def operator_client(identity: Identity | None = None, *, insecure: bool = False, membership: bytes = b"",
                    timeout: httpx.Timeout | float = 30.0) -> httpx.AsyncClient:
    """A client for an operator's tools (the testnet's supervisor, scripts, tests) reading nodes' HTTP planes:
    TLS with `identity`'s certificate (a fresh key by default: enough for an open run; a closed run's planes
    answer a member's key and `membership`), or cleartext for nodes started with --insecure."""
    credentials = None if insecure else Credentials(identity or Identity.generate())
    return http_client(credentials, membership=membership, timeout=timeout)

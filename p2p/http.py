"""A minimal ASGI application with mountable routes, served by hypercorn's trio worker.

The node's HTTP plane: `GET /blobs/<hex>` (see `p2p.blobserve`) plus whatever the node mounts later
(`/status`, `/metrics`, state snapshots). Handlers are `async def handler(request) -> Response`.

Contract:
- Routes match on (method, path prefix); the longest matching prefix wins. Unknown paths get 404.
- A route may be rate limited per client address (`per_client`, e.g. `"20/second"`, the `limits`
  library's notation, a moving window) and across all clients (`total`), and the whole app across all
  clients and routes (`HttpApp(total=...)`: many addresses together cannot take the node's time either). A
  request past any of them is answered 429 with `retry-after`, without calling the handler, and counted in
  `HttpApp.throttled` (by route). The per-client limit is checked first, so one flooding address does not
  use up the totals of the others.
- A request body (small control requests such as `POST /chaos`) is read whole into `Request.body`, up
  to `MAX_REQUEST_BODY` bytes; a larger one is answered 413 without calling the handler. A route added
  with `stream_body=True` (a pushed blob, `p2p.blobpush`) gets the body as `Request.stream` instead, an
  async iterator of chunks the handler must drain before it answers.
- A `Response` body is either `bytes` or an async iterator of byte chunks (streamed with
  `more_body`, so large bodies never sit in memory whole). A streamed body is pulled by its own
  task, one chunk ahead of the socket (the next chunk is read, e.g. from disk, while this one is
  sent; more read-ahead only cost CPU: more large blocks in flight for the allocator to recycle).
  When the client disconnects, the body is no longer pulled, and an async generator body is
  closed (`aclose`) whether it finished, failed or was cut off.
- The app answers the ASGI lifespan protocol (hypercorn requires it).
- `serve_http` is a trio service: `await nursery.start(serve_http, app, host, port)` returns the
  bound `(host, port)`; cancelling the nursery stops the server. With `tls=` (a pyOpenSSL context from
  `p2p.tls.Credentials`) it serves HTTPS only: hypercorn's connection handler runs over `p2p.tls.TlsListener`'s
  streams, and `Request.peer` is the peer id the client's certificate proved (None: an anonymous client).
- `HttpApp.guard`, when set, sees every request first (before the rate limits, so refused clients spend none
  of them) and may answer it instead of the route: a closed run's access check (`p2p.access`).
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections import Counter
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import trio
from hypercorn.app_wrappers import ASGIWrapper
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve
from hypercorn.trio.statsd import StatsdLogger
from hypercorn.trio.tcp_server import TCPServer
from hypercorn.trio.worker_context import WorkerContext
from hypercorn.typing import ConnectionState
from limits import RateLimitItem
from limits import parse as parse_limit
from limits.storage import MemoryStorage
from limits.strategies import MovingWindowRateLimiter

from OpenSSL import SSL

from p2p.errors import TransportError
from p2p.tls import TlsListener
from p2p.transport import listener_addr, open_listener
from protocol.errors import LocalProtocolError

log = logging.getLogger("p2p.http")


MAX_REQUEST_BODY = 64 << 10


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    query: bytes
    headers: dict[str, str]
    client: tuple[str, int] | None
    body: bytes = b""
    peer: str | None = None  # the peer id the client's TLS certificate proved (None: anonymous, or cleartext)
    stream: AsyncIterator[bytes] | None = None  # the body, for a route with `stream_body` (then `body` is b"")

    def json(self) -> object:
        """The body parsed as JSON. Raises ValueError for anything that is not (bad UTF-8, bad JSON, or
        nesting too deep for the parser: a RecursionError would otherwise escape as a 500)."""
        try:
            return json.loads(self.body)
        except RecursionError:
            raise ValueError("JSON nested too deeply") from None


@dataclass
class Response:
    status: int = 200
    body: bytes | AsyncIterator[bytes] = b""
    headers: dict[str, str] = field(default_factory=dict)
    content_length: int | None = None  # required for streamed bodies that announce a length

    @classmethod
    def text(cls, status: int, text: str, content_type: str = "text/plain; charset=utf-8") -> Response:
        return cls(status, text.encode(), {"content-type": content_type})


Handler = Callable[[Request], Awaitable[Response]]


@dataclass(frozen=True)
class _Route:
    prefix: str
    handler: Handler
    per_client: RateLimitItem | None
    total: RateLimitItem | None
    stream_body: bool = False


class HttpApp:
    """An ASGI app whose routes can be added while it runs."""

    def __init__(self, *, total: str | None = None) -> None:
        """`total`: at most this many requests (e.g. "1000/second") across all routes and clients."""
        self._routes: dict[tuple[str, str], _Route] = {}
        self._limiter = MovingWindowRateLimiter(MemoryStorage())
        self._total = parse_limit(total) if total else None
        self.throttled: Counter[str] = Counter()  # requests answered 429, by route prefix
        self.guard: Callable[[Request], Response | None] | None = None  # an answer instead of the route's
        self.peer_of: Callable[[tuple[str, int] | None], str | None] = lambda _client: None  # set by serve_http

    def route(self, method: str, prefix: str, handler: Handler, *, per_client: str | None = None,
              total: str | None = None, stream_body: bool = False) -> None:
        """Serve requests `method` whose path starts with `prefix` by `handler` (replaces any), at most
        `per_client` requests (e.g. "20/second") per client address and `total` across all clients."""
        if not prefix.startswith("/"):
            raise LocalProtocolError(f"route prefix must start with '/': {prefix!r}")
        self._routes[(method.upper(), prefix)] = _Route(
            prefix, handler, parse_limit(per_client) if per_client else None, parse_limit(total) if total else None,
            stream_body)

    def _find(self, method: str, path: str) -> _Route | None:
        best: _Route | None = None
        for (m, prefix), route in self._routes.items():
            if m == method and path.startswith(prefix) and (best is None or len(prefix) > len(best.prefix)):
                best = route
        return best

    def _allowed(self, route: _Route, client: tuple[str, int] | None) -> bool:
        """Per client first, then the route's total, then the app's (a hit counts against each it passes)."""
        hit = self._limiter.hit
        if ((route.per_client is None or hit(route.per_client, route.prefix, client[0] if client else "?"))
                and (route.total is None or hit(route.total, route.prefix, "*"))
                and (self._total is None or hit(self._total, "*", "*"))):
            return True
        self.throttled[route.prefix] += 1
        return False

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        found = self._find(scope["method"], scope["path"])
        streamed = found is not None and found.stream_body
        body = b"" if streamed else await _read_body(receive)
        if body is None:
            await _send_response(send, receive, Response.text(413, "request body too large\n"))
            return
        client = tuple(scope["client"]) if scope.get("client") else None
        request = Request(
            method=scope["method"],
            path=scope["path"],
            query=scope.get("query_string", b""),
            headers={k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]},
            client=client,
            body=body,
            peer=self.peer_of(client),
            stream=_body_chunks(receive) if streamed else None,
        )
        refusal = self.guard(request) if self.guard is not None else None
        if refusal is not None:
            response = refusal
        elif found is None:
            response = Response.text(404, "not found\n")
        elif not self._allowed(found, request.client):
            response = Response(429, b"too many requests\n", {"retry-after": "1"})
        else:
            response = await found.handler(request)
        await _send_response(send, receive, response)


async def _read_body(receive: Any) -> bytes | None:
    """The whole request body, or None if it exceeds MAX_REQUEST_BODY (or the client left early)."""
    body = bytearray()
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return None
        body += message.get("body", b"")
        if len(body) > MAX_REQUEST_BODY:
            return None
        if not message.get("more_body", False):
            return bytes(body)


async def _body_chunks(receive: Any) -> AsyncIterator[bytes]:
    """A request body as it arrives; raises TransportError if the client leaves before its end."""
    while True:
        message = await receive()
        if message["type"] != "http.request":
            raise TransportError("the client left before the end of its request body")
        if chunk := message.get("body", b""):
            yield chunk
        if not message.get("more_body", False):
            return


async def _lifespan(receive: Any, send: Any) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _send_response(send: Any, receive: Any, response: Response) -> None:
    headers = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in response.headers.items()]
    body = response.body
    if isinstance(body, bytes | bytearray | memoryview):
        headers.append((b"content-length", str(len(body)).encode()))
        await send({"type": "http.response.start", "status": response.status, "headers": headers})
        await send({"type": "http.response.body", "body": bytes(body), "more_body": False})
        return
    if response.content_length is not None:
        headers.append((b"content-length", str(response.content_length).encode()))
    await send({"type": "http.response.start", "status": response.status, "headers": headers})
    chunks_in, chunks_out = trio.open_memory_channel[bytes](0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_produce, body, chunks_in)
        nursery.start_soon(_cancel_on_disconnect, receive, nursery.cancel_scope)
        async with chunks_out:
            async for chunk in chunks_out:
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        nursery.cancel_scope.cancel()  # done: stop watching


async def _cancel_on_disconnect(receive: Any, scope: trio.CancelScope) -> None:
    """Hypercorn drops what an app sends after the client left; stop producing the body instead."""
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


async def _produce(body: AsyncIterator[bytes], out: trio.MemorySendChannel[bytes]) -> None:
    """Pull a streamed body into `out` (unbuffered: one chunk is read while the last one is sent).
    An async generator body is closed here, even when cancelled."""
    async with out, _closing(body):
        async for chunk in body:
            await out.send(chunk)


def _closing(body: AsyncIterator[bytes]) -> contextlib.AbstractAsyncContextManager[object]:
    return contextlib.aclosing(body) if isinstance(body, AsyncGenerator) else contextlib.nullcontext()


def _hypercorn_config(host: str, port: int) -> HypercornConfig:
    config = HypercornConfig()
    config.bind = [f"{host}:{port}" if ":" not in host else f"[{host}]:{port}"]
    config.accesslog = None
    config.errorlog = log
    config.graceful_timeout = 0.5
    config.keep_alive_timeout = 30.0
    return config


async def serve_http(
    app: HttpApp, host: str, port: int, *, tls: SSL.Context | None = None,
    task_status: trio.TaskStatus[tuple[str, int]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `app` on `host:port` (port 0 picks one) until cancelled, over TLS with `tls`; reports the bound
    address. Raises TransportError if it cannot listen there (address in use, not an address of this host)."""
    if tls is not None:
        await _serve_tls(app, host, port, tls, task_status)
        return
    try:
        async with trio.open_nursery() as nursery:
            bound = await nursery.start(serve, app, _hypercorn_config(host, port))
            address = bound[0].removeprefix("http://")
            bound_host, _, bound_port = address.rpartition(":")
            task_status.started((bound_host.strip("[]"), int(bound_port)))
    except BaseExceptionGroup as group:  # hypercorn binds inside its nursery
        bind_errors, other = group.split(OSError)
        if bind_errors is None or other is not None:
            raise
        exc = _first_leaf(bind_errors)
        raise TransportError(f"cannot listen on {_hypercorn_config(host, port).bind[0]}: {exc.strerror or exc}") from None


async def _serve_tls(app: HttpApp, host: str, port: int, context: SSL.Context,
                     task_status: trio.TaskStatus[tuple[str, int]]) -> None:
    """hypercorn's HTTP/1.1 connection handler over our TLS streams: its own TLS is Python's `ssl`, which cannot
    check a libp2p certificate (`p2p.tls`). The ASGI lifespan is skipped: the app keeps no state across it."""
    listener = await open_listener(host, port)
    tls_listener = TlsListener(listener, context)
    app.peer_of = tls_listener.peer_of
    config = _hypercorn_config(host, port)
    config.set_statsd_logger_class(StatsdLogger)
    context_ = WorkerContext(None)
    wrapped = ASGIWrapper(app)

    async def handle(stream: trio.abc.Stream) -> None:
        await TCPServer(wrapped, config, context_, ConnectionState({}), stream).run()  # type: ignore[arg-type]

    async with tls_listener, trio.open_nursery() as nursery:
        await nursery.start(trio.serve_listeners, handle, [tls_listener])
        task_status.started(listener_addr(listener))


def _first_leaf(group: BaseExceptionGroup) -> BaseException:
    first = group.exceptions[0]
    return _first_leaf(first) if isinstance(first, BaseExceptionGroup) else first

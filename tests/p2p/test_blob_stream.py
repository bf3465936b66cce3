"""Tier (b): the blob plane's fast paths on loopback.

The client lets h11 parse the response head and then reads the body straight from the socket
(`LinkStream.stop_at_head`, `_Body.readinto`); these tests pin that against a hand-driven HTTP/1.1 server that cuts
the response into TCP writes wherever it likes (inside the blank line that ends the head too), and
check that a server's streamed body stops when its client goes.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import httpx
import pytest
import trio

from p2p.blobfetch import BlobClient
from p2p.httpclient import LinkStream
from p2p.blobstore import BlobStore, blob_hex
from p2p.counters import Counters, Kind
from p2p.errors import TransportError
from p2p.http import MAX_REQUEST_BODY, HttpApp, Request, Response, serve_http
from protocol.errors import Reason, RemoteProtocolError


async def serve_split(
    nursery: trio.Nursery, head: bytes, body: bytes, cuts: Sequence[int], *, then_stall: bool = False
) -> str:
    """A one-shot HTTP server: reads the request head, then sends `head + body` as separate writes
    cut at the offsets `cuts` (into the whole response), then closes (or stalls)."""
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]

    async def one(stream: trio.SocketStream) -> None:
        async with stream:
            request = b""
            while b"\r\n\r\n" not in request:
                request += await stream.receive_some(4096)
            whole = head + body
            edges = [0, *sorted(cuts), len(whole)]
            for a, b in zip(edges, edges[1:], strict=False):
                if b > a:
                    await stream.send_all(whole[a:b])
                    await trio.sleep(0)
            if then_stall:
                await trio.sleep_forever()

    async def accept_once() -> None:
        async with listener:
            stream = await listener.accept()
            await one(stream)

    nursery.start_soon(accept_once)
    port = listener.socket.getsockname()[1]
    return f"http://127.0.0.1:{port}"


async def test_a_head_read_stops_at_the_blank_line_even_across_reads() -> None:
    a, b = trio.socket.socketpair()
    with a, b:
        stream = LinkStream(trio.SocketStream(a), None, stop_at_head=True)
        await b.send(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r")
        assert await stream.read(65536) == b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r"
        await b.send(b"\nhello")
        assert await stream.read(65536) == b"\n"  # the head ends here; the body stays in the socket
        assert await a.recv(100) == b"hello"
        await b.send(b"HTTP/1.1 200 OK\n\nbody\n\nmore")  # h11 also ends a head at a bare LF LF
        assert await stream.read(65536) == b"HTTP/1.1 200 OK\n\n"


def ok_head(length: int | None) -> bytes:
    lines = [b"HTTP/1.1 200 OK", b"content-type: application/octet-stream"]
    if length is not None:
        lines.append(b"content-length: %d" % length)
    return b"\r\n".join(lines) + b"\r\n\r\n"


@pytest.mark.parametrize(
    ("read_bytes", "where"),
    [
        (1 << 20, "head alone, then the body"),
        (1 << 20, "head with the first body bytes"),
        (1 << 20, "everything in one write"),
        (4096, "head with more body than one buffer"),
        (4096, "many small writes"),
        (1 << 20, "the blank line cut after CR LF CR"),
        (1 << 20, "the blank line cut after CR LF"),
        (1 << 20, "the blank line cut after CR"),
        (4096, "byte by byte"),
    ],
)
async def test_a_body_arrives_whole_however_the_writes_are_cut(tmp_path: Path, read_bytes: int, where: str) -> None:
    body = os.urandom(100_000)
    head = ok_head(len(body))
    cuts = {
        "head alone, then the body": [len(head)],
        "head with the first body bytes": [len(head) + 777],
        "everything in one write": [],
        "head with more body than one buffer": [len(head) + 3 * 4096 + 5],
        "many small writes": list(range(7, len(head) + len(body), 999)),
        "the blank line cut after CR LF CR": [len(head) - 1],
        "the blank line cut after CR LF": [len(head) - 2],
        "the blank line cut after CR": [len(head) - 3],
        "byte by byte": list(range(1, len(head) + 64)),
    }[where]
    store = BlobStore(tmp_path)
    counters = Counters()
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            url = await serve_split(nursery, head, body, cuts)
            async with BlobClient(store, counters, local_peer="B", read_bytes=read_bytes, queue_chunks=2) as client:
                await client.fetch_once("A", url, blob_hex(body), len(body))
    assert store.read(blob_hex(body)) == body
    assert counters.traffic("A", Kind.BLOB).recv_bytes == len(body)


async def test_a_body_without_content_length_is_refused(tmp_path: Path) -> None:
    body = os.urandom(5000)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            url = await serve_split(nursery, ok_head(None), body, [])
            async with BlobClient(BlobStore(tmp_path), Counters(), local_peer="B") as client:
                with pytest.raises(RemoteProtocolError) as err:
                    await client.fetch_once("A", url, blob_hex(body), len(body))
    assert err.value.reason is Reason.MALFORMED
    assert list(tmp_path.glob("*.part")) == []


async def test_a_body_cut_short_is_a_transport_error(tmp_path: Path) -> None:
    body = os.urandom(300_000)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            url = await serve_split(nursery, ok_head(len(body)), body[:200_000], [1000])
            async with BlobClient(BlobStore(tmp_path), Counters(), local_peer="B", read_bytes=65536) as client:
                with pytest.raises(TransportError, match="body bytes to come"):
                    await client.fetch_once("A", url, blob_hex(body), len(body))
    assert list(tmp_path.glob("*.part")) == []


async def test_a_stalled_body_times_out(tmp_path: Path, autojump_clock: trio.abc.Clock) -> None:
    body = os.urandom(300_000)
    with trio.fail_after(100):
        async with trio.open_nursery() as nursery:
            url = await serve_split(nursery, ok_head(len(body)), body[:200_000], [50_000], then_stall=True)
            async with BlobClient(BlobStore(tmp_path), Counters(), local_peer="B", timeout=5.0) as client:
                t0 = trio.current_time()
                with pytest.raises(TransportError, match="ReadTimeout"):
                    await client.fetch_once("A", url, blob_hex(body), len(body))
                assert 5.0 <= trio.current_time() - t0 < 6.0
            nursery.cancel_scope.cancel()
    assert list(tmp_path.glob("*.part")) == []


async def test_a_streamed_body_is_closed_when_the_client_goes_away() -> None:
    closed = trio.Event()
    sent: list[int] = []

    async def chunks() -> AsyncIterator[bytes]:
        try:
            for i in range(1000):
                sent.append(i)
                yield bytes(1 << 20)
        finally:
            closed.set()

    async def endless(request: Request) -> Response:
        return Response(200, chunks(), content_length=1000 << 20)

    app = HttpApp()
    app.route("GET", "/endless", endless)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            host, port = await nursery.start(serve_http, app, "127.0.0.1", 0)
            async with httpx.AsyncClient() as client, client.stream("GET", f"http://{host}:{port}/endless") as response:
                assert response.status_code == 200  # leave with the body unread: the connection closes
            await closed.wait()
            nursery.cancel_scope.cancel()
    assert len(sent) < 1000


async def test_a_request_body_reaches_the_handler_and_an_oversized_one_is_refused() -> None:
    seen: list[bytes] = []

    async def echo(request: Request) -> Response:
        seen.append(request.body)
        return Response(200, request.body)

    app = HttpApp()
    app.route("POST", "/echo", echo)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            host, port = await nursery.start(serve_http, app, "127.0.0.1", 0)
            async with httpx.AsyncClient() as client:
                ok = await client.post(f"http://{host}:{port}/echo", content=b'{"x": 1}')
                big = await client.post(f"http://{host}:{port}/echo", content=bytes(MAX_REQUEST_BODY + 1))
            nursery.cancel_scope.cancel()
    assert (ok.status_code, ok.content) == (200, b'{"x": 1}')
    assert big.status_code == 413
    assert seen == [b'{"x": 1}']


async def test_a_rate_limited_route_answers_429_past_its_limit_per_client_and_counts_it() -> None:
    calls: list[str] = []

    async def heavy(request: Request) -> Response:
        calls.append(request.path)
        return Response(200, b"ok")

    app = HttpApp()
    app.route("GET", "/heavy", heavy, per_client="3/minute")
    app.route("GET", "/light", heavy)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            host, port = await nursery.start(serve_http, app, "127.0.0.1", 0)
            async with httpx.AsyncClient() as client:
                heavy_codes = [(await client.get(f"http://{host}:{port}/heavy")).status_code for _ in range(5)]
                light_codes = [(await client.get(f"http://{host}:{port}/light")).status_code for _ in range(5)]
                refused = await client.get(f"http://{host}:{port}/heavy")
            nursery.cancel_scope.cancel()
    assert heavy_codes == [200, 200, 200, 429, 429] and light_codes == [200] * 5
    assert refused.headers["retry-after"] == "1"
    assert calls.count("/heavy") == 3, "a refused request never reaches the handler"
    assert app.throttled["/heavy"] == 3


async def serve_trickle(nursery: trio.Nursery, head: bytes, body: bytes, *, head_too: bool, every_s: float) -> str:
    """A one-shot tarpit: sends the response (from its first byte if `head_too`, else after the head)
    one byte per `every_s` seconds."""
    listener = (await trio.open_tcp_listeners(0, host="127.0.0.1"))[0]

    async def accept_once() -> None:
        async with listener:
            stream = await listener.accept()
            async with stream:
                while b"\r\n\r\n" not in await stream.receive_some(4096):
                    pass
                if not head_too:
                    await stream.send_all(head)
                for byte in (head if head_too else b"") + body:
                    await stream.send_all(bytes([byte]))
                    await trio.sleep(every_s)

    nursery.start_soon(accept_once)
    return f"http://127.0.0.1:{listener.socket.getsockname()[1]}"


@pytest.mark.parametrize("head_too", [False, True], ids=["body", "head"])
async def test_a_holder_under_the_minimum_rate_is_dropped_as_too_slow_after_the_grace(
        tmp_path: Path, autojump_clock: trio.abc.Clock, head_too: bool) -> None:
    body = os.urandom(50_000)
    with trio.fail_after(1000):
        async with trio.open_nursery() as nursery:
            # a byte every 20 s never trips the 60 s silence timeout: only the rate floor ends it
            url = await serve_trickle(nursery, ok_head(len(body)), body, head_too=head_too, every_s=20.0)
            async with BlobClient(BlobStore(tmp_path), Counters(), local_peer="B", timeout=60.0,
                                  min_rate=10_000, grace=10.0) as client:
                t0 = trio.current_time()
                with pytest.raises(RemoteProtocolError) as err:
                    await client.fetch_once("A", url, blob_hex(body), len(body))
                assert err.value.reason is Reason.TOO_SLOW
                assert 10.0 <= trio.current_time() - t0 < 11.0
            nursery.cancel_scope.cancel()
    assert list(tmp_path.glob("*.part")) == []


async def test_a_holder_at_the_minimum_rate_finishes(tmp_path: Path) -> None:
    body = os.urandom(100)
    with trio.fail_after(30):  # real time: the autojump clock would jump past the store's worker thread
        async with trio.open_nursery() as nursery:
            # ~200 B/s (less under load) against a floor of 25 B/s after 0.2 s: slow, but never behind
            url = await serve_trickle(nursery, ok_head(len(body)), body, head_too=False, every_s=0.005)
            async with BlobClient(BlobStore(tmp_path), Counters(), local_peer="B", min_rate=25, grace=0.2) as client:
                await client.fetch_once("A", url, blob_hex(body), len(body))
            nursery.cancel_scope.cancel()
    assert BlobStore(tmp_path).size(blob_hex(body)) == len(body)

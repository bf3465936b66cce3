"""Tier (b): one blob fetched as byte ranges at once, from several holders (`BlobClient.fetch_ranges`,
`Range` requests served by `p2p.blobserve`), on loopback: the ranges add up to the verified blob; a holder
that fails mid-range is resumed by the next from the byte it reached; wrong bytes from any holder fail the
hash and leave nothing; a holder counts a peer as served once its ranges add up to the blob."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing

from p2p.blobfetch import BlobClient
from p2p.blobserve import BlobService, parse_range
from p2p.blobstore import BlobStore
from p2p.counters import Counters, Kind
from p2p.errors import TransportError
from p2p.http import HttpApp, Request, Response, serve_http
from protocol.errors import Reason, RemoteProtocolError


def test_range_headers() -> None:
    assert parse_range(None, 100) is None and parse_range("bytes=0-", 100) == (0, 100)
    assert parse_range("bytes=10-19", 100) == (10, 20) and parse_range("bytes=90-500", 100) == (90, 100)
    assert parse_range("bytes=100-", 100) == "unsatisfiable" and parse_range("bytes=5-4", 100) == "unsatisfiable"
    assert parse_range("bytes=0-1,5-6", 100) is None and parse_range("items=0-1", 100) is None  # ignored


async def serve(nursery: trio.Nursery, store: BlobStore, counters: Counters, *, cut_after: int | None = None) -> str:
    """A holder's blob plane; with `cut_after`, every body it sends stops after that many bytes (a holder that
    dies mid-transfer)."""
    app = HttpApp()
    service = BlobService(store, counters, chunk_bytes=256 << 10)
    if cut_after is None:
        service.mount(app)
    else:
        async def cut(request: Request) -> Response:
            response = await service.handle(request)
            whole = response.body

            async def short():
                sent = 0
                async for chunk in whole:
                    if sent >= cut_after:
                        return
                    yield chunk[: cut_after - sent]
                    sent += len(chunk)
            return Response(response.status, short(), response.headers, content_length=response.content_length)

        app.route("GET", "/blobs/", cut)
    host, port = await nursery.start(serve_http, app, "127.0.0.1", 0)
    return f"http://{host}:{port}"


async def test_ranges_from_two_holders_add_up_to_the_verified_blob(tmp_path: Path) -> None:
    data = os.urandom(5 * 1024 * 1024 + 3)
    a, b, dst = BlobStore(tmp_path / "a"), BlobStore(tmp_path / "b"), BlobStore(tmp_path / "dst")
    name = a.put(data)
    b.put(data)
    ca, cb, fetched = Counters(), Counters(), Counters()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            ua, ub = await serve(nursery, a, ca), await serve(nursery, b, cb)
            async with BlobClient(dst, fetched, local_peer="D") as client:
                failed = await client.fetch_ranges([("A", ua), ("B", ub)], name, len(data), 4)
                assert failed == {} and dst.read(name) == data
                await trio.testing.wait_all_tasks_blocked()
                sent_a = ca.traffic("D", Kind.BLOB).sent_bytes
                sent_b = cb.traffic("D", Kind.BLOB).sent_bytes
                assert sent_a + sent_b == len(data) and sent_a > 0 and sent_b > 0, "each holder sent its ranges"
                assert fetched.total(Kind.BLOB).recv_bytes == len(data) and fetched.blob_downloads == 1
                async with httpx.AsyncClient() as plain:
                    part = await plain.get(f"{ua}/blobs/{name}", headers={"range": "bytes=10-19"})
                    assert part.status_code == 206 and part.content == data[10:20]
                    assert part.headers["content-range"] == f"bytes 10-19/{len(data)}"
                    assert (await plain.get(f"{ua}/blobs/{name}", headers={"range": "bytes=99999999-"})
                            ).status_code == 416
            nursery.cancel_scope.cancel()
    assert list((tmp_path / "dst").rglob("*.part")) == []


async def test_a_holder_that_dies_mid_range_is_resumed_by_the_next(tmp_path: Path) -> None:
    data = os.urandom(4 * 1024 * 1024)
    a, b, dst = BlobStore(tmp_path / "a"), BlobStore(tmp_path / "b"), BlobStore(tmp_path / "dst")
    name = a.put(data)
    b.put(data)
    cb = Counters()
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            dying = await serve(nursery, a, Counters(), cut_after=300_000)
            whole = await serve(nursery, b, cb)
            async with BlobClient(dst, Counters(), local_peer="D", timeout=5) as client:
                failed = await client.fetch_ranges([("A", dying), ("B", whole)], name, len(data), 2)
                assert set(failed) == {"A"} and isinstance(failed["A"], TransportError)
                assert dst.read(name) == data
                assert cb.traffic("D", Kind.BLOB).sent_bytes >= len(data) // 2, "B sent its range and A's rest"
            nursery.cancel_scope.cancel()


async def test_wrong_bytes_from_one_holder_fail_the_hash_and_leave_nothing(tmp_path: Path) -> None:
    data = os.urandom(3 * 1024 * 1024)
    a, b, dst = BlobStore(tmp_path / "a"), BlobStore(tmp_path / "b"), BlobStore(tmp_path / "dst")
    name = a.put(data)
    b.put(data)
    b.path(name).write_bytes(os.urandom(len(data)))  # tampered after verification
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            ua, ub = await serve(nursery, a, Counters()), await serve(nursery, b, Counters())
            async with BlobClient(dst, Counters(), local_peer="D") as client:
                with pytest.raises(RemoteProtocolError) as err:
                    await client.fetch_ranges([("A", ua), ("B", ub)], name, len(data), 2)
                assert err.value.reason is Reason.HASH_MISMATCH
                with pytest.raises(TransportError):  # nobody serves it: the range's first failure
                    await client.fetch_ranges([("A", "http://127.0.0.1:1")], name, len(data), 2)
            nursery.cancel_scope.cancel()
    assert not dst.has(name) and list((tmp_path / "dst").rglob("*.part")) == []

"""Tier (b): a failed blob download never crashes a node. Whatever a holder does (answers 404 because it
removed the blob, resets or closes the connection mid-body, sends a short body), the fetch raises the p2p
layer's one domain exception, `TransportError` (never an exception group), the host counts it and moves
on to the next holder, and keeps running. A holder that removes a blob while sending it sends it whole."""

from __future__ import annotations

import functools
import os
import socket
from pathlib import Path

import httpx
import pytest
import trio

from p2p.blobfetch import BlobClient, _one_exception
from p2p.blobserve import BlobService
from p2p.blobstore import BlobStore
from p2p.counters import Counters
from p2p.errors import BlobGone, TransportError
from p2p.http import HttpApp, serve_http
from p2p_helpers import host_config, start, wait_for
from protocol.errors import Reason, RemoteProtocolError


async def _serve(nursery: trio.Nursery, store: BlobStore) -> str:
    app = HttpApp()
    BlobService(store, Counters(), chunk_bytes=64 * 1024).mount(app)
    host, port = await nursery.start(serve_http, app, "127.0.0.1", 0)
    return f"http://{host}:{port}"


async def _raw_holder(nursery: trio.Nursery, mode: str, data: bytes) -> str:
    """An HTTP 'holder' written by hand: answers every request per `mode`, then hangs up."""

    async def handle(stream: trio.SocketStream) -> None:
        async with stream:
            request = b""
            while b"\r\n\r\n" not in request:
                chunk = await stream.receive_some(4096)
                if not chunk:
                    return
                request += chunk
            if mode == "404":
                await stream.send_all(b"HTTP/1.1 404 Not Found\r\ncontent-length: 13\r\n\r\nno such blob\n")
                return
            head = f"HTTP/1.1 200 OK\r\ncontent-length: {len(data)}\r\n\r\n".encode()
            await stream.send_all(head + data[: len(data) // 2])
            if mode == "reset":  # an abortive close: the client's next read fails with ECONNRESET
                stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")

    listeners = await nursery.start(functools.partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
    return f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"


@pytest.mark.parametrize("mode", ["404", "reset", "closed"])
async def test_a_holder_that_fails_mid_download_raises_the_domain_error(tmp_path: Path, mode: str) -> None:
    data = os.urandom(256 * 1024)
    name = BlobStore(tmp_path / "src").put(data)
    store = BlobStore(tmp_path / "dst")
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            url = await _raw_holder(nursery, mode, data)
            async with BlobClient(store, Counters(), local_peer="B", read_bytes=16 * 1024) as client:
                with pytest.raises(TransportError, match="404" if mode == "404" else "GET") as failed:
                    await client.fetch_once("A", url, name, len(data))
                assert isinstance(failed.value, BlobGone) == (mode == "404")  # gone: not asked again
            assert not store.has(name) and list((tmp_path / "dst").glob("*.part")) == []
            nursery.cancel_scope.cancel()


async def test_a_blob_removed_while_it_is_served_is_sent_whole_and_then_is_a_404(tmp_path: Path) -> None:
    store = BlobStore(tmp_path / "a")
    data = os.urandom(3 * 1024 * 1024)
    name = store.put(data)
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            url = await _serve(nursery, store)
            async with httpx.AsyncClient() as client, client.stream("GET", f"{url}/blobs/{name}") as response:
                assert response.status_code == 200
                store.remove(name)  # e.g. an old snapshot pruned while a peer downloads it
                assert await response.aread() == data
            async with httpx.AsyncClient() as client:
                assert (await client.get(f"{url}/blobs/{name}")).status_code == 404
            nursery.cancel_scope.cancel()


async def test_the_host_falls_back_to_another_holder_counts_the_failure_and_keeps_running(tmp_path: Path) -> None:
    data = os.urandom(200_000)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            gone = await start(nursery, host_config(tmp_path, "gone"))
            holder = await start(nursery, host_config(tmp_path, "holder", bootstrap=(gone.gossip_addr,)))
            fetcher = await start(nursery, host_config(tmp_path, "fetcher", bootstrap=(gone.gossip_addr,
                                                                                       holder.gossip_addr)))
            await wait_for(lambda: len(fetcher.connected_peers()) == 2, what="the connections")
            name = await holder.add_blob(data)
            assert await gone.add_blob(data) == name
            gone.store.remove(name)  # announced once, gone now: its GET answers 404
            path = await fetcher.fetch_blob(name, len(data), [gone.peer_id, holder.peer_id])
            assert path.read_bytes() == data
            assert fetcher.counters.blob_fetch_failures == 1
            assert fetcher.counters.events["blob_fetch_failed:transport"] == 1, "the reason is counted"
            with pytest.raises(TransportError, match="no peer of 1"):
                await fetcher.fetch_blob("ab" * 32, 10, [gone.peer_id])
            assert fetcher.counters.blob_fetch_failures == 2
            other = await holder.add_blob(os.urandom(1000))  # still running: fetches and serves
            assert (await fetcher.fetch_blob(other, 1000, [holder.peer_id])).exists()
            nursery.cancel_scope.cancel()


async def test_cancellation_wins_over_a_failure_raised_beside_it_and_nothing_escapes_as_a_group() -> None:
    failure = TransportError("GET x answered 404", peer="A")
    with trio.CancelScope() as scope:
        scope.cancel()
        try:
            await trio.sleep(0)
        except trio.Cancelled as exc:
            # What a download's nursery raises when the host closes as a holder answers 404.
            group = BaseExceptionGroup("nursery", [failure, BaseExceptionGroup("inner", [exc])])
            assert _one_exception(group, "x", "A") is exc
            raise
    assert scope.cancelled_caught
    mixed = ExceptionGroup("nursery", [httpx.ReadError("reset"), RemoteProtocolError(Reason.TRUNCATED, "short")])
    first = _one_exception(mixed, "http://a/blobs/x", "A")
    assert isinstance(first, TransportError) and isinstance(first.__cause__, httpx.ReadError)
    assert isinstance(_one_exception(ExceptionGroup("g", [OSError("disk")]), "u", "A"), TransportError)
    bug = ExceptionGroup("nursery", [failure, ValueError("a bug")])
    assert _one_exception(bug, "x", "A") is bug

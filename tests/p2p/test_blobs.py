"""Tier (b): the content-addressed blob store and the HTTP blob plane (hypercorn + httpx)."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
import trio
import trio.testing

from p2p.blobfetch import BlobClient
from p2p.blobserve import BlobService
from p2p.blobstore import BlobStore, blob_hex
from p2p.counters import Counters, Kind
from p2p.errors import TransportError
from p2p.http import HttpApp, Request, Response, serve_http
from protocol.errors import LocalProtocolError, Reason, RemoteProtocolError


def test_store_verifies_before_publishing_and_cleans_up(tmp_path: Path) -> None:
    store = BlobStore(tmp_path)
    data = os.urandom(10_000)
    name = store.put(data)
    assert name == blob_hex(data) and store.has(name) and store.read(name) == data and store.size(name) == 10_000
    assert store.put(data) == name  # idempotent

    other = os.urandom(100)
    for chunks, reason in [
        ([other, b"x"], Reason.OVERSIZED),
        ([other[:50]], Reason.TRUNCATED),
        ([bytes(100)], Reason.HASH_MISMATCH),
    ]:
        writer = store.open_writer(blob_hex(other), 100)
        with pytest.raises(RemoteProtocolError) as err:
            for chunk in chunks:
                writer.write(chunk)
            writer.commit()
        writer.close()
        assert err.value.reason is reason
    assert not store.has(blob_hex(other))
    assert list(tmp_path.glob("*.part")) == []
    (tmp_path / f"{name}.dead.part").write_bytes(b"left by a crash")
    reopened = BlobStore(tmp_path)
    assert reopened.names() == [name] and list(tmp_path.glob("*.part")) == []
    reopened.remove(name)
    assert not reopened.has(name) and not (tmp_path / name).exists()
    with pytest.raises(LocalProtocolError):
        store.open_writer("not-hex", 1)
    outside = tmp_path / "checkpoint.bin"
    outside.write_bytes(data * 3)
    copied = store.put_file(outside, chunk_bytes=4096)
    assert copied == blob_hex(data * 3) and store.read(copied) == data * 3 and outside.exists()
    assert store.put_file(outside) == copied and list(tmp_path.glob("*.part")) == []


def test_a_kept_blob_removed_meanwhile_stays_readable_until_its_last_keeper_releases_it(tmp_path: Path) -> None:
    """A reader that holds a blob's path (a state download between fetch and load) keeps it; a removal by
    someone else (the clean-up, a failed download) hides it at once and deletes the file at the last release,
    unless the blob was stored again meanwhile."""
    store = BlobStore(tmp_path)
    data, other = os.urandom(1000), os.urandom(500)
    name, second = store.put(data), store.put(other)
    path = store.path(name)
    store.keep([name])
    with store.kept([name, second]):
        store.remove(name)
        assert not store.has(name) and name not in store.names(), "hidden: no longer served or listed"
        assert path.read_bytes() == data, "the keepers' path still reads the whole blob"
    assert path.exists(), "one keeper is left"
    store.release([name])
    assert not path.exists() and not store.has(name)
    assert store.has(second), "kept and released without a removal: untouched"

    with store.kept([name]):  # kept before it is stored (a blob being fetched), removed, then stored again
        assert store.put(data) == name
        store.remove(name)
        assert store.put(data) == name
    assert store.has(name) and store.read(name) == data, "stored again after the removal: it stays"
    store.remove(name)
    assert not path.exists(), "a blob nobody keeps is deleted at once"


async def serve(nursery: trio.Nursery, store: BlobStore, counters: Counters) -> str:
    app = HttpApp()
    BlobService(store, counters, chunk_bytes=1 << 20).mount(app)

    async def hello(request: Request) -> Response:
        return Response.text(200, f"hi {request.query.decode()}\n")

    app.route("GET", "/hello", hello)
    host, port = await nursery.start(serve_http, app, "127.0.0.1", 0)
    return f"http://{host}:{port}"


async def test_blob_is_streamed_verified_and_counted(tmp_path: Path) -> None:
    src, dst = BlobStore(tmp_path / "a"), BlobStore(tmp_path / "b")
    data = os.urandom(3 * 1024 * 1024 + 17)
    name = src.put(data)
    served, fetched = Counters(), Counters()
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            url = await serve(nursery, src, served)
            async with BlobClient(dst, fetched, local_peer="B") as client:
                await client.fetch_once("A", url, name, len(data))
                assert dst.read(name) == data
                assert fetched.total(Kind.BLOB).recv_bytes == len(data) and fetched.blob_downloads == 1
                assert fetched.traffic("A", Kind.BLOB).recv_frames == 1
                await trio.testing.wait_all_tasks_blocked()
                assert served.traffic("B", Kind.BLOB).sent_bytes == len(data) and served.blobs_served == 1

                with pytest.raises(TransportError, match="404"):
                    await client.fetch_once("A", url, "ab" * 32, 10)
                with pytest.raises(RemoteProtocolError) as err:  # the header announced another size
                    await client.fetch_once("A", url, name, len(data) - 1)
                assert err.value.reason is Reason.OVERSIZED
                with pytest.raises(TransportError):
                    await client.fetch_once("A", "http://127.0.0.1:1", name, len(data))
                assert list((tmp_path / "b").glob("*.part")) == []

                async with httpx.AsyncClient() as plain:
                    assert (await plain.get(f"{url}/hello?x")).text == "hi x\n"
                    assert (await plain.get(f"{url}/nothing")).status_code == 404
                    assert (await plain.get(f"{url}/blobs/zz")).status_code == 400
            nursery.cancel_scope.cancel()


async def test_a_holder_serving_wrong_bytes_is_caught_by_the_hash(tmp_path: Path) -> None:
    src, dst = BlobStore(tmp_path / "a"), BlobStore(tmp_path / "b")
    data = os.urandom(2 * 1024 * 1024)
    name = src.put(data)
    src.path(name).write_bytes(os.urandom(len(data)))  # tampered on disk after verification
    with trio.fail_after(15):
        async with trio.open_nursery() as nursery:
            url = await serve(nursery, src, Counters())
            async with BlobClient(dst, Counters(), local_peer="B") as client:
                with pytest.raises(RemoteProtocolError) as err:
                    await client.fetch_once("A", url, name, len(data))
                assert err.value.reason is Reason.HASH_MISMATCH
            assert not dst.has(name) and list((tmp_path / "b").glob("*.part")) == []
            nursery.cancel_scope.cancel()


def test_route_prefix_must_be_absolute() -> None:
    with pytest.raises(LocalProtocolError):
        HttpApp().route("GET", "status", lambda r: None)  # type: ignore[arg-type,return-value]


def test_per_peer_counts_name_a_bounded_number_of_peers_and_keep_exact_totals() -> None:
    from p2p.counters import MAX_NAMED_PEERS, OTHER_PEERS
    from protocol.errors import Reason

    counters = Counters()
    for i in range(MAX_NAMED_PEERS + 500):  # e.g. a flood of fresh keys, each refused once
        counters.rejected(f"peer-{i}", Reason.BAD_SIGNATURE)
        counters.received(f"peer-{i}", Kind.CONTROL, 10)
    snapshot = counters.snapshot()
    assert len(snapshot["rejections_by_peer"]) <= MAX_NAMED_PEERS and len(snapshot["peers"]) <= MAX_NAMED_PEERS
    assert counters.rejections[Reason.BAD_SIGNATURE] == MAX_NAMED_PEERS + 500  # totals stay exact
    assert counters.total(Kind.CONTROL).recv_bytes == 10 * (MAX_NAMED_PEERS + 500)
    assert snapshot["rejections_by_peer"][OTHER_PEERS]["bad_signature"] >= 500
    counters.received("peer-0", Kind.CONTROL, 1)  # a peer named early keeps its name
    assert counters.snapshot()["peers"]["peer-0"]["control"]["recv_bytes"] == 11

"""Tier (b): the host's API beyond plain updates: reconnect with backoff, state manifests and blob
downloads for joiners, status and metrics, extra HTTP routes."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import httpx
import pytest
import trio
from p2p_helpers import host_config, start, wait_for

from p2p.errors import TransportError
from p2p.http import Request, Response
from protocol.errors import LocalProtocolError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_dialling_a_bootstrap_that_is_not_up_yet_backs_off_then_connects(tmp_path: Path) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            joiner = await start(nursery, host_config(tmp_path, "joiner", bootstrap=(address,)))
            await wait_for(lambda: joiner.router.dials.failures(address) >= 3, what="failed dials")
            dials = joiner.counters.events["dials"]
            assert dials < 40, "retries back off instead of spinning every heartbeat"
            boot = await start(nursery, host_config(tmp_path, "boot", gossip_port=port))
            await wait_for(lambda: boot.peer_id in joiner.connected_peers(), what="the connection")
            assert joiner.router.dials.failures(address) == 0  # reset by the success
            await joiner.close()
            await boot.close()


async def test_a_joiner_fetches_the_state_named_in_a_manifest(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            old = await start(nursery, host_config(tmp_path, "old"))
            params, momentum = os.urandom(200_000), os.urandom(100_000)
            names = {"params": await old.add_blob(params), "momentum": await old.add_blob(momentum)}
            with pytest.raises(LocalProtocolError):
                await old.publish_manifest(3, bytes(32), bytes(32), [("x", "ab" * 32)])
            joiner = await start(nursery, host_config(tmp_path, "joiner", bootstrap=(old.gossip_addr,)))
            await wait_for(lambda: old.peer_id in joiner.connected_peers(), what="the connection")
            signed = await old.publish_manifest(3, b"L" * 32, b"P" * 32, sorted(names.items()))
            with trio.fail_after(5):
                delivery = await joiner.inbox.receive()
            assert delivery.message.message_id == signed.message_id and delivery.blob is None
            manifest = delivery.body
            assert [name for name, _, _ in manifest.blobs] == ["momentum", "params"]
            for name, digest, size in manifest.blobs:
                path = await joiner.fetch_blob(digest.hex(), size, [manifest.origin])
                assert path.read_bytes() == (params if name == "params" else momentum)
            assert joiner.counters.blob_downloads == 2
            with pytest.raises(TransportError):
                await joiner.fetch_blob("cd" * 32, 10)  # nobody has it
            await joiner.close()
            await old.close()


async def test_a_blob_removed_here_as_it_arrives_is_a_transport_error_unless_the_fetcher_keeps_it(
        tmp_path: Path) -> None:
    """Another task may remove a blob while the fetching task waits for it to be stored (a concurrent download
    that failed forgets what it fetched): the fetch then fails as a transport error (the caller retries, the
    node does not crash); a fetcher that keeps the blob gets a path that reads it to the end."""
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            donor = await start(nursery, host_config(tmp_path, "donor"))
            data = os.urandom(100_000)
            name = await donor.add_blob(data)
            fetcher = await start(nursery, host_config(tmp_path, "fetcher", bootstrap=(donor.gossip_addr,)))
            await wait_for(lambda: donor.peer_id in fetcher.connected_peers(), what="the connection")
            fetcher.counters.on_fetch = lambda seconds: fetcher.store.remove(name)  # right after it is stored
            with pytest.raises(TransportError, match="removed here"):
                await fetcher.fetch_blob(name, len(data), [donor.peer_id])
            with fetcher.store.kept([name]):
                path = await fetcher.fetch_blob(name, len(data), [donor.peer_id])
                assert not fetcher.store.has(name) and path.read_bytes() == data
            assert not path.exists(), "deleted once its keeper let go"
            await fetcher.close()
            await donor.close()


async def test_status_and_extra_routes(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            a = await start(nursery, host_config(tmp_path, "a"))
            b = await start(nursery, host_config(tmp_path, "b", bootstrap=(a.gossip_addr,)))
            await wait_for(lambda: a.peer_id in b.connected_peers(), what="the connection")
            b.set_progress(7, 2, "training")
            await wait_for(lambda: any(p.slot == 7 and p.state == "training" for p in a.peers()), what="heartbeats")

            async def status(request: Request) -> Response:
                return Response(200, json.dumps(a.status()).encode(), {"content-type": "application/json"})

            a.http.route("GET", "/status", status)
            async with b.http_client() as client:
                got = (await client.get(f"{a.http_url}/status")).json()
                assert got["peer_id"] == a.peer_id and got["peers"][0]["peer_id"] == b.peer_id
                assert got["counters"]["totals"]["control"]["recv_bytes"] > 0
                assert got["counters"]["peers"][b.peer_id]["control"]["recv_bytes"] > 0
            await b.close()
            await a.close()


async def test_a_large_blob_comes_in_byte_ranges_from_every_holder(tmp_path: Path) -> None:
    """A blob of at least `range_fetch_bytes` comes as `fetch_streams` ranges at once, over as many connections
    (TLS, as between nodes), verified whole; the holder counts the fetcher as served once its ranges add up.
    (Several holders at once: tests/p2p/test_blob_ranges.py.)"""
    data = os.urandom(3 << 20)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            a = await start(nursery, host_config(tmp_path, "a"))
            c = await start(nursery, host_config(tmp_path, "c", bootstrap=(a.gossip_addr,),
                                                 range_fetch_bytes=1 << 20, fetch_streams=4))
            await wait_for(lambda: a.peer_id in c.connected_peers(), what="c connected")
            name = await a.add_blob(data)
            path = await c.fetch_blob(name, len(data), [a.peer_id])
            assert path.read_bytes() == data and c.counters.blob_downloads == 1
            assert a.counters.blobs_served == 1, "a's ranges added up to the blob: served once"
            from p2p.counters import Kind

            await wait_for(lambda: a.counters.traffic(c.peer_id, Kind.BLOB).sent_bytes == len(data),
                           what="a's four ranges counted")
            for host in (c, a):
                await host.close()

"""Tier (b): 8 hosts on loopback in one trio process (port 0, bounded by fail_after, no fixed sleeps)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import trio
from p2p_helpers import host_config, publish_kwargs, start, wait_for

from p2p.counters import Kind
from p2p.host import Host

N = 8
BLOB = 5 * 1024 * 1024


def overlay_connected(hosts: list[Host]) -> bool:
    ids = {h.peer_id for h in hosts}
    adj = {h.peer_id: set(h.connected_peers()) & ids for h in hosts}
    seen, stack = {hosts[0].peer_id}, [hosts[0].peer_id]
    while stack:
        for p in adj[stack.pop()] - seen:
            seen.add(p)
            stack.append(p)
    return seen == ids


async def start_overlay(nursery: trio.Nursery, tmp: Path, n: int = N) -> list[Host]:
    first = await start(nursery, host_config(tmp, "n0"))
    hosts = [first]
    for i in range(1, n):
        hosts.append(await start(nursery, host_config(tmp, f"n{i}", bootstrap=(first.gossip_addr,))))
    return hosts


@pytest.mark.slow
async def test_single_bootstrap_address_gives_a_connected_overlay(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            hosts = await start_overlay(nursery, tmp_path)
            await wait_for(lambda: overlay_connected(hosts), what="a connected overlay")
            # peer exchange: everyone learns everyone (target_peers=8 > 7 others)
            await wait_for(lambda: all(len(h.connected_peers()) == N - 1 for h in hosts), what="full peer tables")
            await wait_for(lambda: all(len(h.router.mesh) >= h.router.config.d_lo for h in hosts), what="meshes")
            for h in hosts:
                assert h.counters.rejections == {}, h.counters.rejections
            for h in hosts:
                await h.close()


@pytest.mark.slow
async def test_5mb_blob_reaches_all_8_and_each_node_downloads_it_once(tmp_path: Path) -> None:
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            hosts = await start_overlay(nursery, tmp_path)
            await wait_for(lambda: all(len(h.router.mesh) >= 2 for h in hosts), what="meshes")
            payload = os.urandom(BLOB)
            signed = await hosts[3].publish_update(payload, **publish_kwargs(payload))
            name = signed.body.payload_sha256.hex()
            for i, h in enumerate(hosts):
                if i == 3:
                    continue
                with trio.fail_after(15):
                    delivery = await h.inbox.receive()
                assert delivery.message.message_id == signed.message_id
                assert delivery.blob is not None and delivery.blob.read_bytes() == payload
            await wait_for(lambda: all(h.store.has(name) for h in hosts), what="every store")
            for i, h in enumerate(hosts):
                blob_in = h.counters.total(Kind.BLOB).recv_bytes
                if i == 3:
                    assert blob_in == 0 and h.counters.blob_downloads == 0
                else:
                    assert blob_in == BLOB, f"node {i} downloaded {blob_in} bytes"
                    assert h.counters.blob_downloads == 1
            served = sum(h.counters.total(Kind.BLOB).sent_bytes for h in hosts)
            assert served == BLOB * (N - 1)
            assert sum(h.counters.blobs_served for h in hosts) == N - 1
            assert all(h.inbox.statistics().current_buffer_used == 0 for h in hosts)  # nothing twice
            for h in hosts:
                await h.close()


@pytest.mark.slow
async def test_killed_nodes_are_detected_and_a_restarted_one_rejoins(tmp_path: Path) -> None:
    with trio.fail_after(40):
        async with trio.open_nursery() as nursery:
            hosts = await start_overlay(nursery, tmp_path)
            await wait_for(lambda: all(len(h.connected_peers()) == N - 1 for h in hosts), what="full overlay")
            victims = [hosts[2], hosts[5]]
            dead = {v.peer_id for v in victims}
            survivors = [h for h in hosts if h not in victims]
            for v in victims:
                v.abort()  # a crash: no goodbye
            timeout = survivors[0].router.config.heartbeat_timeout_s
            took = await wait_for(
                lambda: all(dead.isdisjoint(h.connected_peers()) for h in survivors),
                timeout=timeout + 2.0, what="the crash to be noticed",
            )
            assert took <= timeout + 0.5
            await wait_for(lambda: all(dead.isdisjoint(h.router.mesh) and h.router.mesh for h in survivors), what="mesh repair")
            payload = os.urandom(256 * 1024)
            signed = await survivors[0].publish_update(payload, **publish_kwargs(payload))
            for h in survivors[1:]:
                with trio.fail_after(10):
                    assert (await h.inbox.receive()).message.message_id == signed.message_id

            # node 2 comes back with the same key and the same data directory
            again = await start(nursery, host_config(tmp_path, "n2", identity=victims[0].identity,
                                                     bootstrap=(hosts[0].gossip_addr,)))
            everyone = [*survivors, again]
            await wait_for(lambda: len(again.connected_peers()) == len(survivors), what="the rejoin")
            await wait_for(lambda: all(again.peer_id in h.connected_peers() for h in survivors), what="peers to see it")
            payload2 = os.urandom(128 * 1024)
            signed2 = await again.publish_update(payload2, **publish_kwargs(payload2))
            for h in survivors:
                with trio.fail_after(10):
                    assert (await h.inbox.receive()).message.message_id == signed2.message_id
            for h in everyone:
                await h.close()


@pytest.mark.slow
async def test_goodbye_is_signed_delivered_and_the_leaver_is_not_redialled(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            hosts = await start_overlay(nursery, tmp_path, n=4)
            await wait_for(lambda: all(len(h.connected_peers()) == 3 for h in hosts), what="full overlay")
            leaver = hosts[1]
            await leaver.close("done training")
            for h in hosts:
                if h is leaver:
                    continue
                with trio.fail_after(5):
                    delivery = await h.inbox.receive()
                assert delivery.body.KIND == "goodbye" and delivery.body.origin == leaver.peer_id
                assert delivery.body.reason == "done training"
                await wait_for(lambda h=h: leaver.peer_id not in h.connected_peers(), what="the leaver to be dropped")
            dials_before = sum(h.counters.events["dials"] for h in hosts)
            # several heartbeats later nobody has tried to reach the leaver again
            await wait_for(lambda: all(h.router._heartbeats > 20 for h in hosts if h is not leaver), what="heartbeats")
            assert sum(h.counters.events["dials"] for h in hosts) == dials_before
            for h in hosts:
                await h.close()

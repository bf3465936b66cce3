"""Tier (b): room for a joiner when a node is flooded. Every connection slot held by other hosts' idle
sockets: a joiner's connection replaces the oldest of the host holding the most (`choose_eviction`); an
established peer silent past half the heartbeat timeout gives way too, an active one never; a peer refused
for room in the peer table is sent a `peer_exchange` before the close; the HTTP plane limits all clients
together, not only each address."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import httpx
import trio
import trio.testing
from p2p_helpers import RawPeer, fast_gossip, host_config, start, wait_for

from p2p.connection import Connection, choose_eviction
from p2p.counters import Counters
from p2p.http import HttpApp, Request, Response, serve_http
from protocol.messages import Heartbeat, PeerExchange, PeerInfo, split_addr

PATIENT = fast_gossip(heartbeat_timeout_s=30.0)  # raw peers send no heartbeats unless told to


def conn(conn_id: int, remote: str, *, outbound: bool = False, peer: str | None = None) -> Connection:
    c = Connection(trio.testing.memory_stream_pair()[0], conn_id, Counters(), remote=remote, outbound=outbound,
                   max_frame_size=1024, queue_frames=4, queue_bytes=4096)
    if peer is not None:
        c.authenticated(peer)
    return c


async def test_choose_eviction_takes_the_oldest_handshake_of_the_busiest_other_host(autojump_clock) -> None:
    a1, a2 = conn(1, "127.0.0.2:1"), conn(2, "127.0.0.2:2")
    await trio.sleep(1)
    b1, b2, b3 = conn(3, "127.0.0.3:1"), conn(4, "127.0.0.3:2"), conn(5, "127.0.0.3:3")
    mine = conn(6, "127.0.0.4:9", outbound=True)  # our own dial, in its handshake
    conns = [a1, a2, b1, b2, b3, mine]
    now = trio.current_time()
    assert choose_eviction(conns, "127.0.0.1:7", now, 5.0)[0] is b1, "the host holding the most, its oldest"
    assert choose_eviction(conns, "127.0.0.3:7", now, 5.0) is None, "never for a newcomer of the busiest host"
    assert choose_eviction([a1, a2, b1, b2, mine], "127.0.0.1:7", now, 5.0)[0] is a1, "ties: the oldest first"
    assert choose_eviction([a1, a2, b1, b2], "127.0.0.2:7", now, 5.0) is None, "2 vs 2 + 1: no trade"
    assert choose_eviction([a1, b1], "127.0.0.1:7", now, 5.0) is None, "one socket each: kept"
    b1.close("gone")
    b2.close("gone")
    assert choose_eviction(conns, "127.0.0.1:7", now, 5.0)[0] is a1, "closing ones are not counted"


async def test_choose_eviction_takes_a_silent_established_connection_never_an_active_one(autojump_clock) -> None:
    quiet, busy = conn(1, "127.0.0.2:1", peer="quiet"), conn(2, "127.0.0.3:1", outbound=True, peer="busy")
    await trio.sleep(3)
    busy.last_recv = trio.current_time()
    assert choose_eviction([quiet, busy], "127.0.0.1:7", trio.current_time(), 5.0) is None, "silent 3 s < 5 s"
    await trio.sleep(3)
    busy.last_recv = trio.current_time()
    victim, why = choose_eviction([quiet, busy], "127.0.0.1:7", trio.current_time(), 5.0)
    assert victim is quiet and "silent for 6.0 s" in why
    assert choose_eviction([busy], "127.0.0.1:7", trio.current_time(), 5.0) is None


def idle_socket(source: str, target: str) -> socket.socket:
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    s.bind((source, 0))
    s.connect(split_addr(target))
    return s


async def test_a_joiner_replaces_other_hosts_idle_sockets_when_every_slot_is_taken(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            node = await start(nursery, host_config(tmp_path, "node", max_connections=8, max_handshakes_per_host=4,
                                                    handshake_timeout_s=30.0))
            held = [idle_socket(f"127.0.0.{2 + i // 4}", node.gossip_addr) for i in range(8)]
            await wait_for(lambda: len(node._conns) == 8, what="every slot held")
            extra = idle_socket("127.0.0.2", node.gossip_addr)  # a flooder cannot push out its own host's sockets
            await wait_for(lambda: node.counters.events["refused_handshakes_per_host"] == 1, what="refused")
            joiner = await start(nursery, host_config(tmp_path, "joiner", bootstrap=(node.gossip_addr,)))
            took = await wait_for(lambda: joiner.peer_id in node.connected_peers(), 5.0, "the joiner connected")
            assert took < 5.0 and node.counters.events["evicted_handshakes"] == 1
            assert node.counters.events["refused_connections"] == 0
            for s in [*held, extra]:
                s.close()
            nursery.cancel_scope.cancel()


@pytest.mark.slow
async def test_a_silent_peer_gives_way_when_full_and_an_active_one_stays(tmp_path: Path) -> None:
    gossip = fast_gossip(heartbeat_timeout_s=4.0)  # silent past 2 s: may be evicted; past 4 s: dropped anyway
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            node = await start(nursery, host_config(tmp_path, "node", gossip=gossip, max_connections=2))
            quiet = await RawPeer.connect(node.gossip_addr)
            await quiet.handshake(node.now())
            active = await RawPeer.connect(node.gossip_addr)
            await active.handshake(node.now())
            stop = trio.Event()

            async def beat() -> None:
                n = 0
                while not stop.is_set():
                    n += 1
                    await active.send(Heartbeat(gossip.run_id, 0, 0, "", n))
                    await trio.sleep(0.05)

            nursery.start_soon(beat)
            await wait_for(lambda: len(node.connected_peers()) == 2, what="both connected")
            joiner = await start(nursery, host_config(tmp_path, "joiner", gossip=gossip, bootstrap=(node.gossip_addr,)))
            await wait_for(lambda: joiner.peer_id in node.connected_peers(), 10.0, "the joiner connected")
            assert node.counters.events["evicted_silent"] == 1
            assert quiet.identity.peer_id not in node.connected_peers()
            assert active.identity.peer_id in node.connected_peers(), "an active peer is never evicted"
            stop.set()
            nursery.cancel_scope.cancel()


async def test_a_peer_refused_for_room_is_told_other_peers_before_the_close(tmp_path: Path) -> None:
    gossip = fast_gossip(heartbeat_timeout_s=30.0, max_peers=2, target_peers=2, min_outbound=0)
    hearsay = (PeerInfo("12D3KooWA4Xop1JaT3MHxwYMkCepYsv4iPVopMXwCz5iHYdBfeSB", "10.9.9.9:4100", "10.9.9.9:8100"),)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            node = await start(nursery, host_config(tmp_path, "node", gossip=gossip))
            first = await RawPeer.connect(node.gossip_addr)
            await first.handshake(node.now())
            await first.send(PeerExchange(gossip.run_id, hearsay))
            second = await RawPeer.connect(node.gossip_addr)
            await second.handshake(node.now())
            await wait_for(lambda: len(node.connected_peers()) == 2 and hearsay[0].peer_id in node.router.table,
                           what="two peers and a known address")
            refused = await RawPeer.connect(node.gossip_addr)  # same host, same group: no eviction
            await refused.handshake(node.now())
            told = await refused.next_message(PeerExchange)
            assert hearsay[0] in told.peers
            await refused.wait_closed()
            assert refused.identity.peer_id not in node.connected_peers()
            nursery.cancel_scope.cancel()


async def test_the_http_plane_limits_every_client_together() -> None:
    async def ok(request: Request) -> Response:
        return Response(200, b"ok")

    app = HttpApp(total="6/minute")
    app.route("GET", "/status", ok, per_client="3/minute", total="4/minute")
    app.route("GET", "/other", ok)
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            host, port = await nursery.start(serve_http, app, "127.0.0.1", 0)
            codes: dict[str, list[int]] = {}
            plan = (("127.0.0.2", "/status", 4), ("127.0.0.3", "/status", 2), ("127.0.0.4", "/other", 4))
            for source, path, n in plan:
                transport = httpx.AsyncHTTPTransport(local_address=source)
                async with httpx.AsyncClient(transport=transport) as client:
                    codes[source] = [(await client.get(f"http://{host}:{port}{path}")).status_code for _ in range(n)]
            nursery.cancel_scope.cancel()
    assert codes["127.0.0.2"] == [200, 200, 200, 429], "its own limit"
    assert codes["127.0.0.3"] == [200, 429], "the route's total, shared with the first client"
    assert codes["127.0.0.4"] == [200, 200, 429, 429], "the app's total, across routes (4 of 6 used before)"
    assert app.throttled == {"/status": 2, "/other": 2}

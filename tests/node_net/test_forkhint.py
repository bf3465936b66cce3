"""Tier (b): the fork hint (`POST /compare`) on real loopback hosts: a connected peer is queued for a
comparison, anything else is refused with a reason, and sending never raises."""

from __future__ import annotations

from pathlib import Path

import httpx
import trio

import p2p
from node.sync.forkhint import COMPARE_PATH, ForkHintRoute, send_fork_hint
from node_net_helpers import fast_host_config
from waiting import wait_for

RUN = "forkhint-test"


def host_config(tmp: Path, name: str, bootstrap: tuple[str, ...] = ()) -> p2p.HostConfig:
    return fast_host_config(tmp, name, RUN, bootstrap)


async def test_a_hint_queues_a_connected_peer_and_refuses_anything_else(tmp_path: Path) -> None:
    to_compare: set[str] = set()
    replica_ready = False
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            a = await nursery.start(p2p.run, host_config(tmp_path, "a"))
            b = await nursery.start(p2p.run, host_config(tmp_path, "b", (a.gossip_addr,)))
            ForkHintRoute(a, lambda: to_compare if replica_ready else None).mount()
            await wait_for(lambda: b.peer_id in a.connected_peers(), 10, "the connection")
            a_http = a.http_addr
            assert not await send_fork_hint(b, a_http), "no replica yet: 503"
            assert to_compare == set()
            replica_ready = True
            assert await send_fork_hint(b, a_http)
            assert to_compare == {b.peer_id}
            assert not await send_fork_hint(b, a_http, "12D3KooWnotconnected"), "only the sender itself"
            assert to_compare == {b.peer_id}
            async with b.http_client() as client:
                bad = await client.post(f"{a.http_url}{COMPARE_PATH}", content=b"not json")
                assert bad.status_code == 400 and "bad compare request" in bad.text
                wrong = await client.post(f"{a.http_url}{COMPARE_PATH}", json={"peer": 7})
                assert wrong.status_code == 400
                deep = await client.post(f"{a.http_url}{COMPARE_PATH}", content=b"[" * 30_000 + b"]" * 30_000)
                assert deep.status_code == 400 and "nested too deeply" in deep.text  # not a 500
            await b.close()
            await a.close()
    assert not await send_fork_hint(b, "127.0.0.1:9"), "nobody listening: False, no exception"

"""Tier (b): a node asking its peers whether it can be dialled (`POST /dialback`) and pushing blobs
(`PUT /blobs/<name>`), between hosts on loopback; the rules of what a pusher may do."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import trio
from p2p_helpers import host_config, publish_kwargs, start, wait_for

from p2p.httpclient import operator_client
from protocol.errors import Reason


async def test_peers_dial_a_reachable_node_back_and_a_private_one_pushes_its_blobs(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            a = await start(nursery, host_config(tmp_path, "a"))
            b = await start(nursery, host_config(tmp_path, "b", bootstrap=(a.gossip_addr,)))
            await wait_for(lambda: a.outreach.reach.state == b.outreach.reach.state == "public", what="both dialled back")
            # a node that says it cannot be dialled: its blob reaches a before its header does
            private = await start(nursery, host_config(tmp_path, "p", reachability="private",
                                                       bootstrap=(a.gossip_addr,)))
            await wait_for(lambda: a.peer_id in private.connected_peers(), what="the private node connected")
            payload = os.urandom(300_000)
            signed = await private.publish_update(payload, **publish_kwargs(payload))
            name = hashlib.sha256(payload).hexdigest()
            assert a.peer_id in private.outreach.pushed_to and a.store.has(name)
            with trio.fail_after(5):
                while (delivery := await b.inbox.receive()).message.message_id != signed.message_id:
                    pass
            assert delivery.blob is not None and delivery.blob.read_bytes() == payload
            assert "pushed over connections this node opens" in private.status()["blobs_leave"]
            assert name not in a.outreach.pushes.pending, "the header named it: it stays"
            nursery.cancel_scope.cancel()


async def test_a_push_is_taken_only_from_a_connected_peer_and_only_with_the_right_bytes(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            a = await start(nursery, host_config(tmp_path, "a"))
            b = await start(nursery, host_config(tmp_path, "b", bootstrap=(a.gossip_addr,)))
            await wait_for(lambda: b.peer_id in a.connected_peers(), what="the connection")
            data = os.urandom(50_000)
            name = hashlib.sha256(data).hexdigest()
            url = f"{a.http_url}/blobs/{name}"
            async with operator_client() as stranger:  # a valid certificate, not a connected peer
                assert (await stranger.put(url, content=data)).status_code == 403
            async with b.http_client() as peer:
                wrong = await peer.put(url, content=os.urandom(len(data)))
                assert wrong.status_code == 400 and "hash_mismatch" in wrong.text and not a.store.has(name)
                assert a.counters.rejections_by_peer[b.peer_id][Reason.HASH_MISMATCH] == 1
                assert (await peer.put(f"{a.http_url}/blobs/NOTHEX", content=data)).status_code == 400
                assert (await peer.put(url, content=data)).status_code == 201 and a.store.has(name)
                assert (await peer.put(url, content=data)).status_code == 200  # held already
                for _ in range(a.outreach.pushes.max_unannounced - 1):
                    more = os.urandom(1000)
                    assert (await peer.put(f"{a.http_url}/blobs/{hashlib.sha256(more).hexdigest()}",
                                           content=more)).status_code == 201
                extra = os.urandom(1000)
                over = await peer.put(f"{a.http_url}/blobs/{hashlib.sha256(extra).hexdigest()}", content=extra)
                assert over.status_code == 429, "no more pushed blobs that no header named"
            swept = a.outreach.pushes.sweep(trio.current_time() + a.outreach.pushes.unannounced_s + 1)
            assert name in swept and not a.store.has(name), "never announced: removed"
            nursery.cancel_scope.cancel()

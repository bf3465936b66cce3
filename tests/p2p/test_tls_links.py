"""Tier (b): both planes over TLS between hosts on loopback (PROTOCOL.md sections 1a and 7b).

What a tap on the path sees (a relay between two hosts records every byte), what a cleartext peer and a
plain-HTTP client get, a hello that is not the certificate's, and a closed run's HTTP plane."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import httpx
import pytest
import trio
from p2p_helpers import RUN, RawPeer, host_config, publish_kwargs, start, wait_for

from p2p.access import MEMBERSHIP_HEADER
from p2p.httpclient import operator_client
from p2p.tls import PROTOCOL_VERSION_ALERT, Credentials
from p2p.tls import connect as tls_connect
from p2p.transport import format_addr, listener_addr, open_listener
from protocol.admission import Admission, grant
from protocol.errors import Reason
from protocol.identity import Identity


class Tap:
    """A TCP relay to `target` that records what each direction carried."""

    def __init__(self, target: str) -> None:
        self.target = target
        self.up = bytearray()  # client to server
        self.down = bytearray()
        self.address = ""

    async def serve(self, nursery: trio.Nursery) -> None:
        listener = await open_listener("127.0.0.1", 0)
        self.address = format_addr(*listener_addr(listener))
        nursery.start_soon(trio.serve_listeners, self._relay, [listener])

    async def _relay(self, client: trio.SocketStream) -> None:
        host, port = self.target.rsplit(":", 1)
        async with client, await trio.open_tcp_stream(host, int(port)) as server, trio.open_nursery() as nursery:
            nursery.start_soon(self._pump, client, server, self.up, nursery.cancel_scope)
            nursery.start_soon(self._pump, server, client, self.down, nursery.cancel_scope)

    @staticmethod
    async def _pump(src: trio.SocketStream, dst: trio.SocketStream, log: bytearray, done: trio.CancelScope) -> None:
        try:
            while data := await src.receive_some(1 << 16):
                log += data
                await dst.send_all(data)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        done.cancel()


def readable(capture: bytes, *secrets: bytes) -> list[bytes]:
    return [s for s in secrets if s in capture]


async def test_a_tap_on_either_plane_reads_nothing_of_the_run(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            a_id, b_id = Identity.generate(), Identity.generate()
            a = await start(nursery, host_config(tmp_path, "a", a_id))
            gossip_tap, http_tap = Tap(a.gossip_addr), Tap(a.http_addr)
            await gossip_tap.serve(nursery)
            await http_tap.serve(nursery)
            # b reaches a's gossip port through one tap; c fetches a's blobs through the other
            b = await start(nursery, host_config(tmp_path, "b", b_id, bootstrap=(gossip_tap.address,)))
            await wait_for(lambda: a.peer_id in b.connected_peers(), what="b connected through the tap")
            payload = os.urandom(200_000)
            header = await b.publish_update(payload, **publish_kwargs(payload))
            with trio.fail_after(5):
                assert (await a.inbox.receive()).message.message_id == header.message_id
            own = os.urandom(150_000)
            await a.add_blob(own)
            async with b.http_client() as client:
                got = await client.get(f"https://{http_tap.address}/blobs/{hashlib.sha256(own).hexdigest()}")
            assert got.status_code == 200 and got.content == own
            nursery.cancel_scope.cancel()
    for capture in (gossip_tap.up, gossip_tap.down, http_tap.up, http_tap.down):
        assert capture[0] == 0x16 and capture[1] == 0x03, capture[:8].hex()  # a TLS handshake record first
    secrets = (RUN.encode(), a_id.public_key, b_id.public_key, a.peer_id.encode(), b.peer_id.encode(),
               hashlib.sha256(payload).digest(), payload[:64], own[:64], hashlib.sha256(own).hexdigest().encode(),
               b"/blobs/", b"HTTP/1.1")
    assert readable(bytes(gossip_tap.up + gossip_tap.down), *secrets) == []
    assert readable(bytes(http_tap.up + http_tap.down), *secrets) == []


async def test_a_plain_http_request_gets_a_tls_alert_and_nothing_else(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            a = await start(nursery, host_config(tmp_path, "a"))
            host, port = a.http_addr.rsplit(":", 1)
            async with await trio.open_tcp_stream(host, int(port)) as raw:
                await raw.send_all(b"GET /status HTTP/1.1\r\nhost: x\r\n\r\n")
                answer = b""
                while data := await raw.receive_some(1 << 16):
                    answer += data
            assert answer == PROTOCOL_VERSION_ALERT
            with pytest.raises(httpx.HTTPError):
                async with httpx.AsyncClient() as plain:
                    await plain.get(f"http://{a.http_addr}/health")
            async with httpx.AsyncClient(verify=False) as anonymous:  # curl -k: an open run answers anyone
                assert (await anonymous.get(f"https://{a.http_addr}/health")).text == "ok\n"
            nursery.cancel_scope.cancel()


async def test_tls_and_cleartext_nodes_refuse_each_other_by_name(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            tls = await start(nursery, host_config(tmp_path, "tls"))
            plain = await start(nursery, host_config(tmp_path, "plain", insecure=True, bootstrap=(tls.gossip_addr,)))
            await wait_for(lambda: tls.counters.rejections[Reason.CLEARTEXT_PEER] >= 1, what="the cleartext dialer named")
            await wait_for(lambda: plain.counters.rejections[Reason.TLS_PEER] >= 1, what="the TLS answer named")
            dialer = await start(nursery, host_config(tmp_path, "dialer", bootstrap=(plain.gossip_addr,)))
            await wait_for(lambda: dialer.counters.rejections[Reason.CLEARTEXT_PEER] >= 1, what="cleartext answer named")
            await wait_for(lambda: plain.counters.rejections[Reason.TLS_PEER] >= 2, what="the TLS dialer named")
            assert tls.connected_peers() == plain.connected_peers() == dialer.connected_peers() == []
            assert plain.http_url.startswith("http://") and tls.http_url.startswith("https://")
            nursery.cancel_scope.cancel()


async def test_a_hello_of_another_key_than_the_certificates_is_refused(tmp_path: Path) -> None:
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            a = await start(nursery, host_config(tmp_path, "a"))
            shown, claimed = Identity.generate(), Identity.generate()
            raw = RawPeer(await tls_connect(a.gossip_addr, Credentials(shown).gossip_client, 5.0), claimed)
            await raw.handshake(a.now())
            await raw.wait_closed()
            assert a.counters.rejections_by_peer[claimed.peer_id][Reason.BAD_IDENTITY] == 1
            assert a.connected_peers() == []
            with pytest.raises(Exception, match="bad_identity"):  # a dialer checks whom it reached, too
                await tls_connect(a.gossip_addr, Credentials(shown).gossip_client, 5.0, expected_peer=claimed.peer_id)
            nursery.cancel_scope.cancel()


async def test_a_closed_runs_http_plane_answers_members_only(tmp_path: Path) -> None:
    founder_id, member_id, stranger_id = Identity.generate(), Identity.generate(), Identity.generate()
    founder_only = Admission(RUN, founder_id.peer_id, peer_id=founder_id.peer_id)
    membership = grant(founder_id, RUN, member_id.peer_id)
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            founder = await start(nursery, host_config(tmp_path, "founder", founder_id, admission=founder_only))
            blob = await founder.add_blob(os.urandom(10_000))
            paths = ("/status", f"/blobs/{blob}", "/state", "/metrics", "/nonexistent")
            async with httpx.AsyncClient(verify=False) as anonymous, operator_client(stranger_id) as stranger:
                for client in (anonymous, stranger):
                    assert (await client.get(f"{founder.http_url}/health")).text == "ok\n"
                    for path in paths:
                        refusal = await client.get(f"{founder.http_url}{path}")
                        assert refusal.status_code == 403 and refusal.text == "this is a closed run: members only\n"
                forged = await stranger.get(f"{founder.http_url}/blobs/{blob}",  # a member's membership, another key
                                            headers={MEMBERSHIP_HEADER: membership.to_bytes().hex()})
                assert forged.status_code == 403
            # a member never seen by the founder: its certificate and its membership header
            async with operator_client(member_id, membership=membership.to_bytes()) as member:
                assert (await member.get(f"{founder.http_url}/blobs/{blob}")).status_code == 200
            async with operator_client(founder_id) as itself:
                assert (await itself.get(f"{founder.http_url}/blobs/{blob}")).status_code == 200
            guard = founder.http.guard
            assert guard is not None
            assert dict(guard.refused) == {"anonymous": 5, "not_admitted": 5, "bad_membership": 1}, guard.refused
            nursery.cancel_scope.cancel()

"""Advertised addresses that cannot reach their peer are named (pure rules) and refused in the handshake."""

from __future__ import annotations

import pytest
from protocol_strategies import IDENTITIES, RUN_ID

from protocol import signing
from protocol.addresses import address_problem, is_loopback_host, is_wildcard_host
from protocol.errors import Reason, RemoteProtocolError
from protocol.framing import encode_frame
from protocol.gossip import Handshake
from protocol.messages import PROTOCOL_VERSION, Hello
from protocol.validation import Validator

ALICE, BOB = IDENTITIES[:2]
NOW = 1_800_000_000.0


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "[::]", "0:0:0:0:0:0:0:0"])
def test_wildcards_are_never_usable(host: str) -> None:
    assert is_wildcard_host(host)
    addr = f"[{host.strip('[]')}]:7000" if ":" in host else f"{host}:7000"
    assert "wildcard" in address_problem(addr)


def test_usable_and_unusable_addresses() -> None:
    assert address_problem("10.0.0.2:7000") is None
    assert address_problem("node-3.example:7000") is None
    assert address_problem("[2001:db8::5]:7000", remote_host="2001:db8::5") is None
    assert address_problem("127.0.0.1:7000", remote_host="127.0.0.1") is None, "loopback peers on one machine"
    assert "loopback" in address_problem("127.0.0.1:7000", remote_host="10.0.0.9")
    assert "loopback" in address_problem("localhost:7000", remote_host="10.0.0.9")
    assert "own address" in address_problem("10.0.0.2:7000", own=frozenset({"10.0.0.2:7000"}))
    assert "unicast" in address_problem("224.0.0.1:7000")
    assert "not host:port" in address_problem("10.0.0.2")
    assert is_loopback_host("::1") and is_loopback_host("127.8.0.1") and not is_loopback_host("10.0.0.1")


def _hello(ident, gossip: str, http: str) -> Hello:
    return Hello(RUN_ID, PROTOCOL_VERSION, ident.peer_id, gossip, http, signing.new_challenge(), "diloco-test")


@pytest.mark.parametrize(("gossip", "http", "remote"), [
    ("0.0.0.0:7000", "10.0.0.2:8000", "10.0.0.2"),  # a wildcard: we would dial ourselves
    ("10.0.0.2:7000", "0.0.0.0:8000", "10.0.0.2"),  # ... and fetch blobs from ourselves
    ("127.0.0.1:7000", "127.0.0.1:8000", "10.0.0.2"),  # loopback, from another host
    ("10.0.0.1:7000", "10.0.0.1:8000", "10.0.0.2"),  # our own addresses
])
def test_the_handshake_refuses_an_address_that_cannot_reach_the_peer(gossip: str, http: str, remote: str) -> None:
    ours = Handshake(ALICE, Validator(RUN_ID), gossip_addr="10.0.0.1:7000", http_addr="10.0.0.1:8000",
                     challenge=signing.new_challenge(), remote_host=remote)
    with pytest.raises(RemoteProtocolError) as info:
        ours.receive_frame(encode_frame(_hello(BOB, gossip, http))[4:], NOW)
    assert info.value.reason is Reason.BAD_ADDRESS


def test_the_handshake_accepts_reachable_addresses() -> None:
    ours = Handshake(ALICE, Validator(RUN_ID), gossip_addr="10.0.0.1:7000", http_addr="10.0.0.1:8000",
                     challenge=signing.new_challenge(), remote_host="10.0.0.2")
    assert ours.receive_frame(encode_frame(_hello(BOB, "10.0.0.2:7000", "10.0.0.2:8000"))[4:], NOW)

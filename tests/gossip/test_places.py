"""Tier (a): places in the peer table (`protocol.gossip.places`) and the router's use of them: caps per
address and per prefix on peers that dial in, a full table's eviction rule, and the `peer_exchange` a peer
refused for room gets before its Disconnect."""

from __future__ import annotations

import random

from protocol.gossip import Disconnect, GossipConfig, Router, Send
from protocol.gossip.peers import PeerState
from protocol.gossip.places import address_of, group_of, is_local, place_for, prefix_of
from protocol.identity import Identity
from protocol.messages import Hello, PeerExchange, PeerInfo

RUN = "places"
T0 = 1_800_000_000.0
CONFIG = GossipConfig(run_id=RUN, max_peers_per_address=2, max_peers_per_prefix=3, max_peers_per_local_address=5)


def state(n: int, address: str, *, outbound: bool = False, since: float = 0.0) -> PeerState:
    return PeerState(PeerInfo(f"peer{n:03d}", "", ""), n, outbound, since, since, address=address)


def table(*states: PeerState) -> dict[str, PeerState]:
    return {s.info.peer_id: s for s in states}


def zero(peer: str) -> float:
    return 0.0


def test_addresses_prefixes_and_groups() -> None:
    assert address_of("198.51.7.9:4000") == "198.51.7.9" and address_of("[2001:db8::1]:4000") == "2001:db8::1"
    assert address_of("[::ffff:8.8.8.8]:1") == "8.8.8.8" and address_of("Node.Example:4000") == "node.example"
    assert address_of(None) == "" and address_of("") == ""
    assert prefix_of("8.8.8.8") == "8.8.8.0/24" and prefix_of("2a00:1450:4001:81c::200e") == "2a00:1450:4001::/48"
    for local in ("127.0.0.3", "10.1.2.3", "192.168.0.7", "::1", "fe80::1", "node.example", ""):
        assert is_local(local) and prefix_of(local) is None and group_of(local) == local
    assert not is_local("8.8.8.8") and group_of("8.8.4.4") == "8.8.4.0/24"


def test_peers_dialling_in_are_capped_per_global_address_and_prefix() -> None:
    peers = table(state(1, "8.8.8.8"), state(2, "8.8.8.8"))
    assert "from 8.8.8.8 (2)" in place_for("8.8.8.8", False, peers, CONFIG, zero, full=False).refusal
    assert place_for("8.8.8.9", False, peers, CONFIG, zero, full=False).accepted
    assert place_for("8.8.8.8", True, peers, CONFIG, zero, full=False).accepted, "our own dials are never capped"
    peers |= table(state(3, "8.8.8.9"))
    assert "from 8.8.8.0/24 (3)" in place_for("8.8.8.10", False, peers, CONFIG, zero, full=False).refusal
    assert place_for("8.8.9.1", False, peers, CONFIG, zero, full=False).accepted


def test_local_addresses_have_their_own_cap_and_no_prefix_cap() -> None:
    # a local testnet: every node on 127.0.0.1 (and a cluster's machines in one private /24)
    peers = table(*(state(n, "127.0.0.1") for n in range(4)), *(state(10 + n, f"10.0.0.{n}") for n in range(6)))
    assert place_for("127.0.0.1", False, peers, CONFIG, zero, full=False).accepted
    assert place_for("10.0.0.99", False, peers, CONFIG, zero, full=False).accepted
    peers |= table(state(5, "127.0.0.1"))
    assert "from 127.0.0.1 (5)" in place_for("127.0.0.1", False, peers, CONFIG, zero, full=False).refusal
    assert place_for("127.0.0.2", False, peers, CONFIG, zero, full=False).accepted, "another loopback address"


def test_the_default_caps_let_a_local_testnet_of_a_dozen_nodes_in() -> None:
    default = GossipConfig(run_id=RUN)
    peers = table(*(state(n, "127.0.0.1") for n in range(11)))
    assert place_for("127.0.0.1", False, peers, default, zero, full=False).accepted


def test_a_full_table_evicts_from_the_largest_group_the_youngest_of_its_lowest_scores() -> None:
    scores = {"peer004": -3.0, "peer005": 0.0, "peer006": 0.0}
    score = lambda p: scores.get(p, 0.0)  # noqa: E731
    peers = table(state(1, "127.0.0.1", outbound=True), state(2, "127.0.0.9", since=1.0),
                  state(4, "127.0.0.2", since=1.0), state(5, "127.0.0.2", since=2.0), state(6, "127.0.0.2", since=3.0))
    place = place_for("127.0.0.5", False, peers, CONFIG, score, full=True)
    assert place.accepted and place.evict == "peer004", "the lowest score first"
    scores["peer004"] = 0.0
    assert place_for("127.0.0.5", False, peers, CONFIG, score, full=True).evict == "peer006", "then the youngest"


def test_a_full_table_keeps_peers_we_dialled_peers_that_delivered_and_balanced_groups() -> None:
    peers = table(state(1, "127.0.0.2", outbound=True), state(2, "127.0.0.2", outbound=True),
                  state(3, "127.0.0.2", outbound=True))
    assert place_for("127.0.0.5", False, peers, CONFIG, zero, full=True).refusal == "too many peers"
    peers = table(state(1, "127.0.0.2"), state(2, "127.0.0.2"), state(3, "127.0.0.2"))
    assert place_for("127.0.0.5", False, peers, CONFIG, lambda p: 1.0, full=True).refusal == "too many peers"
    # a newcomer from a group one smaller than the largest would only trade places: refused
    peers = table(state(1, "127.0.0.2"), state(2, "127.0.0.2"), state(3, "127.0.0.3"))
    assert place_for("127.0.0.3", False, peers, CONFIG, zero, full=True).refusal == "too many peers"
    assert place_for("127.0.0.4", False, peers, CONFIG, zero, full=True).evict in {"peer001", "peer002"}
    # global addresses group by prefix: two addresses of one /24 are one group
    peers = table(state(1, "8.8.8.1"), state(2, "8.8.8.2", since=1.0), state(3, "9.9.9.9"))
    assert place_for("1.1.1.1", False, peers, CONFIG, zero, full=True).evict == "peer002"


def hello(identity: Identity, gossip: str = "") -> Hello:
    return Hello(RUN, 1, identity.peer_id, gossip, "", bytes(32), "test")


def test_the_router_sends_a_refused_peer_other_addresses_then_disconnects_it() -> None:
    config = GossipConfig(run_id=RUN, max_peers=2, target_peers=2, min_outbound=0)
    router = Router(config, PeerInfo(Identity.generate().peer_id, "10.0.0.1:4000", ""), rng=random.Random(0))
    known = [Identity.generate() for _ in range(3)]
    for k in known:
        router.table.learn(PeerInfo(k.peer_id, f"10.0.1.{known.index(k)}:4000", ""), T0)
    for conn, address in ((1, "127.0.0.2:5000"), (2, "127.0.0.3:5000")):
        router.connected(hello(Identity.generate()), conn, False, T0, remote=address)
    newcomer = Identity.generate()
    actions = router.connected(hello(newcomer), 3, False, T0, remote="127.0.0.3:6000")
    assert [type(a) for a in actions] == [Send, Disconnect]
    assert actions[1] == Disconnect(newcomer.peer_id, 3, "too many peers")
    px = actions[0]
    assert px.conn == 3 and isinstance(px.message, PeerExchange)
    assert {i.peer_id for i in px.message.peers} >= {k.peer_id for k in known}
    assert newcomer.peer_id not in router.peers and newcomer.peer_id not in {i.peer_id for i in px.message.peers}


def test_the_router_evicts_for_a_newcomer_from_elsewhere() -> None:
    config = GossipConfig(run_id=RUN, max_peers=3, target_peers=2, min_outbound=0)
    router = Router(config, PeerInfo(Identity.generate().peer_id, "10.0.0.1:4000", ""), rng=random.Random(0))
    flooders = [Identity.generate() for _ in range(3)]
    for conn, f in enumerate(flooders, 1):
        router.connected(hello(f), conn, False, T0 + conn, remote=f"127.0.0.2:{5000 + conn}")
    joiner = Identity.generate()
    actions = router.connected(hello(joiner), 9, False, T0 + 5, remote="127.0.0.1:7000")
    assert Disconnect(flooders[2].peer_id, 3, "evicted for a newcomer from 127.0.0.1") in actions
    assert joiner.peer_id in router.peers and flooders[2].peer_id not in router.peers
    assert router.peers[joiner.peer_id].address == "127.0.0.1"
    again = router.connected(hello(flooders[2]), 10, False, T0 + 6, remote="127.0.0.2:5010")
    assert isinstance(again[-1], Disconnect) and again[-1].reason == "too many peers", "no eviction back"

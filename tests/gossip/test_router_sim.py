"""Tier (a): N routers in memory, fake clock. The overlay forms from one bootstrap address, updates
reach everyone with one download per node, faults are detected and repaired."""

from __future__ import annotations

import dataclasses
import hashlib
import os

from gossip_sim import RUN, SimNet, addr, header
from protocol import signing, wire
from protocol.errors import Reason
from protocol.gossip import Disconnect, Fetch, Reject
from protocol.identity import Identity
from protocol.messages import Goodbye, PeerExchange, PeerInfo, ReducedRecord, Signed, StateManifest
from protocol.reduced.records import SEAL, sign_record
from testnet.faults import FaultPlan, Kill, Partition, make_plan

FAST = dict(heartbeat_s=1.0, heartbeat_timeout_s=3.5)


def formed(n: int = 8, **kw: object) -> SimNet:
    net = SimNet(n, bootstrap=[0], **{**FAST, **kw})
    for _ in range(6):
        net.tick()
    return net


def test_one_bootstrap_address_gives_a_connected_overlay_and_a_mesh() -> None:
    net = formed(8)
    assert net.overlay_connected()
    for node in net.nodes:
        r = node.router
        assert len(r.peers) == 7, "peer exchange lets everyone find everyone (target_peers=8)"
        assert net.config.d_lo <= len(r.mesh) <= net.config.d_hi
        assert r.mesh <= set(r.peers)


def test_update_reaches_all_and_each_node_downloads_its_blob_once() -> None:
    net = formed(8)
    payload = os.urandom(4096)
    mid = net.publish(3, payload)
    for _ in range(2):
        net.tick()
    for node in net.nodes:
        if node.index == 3:
            assert node.delivered == [] and node.fetches == 0
            continue
        assert [d.message.message_id for d in node.delivered] == [mid]
        assert node.fetches == 1
        assert node.delivered[0].blob in node.blobs


def test_duplicates_are_counted_not_penalized_and_not_delivered_twice() -> None:
    net = formed(8)
    net.publish(0, os.urandom(512))
    dups = [r for n in net.nodes for r in n.rejects if r.reason is Reason.DUPLICATE]
    assert dups, "a mesh forwards each header over several links"
    assert all(len(n.delivered) <= 1 for n in net.nodes)
    assert all(n.router.scores.score(r.peer) >= 0 for n in net.nodes for r in n.rejects)


def test_late_joiner_learns_recent_updates_through_ihave_iwant() -> None:
    net = SimNet(5, bootstrap=[0], **FAST)
    net.crash(4)
    for _ in range(4):
        net.tick()
    mid = net.publish(1, os.urandom(1000))
    net.nodes[4].up = True
    net.tick()  # node 4 dials its bootstrap, gets an IHAVE on connect, asks with IWANT
    net.tick()
    assert [d.message.message_id for d in net.nodes[4].delivered] == [mid]
    assert net.nodes[4].fetches == 1


def test_crashed_nodes_are_detected_by_heartbeat_timeout_and_the_rest_keep_delivering() -> None:
    net = formed(8)
    net.crash(2)
    net.crash(5)
    dead = {net.nodes[2].peer_id, net.nodes[5].peer_id}
    t_crash = net.now
    while any(dead & set(n.router.peers) for n in net.live()):
        net.tick()
        assert net.now - t_crash <= net.config.heartbeat_timeout_s + net.config.heartbeat_s
    assert net.overlay_connected()
    for node in net.live():
        assert dead.isdisjoint(node.router.mesh)
        assert len(node.router.mesh) >= 1
    mid = net.publish(0, os.urandom(2048))
    net.tick()
    for node in net.live():
        if node.index != 0:
            assert [d.message.message_id for d in node.delivered] == [mid]


def test_restarted_node_with_the_same_key_rejoins() -> None:
    net = formed(6)
    net.follow(FaultPlan(nodes=6, duration=5.0, kills=(Kill(0.0, 4, 5.0),)))  # the testnet's vocabulary
    assert all(net.nodes[4].peer_id not in n.router.peers for n in net.live())
    net.follow(FaultPlan(nodes=6, duration=3.0))
    back = net.nodes[4]
    assert len(back.router.peers) == 5
    assert sum(back.peer_id in n.router.peers for n in net.nodes) == 5
    mid = net.publish(4, os.urandom(300))
    net.tick()
    assert all([d.message.message_id for d in n.delivered][-1:] == [mid] for n in net.nodes if n.index != 4)


def test_a_restarted_node_does_not_fetch_again_what_its_application_holds() -> None:
    """Its peers announce their history to a node that comes back; the updates its ledger holds (`known`)
    are duplicates: not asked for, not fetched, no penalty. A new update is fetched and delivered."""
    net = formed(4)
    old = [net.publish(k % 3, os.urandom(300)) for k in range(6)]
    net.tick()
    assert len(net.nodes[3].delivered) == 6
    net.crash(3)
    for _ in range(5):
        net.tick()
    net.restart(3, keep_blobs=False, known=set(old).__contains__)  # the blobs were cleaned up
    for _ in range(5):
        net.tick()
    back = net.nodes[3]
    assert len(back.router.peers) == 3
    assert back.fetches == 0 and back.delivered == [], "nothing it holds was fetched or delivered again"
    assert all(r.reason is Reason.DUPLICATE for r in back.rejects)
    new = net.publish(0, os.urandom(300))
    net.tick()
    assert [d.message.message_id for d in back.delivered] == [new] and back.fetches == 1


def test_bad_signature_is_penalized_and_a_persistent_offender_is_banned() -> None:
    net = formed(3)
    victim, evil = net.nodes[0], net.nodes[1]
    for k in range(10):
        body = header(evil, os.urandom(60) + bytes([k]) * 4, net.now)
        forged = Signed(body, bytes(64))
        net.inject(0, evil.peer_id, wire.encode(forged))
        if evil.peer_id not in victim.router.peers:
            break
    bad = [r for r in victim.rejects if r.reason is Reason.BAD_SIGNATURE]
    assert 2 <= len(bad) <= 4, "a few are tolerated, then the peer is dropped"
    assert evil.peer_id not in victim.router.peers
    assert victim.router.scores.banned(evil.peer_id, net.now)
    assert net.connect(1, 0) is None, "a banned peer's reconnection is refused"
    assert victim.rejects[-1].reason is Reason.PEER_BANNED


def test_a_broken_control_message_closes_the_connection_a_bad_signed_one_does_not() -> None:
    net = formed(3)
    victim, other = net.nodes[0], net.nodes[1]
    net.inject(0, other.peer_id, wire.encode(Signed(header(other, bytes(64), net.now), bytes(64))))
    assert other.peer_id in victim.router.peers and victim.rejects[-1].reason is Reason.BAD_SIGNATURE
    actions = net.inject(0, other.peer_id, b"\x92\xa9heartbeat\x91\xc1")  # not msgpack
    assert victim.rejects[-1].reason is Reason.MALFORMED
    assert [a for a in actions if isinstance(a, Disconnect)][0].reason == "bad control message: malformed"
    assert other.peer_id not in victim.router.peers


def test_hash_mismatch_moves_on_to_another_holder() -> None:
    net = SimNet(4, target_peers=0, **FAST)  # hand-wired: nobody dials on their own
    net.connect(0, 1)
    net.connect(0, 2)
    mid = net.publish(0, os.urandom(4000))
    assert net.nodes[1].fetches == net.nodes[2].fetches == 1
    net.nodes[1].corrupt = True  # from now on node 1 serves garbage
    late = net.nodes[3]
    net.connect(1, 3)  # IHAVE from 1 on connect, IWANT, header from 1, fetch from 1: mismatch
    net.connect(2, 3)  # IHAVE from 2: another holder, fetched from it
    net.settle()
    assert [(r.reason, r.peer) for r in late.rejects] == [(Reason.HASH_MISMATCH, net.nodes[1].peer_id)]
    assert [d.message.message_id for d in late.delivered] == [mid]
    assert late.delivered[0].source == net.nodes[2].peer_id
    assert late.fetches == 1
    assert late.router.scores.score(net.nodes[1].peer_id) < 0


def test_hash_mismatch_from_the_only_holder_waits_for_an_honest_one() -> None:
    net = SimNet(3, target_peers=0, **FAST)
    net.connect(0, 1)
    net.nodes[0].corrupt = True
    net.publish(0, os.urandom(100))
    net.tick()  # the failed holder is retried once per heartbeat: still wrong, still refused
    victim = net.nodes[1]
    assert [r.reason for r in victim.rejects] == [Reason.HASH_MISMATCH]
    assert victim.delivered == [] and victim.fetches == 0
    # an honest holder appears: node 2 holds the blob and the header, and announces it
    honest = net.nodes[2]
    name, data = next(iter(net.nodes[0].blobs.items()))
    honest.blobs[name] = data
    honest.router.blob_stored(name, net.now)
    net.connect(0, 2)  # 2 gets the header from 0 (blob already local: no fetch)
    net.connect(2, 1)  # 1 gets an IHAVE from 2 on connect → holder → fetch from 2
    net.tick()
    assert len(victim.delivered) == 1 and victim.delivered[0].source == honest.peer_id


def test_a_holder_that_no_longer_holds_the_blob_is_not_asked_again() -> None:
    """A 404 (the holder's clean-up removed the blob, e.g. an update its ledger left out) ends that holder's
    turn for that blob for good, unpenalized; asking again every heartbeat, as for an unreachable holder,
    filled a node's download slots with thousands of doomed requests under a flood (BENCHMARKS.md, session
    27). Another holder still serves it."""
    net = SimNet(3, target_peers=0, **FAST)
    net.connect(0, 1)
    net.nodes[0].gone = True
    net.publish(0, os.urandom(100))
    for _ in range(5):
        net.tick()
    fetcher = net.nodes[1]
    assert fetcher.attempts == 1 and fetcher.delivered == [] and fetcher.rejects == []
    holder = net.nodes[2]  # one that holds it after all
    name, data = next(iter(net.nodes[0].blobs.items()))
    holder.blobs[name] = data
    holder.router.blob_stored(name, net.now)
    net.connect(0, 2)
    net.connect(2, 1)
    net.tick()
    assert len(fetcher.delivered) == 1 and fetcher.delivered[0].source == holder.peer_id


def test_simultaneous_dials_keep_the_same_single_connection_on_both_sides() -> None:
    net = SimNet(2, **FAST)
    c1 = net.connect(0, 1)
    c2 = net.connect(1, 0)
    a, b = net.nodes[0].router, net.nodes[1].router
    assert a.peers[net.nodes[1].peer_id].conn == b.peers[net.nodes[0].peer_id].conn
    kept = a.peers[net.nodes[1].peer_id].conn
    smaller_dials = 0 if net.nodes[0].peer_id < net.nodes[1].peer_id else 1
    assert kept == (c1 if smaller_dials == 0 else c2)


def test_goodbye_removes_the_peer_everywhere_and_it_is_not_redialled() -> None:
    net = formed(5)
    leaver = net.nodes[2]
    bye = signing.sign(leaver.identity, Goodbye(RUN, leaver.peer_id, leaver.seqnos.next(net.now), "done"))
    net._run(2, leaver.router.publish(bye, net.now))
    net.settle()
    net.crash(2)
    for _ in range(10):
        net.tick()
    for node in net.live():
        assert leaver.peer_id not in node.router.peers
        assert node.router.table.get(leaver.peer_id).left
        assert [d.message.body.KIND for d in node.delivered] == ["goodbye"]


def test_a_manifest_is_delivered_at_once_but_forwarded_only_by_nodes_holding_its_blobs() -> None:
    net = SimNet(3, target_peers=0, **FAST)
    net.connect(0, 1)
    net.connect(1, 2)
    origin = net.nodes[0]
    state = os.urandom(2000)
    name = hashlib.sha256(state).hexdigest()
    origin.blobs[name] = state
    origin.router.blob_stored(name, net.now)
    body = StateManifest(RUN, origin.peer_id, origin.seqnos.next(net.now), 5, bytes(32), bytes(32),
                         (("params", bytes.fromhex(name), len(state)),))
    signed = signing.sign(origin.identity, body)
    net._run(0, origin.router.publish(signed, net.now))
    net.settle()
    assert [d.message.message_id for d in net.nodes[1].delivered] == [signed.message_id]
    assert net.nodes[2].delivered == [], "node 1 cannot serve the state yet, so it does not forward"
    net.nodes[1].blobs[name] = state  # node 1 downloads the state (as a joiner would)
    net._run(1, net.nodes[1].router.blob_stored(name, net.now))
    net.settle()
    assert [d.message.message_id for d in net.nodes[2].delivered] == [signed.message_id]
    assert len(net.nodes[1].delivered) == 1, "holding it later does not deliver it twice"


def test_reduced_records_are_carried_only_in_a_reduced_run() -> None:
    for reduced in (False, True):
        net = SimNet(3, target_peers=0, reduced_records=reduced, **FAST)
        net.connect(0, 1)
        net.connect(1, 2)
        origin = net.nodes[0]
        record = sign_record(origin.identity, SEAL, [4, [bytes(32)]])
        body = ReducedRecord(RUN, origin.peer_id, origin.seqnos.next(net.now), SEAL.decode(), record.body,
                             record.signature)
        signed = signing.sign(origin.identity, body)
        net._run(0, origin.router.publish(signed, net.now))
        net.settle()
        got = [[d.message.message_id for d in n.delivered] for n in net.nodes[1:]]
        refused = [r.reason for r in net.nodes[1].rejects]
        assert (got, refused) == (([[signed.message_id]] * 2, []) if reduced else ([[], []], [Reason.BAD_STATE]))


def test_fetch_is_one_at_a_time_per_blob() -> None:
    net = formed(6)
    actions = []
    node = net.nodes[0]
    orig = node.router.received

    def spy(peer: str, conn: int, data: bytes, now: float) -> list:
        out = orig(peer, conn, data, now)
        actions.extend(a for a in out if isinstance(a, Fetch))
        return out

    node.router.received = spy  # type: ignore[method-assign]
    net.publish(3, os.urandom(1000))
    assert len(actions) <= 1
    assert node.fetches == 1


def test_silent_peer_is_disconnected_after_the_timeout_exactly() -> None:
    net = SimNet(2, **FAST)
    net.connect(0, 1)
    net.settle()
    net.crash(1)
    steps = 0
    while net.nodes[1].peer_id in net.nodes[0].router.peers:
        net.tick()
        steps += 1
    assert steps == 4  # silent > 3.5 s is noticed at the first heartbeat after 3.5 s
    assert addr(1) not in [d for d in net.nodes[0].router.dialer.dialing]


def test_heartbeat_returns_disconnect_for_the_silent_connection() -> None:
    net = SimNet(2, **FAST)
    conn = net.connect(0, 1)
    net.now += 10
    out = net.nodes[0].router.heartbeat(net.now)
    assert [a for a in out if isinstance(a, Disconnect)] == [Disconnect(net.nodes[1].peer_id, conn, "silent for 10.0 s")]


def test_config_is_checked() -> None:
    import pytest

    from protocol.errors import LocalProtocolError
    from protocol.gossip import GossipConfig

    with pytest.raises(LocalProtocolError):
        GossipConfig(run_id=RUN, d_lo=5, d=4)
    with pytest.raises(LocalProtocolError):
        GossipConfig(run_id=RUN, heartbeat_s=2, heartbeat_timeout_s=1)
    assert dataclasses.replace(GossipConfig(run_id=RUN), d=5).d == 5


# ---- partitions: anti-entropy -------------------------------------------------------------------

HEAL = dict(FAST, dial_backoff_max_s=4.0)


def _partitioned_run(net: SimNet, a: list[int], b: list[int], gap: int) -> dict[bytes, int]:
    """Cut the overlay into a and b; both sides publish early and midway through a `gap`-heartbeat
    partition (far longer than the short mcache window), then heal it. Returns update id -> origin."""
    origin: dict[bytes, int] = {}
    net.partition(a, b)
    assert not net.overlay_connected()
    for k in range(gap):
        if k in (0, 1, gap // 2):
            for side in (a, b):
                origin[net.publish(side[k % len(side)], os.urandom(256))] = side[k % len(side)]
        net.tick()
    for side in (a, b):  # the partition really held: each side saw only its own updates
        for i in side:
            assert {origin[d.message.message_id] for d in net.nodes[i].delivered} <= set(side)
    net.heal()
    return origin


def _missing(net: SimNet, origin: dict[bytes, int]) -> int:
    """Updates some node has neither published nor had delivered."""
    return sum(
        1
        for node in net.nodes
        for m, o in origin.items()
        if o != node.index and m not in {d.message.message_id for d in node.delivered}
    )


def test_a_healed_partition_reconverges_within_bounded_heartbeats() -> None:
    net = formed(8, **HEAL)
    origin = _partitioned_run(net, [0, 1, 2, 3], [4, 5, 6, 7], gap=20)
    assert _missing(net, origin) == 8 * len(origin) // 2
    for beats in range(1, 16):
        net.tick()
        if _missing(net, origin) == 0:
            break
    assert net.overlay_connected()
    assert _missing(net, origin) == 0, f"not converged {beats} heartbeats after the heal"
    for node in net.nodes:
        ids = [d.message.message_id for d in node.delivered]
        assert len(ids) == len(set(ids)), "each update delivered once"
        assert all(d.blob in node.blobs for d in node.delivered), "every blob was fetched"
    assert not [r for n in net.nodes for r in n.rejects if r.reason is not Reason.DUPLICATE]


def test_a_testnet_fault_plan_of_kills_and_a_partition_ends_with_every_update_everywhere() -> None:
    net = formed(8, **HEAL)
    plan = make_plan(nodes=8, duration=40.0, seed=2, kill_every=8.0, downtime=4.0, settle=10.0,
                     partitions=[Partition(10.0, 22.0, (0, 1, 2, 3), (4, 5, 6, 7))])
    assert plan.kills and plan.partitions
    net.follow(plan)
    origin = {net.publish(i, os.urandom(256)): i for i in range(8)}
    net.follow(FaultPlan(nodes=8, duration=10.0))
    assert net.overlay_connected() and _missing(net, origin) == 0


def test_anti_entropy_splits_large_announcements_and_skips_evicted_blobs() -> None:
    net = formed(4, **HEAL, max_ihave_ids=2, anti_entropy_every=0)
    origin = _partitioned_run(net, [0, 1], [2, 3], gap=12)  # 3 updates a side: 2 IHAVE chunks each
    gone = next(m for m, o in origin.items() if o == 0)
    blob = net.nodes[0].router.mcache.get(gone).message.body.payload_sha256.hex()
    for node in net.nodes[:2]:  # side a evicted one blob: its header must not be announced any more
        node.blobs.pop(blob)
        node.router.forget_blob(blob)
        assert gone not in node.router.mcache
    for _ in range(10):
        net.tick()
    for node in net.nodes[2:]:
        got = {d.message.message_id for d in node.delivered}
        assert got == {m for m, o in origin.items() if o != node.index} - {gone}
    assert _missing(net, {m: o for m, o in origin.items() if m != gone}) == 0


def test_update_headers_outlive_the_short_window_but_not_the_history() -> None:
    net = formed(2, **HEAL, history_s=10.0, history_max=3)
    ids = [net.publish(0, os.urandom(64)) for _ in range(4)]
    cache = net.nodes[0].router.mcache
    assert ids[0] not in cache and all(m in cache for m in ids[1:]), "history_max keeps the newest 3"
    for _ in range(net.config.mcache_windows + 1):
        net.tick()
    assert all(m in cache for m in ids[1:]), "headers stay past the short mcache window"
    for _ in range(10):
        net.tick()
    assert not any(m in cache for m in ids), "and are forgotten after history_s"


def test_a_late_answer_to_our_own_iwant_is_a_duplicate_not_penalized_nor_asked_again() -> None:
    net = formed(2, **HEAL)
    mid = net.publish(0, os.urandom(64))
    one = net.nodes[1]
    blob = one.delivered[0].blob
    one.blobs.pop(blob)
    one.router.forget_blob(blob)  # node 1 garbage-collected it; node 0 still holds it in its history
    for _ in range(int(one.router.validator.seen.ttl_s) + 2):  # and node 1's seen-cache forgot it
        net.tick()
    before = len(one.rejects)
    for _ in range(2):  # two reconnects: each announces every held id anew
        net.partition([0], [1])
        net.heal()
        for _ in range(6):
            net.tick()
    late = [r.reason for r in one.rejects[before:]]
    assert late == [Reason.DUPLICATE], "asked once (anti-entropy): the message it accepted, then remembered"
    assert one.router.validator.counters.rejected[Reason.REPLAYED] == 0
    assert one.router.scores.score(net.nodes[0].peer_id) >= 0
    assert [d.message.message_id for d in one.delivered] == [mid], "never delivered twice"


def test_hearsay_addresses_that_cannot_reach_their_peer_are_counted_and_never_dialled() -> None:
    net = formed(3)
    victim, other = net.nodes[0], net.nodes[1]
    stranger = Identity.generate().peer_id
    bad = PeerInfo(stranger, "0.0.0.0:4100", "0.0.0.0:8100")  # a misconfigured node's wildcard
    mine = PeerInfo(Identity.generate().peer_id, victim.router.local.gossip_addr, "")  # claims our address
    good = PeerInfo(Identity.generate().peer_id, "10.9.9.9:4100", "10.9.9.9:8100")
    actions = net.inject(0, other.peer_id, wire.encode(PeerExchange(RUN, (bad, mine, good))))
    refused = [a for a in actions if isinstance(a, Reject)]
    assert [a.reason for a in refused] == [Reason.BAD_ADDRESS] * 2 and "wildcard" in refused[0].detail
    assert stranger not in victim.router.table and mine.peer_id not in victim.router.table
    assert good.peer_id in victim.router.table
    assert other.peer_id in victim.router.peers, "passing on a bad address is not held against the sender"


def test_peers_dialling_in_cannot_take_the_places_of_peers_a_node_dials_itself() -> None:
    # node 0 takes at most max_peers - min_outbound = 2 inbound peers; the rest must be dialled by node 0
    net = SimNet(6, max_peers=4, min_outbound=2, target_peers=2)
    for i in (1, 2):
        assert net.connect(i, 0) is not None
    assert net.connect(3, 0) is None, "a third inbound peer is refused (an eclipse by keys dialling in)"
    node = net.nodes[0].router
    assert len(node.peers) == 2 >= node.config.target_peers  # enough peers, but none dialled by node 0 ...
    for j in (4, 5):
        node.table.connected(net.nodes[j].router.local, net.now)  # peers it knows first-hand
    dials = node._plan_dials(net.now)
    assert {d.address for d in dials} == {addr(4), addr(5)}  # ... so it dials min_outbound of its own choice
    for d in dials:
        assert net.connect(0, net.index_of(d.peer), d.address) is not None
    assert sum(p.outbound for p in node.peers.values()) == 2 and len(node.peers) == 4

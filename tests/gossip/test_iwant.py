"""Tier (a): IWANT budgets (`protocol.gossip.iwant`) and the router's use of them. A peer asking for the same
held ids over and over gets each once per mcache window; one asking past its budget gets nothing more in that
heartbeat and is penalized (`flood`) once a heartbeat until it is banned; an honest node catching up on more
ids than one heartbeat's budget paces its own IWANTs and is never penalized."""

from __future__ import annotations

import os

from gossip_sim import SimNet
from protocol import wire
from protocol.errors import Reason
from protocol.gossip import Disconnect, Reject, Send
from protocol.gossip.iwant import IWantBudget, WantPacer
from protocol.messages import IWant, Signed

FAST = dict(heartbeat_s=1.0, heartbeat_timeout_s=3.5)


def test_a_budget_refills_per_heartbeat_and_reports_a_peer_over_it_once_a_heartbeat() -> None:
    b = IWantBudget(10, heartbeat_s=1.0, windows=3)
    assert b.take("p", 6, 0.0) == (6, False)
    assert b.take("p", 6, 0.0) == (4, True), "past the budget: the first ids only, reported"
    assert b.take("p", 6, 0.1) == (1, False), "reported once a heartbeat; 0.1 s refilled one id"
    assert b.take("q", 10, 0.1) == (10, False), "per peer"
    b.shift()
    assert b.take("p", 20, 10.0) == (10, True), "full again after a heartbeat, never more than the budget"


def test_an_id_is_answered_once_per_peer_within_the_window() -> None:
    b = IWantBudget(10, heartbeat_s=1.0, windows=3)
    b.answered("p", b"x")
    assert b.answered_recently("p", b"x") and not b.answered_recently("q", b"x")
    for _ in range(2):
        b.shift()
        assert b.answered_recently("p", b"x")
    b.shift()
    assert not b.answered_recently("p", b"x"), "after `windows` heartbeats it may be asked again"


def test_the_pacer_defers_what_has_no_room_to_the_next_heartbeat() -> None:
    pacer = WantPacer(per_heartbeat=4, max_waiting=5)
    pacer.asked("p", 3)
    assert pacer.room("p") == 1 and pacer.room("q") == 4
    pacer.wait("p", [b"a", b"b", b"a", b"c", b"d", b"e", b"f", b"g"])
    pacer.forget_peer("q")
    assert pacer.due() == [("p", (b"a", b"b", b"c", b"d", b"e"))]
    assert pacer.room("p") == 4 and pacer.due() == []


def held(n: int, **config: object) -> SimNet:
    net = SimNet(2, bootstrap=[0], **{**FAST, **config})
    for _ in range(3):
        net.tick()
    for _ in range(n):
        net.publish(0, os.urandom(64))
    return net


def answers(actions: list) -> list[Signed]:
    return [a.message for a in actions if isinstance(a, Send) and isinstance(a.message, Signed)]


def test_repeated_iwants_are_answered_once_and_a_flood_past_the_budget_is_penalized_until_banned() -> None:
    net = held(30, iwant_budget=40, max_ihave_ids=20)
    node, asker = net.nodes[0].router, net.nodes[1].peer_id
    ids = tuple(node.mcache.held_ids())
    node.mcache.forget_peer(asker)  # as if it never got them
    first = node.received(asker, node.peers[asker].conn, wire.encode(IWant(net.config.run_id, ids[:20])), net.now)
    assert len(answers(first)) == 20
    again = node.received(asker, node.peers[asker].conn, wire.encode(IWant(net.config.run_id, ids[:20])), net.now)
    assert answers(again) == [] and not [a for a in again if isinstance(a, Reject)], "repeats: no answer, in budget"
    over = node.received(asker, node.peers[asker].conn, wire.encode(IWant(net.config.run_id, ids[20:] * 2)), net.now)
    assert answers(over) == [], "past the budget (20 + 20 of 40 used): nothing answered"
    assert [a.reason for a in over if isinstance(a, Reject)] == [Reason.FLOOD]
    assert node.scores.score(asker) == -20.0
    more = node.received(asker, node.peers[asker].conn, wire.encode(IWant(net.config.run_id, ids)), net.now)
    assert not [a for a in more if isinstance(a, Reject)], "penalized once a heartbeat"
    banned = False
    for _ in range(8):
        net.now += 1.0
        node.heartbeat(net.now)
        if asker not in node.peers:
            break
        out = node.received(asker, node.peers[asker].conn, wire.encode(IWant(net.config.run_id, ids * 3)), net.now)
        banned = any(isinstance(a, Disconnect) for a in out)
    assert banned and node.scores.banned(asker, net.now), "a peer that keeps flooding is banned"


def test_an_honest_catch_up_on_more_ids_than_a_budget_is_paced_and_never_penalized() -> None:
    net = SimNet(3, bootstrap=[0], **FAST, iwant_budget=20, max_ihave_ids=10)
    net.crash(2)
    for _ in range(3):
        net.tick()
    mids = {net.publish(1, os.urandom(64)) for _ in range(45)}
    net.nodes[2].up = True
    for _ in range(8):  # node 2 connects, is told every held id at once, asks for 10 a heartbeat per peer
        net.tick()
    assert {d.message.message_id for d in net.nodes[2].delivered} == mids
    assert not [r for n in net.nodes for r in n.rejects if r.reason is Reason.FLOOD]

"""Tier (c): nodes behind NATs take part (PROTOCOL.md section 11, `p2p.reach`, `p2p.blobpush`).

Two public hosts and two hosts each behind its own NAT (`testnet.nat`: a gateway namespace masquerading a
private one with nftables; nobody can dial the private hosts, they can dial out). Every node is started the
same way, `--listen 0.0.0.0:7000 --http 0.0.0.0:8000`, the others with `--peers <first host>:7000`; nobody
forwards a port. Each private node finds out from the public ones that it cannot be dialled back (`reachable:
no` in /status), syncs the run's state over its own connection, and pushes its updates' payloads to the
public nodes it dialled, which serve them on: both public nodes and the other private node apply its updates,
and all four stop with equal digests."""

from __future__ import annotations

import re

import pytest

from testnet.nat import NatBox, probe_nat

COMMON = ["--inner-steps", "10", "--heartbeat", "0.5", "--eval-every", "0", "--drain-timeout", "60"]
WILDCARD = ("0.0.0.0:7000", "0.0.0.0:8000")
START_S = 180.0


@pytest.fixture
def nat_boxes(hosts):
    """`nat_boxes(net, n)`: n NATed private hosts on `net`'s bridge (slots past its nodes), removed at the end."""
    why = probe_nat()
    if why is not None:
        pytest.skip(f"a NAT needs nftables: {why}")
    made: list[NatBox] = []

    def make(net, n: int) -> list[NatBox]:
        for slot in range(net.nodes, net.nodes + n):
            box = NatBox(net, slot)
            made.append(box)
            box.setup()
        return made[-n:]

    yield make
    for box in reversed(made):
        box.teardown()


def stopped_line(node) -> str:
    line = node.wait_line("STOPPED ", 240.0)
    assert node.wait_exit(30.0) == 0, node.log_tail()
    return line


def test_two_nodes_behind_nats_train_with_two_public_ones(hosts, nat_boxes, cluster) -> None:
    net = hosts(2)
    boxes = nat_boxes(net, 2)
    args = [*COMMON, "--max-rounds", "8"]
    a = cluster("a", *args, "--slowdown", "30", exec_prefix=tuple(net.exec_prefix(0)), listen=WILDCARD)
    a.wait_listening(START_S)
    # a closes a slot before anyone joins, so every joiner has a state to sync (one that joined while a was
    # still in its first round would start from the run's seed and sync nothing)
    a.wait_status(lambda s: s["slot"] >= 1, START_S, "a past its first slot")
    peers = ("--peers", f"{net.host(0)}:7000")
    b = cluster("b", *args, *peers, exec_prefix=tuple(net.exec_prefix(1)), listen=WILDCARD)
    private = [cluster(f"n{i}", *args, *peers, exec_prefix=tuple(box.exec_prefix()), listen=WILDCARD)
               for i, box in enumerate(boxes)]
    for node, box in zip(private, boxes, strict=True):
        node.wait_listening(START_S)
        assert node.gossip == f"{box.host}:7000", "it advertises its private address: nobody can dial it"
    for node in private:
        seen = node.wait_status(lambda s: s["reachable"] == "no" and s["state"] == "training", START_S,
                                "the private node training, knowing it cannot be dialled")
        assert "pushed over connections this node opens" in seen["blobs_leave"]
        assert seen["sync"] is not None, "it synced the run's state over a connection it opened"
    publics = (a, b)
    lines = [stopped_line(n) for n in (*publics, *private)]
    assert len(set(lines)) == 1, "\n".join(lines)
    for node in publics:  # peers dialled the public nodes back
        assert "reachability: public" in node.log_path.read_text(), node.log_tail()
    for node in private:  # its updates: pushed to a public node, and applied by every other node
        assert re.search(f"pushed blob [0-9a-f]+ to ", node.log_path.read_text()), node.log_tail()
        for other in (*publics, *(p for p in private if p is not node)):
            # counted there: applied in its slot, folded in late, or held until the node reached its slot
            # (then applied: the digests above are equal)
            assert re.search(f"update [0-9a-f]+ from {node.peer_id} .*: (applied|folded-late|held-future)",
                             other.log_path.read_text()), (node.peer_id, other.home.name)
    assert any(re.search("stored blob [0-9a-f]+ .* pushed by", n.log_path.read_text()) for n in publics)

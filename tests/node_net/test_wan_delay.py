"""Tier (c): a run over emulated WAN links with real latency (`testnet.wan`; where the kernel lacks netem, the
user-space delay line of `testnet.delayline`).

Three hosts, each in its own namespace behind a 100 Mbit/s link with 25 ms one-way delay (a 50 ms round trip
between any two): every connection, the handshakes, gossip, blob fetches and the joiners' state sync, crosses
the delayed links. The nodes train, apply each other's updates and stop with equal digests, and the links
carried their traffic (the delay line's own counts)."""

from __future__ import annotations

import re

COMMON = ["--inner-steps", "10", "--heartbeat", "0.5", "--eval-every", "0", "--drain-timeout", "60"]
WILDCARD = ("0.0.0.0:7000", "0.0.0.0:8000")
START_S = 180.0


def test_three_hosts_over_delayed_links_train_and_agree(hosts, cluster) -> None:
    net = hosts(3, "100mbit,25ms")
    args = [*COMMON, "--max-rounds", "5"]
    a = cluster("a", *args, "--slowdown", "50", exec_prefix=tuple(net.exec_prefix(0)), listen=WILDCARD)
    a.wait_listening(START_S)
    joiners = [cluster(name, *args, "--peers", f"{net.host(0)}:7000", exec_prefix=tuple(net.exec_prefix(i)),
                       listen=WILDCARD) for i, name in ((1, "b"), (2, "c"))]
    for node in joiners:
        node.wait_listening(START_S)
    a.wait_status(lambda s: len(s["peers"]) == 2 and s["state"] == "training", START_S, "a training with 2 peers")
    lines = []
    for node in (a, *joiners):
        lines.append(node.wait_line("STOPPED ", 240.0))
        assert node.wait_exit(30.0) == 0, node.log_tail()
    assert len(set(lines)) == 1, "\n".join(lines)
    for joiner in joiners:
        # counted at a: applied in its slot, folded in late, or held until a reached its slot
        assert re.search(f"update [0-9a-f]+ from {joiner.peer_id} .*: (applied|folded-late|held-future)",
                         a.log_path.read_text()), joiner.peer_id
    stats = net.link_stats()
    if stats:  # the delay line carried the run (with netem there is a bridge and no counts)
        for i in range(3):
            port = stats[f"dlc{net.tag}n{i}"]
            assert port["sent_bytes"] > 100_000 and port["received_bytes"] > 100_000, (i, port)

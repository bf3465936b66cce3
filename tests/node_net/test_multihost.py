"""Tier (c): nodes on separate hosts and nodes whose bootstrap peer is not there yet.

- Three hosts (a network namespace each, with its own address, on one bridge: `testnet.wan`), every node
  started as the README tells a user on separate hosts: `--listen 0.0.0.0:7000 --http 0.0.0.0:8000`, the
  joiners with `--peers <first host>:7000`. Each advertises its own host's address (never the wildcard,
  from which a peer would fetch from itself), and the three stop with equal digests. Skipped, with the
  reason, where namespaces cannot be made (not root, no iproute2).
- A node whose `--peers` names a closed port waits (state "syncing", what it waits for and the failed
  dials in `/status`, each failed dial logged) and never trains alone; when a node starts at that address
  it joins it, and the two stop with equal digests.
"""

from __future__ import annotations

import re

from node_net_helpers import free_port

COMMON = ["--inner-steps", "10", "--heartbeat", "0.5", "--eval-every", "0", "--drain-timeout", "60"]
WILDCARD = ("0.0.0.0:7000", "0.0.0.0:8000")  # the README's --listen and --http on each host
START_S = 180.0


def stopped_line(node) -> str:
    line = node.wait_line("STOPPED ", 150.0)
    assert node.wait_exit(30.0) == 0, node.log_tail()
    return line


def test_three_hosts_started_with_the_readme_command_agree(hosts, cluster) -> None:
    net = hosts(3)
    args = [*COMMON, "--max-rounds", "5"]
    # --slowdown stretches the founder's rounds (a sleep, no CPU) so the joiners arrive mid-run: they connect
    # ~4 s after a's LISTENING; at 50, a alone would train until ~8 s after it on an idle machine (~14 s at 100).
    a = cluster("a", *args, "--slowdown", "50", exec_prefix=tuple(net.exec_prefix(0)), listen=WILDCARD)
    a.wait_listening(START_S)
    joiners = [cluster(name, *args, "--peers", f"{net.host(0)}:7000", exec_prefix=tuple(net.exec_prefix(i)),
                       listen=WILDCARD) for i, name in ((1, "b"), (2, "c"))]
    for i, node in enumerate((a, *joiners)):
        if node is not a:
            node.wait_listening(START_S)
        assert (node.gossip, node.http) == (f"{net.host(i)}:7000", f"{net.host(i)}:8000"), \
            "each node advertises its own host's address, not 0.0.0.0"
    a.wait_status(lambda s: len(s["peers"]) == 2 and s["state"] == "training", START_S, "a training with 2 peers")
    lines = [stopped_line(n) for n in (a, *joiners)]
    assert len(set(lines)) == 1, "\n".join(lines)
    assert int(lines[0].split()[1]) == 5, "every node stopped at the run's last slot"
    for joiner in joiners:  # the slots hold the peers' updates, not one node's rounds alone
        assert re.search(f"update [0-9a-f]+ from {joiner.peer_id}", a.log_path.read_text()), joiner.peer_id


def test_a_node_with_an_unreachable_bootstrap_peer_waits_and_joins_when_it_starts(cluster) -> None:
    port = free_port()  # nobody listens there yet
    # --no-adopt: the node starts at once instead of first trying, for 30 s, to read the run's configuration
    # from the closed port (node.adopt, tested on its own in tests/node/test_adopt_config.py); what follows (the
    # failed dials, the wait in "syncing", the join) is the same with or without it.
    b = cluster("b", *COMMON, "--max-rounds", "3", "--no-adopt", "--peers", f"127.0.0.1:{port}")
    b.wait_listening(START_S)
    b.wait_log(rf"cannot reach bootstrap peer 127\.0\.0\.1:{port} \(try 2\)", 60.0)
    waiting = b.wait_status(lambda s: s["waiting_for"] is not None and f"127.0.0.1:{port}" in s["dial_failures"],
                            30.0, "waiting, with the failed dials")
    assert waiting["state"] == "syncing" and waiting["round"] == 0 and waiting["updates_published"] == 0
    assert "a connection to a peer" in waiting["waiting_for"] and f"127.0.0.1:{port}" in waiting["waiting_for"]

    # --slowdown keeps a (and so b, draining while it waits for a) running for a few seconds, so b is seen training
    a = cluster("a", *COMMON, "--max-rounds", "3", "--slowdown", "50", listen=(f"127.0.0.1:{port}", "127.0.0.1:0"))
    a.wait_listening(START_S)
    joined = b.wait_status(lambda s: s["state"] == "training", START_S, "b joined and training")
    assert a.peer_id in joined["peers"] and joined["waiting_for"] is None and not joined["dial_failures"]
    assert "no usable peer state" not in b.log_path.read_text(), "it never gave up and founded a run"
    lines = [stopped_line(n) for n in (a, b)]
    assert len(set(lines)) == 1, "\n".join(lines)

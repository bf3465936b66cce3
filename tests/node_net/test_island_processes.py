"""Tier (c): an island of two processes (`jax.distributed` on this machine, one CPU device each, gloo between
them) is one node of a run beside a one-process node.

Its mesh is `fsdp=2`, so every large tensor is split across the two processes: each step's collectives cross
them. They train, exchange updates with the other node, and stop with equal digests. SIGKILL one process of
the island: the other exits within the coordination service's heartbeat timeout (the island fails as a unit),
the other node keeps training, and the island started again resumes from the speaker's checkpoint, syncs and
stops at the run's end with the same digests.
"""

from __future__ import annotations

import re

from node_net_helpers import free_port

COMMON = ["--inner-steps", "10", "--heartbeat", "0.5", "--eval-every", "4", "--eval-batches", "2",
          "--drain-timeout", "60", "--max-rounds", "24"]
START_S = 180.0


def island(cluster, coordinator: str, *args: str):
    flags = [*COMMON, *args, "--mesh", "fsdp=2", "--coordinator", coordinator, "--num-processes", "2"]
    return cluster("b0", *flags, "--process-id", "0"), cluster("b1", *flags, "--process-id", "1")


def test_a_two_process_island_trains_beside_a_node_and_fails_and_returns_as_a_unit(cluster) -> None:
    a = cluster("a", *COMMON, "--slowdown", "100")  # rounds stretched (a sleep): the run outlasts the restart
    a.wait_listening(START_S)
    speaker, follower = island(cluster, f"127.0.0.1:{free_port()}", "--peers", a.gossip)
    follower.wait_line("ISLAND 1 2 ", START_S)
    speaker.wait_listening(START_S)
    status = speaker.wait_status(lambda s: s["round"] >= 3, START_S, "the island at round 3")
    assert status["island"]["processes"] == 2 and status["island"]["devices"] == 2
    assert status["island"]["mesh"] == "data=1,fsdp=2"
    a.wait_log(rf"from {speaker.peer_id} .*: applied", 60.0)  # the island's updates reach the other node

    follower.kill()
    assert speaker.wait_exit(60.0) != 0, "the speaker went down with its follower"
    at_kill = a.status()["slot"]
    a.wait_status(lambda s: s["slot"] >= at_kill + 1, 120.0, "the other node training on")

    follower.start()
    speaker.start()
    follower.wait_line("ISLAND 1 2 ", START_S)
    speaker.wait_listening(START_S)
    back = speaker.wait_status(lambda s: s["state"] == "training", START_S, "the island training again")
    assert back["resumed_round"] is not None and back["resumed_round"] >= 1, "resumed from the speaker's checkpoint"

    lines = [n.wait_line("STOPPED ", 180.0) for n in (a, speaker)]
    assert len(set(lines)) == 1, "\n".join(lines)
    assert int(lines[0].split()[1]) == 24
    assert a.wait_exit(30.0) == 0 and speaker.wait_exit(30.0) == 0
    assert follower.wait_exit(60.0) == 0, "the follower ends when its speaker closes the island"
    assert re.search(r"the speaker closed the island", follower.log_path.read_text())

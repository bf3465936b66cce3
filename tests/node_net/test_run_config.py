"""Tier (c): one run configuration, checked at the handshake. A node started with another inner learning
rate (which would pass every check an update gets, and corrupt the run) is refused at its first frame,
both sides name the field that differs, and the refusal is counted; nodes with the same settings connect
and report the same run configuration hash."""

from __future__ import annotations

import re

COMMON = ["--inner-steps", "5", "--heartbeat", "0.5", "--eval-every", "0", "--sync-timeout", "5"]


def test_a_peer_with_another_inner_learning_rate_is_refused_at_the_handshake(cluster) -> None:
    a = cluster("a", *COMMON)
    a.wait_listening(180.0)
    b = cluster("b", *COMMON, "--peers", a.gossip)
    c = cluster("c", *COMMON, "--set", "lr=0.5", "--peers", a.gossip)
    for node in (b, c):
        node.wait_listening(180.0)
    b.wait_status(lambda s: a.peer_id in s["peers"], 60.0, "b connected to a")
    assert b.status()["run_config_hash"] == a.status()["run_config_hash"]
    assert "inner.lr=0.5\n" in c.status()["run_config"]
    a.wait_log("config_mismatch", 60.0)
    line = next(ln for ln in a.log_path.read_text().splitlines() if "config_mismatch" in ln)
    assert "inner.lr: ours 0.01, theirs 0.5" in line, line
    named = set(re.findall(r"([a-z_]+\.[a-z_]+): ours", line))
    assert named == {"inner.lr", "outer.max_step_rms"}, named  # and what follows from it: the update bound
    assert a.status()["updates_rejected"].get("config_mismatch", 0) >= 1
    assert c.peer_id not in a.status()["peers"] and a.peer_id not in c.status()["peers"]
    c.wait_log("config_mismatch", 60.0)

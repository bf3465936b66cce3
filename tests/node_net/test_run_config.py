"""Tier (c): one run configuration, checked at the handshake and adopted by joiners. A node started with
another inner learning rate (which would pass every check an update gets, and corrupt the run) and told not
to adopt the run's settings is refused at its first frame, both sides name the field that differs, and the
refusal is counted; nodes with the same settings connect and report the same run configuration hash. A
joiner given only the run id and a peer trains with the run's settings; one that pins a conflicting
setting stops at once with an error naming the flag."""

from __future__ import annotations

import re

COMMON = ["--inner-steps", "5", "--heartbeat", "0.5", "--eval-every", "0", "--sync-timeout", "5"]


def test_a_peer_with_another_inner_learning_rate_is_refused_at_the_handshake(cluster) -> None:
    a = cluster("a", *COMMON)
    a.wait_listening(180.0)
    b = cluster("b", *COMMON, "--peers", a.gossip)
    # c never syncs (every peer refuses it): a long --sync-timeout keeps it up while its /status is read
    c = cluster("c", *COMMON, "--set", "lr=0.5", "--no-adopt", "--sync-timeout", "300", "--peers", a.gossip)
    for node in (b, c):
        node.wait_listening(180.0)
    b.wait_status(lambda s: a.peer_id in s["peers"], 60.0, "b connected to a")
    assert b.status()["run_config_hash"] == a.status()["run_config_hash"]
    assert "inner.lr=0.5\n" in c.status()["run_config"]
    a.wait_log("config_mismatch", 60.0)
    line = next(ln for ln in a.log_path.read_text().splitlines() if "config_mismatch" in ln)
    assert "inner.lr: ours 0.01, theirs 0.5" in line, line
    named = set(re.findall(r"([a-z_]+\.[a-z_]+): ours", line))
    # and what follows from it: the traced optimizer, the schedule's values, the update bound
    assert named == {"inner.lr", "inner.optimizer", "inner.schedule", "outer.max_step_rms"}, named
    assert a.status()["updates_rejected"].get("config_mismatch", 0) >= 1
    assert c.peer_id not in a.status()["peers"] and a.peer_id not in c.status()["peers"]
    c.wait_log("config_mismatch", 60.0)


def test_a_joiner_adopts_the_runs_settings_and_one_that_pins_a_conflicting_one_stops_naming_it(cluster) -> None:
    # (every node here is given the small model's --set flags: the joiner pins those, and they agree)
    run_wide = ["--window", "4", "--inner-steps", "5", "--outer-lr", "0.5", "--seed", "7", "--compression", "int8"]
    a = cluster("a", *run_wide, "--heartbeat", "0.5", "--eval-every", "0")
    a.wait_listening(180.0)
    joiner = cluster("joiner", "--heartbeat", "0.5", "--eval-every", "0", "--peers", a.gossip)  # nothing run-wide
    pinned = cluster("pinned", "--window", "2", "--peers", a.gossip)
    joiner.wait_listening(180.0)
    joined = joiner.wait_status(lambda s: a.peer_id in s["peers"] and s["round"] >= 1, 180.0, "the joiner training")
    assert joined["run_config_hash"] == a.status()["run_config_hash"]
    assert "outer.window=4\n" in joined["run_config"] and 'run.compression="int8"\n' in joined["run_config"]
    joiner.wait_log("adopted the run's configuration from", 10.0)
    assert pinned.wait_exit(120.0) == 2
    error = pinned.log_path.read_text()
    assert "--window 2 (the run's outer.window is 4)" in error, error[-2000:]

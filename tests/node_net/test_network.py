"""Tier (c): real `diloco-node` processes on loopback (the tiny model, shrunk).

- three nodes train, loss falls, and at the run's end (`--max-rounds`: its last slot) all stop with equal
  ledger and params digests; a fourth node started mid-run, without `--max-rounds` (it takes the run's),
  syncs the others' state, trains fewer rounds, and stops at the same slot with the same digests;
- one node SIGKILLed mid-run: the other two keep advancing; restarted, it resumes from its own checkpoint,
  syncs, and all three stop at the run's end with equal digests.

No fixed sleeps: every wait is a `/status` predicate or a stdout line, with a bounded timeout.
"""

from __future__ import annotations

import json

import pytest

from node.checkpoint import CheckpointDir
from node.status import LAST_STATUS

# --eval-budget 1: every second round is evaluated whatever it costs (the default 2% share skips evaluations
# on a loaded machine, and the tests read the loss's fall from the evaluations)
COMMON = ["--inner-steps", "10", "--heartbeat", "0.5", "--eval-every", "2", "--eval-batches", "2",
          "--eval-budget", "1", "--drain-timeout", "60", "--compression", "int4"]
START_S = 180.0  # first start of the suite compiles the model (cold JAX cache) on a busy CPU


def stopped_line(node) -> str:
    line = node.wait_line("STOPPED ", 150.0)
    assert node.wait_exit(30.0) == 0
    return line


def test_three_nodes_train_and_stop_equal_and_a_joiner_syncs(cluster) -> None:
    # --slowdown stretches the founders' rounds (a sleep, no CPU) so the joiner arrives mid-run.
    a = cluster("a", *COMMON, "--max-rounds", "10", "--slowdown", "30")
    a.wait_listening(START_S)
    b = cluster("b", *COMMON, "--max-rounds", "10", "--slowdown", "30", "--peers", a.gossip)
    c = cluster("c", *COMMON, "--max-rounds", "10", "--slowdown", "30", "--peers", a.gossip)
    b.wait_listening(START_S)
    c.wait_listening(START_S)
    for node in (a, b, c):
        node.wait_status(lambda s: s["state"] == "training" and len(s["peers"]) == 2, START_S, "training, 2 peers")
    first = a.wait_status(lambda s: s["slot"] >= 3, 120.0, "slot 3")
    assert first["updates_applied"] >= 3 and first["first_update_at"] is not None
    for node in (b, c):  # a joiner takes a state two peers vouch for: every founder past slot 3 first
        node.wait_status(lambda s: s["slot"] >= 3, 120.0, "slot 3")

    d = cluster("d", *COMMON, "--peers", a.gossip)  # the run's end comes with the run's configuration
    d.wait_listening(START_S)
    joined = d.wait_status(lambda s: s["state"] == "training", START_S, "the joiner training")
    sync = joined["sync"]
    assert sync is not None and sync["slot"] >= 3, "the joiner downloaded a mid-run state"
    assert set(sync["confirmed_by"]) <= {a.peer_id, b.peer_id, c.peer_id}
    if len(sync["confirmed_by"]) < 2:  # only if the three were mid-close at every ask
        assert "vouched for by" in d.log_path.read_text()

    assert d.status()["end_slot"] == 10
    lines = [stopped_line(n) for n in (a, b, c, d)]
    assert len(set(lines)) == 1, "\n".join(lines)
    assert int(lines[0].split()[1]) == 10, "every node stopped at the run's last slot"
    last = {n.peer_id: json.loads((n.home / "ckpt" / LAST_STATUS).read_text()) for n in (a, b, c, d)}
    joiner = last.pop(d.peer_id)
    assert joiner["slot"] == 10 and joiner["round"] < 10, "the joiner trained only the run's remaining rounds"
    founder = last[a.peer_id]["eval_history"]
    assert founder[0][0] == 0 and founder[0][2] > 7.0 and founder[-1][2] < founder[0][2] - 2.0, founder
    for status in last.values():
        history = status["eval_history"]  # the last one: the run's final model, the same for every node
        # A joiner's first evaluation is of the state it synced (how far the founder got first varies),
        # so the check is against the initial parameters' ~7.9 bits per byte.
        assert len(history) >= 3 and history[-1][2] < 6.0, f"loss fell: {history}"
        assert status["eval_slot"] == 10 and status["eval_loss"] == pytest.approx(founder[-1][2], rel=1e-6)
        assert status["loss"] is not None and status["contributed_step_seconds"] > 0
        assert not status["updates_rejected"].get("non_finite") and not status["updates_rejected"].get("shape_mismatch")


def test_a_killed_node_does_not_stop_the_others_and_resumes_from_its_checkpoint(cluster) -> None:
    # the run's end leaves a and b training while c restarts (a cold start compiles for tens of seconds)
    a = cluster("a", *COMMON, "--max-rounds", "30", "--slowdown", "30")
    a.wait_listening(START_S)
    b = cluster("b", *COMMON, "--max-rounds", "30", "--slowdown", "30", "--peers", a.gossip)
    c = cluster("c", *COMMON, "--max-rounds", "30", "--peers", a.gossip)
    b.wait_listening(START_S)
    c.wait_listening(START_S)
    c.wait_status(lambda s: s["round"] >= 2 and len(s["peers"]) == 2, START_S, "c at round 2")
    saved = sorted(int(p.name[5:13]) for p in (c.home / "ckpt").glob("ckpt-*.dlc"))
    c.kill()  # SIGKILL: no goodbye, no last checkpoint
    assert saved and saved[-1] >= 1, "c had checkpoints before the kill"
    at_kill = {n: n.status()["slot"] for n in (a, b)}
    for n in (a, b):
        n.wait_status(lambda s: s["slot"] >= at_kill[n] + 2, 120.0, "advancing without c")
    a.wait_status(lambda s: c.peer_id not in s["peers"], 60.0, "c dropped after missed heartbeats")

    c.start()
    c.wait_listening(START_S)
    back = c.wait_status(lambda s: s["state"] == "training", START_S, "c training again")
    assert back["resumed_round"] is not None and back["resumed_round"] >= saved[-1], "resumed from its checkpoint"
    assert back["round"] >= back["resumed_round"]
    assert back["sync"] is not None and back["sync"]["slot"] > at_kill[a], "caught up with the others' state"

    lines = [stopped_line(n) for n in (a, b, c)]
    assert len(set(lines)) == 1, "\n".join(lines)
    assert int(lines[0].split()[1]) == 30, "the restarted node stopped at the run's last slot with the others"


def test_sigterm_says_goodbye_writes_a_checkpoint_and_exits_0(cluster) -> None:
    a = cluster("a", *COMMON)  # no --max-rounds: runs until a signal
    a.wait_listening(START_S)
    b = cluster("b", *COMMON, "--peers", a.gossip)
    b.wait_listening(START_S)
    a.wait_status(lambda s: s["round"] >= 2 and len(s["peers"]) == 1, START_S, "a at round 2 with b")
    a.terminate()
    _, slot, ledger_digest, _ = stopped_line(a).split()
    b.wait_log(f"disconnected {a.peer_id} .*: goodbye", 30.0)
    newest = CheckpointDir(a.home / "ckpt").latest()
    assert newest is not None and newest.round >= 2 and newest.meta["slot"] == int(slot)
    b.terminate()
    assert b.wait_exit(60.0) == 0

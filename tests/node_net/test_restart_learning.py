"""Tier (c): a crash and a restart never set the run's learning back.

Three real nodes train; one of them is SIGKILLed and restarted three times — from its newest checkpoint
(killed in the middle of a round, whose journaled steps the new process then publishes once:
`node.outer.inflight`), from a checkpoint many rounds older than the run (its copied journal is not
published again), and with its checkpoint directory wiped. After each
restart the two nodes that were never killed must not see their held-out loss rise (each evaluation in
the rounds after the restart within `NOISE` of the one before it) and must never fork (no "histories
forked", no adopted state), nor close more slots than the rounds they train (each slot close is an outer
momentum step). At the end they stop with equal digests.

Before the fix, a node resumed from an old checkpoint published a burst of one-step rounds, one slot
each, and every replica followed it: a dozen extra outer momentum steps in seconds, the held-out loss of
every node jumping from ~3 to ~5 bits per byte (issue "Self-healing that heals").
"""

from __future__ import annotations

import shutil
import statistics
import time

COMMON = ["--inner-steps", "10", "--heartbeat", "0.5", "--eval-every", "1", "--eval-batches", "4",
          "--eval-budget", "1", "--drain-timeout", "30", "--checkpoint-interval", "0", "--inflight-every", "0.5"]
START_S = 180.0
NOISE = 0.08  # an evaluation may be this much above the median of the last three before the restart
AFTER_ROUNDS = 4  # evaluations of the never-killed nodes watched after each restart
ROUNDS = 70  # the run's end (--max-rounds: its last slot), past the three restarts and their watches
FORK_SIGNS = ("histories forked", "adopted the state of")


def _watch_restart(survivors, restarted_at: float, at_restart: dict, what: str) -> None:
    """Over the survivors' next rounds: their slots advance with the run's rounds (a slot is an outer
    momentum step: a burst of the restarted node's short rounds must not add any), their held-out loss
    does not rise past the median of their last evaluations before the restart + NOISE, and nothing
    forks."""
    for node in survivors:
        start_round = node.status()["round"]
        node.wait_status(lambda s: s["round"] >= start_round + AFTER_ROUNDS, 120.0, f"{AFTER_ROUNDS} rounds after {what}")
    now = {node: node.status() for node in survivors}
    # The run's rounds in the window: the faster survivor's (on a loaded machine one node may train slower than
    # the others, and its slots then follow theirs). The bug this guards against added a dozen slots in seconds.
    rounds = max(now[n]["round"] - at_restart[n]["round"] for n in survivors)
    for node in survivors:
        slots = now[node]["slot"] - at_restart[node]["slot"]
        assert slots <= rounds + max(3, rounds // 4), (
            f"{what}: {slots} slots closed while the run trained {rounds} rounds")
        history = node.status()["eval_history"]
        before = [p for p in history if p[1] < restarted_at]
        assert before, f"{what}: evaluations before the restart"
        reference = statistics.median(p[2] for p in before[-3:])
        after = [p[2] for p in history if p[1] >= restarted_at]
        assert max(after) <= reference * (1 + NOISE), (
            f"{what}: held-out loss of a never-killed node rose after the restart: {reference:.4f} before, "
            f"{[round(x, 4) for x in after]} after")
        log = node.log_path.read_text()
        for sign in FORK_SIGNS:
            assert sign not in log, f"{what}: a never-killed node forked ('{sign}')"


def _copy_if_present(src: str, dst: str) -> None:
    """copytree's copy of one file of a running node's directory: a blob the node's clean-up removed while the
    directory was being copied is left out (as a checkpoint copied by hand would miss it)."""
    try:
        shutil.copy2(src, dst)
    except FileNotFoundError:
        pass


def test_restarts_from_a_new_an_old_and_no_checkpoint_never_set_the_survivors_back(cluster, tmp_path) -> None:
    # --slowdown stretches the rounds (a sleep, no CPU) so restarts happen mid-run.
    # the run ends at slot ROUNDS: the three restarts and their watched rounds fit with a dozen slots to spare
    # (slots come a little faster than one node's rounds: the three nodes' updates close them)
    a = cluster("a", *COMMON, "--max-rounds", str(ROUNDS), "--slowdown", "50")
    a.wait_listening(START_S)
    b = cluster("b", *COMMON, "--max-rounds", str(ROUNDS), "--slowdown", "50", "--peers", a.gossip)
    c = cluster("c", *COMMON, "--slowdown", "50", "--peers", a.gossip)
    for node in (b, c):
        node.wait_listening(START_S)
    c.wait_status(lambda s: s["round"] >= 3 and len(s["peers"]) == 2, START_S, "c at round 3")
    old = tmp_path / "c-old-ckpt"
    shutil.copytree(c.home / "ckpt", old, copy_function=_copy_if_present)  # many rounds behind the run, later

    for what in ("a restart from its newest checkpoint", "a restart from an old checkpoint",
                 "a restart with its checkpoint directory wiped"):
        journal = c.home / "ckpt" / "inflight.dlc"
        if "newest" in what:  # in the middle of a round, once its journal is written (node.outer.inflight)
            # (the later restarts come after the previous one's watch, in which c trained 2 + AFTER_ROUNDS rounds)
            at = c.status()["round"]
            c.wait_status(lambda s: s["round"] >= at + 3, 120.0, "c trained on")
            c.wait_status(lambda s: journal.exists(), 60.0, "c's round in flight journaled")
        c.kill()  # SIGKILL: no goodbye, no last checkpoint
        in_flight = journal.exists()  # the round may have ended (and removed it) just before the kill
        if "old" in what:
            shutil.rmtree(c.home / "ckpt")
            shutil.copytree(old, c.home / "ckpt")
        elif "wiped" in what:
            shutil.rmtree(c.home / "ckpt")
        restarted_at = time.time()
        at_restart = {n: n.status() for n in (a, b)}
        c.start()
        c.wait_listening(START_S)
        back = c.wait_status(lambda s: s["state"] == "training", START_S, f"c training again after {what}")
        c.wait_status(lambda s: s["round"] >= back["round"] + 2, 120.0, f"c contributing after {what}")
        if "newest" in what:  # the killed round's steps were published by the new process, once
            assert c.status()["recovered_rounds"] == int(in_flight), c.log_path.read_text()[-3000:]
        else:  # an old copy's journal was published by the process that went on; a wiped one has none
            assert c.status()["recovered_rounds"] == 0
        _watch_restart((a, b), restarted_at, at_restart, what)

    c.terminate()
    assert c.wait_exit(60.0) == 0
    lines = [n.wait_line("STOPPED ", 180.0) for n in (a, b)]
    assert len(set(lines)) == 1, "\n".join(lines)

"""Tier (c): one hostile peer cannot wreck a run. Three honest nodes train a fixed number of rounds, alone and
then with a fourth node whose key is valid and which publishes, every round, its own update negated and
scaled ×10⁴, claiming the most tokens the run allows (`--misbehave poison:negate`). The honest nodes'
held-out loss at the end must stay within `TOLERANCE` of the honest-only run's; and an update claiming 2⁴⁰
tokens is refused by every honest node as `bad_claim`.

The test guards the bound, not the issue's 5% claim at every scale. Measured gaps
of the attacked run over the honest-only one: at this test's small model and length +1.2% (4.178 vs 4.130
bits/byte) and +5.3% (4.041 vs 3.839, 2026-11-28, on a machine running the suite at half its usual pace,
both runs on the same ~228 inner steps per node); with `python -m testnet.bench hostile` on the `tiny` preset
+0–6% with the screen, +10–13% with the bound alone (BENCHMARKS.md, "Hostile peer"). Single runs spread that
much, so `TOLERANCE` is 10%, above the spread with the screen; a broken bound sends the loss to ~10⁹.

Before the bound (`protocol.ledger.bound`) the same attack took the honest nodes' held-out loss from ~4
to thousands of bits per byte within two rounds (issue "Trust in a running training").
"""

from __future__ import annotations

import re
import statistics

ROUNDS = 24
# The refused claim needs no loss comparison: a dozen rounds give every honest node the hostile node's updates
# (it publishes one every round from its first) and the evaluations the run checks (rounds 0, 4, 8, 12).
CLAIM_ROUNDS = 12
# --slowdown stretches the inner steps (a sleep, no CPU) to ~2 s rounds, so every node has joined long before
# the first ones finish (without it the first two ran their 24 rounds before the last one started, and the
# late one then shared the run with the hostile node alone, a hostile half the bound is not meant for)
COMMON = ["--inner-steps", "10", "--heartbeat", "0.5", "--eval-every", "4", "--eval-batches", "4",
          "--eval-budget", "1", "--drain-timeout", "20", "--checkpoint-interval", "0", "--slowdown", "40"]
TOLERANCE = 0.10
START_S = 180.0


def _start(cluster, prefix: str, hostile: str | None, rounds: int = ROUNDS) -> tuple[list, object]:
    """Start three honest nodes (and a hostile one) that train `rounds` rounds: (the honest ones, the hostile one)."""
    common = [*COMMON, "--max-rounds", str(rounds)]
    a = cluster(f"{prefix}a", *common)
    a.wait_listening(START_S)
    honest = [a] + [cluster(f"{prefix}{n}", *common, "--peers", a.gossip) for n in "bc"]
    evil = cluster(f"{prefix}h", *common, "--misbehave", hostile, "--peers", a.gossip) if hostile else None
    for node in honest[1:] + ([evil] if evil else []):
        node.wait_listening(START_S)
    return honest, evil


def _finish(run: tuple[list, object], hostile: str | None) -> float:
    """Wait for a run's honest nodes to stop; their mean final held-out bpb."""
    honest, evil = run
    finals = []
    for node in honest:
        assert node.wait_exit(300.0) == 0, node.log_tail()
        log = node.log_path.read_text()
        evaluations = [float(x) for x in re.findall(r"held-out ([0-9.]+) bits/byte", log)]
        assert len(evaluations) >= 3, log[-2000:]
        finals.append(statistics.mean(evaluations[-2:]))
        if hostile == "poison:tokens":
            assert "bad_claim" in log, "the inflated claim is refused, with its reason"
    if evil is not None:
        evil.kill()
    return statistics.mean(finals)


def test_a_hostile_peer_publishing_negated_scaled_updates_does_not_set_the_honest_nodes_back(cluster) -> None:
    # The two runs train side by side, on the same loaded machine: two separate networks (each node knows only
    # its own run's first node), so the honest-only run never hears of the hostile node.
    clean = _start(cluster, "clean-", None)
    hostile = _start(cluster, "attacked-", "poison:negate")
    honest_only = _finish(clean, None)
    attacked = _finish(hostile, "poison:negate")
    other_run = [node.peer_id for node in (*hostile[0], hostile[1])]
    for node in clean[0]:
        log = node.log_path.read_text()
        assert not [p for p in other_run if p in log], "the honest-only run never met the attacked run's nodes"
    assert attacked <= honest_only * (1 + TOLERANCE), (
        f"held-out bpb with a hostile peer {attacked:.4f}, honest only {honest_only:.4f}")


def test_an_update_claiming_more_tokens_than_the_run_allows_is_refused(cluster) -> None:
    _finish(_start(cluster, "claim-", "poison:tokens", rounds=CLAIM_ROUNDS), "poison:tokens")

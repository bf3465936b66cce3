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
from collections.abc import Sequence

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


def _start(cluster, prefix: str, hostile: Sequence[str] = (), honest: int = 3,
           rounds: int = ROUNDS) -> tuple[list, list]:
    """Start `honest` honest nodes and one node per `hostile` mode, all training `rounds` rounds:
    (the honest ones, the hostile ones)."""
    common = [*COMMON, "--max-rounds", str(rounds)]
    a = cluster(f"{prefix}a", *common)
    a.wait_listening(START_S)
    names = "bcdefg"
    nodes = [a] + [cluster(f"{prefix}{names[k]}", *common, "--peers", a.gossip) for k in range(honest - 1)]
    evil = [cluster(f"{prefix}h{k}", *common, "--misbehave", mode, "--peers", a.gossip)
            for k, mode in enumerate(hostile)]
    for node in nodes[1:] + evil:
        node.wait_listening(START_S)
    return nodes, evil


def _evaluations(node) -> list[float]:
    return [float(x) for x in re.findall(r"held-out ([0-9.]+) bits/byte", node.log_path.read_text())]


def _finish(run: tuple[list, list], hostile: str | None = None) -> list[list[float]]:
    """Wait for a run's honest nodes to stop; each one's held-out bpb at its evaluations, in order."""
    honest, evil = run
    curves = []
    for node in honest:
        assert node.wait_exit(300.0) == 0, node.log_tail()
        evaluations = _evaluations(node)
        assert len(evaluations) >= 3, node.log_path.read_text()[-2000:]
        curves.append(evaluations)
        if hostile == "poison:tokens":
            assert "bad_claim" in node.log_path.read_text(), "the inflated claim is refused, with its reason"
    for node in evil:
        node.kill()
    return curves


def _final(curves: list[list[float]]) -> float:
    """The honest nodes' mean of their last two evaluations."""
    return statistics.mean(statistics.mean(c[-2:]) for c in curves)


def _worst_ratio(attacked: list[list[float]], clean: list[list[float]]) -> float:
    """The largest ratio, over the evaluations both runs took (the k-th of each, rounds 0, 4, 8, …), of the
    attacked run's honest nodes' mean held-out to the honest-only run's."""
    points = min(len(c) for c in attacked + clean)
    return max(statistics.mean(c[k] for c in attacked) / statistics.mean(c[k] for c in clean) for k in range(points))


def test_a_hostile_peer_publishing_negated_scaled_updates_does_not_set_the_honest_nodes_back(cluster) -> None:
    # The two runs train side by side, on the same loaded machine: two separate networks (each node knows only
    # its own run's first node), so the honest-only run never hears of the hostile node.
    clean = _start(cluster, "clean-")
    hostile = _start(cluster, "attacked-", ["poison:negate"])
    honest_only = _finish(clean)
    attacked = _finish(hostile)
    other_run = [node.peer_id for node in (*hostile[0], *hostile[1])]
    for node in clean[0]:
        log = node.log_path.read_text()
        assert not [p for p in other_run if p in log], "the honest-only run never met the attacked run's nodes"
    assert _final(attacked) <= _final(honest_only) * (1 + TOLERANCE), (
        f"held-out bpb with a hostile peer {_final(attacked):.4f}, honest only {_final(honest_only):.4f}")


def test_two_colluding_members_of_four_publishing_one_payload_every_round_are_bounded(cluster) -> None:
    """Two hostile nodes publish, every round, the same payload (a random direction ×10⁴ drawn from the
    target slot alone: `poison:collude`) beside two honest ones. Counted as two, the pair agreed with each
    other and outweighed the honest pair, and the screen, which keeps more than half, left an honest update
    out instead (issue "Trust, second pass"); bit-identical deltas now count once, so the screen has three
    to judge by and leaves the hostile one out."""
    clean = _start(cluster, "pair-", honest=2)
    hostile = _start(cluster, "colluded-", ["poison:collude", "poison:collude"], honest=2)
    honest_only, attacked = _finish(clean), _finish(hostile)
    first, second = (set(re.findall(r"published [0-9a-f]{16} \(base \d+, slot (\d+), \d+ bytes, blob ([0-9a-f]+)",
                                    node.log_path.read_text())) for node in hostile[1])
    assert first & second, "the colluders published one payload into the same slots"
    assert _worst_ratio(attacked, honest_only) <= 1 + TOLERANCE, (attacked, honest_only)
    assert _final(attacked) <= _final(honest_only) * (1 + TOLERANCE), (attacked, honest_only)


def test_an_update_claiming_more_tokens_than_the_run_allows_is_refused(cluster) -> None:
    _finish(_start(cluster, "claim-", ["poison:tokens"], rounds=CLAIM_ROUNDS), "poison:tokens")

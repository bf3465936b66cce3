"""Runs of honest and hostile nodes side by side for the hostile-peer tests (`test_hostile.py`,
`test_colluders_live.py`): start them, wait for their ends, read their held-out evaluations."""

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


def start(cluster, prefix: str, hostile: Sequence[str] = (), honest: int = 3,
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


def evaluations(node) -> dict[int, float]:
    """A node's held-out bpb by the round it was taken at (its own evaluations, not the vet of a state it
    synced; the last of a round, the final model's, wins)."""
    text = node.log_path.read_text()
    return {int(r): float(x) for x, r in re.findall(r"held-out ([0-9.]+) bits/byte at slot \d+ \(round (\d+)\)", text)}


def finish(run: tuple[list, list], hostile: str | None = None) -> list[dict[int, float]]:
    """Wait for a run's honest nodes to stop; each one's held-out bpb by round (`evaluations`)."""
    honest, evil = run
    curves = []
    for node in honest:
        assert node.wait_exit(300.0) == 0, node.log_tail()
        curve = evaluations(node)
        assert len(curve) >= 3, node.log_path.read_text()[-2000:]
        curves.append(curve)
        if hostile == "poison:tokens":
            assert "bad_claim" in node.log_path.read_text(), "the inflated claim is refused, with its reason"
    for node in evil:
        node.kill()
    return curves


def final(curves: list[dict[int, float]]) -> float:
    """The honest nodes' mean of their evaluations at their last two rounds."""
    return statistics.mean(statistics.mean(c[r] for r in sorted(c)[-2:]) for c in curves)


def worst_ratio(attacked: list[dict[int, float]], clean: list[dict[int, float]]) -> float:
    """The largest ratio, over the rounds at which every honest node of both runs evaluated (0, 4, 8, …), of
    the attacked run's honest nodes' mean held-out to the honest-only run's."""
    rounds = set.intersection(*(set(c) for c in attacked + clean))
    assert rounds, (attacked, clean)
    return max(statistics.mean(c[r] for c in attacked) / statistics.mean(c[r] for c in clean) for r in rounds)

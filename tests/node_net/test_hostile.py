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

from hostile_runs import CLAIM_ROUNDS, TOLERANCE, finish, final, start


def test_a_hostile_peer_publishing_negated_scaled_updates_does_not_set_the_honest_nodes_back(cluster) -> None:
    # The two runs train side by side, on the same loaded machine: two separate networks (each node knows only
    # its own run's first node), so the honest-only run never hears of the hostile node.
    clean = start(cluster, "clean-")
    hostile = start(cluster, "attacked-", ["poison:negate"])
    honest_only = finish(clean)
    attacked = finish(hostile)
    other_run = [node.peer_id for node in (*hostile[0], *hostile[1])]
    for node in clean[0]:
        log = node.log_path.read_text()
        assert not [p for p in other_run if p in log], "the honest-only run never met the attacked run's nodes"
    assert final(attacked) <= final(honest_only) * (1 + TOLERANCE), (
        f"held-out bpb with a hostile peer {final(attacked):.4f}, honest only {final(honest_only):.4f}")


def test_an_update_claiming_more_tokens_than_the_run_allows_is_refused(cluster) -> None:
    finish(start(cluster, "claim-", ["poison:tokens"], rounds=CLAIM_ROUNDS), "poison:tokens")

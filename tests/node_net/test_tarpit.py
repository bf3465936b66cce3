"""Tier (c): a tarpitting peer does not slow the intake of updates from honest peers.

Three nodes train a fixed number of rounds, in two separate networks side by side on the same machine: all
honest, and with the third one started with `--misbehave tarpit` (it trains and publishes honestly, but
serves every blob one byte per 20 s). Node a's
intake of node b's updates is measured in both runs from the logs: for each update b published, whether a
fetched its blob within `ON_TIME_S` of the publication. The tarpitted run must take at least
`1 - TOLERANCE` of the honest run's on-time share, and a must have dropped the tarpit's downloads as
`too_slow`.

Before the minimum rate (`p2p.blobfetch`) and the per-holder limit (`protocol.gossip.fetches`), each download
from such a peer held one of the four fetch slots for good (a byte every 20 s never trips the 60 s silence
timeout): after its fourth round, nothing from anyone reached a (issue "Trust in a running training":
27 updates in 75 s instead of ~580).
"""

from __future__ import annotations

from testnet.benchmarks.node_logs import intake_delays, on_time

ROUNDS = 14
# --slowdown makes the rounds ~1.5 s of sleeping (little CPU), so all three nodes train side by side.
# --fork-tolerance inf: a joiner that syncs the run's state at slot 1, when its held-out loss can be above the
# random start's (9.55 against 7.88 bits per byte seen on a loaded machine), must not refuse it and wait out the
# run: this test is about the intake, and the vet has tests of its own (test_forged_state.py).
COMMON = ["--inner-steps", "10", "--heartbeat", "0.5", "--eval-every", "100", "--drain-timeout", "20",
          "--checkpoint-interval", "0", "--max-rounds", str(ROUNDS), "--slowdown", "30", "--fork-tolerance", "inf"]
ON_TIME_S = 5.0  # a few rounds: a download held up by a tarpit takes ~20 s per byte
TOLERANCE = 0.20
START_S = 180.0

def _start(cluster, prefix: str, third: list[str]) -> tuple:
    """Start a, b and a third node (each network knows only its own a): (a, b, the third)."""
    a = cluster(f"{prefix}a", *COMMON)
    a.wait_listening(START_S)
    b = cluster(f"{prefix}b", *COMMON, "--peers", a.gossip)
    other = cluster(f"{prefix}c", *COMMON, *third, "--peers", a.gossip)
    for node in (b, other):
        node.wait_listening(START_S)
    return a, b, other


def _on_time_intake(run: tuple) -> tuple[int, int, str]:
    """Run a network to the end; how many of b's updates a fetched within ON_TIME_S, of how many b
    published; and a's log."""
    a, b, other = run
    for node in (a, b):
        assert node.wait_exit(300.0) == 0, node.log_tail()
    other.kill()
    delays = intake_delays(b.log_path, a.log_path)
    assert len(delays) >= ROUNDS // 2, "b published rounds in most of the run's slots"
    return on_time(delays, ON_TIME_S), len(delays), a.log_path.read_text()


def test_a_tarpitting_peer_does_not_slow_the_intake_of_honest_updates(cluster) -> None:
    honest_run = _start(cluster, "honest-", [])
    tarpit_run = _start(cluster, "tarpit-", ["--misbehave", "tarpit"])
    honest, published, _ = _on_time_intake(honest_run)
    assert honest >= published // 2, f"without a tarpit, {honest} of {published} of b's updates reached a on time"
    tarpitted, published_t, log = _on_time_intake(tarpit_run)
    assert tarpitted / published_t >= (1 - TOLERANCE) * honest / published, (
        f"with a tarpit {tarpitted} of {published_t} of b's updates reached a within {ON_TIME_S} s; "
        f"without, {honest} of {published}")
    assert "too_slow" in log, "a dropped the tarpit's downloads, with the reason"

"""Tier (c): `diloco-node --traffic reduced` — real processes (the tiny model, shrunk) over TLS.

- four nodes of one roster train, seal and reduce their slots, and stop at the run's last slot with the same
  replica and params digests, every slot sealing most updates, and the held-out loss falls (the bytes per
  round are a benchmark's: `testnet.benchmarks.reduced_nodes`);
- a fifth node whose roster differs is refused as another run's (the roster is part of the run configuration);
- a node started after the run moved on stops with an error that says why (no state sync of a reduced run);
  a SIGTERM stops a reduced node cleanly (its `STOPPED` line, exit 0);
- among four, an aggregator that negates every reduction (`--misbehave lie`) is proven wrong and excluded, and
  a contributor claiming 2⁴⁰ tokens every round (`--misbehave poison:tokens`) is refused as `bad_claim`: the
  honest nodes and the liar (whose contributions are honest) stop with the same digests and a falling loss
  (what the attacks cost the model is a benchmark's: `python -m testnet.bench hostile --traffic reduced`).
"""

from __future__ import annotations

import json
from pathlib import Path

from node.status import LAST_STATUS
from protocol.identity import Identity

COMMON = ["--inner-steps", "10", "--heartbeat", "0.5", "--eval-every", "2", "--eval-batches", "2",
          "--eval-budget", "1", "--compression", "int4", "--traffic", "reduced", "--slot-patience", "20",
          "--slot-step", "1"]
START_S = 180.0


def _roster(tmp: Path, names: list[str]) -> tuple[Path, dict[str, str]]:
    """Keys for `names` (under the nodes' homes, where NodeProc points --key) and a roster file of them."""
    ids = {}
    for name in names:
        (tmp / name).mkdir(parents=True, exist_ok=True)
        ids[name] = Identity.load_or_create(tmp / name / "key").peer_id
    roster = tmp / "roster.txt"
    roster.write_text("# the run's contributors\n" + "".join(f"{p}\n" for p in ids.values()))
    return roster, ids


def test_four_nodes_of_a_roster_close_reduced_slots_and_stop_equal(cluster, tmp_path: Path) -> None:
    names = ["a", "b", "c", "d"]
    roster, ids = _roster(tmp_path, names)
    rounds = 6
    a = cluster("a", *COMMON, "--roster", str(roster), "--max-rounds", str(rounds))
    a.wait_listening(START_S)
    others = [cluster(n, *COMMON, "--roster", str(roster), "--max-rounds", str(rounds), "--peers", a.gossip)
              for n in names[1:]]
    # a node started with another roster (itself and a) is another run's: refused at the handshake
    (tmp_path / "e").mkdir()
    e_id = Identity.load_or_create(tmp_path / "e" / "key").peer_id
    other_roster = tmp_path / "other.txt"
    other_roster.write_text(f"{ids['a']}\n{e_id}\n")
    e = cluster("e", *COMMON, "--roster", str(other_roster), "--max-rounds", str(rounds), "--peers", a.gossip,
                "--sync-timeout", "5")
    nodes = [a, *others]
    for node in others:
        node.wait_listening(START_S)
    first = a.wait_status(lambda s: s["slot"] >= 1, START_S, "slot 1")
    assert first["traffic"]["mode"] == "reduced" and first["traffic"]["roster"] == 4
    assert first["traffic"]["last_slot"]["sealed"] >= 1
    e.wait_log("config_mismatch", 60.0)
    e.kill()

    lines = [n.wait_line("STOPPED ", 300.0) for n in nodes]
    assert all(n.wait_exit(30.0) == 0 for n in nodes)
    assert len(set(lines)) == 1 and lines[0].startswith(f"STOPPED {rounds} "), "\n".join(lines)
    last = [json.loads((tmp_path / n / "ckpt" / LAST_STATUS).read_text()) for n in names]
    assert all(s["slot"] == rounds and s["state"] == "stopped" for s in last)
    assert all(s["updates_applied"] >= 3 * rounds for s in last)  # most slots sealed every node's update
    assert all(s["ledger_outcomes"].get("aggregators_caught", 0) == 0 for s in last)
    assert {s["ledger_digest"] for s in last} == {lines[0].split()[2]}
    history = last[0]["eval_history"]
    assert len(history) >= 2 and history[-1][2] < history[0][2], history  # the held-out loss fell


def test_a_node_behind_a_reduced_run_stops_with_an_error_that_says_why(cluster, tmp_path: Path) -> None:
    roster, _ = _roster(tmp_path, ["a", "b", "late"])
    alone = [*COMMON, "--slot-patience", "2"]  # the sealers wait this long for the absent third contributor
    a = cluster("a", *alone, "--roster", str(roster), "--sync-timeout", "1")
    a.wait_listening(START_S)
    b = cluster("b", *alone, "--roster", str(roster), "--sync-timeout", "1", "--peers", a.gossip)
    b.wait_listening(START_S)
    late = None
    try:
        a.wait_status(lambda s: s["slot"] >= 3, START_S, "slot 3 (a and b alone: the third contributor absent)")
        late = cluster("late", *COMMON, "--roster", str(roster), "--peers", a.gossip)
        assert late.wait_exit(START_S) == 1
        assert "cannot sync a state yet" in late.log_path.read_text()
        a.terminate()  # SIGTERM: the slot being closed is left, goodbye, STOPPED, exit 0
        assert a.wait_line("STOPPED ", 60.0).split()[1].isdigit() and a.wait_exit(60.0) == 0
    finally:
        for node in (a, b, late):
            if node is not None:
                node.kill()


def test_a_lying_aggregator_is_caught_and_a_claim_past_the_runs_work_refused(cluster, tmp_path: Path) -> None:
    names = ["a", "b", "liar", "claimer"]
    roster, ids = _roster(tmp_path, names)
    rounds = 6
    flags = [*COMMON, "--roster", str(roster), "--max-rounds", str(rounds)]
    a = cluster("a", *flags)
    a.wait_listening(START_S)
    b = cluster("b", *flags, "--peers", a.gossip)
    liar = cluster("liar", *flags, "--peers", a.gossip, "--misbehave", "lie")
    claimer = cluster("claimer", *flags, "--peers", a.gossip, "--misbehave", "poison:tokens")
    agreeing = [a, b, liar]
    try:
        lines = [n.wait_line("STOPPED ", 300.0) for n in agreeing]
        assert all(n.wait_exit(30.0) == 0 for n in agreeing)
        assert len(set(lines)) == 1 and lines[0].startswith(f"STOPPED {rounds} "), "\n".join(lines)
    finally:
        claimer.kill()
    last = {n: json.loads((tmp_path / n / "ckpt" / LAST_STATUS).read_text()) for n in ("a", "b")}
    for status in last.values():
        assert status["ledger_outcomes"].get("aggregators_caught", 0) >= 1, status["ledger_outcomes"]
        dropped = status["traffic"]["records_dropped"]
        assert any("bad_claim" in why and ids["claimer"][:12] in why for why in dropped), dropped
        assert status["updates_applied"] <= 3 * rounds  # the claimer's updates never sealed
        history = status["eval_history"]
        assert len(history) >= 2 and history[-1][2] < history[0][2], history
    assert "aggregators caught" in a.log_path.read_text() and ids["liar"] in a.log_path.read_text()

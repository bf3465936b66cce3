"""Tier (a): the verdict on hand-made recorded runs: which nodes failed, and whether the run did."""

from __future__ import annotations

from pathlib import Path

from testnet.faults import FaultPlan
from testnet.outcome import assess
from testnet.record import RunMeta, RunRecord
from testnet.timeline import Timeline


def ev(node: int, inc: int, event: str, **fields) -> dict:
    return {"t": 1.0 + inc, "node": node, "inc": inc, "event": event, **fields}


def trained(node: int, inc: int, tokens: int = 100) -> dict:
    return {"t": 2.0 + inc, "node": node, "inc": inc, "status": {"state": "training", "tokens": tokens}}


def verdict(events: list[dict], samples: list[dict], nodes: int = 3):
    meta = RunMeta(nodes=nodes, model="tiny", inner_steps=10, peer_ids=["p"] * nodes, t_launch=0.0, t_end=10.0)
    return assess(Timeline(RunRecord(meta, FaultPlan(nodes=nodes, duration=10), events, samples)))


def test_planned_kills_finished_nodes_and_the_final_stop_are_not_failures() -> None:
    events = [ev(n, 0, "launch") for n in range(3)]
    events += [ev(0, 0, "kill"), ev(0, 0, "exit", rc=-9, expected=True), ev(0, 1, "launch"),  # killed, restarted
               ev(1, 0, "exit", rc=0, expected=True, finished=True),  # finished its rounds
               ev(2, 0, "kill"), ev(2, 0, "exit", rc=-9, expected=True)]  # killed, restart after the end
    outcome = verdict(events, [trained(0, 1), trained(1, 0)])
    assert outcome.failures == () and not outcome.failed and outcome.tokens == 200


def test_a_crash_and_a_failed_restart_are_failures_but_the_run_goes_on() -> None:
    events = [ev(n, 0, "launch") for n in range(3)]
    events += [ev(0, 0, "exit", rc=2, expected=False),
               ev(1, 0, "kill"), ev(1, 0, "exit", rc=-9, expected=True), ev(1, 1, "launch"),
               ev(1, 1, "exit", rc=3, expected=False),
               ev(1, 1, "start-error", error="node 1 (process 1) exited with status 3 before printing LISTENING; "
                                             "last lines of node-1.log:")]
    outcome = verdict(events, [trained(2, 0)])
    assert [(f.node, f.process, f.reason) for f in outcome.failures] == [
        (0, 0, "exited by itself with status 2"), (1, 1, "exited with status 3 before printing LISTENING")]
    assert not outcome.failed  # node 2 trains on


def test_a_restart_that_failed_only_because_the_run_was_stopping_is_not_a_failure() -> None:
    events = [ev(0, 0, "launch"), ev(0, 0, "kill"), ev(0, 0, "exit", rc=-9, expected=True), ev(0, 1, "launch"),
              ev(0, 1, "exit", rc=-15, expected=True), ev(0, 1, "start-error", error="node 0 (process 1) exited")]
    assert verdict(events, [trained(0, 0)], nodes=1).failures == ()


def test_every_node_failing_or_no_tokens_fails_the_run(tmp_path: Path) -> None:
    events = [ev(n, 0, "launch") for n in range(2)] + [ev(n, 0, "exit", rc=2, expected=False) for n in range(2)]
    outcome = verdict(events, [trained(0, 0)], nodes=2)
    assert outcome.problems == ["every node failed (2 of 2)"]
    idle = verdict([ev(0, 0, "launch")], [trained(0, 0, tokens=0)], nodes=1)
    assert idle.failures == () and idle.problems == ["no node trained: no tokens reported"]
    log = tmp_path / "node-0.log"
    log.write_text("".join(f"line {i}\n" for i in range(10)))
    text = outcome.describe(lambda node: log)[0]
    assert text.splitlines() == [f"node 0 (process 0) exited by itself with status 2; last lines of {log}:",
                                 *(f"    line {i}" for i in range(5, 10))]

"""Tier (c): the supervisor with real child processes (fake_node.py): launch, kill/restart on the same
ports, partitions through POST /chaos, and cleanup on success, error, cancellation and Ctrl-C."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import trio

from testnet.faults import FaultPlan, Kill, Partition
from testnet.procs import NodeStartError, alive
from testnet.record import Recorder
from testnet.supervisor import Supervisor
from testnet_helpers import FAKE_NODE, events, fake_argv, fake_specs, wait_for


def pids_of(run_dir: Path) -> list[int]:
    """Every process the run started: node pids from the events, grandchildren from their pid files."""
    pids = [e["pid"] for e in events(run_dir) if e["event"] == "listening"]
    pids += [int(p.read_text()) for p in run_dir.glob("checkpoints/*/grandchild.pid")]
    return pids


@pytest.mark.slow
async def test_kill_restart_same_ports_and_everything_stopped(tmp_path: Path) -> None:
    specs = fake_specs(tmp_path, 3)
    recorder = Recorder(tmp_path)
    sup = Supervisor(specs, fake_argv(), recorder, start_timeout=20, stop_grace=5, poll_interval=0.05)
    plan = FaultPlan(nodes=3, duration=2.0, kills=(Kill(at=0.5, node=1, downtime=0.4),))
    with trio.fail_after(30):
        await sup.run(plan)
    recorder.close()
    evs = events(tmp_path)
    node1 = [e for e in evs if e["node"] == 1 and e["event"] == "listening"]
    assert [e["inc"] for e in node1] == [0, 1]
    assert node1[0]["gossip"] == node1[1]["gossip"] and node1[0]["http"] == node1[1]["http"]
    kills = [e for e in evs if e["event"] == "kill"]
    assert [(k["node"], k["inc"]) for k in kills] == [(1, 0)]
    # node 0 bootstrapped the others; the restarted node got the nodes that were up as peers
    launches = {(e["node"], e["inc"]): e["argv"] for e in evs if e["event"] == "launch"}
    assert launches[(0, 0)][launches[(0, 0)].index("--peers") + 1] == ""
    assert launches[(2, 0)][launches[(2, 0)].index("--peers") + 1] == json_gossip(evs, 0)
    restart_peers = launches[(1, 1)][launches[(1, 1)].index("--peers") + 1].split(",")
    assert sorted(restart_peers) == sorted([json_gossip(evs, 0), json_gossip(evs, 2)])
    samples = [json.loads(line) for line in (tmp_path / "status.jsonl").read_text().splitlines()]
    assert {(s["node"], s["inc"]) for s in samples if "status" in s} >= {(0, 0), (1, 1), (2, 0)}
    assert all(s["status"]["peer_id"] == specs[s["node"]].peer_id for s in samples if "status" in s)
    assert {e["node"] for e in evs if e["event"] == "ready"} == {0, 1, 2}
    exits = [e for e in evs if e["event"] == "exit"]
    assert len(exits) == 4 and all(e["expected"] for e in exits)
    assert not [p for p in pids_of(tmp_path) if alive(p)]
    assert all(h.state == "stopped" for h in sup.handles)


@pytest.mark.slow
@pytest.mark.parametrize("linger", ["1.0", "0"])
async def test_the_stop_reads_status_until_the_nodes_exit(tmp_path: Path, linger: str) -> None:
    """A node publishes the round its stop cut short (the fake counts 1 s more of contributed steps after
    SIGTERM, writes its last status to its checkpoint directory, and answers for `linger` s): `stop()` keeps
    reading `/status` after `t_end` until it exits, then that file, so the report's goodput counts that round
    even from a node that exits at once; errors of nodes closing their servers are not recorded as failures."""
    specs = fake_specs(tmp_path, 2)
    recorder = Recorder(tmp_path)
    sup = Supervisor(specs, fake_argv("--publish-on-stop", linger), recorder, start_timeout=20, stop_grace=5,
                     poll_interval=0.05)
    with trio.fail_after(30):
        await sup.run(FaultPlan(nodes=2, duration=1.0))
    recorder.close()
    rows = [json.loads(line) for line in (tmp_path / "status.jsonl").read_text().splitlines()]
    for node in (0, 1):
        before = [r["status"]["contributed_step_seconds"] for r in rows
                  if r["node"] == node and "status" in r and r["t"] <= sup.t_end]
        after = [r["status"]["contributed_step_seconds"] for r in rows
                 if r["node"] == node and "status" in r and r["t"] > sup.t_end]
        assert after and after[-1] >= before[-1] + 1.0, (before[-3:], after)
    assert not [r for r in rows if "error" in r and r["t"] > sup.t_end]
    exits = [e for e in events(tmp_path) if e["event"] == "exit"]
    assert len(exits) == 2 and all(e["expected"] and e["rc"] == 0 for e in exits), exits


async def test_nodes_that_finish_by_themselves_end_the_run_early(tmp_path: Path) -> None:
    specs = fake_specs(tmp_path, 2)
    recorder = Recorder(tmp_path)
    sup = Supervisor(specs, fake_argv("--finish-after", "0.3"), recorder, start_timeout=20, stop_grace=5,
                     poll_interval=0.05)
    with trio.fail_after(30):
        await sup.run(FaultPlan(nodes=2, duration=600))  # would take 10 minutes if it did not end early
    recorder.close()
    evs = events(tmp_path)
    assert [(e["node"], e["slot"], e["ledger"], e["params"]) for e in evs if e["event"] == "stopped"] \
        in ([(0, 7, "aa", "bb"), (1, 7, "aa", "bb")], [(1, 7, "aa", "bb"), (0, 7, "aa", "bb")])
    exits = [e for e in evs if e["event"] == "exit"]
    assert len(exits) == 2 and all(e["finished"] and e["expected"] and e["rc"] == 0 for e in exits)
    assert not [e for e in evs if e["event"] == "stop"]  # nothing left to stop


@pytest.mark.slow
async def test_a_run_sized_in_steps_ends_once_the_nodes_mean_steps_reach_it(tmp_path: Path) -> None:
    """`--steps`: the run ends when the nodes have taken the steps on average (node 1 at half node 0's
    pace), not after the plan's duration, which is then only an upper bound."""
    specs = fake_specs(tmp_path, 2)
    recorder = Recorder(tmp_path)
    said: list[str] = []
    sup = Supervisor(specs, fake_argv(per_node={1: ["--steps-per-second", "5"]}), recorder, start_timeout=20,
                     stop_grace=5, poll_interval=0.05, notify=said.append, until_steps=15)
    with trio.fail_after(30):
        await sup.run(FaultPlan(nodes=2, duration=600))  # would take 10 minutes if it did not end early
    recorder.close()
    stop = min(e["t"] for e in events(tmp_path) if e["event"] == "stop")
    samples = [json.loads(line) for line in (tmp_path / "status.jsonl").read_text().splitlines()]
    last = {node: max((s for s in samples if s["node"] == node and "status" in s and s["t"] < stop),
                      key=lambda s: s["t"])["status"]["inner_steps"] for node in (0, 1)}
    assert (last[0] + last[1]) / 2 >= 15 and last[0] > last[1], last
    assert last[1] < 15 + 5, "not held until the slower node alone had taken the steps"
    assert any("inner steps each on average" in line for line in said), said


@pytest.mark.slow
async def test_a_plan_from_ready_counts_from_the_moment_every_node_trains(tmp_path: Path) -> None:
    """The solo run's clock (`plan_from_ready`): its duration runs from the last node's first `training`,
    so a slow start-up cannot eat the window in which the pace is measured."""
    specs = fake_specs(tmp_path, 2)
    recorder = Recorder(tmp_path)
    sup = Supervisor(specs, fake_argv(per_node={1: ["--train-after", "1.5"]}), recorder, start_timeout=20,
                     stop_grace=5, poll_interval=0.05, plan_from_ready=True)
    with trio.fail_after(30):
        await sup.run(FaultPlan(nodes=2, duration=0.5))
    recorder.close()
    evs = events(tmp_path)
    ready = max(e["t"] for e in evs if e["event"] == "ready")
    stop = min(e["t"] for e in evs if e["event"] == "stop")
    assert {e["node"] for e in evs if e["event"] == "ready"} == {0, 1}
    assert ready - sup.t0 >= 1.5  # node 1 trained only after its 1.5 s of start-up
    assert stop - ready >= 0.5  # the whole plan ran after it: counted from the launch, it would be over


def json_gossip(evs: list[dict], node: int) -> str:
    return next(e["gossip"] for e in evs if e["event"] == "listening" and e["node"] == node)


@pytest.mark.slow
async def test_partition_posts_chaos_to_both_sides(tmp_path: Path) -> None:
    specs = fake_specs(tmp_path, 3)
    recorder = Recorder(tmp_path)
    sup = Supervisor(specs, fake_argv(), recorder, start_timeout=20, stop_grace=5, poll_interval=0.2)
    plan = FaultPlan(nodes=3, duration=3.0, partitions=(Partition(0.2, 0.7, (0,), (1, 2)),))
    with trio.fail_after(30):
        await sup.run(plan)
    recorder.close()
    bodies = {i: [json.loads(line)["body"] for line in (spec.checkpoint_dir / "chaos.jsonl").read_text().splitlines()]
              for i, spec in enumerate(specs)}
    assert bodies[0] == [{"block_peers": [specs[1].peer_id, specs[2].peer_id], "seconds": pytest.approx(0.5)}]
    assert bodies[1] == bodies[2] == [{"block_peers": [specs[0].peer_id], "seconds": pytest.approx(0.5)}]


async def test_cancellation_kills_term_ignoring_nodes_and_grandchildren(tmp_path: Path) -> None:
    specs = fake_specs(tmp_path, 3)
    recorder = Recorder(tmp_path)
    sup = Supervisor(specs, fake_argv("--ignore-term", "--grandchild"), recorder, start_timeout=20, stop_grace=0.3,
                     poll_interval=0.1)
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(sup.run, FaultPlan(nodes=3, duration=600))
            await wait_for(lambda: all(h.ready for h in sup.handles), 20)
            grandchildren = list(tmp_path.glob("checkpoints/*/grandchild.pid"))
            assert len(grandchildren) == 3
            assert all(alive(p) for p in pids_of(tmp_path))
            nursery.cancel_scope.cancel()
    pids = pids_of(tmp_path)
    assert len(pids) == 6
    assert not [p for p in pids if alive(p)]
    assert sup.registry.live_groups() == []


async def test_failed_start_quotes_the_log_and_leaves_nothing(tmp_path: Path) -> None:
    specs = fake_specs(tmp_path, 3)
    recorder = Recorder(tmp_path)
    sup = Supervisor(specs, fake_argv(failing={2}), recorder, start_timeout=20, stop_grace=2)
    with trio.fail_after(30), pytest.raises(NodeStartError) as info:
        await sup.run(FaultPlan(nodes=3, duration=600))
    message = str(info.value)
    assert "node 2" in message and "status 3" in message and "cannot load the model (test)" in message
    assert not [p for p in pids_of(tmp_path) if alive(p)]
    assert sup.registry.live_groups() == []


async def test_silent_node_times_out_with_clear_error(tmp_path: Path) -> None:
    specs = fake_specs(tmp_path, 1)
    recorder = Recorder(tmp_path)

    def silent(spec, gossip_port, http_port, peers):
        return [sys.executable, "-c", "import signal, sys; print('loading', file=sys.stderr, flush=True); signal.pause()"]

    sup = Supervisor(specs, silent, recorder, start_timeout=0.5, stop_grace=1)
    with trio.fail_after(30), pytest.raises(NodeStartError, match="no LISTENING line within 0.5 s") as info:
        await sup.run(FaultPlan(nodes=1, duration=600))
    assert "loading" in str(info.value)
    assert sup.registry.live_groups() == []


DRIVER = textwrap.dedent("""
    import signal, sys, trio
    # as in a terminal: a shell that started this suite in the background (`cmd &`, no job control) made
    # its children ignore SIGINT, and Python then installs no KeyboardInterrupt handler
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.path.insert(0, {tests!r})
    from pathlib import Path
    from testnet.faults import FaultPlan
    from testnet.record import Recorder
    from testnet.supervisor import Supervisor
    from testnet_helpers import fake_argv, fake_specs
    run_dir = Path({run_dir!r})
    sup = Supervisor(fake_specs(run_dir, 3), fake_argv("--ignore-term", "--grandchild"), Recorder(run_dir),
                     start_timeout=20, stop_grace=0.5, poll_interval=0.1)
    try:
        trio.run(sup.run, FaultPlan(nodes=3, duration=600))
    except KeyboardInterrupt:
        print("interrupted", flush=True)
        sys.exit(130)
""")


async def test_ctrl_c_stops_every_process(tmp_path: Path) -> None:
    """SIGINT to a process running the supervisor (as Ctrl-C in a terminal would send) leaves no node,
    not even ones that ignore SIGTERM, nor their children."""
    script = DRIVER.format(tests=str(Path(FAKE_NODE).parent), run_dir=str(tmp_path))
    driver = await trio.lowlevel.open_process([sys.executable, "-c", script], stdout=subprocess.PIPE,
                                              env={**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), str(Path(__file__).parents[1])])})
    try:
        with trio.fail_after(90):  # the driver's imports and three starts: slow on a loaded machine
            await wait_for(lambda: sum(e["event"] == "ready" for e in events(tmp_path)) == 3, 85, interval=0.05)
        driver.send_signal(signal.SIGINT)
        with trio.fail_after(30):
            assert await driver.wait() == 130
    finally:
        if driver.returncode is None:  # the test failed: do not leave its nodes behind either
            driver.kill()
            for pid in pids_of(tmp_path):
                if alive(pid):
                    os.kill(pid, signal.SIGKILL)
    pids = pids_of(tmp_path)
    assert len(pids) == 6
    assert not [p for p in pids if alive(p)]

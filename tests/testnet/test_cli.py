"""The `diloco-testnet` command: flags, plan-only, errors, and a whole run (fake node processes) that
leaves a report and no process behind."""

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

from testnet.cli import DEMO_STEPS, STEPS_MINUTES, Options, build_plan, main, parse_args, run_testnet
from testnet.procs import GroupRegistry, alive
from testnet_helpers import FAKE_NODE, events, fake_argv, wait_for


def test_defaults_finish_in_a_few_minutes() -> None:
    o = parse_args([])
    assert o == Options(steps=DEMO_STEPS, minutes=STEPS_MINUTES)
    assert (o.nodes, o.steps, o.model, o.baseline) == (3, 1800, "tiny", True)
    assert build_plan(o).kills == ()


def test_a_run_is_sized_in_steps_or_in_minutes_and_steps_go_with_no_timed_faults() -> None:
    from testnet.horizon import Pace, horizon_steps, run_seconds

    assert (parse_args(["--minutes", "5"]).steps, parse_args(["--minutes", "5"]).minutes) == (None, 5.0)
    assert (parse_args(["--steps", "900", "--minutes", "4"]).steps, parse_args(["--steps", "900"]).minutes) == \
        (900, STEPS_MINUTES), "--minutes caps --steps"
    for timed in (["--kill-every", "30"], ["--partition", "10:20:0"], ["--rounds", "5"]):
        assert parse_args(timed).steps is None and parse_args(timed).minutes == 2.0, "faults keep the 2 minutes"
        with pytest.raises(SystemExit):
            parse_args(["--steps", "900", *timed])
    assert parse_args(["--solo-seconds", "0"]).steps == DEMO_STEPS, "the steps are counted, not timed by a pace"
    assert parse_args(["--steps", "900", "--set", "inner.lr=1e-3"]).config_overrides() == \
        ("inner.lr=1e-3", "total_steps=900"), "the schedule ends with the run"
    pace = Pace(8.0, 20.0)
    assert run_seconds(pace, 1800) == 245.0 and horizon_steps(pace, run_seconds(pace, 1800)) == 1800


def test_flags_build_the_plan() -> None:
    o = parse_args(["--nodes", "6", "--minutes", "5", "--kill-every", "30", "--downtime", "15", "--slow", "2:4",
                    "--partition", "40:60:0,1", "--misbehave", "5:garbage", "--seed", "3", "--data", "a.txt,b.txt",
                    "--data", "c.txt", "--wan", "--no-baseline"])
    plan = build_plan(o)
    assert o.data == ("a.txt", "b.txt", "c.txt") and o.wan == "2gbit,30ms" and not o.baseline
    assert plan.slow == ((2, 4.0),) and plan.misbehave == ((5, "garbage"),) and len(plan.partitions) == 1
    assert len(plan.kills) == 7 and all(k.downtime == 15 for k in plan.kills)  # last restart by 240 s
    assert build_plan(o) == plan


def test_set_reaches_nodes_and_baseline_and_rounds_set_the_schedule_horizon(tmp_path: Path) -> None:
    from testnet.baseline_run import baseline_argv, baseline_config
    from testnet.nodes import RunFlags, NodeSpec, node_argv

    assert parse_args([]).config_overrides() == ("total_steps=1800",), "the demo: its 1,800 steps"
    assert parse_args(["--minutes", "3"]).config_overrides() == (), "a timed run: set by the solo pace"
    o = parse_args(["--rounds", "20", "--inner-steps", "5", "--set", "inner.lr=1e-3"])
    assert o.config_overrides() == ("inner.lr=1e-3", "total_steps=100")
    given = ("inner.total_steps=700",)
    assert parse_args(["--rounds", "10", "--set", given[0]]).config_overrides() == given
    assert parse_args(["--rounds", "2", "--inner-steps", "5"]).config_overrides() == (), "shorter than the warmup"
    spec = NodeSpec(index=0, peer_id="p", key_path=tmp_path / "k", checkpoint_dir=tmp_path, log_path=tmp_path / "l")
    argv = node_argv(spec, RunFlags(run_id="r", overrides=o.config_overrides()), gossip_port=0, http_port=0,
                     peers=())
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--set"] == ["inner.lr=1e-3", "total_steps=100"]
    base = baseline_argv(model="tiny", data=(), seed=0, steps=3, shard_keys=["p"], out=tmp_path / "b.json",
                         eval_batches=1, overrides=o.config_overrides())
    assert [base[i + 1] for i, a in enumerate(base) if a == "--set"] == ["inner.lr=1e-3", "total_steps=100"]
    cfg = baseline_config("tiny", (), 0, o.config_overrides())
    assert (cfg.inner.lr, cfg.inner.total_steps) == (1e-3, 100)


def test_the_demo_defaults_span_the_schedule_and_pass_the_outer_momentum(tmp_path: Path) -> None:
    from node.cli import build_parser
    from testnet.nodes import RunFlags, NodeSpec, node_argv

    o = parse_args([])
    assert o.solo_seconds == 20.0, "the solo phase: the overlap figure"
    assert o.outer_momentum is None and build_parser().get_default("outer_momentum") == 0.6, "the node's own"
    spec = NodeSpec(index=0, peer_id="p", key_path=tmp_path / "k", checkpoint_dir=tmp_path, log_path=tmp_path / "l")

    def momentum(settings: RunFlags) -> list[str]:
        argv = node_argv(spec, settings, gossip_port=0, http_port=0, peers=())
        return [argv[i + 1] for i, a in enumerate(argv) if a == "--outer-momentum"]

    assert momentum(RunFlags(run_id="r", outer_momentum=0.8)) == ["0.8"]
    assert momentum(RunFlags(run_id="r")) == [], "None: the node's own default"
    assert parse_args(["--outer-momentum", "0.9"]).outer_momentum == 0.9
    with pytest.raises(SystemExit):
        parse_args(["--outer-momentum", "1"])


def test_a_measured_pace_sets_the_schedule_of_a_timed_run() -> None:
    import dataclasses

    from testnet.run import _pace_schedule
    from testnet.horizon import Pace, horizon_steps

    assert horizon_steps(Pace(10.0, 8.0), 300) == 2920
    assert horizon_steps(Pace(10.0, 8.0), 5) == 1, "never zero"
    assert Pace.of([], [1.0]) is None
    assert Pace.of([9.0, 12.0, 10.0], []) == Pace(10.0, 0.0)
    o = parse_args(["--minutes", "5", "--nodes", "3", "--slow", "2:4", "--set", "inner.lr=1e-3"])
    paced = _pace_schedule(o, rates={0: 10.0, 1: 11.0, 2: 2.5}, startups=[8.0, 9.0, 8.0])
    assert paced.config_overrides() == ("inner.lr=1e-3", "total_steps=3066"), "median of the unslowed: 10.5 x 292 s"
    rounds = dataclasses.replace(o, rounds=40, paced_total_steps=3060)
    assert rounds.config_overrides() == ("inner.lr=1e-3", "total_steps=800"), "--rounds wins over the pace"
    given = parse_args(["--set", "total_steps=500"])
    assert _pace_schedule(given, {0: 10.0}, [8.0]).config_overrides() == ("total_steps=500",), "--set wins"
    short = dataclasses.replace(parse_args(["--minutes", "1"]), paced_total_steps=30)
    assert short.config_overrides() == (), "inside the warmup: the preset's"
    steps = parse_args(["--steps", "900"])
    assert _pace_schedule(steps, {0: 10.0}, [8.0]) == steps, "--steps knows its horizon without the pace"


def test_plan_only_and_bad_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--plan-only", "--kill-every", "30", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "fault plan" in out and "kill node" in out
    assert main(["--plan-only", "--slow", "9:2"]) == 2
    assert "node 9 does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse_args(["--nodes", "0"])
    with pytest.raises(SystemExit):
        parse_args(["--set", "no_such_field=1"])
    assert "unknown config key 'no_such_field'" in capsys.readouterr().err


async def test_a_whole_run_writes_the_report_and_stops_everything(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    o = Options(nodes=3, minutes=0.06, kill_every=1.0, downtime=0.6, settle=0.5, baseline=False, solo_seconds=0,
                out=tmp_path,
                progress="plain", poll_interval=0.1, wan="2gbit,30ms", stop_grace=2)
    registry = GroupRegistry()
    with trio.fail_after(60):
        run_dir = await run_testnet(o, argv_builder=lambda specs: fake_argv(), registry=registry)
    out = capsys.readouterr().out
    assert "WAN emulation off:" in out or "WAN emulation:" in out
    report = json.loads((run_dir / "report.json").read_text())
    assert report["run"]["nodes"] == 3 and report["run"]["restarts"] == len(build_plan(o).kills) >= 1
    assert report["run"]["param_count"] > 0 and report["communication"]["dp_bytes_per_step"] > 0
    assert (run_dir / "loss.png").stat().st_size > 0 and (run_dir / "report.md").read_text().startswith("# Testnet")
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["t_end"] > meta["t_launch"] > 0 and not meta["interrupted"]
    pids = [e["pid"] for e in events(run_dir) if e["event"] == "listening"]
    assert len(pids) == 3 + report["run"]["restarts"] and not [p for p in pids if alive(p)]
    assert registry.live_groups() == []


DRIVER = textwrap.dedent("""
    import signal, sys
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # as a shell starts a background job
    sys.path.insert(0, {tests!r})
    from testnet.cli import main
    from testnet_helpers import fake_argv
    sys.exit(main(["--minutes", "10", "--out", {out!r}, "--progress", "quiet", "--stop-grace", "1",
                   "--solo-seconds", "0"],
                  argv_builder=lambda specs: fake_argv("--ignore-term")))
""")


async def test_sigterm_stops_a_background_testnet(tmp_path: Path) -> None:
    """SIGTERM stops the testnet (exit 130) and every node, even one that ignores SIGTERM, even when the
    testnet was started with SIGINT ignored."""
    script = DRIVER.format(tests=str(Path(FAKE_NODE).parent), out=str(tmp_path))
    driver = await trio.lowlevel.open_process([sys.executable, "-c", script], stdout=subprocess.DEVNULL,
                                              stderr=subprocess.PIPE,
                                              env={**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), str(Path(__file__).parents[1])])})
    try:
        with trio.fail_after(40):
            def ready() -> bool:
                runs = list(tmp_path.glob("2*"))
                return bool(runs) and sum(e["event"] == "ready" for e in events(runs[0])) == 3
            await wait_for(ready, 30, interval=0.05)
            driver.send_signal(signal.SIGTERM)
            assert await driver.wait() == 130
    finally:
        if driver.returncode is None:  # the test failed: do not leave its nodes behind either
            driver.kill()
            for run in tmp_path.glob("2*"):
                for e in events(run):
                    if e["event"] == "listening" and alive(e["pid"]):
                        os.killpg(e["pid"], signal.SIGKILL)
    run_dir = next(tmp_path.glob("2*"))
    pids = [e["pid"] for e in events(run_dir) if e["event"] == "listening"]
    assert len(pids) == 3 and not [p for p in pids if alive(p)]
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["interrupted"] is True and meta["t_end"] > meta["t_launch"] > 0
    assert meta["extra"]["stopped_during"] == "nodes"
    # the testnet wrote the report of what ran: the nodes' figures, the baseline's n/a
    assert "**Interrupted**: the nodes were stopped before the end of the run" in (run_dir / "report.md").read_text()
    report = json.loads((run_dir / "report.json").read_text())
    assert report["baseline_run"]["state"] == "not run" and report["quality"]["at_equal_tokens"]["ratio"] is None
    assert report["run"]["interrupted"] and report["run"]["stopped_during"] == "nodes"
    assert main_report(run_dir)["run"]["nodes"] == 3  # and it can be made again from the records


def main_report(run_dir: Path) -> dict:
    from testnet.report import write_report

    return write_report(run_dir)


def test_node_processes_share_a_gpu_unless_the_user_says_otherwise(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    from testnet.nodes import node_env

    monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE", raising=False)
    env = node_env(tmp_path / "cache")
    assert env["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"  # no process takes 75% of a GPU the others need
    assert env["JAX_COMPILATION_CACHE_DIR"] == str((tmp_path / "cache").resolve())
    monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "true")
    assert node_env()["XLA_PYTHON_CLIENT_PREALLOCATE"] == "true"


def test_traffic_reduced_needs_rounds_and_no_faults_and_gives_the_main_run_a_roster(tmp_path: Path) -> None:
    from node.settings import NodeSettings, load_roster
    from testnet.nodes import NodeSpec
    from testnet.run import _with_traffic

    for bad in ([], ["--rounds", "5", "--kill-every", "30"], ["--rounds", "5", "--misbehave", "1:garbage"],
                ["--rounds", "5", "--misbehave", "1:flood"]):
        with pytest.raises(SystemExit):
            parse_args(["--traffic", "reduced", *bad])
    with pytest.raises(SystemExit):
        parse_args(["--rounds", "5", "--misbehave", "1:lie"])  # an aggregator's lie: all-to-all has none
    o = parse_args(["--traffic", "reduced", "--rounds", "5"])
    assert o.traffic == "reduced" and o.rounds == 5
    hostile = parse_args(["--traffic", "reduced", "--rounds", "5", "--misbehave", "1:lie", "--misbehave", "2:poison:tokens"])
    assert hostile.misbehave == ("1:lie", "2:poison:tokens")
    from protocol.identity import Identity

    ids = [Identity.generate().peer_id for _ in range(3)]
    specs = [NodeSpec(index=i, peer_id=p, key_path=tmp_path / f"k{i}", checkpoint_dir=tmp_path, log_path=tmp_path / "l")
             for i, p in enumerate(ids)]
    argv = _with_traffic(o, tmp_path, specs, lambda spec, gp, hp, peers: ["node", spec.peer_id])(specs[1], 0, 0, ())
    roster = Path(argv[argv.index("--roster") + 1])
    assert argv[:2] == ["node", ids[1]] and argv[argv.index("--traffic") + 1] == "reduced"
    settings = NodeSettings(run_id="r", key_path=tmp_path / "k", traffic="reduced", roster=roster)
    assert load_roster(settings, ids[2]) == tuple(sorted(ids))
    plain = parse_args(["--rounds", "5"])
    assert _with_traffic(plain, tmp_path, specs, lambda *a: ["node"])(specs[0], 0, 0, ()) == ["node"]

"""Tier (c), the issue's acceptance test: a short 3-node testnet of real `diloco-node` processes with one
kill and restart, whose report must be present and plausible: goodput > 0.5, replica agreement after
quiescence, the restarted node rejoined.

Quiescence is exact: every node runs `--max-rounds 40`, so it drains (waits for its peers) and prints
STOPPED; all three must stop with the same ledger and parameter digests, the restarted one included.
The kill comes 25 s after every node first trained (a plan with faults counts from then, `run.json`'s
`t_plan`), well inside the ~60 s of training. 90 s on 2 cores (166 s on a day this machine ran at half
pace)."""

from __future__ import annotations

import json
from pathlib import Path

import trio

from testnet.cli import Options, build_plan, run_testnet
from testnet.procs import GroupRegistry, alive
from testnet_helpers import events

OPTIONS = dict(nodes=3, minutes=4.0, rounds=40, inner_steps=20, eval_every=2, kill_every=1000.0, first_kill=25.0,
               downtime=5.0, baseline=False, solo_seconds=0.0, progress="plain", stop_grace=20.0, start_timeout=120.0)


async def test_three_nodes_one_kill_and_restart(tmp_path: Path, jax_cache: Path) -> None:
    # The compilation cache outlives the test (the default, OUT/jax-cache, is new in every run): the three
    # nodes' start-up does not wait on compiling the model, except in a checkout's first run.
    o = Options(out=tmp_path, jax_cache=str(jax_cache), **OPTIONS)
    plan = build_plan(o)
    assert len(plan.kills) == 1 and plan.kills[0].at == 25.0
    registry = GroupRegistry()
    with trio.fail_after(400):
        run_dir = await run_testnet(o, registry=registry)
    report = json.loads((run_dir / "report.json").read_text())
    detail = json.dumps({k: report[k] for k in ("goodput", "agreement", "joins", "rejections")}, indent=1)

    assert report["goodput"]["value"] > 0.5, detail
    assert report["agreement"]["finished_equal"] is True, f"nodes did not all drain to equal digests: {detail}"
    assert report["agreement"]["ok"], detail
    assert report["rejoined"] and report["run"]["restarts"] == 1, detail
    assert report["communication"]["ratio"] is not None and report["communication"]["ratio"] > 1, detail
    killed = plan.kills[0].node
    restarted = [j for j in report["joins"] if j["node"] == killed and j["process"] == 1]
    assert restarted and restarted[0]["recovery_s"] is not None, detail
    for node in range(3):
        assert report["curves"]["nodes"][str(node)], f"node {node} reported no held-out evaluation"
    assert (run_dir / "loss.png").stat().st_size > 10_000 and (run_dir / "report.md").exists()
    pids = [e["pid"] for e in events(run_dir) if e["event"] == "listening"]
    assert len(pids) == 4 and not [p for p in pids if alive(p)]
    assert registry.live_groups() == []
    ready = [e["t"] for e in events(run_dir) if e["event"] == "ready" and e["inc"] == 0]
    kill = next(e["t"] for e in events(run_dir) if e["event"] == "kill")
    t_plan = json.loads((run_dir / "run.json").read_text())["t_plan"]
    assert len(ready) == 3 and max(ready) - 1.0 <= t_plan and kill >= t_plan + 25.0 - 0.5, (ready, t_plan, kill)
    exits = [e for e in events(run_dir) if e["event"] == "exit"]
    assert sorted(e["rc"] for e in exits) == [-9, 0, 0, 0] and sum(e["finished"] for e in exits) == 3, exits

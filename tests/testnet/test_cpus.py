"""Tier (a): equal core slices; tier (c): a testnet's (fake) nodes run on theirs, restarts included."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import trio

from testnet.cpus import core_slices
from testnet.options import Options
from testnet.procs import GroupRegistry
from testnet.run import run_testnet
from testnet_helpers import fake_argv


@pytest.mark.parametrize(("nodes", "cores", "slices"), [
    (6, [0, 1], [(0,), (1,), (0,), (1,), (0,), (1,)]),  # 3 nodes per core
    (2, [4, 5, 6, 7], [(4, 5), (6, 7)]),  # 2 cores each, of the ones this process may use
    (1, [1, 0], [(0, 1)]),
    (4, [0, 1, 2, 3], [(0,), (1,), (2,), (3,)]),
])
def test_slices_are_equal(nodes: int, cores: list[int], slices: list[tuple[int, ...]]) -> None:
    assert core_slices(nodes, cores) == slices


@pytest.mark.parametrize(("nodes", "cores"), [(3, [0, 1]), (3, [0, 1, 2, 3]), (5, [0, 1, 2, 3]), (0, [0])])
def test_no_slices_when_some_node_would_get_more(nodes: int, cores: list[int]) -> None:
    assert core_slices(nodes, cores) is None


@pytest.mark.skipif(shutil.which("taskset") is None, reason="needs taskset (util-linux)")
@pytest.mark.parametrize("pin", [True, False])
async def test_each_node_and_its_restart_run_on_their_slice(tmp_path: Path, pin: bool) -> None:
    o = Options(nodes=2, minutes=0.05, kill_every=0.8, first_kill=0.5, downtime=0.3, settle=0.5, baseline=False,
                solo_seconds=0, out=tmp_path, progress="quiet", poll_interval=0.1, stop_grace=2, pin_cpus=pin)
    with trio.fail_after(60):
        run_dir = await run_testnet(o, argv_builder=lambda specs: fake_argv(), registry=GroupRegistry())
    samples = [json.loads(line) for line in (run_dir / "status.jsonl").read_text().splitlines()]
    seen = {(s["node"], s["inc"]): s["status"]["cpus"] for s in samples if "status" in s}
    assert any(inc > 0 for _, inc in seen), "the plan restarted a node"
    everything = sorted(os.sched_getaffinity(0))
    expected = core_slices(2, everything) if pin else [tuple(everything)] * 2
    assert all(tuple(cpus) == expected[node] for (node, _), cpus in seen.items()), seen
    report = json.loads((run_dir / "report.json").read_text())
    assert report["run"]["cpus"].startswith("each node pinned" if pin else "not pinned")

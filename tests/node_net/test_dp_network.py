"""Tier (c): data-parallel that really talks (`testnet.dp_network`): three processes in three namespaces
behind emulated links (5 ms one way), their gradients all-reduced by `jax.distributed` every step. They train
the baseline's computation (the held-out curve of `node.island.baseline.run_baseline` on the same shard keys,
within float tolerance: the sums run in another order), and the gradients crossed the links (each node's link
carried at least a ring all-reduce's bytes per step)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from testnet.bench_wan import ring_bytes

KEYS = ["worker-a", "worker-b", "worker-c"]
STEPS, EVERY, EVAL_BATCHES = 8, 4, 2


def test_data_parallel_over_three_namespaces_trains_the_baselines_curve(hosts, tmp_path) -> None:
    net = hosts(3, "1gbit,5ms")
    out = tmp_path / "dp.json"
    argv = ["--coordinator", f"{net.host(0)}:7733", "--num-processes", "3", "--steps", str(STEPS),
            "--eval-every", str(EVERY), "--eval-batches", str(EVAL_BATCHES), "--out", str(out), "--shard-keys", *KEYS]
    procs = [subprocess.Popen([*net.exec_prefix(i), sys.executable, "-m", "testnet.dp_network", *argv,
                               "--process-id", str(i)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i in range(3)]
    logs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], logs[0][-3000:]
    record = json.loads(out.read_text())
    assert record["finished"] and record["processes"] == 3 and record["mesh"] == "data=3,fsdp=1"
    assert [p[1] for p in record["points"]] == [0, 4, 8]

    from node.island.baseline import run_baseline
    from testnet.baseline_run import baseline_config

    local = run_baseline(baseline_config("tiny", (), 0), steps=STEPS, shard_keys=KEYS, eval_every=EVERY,
                         eval_batches=EVAL_BATCHES)
    assert [pt.tokens for pt in local] == [p[2] for p in record["points"]]
    assert [pt.bits_per_byte for pt in local] == pytest.approx([p[3] for p in record["points"]], rel=1e-4)
    assert record["points"][-1][3] < record["points"][0][3] - 0.3, "it learned (8 steps, inside the warm-up)"

    stats = net.link_stats()
    if stats:  # the delay line counts what each link carried (with netem there is a bridge and no counts)
        from node.island.bytelm import byte_lm_model

        grads = ring_bytes(byte_lm_model(baseline_config("tiny", (), 0)).param_count, 3)
        for i in range(3):
            assert stats[f"dlc{net.tag}n{i}"]["sent_bytes"] >= STEPS * grads, (i, stats)

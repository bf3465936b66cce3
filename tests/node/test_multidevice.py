"""Data parallelism inside an island: 2 emulated CPU devices give the same training as 1."""

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json
import jax
import numpy as np
from node.island.config import preset
from node.island.data import Dataset
from node.island.train import InnerLoop

cfg = preset("tiny").with_overrides(seq_len=32, d_model=32, n_heads=2, d_ff=64, batch_size=8, lr=1e-2,
                                    warmup_steps=2)
ds = Dataset(cfg.data, seq_len=cfg.model.seq_len, vocab_size=cfg.model.vocab_size)
heldout = ds.heldout_batches(2)
runs = {}
for n in (1, 2):
    loop = InnerLoop.byte_lm(cfg, ds.batcher("peer-a"), devices=jax.devices()[:n])
    result = loop.run(5)
    batch = jax.device_put(ds.batcher("peer-a").next_batch(), loop._by_batch)
    runs[n] = dict(losses=result.losses, params=result.params, bpb=loop.evaluate(heldout),
                   shard_rows=sorted(s.data.shape[0] for s in batch.addressable_shards),
                   param_devices=len(loop._params["norm.scale"].sharding.device_set))
diff = max(float(np.abs(runs[1]["params"][k] - runs[2]["params"][k]).max()) for k in runs[1]["params"])
scale = max(float(np.abs(v).max()) for v in runs[1]["params"].values())
print(json.dumps(dict(devices=len(jax.devices()), param_rel_diff=diff / scale,
                      **{f"{k}_{n}": v for n, r in runs.items() for k, v in r.items() if k != "params"})))
"""


def test_two_devices_train_like_one():
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT),
               # two host devices; the cheap-compile flags only shorten the test (same for both runs)
               XLA_FLAGS="--xla_force_host_platform_device_count=2 --xla_backend_optimization_level=0 "
                         "--xla_llvm_disable_expensive_passes=true")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["devices"] == 2
    assert out["shard_rows_1"] == [8] and out["shard_rows_2"] == [4, 4]  # the batch really is split
    assert out["param_devices_1"] == 1 and out["param_devices_2"] == 2  # params replicated on both
    losses_1, losses_2 = out["losses_1"], out["losses_2"]
    assert len(losses_1) == len(losses_2) == 5
    for a, b in zip(losses_1, losses_2):
        assert abs(a - b) <= 1e-5 * abs(a), (losses_1, losses_2)
    assert losses_1[-1] < losses_1[0]
    assert out["param_rel_diff"] < 1e-4
    assert abs(out["bpb_1"] - out["bpb_2"]) < 1e-4

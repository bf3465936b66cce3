"""A sharded island (tier a and b): the mesh's layout rules, and 8 emulated CPU devices training the same steps
whether the state is replicated (data=8), sharded (fsdp=8) or both (data=2,fsdp=4), with an eighth of the
parameter and optimizer bytes on each device when sharded."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from node.island.config import ConfigError, MeshShape
from node.island.mesh import MIN_SHARDED_ELEMENTS, auto_shape, param_spec

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_mesh_flag_reads_axes_and_names_mistakes():
    assert MeshShape.parse("data=2,fsdp=4") == MeshShape(data=2, fsdp=4)
    assert MeshShape.parse("fsdp=8") == MeshShape(data=1, fsdp=8)
    assert str(MeshShape.parse(" fsdp = 8 , data=1")) == "data=1,fsdp=8"
    for bad, says in (("tensor=2", "AXIS=SIZE"), ("fsdp=two", "whole number"), ("fsdp=0", ">= 1"),
                      ("fsdp=2,fsdp=2", "given twice"), ("", "at least one axis"), ("8", "AXIS=SIZE")):
        with pytest.raises(ConfigError, match=says):
            MeshShape.parse(bad)


def test_largest_divisible_axis_is_split_and_slivers_stay_whole():
    assert tuple(param_spec((256, 1024), 8)) == (None, "fsdp")
    assert tuple(param_spec((1024, 256), 8)) == ("fsdp", None)
    assert tuple(param_spec((1001, 256), 8)) == (None, "fsdp")  # 1001 is not a multiple of 8: the other axis
    assert tuple(param_spec((999, 333), 8)) == ()  # no axis divides: whole on every device
    assert tuple(param_spec((MIN_SHARDED_ELEMENTS // 2,), 8)) == ()  # a norm scale stays whole
    assert tuple(param_spec((256, 1024), 1)) == ()


def test_auto_shape_shards_only_what_does_not_fit_replicated():
    assert auto_shape(8, 10**9, None) == MeshShape(data=8)  # no memory figure (CPU): replicated
    assert auto_shape(8, 10**9, 80 * 2**30) == MeshShape(data=8)  # 16 GB of 80: replicated
    assert auto_shape(8, 12 * 10**9, 80 * 2**30) == MeshShape(fsdp=8)  # 192 GB would not fit: sharded


SCRIPT = r"""
import json
import jax
import numpy as np
from node.island.config import MeshShape, preset
from node.island.data import Dataset
from node.island.train import InnerLoop

cfg = preset("tiny").with_overrides(seq_len=32, d_model=64, n_heads=2, d_ff=256, batch_size=16, lr=1e-2,
                                    warmup_steps=2)
ds = Dataset(cfg.data, seq_len=cfg.model.seq_len, vocab_size=cfg.model.vocab_size)
heldout = ds.heldout_batches(2)
out = {"devices": len(jax.devices())}
runs = {}
for name, mesh, remat in (("data8", "data=8", False), ("fsdp8", "fsdp=8", False), ("mixed", "data=2,fsdp=4", False),
                          ("fsdp8_remat", "fsdp=8", True)):
    loop = InnerLoop.byte_lm(cfg, ds.batcher("peer-a"), mesh=MeshShape.parse(mesh), remat=remat)
    start = loop.params
    shift = {k: np.full(v.shape, 1e-3, np.float32) for k, v in start.items()}
    shifts = iter([None, None, shift])
    result = loop.run(6, shift=lambda: next(shifts, None))
    state = loop.state_dict()
    again = InnerLoop.byte_lm(cfg, ds.batcher("peer-a"), mesh=MeshShape.parse(mesh), remat=remat)
    again.load_state_dict(state)
    again.set_params(result.params)
    runs[name] = dict(params=result.params, next_a=loop.run(2).losses, next_b=again.run(2).losses)
    layout = loop.layout()
    out[name] = dict(losses=result.losses, bpb=loop.evaluate(heldout), mesh=layout["mesh"],
                     bytes_per_param=layout["state_bytes_per_param"],
                     kernel_shards=sorted({s.data.shape for s in loop._params["blocks.0.mlp.fc.kernel"].addressable_shards}),
                     moment_shards=len({s.data.shape for s in jax.tree_util.tree_leaves(loop._opt_state)[3].addressable_shards}),
                     next_a=runs[name]["next_a"], next_b=runs[name]["next_b"])
ref = runs["data8"]["params"]
scale = max(float(np.abs(v).max()) for v in ref.values())
for name in ("fsdp8", "mixed", "fsdp8_remat"):
    out[name]["param_rel_diff"] = max(float(np.abs(ref[k] - runs[name]["params"][k]).max()) for k in ref) / scale
print(json.dumps(out))
"""


def test_sharded_island_trains_like_the_replicated_one_with_an_eighth_of_the_state_per_device():
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT),
               XLA_FLAGS="--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 "
                         "--xla_llvm_disable_expensive_passes=true")
    proc = subprocess.run([sys.executable, "-c", SCRIPT], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=400)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["devices"] == 8
    data8, fsdp8 = out["data8"], out["fsdp8"]
    assert data8["kernel_shards"] == [[64, 256]] and fsdp8["kernel_shards"] == [[64, 32]]  # 1/8 of the MLP
    assert out["mixed"]["kernel_shards"] == [[64, 64]]
    assert 11.9 < data8["bytes_per_param"] <= 12.01  # fp32 params + AdamW's two moments, whole on every device
    assert data8["bytes_per_param"] / fsdp8["bytes_per_param"] > 6.5  # ~8x less; the norm scales stay whole
    assert 2.5 < out["mixed"]["bytes_per_param"] < 3.5
    for name in ("fsdp8", "mixed", "fsdp8_remat"):
        run = out[name]
        for a, b in zip(data8["losses"], run["losses"]):
            assert abs(a - b) <= 1e-4 * abs(a), (name, data8["losses"], run["losses"])
        assert run["param_rel_diff"] < 1e-4, name
        assert abs(run["bpb"] - data8["bpb"]) < 1e-3, name
        # a checkpoint's state dict, restored into a fresh sharded loop, continues identically
        assert run["next_a"] == pytest.approx(run["next_b"], rel=1e-6), name
    assert data8["losses"][-1] < data8["losses"][0]

"""An island of two processes (tier b): `jax.distributed` on this machine, one CPU device per process, gloo
between them, the mesh `fsdp=2` (every large tensor split across the two processes). Driven the way the node
drives its loop (callbacks, a shift, a progress hook that reads the parameters, evaluation, a state dict and
its restore), it takes bit for bit the steps of one process with two devices (its batches shared in the
coordination service's store, its parameters by broadcast); and a follower whose program trains another
model says so and stops. The wire format of a share keeps what a batch's pytree is made of."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys

import numpy as np

from node.island.multihost import INLINE_BYTES, _decode, _encode, _pack, _unpack

ROOT = pathlib.Path(__file__).resolve().parents[2]

SCRIPT = r"""
import json, sys
from node.island import multihost
process, count, port, d_model = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
island = multihost.join(f"127.0.0.1:{port}", count, process) if count > 1 else multihost.current()
import numpy as np
from node.island.bytelm import byte_lm_model
from node.island.config import ConfigError, MeshShape, preset
from node.island.data import Dataset
from node.island.follow import follow
from node.island.task import Task
from node.island.train import InnerLoop

cfg = preset("tiny").with_overrides(seq_len=32, d_model=d_model, n_heads=2, d_ff=256, batch_size=16, lr=1e-2,
                                    warmup_steps=2)
if not island.speaks:
    # a library program's own model (the CLI's byte-level model follows the speaker's fields instead)
    own = None if d_model == 128 else Task(model=byte_lm_model(cfg), batches=lambda key: iter(()), tokens_per_batch=1)
    try:
        follow(island, own)
    except ConfigError as exc:
        print("ERROR", exc, flush=True)
        island.leave(2)
    print("FOLLOWED", flush=True)
    sys.exit(0)
ds = Dataset(cfg.data, seq_len=cfg.model.seq_len, vocab_size=cfg.model.vocab_size)
heldout = ds.heldout_batches(2)
loop = InnerLoop(byte_lm_model(cfg), ds.batcher("peer-a"), seed=0, mesh=MeshShape.parse("fsdp=2"))
loop.warm_up(heldout)
seen, shifts = [], iter([None, None, {k: np.full(v.shape, 1e-3, np.float32) for k, v in loop.params.items()}])
first = loop.run(6, should_stop=lambda: False, shift=lambda: next(shifts, None),
                 progress=lambda p: seen.append(float(sum(np.abs(v).sum() for v in loop.params.values()))))
stopped = loop.run(5, should_stop=lambda: len(seen) >= 8, progress=lambda p: seen.append(0.0))
loop.set_schedule_step(40)
state = loop.state_dict()
loop.set_params({k: v * 0.5 for k, v in loop.params.items()})
halved = loop.run(3)
bpb = loop.evaluate(heldout)
loop.load_state_dict(state)
again = loop.run(3)
out = dict(layout=loop.layout(), losses=first.losses + stopped.losses + halved.losses + again.losses, bpb=bpb,
           seen=seen, steps=[first.steps, stopped.steps], lr=loop.learning_rate(),
           params={k: float(np.abs(v).sum()) for k, v in again.params.items()})
island.close()
print("RESULT", json.dumps(out), flush=True)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawn(process: int, count: int, port: int, d_model: int = 128, devices: int = 1) -> subprocess.Popen:
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT),
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    return subprocess.Popen([sys.executable, "-c", SCRIPT, str(process), str(count), str(port), str(d_model)],
                            env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def finish(proc: subprocess.Popen, timeout: float = 300) -> tuple[int, str, str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    return proc.returncode, out, err


def result(out: str) -> dict:
    return json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])


def test_two_processes_take_the_steps_of_one_process_with_two_devices_bit_for_bit():
    port = free_port()
    speaker, follower = spawn(0, 2, port), spawn(1, 2, port)
    (rc0, out0, err0), (rc1, out1, err1) = finish(speaker), finish(follower)
    assert rc0 == 0, err0[-3000:]
    assert rc1 == 0 and "FOLLOWED" in out1, err1[-3000:]
    rc, out, err = finish(spawn(0, 1, 0, devices=2))
    assert rc == 0, err[-3000:]
    island, alone = result(out0), result(out)
    assert island["layout"]["processes"] == 2 and alone["layout"]["processes"] == 1
    assert island["layout"]["mesh"] == alone["layout"]["mesh"] == "data=1,fsdp=2"
    assert island["steps"] == [6, 4], "should_stop asked of the speaker, obeyed by both"
    for key in ("losses", "bpb", "seen", "lr", "params"):
        assert island[key] == alone[key], key
    assert island["losses"][5] < island["losses"][0]


def test_a_follower_whose_program_has_another_model_says_so_and_stops():
    port = free_port()
    speaker, follower = spawn(0, 2, port), spawn(1, 2, port, d_model=32)
    try:
        rc, out, err = finish(follower)
        assert rc == 2, err[-3000:]
        assert "is not the speaker's" in out and "same model flags" in out
    finally:
        speaker.kill()
        speaker.communicate()


def test_a_share_comes_back_as_it_went():
    value = {"batch": (np.arange(12, dtype=np.int32).reshape(3, 4), np.float32(2.5)), "stop": False, "n": 3,
             "rows": [np.array(-0.0, np.float32), np.zeros((0, 5), np.float16)], "none": None, "name": "x"}
    arrays: list[np.ndarray] = []
    tree = _encode(value, arrays)
    back = _decode(tree, _unpack(_pack(arrays), [a.nbytes for a in arrays]))
    assert isinstance(back["batch"], tuple) and isinstance(back["rows"], list)
    assert back["batch"][0].dtype == np.int32 and back["batch"][0].tolist() == value["batch"][0].tolist()
    assert back["batch"][1].shape == () and back["batch"][1].dtype == np.float32 and float(back["batch"][1]) == 2.5
    assert np.signbit(back["rows"][0]) and back["rows"][1].shape == (0, 5)  # -0.0 keeps its bits
    assert {k: back[k] for k in ("stop", "n", "none", "name")} == {"stop": False, "n": 3, "none": None, "name": "x"}
    assert 16 * 33 * 4 < INLINE_BYTES < 4 * 250_000  # a test batch rides inline, the ~295k parameters do not

"""`diloco.start` (tier b: real nodes on loopback, each in a thread of this process with its own trio loop): a
handle on a running node — its status, the run's parameters, stop, wait — from a command line or from typed
settings, and two started nodes training together to equal digests."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

import diloco
from node.settings import NodeSettings

SMALL = ("seq_len=32", "d_model=32", "n_heads=2", "d_ff=64", "batch_size=8", "lr=1e-2", "warmup_steps=5")
FLAGS = ["--run-id", "library-handle", "--inner-steps", "5", "--heartbeat", "0.3", "--eval-every", "0",
         "--drain-timeout", "30"]


def poll(predicate, timeout: float, what: str):
    """Until `predicate()` returns something true (polled every 0.1 s), at most `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


@pytest.mark.loopback
@pytest.mark.slow
def test_two_started_nodes_train_together_and_a_handle_reads_and_stops_them(tmp_path: Path) -> None:
    task = NodeSettings(run_id="library-handle", key_path=tmp_path / "unused", overrides=SMALL).byte_lm_task()
    with pytest.raises(ValueError, match="--set"):
        diloco.start(task, [*FLAGS, "--key", str(tmp_path / "x.key"), "--set", "lr=1"])
    a = diloco.start(task, [*FLAGS, "--key", str(tmp_path / "a.key"), "--max-rounds", "4"])
    b = diloco.start(task, [*FLAGS, "--key", str(tmp_path / "b.key"), "--max-rounds", "4", "--peers", a.gossip_addr])
    with b:
        status = poll(lambda: (s := a.status())["round"] >= 1 and s, 120.0, "a's first round")
        assert status["peer_id"] == a.peer_id and status["state"] == "training"
        params = a.params()
        assert {k: v.shape for k, v in params.items()} == task.model.shapes
        assert all(v.dtype == np.float32 and np.isfinite(v).all() for v in params.values())
        ends = [a.wait(180.0), b.wait(180.0)]
    assert all(end is not None and end.slot == 4 for end in ends), ends
    assert ends[0].line() == ends[1].line(), "the two nodes stopped with equal digests"
    assert not a.running
    with pytest.raises(RuntimeError, match="stopped"):
        a.status()

    # typed settings instead of a command line; no max_rounds: until stopped
    typed = diloco.NodeSettings(run_id="library-handle", key_path=tmp_path / "c.key", inner_steps=5, heartbeat_s=0.3,
                                eval_every=0)
    with pytest.raises(ValueError, match="not both"):
        diloco.start(task, FLAGS, settings=typed)
    c = diloco.start(task, settings=typed)
    poll(lambda: c.status()["round"] >= 1, 120.0, "c's first round")
    c.stop()
    end = c.wait(60.0)
    assert end is not None and end.reason == "stop() called"

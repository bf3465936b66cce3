"""Tier (a): checkpoint files — atomic writes, corrupt and partial files skipped, full disk survived."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from node.checkpoint import MAGIC, Checkpoint, CheckpointDir, CheckpointError, decode_checkpoint, encode_checkpoint

EXPECT = {"run_id": "r", "peer_id": "p"}


def ckpt(round_: int, fill: float = 1.0) -> Checkpoint:
    return Checkpoint(
        meta={"round": round_, **EXPECT},
        ledger=bytes([round_]) * 1000,
        inner={"params/w": np.full((3, 4), fill, np.float32), "step": np.asarray(round_ * 10, np.int64)},
        feedback={"w": np.arange(12, dtype=np.float32).reshape(3, 4) * fill},
    )


def test_roundtrip_keeps_arrays_dtypes_and_meta() -> None:
    original = ckpt(7, 2.5)
    back = decode_checkpoint(encode_checkpoint(original))
    assert back.round == 7 and back.meta == original.meta and back.ledger == original.ledger
    assert back.inner["step"].dtype == np.int64 and int(back.inner["step"]) == 70
    np.testing.assert_array_equal(back.inner["params/w"], original.inner["params/w"])
    np.testing.assert_array_equal(back.feedback["w"], original.feedback["w"])


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty", "magic"])
def test_damaged_bytes_are_refused_with_a_reason(damage: str) -> None:
    data = bytearray(encode_checkpoint(ckpt(1)))
    if damage == "flip":
        data[len(data) // 2] ^= 0x40
    elif damage == "truncate":
        data = data[: len(data) - 100]
    elif damage == "empty":
        data = bytearray()
    else:
        data[:4] = b"XXXX"
    with pytest.raises(CheckpointError):
        decode_checkpoint(bytes(data))


def test_kill_between_temp_write_and_rename_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    d = CheckpointDir(tmp_path, keep=3, expect=EXPECT)
    d.save(ckpt(1))
    staged = d.stage(ckpt(2, 9.0))  # written and fsynced, never committed: the process "died" here
    assert staged.exists() and d.latest().round == 1
    reopened = CheckpointDir(tmp_path, keep=3, expect=EXPECT)  # the restart
    assert not staged.exists(), "stale temp files are removed on open"
    got = reopened.latest()
    assert got is not None and got.round == 1 and float(got.inner["params/w"][0, 0]) == 1.0


def test_sigkill_during_a_write_never_leaves_a_corrupt_checkpoint(tmp_path: Path) -> None:
    """A child process writes checkpoints in a loop and is SIGKILLed mid-way; whatever survives loads."""
    script = textwrap.dedent(f"""
        import sys, numpy as np
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from node.checkpoint import Checkpoint, CheckpointDir
        d = CheckpointDir({str(tmp_path)!r}, keep=2)
        big = np.random.default_rng(0).standard_normal(2_000_000).astype(np.float32)
        for r in range(1, 10_000):
            d.save(Checkpoint({{"round": r}}, b"x" * 1000, {{"big": big}}, {{}}))
            if r == 2:
                print("two", flush=True)
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "two"
    child.kill()
    child.wait(timeout=30)
    d = CheckpointDir(tmp_path, keep=2)
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
    assert d.paths(), "at least the checkpoints before the kill are there"
    for path in d.paths():
        decode_checkpoint(path.read_bytes())  # every surviving file is complete
    assert d.latest().round >= 2


def test_a_corrupt_newest_checkpoint_is_skipped_and_the_previous_used(tmp_path: Path, caplog) -> None:
    d = CheckpointDir(tmp_path, keep=3, expect=EXPECT)
    d.save(ckpt(1))
    newest = d.save(ckpt(2))
    newest.write_bytes(newest.read_bytes()[:-10])  # a torn file (e.g. a disk that lied about fsync)
    with caplog.at_level("WARNING"):
        assert d.latest().round == 1
    assert "ckpt-00000002.dlc" in caplog.text and "truncated" in caplog.text


def test_another_runs_checkpoint_is_skipped(tmp_path: Path, caplog) -> None:
    CheckpointDir(tmp_path, expect={"run_id": "other", "peer_id": "p"}).save(
        Checkpoint({"round": 5, "run_id": "other", "peer_id": "p"}, b"", {}, {}))
    with caplog.at_level("WARNING"):
        assert CheckpointDir(tmp_path, expect=EXPECT).latest() is None
    assert "run_id" in caplog.text


def test_only_the_last_k_are_kept(tmp_path: Path) -> None:
    d = CheckpointDir(tmp_path, keep=2, expect=EXPECT)
    for r in range(1, 6):
        d.save(ckpt(r))
    assert [p.name for p in d.paths()] == ["ckpt-00000005.dlc", "ckpt-00000004.dlc"]


def test_a_full_disk_is_logged_and_training_goes_on(tmp_path: Path) -> None:
    """RLIMIT_FSIZE makes writes past 1 MB fail with EFBIG, like a full disk: save returns None, logs an
    error, leaves no temp file, and the previous checkpoint is still the latest."""
    script = textwrap.dedent(f"""
        import logging, resource, signal, sys, numpy as np
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        from node.checkpoint import Checkpoint, CheckpointDir
        logging.basicConfig(level=logging.INFO, stream=sys.stdout)
        d = CheckpointDir({str(tmp_path)!r}, keep=3)
        assert d.save(Checkpoint({{"round": 1}}, b"small", {{}}, {{}})) is not None
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
        big = {{"big": np.zeros(1 << 20, np.float32)}}
        print("saved:", d.save(Checkpoint({{"round": 2}}, b"", big, {{}})))
        print("latest:", d.latest().round)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "saved: None" in out.stdout and "latest: 1" in out.stdout
    assert "checkpoint of round 2 not written" in out.stdout
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]


def test_magic_is_versioned() -> None:
    assert MAGIC.startswith(b"DILOCO-CKPT") and len(MAGIC) == 16
    assert os.sep not in MAGIC.decode("latin-1")

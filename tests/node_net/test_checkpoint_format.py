"""Tier (a): checkpoint format version 3 — the documented layout, streaming writes and reads, version 1 and 2
files still loading, damaged files skipped with their reason, writes interrupted mid-stream."""

from __future__ import annotations

import errno
import hashlib
import subprocess
import sys
import textwrap
import tracemalloc
from pathlib import Path

import ml_dtypes
import msgpack
import numpy as np
import pytest

import node.checkpoint as checkpoint_module
from node.checkpoint import (MAGIC, MAGIC_V1, MAGIC_V2, Checkpoint, CheckpointDir, CheckpointError, decode_checkpoint,
                             encode_checkpoint, read_checkpoint, write_checkpoint)

EXPECT = {"run_id": "r", "peer_id": "p"}
MIB = 1 << 20


def ckpt(round_: int, big: int = 0) -> Checkpoint:
    """A checkpoint whose ledger is given as pieces; `big`: bytes of an extra zero array (streamed)."""
    inner = {"params/w": np.full((3, 4), round_, np.float32), "step": np.asarray(round_, np.int64)}
    if big:
        inner["opt/big"] = np.zeros(big, np.uint8)
    return Checkpoint({"round": round_, **EXPECT}, [b"ledger-", memoryview(bytes([round_]) * 100)], inner,
                      {"w": np.arange(6, dtype=np.float32)},
                      {"working/theta/w": np.full((3, 4), 0.5, np.float32),
                       "working/momentum/w": np.full((3, 4), -1, np.float32)})


def v2_file(meta: dict, ledger: bytes, inner: dict, feedback: dict) -> bytes:
    """A version 2 file, as nodes before version 3 wrote them (no `outer` section)."""
    def specs(d):
        return [[n, d[n].dtype.str, list(d[n].shape)] for n in sorted(d)]

    header = msgpack.packb({"meta": meta, "ledger": len(ledger), "inner": specs(inner), "feedback": specs(feedback)},
                           use_bin_type=True)
    body = len(header).to_bytes(8, "big") + header + ledger + b"".join(
        d[n].tobytes() for d in (inner, feedback) for n in sorted(d))
    head = MAGIC_V2 + len(body).to_bytes(8, "big")
    return head + body + hashlib.sha256(head + body).digest()


def v1_file(meta: dict, ledger: bytes, inner: dict, feedback: dict) -> bytes:
    """A version 1 file, as nodes before version 2 wrote them (one msgpack map in the envelope)."""
    def arrays(d):
        return {n: [d[n].dtype.str, list(d[n].shape), d[n].tobytes()] for n in sorted(d)}

    body = msgpack.packb({"meta": meta, "ledger": ledger, "inner": arrays(inner), "feedback": arrays(feedback)},
                         use_bin_type=True)
    head = MAGIC_V1 + len(body).to_bytes(8, "big")
    return head + body + hashlib.sha256(head + body).digest()


def test_the_layout_is_the_documented_one() -> None:
    """docs/checkpoint-format.md, byte by byte."""
    original = ckpt(3)
    data = encode_checkpoint(original)
    assert data[:16] == MAGIC == b"DILOCO-CKPT\x00v3\n\x00"
    body_length = int.from_bytes(data[16:24], "big")
    assert len(data) == 24 + body_length + 32
    assert data[-32:] == hashlib.sha256(data[:-32]).digest()
    header_length = int.from_bytes(data[24:32], "big")
    header = msgpack.unpackb(data[32: 32 + header_length])
    assert header == {"meta": {"round": 3, **EXPECT}, "ledger": 107,
                      "inner": [["params/w", "<f4", [3, 4]], ["step", "<i8", []]],
                      "feedback": [["w", "<f4", [6]]],
                      "outer": [["working/momentum/w", "<f4", [3, 4]], ["working/theta/w", "<f4", [3, 4]]]}
    at = 32 + header_length
    assert data[at: at + 107] == b"ledger-" + bytes([3]) * 100
    assert data[at + 107: at + 107 + 48] == original.inner["params/w"].tobytes()
    assert data[at + 155: at + 163] == (3).to_bytes(8, "little")
    assert data[at + 163: at + 187] == original.feedback["w"].tobytes()
    assert data[at + 187: at + 235] == original.outer["working/momentum/w"].tobytes()
    assert data[at + 235: -32] == original.outer["working/theta/w"].tobytes()
    back = decode_checkpoint(data)
    assert back.version == 3 and sorted(back.outer) == ["working/momentum/w", "working/theta/w"]


def test_the_documented_example() -> None:
    data = encode_checkpoint(Checkpoint({"round": 3}, b"abc", {"step": np.asarray(3)}, {}))
    assert len(data) == 132 and data[:0x64] == bytes.fromhex(
        "44 49 4c 4f 43 4f 2d 43 4b 50 54 00 76 33 0a 00"
        "00 00 00 00 00 00 00 4c 00 00 00 00 00 00 00 39"
        "85 a4 6d 65 74 61 81 a5 72 6f 75 6e 64 03 a6 6c"
        "65 64 67 65 72 03 a5 69 6e 6e 65 72 91 93 a4 73"
        "74 65 70 a3 3c 69 38 90 a8 66 65 65 64 62 61 63"
        "6b 90 a5 6f 75 74 65 72 90 61 62 63 03 00 00 00"
        "00 00 00 00")
    assert data[0x64:] == hashlib.sha256(data[:0x64]).digest()


def test_round_trip_keeps_every_dtype_and_shape() -> None:
    arrays = {"bf16": np.arange(5).astype(ml_dtypes.bfloat16), "bool": np.array([True, False]),
              "big-endian": np.arange(3, dtype=">i4"), "strided": np.arange(12.0).reshape(3, 4)[:, ::2],
              "scalar": np.asarray(2.5), "empty": np.zeros((0, 3), np.int8)}
    back = decode_checkpoint(encode_checkpoint(Checkpoint({"round": 1}, b"", arrays, {})))
    assert back.ledger == b"" and set(back.inner) == set(arrays)
    for name, a in arrays.items():
        assert back.inner[name].shape == a.shape and back.inner[name].dtype == a.dtype.newbyteorder("<")
        np.testing.assert_array_equal(back.inner[name], a)
    assert back.inner["bf16"].dtype == ml_dtypes.bfloat16  # not the "<V2" that dtype.str would give


def test_writing_streams_and_reading_copies_nothing_twice(tmp_path: Path) -> None:
    """Writing 64 MiB allocates almost nothing (views of the arrays, 8 MiB chunks); reading allocates
    what it returns and little more."""
    path = tmp_path / "x.dlc"
    big = 64 * MIB
    original = ckpt(1, big=big)
    with open(path, "wb") as f:
        tracemalloc.start()
        try:
            write_checkpoint(f, original)
            written_peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    with open(path, "rb") as f:
        tracemalloc.start()
        try:
            back = read_checkpoint(f, path.stat().st_size)
            read_peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    assert written_peak < MIB, written_peak
    assert big <= read_peak < big + MIB, read_peak
    assert back.ledger == b"ledger-" + bytes([1]) * 100 and not back.inner["opt/big"].any()


def test_version_1_files_still_load(tmp_path: Path) -> None:
    inner = {"params/w": np.full((3, 4), 2.5, np.float32), "step": np.asarray(70, np.int64)}
    feedback = {"w": np.arange(12, dtype=np.float32).reshape(3, 4)}
    (tmp_path / "ckpt-00000007.dlc").write_bytes(v1_file({"round": 7, **EXPECT}, b"L" * 100, inner, feedback))
    d = CheckpointDir(tmp_path, expect=EXPECT)
    got = d.latest()
    assert got is not None and got.round == 7 and got.ledger == b"L" * 100
    np.testing.assert_array_equal(got.inner["params/w"], inner["params/w"])
    assert got.inner["step"].dtype == np.int64 and int(got.inner["step"]) == 70
    np.testing.assert_array_equal(got.feedback["w"], feedback["w"])
    d.save(ckpt(8))  # the next one is written as version 3 beside it
    assert d.paths()[0].read_bytes()[:16] == MAGIC and d.latest().round == 8
    broken = bytearray(v1_file({"round": 9}, b"", {}, {}))
    broken[30] ^= 1
    with pytest.raises(CheckpointError, match="checksum"):
        decode_checkpoint(bytes(broken))


def test_version_2_files_still_load_without_a_working_state(tmp_path: Path) -> None:
    inner = {"params/w": np.full((3, 4), 2.5, np.float32), "step": np.asarray(70, np.int64)}
    feedback = {"w": np.arange(12, dtype=np.float32).reshape(3, 4)}
    (tmp_path / "ckpt-00000007.dlc").write_bytes(v2_file({"round": 7, **EXPECT}, b"L" * 100, inner, feedback))
    got = CheckpointDir(tmp_path, expect=EXPECT).latest()
    assert got is not None and got.round == 7 and got.ledger == b"L" * 100
    np.testing.assert_array_equal(got.inner["params/w"], inner["params/w"])
    np.testing.assert_array_equal(got.feedback["w"], feedback["w"])
    assert got.outer == {} and got.version == 2  # a LedgerSnapshot inside: the restore decodes and replays


def _header_end(data: bytes) -> int:
    return 32 + int.from_bytes(data[24:32], "big")


def _patch(data: bytes, at: int, new: bytes) -> bytes:
    return data[:at] + new + data[at + len(new):]


DAMAGE = [
    ("cut mid-array", lambda d: d[: len(d) - 5000], "truncated or padded"),
    ("padded", lambda d: d + b"\0", "truncated or padded"),
    ("bit flip in an array", lambda d: _patch(d, len(d) - 3000, bytes([d[len(d) - 3000] ^ 1])), "checksum mismatch"),
    ("bit flip in the ledger", lambda d: _patch(d, _header_end(d) + 3, b"X"), "checksum mismatch"),
    ("digest", lambda d: _patch(d, len(d) - 1, bytes([d[-1] ^ 1])), "checksum mismatch"),
    ("header length", lambda d: _patch(d, 24, (1 << 40).to_bytes(8, "big")), "corrupt: a header of"),
    ("header bytes", lambda d: _patch(d, 24, (int.from_bytes(d[24:32], "big") - 1).to_bytes(8, "big")),
     "undecodable header"),
    ("header sizes", lambda d: d.replace(b"\xa6ledger\x6b", b"\xa6ledger\x6c", 1), "sizes add up to"),
    ("another format", lambda d: b"PK\x03\x04" + d[4:], "bad magic"),
]


@pytest.mark.parametrize("name,damage,reason", DAMAGE, ids=[d[0] for d in DAMAGE])
def test_a_damaged_file_is_skipped_with_its_reason(tmp_path: Path, caplog, name, damage, reason) -> None:
    d = CheckpointDir(tmp_path, expect=EXPECT)
    d.save(ckpt(1))
    newest = d.save(ckpt(2, big=10_000))
    newest.write_bytes(damage(newest.read_bytes()))
    with caplog.at_level("WARNING", logger="node.checkpoint"):
        got = d.latest()
    assert got is not None and got.round == 1
    assert "skipping checkpoint ckpt-00000002.dlc" in caplog.text and reason in caplog.text, caplog.text


class FailingFile:
    """A file whose writes fail with `exc` once `limit` bytes would be passed (a disk filling up mid-way)."""

    def __init__(self, f, limit: int, exc: BaseException) -> None:
        self.f, self.limit, self.exc, self.written = f, limit, exc, 0

    def write(self, data) -> int:
        if self.written + len(data) > self.limit:
            raise self.exc
        self.written += self.f.write(data)
        return len(data)

    def __getattr__(self, name):
        return getattr(self.f, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.f.close()


@pytest.mark.parametrize("exc", [OSError(errno.ENOSPC, "No space left on device"), RuntimeError("a bug")],
                         ids=["disk full", "other exception"])
def test_a_write_failing_mid_stream_leaves_the_previous_checkpoint(tmp_path: Path, monkeypatch, caplog, exc) -> None:
    d = CheckpointDir(tmp_path, expect=EXPECT)
    d.save(ckpt(1))
    real_open = open
    monkeypatch.setattr(checkpoint_module, "open", lambda *a: FailingFile(real_open(*a), 10 * MIB, exc), raising=False)
    with caplog.at_level("ERROR", logger="node.checkpoint"):
        if isinstance(exc, OSError):
            assert d.save(ckpt(2, big=32 * MIB)) is None  # logged, training goes on
            assert "checkpoint of round 2 not written" in caplog.text and "No space left" in caplog.text
        else:
            with pytest.raises(RuntimeError):  # a bug is not swallowed, but leaves no temp file behind
                d.save(ckpt(2, big=32 * MIB))
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt-00000001.dlc"]
    assert d.latest().round == 1


def test_sigkill_mid_stream_leaves_the_previous_checkpoint(tmp_path: Path) -> None:
    """A child writes round 1, then stops (for good) 8 MiB into writing round 2 and is SIGKILLed there."""
    script = textwrap.dedent(f"""
        import signal, sys, numpy as np
        sys.path.insert(0, {str(Path(__file__).resolve().parents[2])!r})
        import node.checkpoint as checkpoint_module
        from node.checkpoint import Checkpoint, CheckpointDir

        class Stalling:
            def __init__(self, f):
                self.f, self.written = f, 0
            def write(self, data):
                if self.written >= 8 << 20:
                    self.f.flush()
                    print("mid-write", self.written, flush=True)
                    signal.pause()  # wait here for the SIGKILL
                self.written += self.f.write(data)
                return len(data)
            def __getattr__(self, name):
                return getattr(self.f, name)
            def __enter__(self):
                return self
            def __exit__(self, *exc):
                self.f.close()

        d = CheckpointDir({str(tmp_path)!r}, keep=2)
        d.save(Checkpoint({{"round": 1}}, b"one", {{"big": np.ones(1 << 20, np.float32)}}, {{}}))
        checkpoint_module.open = lambda *a: Stalling(open(*a))
        d.save(Checkpoint({{"round": 2}}, [b"two"], {{"big": np.ones(6 << 20, np.float32)}}, {{}}))
    """)
    child = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        line = child.stdout.readline().split()
        assert line and line[0] == "mid-write", line
        temps = [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]
        assert len(temps) == 1 and temps[0].stat().st_size == int(line[1])  # half written
    finally:
        child.kill()
        child.wait(timeout=30)
    d = CheckpointDir(tmp_path, keep=2)
    assert [p.name for p in tmp_path.iterdir()] == ["ckpt-00000001.dlc"]  # the temp file is gone on open
    got = d.latest()
    assert got is not None and got.round == 1 and got.ledger == b"one" and got.inner["big"].all()

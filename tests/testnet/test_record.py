"""Tier (a): the run's records on a full disk. The testnet's recorder never stops a run because a write
failed: the refused lines wait and are written, in order and whole, once there is space again; what could
not be written is reported, never raised (a run of session 15 died at 9 minutes with ENOSPC raised from
the status recorder)."""

from __future__ import annotations

import errno
import json
import os

from testnet import record
from testnet.record import Recorder


class FillingDisk:
    """`os.write` of a disk that fills up: while `full`, the first write takes 10 bytes of a line (a disk
    that fills mid-line), every later one is refused with ENOSPC."""

    def __init__(self) -> None:
        self.full, self.partial_done, self.real = True, False, os.write

    def __call__(self, fd: int, data) -> int:
        if not self.full:
            return self.real(fd, data)
        if not self.partial_done and len(data) > 10:
            self.partial_done = True
            return self.real(fd, bytes(data[:10]))
        raise OSError(errno.ENOSPC, "No space left on device")


def test_a_full_disk_delays_the_records_and_loses_none_once_space_is_back(tmp_path, monkeypatch) -> None:
    recorder = Recorder(tmp_path)
    recorder.event(1.0, 0, 0, "launch")
    disk = FillingDisk()
    monkeypatch.setattr(record.os, "write", disk)
    recorder.event(2.0, 0, 0, "listening", pid=1)
    recorder.sample(3.0, 0, 0, status={"state": "training", "slot": 4})
    recorder.sample(4.0, 0, 0, error="timeout")
    assert disk.partial_done and "No space left on device" in recorder.problem()
    disk.full = False
    recorder.event(5.0, 0, 0, "kill")
    recorder.close()
    assert recorder.problem().endswith("every line written once space was back"), recorder.problem()
    events = [json.loads(line) for line in (tmp_path / "events.jsonl").read_text().splitlines()]
    assert [e["event"] for e in events] == ["launch", "listening", "kill"]
    samples = [json.loads(line) for line in (tmp_path / "status.jsonl").read_text().splitlines()]
    assert samples == [{"t": 3.0, "node": 0, "inc": 0, "status": {"state": "training", "slot": 4}},
                       {"t": 4.0, "node": 0, "inc": 0, "error": "timeout"}]


def test_lines_that_never_find_space_are_counted_lost(tmp_path, monkeypatch) -> None:
    recorder = Recorder(tmp_path)
    monkeypatch.setattr(record, "_WAITING_MAX", 100)  # about two lines may wait

    def refuse(fd: int, data) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(record.os, "write", refuse)
    for i in range(5):
        recorder.event(float(i), 0, 0, "launch")
    recorder.close()
    assert recorder.problem() == "events.jsonl: No space left on device; 5 line(s) lost"
    assert (tmp_path / "events.jsonl").read_text() == ""

"""The round in flight on disk (`node.outer.inflight`): what a journal holds comes back bit for bit, a journal
that is not this node's or is damaged is dropped with its reason, a failed write loses only itself, the
cadence keeps writes under their share of the time, and the inner loop's progress hook sees the round as
the node would publish it at that step."""

from __future__ import annotations

import errno
import logging
import os

import numpy as np
import pytest

from node.island.model import init_params
from node.island.train import InnerLoop, Progress
from node.outer.inflight import FILE_NAME, InflightJournal, InflightRound, JournalCadence
from node.outer.rebase import BaseShift
from node.outer.updates import make_delta

SHAPES = {"b": (3,), "w": (4, 5)}


def _round(**changes) -> InflightRound:
    rng = np.random.default_rng(0)
    fields = dict(run_id="run", peer_id="peer-a", round=7, base_slot=12, steps=31, tokens=31 * 256, seconds=4.25,
                  mean_loss=2.5, data_position=400, started_at=1_790_000_000.25,
                  delta={n: rng.standard_normal(s).astype(np.float32) for n, s in SHAPES.items()})
    fields.update(changes)
    return InflightRound(**fields)


def test_a_journal_comes_back_as_written(tmp_path) -> None:
    journal = InflightJournal(tmp_path, every_s=2.0)
    assert journal.load(run_id="run", peer_id="peer-a", shapes=SHAPES) is None, "nothing written yet"
    written = _round()
    assert journal.write(written) and journal.path.name == FILE_NAME
    assert journal.write(_round(steps=40)), "a later write replaces the journal"
    got = journal.load(run_id="run", peer_id="peer-a", shapes=SHAPES)
    assert got.steps == 40 and (got.round, got.base_slot, got.tokens, got.data_position) == (7, 12, 31 * 256, 400)
    assert (got.seconds, got.mean_loss, got.started_at) == (4.25, 2.5, 1_790_000_000.25)
    for name in SHAPES:
        assert got.delta[name].dtype == np.float32
        np.testing.assert_array_equal(got.delta[name], written.delta[name])
    assert [p.name for p in tmp_path.iterdir()] == [FILE_NAME], "no temp file left"
    journal.clear()
    assert not journal.path.exists()


@pytest.mark.parametrize("case, expect", [
    ("other peer", "not ours"),
    ("other run", "not ours"),
    ("other model", "not this model's"),
    ("non-finite", "non-finite"),
    ("truncated", "truncated"),
    ("flipped byte", "checksum mismatch"),
])
def test_a_journal_that_is_not_ours_or_is_damaged_is_dropped_with_its_reason(tmp_path, caplog, case,
                                                                               expect) -> None:
    journal = InflightJournal(tmp_path, every_s=2.0)
    delta = _round().delta
    if case == "non-finite":
        delta = {**delta, "b": np.array([1.0, np.nan, 0.0], np.float32)}
    journal.write(_round(peer_id="peer-b" if case == "other peer" else "peer-a",
                         run_id="other" if case == "other run" else "run", delta=delta))
    data = journal.path.read_bytes()
    if case == "truncated":
        journal.path.write_bytes(data[: len(data) // 2])
    elif case == "flipped byte":
        journal.path.write_bytes(data[:100] + bytes([data[100] ^ 1]) + data[101:])
    shapes = {**SHAPES, "w": (5, 4)} if case == "other model" else SHAPES
    with caplog.at_level(logging.WARNING, logger="node.outer.inflight"):
        assert journal.load(run_id="run", peer_id="peer-a", shapes=shapes) is None
    assert expect in caplog.text, caplog.text
    assert not journal.path.exists(), "a dropped journal is removed"


def test_a_failed_write_keeps_the_previous_journal_and_says_why(tmp_path, caplog, monkeypatch) -> None:
    journal = InflightJournal(tmp_path, every_s=2.0)
    assert journal.write(_round(steps=10))

    def full_disk(fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    with monkeypatch.context() as patched, caplog.at_level(logging.ERROR, logger="node.outer.inflight"):
        patched.setattr(os, "fsync", full_disk)
        assert not journal.write(_round(steps=20))
    assert "No space left" in journal.last_error and "not journaled" in caplog.text
    assert [p.name for p in tmp_path.iterdir()] == [FILE_NAME], "the temp file is removed"
    assert journal.load(run_id="run", peer_id="peer-a", shapes=SHAPES).steps == 10
    assert journal.write(_round(steps=30)) and journal.last_error is None


def test_a_write_into_a_missing_directory_fails_without_raising(tmp_path) -> None:
    journal = InflightJournal(tmp_path / "gone", every_s=2.0)
    assert not journal.write(_round()) and "No such file" in journal.last_error


def test_the_cadence_waits_its_interval_and_keeps_writes_under_five_percent() -> None:
    now = [100.0]
    cadence = JournalCadence(2.0, clock=lambda: now[0])
    now[0] += 1.9
    assert not cadence.due()
    now[0] += 0.2
    assert cadence.due()
    cadence.wrote(now[0] - 0.5)  # a write that took 0.5 s: the next one only 10 s after it
    now[0] += 9.9
    assert not cadence.due()
    now[0] += 0.2
    assert cadence.due()
    cadence.wrote(now[0] - 0.01)  # a quick write: the interval again
    now[0] += 2.0
    assert cadence.due()
    with pytest.raises(ValueError):
        InflightJournal("/tmp", every_s=0.0)


@pytest.mark.slow
def test_the_progress_hook_sees_the_round_as_it_would_be_published(config, dataset) -> None:
    """Between steps the hook sees the steps done; Δ against the moved base taken then equals Δ of a round
    of that many steps (the same batches), and the hook changes nothing in the round."""
    base, moved_to = init_params(config.model, seed=1), init_params(config.model, seed=2)
    seen: dict[int, tuple[Progress, dict[str, np.ndarray]]] = {}
    hooked = InnerLoop.byte_lm(config, dataset.batcher("peer-a"))
    shift = BaseShift(base, base_slot=0)
    calls = []

    def take():
        calls.append(1)
        if len(calls) == 2:  # the base moves before the second step
            shift.post(moved_to, slot=1)
        return shift.take()

    def progress(p: Progress) -> None:
        seen[p.steps] = (p, make_delta(shift.applied, hooked.params))

    hooked.set_params(base)
    full = hooked.run(5, shift=take, progress=progress)
    assert sorted(seen) == [1, 2, 3, 4], "between steps: not before the first, not after the last"
    p, delta_at_3 = seen[3]
    assert len(p.losses()) == 3 and p.losses() == full.losses[:3] and 0 < p.seconds <= full.seconds

    plain = InnerLoop.byte_lm(config, dataset.batcher("peer-a"))  # same batches, no hook
    again = BaseShift(base, base_slot=0)
    calls.clear()

    def take_again():
        calls.append(1)
        if len(calls) == 2:
            again.post(moved_to, slot=1)
        return again.take()

    plain.set_params(base)
    three = plain.run(3, shift=take_again)
    for name in base:
        np.testing.assert_array_equal(delta_at_3[name], make_delta(again.applied, three.params)[name])
    rest = plain.run(2)
    for name in base:
        np.testing.assert_array_equal(rest.params[name], full.params[name])

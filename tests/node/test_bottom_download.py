"""Tier (a): the joiner's part file (`node.sync.statefetch.BottomDownload`), no network: a piece is written only
if it is the indexed one, an interrupted download is resumed from the pieces that still verify on disk,
and the finished file reads back as the arrays."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from node.sync.statefetch import BottomDownload
from protocol.ledger.digest import PIECE
from protocol.ledger.statesync import BottomIndex

ARRAYS = {"theta/w": np.arange(PIECE // 2, dtype=np.float32),  # two pieces
          "momentum/w": np.linspace(-1, 1, PIECE // 2, dtype=np.float32),
          "theta/b": np.array([1.5, -2.0], np.float32), "momentum/b": np.zeros(2, np.float32)}


def piece_bytes(index: BottomIndex) -> list[bytes]:
    blob = b"".join(ARRAYS[a.name].tobytes() for a in index.arrays)
    return [blob[p.offset:p.offset + p.length] for p in index.pieces()]


def test_only_verified_pieces_are_written_and_the_file_reads_back(tmp_path: Path) -> None:
    index = BottomIndex.of_arrays(ARRAYS)
    download = BottomDownload(index, tmp_path)
    download.open()
    pieces, data = download.pieces, piece_bytes(index)
    assert len(pieces) == 6 and download.missing == list(range(6))
    assert not download.write_verified(pieces[1], data[2]), "another piece's bytes"
    assert not download.write_verified(pieces[1], data[1][:-1]), "short"
    assert not download.write_verified(pieces[1], data[1] + b"\0"), "long"
    for p, raw in zip(pieces, data):
        assert download.write_verified(p, raw)
    views = download.views()
    assert all(np.array_equal(views[n], ARRAYS[n]) and views[n].dtype == ARRAYS[n].dtype for n in ARRAYS)


def test_a_retry_keeps_the_pieces_that_still_verify(tmp_path: Path) -> None:
    index = BottomIndex.of_arrays(ARRAYS)
    first = BottomDownload(index, tmp_path)
    first.open()
    data = piece_bytes(index)
    for i in (0, 2, 3, 5):
        assert first.write_verified(first.pieces[i], data[i])
    with open(first.path, "r+b") as f:  # piece 3 damaged on disk since
        f.seek(first.pieces[3].offset)
        f.write(b"\xff\xff")
    first.release()  # the first attempt ended (its donors gone)
    again = BottomDownload(index, tmp_path)
    again.open()
    assert again.path == first.path and again.resumed == 3 and again.missing == [1, 3, 4]
    other = BottomDownload(BottomIndex.of_arrays({**ARRAYS, "theta/b": np.ones(2, np.float32)}), tmp_path)
    other.open()
    assert other.path != first.path and other.resumed == 0, "another bottom starts from nothing"


def test_concurrent_downloads_of_one_bottom_never_share_or_delete_each_others_part_file(tmp_path: Path) -> None:
    """A join and a repair (or two repairs) may fetch the same bottom at once: each gets its own part
    file, and the one that finishes first removes only its own (and unused leftovers)."""
    index = BottomIndex.of_arrays(ARRAYS)
    a, b = BottomDownload(index, tmp_path), BottomDownload(index, tmp_path)
    a.open()
    b.open()
    assert a.path != b.path and a.path.exists() and b.path.exists()
    (tmp_path / "leftover.part").write_bytes(b"old")
    a.remove()
    a.release()
    assert not a.path.exists() and b.path.exists() and not (tmp_path / "leftover.part").exists()
    b.release()

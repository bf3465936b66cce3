"""Tier (a): the blob store on a full disk (`p2p.blobstore`: the spill). The directory is a small tmpfs that
fills for real (ENOSPC); where mounting is not allowed the tests are skipped. Also the fetch back-off after a
local write error (`p2p.blobfetch.LocalBackoff`)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from p2p.blobfetch import LocalBackoff
from p2p.blobstore import BlobStore, blob_hex


@pytest.fixture
def small_disk(tmp_path: Path):
    where = tmp_path / "disk"
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(where)], capture_output=True,
                      check=False).returncode != 0:
        pytest.skip("mounting a tmpfs needs privilege")
    yield where
    subprocess.run(["umount", "-l", str(where)], capture_output=True, check=False)


def _fill(where: Path) -> Path:
    filler = where / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(os.urandom(4096))
                f.flush()
        except OSError:
            pass
    return filler


def test_blobs_go_to_the_spill_on_a_full_disk_and_come_back_when_it_has_room(small_disk: Path, tmp_path: Path) -> None:
    store = BlobStore(small_disk / "blobs", tmp_path / "spill", spill_limit=1 << 20)
    before = store.put(b"written while there was room")
    filler = _fill(small_disk)
    data = os.urandom(100_000)
    name = store.put(data)  # the directory refuses it: it goes to the spill
    assert store.disk_error is not None and "No space left" in store.disk_error
    assert store.path(name).parent == tmp_path / "spill" and store.read(name) == data
    assert store.spilled_bytes == len(data)
    writer = store.open_writer(blob_hex(b"fetched"), 7)  # a download goes there at once
    writer.write(b"fetched")
    writer.commit()
    writer.close()
    assert store.path(blob_hex(b"fetched")).parent == tmp_path / "spill"
    assert store.unspill() == 0 and store.disk_error is not None  # still full: nothing moves, nothing is lost
    assert store.read(before) == b"written while there was room" and store.read(name) == data

    filler.unlink()
    assert store.unspill() == 2 and store.disk_error is None and store.spilled_bytes == 0
    assert store.path(name).parent == small_disk / "blobs" and store.read(name) == data
    assert not (tmp_path / "spill").exists()  # the empty spill directory is gone too
    again = BlobStore(small_disk / "blobs", tmp_path / "spill", spill_limit=1 << 20)
    assert again.read(name) == data and again.disk_error is None


def test_a_spilled_blob_is_found_after_a_restart_and_the_spill_has_a_bound(small_disk: Path, tmp_path: Path) -> None:
    store = BlobStore(small_disk / "blobs", tmp_path / "spill", spill_limit=150_000)
    _fill(small_disk)
    kept = store.put(os.urandom(100_000))
    with pytest.raises(OSError):  # over the bound: refused as before the spill
        store.put(os.urandom(100_000))
    restarted = BlobStore(small_disk / "blobs", tmp_path / "spill", spill_limit=150_000)
    assert restarted.has(kept) and restarted.spilled_bytes == 100_000 and restarted.disk_error is not None
    restarted.remove(kept)
    assert not restarted.has(kept) and not (tmp_path / "spill" / kept).exists()


def test_fetches_wait_longer_after_each_local_write_error_and_not_at_all_after_a_success() -> None:
    backoff = LocalBackoff()
    waits = [backoff.failed(100.0) for _ in range(7)]
    assert waits == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0] and backoff.until == 130.0
    backoff.succeeded()
    assert backoff.until < 0 and backoff.failed(5.0) == 1.0


def test_a_nodes_spill_holds_several_of_its_models_updates() -> None:
    from node.hostconfig import SPILL_UPDATES, spill_bytes
    from p2p import HostConfig

    assert spill_bytes({"w": (1000,)}, "int4") == HostConfig.blob_spill_bytes  # small models: the default
    big = {"w": (10**9,)}  # 1B parameters, int4: ~0.53 GB a payload
    assert spill_bytes(big, "int4") == SPILL_UPDATES * 531_250_000 > HostConfig.blob_spill_bytes

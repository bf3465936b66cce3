"""Tier (c): a full disk under a running node. The node keeps training, says so in `/status`, keeps its last
good checkpoint, and writes again once space returns.

The disk is "filled" for the node process alone with a soft RLIMIT_FSIZE (set from outside, `prlimit`):
every write past the limit fails with EFBIG, like ENOSPC on a full disk, while this test and the node's
log (kept small with `--log-level WARNING`) go on. First the limit lets the round's update blob through
(fp32: ~100 KB) but not a checkpoint: rounds are published, checkpoints fail. Then it stops the blob too:
rounds are trained but not published (the limit is per file, so the spill to memory of the second test cannot
take the blob either). Then the limit is lifted.

The second test fills a real filesystem (a small tmpfs mounted under the checkpoint directory: ENOSPC) and
has a peer: there the node's blobs go to memory and its part in the run goes on.
"""

from __future__ import annotations

import re
import resource
import shutil
import subprocess
from pathlib import Path

import pytest

from node.checkpoint import CheckpointDir
from p2p.blobstore import default_spill_dir

BLOB_FITS, NOTHING_FITS = 200 << 10, 60 << 10  # an fp32 update blob is ~100 KB, a checkpoint several times more
UNLIMITED = resource.RLIM_INFINITY  # only the soft limit moves, so no privilege is needed to lift it again
COMMON = ["--inner-steps", "5", "--heartbeat", "0.5", "--checkpoint-interval", "0", "--compression", "fp32",
          "--eval-every", "0", "--log-level", "WARNING"]


def test_a_full_disk_leaves_the_node_training_and_its_last_checkpoint_intact(cluster) -> None:
    a = cluster("a", *COMMON)
    a.wait_listening(180.0)
    a.wait_status(lambda s: s["round"] >= 2, 120.0, "two rounds")
    ckpts = CheckpointDir(a.home / "ckpt")
    good = ckpts.latest()
    assert good is not None, "a checkpoint before the disk fills"

    resource.prlimit(a.proc.pid, resource.RLIMIT_FSIZE, (BLOB_FITS, UNLIMITED))
    full = a.wait_status(lambda s: "checkpoint" in s["disk_errors"], 60.0, "checkpoints failing in /status")
    assert "update_blob" not in full["disk_errors"] and full["state"] == "training"
    a.wait_status(lambda s: s["round"] >= full["round"] + 5, 60.0, "rounds still published")
    latest = ckpts.latest()
    assert latest is not None and latest.round >= good.round, "the last good checkpoint still loads"

    resource.prlimit(a.proc.pid, resource.RLIMIT_FSIZE, (NOTHING_FITS, UNLIMITED))
    full = a.wait_status(lambda s: "update_blob" in s["disk_errors"], 60.0, "update blobs failing in /status")
    a.wait_status(lambda s: s["inner_steps"] >= full["inner_steps"] + 50, 60.0, "training on, unpublished")
    assert a.proc.poll() is None, "the node is still running"
    assert ckpts.latest().round == latest.round, "no checkpoint written, the last good one intact"
    assert not [p for p in (a.home / "ckpt").iterdir() if p.name.startswith(".tmp-")]
    assert a.log_path.read_text().count("not published: [Errno") == 1, "logged once, not every round"

    resource.prlimit(a.proc.pid, resource.RLIMIT_FSIZE, (UNLIMITED, UNLIMITED))  # the soft limit back up
    round_then = a.status()["round"]
    a.wait_status(lambda s: not s["disk_errors"] and s["round"] >= round_then + 2, 60.0,
                  "writing and publishing again once space returned")
    assert ckpts.latest().round > latest.round


def _mount_small_disk(where: Path, megabytes: int) -> bool:
    """A tmpfs of `megabytes` at `where` (a real filesystem that fills: ENOSPC); False where mounting is not
    allowed (no privilege)."""
    where.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(where)],
                          capture_output=True, check=False)
    return done.returncode == 0


def _fill(disk: Path) -> Path:
    """Fill `disk` to its last byte with one file; its path."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError:
            pass
    return filler


def _published(node, after: int) -> list[str]:
    """The ids (16 hex digits) of the updates `node` published, from its `after`-th log byte on."""
    text = node.log_path.read_text(errors="replace")[after:]
    return re.findall(r"published ([0-9a-f]{16}) \(base \d+, slot \d+", text)


def _applied(node, origin: str) -> set[str]:
    """The ids of `origin`'s updates `node`'s ledger took (applied or folded in)."""
    text = node.log_path.read_text(errors="replace")
    return set(re.findall(rf"update ([0-9a-f]{{16}}) from {origin} .*: "
                          r"(?:applied-open|folded-late|applied-stale|held-future)", text))  # held: applied at its slot


def test_a_node_on_a_full_disk_keeps_contributing_and_restarts_from_its_checkpoint(cluster, tmp_path) -> None:
    """The checkpoint directory, and the blobs under it, on a small filesystem that then fills to its last byte.
    The node's own updates and the blobs it fetches go to memory (`p2p.blobstore`'s spill), so its peer keeps
    applying its updates and its slot keeps pace; `/status` says how much it holds; checkpoints wait. Killed and
    restarted on the still-full disk, it resumes from its last checkpoint and trains on. Once the disk has room
    the blobs move back and checkpoints are written again."""
    disk = tmp_path / "b" / "ckpt"
    if not _mount_small_disk(disk, 8):
        pytest.skip("mounting a tmpfs needs privilege")
    nodes = []
    try:
        args = ["--inner-steps", "5", "--heartbeat", "0.5", "--checkpoint-interval", "0", "--eval-every", "0",
                "--log-level", "INFO", "--slowdown", "20"]  # rounds of ~0.5 s
        a = cluster("a", *args)
        nodes.append(a)
        a.wait_listening(180.0)
        b = cluster("b", *args, "--peers", a.gossip)
        nodes.append(b)
        b.wait_listening(180.0)
        b.wait_status(lambda s: s["round"] >= 3, 120.0, "three rounds")
        good = CheckpointDir(disk).latest()
        assert good is not None, "a checkpoint before the disk fills"

        filler = _fill(disk)
        log_at = b.log_path.stat().st_size
        full = b.wait_status(lambda s: "blobs" in s["disk_errors"], 60.0, "blobs held in memory, in /status")
        assert "update_blob" not in full["disk_errors"] and full["state"] == "training"
        b.wait_status(lambda s: s["round"] >= full["round"] + 4, 90.0, "rounds published from memory")
        mine = _published(b, log_at)
        assert len(mine) >= 4 and "not published" not in b.log_path.read_text(errors="replace")[log_at:]
        a.wait_log(rf"update {mine[-2]} from {b.peer_id}", 30.0)
        assert set(mine[:-1]) <= _applied(a, b.peer_id), "its peer applied the updates it published on the full disk"
        assert abs(b.status()["slot"] - a.status()["slot"]) <= 3, "its slot keeps pace with its peer's"
        assert "postponed" in b.status()["disk_errors"].get("checkpoint", ""), "checkpoints wait for the disk"
        assert CheckpointDir(disk).latest().round == good.round, "the last good checkpoint is intact"

        b.kill()  # a restart on the still-full disk
        b.start()
        b.wait_listening(180.0)
        b.wait_log(r"resumed from checkpoint of round", 120.0)
        restarted = b.wait_status(lambda s: s["state"] == "training", 120.0, "training after the restart")
        b.wait_status(lambda s: s["round"] >= restarted["round"] + 3, 90.0, "rounds after the restart")

        filler.unlink()  # space returns
        b.wait_status(lambda s: not s["disk_errors"], 90.0, "blobs back on disk and a checkpoint written")
        assert CheckpointDir(disk).latest().round > good.round
    finally:
        for node in nodes:  # before the clean-up: a running node would spill again
            node.kill()
        subprocess.run(["umount", "-l", str(disk)], capture_output=True, check=False)
        shutil.rmtree(default_spill_dir(disk / "blobs"), ignore_errors=True)  # memory, until it is removed

"""Tier (c): a full disk under a running node. The node keeps training, says so in `/status`, keeps its last
good checkpoint, and writes again once space returns.

The disk is "filled" for the node process alone with a soft RLIMIT_FSIZE (set from outside, `prlimit`):
every write past the limit fails with EFBIG, like ENOSPC on a full disk, while this test and the node's
log (kept small with `--log-level WARNING`) go on. First the limit lets the round's update blob through
(fp32: ~100 KB) but not a checkpoint: rounds are published, checkpoints fail. Then it stops the blob too:
rounds are trained but not published. Then the limit is lifted.
"""

from __future__ import annotations

import resource

from node.checkpoint import CheckpointDir

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

"""The node's parts that its rounds, what comes between them and the intake of peers' updates share.

`NodeRuntime` builds one `NodeParts` once the ledger is ready (`NodeRuntime._start_training`) and hands it to
`Rounds`, `BetweenRounds` and `Intake`, so each part is named once and every reader gets the same one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from node.checkpoint import CheckpointDir
    from node.island.train import InnerLoop
    from node.outer.replica import Replica
    from node.outer.upkeep import HeldBlobs
    from node.settings import NodeSettings
    from node.status import NodeStats
    from p2p import Host
    from protocol.compression import ErrorFeedback
    from protocol.ledger import SlotClosePolicy

__all__ = ["NodeParts"]


@dataclass(frozen=True)
class NodeParts:
    settings: NodeSettings
    host: Host
    replica: Replica
    loop: InnerLoop  # the island's inner loop
    feedback: ErrorFeedback  # this node's compression residual
    stats: NodeStats  # what /status and the metrics report
    policy: SlotClosePolicy  # when a slot closes
    shapes: Mapping[str, tuple[int, ...]]
    blobs: HeldBlobs  # the payload blobs held, for the clean-up
    checkpoints: CheckpointDir | None  # None: no --checkpoint-dir
    heldout: Sequence = ()  # the held-out batches (empty: no evaluation)

"""A follower process of an island (`diloco-node --process-id 1..N-1`, `node.island.multihost`): no network, no
ledger, no data; it builds the speaker's inner loops on its own devices and makes the speaker's calls until the
speaker closes the island."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from node.island.bytelm import byte_lm_of_fields
from node.island.config import ConfigError
from node.island.multihost import Island
from node.island.task import Task
from node.island.train import InnerLoop

__all__ = ["follow"]

log = logging.getLogger("node.island")


def follow(island: Island, task: Task | None = None) -> None:
    """Serve the speaker until it closes the island. `task`: a library program's own task (every process of
    the island runs the same program); None for diloco-node's byte-level model, built from the fields the
    speaker announces (so a speaker that took the run's configuration from its peers is followed exactly)."""

    def build(*, model_name: str, model_config: Mapping[str, object], **kwargs: Any) -> InnerLoop:
        if task is not None:
            model = task.model
        elif model_name == "byte-lm":
            model = byte_lm_of_fields(model_config)
        else:
            raise ConfigError(f"the island's speaker trains its own model ({model_name}): start every process of "
                              f"the island with the same program")
        loop = InnerLoop.follower(model, **kwargs)
        log.info("island process %d of %d: training %s, %d parameters, on %d of the island's %d devices",
                 island.process_id, island.process_count, model.name, model.param_count,
                 len([d for d in loop.mesh.devices.flat if d.process_index == island.process_id]),
                 loop.mesh.devices.size)
        return loop

    island.serve(build)

"""The training node (`diloco-node`), in three parts that show the design:

- `node.island` — the island's training, which knows nothing of the network: what a node trains (`task`:
  a `Model` — init, loss, optimizer — and its data; the library API, `diloco`), the CLI's byte-level
  transformer as one such model (`bytelm`; the Flax NNX module in `model`, presets in `config`, the corpus in
  `data`), the jitted inner loop (`train.InnerLoop`:
  `set_params` / `run` / `evaluate` / `state_dict`, parameters in flat form `dict[str, np.ndarray]`),
  and the synchronous data-parallel baseline (`baseline`).
- `node.outer` — the outer loop around it: the ledger service (`replica.Replica`, the one owner of the
  node's `protocol.ledger.Ledger`: every operation in a worker thread under one lock, views read on the
  trio thread), the rounds (`rounds.Rounds`: train, compress, publish, add) and what comes between them
  (`upkeep.BetweenRounds`: evaluation, checkpoints, blob clean-up), the intake of peers' updates
  (`intake.Intake`), the hand-over of moving
  global parameters to a running round (`rebase.BaseShift`, the one place the trio side and the training
  thread meet), update encoding/decoding (`updates`) and the memory-mapped outer files (`outer_files`).
- `node.sync` — how replicas come to agree: joining a running training (`join`, `statefetch`), serving
  state to joiners (`stateserve`), repair and the fork choice between diverged replicas (`repair`,
  `forkhint`), and the drain at the end of a run (`drain`).

`node.runtime.NodeRuntime` wires them (lifecycle, checkpoints: `checkpoint`);
`cli`, `settings`, `status`, `logs` and `chaos` are the process around it.

Names are re-exported lazily (PEP 562): `import node` or `from node.island.config import ...` does not import
JAX, and `python -m node.island.train` does not import `node.island.train` twice.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "node.island.baseline": ("CurvePoint", "run_baseline", "worker_keys"),
    "node.checkpoint": ("Checkpoint", "CheckpointDir", "CheckpointError"),
    "node.island.config": ("PRESETS", "Config", "ConfigError", "DataConfig", "InnerConfig", "ModelConfig", "preset"),
    "node.island.data": ("Batcher", "DataError", "Dataset", "MultiBatcher"),
    "node.island.model": ("Transformer", "build_model", "check_flat", "embedding_names", "flatten_params", "init_params",
                   "make_apply", "param_count", "param_shapes", "unflatten_params"),
    "node.runtime": ("NodeRuntime", "Stopped"),
    "node.settings": ("NodeSettings",),
    "node.island.task": ("IterableBatches", "Model", "Task"),
    "node.island.train": ("InnerLoop", "RoundResult"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_MODULE_OF)

if TYPE_CHECKING:
    from node.island.baseline import CurvePoint, run_baseline, worker_keys
    from node.checkpoint import Checkpoint, CheckpointDir, CheckpointError
    from node.island.config import PRESETS, Config, ConfigError, DataConfig, InnerConfig, ModelConfig, preset
    from node.island.data import Batcher, DataError, Dataset, MultiBatcher
    from node.island.model import (Transformer, build_model, check_flat, embedding_names, flatten_params, init_params,
                            make_apply, param_count, param_shapes, unflatten_params)
    from node.runtime import NodeRuntime, Stopped
    from node.settings import NodeSettings
    from node.island.task import IterableBatches, Model, Task
    from node.island.train import InnerLoop, RoundResult


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'node' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

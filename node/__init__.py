"""The training node: model (Flax NNX), data, the jitted inner loop, the synchronous baseline, and the
`diloco-node` runtime (rounds, outer steps through the ledger, join, checkpoints, status).

The networking glue (rounds, gossip, outer steps, CLI) builds on this API: `InnerLoop.set_params` /
`run` / `evaluate` / `state_dict`, parameters in flat form (`dict[str, np.ndarray]`), and `Dataset`.

Names are re-exported lazily (PEP 562): `import node` or `from node.config import ...` does not import
JAX, and `python -m node.train` does not import `node.train` twice.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_EXPORTS = {
    "node.baseline": ("CurvePoint", "run_baseline", "worker_keys"),
    "node.checkpoint": ("Checkpoint", "CheckpointDir", "CheckpointError"),
    "node.config": ("PRESETS", "Config", "ConfigError", "DataConfig", "InnerConfig", "ModelConfig", "preset"),
    "node.data": ("Batcher", "DataError", "Dataset", "MultiBatcher"),
    "node.model": ("Transformer", "build_model", "check_flat", "embedding_names", "flatten_params", "init_params",
                   "make_apply", "param_count", "param_shapes", "unflatten_params"),
    "node.runtime": ("NodeRuntime", "Stopped"),
    "node.settings": ("NodeSettings",),
    "node.train": ("InnerLoop", "RoundResult"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_MODULE_OF)

if TYPE_CHECKING:
    from node.baseline import CurvePoint, run_baseline, worker_keys
    from node.checkpoint import Checkpoint, CheckpointDir, CheckpointError
    from node.config import PRESETS, Config, ConfigError, DataConfig, InnerConfig, ModelConfig, preset
    from node.data import Batcher, DataError, Dataset, MultiBatcher
    from node.model import (Transformer, build_model, check_flat, embedding_names, flatten_params, init_params,
                            make_apply, param_count, param_shapes, unflatten_params)
    from node.runtime import NodeRuntime, Stopped
    from node.settings import NodeSettings
    from node.train import InnerLoop, RoundResult


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'node' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))

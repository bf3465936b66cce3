"""diloco as a library: train your own JAX model with peer-to-peer Decoupled DiLoCo.

    import diloco

    model = diloco.Model(name="mlp", init=init, loss=loss, lr=1e-3)      # init(key) -> params; loss(params, batch)
    task = diloco.Task(model, batches=my_batches, heldout=my_heldout, tokens_per_batch=64)
    raise SystemExit(diloco.run(task))   # the flags of diloco-node: --run-id, --key, --peers, --max-rounds, ...

`Model` also comes from a Flax NNX module (`diloco.Model.from_nnx(name, build, loss)`). `run` parses the command
line (or `argv`) exactly as `diloco-node` does, without the flags that choose diloco-node's own model (`--model`,
`--set`, `--data`), and runs one node: the inner loop on this host's devices, gossip of signed compressed
pseudo-gradients with its peers, and the outer step applied by every node. It prints `LISTENING ...` and
`STOPPED ...` lines and returns the exit status as `diloco-node` does (docs/library.md; examples/ holds
runnable examples). `start` runs the same node in the background and returns a handle on it:

    with diloco.start(task, ["--run-id", "r1", "--key", "node.key", "--max-rounds", "20"]) as node:
        print(node.status()["slot"], node.params()["dense.kernel"].shape)
        node.wait()
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Sequence
from typing import Any

from diloco.running import RunningNode, start
from node.island.task import IterableBatches, Model, Task, TaskDataError, TaskError, default_optimizer
from node.settings import NodeSettings
from protocol.ledger.rules import OuterRule, register_rule

__all__ = ["IterableBatches", "Model", "NodeSettings", "OuterRule", "RunningNode", "Task", "TaskDataError",
           "TaskError", "default_optimizer", "load", "register_rule", "run", "start"]


def run(task: Task, argv: Sequence[str] | None = None, *,
        on_metrics: Callable[[dict[str, Any]], object] | None = None) -> int:
    """Run one node training `task` with `diloco-node`'s command line (`argv`, default `sys.argv[1:]`);
    returns the exit status (0 after --max-rounds or a SIGTERM/SIGINT, 2 for bad arguments, 1 otherwise).
    `on_metrics(record)` is called after every round and at the end with the node's figures (a dict:
    round, slot, tokens, loss, eval_loss, eval_slot, tokens_per_second, bytes_sent, ...; `node.metrics`), in a
    worker thread: log them to the experiment tracker you use."""
    from node.cli import main

    if not isinstance(task, Task):
        print(f"diloco: error: run() needs a diloco.Task, got {type(task).__name__}", file=sys.stderr)
        return 2
    return main(argv, task=task, on_metrics=on_metrics)


def load(source: str | os.PathLike[str], model: Model | None = None) -> Any:
    """The run's global parameters from `source`: a node's `--checkpoint-dir` (its newest valid checkpoint), one
    `ckpt-*.dlc` file, or a `.safetensors` file `diloco-export` wrote. In flat form (a dict of float32 numpy
    arrays by dotted name); with `model`, checked against it and as the user's own object (`Model.restore`:
    the NNX module of a `from_nnx` model, else the pytree `init` returns). Raises `TaskError` for parameters
    that are not the model's, `node.checkpoint.CheckpointError` for a source that holds none."""
    from pathlib import Path

    from node.export import global_params, load_checkpoint, load_exported

    path = Path(source)
    flat = load_exported(path)[0] if path.suffix == ".safetensors" else global_params(load_checkpoint(path))
    return flat if model is None else model.restore(flat)

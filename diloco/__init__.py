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
runnable examples).
"""

from __future__ import annotations

from collections.abc import Sequence

from node.island.task import IterableBatches, Model, Task, default_optimizer

__all__ = ["IterableBatches", "Model", "Task", "default_optimizer", "run"]


def run(task: Task, argv: Sequence[str] | None = None) -> int:
    """Run one node training `task` with `diloco-node`'s command line (`argv`, default `sys.argv[1:]`);
    returns the exit status (0 after --max-rounds or a SIGTERM/SIGINT, 2 for bad arguments, 1 otherwise)."""
    from node.cli import main

    return main(argv, task=task)

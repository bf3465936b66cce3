"""Synchronous data-parallel baseline: what N workers would reach with a gradient all-reduce every step.

N workers, each with the per-node batch `B` from its own shard, averaging gradients every step, compute
exactly the gradient of the mean loss over their concatenated batch. So the baseline is the same model
and inner optimizer trained on a global batch of `N x B` sequences: batch `k` is the concatenation of
batch `k` of each worker's shard batcher (`MultiBatcher`), the same batches the DiLoCo nodes with those
shard keys draw. Run for `steps` steps it sees `N x steps x B x seq_len` tokens, as many as N DiLoCo
nodes running `steps` inner steps each. The held-out batches are the shared ones of `Dataset`.

Used by the quality benchmark and the testnet report (`run_baseline`), and runnable alone:
`python -m node.island.baseline --model tiny --workers 4 --steps 200`.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from collections.abc import Callable, Sequence

from typing import TYPE_CHECKING, Any

import jax
import numpy as np

from node.island.config import Config, ConfigError, preset
from node.island.data import DataError, Dataset, MultiBatcher
from node.island.train import BatchSource, InnerLoop

if TYPE_CHECKING:
    from node.island.task import Task

__all__ = ["ConcatSources", "CurvePoint", "run_baseline", "run_task_baseline", "worker_keys"]


@dataclasses.dataclass(frozen=True)
class CurvePoint:
    """Held-out bits per byte after `step` synchronous steps that consumed `tokens` tokens in total."""

    step: int
    tokens: int
    bits_per_byte: float


def worker_keys(n_workers: int) -> tuple[str, ...]:
    """Default shard keys of the baseline's workers (pass the real peer ids to match a testnet)."""
    return tuple(f"worker-{i}" for i in range(n_workers))


def run_baseline(config: Config, *, steps: int, shard_keys: Sequence[str], eval_every: int,
                 eval_batches: int = 8, dataset: Dataset | None = None,
                 devices: Sequence[jax.Device] | None = None,
                 on_point: Callable[[CurvePoint], None] | None = None) -> list[CurvePoint]:
    """Train synchronous data-parallel over `len(shard_keys)` workers for `steps` steps and return the
    held-out curve: a point at step 0, every `eval_every` steps, and at the end.

    Each worker contributes `config.data.batch_size` sequences per step from its shard
    (`dataset.batcher(key)`). `dataset` may be passed to reuse a loaded corpus; it must have been
    built from `config.data` and `config.model`. `on_point` is called with each point as it is measured.
    """
    if not shard_keys:
        raise ConfigError("the baseline needs at least one worker shard key")
    if steps < 0 or eval_every <= 0:
        raise ConfigError(f"need steps >= 0 and eval_every > 0, got steps={steps}, eval_every={eval_every}")
    if dataset is None:
        dataset = Dataset(config.data, seq_len=config.model.seq_len, vocab_size=config.model.vocab_size)
    per_node = config.data.batch_size
    batches = MultiBatcher([dataset.batcher(key, batch_size=per_node) for key in shard_keys])
    loop = InnerLoop.byte_lm(config, batches, devices=devices)
    return _curve(loop, dataset.heldout_batches(eval_batches, per_node), steps, eval_every, on_point)


def _curve(loop: InnerLoop, heldout: Sequence[Any], steps: int, eval_every: int,
           on_point: Callable[[CurvePoint], None] | None) -> list[CurvePoint]:
    """Train `loop` for `steps` steps; its held-out point at step 0, every `eval_every` steps and at the end."""
    points: list[CurvePoint] = []
    tokens = 0

    def measure() -> None:
        points.append(CurvePoint(step=loop.step, tokens=tokens, bits_per_byte=loop.evaluate(heldout)))
        if on_point is not None:
            on_point(points[-1])

    measure()
    while loop.step < steps:
        tokens += loop.run(min(eval_every, steps - loop.step)).tokens
        measure()
    return points


class ConcatSources:
    """N batch sources drawn in lockstep, each batch the concatenation of theirs on the leading axis: the
    global batch of synchronous data parallelism for a library `Task` (`MultiBatcher` for the byte model)."""

    def __init__(self, sources: Sequence[BatchSource]) -> None:
        self.sources = list(sources)
        self.position = 0

    @staticmethod
    def _concat(batches: Sequence[Any]) -> Any:
        return jax.tree_util.tree_map(lambda *xs: np.concatenate([np.asarray(x) for x in xs]), *batches)

    def example(self) -> Any:
        return self._concat([s.example() for s in self.sources])

    def next_batch(self) -> Any:
        self.position += 1
        return self._concat([s.next_batch() for s in self.sources])

    def seek(self, position: int) -> None:
        for s in self.sources:
            s.seek(position)
        self.position = int(position)


def run_task_baseline(task: Task, *, steps: int, shard_keys: Sequence[str], eval_every: int, seed: int = 0,
                      on_point: Callable[[CurvePoint], None] | None = None) -> list[CurvePoint]:
    """`run_baseline` for a library `Task`: its model and optimizer on the concatenated batches of the
    workers `shard_keys` (each `task.open(key)`, as the nodes of those peer ids read them), evaluated on the
    task's held-out batches (`CurvePoint.bits_per_byte` is then the model's own metric)."""
    if not shard_keys or steps < 0 or eval_every <= 0:
        raise ConfigError(f"need workers, steps >= 0 and eval_every > 0, got {len(shard_keys)}, {steps}, {eval_every}")
    opened = [task.open(key) for key in shard_keys]
    loop = InnerLoop(task.model, ConcatSources([source for source, _ in opened]), seed=seed,
                     tokens_per_batch=len(shard_keys) * task.tokens_per_batch)
    return _curve(loop, opened[0][1], steps, eval_every, on_point)


def main(argv: Sequence[str] | None = None) -> int:
    """Print the baseline's held-out curve for a preset."""
    p = argparse.ArgumentParser(prog="python -m node.island.baseline", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--eval-every", type=int, default=50)
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE")
    args = p.parse_args(argv)
    try:
        config = preset(args.model).with_overrides_from_strings(args.overrides)
        print(f"sync data-parallel: {args.workers} workers x batch {config.data.batch_size}, {args.steps} steps")
        run_baseline(config, steps=args.steps, shard_keys=worker_keys(args.workers), eval_every=args.eval_every,
                     on_point=lambda pt: print(f"step {pt.step:6d} | tokens {pt.tokens:>11,} | "
                                               f"held-out {pt.bits_per_byte:.3f} bpb", flush=True))
    except (ConfigError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

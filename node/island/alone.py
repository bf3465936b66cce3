"""One island training alone, no network: `python -m node.island.train` (or `python -m node.island.alone`)
prints throughput, loss and held-out bits per byte; `--bench` times `InnerLoop.run` against the bare jitted
step (`measure_rates`, which `testnet.benchmarks.inner` reports too)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

import jax
import numpy as np

from node.island.bytelm import byte_lm_task
from node.island.config import Config, ConfigError, preset
from node.island.data import DataError, resolve_vocab
from node.island.train import InnerLoop

__all__ = ["bench", "main", "measure_rates"]


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m node.island.train", description="Train one island alone (no network).")
    p.add_argument("--model", default="tiny", help="preset: tiny, small, base, large (default tiny)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--data", action="append", default=[], help="text/.npy/.bin file, folder or glob (repeatable)")
    p.add_argument("--shard-key", default="", help="shard of the train split to read (default: all)")
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--bench", action="store_true",
                   help="measure InnerLoop.run against the bare jitted step and print the ratio")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. d_model=96 lr=1e-3")
    return p.parse_args(argv)


def _bare_steps_per_second(loop: InnerLoop, steps: int) -> float:
    """The same compiled step on one pre-placed batch: no sampling, no transfer, no bookkeeping."""
    batch = jax.device_put(loop.batches.next_batch(), loop._by_batch)
    params, opt_state = loop._params, loop._opt_state
    start = time.perf_counter()
    for _ in range(steps):
        params, opt_state, loss = loop._train_step(params, opt_state, batch)
    loss.block_until_ready()
    loop._params, loop._opt_state = params, opt_state
    return steps / (time.perf_counter() - start)


def measure_rates(loop: InnerLoop, steps: int, repeats: int = 8) -> tuple[float, float]:
    """Steps/s of `InnerLoop.run` and of the bare jitted step: medians over `repeats` rounds of `steps`
    steps each, interleaved A-B-B-A so that load from other processes hits both alike (after two warm-up
    steps that compile)."""
    loop.run(2)
    loop_rates, bare_rates = [], []

    def ours() -> None:
        r = loop.run(steps)
        loop_rates.append(r.steps / r.seconds)

    def bare() -> None:
        bare_rates.append(_bare_steps_per_second(loop, steps))

    for i in range(repeats):
        for measure in (ours, bare) if i % 2 == 0 else (bare, ours):
            measure()
    return float(np.median(loop_rates)), float(np.median(bare_rates))


def bench(loop: InnerLoop, steps: int, repeats: int = 8) -> None:
    """Print `measure_rates`: InnerLoop.run steps/s, bare-step steps/s and their ratio."""
    ours, bare = measure_rates(loop, steps, repeats)
    tokens = loop.tokens_per_batch
    print(f"InnerLoop.run {ours:.1f} steps/s ({ours * tokens:,.0f} tok/s) | bare jitted step {bare:.1f} steps/s "
          f"| ratio {ours / bare:.3f} (median of {repeats} x {steps} steps)", flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Train one island for `--steps`, printing throughput, loss and held-out bits per byte."""
    args = _parse_args(argv)
    try:
        cfg: Config = preset(args.model).with_overrides_from_strings(args.overrides)
        cfg = cfg.with_overrides(shard_key=args.shard_key, **({"sources": tuple(args.data)} if args.data else {}))
        cfg = resolve_vocab(cfg, args.overrides)  # vocab_size from the data unless set
        horizon_given = any(o.partition("=")[0].strip().endswith("total_steps") for o in args.overrides)
        if not horizon_given and args.steps > cfg.inner.warmup_steps:  # decay over this run unless told
            cfg = cfg.with_overrides(total_steps=args.steps)
        task = byte_lm_task(cfg, args.eval_batches)
        batches, heldout = task.open(cfg.data.shard_key)
        loop = InnerLoop(task.model, batches, seed=cfg.inner.init_seed, tokens_per_batch=task.tokens_per_batch)
    except (ConfigError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"model {args.model}: {task.model.param_count:,} params, {loop.mesh.devices.size} {jax.default_backend()} "
          f"device(s), batch {cfg.data.batch_size} x {cfg.model.seq_len}; train shard {len(loop.batches.stream):,}"
          f" tokens", flush=True)
    if args.bench:
        bench(loop, args.steps)
        return 0
    print(f"step {0:6d} | held-out {loop.evaluate(heldout):.3f} bpb", flush=True)
    first = loop.run(1)
    print(f"step {first.step:6d} | loss {first.mean_loss:.3f} | first step (compiles) {first.seconds:.1f} s",
          flush=True)
    while loop.step < args.steps:
        r = loop.run(min(args.log_every - loop.step % args.log_every, args.steps - loop.step))
        print(f"step {r.step:6d} | loss {r.mean_loss:.3f} | {r.steps / r.seconds:6.1f} steps/s | "
              f"{r.tokens / r.seconds:9,.0f} tok/s | lr {loop.learning_rate():.2e}", flush=True)
        if r.step % args.eval_every < r.steps or r.step == args.steps:
            print(f"step {r.step:6d} | held-out {loop.evaluate(heldout):.3f} bpb", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

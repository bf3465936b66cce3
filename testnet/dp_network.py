"""Synchronous data-parallel that really talks: N processes, one per host, their gradients all-reduced over the
network every step by JAX's own collectives (`jax.distributed`; gloo over TCP on CPU devices).

It is the testnet's data-parallel baseline (`node.island.baseline`: the same model, optimizer, data shards and
held-out batches, a global batch of N × the nodes' batch) run as one island of N processes
(`node.island.multihost`): one mesh `data=N` over every process's device, so XLA all-reduces the gradients
across the processes inside each step. Process 0 draws the global batch and shares it with the others (the
island's one data path: see "What it costs" below); every process trains its part of the batch.

    python -m testnet.dp_network --coordinator HOST:PORT --num-processes N --process-id I \\
        --model tiny --steps S --eval-every E --out FILE     # on each host (each namespace)

Process 0 writes `FILE` (JSON) after every evaluation: `{"points": [[seconds, step, tokens, bits_per_byte], ...],
"step_seconds": [...], "processes": N, "finished": bool}`, `seconds` counted from the first step (compilation
and the first evaluation before it), `step_seconds` the wall time of each chunk of steps between evaluations
divided by its steps (evaluations excluded). `--max-seconds` ends the training early (a baseline over a slow
link may need hours to reach the target; its steps per second are what the benchmark needs).

What it costs beyond the all-reduce: the batch share (≤ 256 KiB for the tiny model's global batch, through
the coordination service's key-value store) crosses the link once per step on its way to every process but
process 0, adding about one one-way delay per step that data-parallel with host-local data would not pay.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main"]


def _write(out: Path, record: dict) -> None:
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(out)


def _train(args: argparse.Namespace, island) -> None:
    from node.island.baseline import worker_keys
    from node.island.data import Dataset, MultiBatcher
    from node.island.train import InnerLoop
    from testnet.baseline_run import baseline_config

    config = baseline_config(args.model, args.data, args.seed, args.overrides)
    dataset = Dataset(config.data, seq_len=config.model.seq_len, vocab_size=config.model.vocab_size)
    per_node = config.data.batch_size
    keys = args.shard_keys or worker_keys(island.process_count)
    batches = MultiBatcher([dataset.batcher(key, batch_size=per_node) for key in keys])
    loop = InnerLoop.byte_lm(config, batches)
    heldout = dataset.heldout_batches(args.eval_batches, per_node)
    record = {"points": [], "step_seconds": [], "processes": island.process_count, "finished": False,
              "shard_keys": list(keys), "steps": args.steps, "mesh": str(loop.mesh_shape)}
    record["points"].append([0.0, 0, 0, loop.evaluate(heldout)])
    loop.warm_up()
    _write(args.out, record)
    start, tokens = time.monotonic(), 0
    print(f"data-parallel over {island.process_count} processes, mesh {loop.mesh_shape}: {args.steps} steps",
          flush=True)
    while loop.step < args.steps and time.monotonic() - start < args.max_seconds:
        chunk = min(args.eval_every, args.steps - loop.step)
        t0 = time.monotonic()
        tokens += loop.run(chunk).tokens
        record["step_seconds"].append((time.monotonic() - t0) / chunk)
        bpb = loop.evaluate(heldout)
        record["points"].append([time.monotonic() - start, loop.step, tokens, bpb])
        _write(args.out, record)
        print(f"step {loop.step} | tokens {tokens:,} | held-out {bpb:.3f} bpb | "
              f"{record['step_seconds'][-1]:.3f} s/step", flush=True)
    record["finished"] = True
    _write(args.out, record)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m testnet.dp_network", description=__doc__.splitlines()[0])
    p.add_argument("--coordinator", required=True, metavar="HOST:PORT", help="process 0's host and a free port")
    p.add_argument("--num-processes", type=int, required=True)
    p.add_argument("--process-id", type=int, required=True)
    p.add_argument("--model", default="tiny")
    p.add_argument("--data", action="append", default=[], help="as diloco-node --data (default: the embedded text)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--eval-every", type=int, default=20)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--shard-keys", nargs="*", default=None, help="the workers' shard keys (default worker-0 ...)")
    p.add_argument("--max-seconds", type=float, default=float("inf"))
    p.add_argument("--out", type=Path, default=Path("dp_network.json"), help="process 0's curve (JSON)")
    args = p.parse_args(argv)
    from node.island import multihost
    from node.island.follow import follow

    island = multihost.join(args.coordinator, args.num_processes, args.process_id, heartbeat_timeout_s=30)
    if not island.speaks:
        follow(island)
        return 0
    try:
        _train(args, island)
    finally:
        island.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())

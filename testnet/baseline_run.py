"""The synchronous data-parallel baseline of a testnet run: an adapter around `node.island.baseline.run_baseline`
(the one implementation, shared with the node's quality benchmark), run in a child process.

Same model preset and data as the nodes, one worker per node with the node's peer id as shard key
(nodes shard their data by peer id), and as many tokens as the nodes trained in total:
`steps = tokens / (nodes × batch_size × seq_len)`. The child writes `baseline.json`:
`{"points": [[step, tokens, bits_per_byte], ...], "steps", "shard_keys", "seconds", "config"}`.
Its wall-time axis under failures is derived in the report (`testnet.report.stretch`), since a failure
stalls data-parallel training without changing what it computes.

The config is the node's own: `node.settings.NodeSettings.ml_config` (preset, `--set` overrides, `--seed` as
the initial parameters' and data order's seed, `--data`), so the two cannot drift apart; held-out bits per byte use
the same `--eval-batches` fixed batches as the nodes.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path


from testnet.nodes import node_env
from testnet.procs import GroupRegistry, LineReader, drain_to_log, log_tail, spawn, stop_processes

__all__ = ["BaselineError", "baseline_argv", "baseline_config", "baseline_steps", "main", "run_baseline_child"]


class BaselineError(RuntimeError):
    """The baseline child failed; the message quotes its log."""


def baseline_config(model: str, data: Sequence[str], seed: int,
                    overrides: Sequence[str] = ()):  # -> node.island.config.Config
    """The nodes' training config (their `NodeSettings.ml_config`, with the nodes' `--set` overrides;
    the shard key is set per worker)."""
    from node.settings import NodeSettings

    settings = NodeSettings(run_id="baseline", key_path=Path("unused.key"), model=model, data=tuple(data), seed=seed,
                            overrides=tuple(overrides))
    return settings.ml_config(shard_key="")


def baseline_steps(total_tokens: float, nodes: int, model: str, overrides: Sequence[str] = ()) -> int:
    """Synchronous steps that consume `total_tokens` with `nodes` workers at the nodes' batch."""
    cfg = baseline_config(model, (), 0, overrides)
    return max(1, round(total_tokens / (nodes * cfg.data.batch_size * cfg.model.seq_len)))


def baseline_argv(*, model: str, data: Sequence[str], seed: int, steps: int, shard_keys: Sequence[str], out: Path,
                  eval_batches: int, eval_every: int | None = None, overrides: Sequence[str] = ()) -> list[str]:
    every = eval_every or max(1, steps // 40)
    argv = [sys.executable, "-m", "testnet.baseline_run", "--model", model, "--seed", str(seed), "--steps", str(steps),
            "--eval-every", str(every), "--eval-batches", str(eval_batches), "--shard-keys", ",".join(shard_keys),
            "--out", str(out)]
    for item in overrides:
        argv += ["--set", item]
    return argv + (["--data", ",".join(data)] if data else [])


async def run_baseline_child(argv: Sequence[str], log_path: Path, registry: GroupRegistry) -> None:
    """Run the baseline child to completion, its output in `log_path`. Stopped (with its process group)
    if cancelled. Raises BaselineError quoting the log if it fails."""
    process = await spawn(argv, log_path, registry, env=node_env())
    try:
        await drain_to_log(LineReader(process.stdout), log_path)
        rc = await process.wait()
    finally:
        await stop_processes([process], registry, grace=2.0)
    if rc != 0:
        raise BaselineError(f"the data-parallel baseline exited with status {rc}; last lines of {log_path}:\n"
                           f"{log_tail(log_path)}")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the baseline and write its curve as JSON (see module doc)."""
    p = argparse.ArgumentParser(prog="python -m testnet.baseline_run", description=__doc__.splitlines()[0])
    p.add_argument("--model", default="tiny")
    p.add_argument("--data", default="", help="comma-separated sources (default: the embedded corpus)")
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--eval-batches", type=int, default=4)
    p.add_argument("--shard-keys", required=True, help="comma-separated: one worker per key (the nodes' peer ids)")
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="config override, as the nodes' --set (repeatable)")
    args = p.parse_args(argv)
    from node.island.baseline import run_baseline
    from node.island.config import ConfigError
    from node.island.data import DataError

    keys = [k for k in args.shard_keys.split(",") if k]
    data = [d for d in args.data.split(",") if d]
    started = time.time()
    try:
        cfg = baseline_config(args.model, data, args.seed, args.overrides)
        print(f"data-parallel baseline: {len(keys)} workers x batch {cfg.data.batch_size}, {args.steps} steps",
              flush=True)
        points = run_baseline(cfg, steps=args.steps, shard_keys=keys, eval_every=args.eval_every,
                              eval_batches=args.eval_batches,
                              on_point=lambda pt: print(f"step {pt.step} tokens {pt.tokens} bpb {pt.bits_per_byte:.4f}",
                                                        flush=True))
    except (ConfigError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args.out.write_text(json.dumps({
        "points": [[pt.step, pt.tokens, pt.bits_per_byte] for pt in points], "steps": args.steps,
        "shard_keys": keys, "seconds": time.time() - started, "config": cfg.as_dict()}) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

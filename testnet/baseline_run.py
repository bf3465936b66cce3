"""The synchronous data-parallel baseline of a testnet run: an adapter around `node.island.baseline.run_baseline`
(the one implementation, shared with the node's quality benchmark), run in a child process.

Same model preset and data as the nodes, one worker per node with the node's peer id as shard key
(nodes shard their data by peer id), and as many tokens as the nodes trained in total:
`steps = tokens / (nodes × batch_size × seq_len)`. The child writes `baseline.json`:
`{"points": [[step, tokens, bits_per_byte], ...], "steps", "finished", "shard_keys", "seconds", "config"}`,
after every evaluation with `finished` false, at the end with `finished` true, so a baseline stopped
half-way (Ctrl-C) leaves the curve it trained. Its stdout lines drive `BaselineProgress` on the terminal.
Its wall-time axis under failures is derived in the report (`testnet.report.stretch`), since a failure
stalls data-parallel training without changing what it computes.

The config is the node's own: `node.settings.NodeSettings.ml_config` (preset, `--set` overrides, `--seed` as
the initial parameters' and data order's seed, `--data`), so the two cannot drift apart; held-out bits per byte use
the same `--eval-batches` fixed batches as the nodes.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path


from testnet.nodes import node_env
from testnet.procs import GroupRegistry, LineReader, drain_to_log, log_tail, spawn, stop_processes

__all__ = ["BaselineError", "BaselineProgress", "baseline_argv", "baseline_config", "baseline_steps", "main",
           "run_baseline_child"]


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


class BaselineProgress:
    """The baseline's progress on the terminal, from its child's stdout (`step N tokens T bpb X` after each
    evaluation): one line when it starts training (the first point, after compiling), then at most one every
    `every` seconds, and one at its last step: steps done of `steps`, tokens, the last held-out bpb, seconds
    since the child started, and the time left at the pace measured since the first point."""

    def __init__(self, steps: int, say: Callable[[str], None], *, every: float = 10.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.steps, self._say, self._every, self._clock = steps, say, every, clock
        self._t0 = clock()
        self._first: tuple[float, int] | None = None  # (time, step) of the first point
        self._last_said = -float("inf")

    def line(self, text: str) -> None:
        """Hand one line of the child's output (others than the point lines are ignored)."""
        match = _POINT.fullmatch(text.strip())
        if match is None:
            return
        step, tokens, bpb = int(match[1]), int(match[2]), float(match[3])
        now = self._clock()
        if self._first is None:
            self._first = (now, step)
        elif now - self._last_said < self._every and step < self.steps:
            return
        self._last_said = now
        t_first, s_first = self._first
        left = ""
        if step > s_first and step < self.steps:
            left = f", about {(self.steps - step) * (now - t_first) / (step - s_first):.0f} s left"
        self._say(f"data-parallel baseline: step {step:,}/{self.steps:,} ({step / self.steps:.0%}), {tokens:,} tokens, "
                  f"held-out bpb {bpb:.3f}, {now - self._t0:.0f} s{left}")


_POINT = re.compile(r"step (\d+) tokens (\d+) bpb ([0-9.]+)")


async def run_baseline_child(argv: Sequence[str], log_path: Path, registry: GroupRegistry,
                             on_line: Callable[[str], None] = lambda line: None) -> None:
    """Run the baseline child to completion, its output in `log_path` (and each stdout line handed to
    `on_line`, e.g. `BaselineProgress.line`). Stopped (with its process group) if cancelled or interrupted.
    Raises BaselineError quoting the log if it fails."""
    process = await spawn(argv, log_path, registry, env=node_env())
    try:
        await drain_to_log(LineReader(process.stdout), log_path, on_line)
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
    points: list[list] = []

    def write(cfg, finished: bool) -> None:  # atomically: a reader never sees half a file
        tmp = args.out.with_name(args.out.name + ".tmp")
        tmp.write_text(json.dumps({"points": points, "steps": args.steps, "finished": finished, "shard_keys": keys,
                                   "seconds": time.time() - started, "config": cfg.as_dict()}) + "\n")
        os.replace(tmp, args.out)

    def on_point(cfg, pt) -> None:
        points.append([pt.step, pt.tokens, pt.bits_per_byte])
        write(cfg, finished=False)  # an interrupted baseline leaves the curve it trained
        print(f"step {pt.step} tokens {pt.tokens} bpb {pt.bits_per_byte:.4f}", flush=True)

    try:
        cfg = baseline_config(args.model, data, args.seed, args.overrides)
        print(f"data-parallel baseline: {len(keys)} workers x batch {cfg.data.batch_size}, {args.steps} steps",
              flush=True)
        run_baseline(cfg, steps=args.steps, shard_keys=keys, eval_every=args.eval_every,
                     eval_batches=args.eval_batches, on_point=lambda pt: on_point(cfg, pt))
    except (ConfigError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write(cfg, finished=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

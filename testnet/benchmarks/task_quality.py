"""A user's own model at diloco's defaults: N learners against data-parallel at equal tokens, for library Tasks.

Each task is a `diloco.Task` made by a function of a Python file (`FILE:FUNCTION`; by default the three of
`examples/`: a plain-JAX MLP, a Flax NNX convolutional network, a character-level transformer). For each task
and each N, the outer algorithm runs in one process on a simulated clock (`testnet.benchmarks.quality`'s
`Simulation`, "eager" mode, the node's): N real `InnerLoop`s on the task's own model, optimizer and batches
(learner i reads the shard of `worker-i`), the int4 codec with error feedback, and one real `Ledger` each
with the ledger settings a `diloco-node` of that task uses (`node.settings.ledger_config`: the update bounds
included). Data-parallel is the same model and optimizer on the N learners' batches concatenated, for as
many steps as the learners took on average (`node.island.baseline.run_task_baseline`). The figure is
held-out (the task's metric) of the learners' final global parameters ÷ data-parallel's.

    python -m testnet.benchmarks.task_quality --nodes 3 6 --rounds 40 --inner-steps 25 --json out.json

`--outer-lr`, `--outer-momentum`, `--step-rms` (the per-element bound on an update, × the task's lr;
0: none) and `--norm-clip` override the node's defaults, to see which knobs matter. A function that accepts
`total_steps` is given the run's length (rounds × H), so its learning-rate schedule spans the run, as a user
who sets it would.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import inspect
import json
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DEFAULT_TASKS = ("examples/mlp_spirals.py:task", "examples/nnx_bars.py:task", "examples/char_transformer.py:task")


def load_task(spec: str, total_steps: int) -> Any:
    """The Task that `FILE:FUNCTION` makes (FILE relative to the repository when it is not found as given)."""
    path_text, _, function = spec.rpartition(":")
    path = Path(path_text)
    if not path.exists():
        path = REPO / path_text
    module_spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    make = getattr(module, function)
    kwargs = {"total_steps": total_steps} if "total_steps" in inspect.signature(make).parameters else {}
    return make(**kwargs)


def node_ledger_config(task: Any, inner_steps: int, step_rms: float | None, norm_clip: float | None) -> Any:
    """The ledger settings a `diloco-node` training `task` uses, with the overrides asked for."""
    from node.settings import NodeSettings, ledger_config

    settings = NodeSettings(run_id="bench", key_path=Path("unused.key"), inner_steps=inner_steps)
    config = ledger_config(settings, task)
    if step_rms is not None:
        config = dataclasses.replace(config, max_step_rms=step_rms * task.model.lr if step_rms > 0 else None)
    if norm_clip is not None:
        config = dataclasses.replace(config, norm_clip=norm_clip)
    return config


def measure(spec: str, nodes: int, a: argparse.Namespace) -> dict[str, Any]:
    from node.island.baseline import run_task_baseline, worker_keys
    from node.settings import NodeSettings
    from testnet.benchmarks.quality import Simulation

    task = load_task(spec, a.rounds * a.inner_steps)
    defaults = NodeSettings(run_id="bench", key_path=Path("unused.key"))
    outer_lr = a.outer_lr if a.outer_lr is not None else defaults.outer_lr
    outer_momentum = a.outer_momentum if a.outer_momentum is not None else defaults.outer_momentum
    ledger = node_ledger_config(task, a.inner_steps, a.step_rms, a.norm_clip)
    started = time.perf_counter()
    sim = Simulation("eager", workers=nodes, inner_steps=a.inner_steps, speeds=[a.speed] * nodes,
                     latency=a.latency, codec=a.codec, seed=a.seed, outer_lr=outer_lr, outer_momentum=outer_momentum,
                     task=task, ledger_config=ledger, hold=a.hold)
    ours = sim.run(a.rounds)
    steps = round(ours["tokens"] / (nodes * task.tokens_per_batch))
    dp = run_task_baseline(task, steps=steps, shard_keys=worker_keys(nodes), eval_every=max(1, steps),
                           seed=a.seed)[-1].bits_per_byte
    return {"task": task.model.name, "spec": spec, "nodes": nodes, "inner_steps": a.inner_steps, "rounds": a.rounds,
            "outer_lr": outer_lr, "outer_momentum": outer_momentum, "max_step_rms": ledger.max_step_rms,
            "norm_clip": ledger.norm_clip, "metric": task.model.metric, "ours": ours["bpb"], "dp": dp,
            "ratio": ours["bpb"] / dp, "steps_per_learner": steps, "spread": ours["spread"],
            "updates_per_slot_at_close": ours["at_close"], "seconds": time.perf_counter() - started}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m testnet.benchmarks.task_quality", description=__doc__.splitlines()[0])
    p.add_argument("--task", action="append", default=None, metavar="FILE:FUNCTION",
                   help=f"a function returning a diloco.Task (repeatable; default: {', '.join(DEFAULT_TASKS)})")
    p.add_argument("--nodes", type=int, nargs="+", default=[3, 6])
    p.add_argument("--rounds", type=int, default=40, help="rounds of every learner (default %(default)s)")
    p.add_argument("--inner-steps", type=int, default=25, help="H (default %(default)s)")
    p.add_argument("--latency", type=int, default=2, help="steps from publish to arrival (default %(default)s)")
    p.add_argument("--hold", type=int, default=None, help="steps a slot waits for due updates (default H/2)")
    p.add_argument("--speed", type=float, default=1.0, help="every learner's chance of a step per tick")
    p.add_argument("--codec", default="int4")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--outer-lr", type=float, default=None, help="default: the node's")
    p.add_argument("--outer-momentum", type=float, default=None, help="default: the node's")
    p.add_argument("--step-rms", type=float, default=None,
                   help="per-element RMS bound of an update per inner step, x the task's lr (0: none; default: "
                        "the node's)")
    p.add_argument("--norm-clip", type=float, default=None, help="default: the node's")
    p.add_argument("--json", type=Path, default=None, help="write the rows to this file")
    a = p.parse_args(argv)
    measure_all(a.task or DEFAULT_TASKS, a, measure, lambda row: (
        f"outer lr {row['outer_lr']} momentum {row['outer_momentum']} step rms {row['max_step_rms']} "
        f"({row['seconds']:.0f} s)"))
    return 0


def measure_all(specs: Sequence[str], a: argparse.Namespace, measure_one: Callable[[str, int, Any], dict[str, Any]],
                details: Callable[[dict[str, Any]], str]) -> list[dict[str, Any]]:
    """`measure_one(spec, nodes, a)` for every task and every `a.nodes`, a line each (the ratio, then
    `details(row)`), the rows written to `a.json` when given."""
    rows = []
    for spec in specs:
        for nodes in a.nodes:
            row = measure_one(spec, nodes, a)
            rows.append(row)
            print(f"{row['task']:18s} N={nodes:<2d} H={a.inner_steps} rounds={a.rounds}: {row['metric']} ours "
                  f"{row['ours']:.4f} dp {row['dp']:.4f} ratio {row['ratio']:.4f} | {details(row)}", flush=True)
    if a.json is not None:
        a.json.write_text(json.dumps(rows, indent=1))
    return rows


if __name__ == "__main__":
    sys.exit(main())

"""A user's own model as real processes: N nodes of a library program on loopback against data-parallel at
equal tokens.

The program is run as its user runs it (`python PROGRAM --run-id ... --peers ...`, every node a process, the
first one the bootstrap peer), with `--max-rounds R --inner-steps H` and otherwise diloco's defaults. When all
have printed `STOPPED` (equal digests expected), the run's final global parameters are read from the first
node's checkpoint (`node.export.global_params`) and evaluated in this process on the task's held-out batches;
data-parallel is the task's model and optimizer on the nodes' own shards (their peer ids) concatenated, for as
many steps as the nodes took on average (their last `/status`, `node.status.LAST_STATUS`), `node.island.baseline.run_task_baseline`.

    python -m testnet.benchmarks.task_nodes --task examples/char_transformer.py:task --nodes 3 --rounds 40

`--late S` starts the last node S seconds after the first (a node joining a running training).
`--task FILE:FUNCTION` names the program (FILE, which must end in `diloco.run`) and the function that makes
its Task for the evaluation; `-- ARGS` after everything are passed to every node (e.g. the program's own flags).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from node.status import LAST_STATUS
from testnet.benchmarks.task_quality import REPO, load_task, measure_all


def _start(program: Path, work: Path, name: str, args: Sequence[str]) -> tuple[subprocess.Popen, Path]:
    log = work / f"{name}.log"
    # one compilation cache for every node and run: start-up takes seconds, so the nodes join at about the same
    # time whatever the machine's load (a cold compile of tens of seconds made the late nodes' rounds vary)
    cache = Path(tempfile.gettempdir()) / "diloco-task-nodes-jax-cache"
    env = {**os.environ, "PYTHONPATH": str(REPO), "JAX_PLATFORMS": "cpu", "JAX_COMPILATION_CACHE_DIR": str(cache),
           "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0", "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
    cmd = [sys.executable, str(program), "--run-id", "bench", "--key", str(work / f"{name}.key"),
           "--listen", "127.0.0.1:0", "--http", "127.0.0.1:0", "--checkpoint-dir", str(work / name), *args]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log.open("w"), text=True, env=env, cwd=REPO)
    return proc, log


def _line(proc: subprocess.Popen, prefix: str, log: Path, timeout_s: float = 900.0) -> str:
    """The node's first stdout line starting with `prefix`; RuntimeError if it exits or stays silent."""
    timer = threading.Timer(timeout_s, proc.kill)  # a node that waits forever (a run that ended without it)
    timer.start()
    try:
        for line in proc.stdout:
            if line.startswith(prefix):
                return line.strip()
    finally:
        timer.cancel()
    raise RuntimeError(f"the node exited or waited {timeout_s:.0f} s before {prefix}: {log.read_text()[-2000:]}")


def run_nodes(spec: str, nodes: int, rounds: int, inner_steps: int, extra: Sequence[str], work: Path,
              late_s: float = 0.0) -> dict[str, Any]:
    program = Path(spec.rpartition(":")[0])
    program = program if program.exists() else REPO / program
    common = ["--max-rounds", str(rounds), "--inner-steps", str(inner_steps), *extra]
    started = time.perf_counter()
    first, first_log = _start(program, work, "node-0", common)
    listening = _line(first, "LISTENING ", first_log).split()
    procs = [(first, first_log, listening[1])]
    for i in range(1, nodes):
        if i == nodes - 1 and late_s:
            time.sleep(late_s)  # the last node joins a running training
        proc, log = _start(program, work, f"node-{i}", [*common, "--peers", listening[2]])
        procs.append((proc, log, _line(proc, "LISTENING ", log).split()[1]))
    try:
        stopped = [_line(proc, "STOPPED ", log) for proc, log, _ in procs]
    except RuntimeError:
        for proc, _, _ in procs:
            proc.kill()
        raise
    codes = [proc.wait(timeout=120) for proc, _, _ in procs]
    wall = time.perf_counter() - started
    status = [json.loads((work / f"node-{i}" / LAST_STATUS).read_text()) for i in range(nodes)]
    return {"stopped": stopped, "exit_codes": codes, "wall_s": wall, "peer_ids": [p for _, _, p in procs],
            "inner_steps": [s["inner_steps"] for s in status], "rounds": [s["round"] for s in status],
            "final_slot": [s["slot"] for s in status], "eval_loss": [s["eval_loss"] for s in status]}


def measure(spec: str, nodes: int, a: argparse.Namespace) -> dict[str, Any]:
    import numpy as np

    from node.export import global_params, load_checkpoint
    from node.island.baseline import run_task_baseline
    from node.island.train import InnerLoop

    work = Path(tempfile.mkdtemp(prefix="task-nodes-"))
    try:
        run = run_nodes(spec, nodes, a.rounds, a.inner_steps, a.node_args, work, a.late)
        params = global_params(load_checkpoint(work / "node-0"))
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    run["work"] = str(work)
    task = load_task(spec, a.rounds * a.inner_steps)
    source, heldout = task.open(run["peer_ids"][0])
    ours = InnerLoop(task.model, source, tokens_per_batch=task.tokens_per_batch).evaluate(heldout, params=params)
    steps = round(float(np.mean(run["inner_steps"])))
    dp = run_task_baseline(task, steps=steps, shard_keys=run["peer_ids"], eval_every=max(1, steps))[-1].bits_per_byte
    return {"task": task.model.name, "spec": spec, "nodes": nodes, "rounds": a.rounds, "inner_steps": a.inner_steps,
            "node_args": list(a.node_args), "late_s": a.late, "metric": task.model.metric, "ours": ours, "dp": dp, "ratio": ours / dp,
            "steps_per_node": steps, "agreed": len(set(run["stopped"])) == 1, **run}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    node_args = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(prog="python -m testnet.benchmarks.task_nodes", description=__doc__.splitlines()[0])
    p.add_argument("--task", action="append", required=True, metavar="FILE:FUNCTION")
    p.add_argument("--nodes", type=int, nargs="+", default=[3])
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--inner-steps", type=int, default=25)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--keep", action="store_true", help="keep the nodes' logs and checkpoints")
    p.add_argument("--late", type=float, default=0.0, metavar="SECONDS",
                   help="start the last node this long after the first one's LISTENING (a late joiner)")
    a = p.parse_args(argv)
    a.node_args = node_args
    measure_all(a.task, a, measure, lambda row: (
        f"{' '.join(node_args)} steps/node {row['steps_per_node']} (each {row['inner_steps']}), rounds "
        f"{row['rounds']}, slots {row['final_slot']}, agreed {row['agreed']}, {row['wall_s']:.0f} s"))
    return 0


if __name__ == "__main__":
    sys.exit(main())

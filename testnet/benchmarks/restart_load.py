"""Benchmark: what a joining (or restarting) node spends before it contributes, alone and beside training nodes.

Run: ``python -m testnet.benchmarks.restart_load [--load 5] [--inner-steps 50] [--repeat 2] [--out DIR]``.

Starts ``--load`` real ``diloco-node`` processes of one run on loopback (a founder and joiners, tiny model,
JAX's persistent compilation cache shared, as the testnet does), waits until they train, then starts one more
node with ``--peers`` and a checkpoint directory ``--repeat`` times (the second and later starts resume from
its checkpoint, as a restart does) and prints, for each start, the wall time and the process's CPU time
(``/proc/<pid>/stat``) when it printed ``LISTENING``, when its steps were compiled (from the cache after the
first start; the state sync runs beside it) and when it published its first update. ``--load 0`` measures the same start on an idle machine: the ratio of the
two wall times is what the other processes' training costs a restart. Every process is pinned to an equal
share of the cores, as the testnet pins its nodes (``testnet.cpus``; ``--no-pin-cpus``: the kernel shares
them by thread). Figures in BENCHMARKS.md (issue 13).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from testnet.cpus import pinning
from testnet.nodes import node_env

MARKS = ("LISTENING", "compiled in", "published update")  # the node's own log lines, in the order they come
_CLK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process so far."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _CLK


def node_argv(key: Path, checkpoints: Path, inner_steps: int, peers: str | None, listen: str) -> list[str]:
    argv = [sys.executable, "-m", "node.cli", "--run-id", "restart-load", "--key", str(key), "--listen", listen,
            "--inner-steps", str(inner_steps), "--checkpoint-dir", str(checkpoints), "--eval-every", "0"]
    return argv + (["--peers", peers] if peers else [])


def measure_start(argv: list[str], env: dict[str, str], timeout_s: float) -> dict[str, tuple[float, float]]:
    """Start `argv`, return {mark: (wall s, CPU s)} at each of MARKS, then kill it."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    seen: dict[str, tuple[float, float]] = {}
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            for mark in MARKS:
                if mark in line and mark not in seen:
                    seen[mark] = (time.monotonic() - started, cpu_seconds(proc.pid))
            if len(seen) == len(MARKS) or time.monotonic() - started > timeout_s:
                break
    finally:
        proc.kill()
        proc.wait()
    return seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--load", type=int, default=5, help="nodes training beside the measured one (default 5)")
    ap.add_argument("--inner-steps", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=2, help="starts of the measured node (the later ones restarts)")
    ap.add_argument("--settle-s", type=float, default=40.0, help="seconds the load trains before the first start")
    ap.add_argument("--out", type=Path, default=None, help="working directory (default: a temporary one)")
    ap.add_argument("--pin-cpus", action=argparse.BooleanOptionalAction, default=True,
                    help="each process on an equal share of the cores, as the testnet (default on)")
    args = ap.parse_args()
    pins, cpus = pinning(args.load + 1, args.pin_cpus)
    prefix = (lambda i: list(pins[i])) if pins else (lambda i: [])
    root = args.out or Path(tempfile.mkdtemp(prefix="restart-load-"))
    root.mkdir(parents=True, exist_ok=True)
    env = node_env(root / "jax-cache")
    founder = "127.0.0.1:7390"
    procs = []
    try:
        for i in range(args.load):
            log = open(root / f"load-{i}.log", "w")  # noqa: SIM115 - closed with the process
            argv = node_argv(root / f"load-{i}.key", root / f"load-{i}", args.inner_steps,
                             None if i == 0 else founder, founder if i == 0 else "127.0.0.1:0")
            procs.append((subprocess.Popen(prefix(i) + argv, stdout=log, stderr=subprocess.STDOUT, env=env), log))
            if i == 0:
                time.sleep(3.0)  # the founder listens before the joiners dial it
        if args.load:
            time.sleep(args.settle_s)
        peers = founder if args.load else None
        print(f"{args.load} nodes training beside the measured one; CPU: {cpus}; marks: wall s / CPU s since its start")
        for n in range(args.repeat):
            marks = measure_start(prefix(args.load) + node_argv(root / "measured.key", root / "measured",
                                                                args.inner_steps, peers, "127.0.0.1:0"),
                                  env, timeout_s=300.0)
            kind = "first start" if n == 0 else "restart from its checkpoint"
            print(f"  {kind}: " + ", ".join(f"{m} {w:.1f} / {c:.2f}" for m, (w, c) in marks.items()), flush=True)
    finally:
        for proc, log in procs:
            proc.kill()
            proc.wait()
            log.close()


if __name__ == "__main__":
    main()

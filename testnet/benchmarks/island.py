"""Benchmark: what an island of several processes costs against one process with as many devices.

Run: ``python -m testnet.benchmarks.island [--model tiny] [--mesh fsdp=2] [--steps 20] [--rounds 4]
[--repeats 2] [KEY=VALUE ...] [--json FILE]``.

Both islands train the node's own model (`node.island`: the preset's byte-level transformer on the embedded
text) with the same mesh over the same number of CPU devices, rounds as the node drives them: the round's
start parameters in (`InnerLoop.set_params`), ``--steps`` inner steps with the node's callbacks (a stop
check and a base shift asked before every step, `InnerLoop.run`), the round's parameters out (`params`).

* ``alone``: one process with all the devices (``--xla_force_host_platform_device_count``);
* ``island``: one process per device, joined by ``jax.distributed`` on this machine (gloo over loopback TCP
  between them): process 0 speaks, the others follow (`node.island.multihost`), so every batch, every
  decision of the callbacks and the round's parameters cross between processes as on a multi-host island.

Printed and written (``--json``), medians over ``--repeats`` runs of each, alternated (A-B-A-B):
``steps_per_s`` of each and ``island_over_alone``, and ``boundary_s``, the seconds a round spends outside its
steps (parameters in and out); and ``share_ms_per_step``, what the island's own machinery adds to a step (the
three shares of a step: the stop check, the shift, the batch; `Island.share`), timed alone, so that the rest
of the difference is XLA's collectives between the processes. It measures the island's own overhead on one machine, not a network between
hosts (that is the links' and XLA's collectives'), and on a CPU, where a step of a small model is short, so
the overhead per step weighs far more than on an accelerator.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from testnet.procs import free_port

ROOT = Path(__file__).resolve().parents[2]

WORKER = r"""
import json, statistics, sys, time
from node.island import multihost
process, count, port, spec = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
island = multihost.join(f"127.0.0.1:{port}", count, process) if count > 1 else multihost.current()
import numpy as np
from node.island.bytelm import byte_lm_task
from node.island.config import MeshShape, preset
from node.island.data import resolve_vocab
from node.island.follow import follow
from node.island.train import InnerLoop

cfg = resolve_vocab(preset(spec["model"]).with_overrides_from_strings(spec["overrides"]), spec["overrides"])
task = byte_lm_task(cfg)
if spec["shares"]:  # what the island's own machinery costs a step: a stop check, a shift, the batch
    batch, shares = np.zeros(task.example.shape, np.int32), 50
    island.share(batch if island.speaks else None)
    t0 = time.perf_counter()
    for _ in range(shares):
        for value in (False, None, batch):
            island.share(value if island.speaks else None)
    print("RESULT", json.dumps({"share_ms_per_step": (time.perf_counter() - t0) / shares * 1e3,
                                "batch_bytes": batch.nbytes}), flush=True)
    sys.exit(0)
if not island.speaks:
    follow(island)
    sys.exit(0)
batches, _ = task.open("peer-a")
loop = InnerLoop(task.model, batches, seed=0, tokens_per_batch=task.tokens_per_batch,
                 mesh=MeshShape.parse(spec["mesh"]))
loop.warm_up()
start = loop.params
loop.run(2)
rates, boundary = [], []
for _ in range(spec["rounds"]):
    t0 = time.perf_counter()
    loop.set_params(start)
    result = loop.run(spec["steps"], should_stop=lambda: False, shift=lambda: None)
    t1 = time.perf_counter()
    start = loop.params
    t2 = time.perf_counter()
    rates.append(result.steps / result.seconds)
    boundary.append((t1 - t0 - result.seconds) + (t2 - t1))
island.close()
print("RESULT", json.dumps({"steps_per_s": statistics.median(rates), "boundary_s": statistics.median(boundary),
                            "processes": count, "devices": loop.mesh.devices.size}), flush=True)
"""


def _run(processes: int, devices: int, spec: dict, timeout_s: float) -> dict:
    """One island of `processes` processes with `devices` CPU devices each; the speaker's figures."""
    env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=str(ROOT),
               XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}")
    port = free_port()
    procs = [subprocess.Popen([sys.executable, "-c", WORKER, str(i), str(processes), str(port), json.dumps(spec)],
                              env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for i in range(processes)]
    try:
        outs = [p.communicate(timeout=timeout_s) for p in procs]
    finally:
        for p in procs:
            p.kill()
    for p, (_, err) in zip(procs, outs):
        if p.returncode != 0:
            raise RuntimeError(f"an island process exited {p.returncode}:\n{err[-2000:]}")
    line = next(line for line in outs[0][0].splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m testnet.benchmarks.island", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="tiny", help="preset (default %(default)s)")
    p.add_argument("--mesh", default="fsdp=2", help="the island's mesh; its size is the processes (default %(default)s)")
    p.add_argument("--steps", type=int, default=20, help="inner steps per round (default %(default)s)")
    p.add_argument("--rounds", type=int, default=4, help="rounds per run, the median taken (default %(default)s)")
    p.add_argument("--repeats", type=int, default=2, help="runs of each island, alternated (default %(default)s)")
    p.add_argument("--timeout", type=float, default=600.0, help="seconds one run may take (default %(default)s)")
    p.add_argument("--json", type=Path, default=None, help="write the figures here")
    p.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. batch_size=8")
    args = p.parse_args(argv)
    from node.island.config import MeshShape

    n = MeshShape.parse(args.mesh).size
    spec = {"model": args.model, "overrides": args.overrides, "mesh": args.mesh, "steps": args.steps,
            "rounds": args.rounds, "shares": False}
    runs: dict[str, list[dict]] = {"alone": [], "island": []}
    shares = _run(n, 1, dict(spec, shares=True), args.timeout)
    started = time.perf_counter()
    for i in range(args.repeats):
        for name in ("alone", "island") if i % 2 == 0 else ("island", "alone"):
            figures = _run(1, n, spec, args.timeout) if name == "alone" else _run(n, 1, spec, args.timeout)
            runs[name].append(figures)
            print(f"  {name:6s} {figures['processes']} process(es), {figures['devices']} devices: "
                  f"{figures['steps_per_s']:.1f} steps/s, {figures['boundary_s'] * 1e3:.0f} ms outside the steps "
                  f"per round", flush=True)
    out = {name: {key: statistics.median(r[key] for r in rs) for key in ("steps_per_s", "boundary_s")}
           for name, rs in runs.items()}
    out.update(model=args.model, mesh=args.mesh, steps=args.steps, rounds=args.rounds, repeats=args.repeats,
               overrides=args.overrides, island_over_alone=out["island"]["steps_per_s"] / out["alone"]["steps_per_s"],
               share_ms_per_step=shares["share_ms_per_step"], batch_bytes=shares["batch_bytes"],
               seconds=time.perf_counter() - started)
    print(f"island of {n} processes {out['island']['steps_per_s']:.1f} steps/s | one process of {n} devices "
          f"{out['alone']['steps_per_s']:.1f} steps/s | ratio {out['island_over_alone']:.3f} | outside the steps "
          f"per round: {out['island']['boundary_s'] * 1e3:.0f} ms against {out['alone']['boundary_s'] * 1e3:.0f} ms "
          f"| the island's shares {out['share_ms_per_step']:.2f} ms per step (a {out['batch_bytes']:,} B batch)",
          flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

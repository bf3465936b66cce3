"""What one data-parallel all-reduce costs over an emulated WAN: the model's gradients as one tensor, and as the
same elements in the model's tensor count, all-reduced by `jax.distributed` (gloo on CPU devices).

    python -m testnet.benchmarks.gloo_allreduce [--link 1gbit,10ms] [--elements 115008] [--tensors 14]

Three namespaces behind emulated links (`testnet.wan`). XLA combines a step's gradient all-reduces into one
operation of many operands; this measures whether the engine then moves them as one message sequence or one
per operand (each paying the round trips). `testnet.dp_network`'s step is the latter case (`tiny`: 115,008
parameters in 14 tensors). Needs root.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from testnet.wan import LinkSpec, WanNetwork, probe

WORKER = """
import sys, time, jax, numpy as np
pid, coordinator, elements, tensors = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
jax.distributed.initialize(coordinator, 3, pid)
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mesh = Mesh(np.array(jax.devices()), ("d",))
by, whole = NamedSharding(mesh, P("d")), NamedSharding(mesh, P())
local = lambda n: jax.make_array_from_process_local_data(by, np.ones((1, n), np.float32))
one, many = local(elements), [local(elements // tensors) for _ in range(tensors)]
f_one = jax.jit(lambda a: a.sum(0), out_shardings=whole)
f_many = jax.jit(lambda xs: [x.sum(0) for x in xs], out_shardings=[whole] * tensors)
for name, f, x in (("one_tensor", f_one, one), ("many_tensors", f_many, many)):
    jax.block_until_ready(f(x))
    start = time.perf_counter()
    for _ in range(5):
        jax.block_until_ready(f(x))
    if pid == 0:
        print(name, (time.perf_counter() - start) / 5, flush=True)
"""


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m testnet.benchmarks.gloo_allreduce", description=__doc__.splitlines()[0])
    p.add_argument("--link", default="1gbit,10ms", help="each node's link (rate, one-way delay)")
    p.add_argument("--elements", type=int, default=115_008, help="float32 elements in all (default: tiny's)")
    p.add_argument("--tensors", type=int, default=14, help="tensors they come in (default: tiny's)")
    a = p.parse_args(argv)
    spec = LinkSpec.parse(a.link)
    support = probe(spec)
    if not support.available:
        print(f"cannot emulate the link: {support.reason}", file=sys.stderr)
        return 2
    net = WanNetwork(3, spec, support.qdisc or "netem")
    net.setup()
    try:
        procs = [subprocess.Popen([*net.exec_prefix(i), sys.executable, "-c", WORKER, str(i), f"{net.host(0)}:7734",
                                   str(a.elements), str(a.tensors)], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                  text=True) for i in range(3)]
        out = procs[0].communicate(timeout=300)[0]
        for proc in procs[1:]:
            proc.wait(timeout=60)
    finally:
        net.teardown()
    seconds = {words[0]: float(words[1]) for words in (line.split() for line in out.splitlines())
               if words and words[0] in ("one_tensor", "many_tensors")}  # (gloo prints its own lines too)
    print(f"3 processes, {spec} per node ({support.reason}); {a.elements:,} float32 elements")
    print(f"  as one tensor          {seconds['one_tensor'] * 1000:8.1f} ms per all-reduce")
    print(f"  as {a.tensors} tensors          {seconds['many_tensors'] * 1000:8.1f} ms "
          f"({seconds['many_tensors'] / seconds['one_tensor']:.1f}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Each testnet node on an equal share of this machine's cores (`taskset`, Linux).

The islands of a real run do not share hardware; a testnet packs N of them on one machine, and then the
kernel shares the cores by thread, not by node: a training node's XLA thread pool (one thread per core it
may use) outweighs a node that is starting or restarting on one Python thread. Beside five trainers on 2
cores a restart ran at ~0.23 of a core (launch to LISTENING 8.6 s for 2.0 s of CPU), where an equal share is
1/3; pinned, 0.30 (5.1 s for 1.5 s; BENCHMARKS.md, session 22). Pinned, every node gets the same slice
whatever its threads, and JAX sizes its thread pool by the slice (the affinity mask), so trainers stop
contending for cores they share.

What pinning does not model either: a node that is down or sleeps (`--slow`) leaves its slice to the nodes
on the same cores only, which then train faster than the rest (unpinned, every node speeds up a little).
Real islands do not speed up when another one dies.

Slices are equal or not made: with `nodes` dividing the cores each node gets `cores/nodes` of its own;
with the cores dividing `nodes`, `nodes/cores` nodes share each core; otherwise (3 nodes on 2 cores) one
node would get a core to itself and train faster than the rest, so nothing is pinned and the kernel
shares the cores as before.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence

__all__ = ["core_slices", "pinning"]


def core_slices(nodes: int, cores: Sequence[int]) -> list[tuple[int, ...]] | None:
    """Node i's cores, equal slices of `cores`; None when no equal split exists (see the module doc)."""
    cores = sorted(cores)
    if nodes < 1 or not cores:
        return None
    if len(cores) % nodes == 0:
        width = len(cores) // nodes
        return [tuple(cores[i * width:(i + 1) * width]) for i in range(nodes)]
    if nodes % len(cores) == 0:
        return [(cores[i % len(cores)],) for i in range(nodes)]
    return None


def pinning(nodes: int, enabled: bool = True) -> tuple[list[tuple[str, ...]] | None, str]:
    """(per-node command prefixes, a line saying what was done and why), or (None, why not)."""
    if not enabled:
        return None, "not pinned (--no-pin-cpus)"
    if not hasattr(os, "sched_getaffinity") or shutil.which("taskset") is None:
        return None, "not pinned: no taskset on this system (util-linux)"
    cores = sorted(os.sched_getaffinity(0))
    slices = core_slices(nodes, cores)
    if slices is None:
        return None, (f"not pinned: {nodes} nodes cannot share {len(cores)} cores equally "
                      "(the kernel shares them by thread)")
    share = f"{len(slices[0])} core(s) each" if len(cores) >= nodes else f"{nodes // len(cores)} nodes per core"
    return ([("taskset", "-c", ",".join(map(str, s))) for s in slices],
            f"each node pinned to its share of the {len(cores)} cores: {share}")

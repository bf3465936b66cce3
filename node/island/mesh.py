"""How an island lays its training state over its devices: a two-axis `jax.sharding.Mesh` ("data", "fsdp").

The batch is split over both axes. Parameters, gradients and the optimizer state are *sharded* over "fsdp"
(ZeRO-3 / FSDP, written as GSPMD shardings: XLA inserts the all-gathers before use and the reduce-scatters of
the gradients, as in MaxText and the JAX sharding guide) and replicated over "data" (plain data parallelism,
XLA's all-reduce). `data=N,fsdp=1` is the replicated island of earlier versions; `data=1,fsdp=N` keeps one
N-th of every large tensor on each device.

Which axis of a tensor is split (`param_spec`): its largest axis that "fsdp" divides, the first of equals;
tensors with fewer than `MIN_SHARDED_ELEMENTS` elements (norm scales, biases) and tensors no axis of which
"fsdp" divides stay whole on every device: they are a sliver of the bytes and splitting them buys a
collective per use. The optimizer state follows its parameters (`state_shardings`): every leaf under a
parameter's name with that parameter's shape takes its sharding, the rest (step counts) are replicated.

`MeshShape.parse("data=2,fsdp=4")` reads `--mesh`; `auto_shape` picks one when none is given: replicated
while the replicated state fits the devices comfortably, sharded over every device otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from node.island.config import MESH_AXES as AXES, ConfigError, MeshShape

__all__ = ["AXES", "MIN_SHARDED_ELEMENTS", "MeshShape", "auto_shape", "batch_sharding", "describe_layout",
           "device_memory", "host_copy", "island_mesh", "param_shardings", "param_spec", "resident_bytes", "state_shardings"]

MIN_SHARDED_ELEMENTS = 4096
# fp32 parameters + AdamW's two moments + fp32 gradients: what a replicated island holds per parameter
REPLICATED_BYTES_PER_PARAM = 16
# the share of a device's memory the replicated state may take before `auto_shape` shards it (the rest is
# activations, XLA's temporaries and the host transfers)
AUTO_SHARD_ABOVE = 0.5


def auto_shape(n_devices: int, n_params: int, device_memory_bytes: int | None) -> MeshShape:
    """Replicated (`data=n`) while a replicated copy of the training state (`REPLICATED_BYTES_PER_PARAM` per
    parameter) takes at most `AUTO_SHARD_ABOVE` of one device's memory, else sharded over all (`fsdp=n`).
    Without a memory figure (the CPU backend reports none) it stays replicated."""
    if device_memory_bytes and n_params * REPLICATED_BYTES_PER_PARAM > AUTO_SHARD_ABOVE * device_memory_bytes:
        return MeshShape(data=1, fsdp=n_devices)
    return MeshShape(data=n_devices, fsdp=1)


def device_memory(device: jax.Device) -> int | None:
    """What the backend says `device` can hold (`bytes_limit`), None where it says nothing (CPU)."""
    stats = device.memory_stats()
    return int(stats["bytes_limit"]) if stats and stats.get("bytes_limit") else None


def island_mesh(shape: MeshShape, devices: Sequence[jax.Device]) -> Mesh:
    """The ("data", "fsdp") mesh of `devices` (all of them, in order: "fsdp" the faster-varying axis, so that
    its all-gathers stay between neighbouring devices)."""
    if shape.size != len(devices):
        raise ConfigError(f"--mesh {shape} needs {shape.size} devices; this island has {len(devices)}")
    return Mesh(np.asarray(list(devices)).reshape(shape.data, shape.fsdp), AXES)


def param_spec(shape: tuple[int, ...], fsdp: int) -> PartitionSpec:
    """The partition of one parameter of `shape` over an "fsdp" axis of size `fsdp` (module docstring)."""
    if fsdp == 1 or math.prod(shape) < MIN_SHARDED_ELEMENTS:
        return PartitionSpec()
    candidates = [axis for axis, n in enumerate(shape) if n % fsdp == 0]
    if not candidates:
        return PartitionSpec()
    split = max(candidates, key=lambda axis: (shape[axis], -axis))
    return PartitionSpec(*("fsdp" if axis == split else None for axis in range(len(shape))))


def param_shardings(mesh: Mesh, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, NamedSharding]:
    """Every parameter's sharding on `mesh`, by flat name."""
    fsdp = mesh.shape["fsdp"]
    return {name: NamedSharding(mesh, param_spec(tuple(shape), fsdp)) for name, shape in sorted(shapes.items())}


def state_shardings(mesh: Mesh, abstract_state: Any, params: Mapping[str, NamedSharding],
                    shapes: Mapping[str, tuple[int, ...]]) -> Any:
    """The optimizer state's shardings (a pytree like `abstract_state`): a leaf whose key path ends in a
    parameter's name and that has its shape takes the parameter's sharding; any other is replicated."""
    replicated = NamedSharding(mesh, PartitionSpec())

    def choose(path: tuple, leaf: Any) -> NamedSharding:
        last = path[-1] if path else None
        name = getattr(last, "key", None)
        if isinstance(name, str) and name in params and tuple(leaf.shape) == tuple(shapes[name]):
            return params[name]
        return replicated

    return jax.tree_util.tree_map_with_path(choose, abstract_state)


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """A batch split on its leading axis over every device of the island."""
    return NamedSharding(mesh, PartitionSpec(AXES))


def _covered_by_every_process(x: jax.Array) -> bool:
    """Whether each process's own shards of `x` make up all of it (replicated, or split within each host
    only): the same answer on every process, from the sharding alone."""
    held: dict[int, set[tuple]] = {}
    for device, index in x.sharding.devices_indices_map(x.shape).items():
        held.setdefault(device.process_index, set()).add(
            tuple(s.indices(n)[:2] for s, n in zip(index, x.shape)))
    size = math.prod(x.shape)
    return all(sum(math.prod(stop - start for start, stop in box) for box in boxes) == size
               for boxes in held.values())


def host_copy(x: jax.Array) -> np.ndarray:
    """`x` as a fresh numpy array in this host's memory, assembled from its shards: this process's own when
    they make up the whole (no device holds a gathered tensor), else gathered from the island's processes
    (`multihost_utils.process_allgather`, a collective every process makes: one tensor at a time on the
    devices)."""
    if x.is_fully_addressable:
        return np.array(x, copy=True)
    if _covered_by_every_process(x):
        out = np.empty(x.shape, x.dtype)
        for shard in x.addressable_shards:
            out[shard.index] = np.asarray(shard.data)
        return out
    from jax.experimental import multihost_utils

    return np.array(multihost_utils.process_allgather(x, tiled=True), copy=True)


def resident_bytes(tree: Any) -> dict[jax.Device, int]:
    """Bytes each device holds of the arrays in `tree` (their addressable shards)."""
    held: dict[jax.Device, int] = {}
    for leaf in jax.tree_util.tree_leaves(tree):
        for shard in leaf.addressable_shards:
            held[shard.device] = held.get(shard.device, 0) + shard.data.nbytes
    return held


def describe_layout(layout: Mapping[str, Any]) -> str:
    """One line of `InnerLoop.layout()`, for logs: "8 gpu device(s), mesh data=1,fsdp=8, remat (1.51 B/param ...)"."""
    remat = ", remat" if layout["remat"] else ""
    return (f"{layout['devices']} {layout['platform']} device(s), mesh {layout['mesh']}{remat} "
            f"({layout['state_bytes_per_param']:.2f} B/param of state per device)")

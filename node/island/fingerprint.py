"""What a model *is*, as short hashes every node of a run can compare: its tensors, its computation, its inner
optimizer and its learning-rate schedule (the run configuration's `model.structure`, `model.computation`,
`inner.optimizer` and `inner.schedule`, `node.island.task.Model.run_fields`).

Two models with the same tensor names and shapes can still be different models — another number of attention
heads splits the same projection differently, another activation or another normalisation reads the same
parameters differently — and nodes that mix them corrupt each other's training while every update passes
every check. So beside the tensors' names, shapes and dtypes (`structure_hash`), a node traces its loss with
JAX (`jax.make_jaxpr`, abstract inputs: nothing is computed or allocated) on the shapes of one training batch
and hashes the printed program (`computation_hash`): the primitives, their parameters, the shapes and the
constants. The inner optimizer's update is traced the same way (`optimizer_hash`): its learning rate,
betas, weight decay and schedule are literals of that program. The schedule is also sampled at fixed steps
(`schedule_hash`), so that a mismatch names it.

The program text is JAX's own (`str(ClosedJaxpr)`, with memory addresses masked and constants hashed by
value): the same code under the same JAX version gives the same text on every machine. Nodes on different
JAX versions may print different programs for the same model: `diloco.Model(trace=False)` leaves the two
traced hashes out (the user then names what must agree in `config`).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from typing import Any

import jax
import numpy as np

__all__ = ["SCHEDULE_STEPS", "abstract_batch", "computation_hash", "optimizer_hash", "schedule_hash",
           "structure_hash"]

# where a schedule is sampled: warmups, decays and their ends of runs from tens of steps to a million
SCHEDULE_STEPS = (0, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000,
                  200_000, 500_000, 1_000_000)
_ADDRESS = re.compile(r"0x[0-9a-fA-F]+")


def _digest(*parts: bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(len(part).to_bytes(8, "little"))
        h.update(part)
    return h.hexdigest()[:32]


def structure_hash(shapes: Mapping[str, tuple[int, ...]], dtype: str = "float32") -> str:
    """Every tensor's name, shape and dtype, in name order: SHA-256 of the lines `name:d1,d2,...:dtype` joined
    by newlines, its first 32 hex digits (PROTOCOL.md §7a)."""
    text = "\n".join(f"{name}:{','.join(map(str, shape))}:{dtype}" for name, shape in sorted(shapes.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def abstract_batch(batch: Any) -> Any:
    """A batch's shapes and dtypes (`jax.ShapeDtypeStruct` leaves), nothing of its values."""
    return jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), batch)


def _program_hash(closed: Any) -> str:
    text = _ADDRESS.sub("0x?", str(closed)).encode()
    consts = [np.ascontiguousarray(np.asarray(c)) for c in closed.consts]
    return _digest(text, *(f"{c.dtype}{c.shape}".encode() + c.tobytes() for c in consts))


def _abstract_params(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, jax.ShapeDtypeStruct]:
    return {name: jax.ShapeDtypeStruct(shape, np.float32) for name, shape in sorted(shapes.items())}


def computation_hash(loss: Any, shapes: Mapping[str, tuple[int, ...]], batch: Any) -> str:
    """The traced program of `loss(flat params, batch)` for parameters of `shapes` and a batch of the shapes
    of `batch` (`abstract_batch`)."""
    return _program_hash(jax.make_jaxpr(loss)(_abstract_params(shapes), abstract_batch(batch)))


def optimizer_hash(optimizer: Any, shapes: Mapping[str, tuple[int, ...]]) -> str:
    """The traced programs of an optax optimizer's `init` and `update` on parameters of `shapes`."""
    params = _abstract_params(shapes)
    state = jax.eval_shape(optimizer.init, params)
    init = jax.make_jaxpr(optimizer.init)(params)
    update = jax.make_jaxpr(lambda g, s, p: optimizer.update(g, s, p))(params, state, params)
    return _digest(_program_hash(init).encode(), _program_hash(update).encode())


def schedule_hash(schedule: Any) -> str:
    """A learning-rate schedule's values at `SCHEDULE_STEPS`: SHA-256 of them as little-endian float32, its
    first 32 hex digits; "constant" for none."""
    if schedule is None:
        return "constant"
    values = np.asarray([np.float32(schedule(step)) for step in SCHEDULE_STEPS], "<f4")
    return hashlib.sha256(values.tobytes()).hexdigest()[:32]

"""The inner loop: local AdamW steps on one island, over its devices (data-parallel, sharded, or both).

`InnerLoop` trains one `node.island.task.Model` (the CLI's: `node.island.bytelm.byte_lm`); the node drives it
one round at a time:

    loop = InnerLoop(model, batches, seed=run_seed)
    loop.set_params(global_flat)             # start of a round: global params in, AdamW state kept
    result = loop.run(500, should_stop=...)  # blocks; run it in a worker thread
    delta = {k: global_flat[k] - result.params[k] for k in global_flat}

`train_step` is pure and jitted once per (model, mesh), with parameter and optimizer buffers donated. The
island's devices form a ("data", "fsdp") mesh (`node.island.mesh`, `--mesh`): the batch is split over both
axes, and the parameters and the optimizer state are sharded over "fsdp" and replicated over "data", so XLA
inserts the all-gathers, reduce-scatters and all-reduces. Parameters leave the devices shard by shard into
host memory (`params`: numpy assembles the shards; no device holds a whole sharded tensor) and come back the
same way (`set_params`). `remat=True` trains with the model's `remat_loss`, which recomputes each layer's
activations in the backward pass instead of keeping them (the byte-level model's blocks under `nnx.remat`).
An island of several processes (`node.island.multihost`, one per host) has one mesh over all their devices:
the speaker's loop announces every call marked `mirrored`, and the followers' loops make the same calls.
The learning-rate schedule is driven by its own count in the optimizer state (`InnerLoop.schedule_step`, for
optimizers built on an optax schedule), kept across rounds: the steps this loop did, unless a node that joined
a running training moved it to the run's position (`InnerLoop.set_schedule_step`). AdamW's bias-correction
count is separate and always counts this loop's own steps.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import jax
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from node.island.bytelm import byte_lm_model
from node.island.config import Config, ConfigError
from node.island.mesh import (MeshShape, auto_shape, batch_sharding, device_memory, host_copy, island_mesh,
                              param_shardings, resident_bytes, state_shardings)
from node.island.multihost import CALLBACK, Island, announce_init, current, mirrored
from node.island.task import Model, flat_name
from protocol.errors import LocalProtocolError

__all__ = ["BatchSource", "InnerLoop", "Progress", "RoundResult"]


class BatchSource(Protocol):
    """Where `InnerLoop` takes its batches: `next_batch()` gives one batch (a pytree of arrays, the batch on
    the leading axis), `example()` one of the same shapes without drawing it; `position` counts batches drawn
    and `seek(position)` resumes (see `node.island.data.Batcher`, `node.island.task.IterableBatches`)."""

    position: int

    def next_batch(self) -> Any: ...

    def example(self) -> Any: ...

    def seek(self, position: int) -> None: ...


@dataclasses.dataclass(frozen=True)
class RoundResult:
    """What one `InnerLoop.run` did. `params` are the local params at the end (float32 copies)."""

    params: dict[str, np.ndarray]
    tokens: int  # tokens (or examples) processed: steps * tokens_per_batch
    mean_loss: float  # mean training loss over the round's steps (nats); nan if no step ran
    steps: int
    seconds: float
    losses: tuple[float, ...]  # per-step training losses
    step: int  # inner steps this loop did in all, after the round (`InnerLoop.step`)


@dataclasses.dataclass(frozen=True)
class Progress:
    """A round between two of its steps, as `InnerLoop.run`'s `progress` hook sees it: `steps` done in
    `seconds`; `losses()` waits for their training losses (a device sync: call it only when needed)."""

    steps: int
    seconds: float
    losses: Callable[[], tuple[float, ...]]


def _is_schedule_state(node: Any) -> bool:
    return isinstance(node, optax.ScaleByScheduleState)


def _schedule_count(opt_state: Any) -> jax.Array | None:
    """The learning-rate schedule's count in the optimizer state (not AdamW's own count); None when the
    optimizer has no schedule."""
    found = [s for s in jax.tree_util.tree_leaves(opt_state, is_leaf=_is_schedule_state) if _is_schedule_state(s)]
    if len(found) > 1:
        raise TypeError(f"expected at most one ScaleByScheduleState in the optimizer state, found {len(found)}")
    return found[0].count if found else None


def _with_schedule_count(opt_state: Any, count: jax.Array) -> Any:
    return jax.tree_util.tree_map(lambda s: s._replace(count=count) if _is_schedule_state(s) else s, opt_state,
                                  is_leaf=_is_schedule_state)


def _tree_names(tree: Any) -> tuple[list[str], list[Any], Any]:
    leaves, treedef = jax.tree_util.tree_flatten_with_path(tree)
    names = ["/".join(flat_name((e,)) for e in path) for path, _ in leaves]
    return names, [leaf for _, leaf in leaves], treedef


@dataclasses.dataclass(frozen=True)
class _Steps:
    train_step: Callable[..., Any]
    eval_step: Callable[..., Any]
    opt_init: Callable[..., Any]
    params: dict[str, NamedSharding]  # each parameter's sharding
    state: Any  # the optimizer state's shardings (a pytree like it)


@functools.lru_cache(maxsize=8)
def _compiled_steps(model: Model, mesh: Mesh, remat: bool = False) -> _Steps:
    """The jitted functions for one (model, mesh): shared by every loop with those, so a baseline, a node
    and its evaluations compile each shape once per process."""
    tx = model.optimizer
    rep, data = NamedSharding(mesh, PartitionSpec()), batch_sharding(mesh)
    params = param_shardings(mesh, model.shapes)
    abstract = {k: jax.ShapeDtypeStruct(shape, np.float32) for k, shape in sorted(model.shapes.items())}
    state = state_shardings(mesh, jax.eval_shape(tx.init, abstract), params, model.shapes)
    loss_fn = model.flat_remat_loss if remat else model.flat_loss

    def train_step(params, opt_state, batch):
        loss, grads = jax.value_and_grad(loss_fn)(params, batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return _Steps(
        train_step=jax.jit(train_step, donate_argnums=(0, 1), in_shardings=(params, state, data),
                           out_shardings=(params, state, rep)),
        eval_step=jax.jit(model.flat_evaluate, out_shardings=rep),
        opt_init=jax.jit(tx.init, in_shardings=(params,), out_shardings=state),
        params=params, state=state,
    )


def _example(batches: Any) -> Any:
    """A batch of the source's shapes, not drawn: `example()`, or zeros for a source that only says its
    `batch_size` and `seq_len` (token rows of `seq_len + 1`)."""
    if hasattr(batches, "example"):
        return batches.example()
    return np.zeros((batches.batch_size, batches.seq_len + 1), np.int32)


def _leading(batch: Any) -> int:
    return int(np.shape(jax.tree_util.tree_leaves(batch)[0])[0])


def _shape_lists(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, list[int]]:
    return {k: [int(n) for n in shape] for k, shape in sorted(shapes.items())}


class InnerLoop:
    """Local training state of one island (params, AdamW state, step counts, data position).

    `step` counts the inner steps this loop did (restored from a checkpoint too): what tokens and curves
    are measured in. `schedule_step` is the learning-rate schedule's position; it equals `step` unless
    `set_schedule_step` moved it.

    Not thread-safe: one thread at a time may call its methods (the node's worker thread). All arrays
    handed in are copied; all arrays handed out are fresh numpy copies.

    On an island of several processes (`node.island.multihost`) the loop spans every process's devices: the
    speaker's loop announces each call that touches them (`mirrored`) and the followers' loops (built with
    `batches=None`: the speaker draws every batch and shares it) make the same calls.
    """

    def __init__(self, model: Model, batches: BatchSource | None, *, seed: int = 0,
                 tokens_per_batch: int | None = None, params: Mapping[str, np.ndarray] | None = None,
                 devices: Sequence[jax.Device] | None = None, mesh: MeshShape | None = None,
                 remat: bool = False, island: Island | None = None, example: Any = None) -> None:
        self.island = island or current()
        self.model, self.batches = model, batches
        tokens_per_batch = tokens_per_batch or batches.batch_size * batches.seq_len
        example = _example(batches) if example is None else example
        params = model.init_params(seed) if params is None else params
        if devices is not None and not self.island.single:
            raise ConfigError("an island of several processes trains on all their devices: devices= cannot be given")
        devices = list(devices or self.island.devices())
        # the speaker resolves the mesh and announces it: the followers take its shape, not their own choice
        local = next((d for d in devices if d.process_index == jax.process_index()), devices[0])
        self.mesh_shape = mesh or auto_shape(len(devices), model.param_count, device_memory(local))
        announce_init(self.island, model_name=model.name, model_config=dict(model.config),
                      tokens_per_batch=tokens_per_batch, example=example, params=dict(params),
                      mesh=str(self.mesh_shape), remat=remat, shapes=_shape_lists(model.shapes))
        self.tokens_per_batch, self._example_batch = tokens_per_batch, example
        self.mesh = island_mesh(self.mesh_shape, devices)
        n_dev = self.mesh.devices.size
        if (batch_size := _leading(example)) % n_dev:
            raise ConfigError(f"batch size {batch_size} is not divisible by the {n_dev} devices")
        self._replicated = NamedSharding(self.mesh, PartitionSpec())
        self._by_batch = batch_sharding(self.mesh)
        self.remat = remat
        self._steps = _compiled_steps(model, self.mesh, remat)
        self._train_step = self._steps.train_step
        self._params = self._put(params)
        self._opt_state = self._steps.opt_init(self._params)
        self.step = 0

    @classmethod
    def follower(cls, model: Model, *, tokens_per_batch: int, example: Any, params: Mapping[str, np.ndarray],
                 mesh: str | None, remat: bool, shapes: Mapping[str, list[int]], **_: Any) -> InnerLoop:
        """(follower) The loop the speaker built (the arguments it announced, `node.island.follow`), for this
        process's `model`: the same tensors, or a `ConfigError` saying this process has another model."""
        if _shape_lists(model.shapes) != dict(shapes):
            raise ConfigError(f"island process {current().process_id}: its model ({model.name}, "
                              f"{model.param_count:,} parameters) is not the speaker's; start every process of "
                              f"the island with the same model flags")
        return cls(model, None, tokens_per_batch=tokens_per_batch, params=params, remat=remat,
                   mesh=None if mesh is None else MeshShape.parse(mesh), example=example)

    def layout(self) -> dict[str, Any]:
        """How this island lays its training over its devices, for `/status` and logs: the devices, the mesh,
        whether activations are recomputed, and the bytes of parameters and optimizer state the busiest
        device holds per parameter (AdamW: 4 B of fp32 parameters and 8 of moments, 12 replicated, 1.5 at
        fsdp=8)."""
        held = resident_bytes((self._params, self._opt_state))
        return {"devices": int(self.mesh.devices.size), "platform": self.mesh.devices.flat[0].platform,
                "processes": self.island.process_count, "mesh": str(self.mesh_shape), "remat": self.remat,
                "state_bytes_per_param": max(held.values()) / max(1, self.model.param_count)}

    @classmethod
    def byte_lm(cls, cfg: Config, batches: BatchSource, **kwargs: Any) -> InnerLoop:
        """A loop of the CLI's byte-level model for `cfg` (`node.island.bytelm.byte_lm`), seeded by
        `cfg.inner.init_seed`; other keyword arguments as for `InnerLoop`."""
        return cls(byte_lm_model(cfg), batches, seed=cfg.inner.init_seed, **kwargs)

    # -- parameters --------------------------------------------------------------------------------

    def _put(self, flat: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
        self.model.check(flat)
        # A numpy copy first: jax.device_put may alias host memory (even with may_alias=False when the
        # array came from a jax array), and donation would then let XLA write into the caller's array.
        return {k: jax.device_put(np.array(flat[k], np.float32, copy=True), self._steps.params[k])
                for k in sorted(flat)}

    @property
    @mirrored
    def params(self) -> dict[str, np.ndarray]:
        """Current local parameters, flat, as float32 numpy copies (assembled on the host from the devices'
        shards; `node.island.mesh.host_copy`). Every tensor's transfer is started before the first is waited
        for, so that they overlap."""
        for v in self._params.values():
            if v.is_fully_addressable:
                v.copy_to_host_async()
        return {k: host_copy(v) for k, v in self._params.items()}

    @mirrored
    def set_params(self, flat: Mapping[str, np.ndarray]) -> None:
        """Replace the parameters (start of a round from the global params). AdamW state, the step
        count and the data position are kept, as in DiLoCo. Raises `LocalProtocolError` on a name or
        shape mismatch."""
        self._params = self._put(flat)

    # -- training ----------------------------------------------------------------------------------

    def _shifted(self, moved: Mapping[str, np.ndarray]) -> dict[str, jax.Array]:
        self.model.check(moved)
        return {k: v + jax.device_put(np.asarray(moved[k], np.float32), self._steps.params[k])
                for k, v in self._params.items()}

    @mirrored
    def warm_up(self, eval_batches: Iterable[np.ndarray] = ()) -> float:
        """Compile (or load from JAX's persistent cache) the train step and the evaluation step for the
        shapes of this loop's batches and of `eval_batches`, on copies: no state changes, no batch is
        drawn. Lets a node trace and compile while it does something else (its state sync) instead of in
        its first round. Returns the seconds it took."""
        start = time.perf_counter()
        params = jax.tree.map(lambda x: x.copy(), self._params)
        opt_state = jax.tree.map(lambda x: x.copy(), self._opt_state)
        batch = jax.device_put(self._example_batch, self._by_batch)
        jax.block_until_ready(self._train_step(params, opt_state, batch))
        seen = set()
        for batch in eval_batches:
            shapes = tuple((np.shape(x), np.asarray(x).dtype.str) for x in jax.tree_util.tree_leaves(batch))
            if shapes not in seen:
                seen.add(shapes)
                jax.block_until_ready(self._steps.eval_step(self._params, self._put_batch(batch)))
        return time.perf_counter() - start

    @mirrored
    def run(self, steps: int, *, should_stop: Callable[[], bool] | None = None,
            shift: Callable[[], Mapping[str, np.ndarray] | None] | None = None,
            progress: Callable[[Progress], None] | None = None) -> RoundResult:
        """Run up to `steps` inner steps and return the round's result. Blocks until done.

        `should_stop()` is polled before every step (at most one step is in flight when it is asked);
        when it returns True the round ends early with the steps done so far. `shift()`, also polled
        before every step, may return per-tensor float32 arrays that are added to the parameters (the
        global parameters this round started from have moved: see `node.outer.rebase`). `progress(Progress)`
        is called between steps, after `should_stop` and before `shift` (so `params` are those after the
        steps done, moved by every shift taken so far): the node journals its round in flight there
        (`node.outer.inflight`). `run(0)` returns the current params unchanged.
        """
        if steps < 0:
            raise LocalProtocolError(f"steps must be >= 0, got {steps}")
        start = time.perf_counter()
        pending: list[jax.Array] = []
        island, draw = self.island, self.batches.next_batch if self.batches is not None else CALLBACK
        for _ in range(steps):
            if island.decide(should_stop):
                break
            if progress is not None and pending:
                island.callback(self, progress, Progress(
                    len(pending), time.perf_counter() - start,
                    lambda n=len(pending): tuple(float(x) for x in jax.device_get(pending[:n]))))
            moved = island.decide(shift)
            if moved is not None:
                self._params = self._shifted(moved)
            batch = jax.device_put(island.decide(draw), self._by_batch)
            self._params, self._opt_state, loss = self._train_step(self._params, self._opt_state, batch)
            pending.append(loss)
            if len(pending) >= 2:
                pending[-2].block_until_ready()
        losses = tuple(float(x) for x in jax.device_get(pending))
        self.step += len(losses)
        params = self.params
        return RoundResult(params=params, tokens=len(losses) * self.tokens_per_batch,
                           mean_loss=float(np.mean(losses)) if losses else float("nan"), steps=len(losses),
                           seconds=time.perf_counter() - start, losses=losses, step=self.step)

    def _put_batch(self, batch: Any) -> Any:
        """A held-out batch on the devices: split over them when its size allows, else replicated."""
        sharding = self._by_batch if _leading(batch) % self.mesh.devices.size == 0 else self._replicated
        return jax.device_put(batch, sharding)

    @mirrored
    def evaluate(self, batches: Iterable[Any], params: Mapping[str, np.ndarray] | None = None) -> float:
        """The model's mean held-out loss (`Model.metric`: bits per byte for the byte-level model) over
        `batches`, of the current params, or of `params` if given (the loop's own are left untouched).
        When `batches` has an `n_bytes` (text encoded with a tokenizer, `node.island.data.HeldOut`), the
        summed loss is divided by it instead of the count: bits per byte of text, as for bytes."""
        weights = self._params if params is None else self._put(params)
        total, count = 0.0, 0.0
        for batch in batches:
            summed, n = self._steps.eval_step(weights, self._put_batch(batch))
            total, count = total + float(summed), count + float(n)
        # held-out text encoded with a tokenizer (`node.island.data.HeldOut`): per byte of that text
        count = getattr(batches, "n_bytes", None) or count
        if count <= 0:
            raise LocalProtocolError("evaluate needs at least one held-out example")
        return total / count

    @property
    def has_schedule(self) -> bool:
        """Whether the optimizer keeps a learning-rate schedule's count (one built on an optax schedule)."""
        return _schedule_count(self._opt_state) is not None

    @property
    def schedule_step(self) -> int:
        """The learning-rate schedule's position: the next step uses `model.schedule(schedule_step)` (`step`
        for an optimizer without a schedule)."""
        count = _schedule_count(self._opt_state)
        return self.step if count is None else int(jax.device_get(count))

    @mirrored
    def set_schedule_step(self, step: int) -> None:
        """Move the learning-rate schedule to `step` (a node joining a running training takes the run's
        position, not 0); later steps count on from there. Only the schedule's count moves: AdamW's own
        count, which bias-corrects its moments, still counts this loop's steps (a fresh AdamW state with a
        large count would take huge first steps), and so does `step`. Kept by `state_dict`. Nothing to move
        for an optimizer without a schedule."""
        if not 0 <= step < 2**31:
            raise LocalProtocolError(f"schedule step must be in [0, 2**31), got {step}")
        count = _schedule_count(self._opt_state)
        if count is None:
            return
        moved = jax.device_put(np.asarray(step, count.dtype), self._replicated)
        self._opt_state = _with_schedule_count(self._opt_state, moved)

    def learning_rate(self) -> float:
        """The inner learning rate the next step will use."""
        schedule = self.model.schedule
        return self.model.lr if schedule is None else float(schedule(self.schedule_step))

    # -- checkpoints -------------------------------------------------------------------------------

    @mirrored
    def state_dict(self) -> dict[str, np.ndarray]:
        """Everything needed to continue identically: `params/<name>`, `opt/<path>`, `step`,
        `data_position`; all numpy arrays (copies)."""
        state = {f"params/{k}": v for k, v in self.params.items()}
        names, leaves, _ = _tree_names(self._opt_state)
        state.update({f"opt/{n}": host_copy(leaf) for n, leaf in zip(names, leaves)})
        state["step"] = np.asarray(self.step, np.int64)
        state["data_position"] = np.asarray(self.batches.position if self.batches is not None else 0, np.int64)
        return state

    @mirrored
    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore from `state_dict()` output (of a loop with the same configs). Raises
        `LocalProtocolError` if names or shapes differ; on error nothing is changed."""
        names, leaves, treedef = _tree_names(self._opt_state)
        expected = {f"opt/{n}": leaf for n, leaf in zip(names, leaves)}
        params = {k[len("params/"):]: v for k, v in state.items() if k.startswith("params/")}
        extra = set(state) - set(expected) - {f"params/{k}" for k in params} - {"step", "data_position"}
        missing = (set(expected) | {"step", "data_position"}) - set(state)
        if extra or missing:
            raise LocalProtocolError(f"state dict mismatch: missing {sorted(missing)[:5]}, extra {sorted(extra)[:5]}")
        for name, leaf in expected.items():
            if np.shape(state[name]) != leaf.shape:
                raise LocalProtocolError(f"{name} has shape {np.shape(state[name])}, expected {leaf.shape}")
        new_params = self._put(params)
        shardings = jax.tree_util.tree_leaves(self._steps.state)
        opt_leaves = [jax.device_put(np.array(state[n], leaf.dtype, copy=True), sharding)
                      for (n, leaf), sharding in zip(expected.items(), shardings)]
        self._params = new_params
        self._opt_state = jax.tree_util.tree_unflatten(treedef, opt_leaves)
        self.step = int(state["step"])
        if self.batches is not None:
            self.batches.seek(int(state["data_position"]))


if __name__ == "__main__":  # `python -m node.island.train`: one island training alone
    from node.island.alone import main

    sys.exit(main())

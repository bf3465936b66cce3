"""What an island trains, as a library user hands it to diloco: a `Model` and a `Task`.

A `Model` is parameters, a loss and an inner optimizer:

    model = Model(name="mlp", init=init, loss=loss, lr=1e-3)           # an init/apply pair, any pytree
    model = Model.from_nnx("cnn", lambda rngs: Net(rngs=rngs), loss)   # or a Flax NNX module

`init(key)` returns the parameters (any pytree of float arrays) for a `jax.random.key`; `loss(params, batch)`
returns the mean training loss of a batch (a scalar, traceable under `jax.jit`). diloco moves parameters
between the inner loop, the ledger and the wire in *flat form*: a dict from dotted names (the pytree's key
paths, e.g. `"dense1.kernel"`) to float32 arrays; `Model.shapes` lists them. The inner optimizer (an
`optax.GradientTransformation`, default AdamW with warmup and cosine decay) sees that flat dict. `lr` is its
peak learning rate: the outer step bounds what one update may move by it (`protocol.ledger.bound`).

A `Task` adds the data: `batches` (an iterable of batches, or a function of the node's peer id returning one,
so each node can read its own shard), fixed `heldout` batches for evaluation, and `tokens_per_batch` (what one
batch counts: tokens, or examples), which weights each node's updates in the outer step. A batch is any
pytree of arrays with the batch on the leading axis; the island's devices split that axis.

The CLI's byte-level transformer is one such model (`node.island.bytelm`); `diloco.run(task)` runs a node
around any of them, with the same flags as `diloco-node`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import jax
import numpy as np
import optax

from node.island.tokens import DataError
from protocol.errors import LocalProtocolError

__all__ = ["Batches", "IterableBatches", "Model", "Task", "TaskDataError", "TaskError", "check_shapes",
           "default_optimizer", "flat_name", "nest_flat"]


class TaskError(LocalProtocolError):
    """A `Model` or `Task` that diloco cannot train as given (the user's to fix; one line on the library path)."""


Batches = Any  # a BatchSource (node.island.train), an iterable of batches, or a function of the peer id


def flat_name(path: Sequence[Any]) -> str:
    """The dotted name of a pytree key path: `("blocks", 0, "mlp")` -> `"blocks.0.mlp"`."""
    tu = jax.tree_util
    parts = []
    for entry in path:
        if isinstance(entry, (tu.DictKey, tu.FlattenedIndexKey)):
            parts.append(str(entry.key))
        elif isinstance(entry, tu.SequenceKey):
            parts.append(str(entry.idx))
        elif isinstance(entry, tu.GetAttrKey):
            parts.append(entry.name)
        else:
            parts.append(str(entry))
    return ".".join(parts)


def default_optimizer(lr: float, *, warmup_steps: int = 50, total_steps: int = 10_000, min_lr_ratio: float = 0.1,
                      weight_decay: float = 0.1, b1: float = 0.9, b2: float = 0.95, eps: float = 1e-8,
                      clip_norm: float = 1.0) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """The inner optimizer DiLoCo uses (and the CLI's), with its schedule: global-norm clipping, then AdamW
    (weight decay on matrices only) on a linear warmup from 0 to `lr` over `warmup_steps` and a cosine decay
    to `min_lr_ratio * lr` at `total_steps`, constant after."""
    schedule = optax.warmup_cosine_decay_schedule(init_value=0.0, peak_value=lr, warmup_steps=warmup_steps,
                                                  decay_steps=total_steps, end_value=lr * min_lr_ratio)
    tx = optax.chain(optax.clip_by_global_norm(clip_norm),
                     optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay,
                                 mask=lambda params: {k: v.ndim >= 2 for k, v in params.items()}))
    return tx, schedule


@dataclasses.dataclass(frozen=True, eq=False)
class Model:
    """Parameters, a loss and an inner optimizer (see the module docstring). Hashable by identity: the
    inner loop compiles its steps once per `Model` object."""

    name: str
    init: Callable[[jax.Array], Any]
    loss: Callable[[Any, Any], jax.Array]
    lr: float = 1e-3
    optimizer: optax.GradientTransformation | None = None  # None: `default_optimizer(lr)`
    schedule: optax.Schedule | None = None  # the optimizer's learning-rate schedule, when it has one
    evaluate: Callable[[Any, Any], tuple[jax.Array, jax.Array]] | None = None  # -> (summed loss, count)
    metric: str = "loss"  # what `evaluate`'s mean is, for logs and reports ("bits/byte" for the byte model)
    embeddings: Iterable[str] = frozenset()  # flat names the outer step averages plainly (protocol.ledger)
    config: Mapping[str, object] = dataclasses.field(default_factory=dict)  # more run-wide fields peers must share
    trace: bool = True  # the run configuration holds the traced loss and optimizer (node.island.fingerprint)
    # the same loss with each layer's activations recomputed in the backward pass (`jax.checkpoint` per layer),
    # which `InnerLoop(remat=True)` trains with; a local memory choice, not part of the run configuration
    remat_loss: Callable[[Any, Any], jax.Array] | None = None

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str):
            raise TaskError("a Model needs a name")
        if not (isinstance(self.lr, (int, float)) and 0.0 < self.lr < math.inf):
            raise TaskError(f"Model {self.name!r}: lr must be a positive number, got {self.lr!r}")
        if isinstance(self.embeddings, str) or not all(isinstance(n, str) for n in self.embeddings):
            raise TaskError(f"Model {self.name!r}: embeddings must be tensor names (flat, e.g. "
                            f"'embed.embedding'), got {self.embeddings!r}")
        object.__setattr__(self, "embeddings", frozenset(self.embeddings))
        _check_config(self.name, self.config)
        if self.optimizer is None:
            tx, schedule = default_optimizer(self.lr)
            object.__setattr__(self, "optimizer", tx)
            object.__setattr__(self, "schedule", schedule)
        abstract = jax.eval_shape(self.init, jax.random.key(0))
        leaves, treedef = jax.tree_util.tree_flatten_with_path(abstract)
        names = [flat_name(path) for path, _ in leaves]
        if len(set(names)) != len(names):
            raise TaskError(f"Model {self.name!r}: two parameters share a name in {names}")
        for name, (_, leaf) in zip(names, leaves):
            if not np.issubdtype(leaf.dtype, np.floating):
                raise TaskError(f"Model {self.name!r}: parameter {name!r} is {leaf.dtype}, not a float array")
        object.__setattr__(self, "_names", tuple(names))
        object.__setattr__(self, "_treedef", treedef)
        object.__setattr__(self, "_shapes", dict(sorted((n, tuple(leaf.shape)) for n, (_, leaf) in zip(names, leaves))))
        object.__setattr__(self, "_init_flat", jax.jit(lambda key: self.flatten(self.init(key))))
        if unknown := sorted(self.embeddings - set(names)):
            raise TaskError(f"Model {self.name!r}: embeddings names {unknown}, which are not parameters "
                            f"(the flat names are {names[:8]}{'...' if len(names) > 8 else ''})")
        object.__setattr__(self, "_fields", {})

    @classmethod
    def from_nnx(cls, name: str, build: Callable[[Any], Any], loss: Callable[[Any, Any], jax.Array], *,
                 remat_build: Callable[[Any], Any] | None = None, **kwargs: Any) -> Model:
        """A model from a Flax NNX module: `build(rngs)` makes the module, `loss(module, batch)` its mean loss;
        `nnx.Param` variables are what diloco trains. `remat_build(rngs)`, when given, makes the same module
        with its layers under `nnx.remat` (the `remat_loss`). Other keyword arguments as for `Model`."""
        from flax import nnx

        def merger(make: Callable[[Any], Any]) -> Callable[[Mapping[str, jax.Array]], Any]:
            graphdef, _ = nnx.split(nnx.eval_shape(lambda: make(nnx.Rngs(0))), nnx.Param)
            return lambda flat: nnx.merge(graphdef, nnx.State(nest_flat(flat)))

        def init(key: jax.Array) -> dict[str, jax.Array]:
            state = nnx.state(build(nnx.Rngs(key)), nnx.Param)
            return {flat_name(path): var.get_value() for path, var in nnx.to_flat_state(state)}

        module = merger(build)

        def loss_fn(flat: Mapping[str, jax.Array], batch: Any) -> jax.Array:
            return loss(module(flat), batch)

        if remat_build is not None:
            remat_module = merger(remat_build)
            kwargs["remat_loss"] = lambda flat, batch: loss(remat_module(flat), batch)
        evaluate = kwargs.pop("evaluate", None)
        if evaluate is not None:
            kwargs["evaluate"] = lambda flat, batch: evaluate(module(flat), batch)
        model = cls(name=name, init=init, loss=loss_fn, **kwargs)
        object.__setattr__(model, "_module", module)
        return model

    # -- flat form ------------------------------------------------------------------------------------

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Name -> shape of every parameter, sorted by name (nothing allocated)."""
        return dict(self._shapes)  # type: ignore[attr-defined]

    @property
    def param_count(self) -> int:
        return sum(math.prod(shape) for shape in self._shapes.values())  # type: ignore[attr-defined]

    def flatten(self, params: Any) -> dict[str, Any]:
        """A params pytree in flat form (traceable)."""
        leaves, _ = jax.tree_util.tree_flatten_with_path(params)
        return {flat_name(path): leaf for path, leaf in leaves}

    def unflatten(self, flat: Mapping[str, Any]) -> Any:
        """Flat form back to the pytree `init` returns (traceable)."""
        return jax.tree_util.tree_unflatten(self._treedef, [flat[n] for n in self._names])  # type: ignore[attr-defined]

    def restore(self, flat: Mapping[str, Any]) -> Any:
        """The user's own object for parameters in flat form (checked first): the NNX module of a
        `from_nnx` model, else the pytree `init` returns (`unflatten`)."""
        self.check(flat)
        module = self.__dict__.get("_module")
        return module(flat) if module is not None else self.unflatten(flat)

    def init_params(self, seed: int) -> dict[str, np.ndarray]:
        """Freshly initialised parameters in flat form, float32 numpy copies; same seed, same arrays."""
        flat = self._init_flat(jax.random.key(seed))  # type: ignore[attr-defined]
        return {k: np.array(v, dtype=np.float32, copy=True) for k, v in sorted(flat.items())}

    def check(self, flat: Mapping[str, np.ndarray]) -> None:
        """Raise `LocalProtocolError` unless `flat` has exactly this model's names and shapes."""
        check_shapes(self._shapes, flat)  # type: ignore[attr-defined]

    # -- what the inner loop compiles ------------------------------------------------------------------

    def flat_loss(self, flat: Mapping[str, jax.Array], batch: Any) -> jax.Array:
        return self.loss(self.unflatten(flat), batch)

    def flat_remat_loss(self, flat: Mapping[str, jax.Array], batch: Any) -> jax.Array:
        """`remat_loss` in flat form; `TaskError` for a model that gives none."""
        if self.remat_loss is None:
            raise TaskError(f"Model {self.name!r} gives no remat_loss: it cannot recompute its activations "
                            "(Model(remat_loss=...), or Model.from_nnx(..., remat_build=...))")
        return self.remat_loss(self.unflatten(flat), batch)

    def flat_evaluate(self, flat: Mapping[str, jax.Array], batch: Any) -> tuple[jax.Array, jax.Array]:
        """(summed loss, count) of a batch: the model's `evaluate`, else the mean loss times the batch size."""
        if self.evaluate is not None:
            return self.evaluate(self.unflatten(flat), batch)
        n = jax.tree_util.tree_leaves(batch)[0].shape[0]
        return self.flat_loss(flat, batch) * n, np.float32(n)

    def run_fields(self, batch: Any) -> dict[str, object]:
        """The run-wide fields of this model (`node.settings.run_configuration`; PROTOCOL.md §7a), for training
        batches of the shapes of `batch`: its name, parameter count and peak learning rate; the hashes of its
        tensors (`model.structure`), of its traced loss (`model.computation`), of its traced inner optimizer
        (`inner.optimizer`) and of its schedule's values (`inner.schedule`) — `node.island.fingerprint`; the
        traced two only with `trace` — and then the fields of `config`, added."""
        from node.island.fingerprint import (abstract_batch, computation_hash, optimizer_hash, schedule_hash,
                                             structure_hash)

        spec = jax.tree_util.tree_map(lambda x: (tuple(x.shape), str(x.dtype)), abstract_batch(batch))
        key = repr(spec)
        if key not in self._fields:  # type: ignore[attr-defined]
            fields: dict[str, object] = {"model.name": self.name, "model.parameters": self.param_count,
                                         "model.structure": structure_hash(self._shapes),  # type: ignore[attr-defined]
                                         "inner.lr": float(self.lr), "inner.schedule": schedule_hash(self.schedule)}
            if self.trace:
                fields["model.computation"] = computation_hash(self.flat_loss, self._shapes, batch)  # type: ignore[attr-defined]
                fields["inner.optimizer"] = optimizer_hash(self.optimizer, self._shapes)  # type: ignore[attr-defined]
            for name, value in self.config.items():
                if name in fields and fields[name] != value:
                    raise TaskError(f"Model {self.name!r}: config sets {name}={value!r}, which diloco "
                                    f"takes from the model ({fields[name]!r}): leave it out")
                fields[name] = value
            self._fields[key] = fields  # type: ignore[attr-defined]
        return dict(self._fields[key])  # type: ignore[attr-defined]


def _check_config(model: str, config: Mapping[str, object]) -> None:
    """`Model.config` as the run configuration can hold it (`protocol.runconfig`), or a clear error."""
    from protocol.runconfig import encode_config

    if not isinstance(config, Mapping):
        raise TaskError(f"Model {model!r}: config must be a dict of run-wide fields, got {type(config).__name__}")
    for name, value in config.items():
        if not isinstance(value, (bool, int, float, str, tuple, list, type(None))) or (
                isinstance(value, (tuple, list)) and not all(isinstance(v, str) for v in value)):
            raise TaskError(f"Model {model!r}: config[{name!r}] is {type(value).__name__}; a run-wide "
                            "field is a number, a string, a bool, None or a list of strings")
    try:
        encode_config(config)  # type: ignore[arg-type]
    except (TypeError, ValueError) as exc:
        raise TaskError(f"Model {model!r}: config: {exc} (names like 'model.heads')") from None


def check_shapes(expected: Mapping[str, tuple[int, ...]], flat: Mapping[str, np.ndarray]) -> None:
    """Raise `LocalProtocolError` unless `flat` has exactly the names and shapes of `expected`."""
    if set(flat) != set(expected):
        missing = sorted(set(expected) - set(flat))[:5]
        extra = sorted(set(flat) - set(expected))[:5]
        raise TaskError(f"parameter names do not match the model: missing {missing}, extra {extra}")
    for name, shape in expected.items():
        if tuple(np.shape(flat[name])) != shape:
            raise TaskError(f"parameter {name!r} has shape {np.shape(flat[name])}, model needs {shape}")


def nest_flat(flat: Mapping[str, object]) -> dict:
    """`{"blocks.0.mlp.fc.kernel": a}` -> `{"blocks": {0: {"mlp": {"fc": {"kernel": a}}}}}`."""
    nested: dict = {}
    for name, value in flat.items():
        parts = [int(p) if p.isdigit() else p for p in name.split(".")]
        node = nested
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    return nested


class IterableBatches:
    """A `BatchSource` over an iterable: `position` counts the batches drawn; `seek(n)` (a restart resuming
    from a checkpoint) starts the iterable again and skips `n` batches (a one-shot iterator, which cannot
    start again, is only moved forward). `example()` is the next batch, peeked: not drawn."""

    def __init__(self, batches: Iterable[Any]) -> None:
        self._source = batches
        self._it: Iterator[Any] = iter(batches)
        self._peeked: list[Any] = []
        self.position = 0

    def example(self) -> Any:
        if not self._peeked:
            self._peeked.append(self._draw())
        return self._peeked[0]

    def _draw(self) -> Any:
        try:
            return next(self._it)
        except StopIteration:
            raise TaskError(f"the batches ran out after {self.position} batches") from None

    def next_batch(self) -> Any:
        batch = self._peeked.pop() if self._peeked else self._draw()
        self.position += 1
        return batch

    def seek(self, position: int) -> None:
        position = int(position)
        if position == self.position:
            return
        if iter(self._source) is not self._source:  # an iterable: start it again
            self._it, self._peeked, self.position = iter(self._source), [], 0
        elif position < self.position:
            raise TaskError("an iterator cannot go back: give an iterable (or a function) to resume")
        while self.position < position:  # a one-shot iterator goes on from where it is
            self.next_batch()


@dataclasses.dataclass(frozen=True, eq=False)
class Task:
    """A model and its data (see the module docstring). `example`: a batch of the training batches' shapes and
    dtypes (only those are read), for the run configuration; default: the first batch of `batches`, peeked."""

    model: Model
    batches: Batches
    tokens_per_batch: int
    heldout: Sequence[Any] | Callable[[], Sequence[Any]] = ()
    example: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, Model):
            raise TaskError(f"Task needs a diloco.Model, got {type(self.model).__name__}")
        if not (isinstance(self.tokens_per_batch, int) and self.tokens_per_batch > 0):
            raise TaskError(f"tokens_per_batch must be a positive int, got {self.tokens_per_batch!r}")

    def open(self, peer_id: str) -> tuple[Any, list[Any]]:
        """(BatchSource, held-out batches) for the node `peer_id`: reads data, so run it in a worker thread.
        A file the task's functions cannot read is a `DataError` naming it (`OSError` turned into one)."""
        try:
            source = self.batches(peer_id) if callable(self.batches) and not _is_source(self.batches) else self.batches
            if not _is_source(source):
                source = IterableBatches(source)
            heldout = self.heldout() if callable(self.heldout) else self.heldout
        except OSError as exc:
            raise TaskDataError(f"the task's data: {exc}") from None
        return source, heldout if isinstance(heldout, list) else list(heldout)  # a list subclass kept (HeldOut)

    def run_fields(self, peer_id: str) -> dict[str, object]:
        """The model's run-wide fields (`Model.run_fields`) for this task's batches; without `example`, the
        batches of `peer_id` are opened (once per task) and their first batch peeked."""
        example = self.example
        if example is None:
            if (example := self.__dict__.get("_example")) is None:
                source, _ = self.open(peer_id)
                try:
                    example = source.example() if hasattr(source, "example") else None
                except OSError as exc:
                    raise TaskDataError(f"the task's data: {exc}") from None
                if example is None:
                    raise TaskError("the task's batches have no example(): give Task(example=a batch)")
                object.__setattr__(self, "_example", example)
        return self.model.run_fields(example)


class TaskDataError(DataError):
    """A library task's data cannot be read (a file its functions open is missing, say): a user error."""


def _is_source(obj: Any) -> bool:
    return all(hasattr(obj, a) for a in ("next_batch", "seek", "position"))


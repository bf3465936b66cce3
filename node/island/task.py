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

from protocol.errors import LocalProtocolError

__all__ = ["Batches", "IterableBatches", "Model", "Task", "check_shapes", "default_optimizer", "flat_name", "nest_flat"]

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
    embeddings: frozenset[str] = frozenset()  # flat names the outer step averages plainly (protocol.ledger)
    config: Mapping[str, object] = dataclasses.field(default_factory=dict)  # run-wide fields peers must share

    def __post_init__(self) -> None:
        if not self.name:
            raise LocalProtocolError("a Model needs a name")
        if not 0.0 < self.lr < math.inf:
            raise LocalProtocolError(f"Model {self.name!r}: lr must be a positive number, got {self.lr!r}")
        if self.optimizer is None:
            tx, schedule = default_optimizer(self.lr)
            object.__setattr__(self, "optimizer", tx)
            object.__setattr__(self, "schedule", schedule)
        abstract = jax.eval_shape(self.init, jax.random.key(0))
        leaves, treedef = jax.tree_util.tree_flatten_with_path(abstract)
        names = [flat_name(path) for path, _ in leaves]
        if len(set(names)) != len(names):
            raise LocalProtocolError(f"Model {self.name!r}: two parameters share a name in {names}")
        for name, (_, leaf) in zip(names, leaves):
            if not np.issubdtype(leaf.dtype, np.floating):
                raise LocalProtocolError(f"Model {self.name!r}: parameter {name!r} is {leaf.dtype}, not a float array")
        object.__setattr__(self, "_names", tuple(names))
        object.__setattr__(self, "_treedef", treedef)
        object.__setattr__(self, "_shapes", dict(sorted((n, tuple(leaf.shape)) for n, (_, leaf) in zip(names, leaves))))
        object.__setattr__(self, "_init_flat", jax.jit(lambda key: self.flatten(self.init(key))))

    @classmethod
    def from_nnx(cls, name: str, build: Callable[[Any], Any], loss: Callable[[Any, Any], jax.Array], **kwargs: Any) -> Model:
        """A model from a Flax NNX module: `build(rngs)` makes the module, `loss(module, batch)` its mean loss;
        `nnx.Param` variables are what diloco trains. Other keyword arguments as for `Model`."""
        from flax import nnx

        graphdef, _ = nnx.split(nnx.eval_shape(lambda: build(nnx.Rngs(0))), nnx.Param)

        def init(key: jax.Array) -> dict[str, jax.Array]:
            state = nnx.state(build(nnx.Rngs(key)), nnx.Param)
            return {flat_name(path): var.get_value() for path, var in nnx.to_flat_state(state)}

        def module(flat: Mapping[str, jax.Array]) -> Any:
            return nnx.merge(graphdef, nnx.State(nest_flat(flat)))

        def loss_fn(flat: Mapping[str, jax.Array], batch: Any) -> jax.Array:
            return loss(module(flat), batch)

        evaluate = kwargs.pop("evaluate", None)
        if evaluate is not None:
            kwargs["evaluate"] = lambda flat, batch: evaluate(module(flat), batch)
        return cls(name=name, init=init, loss=loss_fn, **kwargs)

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

    def flat_evaluate(self, flat: Mapping[str, jax.Array], batch: Any) -> tuple[jax.Array, jax.Array]:
        """(summed loss, count) of a batch: the model's `evaluate`, else the mean loss times the batch size."""
        if self.evaluate is not None:
            return self.evaluate(self.unflatten(flat), batch)
        n = jax.tree_util.tree_leaves(batch)[0].shape[0]
        return self.flat_loss(flat, batch) * n, np.float32(n)

    def run_fields(self) -> dict[str, object]:
        """The run-wide fields of this model (`node.settings.run_configuration`): `config` as given, else the
        name, the parameter count and the peak learning rate."""
        if self.config:
            return dict(self.config)
        return {"model.name": self.name, "model.parameters": self.param_count, "inner.lr": self.lr}


def check_shapes(expected: Mapping[str, tuple[int, ...]], flat: Mapping[str, np.ndarray]) -> None:
    """Raise `LocalProtocolError` unless `flat` has exactly the names and shapes of `expected`."""
    if set(flat) != set(expected):
        missing = sorted(set(expected) - set(flat))[:5]
        extra = sorted(set(flat) - set(expected))[:5]
        raise LocalProtocolError(f"parameter names do not match the model: missing {missing}, extra {extra}")
    for name, shape in expected.items():
        if tuple(np.shape(flat[name])) != shape:
            raise LocalProtocolError(f"parameter {name!r} has shape {np.shape(flat[name])}, model needs {shape}")


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
            raise LocalProtocolError(f"the batches ran out after {self.position} batches") from None

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
            raise LocalProtocolError("an iterator cannot go back: give an iterable (or a function) to resume")
        while self.position < position:  # a one-shot iterator goes on from where it is
            self.next_batch()


@dataclasses.dataclass(frozen=True, eq=False)
class Task:
    """A model and its data (see the module docstring)."""

    model: Model
    batches: Batches
    tokens_per_batch: int
    heldout: Sequence[Any] | Callable[[], Sequence[Any]] = ()

    def __post_init__(self) -> None:
        if not (isinstance(self.tokens_per_batch, int) and self.tokens_per_batch > 0):
            raise LocalProtocolError(f"tokens_per_batch must be a positive int, got {self.tokens_per_batch!r}")

    def open(self, peer_id: str) -> tuple[Any, list[Any]]:
        """(BatchSource, held-out batches) for the node `peer_id`: reads data, so run it in a worker thread."""
        source = self.batches(peer_id) if callable(self.batches) and not _is_source(self.batches) else self.batches
        if not _is_source(source):
            source = IterableBatches(source)
        heldout = self.heldout() if callable(self.heldout) else self.heldout
        return source, heldout if isinstance(heldout, list) else list(heldout)  # a list subclass kept (HeldOut)


def _is_source(obj: Any) -> bool:
    return all(hasattr(obj, a) for a in ("next_batch", "seek", "position"))


"""A decoder-only byte-level transformer language model in Flax NNX, and its flat parameter form.

Architecture (GPT-style, modernised): token embedding -> `n_layers` pre-norm blocks
(RMSNorm -> causal multi-head attention with rotary positions -> residual; RMSNorm -> GELU MLP ->
residual) -> final RMSNorm -> logits. No biases, no dropout. Rotary positions keep the parameter set
independent of `seq_len`. Embeddings are tied by default (`ModelConfig.tie_embeddings`): the output
projection is the transpose of the input embedding, so with a 256-byte vocabulary almost every parameter
sits in the blocks. Residual output projections are initialised with std `init_std / sqrt(2 n_layers)`.

Flat form: the node trains, exchanges and averages parameters as `dict[str, np.ndarray]` of float32 with
stable dotted names, e.g. `"blocks.0.attn.qkv.kernel"`. `flatten_params`, `unflatten_params`,
`init_params` and `make_apply` convert between the module and that form; `embedding_names` lists the
names the outer step must average plainly (not radial-directionally).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from node.island.config import ModelConfig
from node.island.task import check_shapes, nest_flat

__all__ = [
    "Transformer",
    "build_model",
    "check_flat",
    "embedding_names",
    "flatten_params",
    "init_params",
    "make_apply",
    "param_count",
    "param_shapes",
    "unflatten_params",
]

FlatParams = dict[str, np.ndarray]


def _normal(std: float) -> nnx.Initializer:
    return nnx.initializers.normal(stddev=std)


def rotary(x_BxTxNxH: jax.Array, base: float) -> jax.Array:
    """Rotate feature pairs (first half, second half) of each head by position-dependent angles."""
    _, t, _, h = x_BxTxNxH.shape
    half = h // 2
    freqs_F = base ** (-jnp.arange(half, dtype=jnp.float32) / half)
    angles_TxF = jnp.arange(t, dtype=jnp.float32)[:, None] * freqs_F[None, :]
    cos_1xTx1xF = jnp.cos(angles_TxF)[None, :, None, :].astype(x_BxTxNxH.dtype)
    sin_1xTx1xF = jnp.sin(angles_TxF)[None, :, None, :].astype(x_BxTxNxH.dtype)
    x1, x2 = x_BxTxNxH[..., :half], x_BxTxNxH[..., half:]
    return jnp.concatenate([x1 * cos_1xTx1xF - x2 * sin_1xTx1xF, x1 * sin_1xTx1xF + x2 * cos_1xTx1xF], axis=-1)


def causal_attention(q_BxTxNxH: jax.Array, k_BxTxNxH: jax.Array, v_BxTxNxH: jax.Array) -> jax.Array:
    """Causal softmax attention: cuDNN's fused (flash) kernel on an NVIDIA GPU in bfloat16 or float16, which
    never materialises the T x T scores; XLA's product elsewhere, or where cuDNN refuses the shapes."""
    if jax.default_backend() == "gpu" and q_BxTxNxH.dtype in (jnp.bfloat16, jnp.float16):
        try:
            return jax.nn.dot_product_attention(q_BxTxNxH, k_BxTxNxH, v_BxTxNxH, is_causal=True,
                                                implementation="cudnn")
        except (NotImplementedError, RuntimeError, ValueError):  # head size, cuDNN version, compute capability
            pass
    return jax.nn.dot_product_attention(q_BxTxNxH, k_BxTxNxH, v_BxTxNxH, is_causal=True, implementation="xla")


class Attention(nnx.Module):
    """Causal multi-head self-attention with one fused QKV projection and rotary positions."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs) -> None:
        dtype = jnp.dtype(cfg.dtype)
        out_std = cfg.init_std / math.sqrt(2 * cfg.n_layers)
        self.cfg = cfg
        self.qkv = nnx.Linear(cfg.d_model, 3 * cfg.d_model, use_bias=False, dtype=dtype,
                              kernel_init=_normal(cfg.init_std), rngs=rngs)
        self.out = nnx.Linear(cfg.d_model, cfg.d_model, use_bias=False, dtype=dtype,
                              kernel_init=_normal(out_std), rngs=rngs)

    def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
        b, t, _ = x_BxTxD.shape
        n, h = self.cfg.n_heads, self.cfg.head_dim
        qkv_BxTx3xNxH = self.qkv(x_BxTxD).reshape(b, t, 3, n, h)
        q_BxTxNxH = rotary(qkv_BxTx3xNxH[:, :, 0], self.cfg.rope_base)
        k_BxTxNxH = rotary(qkv_BxTx3xNxH[:, :, 1], self.cfg.rope_base)
        v_BxTxNxH = qkv_BxTx3xNxH[:, :, 2]
        y_BxTxNxH = causal_attention(q_BxTxNxH, k_BxTxNxH, v_BxTxNxH)
        return self.out(y_BxTxNxH.reshape(b, t, n * h))


class Mlp(nnx.Module):
    """Two-layer GELU feed-forward network, `d_model -> d_ff -> d_model`."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs) -> None:
        dtype = jnp.dtype(cfg.dtype)
        out_std = cfg.init_std / math.sqrt(2 * cfg.n_layers)
        self.fc = nnx.Linear(cfg.d_model, cfg.d_ff, use_bias=False, dtype=dtype,
                             kernel_init=_normal(cfg.init_std), rngs=rngs)
        self.proj = nnx.Linear(cfg.d_ff, cfg.d_model, use_bias=False, dtype=dtype,
                               kernel_init=_normal(out_std), rngs=rngs)

    def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
        return self.proj(jax.nn.gelu(self.fc(x_BxTxD)))


class Block(nnx.Module):
    """Pre-norm residual block: `x + attn(norm(x))`, then `x + mlp(norm(x))`."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs) -> None:
        dtype = jnp.dtype(cfg.dtype)
        self.norm1 = nnx.RMSNorm(cfg.d_model, dtype=dtype, rngs=rngs)
        self.attn = Attention(cfg, rngs=rngs)
        self.norm2 = nnx.RMSNorm(cfg.d_model, dtype=dtype, rngs=rngs)
        self.mlp = Mlp(cfg, rngs=rngs)

    def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
        x_BxTxD = x_BxTxD + self.attn(self.norm1(x_BxTxD))
        return x_BxTxD + self.mlp(self.norm2(x_BxTxD))


def _run_block(block: Block, x_BxTxD: jax.Array) -> jax.Array:
    return block(x_BxTxD)


class Transformer(nnx.Module):
    """Maps token ids `tokens_BxT` (int) to next-token logits `logits_BxTxV` (float32)."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs, remat: bool = False) -> None:
        dtype = jnp.dtype(cfg.dtype)
        self.cfg = cfg
        self.remat = remat  # recompute each block's activations in the backward pass (`InnerLoop(remat=True)`)
        self.embed = nnx.Embed(cfg.vocab_size, cfg.d_model, dtype=dtype,
                               embedding_init=_normal(cfg.init_std), rngs=rngs)
        self.blocks = nnx.List([Block(cfg, rngs=rngs) for _ in range(cfg.n_layers)])
        self.norm = nnx.RMSNorm(cfg.d_model, dtype=dtype, rngs=rngs)
        if not cfg.tie_embeddings:
            self.lm_head = nnx.Linear(cfg.d_model, cfg.vocab_size, use_bias=False, dtype=dtype,
                                      kernel_init=_normal(cfg.init_std), rngs=rngs)

    def __call__(self, tokens_BxT: jax.Array) -> jax.Array:
        x_BxTxD = self.embed(tokens_BxT)
        for block in self.blocks:
            x_BxTxD = nnx.remat(_run_block)(block, x_BxTxD) if self.remat else block(x_BxTxD)
        x_BxTxD = self.norm(x_BxTxD)
        if self.cfg.tie_embeddings:
            logits_BxTxV = self.embed.attend(x_BxTxD)
        else:
            logits_BxTxV = self.lm_head(x_BxTxD)
        return logits_BxTxV.astype(jnp.float32)


# ---- flat parameter form -------------------------------------------------------------------------


def _name(path: tuple) -> str:
    return ".".join(str(part) for part in path)


def flatten_params(model: Transformer) -> FlatParams:
    """The model's parameters as float32 numpy arrays (copies) under stable dotted names, sorted."""
    state = nnx.state(model, nnx.Param)
    flat = {_name(path): np.array(var.get_value(), dtype=np.float32) for path, var in nnx.to_flat_state(state)}
    return dict(sorted(flat.items()))


def unflatten_params(model: Transformer, flat: Mapping[str, np.ndarray]) -> None:
    """Write `flat` into `model` in place. Names and shapes must match `param_shapes(model.cfg)` exactly."""
    check_flat(model.cfg, flat)
    arrays = {k: jnp.asarray(np.array(v, np.float32, copy=True)) for k, v in flat.items()}
    nnx.update(model, nnx.State(nest_flat(arrays)))


@functools.lru_cache(maxsize=16)
def _init_fn(cfg: ModelConfig) -> Callable[[jax.Array], dict[str, jax.Array]]:
    def init(key: jax.Array) -> dict[str, jax.Array]:
        state = nnx.state(Transformer(cfg, rngs=nnx.Rngs(key)), nnx.Param)
        return {_name(path): var.get_value() for path, var in nnx.to_flat_state(state)}

    return jax.jit(init)


def init_params(cfg: ModelConfig, seed: int) -> FlatParams:
    """Freshly initialised parameters in flat form; the same `cfg` and `seed` give the same arrays
    (initialisation runs as one jitted function, compiled once per config)."""
    flat = _init_fn(cfg)(jax.random.key(seed))
    return {k: np.array(v, dtype=np.float32, copy=True) for k, v in sorted(flat.items())}


def _abstract(cfg: ModelConfig) -> Transformer:
    return nnx.eval_shape(lambda: Transformer(cfg, rngs=nnx.Rngs(0)))


def build_model(cfg: ModelConfig, flat: Mapping[str, np.ndarray]) -> Transformer:
    """A concrete `Transformer` holding (copies of) `flat`, built without running the initialisers."""
    model = _abstract(cfg)
    unflatten_params(model, flat)
    return model


@functools.lru_cache(maxsize=16)
def _shapes(cfg: ModelConfig) -> tuple[tuple[str, tuple[int, ...]], ...]:
    state = nnx.state(_abstract(cfg), nnx.Param)
    return tuple(sorted((_name(path), tuple(var.get_value().shape)) for path, var in nnx.to_flat_state(state)))


def param_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every parameter, sorted by name, without allocating any (fine for `large`)."""
    return dict(_shapes(cfg))


def param_count(cfg: ModelConfig) -> int:
    """Number of trainable parameters."""
    return sum(math.prod(shape) for shape in param_shapes(cfg).values())


def embedding_names(cfg: ModelConfig) -> tuple[str, ...]:
    """Names of the embedding-like arrays (input embedding, untied output head), which the outer step
    averages plainly rather than radial-directionally."""
    names = ["embed.embedding"]
    if not cfg.tie_embeddings:
        names.append("lm_head.kernel")
    return tuple(names)


def check_flat(cfg: ModelConfig, flat: Mapping[str, np.ndarray]) -> None:
    """Raise `LocalProtocolError` unless `flat` has exactly the model's parameter names and shapes."""
    check_shapes(param_shapes(cfg), flat)


@functools.lru_cache(maxsize=16)
def make_apply(cfg: ModelConfig) -> Callable[[Mapping[str, jax.Array], jax.Array], jax.Array]:
    """A pure function `apply(flat_params, tokens_BxT) -> logits_BxTxV`, traceable under `jax.jit`.

    The module graph is built once, abstractly; each call only rebinds the flat arrays to it. The same
    function object is returned for equal configs, so `jax.jit` caches compile once per shape.
    """
    graphdef, _ = nnx.split(_abstract(cfg), nnx.Param)

    def apply(flat: Mapping[str, jax.Array], tokens_BxT: jax.Array) -> jax.Array:
        return nnx.merge(graphdef, nest_flat(flat))(tokens_BxT)

    return apply

"""The CLI's model as a library user would write it: the byte-level transformer (`node.island.model`) on the
embedded corpus or the user's files (`node.island.data`), as a `node.island.task.Model` and `Task`.

`byte_lm(model_cfg, inner_cfg)` is the model (one object per pair of configs, so every loop of a process
compiles its steps once); its held-out metric is bits per byte (bits per token for pre-tokenized data), and
its run-wide fields are the configs' (`model.*`, `inner.*`, `data.batch_size`, `data.data_seed`) and the
tokenizer's content hash (`data.tokenizer`, "" for bytes).
`byte_lm_task(cfg, eval_batches)` adds the data: each node trains on its shard of the train split (keyed by
its peer id) and evaluates on the first `eval_batches` held-out batches.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
import optax

from node.island.config import Config, InnerConfig, ModelConfig
from node.island.data import Dataset
from node.island.model import Transformer, embedding_names
from node.island.task import Model, Task, default_optimizer
from node.island.tokens import tokenizer_hash

__all__ = ["byte_lm", "byte_lm_model", "byte_lm_task", "lr_schedule"]


def lr_schedule(cfg: InnerConfig) -> optax.Schedule:
    """Linear warmup from 0 to `lr` over `warmup_steps`, cosine decay to `min_lr_ratio * lr` at
    `total_steps`, then constant."""
    return _optimizer(cfg)[1]


def _optimizer(cfg: InnerConfig) -> tuple[optax.GradientTransformation, optax.Schedule]:
    return default_optimizer(cfg.lr, warmup_steps=cfg.warmup_steps, total_steps=cfg.total_steps,
                             min_lr_ratio=cfg.min_lr_ratio, weight_decay=cfg.weight_decay, b1=cfg.b1, b2=cfg.b2,
                             eps=cfg.eps, clip_norm=cfg.clip_norm)


def _summed_nats(module: Transformer, batch_BxT1: jax.Array) -> jax.Array:
    """Summed next-token negative log-likelihood: inputs are a row's first T tokens, targets its last T."""
    logits_BxTxV = module(batch_BxT1[:, :-1])
    nll_BxT = optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV, batch_BxT1[:, 1:])
    return jnp.sum(nll_BxT, dtype=jnp.float32)


def _mean_nats(module: Transformer, batch_BxT1: jax.Array) -> jax.Array:
    b, t1 = batch_BxT1.shape
    return _summed_nats(module, batch_BxT1) / (b * (t1 - 1))


def _summed_bits(module: Transformer, batch_BxT1: jax.Array) -> tuple[jax.Array, jax.Array]:
    b, t1 = batch_BxT1.shape
    return _summed_nats(module, batch_BxT1) / math.log(2), jnp.float32(b * (t1 - 1))


@functools.lru_cache(maxsize=8)
def byte_lm(model_cfg: ModelConfig, inner_cfg: InnerConfig, batch_size: int = 8, data_seed: int = 0,
            tokenizer: str = "") -> Model:
    """The byte-level transformer for these configs (the same object for equal arguments). `tokenizer`: the
    SHA-256 of the tokenizer file text is encoded with ("" for bytes), which peers must share."""
    tx, schedule = _optimizer(inner_cfg)
    fields: dict[str, object] = {f"model.{k}": v for k, v in dataclasses.asdict(model_cfg).items()}
    fields.update({f"inner.{k}": v for k, v in dataclasses.asdict(inner_cfg).items()})
    fields.update({"data.batch_size": batch_size, "data.data_seed": data_seed, "data.tokenizer": tokenizer})
    return Model.from_nnx("byte-lm", lambda rngs: Transformer(model_cfg, rngs=rngs), _mean_nats,
                          remat_build=lambda rngs: Transformer(model_cfg, rngs=rngs, remat=True), lr=inner_cfg.lr,
                          optimizer=tx, schedule=schedule, evaluate=_summed_bits, metric="bits/byte",
                          embeddings=frozenset(embedding_names(model_cfg)), config=fields)


def byte_lm_of_fields(fields: Mapping[str, object]) -> Model:
    """The byte-level model whose `Model.config` is `fields` (the follower of an island builds its speaker's,
    `node.island.follow`)."""
    def part(prefix: str) -> dict[str, object]:
        return {k[len(prefix):]: v for k, v in fields.items() if k.startswith(prefix)}

    return byte_lm(ModelConfig(**part("model.")), InnerConfig(**part("inner.")), int(fields["data.batch_size"]),
                   int(fields["data.data_seed"]), str(fields["data.tokenizer"]))


def byte_lm_model(cfg: Config) -> Model:
    """`byte_lm` for the configs, batch size, data seed and tokenizer of `cfg`."""
    return byte_lm(cfg.model, cfg.inner, cfg.data.batch_size, cfg.data.data_seed, tokenizer_hash(cfg.data.tokenizer))


def byte_lm_task(cfg: Config, eval_batches: int = 4) -> Task:
    """The model and the data of `cfg`; the data is read when a node opens the task (`Task.open`)."""
    dataset = functools.cache(lambda: Dataset(cfg.data, seq_len=cfg.model.seq_len, vocab_size=cfg.model.vocab_size))
    return Task(model=byte_lm_model(cfg),
                batches=lambda peer_id: dataset().batcher(peer_id or None),
                heldout=lambda: dataset().heldout_batches(eval_batches),
                tokens_per_batch=cfg.data.batch_size * cfg.model.seq_len,
                example=np.zeros((cfg.data.batch_size, cfg.model.seq_len + 1), np.int32))  # rows of T + 1 tokens

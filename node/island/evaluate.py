"""Loss and held-out evaluation shared by the inner loop, the baseline and the CLI.

`bits_per_byte` is a summed next-token cross-entropy in bits (nats / ln 2) per unit predicted. For
text read as bytes a token is a byte; for text encoded with a tokenizer the unit is the bytes of text the
predicted tokens stand for (`node.island.data.HeldOut.n_bytes`), so both are bits per byte and compare;
for pre-tokenized files (whose text is unknown) it is bits per token.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

import jax
import jax.numpy as jnp
import optax

__all__ = ["bits_per_byte", "next_token_loss", "summed_loss"]

Apply = Callable[[Mapping[str, jax.Array], jax.Array], jax.Array]


def summed_loss(apply: Apply, params: Mapping[str, jax.Array], batch_BxT1: jax.Array) -> jax.Array:
    """Sum over all positions of the next-token negative log-likelihood (nats, float32).

    `batch_BxT1` holds `T + 1` tokens per row: inputs are the first `T`, targets the last `T`.
    """
    logits_BxTxV = apply(params, batch_BxT1[:, :-1])
    nll_BxT = optax.softmax_cross_entropy_with_integer_labels(logits_BxTxV, batch_BxT1[:, 1:])
    return jnp.sum(nll_BxT, dtype=jnp.float32)


def next_token_loss(apply: Apply, params: Mapping[str, jax.Array], batch_BxT1: jax.Array) -> jax.Array:
    """Mean next-token negative log-likelihood in nats: the training loss."""
    b, t1 = batch_BxT1.shape
    return summed_loss(apply, params, batch_BxT1) / (b * (t1 - 1))


def bits_per_byte(total_nats: float, n_units: int) -> float:
    """Convert a summed loss to bits per unit: per byte when `n_units` counts the bytes of text predicted
    (per token when it counts tokens of pre-tokenized data)."""
    if n_units <= 0:
        raise ValueError("bits_per_byte needs at least one predicted token")
    return total_nats / n_units / math.log(2)

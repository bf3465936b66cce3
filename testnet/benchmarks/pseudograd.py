"""Synthetic pseudo-gradients shaped and distributed like a real DiLoCo round's, for codec benchmarks.

`transformer_shapes(params)` lists a decoder-only transformer's tensors (tied embedding, pre-norm blocks
with fused QKV and a 4x MLP, RMSNorm scales) summing to about `params`. `adamw_delta` runs `steps`
AdamW steps on every tensor from a warm optimizer state and returns theta_start - theta_end, the
quantity a node compresses. Its gradient model has what shapes real pseudo-gradients:

- per-element signal-to-noise ratios that vary by output row (lognormal), so some elements move
  almost linearly (|delta| ~ lr * steps) and others random-walk (~ lr * sqrt(steps));
- embedding rows for tokens with Zipf frequencies: rare rows see a gradient in few steps, and Adam's
  small second moment then makes their few updates large (the heavy tail);
- decoupled weight decay on matrices, none on norm scales.
"""

from __future__ import annotations

import math

import numpy as np


def transformer_shapes(params: int) -> dict[str, tuple[int, ...]]:
    """Tensor shapes of a transformer with about `params` parameters (d_model a multiple of 64, vocab
    32 * d_model, at least one layer)."""
    d = max(64, 64 * round(math.sqrt(params / 152) / 64))
    vocab = 32 * d
    layers = max(1, round((params - vocab * d) / (12 * d * d + 2 * d)))
    shapes: dict[str, tuple[int, ...]] = {"embed": (vocab, d), "final_norm": (d,)}
    for i in range(layers):
        p = f"layers.{i:02d}."
        shapes |= {
            p + "attn_norm": (d,),
            p + "attn_qkv": (d, 3 * d),
            p + "attn_out": (d, d),
            p + "mlp_norm": (d,),
            p + "mlp_up": (d, 4 * d),
            p + "mlp_down": (4 * d, d),
        }
    return shapes


def adamw_delta(
    shapes: dict[str, tuple[int, ...]],
    *,
    steps: int = 16,
    lr: float = 1e-3,
    weight_decay: float = 0.1,
    beta1: float = 0.9,
    beta2: float = 0.95,
    eps: float = 1e-8,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """theta_start - theta_end after `steps` AdamW steps per tensor (float32), from a steady-state
    optimizer state, under the gradient model in the module docstring. Deterministic in `seed`."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, shape in shapes.items():
        rows = shape[0] if len(shape) == 2 else 1
        is_norm = len(shape) == 1
        # Per-row gradient scale and signal-to-noise ratio; per-element mean direction.
        scale = rng.lognormal(0.0, 1.0, size=(rows, 1)).astype(np.float32)
        snr = rng.lognormal(math.log(0.3), 0.8, size=(rows, 1)).astype(np.float32)
        mean = (rng.standard_normal(shape, dtype=np.float32).reshape(rows, -1) * snr) * scale
        if name == "embed":
            freq = 1.0 / (np.arange(rows, dtype=np.float64) + 10.0)
            present = np.minimum(1.0, 4096 * freq / freq.sum()).astype(np.float32)[:, None]
        else:
            present = np.ones((rows, 1), dtype=np.float32)
        theta0 = np.ones(mean.shape, np.float32) if is_norm else _normal(rng, mean.shape)
        theta = theta0.copy()
        # Warm state: what many earlier steps of the same gradient process would have left.
        m = present * mean + rng.standard_normal(mean.shape, dtype=np.float32) * scale * np.float32(0.23)
        v = present * (mean * mean + scale * scale)
        for _ in range(steps):
            hit = rng.random((rows, 1), dtype=np.float32) < present
            g = (mean + rng.standard_normal(mean.shape, dtype=np.float32) * scale) * hit
            m *= beta1
            m += (1 - beta1) * g
            v *= beta2
            v += (1 - beta2) * g * g
            update = m / (np.sqrt(v) + np.float32(eps))
            if not is_norm:
                update += weight_decay * theta
            theta -= np.float32(lr) * update
        out[name] = (theta0 - theta).reshape(shape).astype(np.float32)
    return out


def gaussian_delta(shapes: dict[str, tuple[int, ...]], *, seed: int = 0) -> dict[str, np.ndarray]:
    """Gaussian values with a lognormal scale per tensor (a light-tailed reference)."""
    rng = np.random.default_rng(seed)
    return {
        name: rng.standard_normal(shape, dtype=np.float32) * np.float32(rng.lognormal(-6.0, 1.0))
        for name, shape in shapes.items()
    }


def student_t_delta(shapes: dict[str, tuple[int, ...]], *, dof: float = 3.0, seed: int = 0) -> dict[str, np.ndarray]:
    """Student-t values (heavy tails, `dof` degrees of freedom) with a lognormal scale per tensor: a
    stress case, heavier-tailed than real pseudo-gradients."""
    rng = np.random.default_rng(seed)
    return {
        name: (rng.standard_t(dof, size=shape) * rng.lognormal(-6.0, 1.0)).astype(np.float32)
        for name, shape in shapes.items()
    }


def _normal(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)

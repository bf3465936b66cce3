"""Train your own model with diloco: a plain-JAX MLP (an init/apply pair) classifying points of three
interleaved spirals, generated here. Nothing about it is diloco's own model: the parameters are a nested
dict, the batches a dict of arrays, the loss a cross-entropy.

Two nodes on this machine (each draws its own stream of points, seeded by its peer id):

    python examples/mlp_spirals.py --run-id spirals --key a.key --listen 127.0.0.1:7000 --max-rounds 30
    python examples/mlp_spirals.py --run-id spirals --key b.key --peers 127.0.0.1:7000 --max-rounds 30

Every `diloco-node` flag works (`--help`), except `--model`, `--set` and `--data`, which choose diloco-node's own
model. Each node logs its held-out cross-entropy; at the end both print the same `STOPPED` digests.
"""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import optax

import diloco

CLASSES, HIDDEN, BATCH = 3, 64, 128


def spirals(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """`n` points of `CLASSES` noisy spiral arms in the unit disc, with their arm as the label."""
    label = rng.integers(0, CLASSES, n)
    radius = rng.uniform(0.05, 1.0, n)
    angle = 3.0 * np.pi * radius + 2.0 * np.pi * label / CLASSES + rng.normal(0.0, 0.2, n)
    points = np.stack([radius * np.cos(angle), radius * np.sin(angle)], axis=1)
    return {"x": points.astype(np.float32), "y": label.astype(np.int32)}


def init(key: jax.Array) -> dict:
    def dense(k: jax.Array, n_in: int, n_out: int) -> dict:
        return {"w": jax.random.normal(k, (n_in, n_out)) * jnp.sqrt(2.0 / n_in), "b": jnp.zeros(n_out)}

    k1, k2, k3 = jax.random.split(key, 3)
    return {"hidden1": dense(k1, 2, HIDDEN), "hidden2": dense(k2, HIDDEN, HIDDEN), "out": dense(k3, HIDDEN, CLASSES)}


def apply(params: dict, x: jax.Array) -> jax.Array:
    for layer in ("hidden1", "hidden2"):
        x = jax.nn.gelu(x @ params[layer]["w"] + params[layer]["b"])
    return x @ params["out"]["w"] + params["out"]["b"]


def loss(params: dict, batch: dict) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(apply(params, batch["x"]), batch["y"]).mean()


def batches(peer_id: str):
    """This node's training stream: deterministic, so a restarted node resumes it exactly."""
    rng = np.random.default_rng(zlib.crc32(peer_id.encode()))
    while True:
        yield spirals(rng, BATCH)


def task() -> diloco.Task:
    model = diloco.Model(name="mlp-spirals", init=init, loss=loss, lr=1e-2, metric="nats/example")
    heldout = [spirals(np.random.default_rng(2026), 512) for _ in range(2)]  # the same on every node
    return diloco.Task(model, batches=batches, heldout=heldout, tokens_per_batch=BATCH)


if __name__ == "__main__":
    raise SystemExit(diloco.run(task()))

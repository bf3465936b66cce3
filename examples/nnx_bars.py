"""Train your own Flax NNX module with diloco: a small convolutional network telling apart four kinds of
12x12 images generated here (a horizontal bar, a vertical bar, a diagonal, a cross), with its own optimizer
(plain Adam at a constant rate instead of diloco's default AdamW with warmup and cosine decay).

Two nodes on this machine:

    python examples/nnx_bars.py --run-id bars --key a.key --listen 127.0.0.1:7000 --max-rounds 20
    python examples/nnx_bars.py --run-id bars --key b.key --peers 127.0.0.1:7000 --max-rounds 20

Every `diloco-node` flag works (`--help`), except `--model`, `--set` and `--data`. The module may hold only
`nnx.Param` state (no BatchNorm statistics or dropout streams): diloco trains and exchanges the parameters.
"""

from __future__ import annotations

import zlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import diloco

SIZE, CLASSES, BATCH, LR = 12, 4, 64, 3e-3


def images(rng: np.random.Generator, n: int) -> dict[str, np.ndarray]:
    """`n` noisy images with one shape each at a random place; the label is the kind of shape."""
    label = rng.integers(0, CLASSES, n)
    x = rng.normal(0.0, 0.3, (n, SIZE, SIZE)).astype(np.float32)
    at = rng.integers(2, SIZE - 2, (n, 2))
    span = np.arange(-2, 3)
    for i in range(n):
        r, c = at[i]
        if label[i] in (0, 3):
            x[i, r, c + span] += 1.0
        if label[i] in (1, 3):
            x[i, r + span, c] += 1.0
        if label[i] == 2:
            x[i, r + span, c + span] += 1.0
    return {"image": x[..., None], "label": label.astype(np.int32)}


class BarNet(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.conv1 = nnx.Conv(1, 16, kernel_size=(3, 3), rngs=rngs)
        self.conv2 = nnx.Conv(16, 32, kernel_size=(3, 3), rngs=rngs)
        self.head = nnx.Linear(32, CLASSES, rngs=rngs)

    def __call__(self, image: jax.Array) -> jax.Array:
        x = nnx.relu(self.conv1(image))
        x = nnx.relu(self.conv2(x))
        return self.head(jnp.max(x, axis=(1, 2)))  # global max pooling: where the shape is does not matter


def loss(net: BarNet, batch: dict) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(net(batch["image"]), batch["label"]).mean()


def batches(peer_id: str):
    rng = np.random.default_rng(zlib.crc32(peer_id.encode()))
    while True:
        yield images(rng, BATCH)


def task() -> diloco.Task:
    model = diloco.Model.from_nnx("nnx-bars", lambda rngs: BarNet(rngs), loss, lr=LR, optimizer=optax.adam(LR),
                                  metric="nats/example")
    heldout = [images(np.random.default_rng(2026), 256)]
    return diloco.Task(model, batches=batches, heldout=heldout, tokens_per_batch=BATCH)


if __name__ == "__main__":
    raise SystemExit(diloco.run(task()))

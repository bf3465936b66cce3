"""Train your own language model with diloco: a character-level transformer in Flax NNX (2 layers, width 64,
4 heads, context 64; about 120k parameters) on a text file, with its own loss and a bits-per-character
held-out figure. Nothing here is diloco's model: the vocabulary is the file's characters, attention is written
out (one fused query/key/value projection split into heads), positions are learned.

Three nodes on this machine, on a text file of yours (without `--text`, the Python standard library's bundled
documentation, which every machine with Python has):

    python examples/char_transformer.py --text my.txt --run-id chars --key a.key --listen 127.0.0.1:7000 --max-rounds 40
    python examples/char_transformer.py --text my.txt --run-id chars --key b.key --peers 127.0.0.1:7000
    python examples/char_transformer.py --text my.txt --run-id chars --key c.key --peers 127.0.0.1:7000

`--text FILE`, `--heads N` and `--schedule-steps N` are this script's own flags; every other one is `diloco-node`'s
(`--help`). `--sample CHECKPOINT` prints text the trained model writes (from a node's `--checkpoint-dir` or
a `diloco-export` file: `diloco.load`). The
run's configuration holds the model's structure and its computation, so a node started with another `--heads`
(the same tensor shapes, the same parameter count) is refused at the handshake, naming the field.
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import zlib
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import diloco

WIDTH, LAYERS, CONTEXT, BATCH, LR = 64, 2, 64, 16, 3e-3
HELDOUT_FRACTION = 0.05


def default_text() -> str:
    """Text every machine with Python has: the standard library's bundled documentation topics."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


class Corpus:
    """The text as character ids: the vocabulary is its sorted set of characters; the last
    `HELDOUT_FRACTION` of it is held out."""

    def __init__(self, text: str) -> None:
        if len(text) < 20 * (CONTEXT + 1):
            raise ValueError(f"the text has {len(text)} characters: too short for a context of {CONTEXT}")
        self.chars = sorted(set(text))
        table = {c: i for i, c in enumerate(self.chars)}
        ids = np.fromiter((table[c] for c in text), np.int32, len(text))
        cut = int(len(ids) * (1 - HELDOUT_FRACTION))
        self.train, self.heldout = ids[:cut], ids[cut:]

    def windows(self, ids: np.ndarray, offsets: np.ndarray) -> np.ndarray:
        return np.stack([ids[o:o + CONTEXT + 1] for o in offsets])


class Block(nnx.Module):
    def __init__(self, width: int, heads: int, rngs: nnx.Rngs) -> None:
        self.heads = heads
        self.norm1, self.norm2 = nnx.LayerNorm(width, rngs=rngs), nnx.LayerNorm(width, rngs=rngs)
        self.qkv = nnx.Linear(width, 3 * width, rngs=rngs)
        self.out = nnx.Linear(width, width, rngs=rngs)
        self.up, self.down = nnx.Linear(width, 4 * width, rngs=rngs), nnx.Linear(4 * width, width, rngs=rngs)

    def attention(self, x_BxTxD: jax.Array) -> jax.Array:
        b, t, d = x_BxTxD.shape
        q, k, v = jnp.split(self.qkv(x_BxTxD).reshape(b, t, 3, self.heads, d // self.heads), 3, axis=2)
        scores_BxHxTxT = jnp.einsum("bqhd,bkhd->bhqk", q[:, :, 0], k[:, :, 0]) / math.sqrt(d // self.heads)
        causal = jnp.tril(jnp.ones((t, t), bool))
        weights = jax.nn.softmax(jnp.where(causal, scores_BxHxTxT, -1e9), axis=-1)
        return self.out(jnp.einsum("bhqk,bkhd->bqhd", weights, v[:, :, 0]).reshape(b, t, d))

    def __call__(self, x_BxTxD: jax.Array) -> jax.Array:
        x_BxTxD = x_BxTxD + self.attention(self.norm1(x_BxTxD))
        return x_BxTxD + self.down(jax.nn.gelu(self.up(self.norm2(x_BxTxD))))


class CharTransformer(nnx.Module):
    def __init__(self, vocab: int, heads: int, rngs: nnx.Rngs) -> None:
        self.embed = nnx.Embed(vocab, WIDTH, rngs=rngs)
        self.position = nnx.Param(0.02 * jax.random.normal(rngs.params(), (CONTEXT, WIDTH)))
        self.blocks = nnx.List([Block(WIDTH, heads, rngs) for _ in range(LAYERS)])
        self.norm = nnx.LayerNorm(WIDTH, rngs=rngs)
        self.head = nnx.Linear(WIDTH, vocab, rngs=rngs)

    def __call__(self, ids_BxT: jax.Array) -> jax.Array:
        x = self.embed(ids_BxT) + self.position[: ids_BxT.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def summed_nats(net: CharTransformer, rows_BxT1: jax.Array) -> jax.Array:
    logits = net(rows_BxT1[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, rows_BxT1[:, 1:]).sum()


def loss(net: CharTransformer, rows_BxT1: jax.Array) -> jax.Array:
    return summed_nats(net, rows_BxT1) / rows_BxT1[:, 1:].size


def bits(net: CharTransformer, rows_BxT1: jax.Array) -> tuple[jax.Array, jax.Array]:
    """(summed bits, characters) of a held-out batch: the mean is bits per character."""
    return summed_nats(net, rows_BxT1) / math.log(2), jnp.float32(rows_BxT1[:, 1:].size)


def task(text: str | None = None, heads: int = 4, total_steps: int = 10_000) -> diloco.Task:
    """The task on `text` (default: `default_text()`), with `heads` attention heads and diloco's default inner
    optimizer (AdamW, warmup, cosine) decaying over `total_steps`."""
    corpus = Corpus(default_text() if text is None else text)

    def batches(peer_id: str):  # each node its own stream, seeded by its peer id: a restart resumes it
        rng = np.random.default_rng(zlib.crc32(peer_id.encode()))
        while True:
            yield corpus.windows(corpus.train, rng.integers(0, len(corpus.train) - CONTEXT - 1, BATCH))

    starts = np.arange(0, len(corpus.heldout) - CONTEXT - 1, CONTEXT + 1)[:8 * BATCH]
    heldout = [corpus.windows(corpus.heldout, chunk) for chunk in np.array_split(starts, 8)]
    build = functools.partial(CharTransformer, len(corpus.chars), heads)
    optimizer, schedule = diloco.default_optimizer(LR, total_steps=total_steps)
    model = diloco.Model.from_nnx("char-transformer", lambda rngs: build(rngs=rngs), loss, lr=LR, evaluate=bits,
                                  metric="bits/char", optimizer=optimizer, schedule=schedule)
    return diloco.Task(model, batches=batches, heldout=heldout, tokens_per_batch=BATCH * CONTEXT)


def sample(chosen: diloco.Task, corpus_chars: list[str], source: str, prompt: str, count: int) -> str:
    """`prompt` and `count` characters the trained model at `source` (a checkpoint or an export) draws."""
    net = diloco.load(source, chosen.model)  # the run's global parameters, as this script's CharTransformer
    table = {c: i for i, c in enumerate(corpus_chars)}
    ids = [table[c] for c in prompt if c in table] or [0]
    rng = np.random.default_rng(0)
    step = nnx.jit(lambda net, window: net(window)[0])
    for _ in range(count):
        window = np.zeros((1, CONTEXT), np.int32)
        context = ids[-CONTEXT:]
        window[0, :len(context)] = context
        logits = np.asarray(step(net, window)[len(context) - 1], np.float64) / 0.8
        p = np.exp(logits - logits.max())
        ids.append(int(rng.choice(len(p), p=p / p.sum())))
    return "".join(corpus_chars[i] for i in ids)


def main(argv: list[str] | None = None) -> int:
    own = argparse.ArgumentParser(add_help=False)
    own.add_argument("--text", type=Path, default=None, help="a text file to train on")
    own.add_argument("--heads", type=int, default=4)
    own.add_argument("--schedule-steps", type=int, default=10_000, help="inner steps the learning rate decays over")
    own.add_argument("--sample", default=None, metavar="CHECKPOINT", help="print text the trained model writes")
    mine, rest = own.parse_known_args(argv)
    try:
        text = default_text() if mine.text is None else mine.text.read_text(encoding="utf-8", errors="replace")
        chosen = task(text, mine.heads, mine.schedule_steps)
    except (OSError, ValueError) as exc:
        print(f"char_transformer: error: --text {mine.text}: {getattr(exc, 'strerror', None) or exc}", file=sys.stderr)
        return 2
    if mine.sample is not None:
        print(sample(chosen, sorted(set(text)), mine.sample, "The ", 200))
        return 0
    return diloco.run(chosen, rest)


if __name__ == "__main__":
    raise SystemExit(main())

"""How far lossless compression could shrink real int4 pseudo-gradient payloads, and what that would do to
the gossip communication bound.

Run: ``python -m testnet.benchmarks.payload_entropy [--rounds 6] [--inner-steps 50] [--nodes 4]``.

One tiny-preset island trains `rounds` rounds of H inner steps on the embedded corpus (the node's
`InnerLoop`); each round's pseudo-gradient is compressed with error feedback by the real int4 codec,
exactly as a node publishes it. Per round: the payload size, and the ratio zlib (level 9) and lzma achieve
on it, measured in the same run; at the end the order-0 entropy of the nibbles of the last payload (its
bf16 block scales included, 1/17 of its bytes) and the resulting bound of the
communication ratio against an fp32 ring all-reduce, `16·H/N · 4/(bits per parameter)`, with and without
the best ratio measured.
"""

from __future__ import annotations

import argparse
import lzma
import zlib

import numpy as np

from node.island.config import preset
from node.island.data import Dataset
from node.island.train import InnerLoop
from protocol.compression import Codec, ErrorFeedback, payload_size


def nibble_entropy(payload: bytes) -> float:
    """Order-0 entropy in bits of the 4-bit halves of `payload`'s bytes."""
    b = np.frombuffer(payload, np.uint8)
    counts = np.bincount(np.concatenate([b & 15, b >> 4]), minlength=16)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log2(p)).sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--inner-steps", type=int, default=50)
    ap.add_argument("--nodes", type=int, default=4)
    args = ap.parse_args()
    cfg = preset("tiny")
    dataset = Dataset(cfg.data, seq_len=cfg.model.seq_len, vocab_size=cfg.model.vocab_size)
    loop = InnerLoop.byte_lm(cfg, dataset.batcher("payload-entropy"))
    feedback = ErrorFeedback(Codec.INT4)
    params = sum(int(np.prod(x.shape)) for x in loop.params.values())
    best = 1.0
    for r in range(args.rounds):
        base = loop.params
        loop.run(args.inner_steps)
        local = loop.params
        payload, _ = feedback.compress({k: np.asarray(base[k] - local[k], np.float32) for k in local})
        z, x = len(payload) / len(zlib.compress(payload, 9)), len(payload) / len(lzma.compress(payload))
        best = max(best, z, x)
        print(f"round {r + 1}: int4 payload {len(payload):,} B; zlib -9 {z:.3f}x, lzma {x:.3f}x", flush=True)
    shapes = {k: v.shape for k, v in loop.params.items()}
    bits = 8 * payload_size(shapes, Codec.INT4) / params
    bound = 16 * args.inner_steps / args.nodes * 4 / bits
    print(f"nibble entropy of the last payload: {nibble_entropy(payload):.2f} bits (of 4)")
    print(f"gossip bound at H={args.inner_steps}, N={args.nodes}: {bound:.0f}x with int4 ({bits:.2f} bits/param); "
          f"{bound * best:.0f}x if every payload shrank by the best ratio measured ({best:.3f}x)")


if __name__ == "__main__":
    main()

"""How large honest updates are against what their inner steps could do: per tensor, the RMS of a published
update ÷ (peak inner learning rate × inner steps), for the int4 update blobs a testnet node kept.

    python -m testnet.benchmarks.update_rms RUN_DIR [--node 0] [--inner-steps 20]

The node's own limit on any update (`max_step_rms`, `node.runtime`) must stay above what honest updates
measure here, or it would clip them (BENCHMARKS.md, "Hostile peer")."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import numpy as np

from node.island.model import param_shapes
from node.settings import NodeSettings
from protocol.compression import payload_size
from protocol.compression.tensors import decode_tensors


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("run_dir", type=Path)
    p.add_argument("--node", type=int, default=0)
    p.add_argument("--inner-steps", type=int, default=20)
    a = p.parse_args()
    cfg = NodeSettings(run_id="x", key_path="unused").ml_config("x")  # the tiny preset's model and lr
    shapes = param_shapes(cfg.model)
    size = payload_size(shapes, "int4")
    blobs = sorted((b for b in (a.run_dir / "checkpoints" / f"node-{a.node}" / "blobs").iterdir()
                    if b.stat().st_size == size), key=os.path.getmtime)
    scale = cfg.inner.lr * a.inner_steps
    for blob in (blobs[0], blobs[len(blobs) // 2], blobs[-1]):
        deltas = decode_tensors(blob.read_bytes(), "int4", shapes)
        rms = [float(np.sqrt(np.mean(x.astype(np.float64) ** 2))) / scale for x in deltas.values()]
        print(f"{blob.name[:12]}: RMS / (lr x steps) per tensor: max {max(rms):.3f}, median {np.median(rms):.3f}")


if __name__ == "__main__":
    main()

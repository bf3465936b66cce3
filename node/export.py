"""Get the model out: a checkpoint's global parameters as a safetensors file (`diloco-export`).

A node's checkpoint (docs/checkpoint-format.md) holds the run's global state: the node's replica of the
outer optimizer's parameters at the checkpoint's slot (version 3: the ledger's working state, which every
node that applied the same updates holds, up to the float32 rounding of late updates; a version 1 or 2
checkpoint's ledger snapshot is replayed to them with the same `protocol.ledger.Ledger` code every replica
runs) — what the nodes of the run agree on, not the node's half-trained local copy.

The file is plain safetensors (https://github.com/huggingface/safetensors), readable without diloco:

    from safetensors.numpy import load_file            # or safetensors.flax.load_file for jax arrays
    params = load_file("model.safetensors")             # {"blocks.0.attn.qkv.kernel": float32 array, ...}

Tensor names are the model's flat names (`node.island.model`); every tensor is float32. The metadata
(strings) says what they are: `diloco.format` (`global-params-v1`), `diloco.run_config` (the run
configuration, PROTOCOL.md §7a: `model.*` lines are the architecture), `diloco.run_id`, `diloco.round`
and `diloco.slot`. `node.island.model.build_model(model_config(run_config), params)` rebuilds the Flax
module; `diloco-sample` generates text from it.

    diloco-export CHECKPOINT_DIR_OR_FILE [-o model.safetensors]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
from safetensors.numpy import load_file, save_file

from node.checkpoint import Checkpoint, CheckpointDir, CheckpointError, read_checkpoint
from node.island.config import ModelConfig
from protocol.errors import LocalProtocolError, RemoteProtocolError
from protocol.ledger import Ledger, LedgerConfig, LedgerSnapshot
from protocol.runconfig import decode_config

__all__ = ["FORMAT", "global_params", "load_checkpoint", "load_exported", "model_config", "export"]

FORMAT = "global-params-v1"


def load_checkpoint(source: str | os.PathLike[str]) -> Checkpoint:
    """A checkpoint file, or the newest valid one of a checkpoint directory. Raises CheckpointError."""
    path = Path(source)
    if path.is_dir():
        ckpt = CheckpointDir(path).latest()
        if ckpt is None:
            raise CheckpointError(f"{path}: no valid checkpoint in this directory")
        return ckpt
    try:
        with open(path, "rb") as f:
            return read_checkpoint(f, os.fstat(f.fileno()).st_size)
    except OSError as exc:
        raise CheckpointError(f"{path}: {exc.strerror or exc}") from None


def global_params(ckpt: Checkpoint) -> dict[str, np.ndarray]:
    """The run's global parameters at the checkpoint's slot (float32): the ledger's working state (version 3),
    or replayed from the ledger snapshot (versions 1 and 2)."""
    if ckpt.version >= 3:
        prefix = "working/theta/"
        params = {key[len(prefix):]: a for key, a in ckpt.outer.items() if key.startswith(prefix)}
        if not params:
            raise CheckpointError("the checkpoint holds no ledger working state (outer working/theta/*)")
        return {name: np.ascontiguousarray(value, dtype=np.float32) for name, value in sorted(params.items())}
    try:
        snap = LedgerSnapshot.from_bytes(bytes(ckpt.ledger))
        ledger = Ledger.from_snapshot(snap, LedgerConfig.from_fingerprint(dict(snap.config)), snap.shapes)
    except (RemoteProtocolError, LocalProtocolError) as exc:
        raise CheckpointError(f"the checkpoint's ledger snapshot cannot be replayed: {exc}") from None
    return {name: np.ascontiguousarray(value, dtype=np.float32) for name, value in ledger.params().items()}


def model_config(run_config: str) -> ModelConfig:
    """The architecture a run configuration names (its `model.*` lines)."""
    try:
        settings = decode_config(run_config)
    except RemoteProtocolError as exc:
        raise ValueError(f"the run configuration is unreadable: {exc.detail}") from None
    name = settings.get("model.name", "byte-lm")
    if name != "byte-lm":
        raise ValueError(f"this run trained a library model ({name}), not diloco-node's byte-level one: sample it "
                         "in its own program, where diloco.load(SOURCE, model) returns it (docs/library.md)")
    known = {f.name for f in dataclasses.fields(ModelConfig)}
    fields = {name[len("model."):]: value for name, value in settings.items()
              if name.startswith("model.") and name[len("model."):] in known}
    if not fields:
        raise ValueError("the run configuration names no model (no model.* lines)")
    return ModelConfig(**fields)


def export(ckpt: Checkpoint, out: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """Write the checkpoint's global parameters to `out` (safetensors); returns them."""
    params = global_params(ckpt)
    metadata = {"diloco.format": FORMAT, "diloco.run_config": str(ckpt.meta.get("run_config", "")),
                "diloco.run_id": str(ckpt.meta.get("run_id", "")), "diloco.round": str(ckpt.round),
                "diloco.slot": str(ckpt.meta.get("slot", ""))}
    save_file(params, str(out), metadata=metadata)
    return params


def load_exported(path: str | os.PathLike[str]) -> tuple[dict[str, np.ndarray], Mapping[str, str]]:
    """An exported file's parameters and metadata."""
    from safetensors import safe_open

    with safe_open(str(path), framework="numpy") as f:
        metadata = dict(f.metadata() or {})
    return load_file(str(path)), metadata


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="diloco-export", description=__doc__.split("\n\n")[0])
    p.add_argument("checkpoint", type=Path, metavar="CHECKPOINT",
                   help="a node's --checkpoint-dir (its newest valid checkpoint is used) or one ckpt-*.dlc file")
    p.add_argument("-o", "--output", type=Path, default=Path("model.safetensors"), metavar="FILE",
                   help="the safetensors file to write (default: %(default)s)")
    args = p.parse_args(argv)
    try:
        ckpt = load_checkpoint(args.checkpoint)
        params = export(ckpt, args.output)
    except (CheckpointError, OSError) as exc:
        print(f"diloco-export: error: {exc}", file=sys.stderr)
        return 2
    count = sum(v.size for v in params.values())
    print(f"wrote {args.output}: {len(params)} tensors, {count:,} parameters (float32), the run's global "
          f"parameters at slot {ckpt.meta.get('slot')} (round {ckpt.round} of node {str(ckpt.meta.get('peer_id', ''))[:16]})")
    if not ckpt.meta.get("run_config"):
        print("note: this checkpoint predates the run configuration in checkpoints; diloco-sample will need "
              "--model/--set to rebuild the architecture", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

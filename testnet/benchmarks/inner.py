"""Benchmark: the inner loop on whatever JAX runs on (CPU, a GPU, a TPU) — steps/s, tokens/s, MFU.

Run: ``python -m testnet.benchmarks.inner --model base [KEY=VALUE ...] [--steps 20] [--repeats 6]
[--peak-tflops T] [--json FILE]``.

The model, data and train step are the node's own (`node.island`: the preset's byte-level transformer on
the embedded default text, `InnerLoop.run` with its batch sampling and one step in flight). Printed and
written (``--json``):

* ``steps_per_s``, ``tokens_per_s``: `InnerLoop.run`, median of ``--repeats`` rounds of ``--steps`` steps.
* ``bare_steps_per_s`` and ``loop_over_bare``: the same compiled step on one batch already on the devices,
  interleaved with the above (A-B-B-A) — the baseline measured in the same run: what the loop's batch
  sampling and transfers cost.
* ``flops_per_token``: the model's training FLOPs per token, counted as PaLM does (Chowdhery et al. 2022,
  appendix B): ``6·N + 12·L·d·T`` — forward and backward of every weight matrix (``N`` parameters, the tied
  output projection included) and of attention's two products at full length ``T`` (causal masking not
  subtracted). ``xla_flops_per_token``: what XLA's cost analysis counts for the lowered step, as a check.
* ``model_tflops_per_s`` and ``mfu``: tokens/s × flops_per_token, and that over the devices' peak dense
  bf16 rate (``--peak-tflops`` × device count, or the datasheet figure for a known device: NVIDIA H100 and
  H200 SXM 989 TFLOP/s, A100 312; none on a CPU, so no MFU there).
* ``device_peak_bytes``: the devices' peak memory in use (where the backend reports it).
* ``--mesh data=D,fsdp=F`` (and ``--remat``) lays the island out as ``diloco-node --mesh`` does
  (`node.island.mesh`; run with ``XLA_FLAGS=--xla_force_host_platform_device_count=8`` for 8 CPU devices).
  ``device_bytes_per_param``: the parameters and optimizer state the busiest device holds, per parameter
  (the arrays' own shards); ``xla_bytes_per_param``: XLA's compiled memory analysis of the train step per
  device (arguments + temporaries: also gradients, gathered weights and activations), per parameter.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import jax

from node.island.bytelm import byte_lm_task
from node.island.config import Config, ConfigError, MeshShape, preset
from node.island.data import DataError, resolve_vocab
from node.island.alone import measure_rates
from node.island.train import InnerLoop

# Dense bf16 tensor-core peaks from the vendors' datasheets (SXM parts), TFLOP/s per device.
DATASHEET_PEAK_TFLOPS = {"H200": 989.4, "H100": 989.4, "A100": 312.0}


def flops_per_token(cfg: Config, n_params: int) -> float:
    """Training FLOPs per token, PaLM's count: 6·N + 12·L·d·T."""
    m = cfg.model
    return 6.0 * n_params + 12.0 * m.n_layers * m.d_model * m.seq_len


def datasheet_peak(device: jax.Device) -> float | None:
    """The datasheet bf16 peak (TFLOP/s) of a known accelerator, else None."""
    kind = getattr(device, "device_kind", "")
    return next((peak for name, peak in DATASHEET_PEAK_TFLOPS.items() if name in kind), None)


def _xla_flops(loop: InnerLoop) -> float | None:
    """XLA's cost analysis of the lowered train step (FLOPs per step), where the backend gives one."""
    try:
        batch = jax.device_put(loop.batches.next_batch(), loop._by_batch)
        cost = loop._train_step.lower(loop._params, loop._opt_state, batch).cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        return float(cost["flops"]) if cost and "flops" in cost else None
    except Exception:  # a backend without cost analysis: the analytic count stands alone
        return None


def _device_peak_bytes() -> int | None:
    peaks = [stats.get("peak_bytes_in_use") for d in jax.local_devices() if (stats := d.memory_stats())]
    return int(max(peaks)) if peaks and None not in peaks else None


def _xla_bytes(loop: InnerLoop) -> int | None:
    """XLA's compiled memory analysis of the train step, per device: arguments + temporaries."""
    try:
        batch = jax.device_put(loop.batches.next_batch(), loop._by_batch)
        mem = loop._train_step.lower(loop._params, loop._opt_state, batch).compile().memory_analysis()
        return int(mem.argument_size_in_bytes + mem.temp_size_in_bytes) if mem is not None else None
    except Exception:  # a backend without memory analysis
        return None


def run(model: str, overrides: list[str], steps: int, repeats: int, peak_tflops: float | None,
        mesh: MeshShape | None = None, remat: bool = False) -> dict[str, Any]:
    cfg = resolve_vocab(preset(model).with_overrides_from_strings(overrides), overrides)
    task = byte_lm_task(cfg, eval_batches=1)
    batches, _ = task.open(cfg.data.shard_key)
    loop = InnerLoop(task.model, batches, seed=cfg.inner.init_seed, tokens_per_batch=task.tokens_per_batch,
                     mesh=mesh, remat=remat)
    layout = loop.layout()
    xla_bytes = _xla_bytes(loop)
    devices = jax.local_devices()
    ours, bare = measure_rates(loop, steps, repeats)
    n_params = task.model.param_count
    per_token = flops_per_token(cfg, n_params)
    xla = _xla_flops(loop)
    tokens_per_s = ours * loop.tokens_per_batch
    peak = peak_tflops if peak_tflops is not None else datasheet_peak(devices[0])
    achieved = tokens_per_s * per_token / 1e12
    return {
        "model": model, "overrides": overrides, "params": n_params,
        "backend": jax.default_backend(), "device_kind": getattr(devices[0], "device_kind", ""),
        "devices": len(devices), "jax": jax.__version__,
        "batch_size": cfg.data.batch_size, "seq_len": cfg.model.seq_len, "dtype": cfg.model.dtype,
        "tokens_per_step": loop.tokens_per_batch, "steps": steps, "repeats": repeats,
        "steps_per_s": ours, "tokens_per_s": tokens_per_s,
        "bare_steps_per_s": bare, "loop_over_bare": ours / bare,
        "flops_per_token": per_token,
        "xla_flops_per_token": xla / loop.tokens_per_batch if xla else None,
        "model_tflops_per_s": achieved,
        "peak_tflops": peak * len(devices) if peak else None,
        "mfu": achieved / (peak * len(devices)) if peak else None,
        "device_peak_bytes": _device_peak_bytes(),
        "mesh": layout["mesh"], "remat": remat,
        "device_bytes_per_param": layout["state_bytes_per_param"],
        "xla_bytes_per_param": xla_bytes / n_params if xla_bytes else None,
    }


def _line(f: dict[str, Any]) -> str:
    mfu = f"MFU {f['mfu']:.1%} of {f['peak_tflops']:.0f} TFLOP/s" if f["mfu"] is not None else "MFU n/a (no peak)"
    xla = f" (XLA counts {f['xla_flops_per_token'] / 1e9:.3g})" if f["xla_flops_per_token"] else ""
    mem = f" | device peak {f['device_peak_bytes'] / 2**30:.1f} GiB" if f["device_peak_bytes"] else ""
    return (f"{f['model']} {f['params'] / 1e6:.1f}M params on {f['devices']} x {f['device_kind'] or f['backend']}, "
            f"batch {f['batch_size']} x {f['seq_len']} {f['dtype']}\n"
            f"  InnerLoop.run {f['steps_per_s']:.2f} steps/s, {f['tokens_per_s']:,.0f} tokens/s | bare step "
            f"{f['bare_steps_per_s']:.2f} steps/s (loop/bare {f['loop_over_bare']:.3f})\n"
            f"  {f['flops_per_token'] / 1e9:.3g} GFLOP/token{xla} -> {f['model_tflops_per_s']:.1f} TFLOP/s | "
            f"{mfu}{mem}\n"
            f"  mesh {f['mesh']}{' remat' if f['remat'] else ''}: {f['device_bytes_per_param']:.2f} B/param of params + "
            f"optimizer state per device" + (f", XLA step {f['xla_bytes_per_param']:.1f} B/param per device"
                                             if f["xla_bytes_per_param"] else ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m testnet.benchmarks.inner", description=__doc__.split("\n")[0])
    ap.add_argument("--model", default="tiny", help="preset: tiny, small, base, large (default tiny)")
    ap.add_argument("--steps", type=int, default=20, help="steps per timed round (default 20)")
    ap.add_argument("--repeats", type=int, default=6, help="timed rounds of each kind (default 6)")
    ap.add_argument("--peak-tflops", type=float, help="the device's peak TFLOP/s, for MFU (default: datasheet)")
    ap.add_argument("--mesh", default=None, metavar="data=D,fsdp=F",
                    help="the island's mesh, as diloco-node --mesh (default: chosen as the node does)")
    ap.add_argument("--remat", action="store_true", help="recompute activations in the backward pass")
    ap.add_argument("--json", type=Path, help="write the figures to this file")
    ap.add_argument("overrides", nargs="*", metavar="KEY=VALUE", help="config overrides, e.g. batch_size=8")
    args = ap.parse_args(argv)
    for flag, value in (("--steps", args.steps), ("--repeats", args.repeats)):
        if value < 1:
            ap.error(f"{flag} must be at least 1, got {value}")
    if args.peak_tflops is not None and not args.peak_tflops > 0:
        ap.error(f"--peak-tflops must be > 0, got {args.peak_tflops}")
    try:
        mesh = MeshShape.parse(args.mesh) if args.mesh else None
        figures = run(args.model, args.overrides, args.steps, args.repeats, args.peak_tflops, mesh, args.remat)
    except (ConfigError, DataError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(_line(figures), flush=True)
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2, default=float) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

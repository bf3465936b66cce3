"""Codec benchmark: size, error and speed of each pseudo-gradient codec on a realistic update.

    python -m testnet.benchmarks.codecs [--params 10000000] [--repeats 5] [--sweep]

Draws an AdamW-like pseudo-gradient over a transformer's tensor shapes (testnet.benchmarks.pseudograd),
then per codec prints: compression ratio against fp32, relative L2 error ||x^ - x|| / ||x||, encode,
decode and encode+decode throughput in MB of fp32 input per second (best of `--repeats`), each also as
a ratio against a plain numpy copy of the same tensors timed in the same run, and whether the issue's
targets are met. `--sweep` adds the block-size / quantization-grid measurements behind BLOCK_SIZE.
"""

from __future__ import annotations

import argparse
import os
import platform
import time
from collections.abc import Callable

import numpy as np

from testnet.benchmarks import pseudograd
from protocol.compression import BLOCK_SIZE, Codec, bf16, blockwise, decode_tensors, encode_tensors

Tensors = dict[str, np.ndarray]

MIN_THROUGHPUT_MBS = 200.0
INT4_MIN_RATIO = 7.5
INT4_MAX_ERROR = 0.1
INT8_MAX_ERROR = 0.01


def relative_error(approx: Tensors, exact: Tensors) -> float:
    """||approx - exact||_2 / ||exact||_2 over all tensors together, accumulated in float64."""
    num = sum(float(np.sum((approx[k].astype(np.float64) - exact[k]) ** 2)) for k in exact)
    den = sum(float(np.sum(exact[k].astype(np.float64) ** 2)) for k in exact)
    return (num / den) ** 0.5


def best_time(fn: Callable[[], object], repeats: int) -> float:
    """Smallest wall time of `repeats` calls of `fn` (after one warm-up call), in seconds."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def codec_table(delta: Tensors, repeats: int) -> tuple[list[str], dict[Codec, dict[str, float]]]:
    """Measure every codec on `delta`; return printed lines and the figures per codec."""
    shapes = {name: x.shape for name, x in delta.items()}
    mb = sum(x.nbytes for x in delta.values()) / 1e6
    copy_mbs = mb / best_time(lambda: {k: np.copy(x) for k, x in delta.items()}, repeats)
    lines = [
        f"baseline np.copy of the same {mb:.1f} MB: {copy_mbs:,.0f} MB/s",
        "",
        f"{'codec':<6} {'ratio':>6} {'rel.err':>9} {'enc MB/s':>9} {'(x copy)':>8} {'dec MB/s':>9} "
        f"{'(x copy)':>8} {'enc+dec':>8} {'(x copy)':>8}",
    ]
    figures = {}
    for codec in Codec:
        payload = encode_tensors(delta, codec)
        decoded = decode_tensors(payload, codec, shapes)
        enc = mb / best_time(lambda c=codec: encode_tensors(delta, c), repeats)
        dec = mb / best_time(lambda c=codec, p=payload: decode_tensors(p, c, shapes), repeats)
        both = 1.0 / (1.0 / enc + 1.0 / dec)
        error = relative_error(decoded, delta)
        fig = {"ratio": mb * 1e6 / len(payload), "error": error, "enc": enc, "dec": dec, "both": both}
        figures[codec] = fig
        lines.append(
            f"{codec.value:<6} {fig['ratio']:>5.2f}x {fig['error']:>9.2e} {enc:>9,.0f} {enc / copy_mbs:>7.2f}x "
            f"{dec:>9,.0f} {dec / copy_mbs:>7.2f}x {both:>8,.0f} {both / copy_mbs:>7.2f}x"
        )
    return lines, figures


def target_lines(figures: dict[Codec, dict[str, float]]) -> list[str]:
    """One line per issue target with the measured figure and whether it is met."""
    i4, i8 = figures[Codec.INT4], figures[Codec.INT8]
    checks = [
        (f"int4 ratio >= {INT4_MIN_RATIO}x", f"{i4['ratio']:.2f}x", i4["ratio"] >= INT4_MIN_RATIO),
        (f"int4 relative error < {INT4_MAX_ERROR}", f"{i4['error']:.4f}", i4["error"] < INT4_MAX_ERROR),
        (f"int8 relative error < {INT8_MAX_ERROR}", f"{i8['error']:.5f}", i8["error"] < INT8_MAX_ERROR),
    ]
    slowest = min(figures, key=lambda c: figures[c]["both"])
    checks.append(
        (
            f"encode+decode > {MIN_THROUGHPUT_MBS:.0f} MB/s (every codec)",
            f"slowest {slowest.value} {figures[slowest]['both']:,.0f} MB/s",
            figures[slowest]["both"] > MIN_THROUGHPUT_MBS,
        )
    )
    return [f"  {what:<44} {got:>28}  {'met' if ok else 'NOT MET'}" for what, got, ok in checks]


def other_distributions(others: dict[str, Tensors]) -> list[str]:
    """Relative error of every codec on each of `others` (label -> update)."""
    lines = [f"{'distribution':<22}" + "".join(f"{c.value:>10}" for c in Codec)]
    for label, delta in others.items():
        shapes = {k: x.shape for k, x in delta.items()}
        errors = [relative_error(decode_tensors(encode_tensors(delta, c), c, shapes), delta) for c in Codec]
        lines.append(f"{label:<22}" + "".join(f"{e:>10.2e}" for e in errors))
    return lines


def sweep_lines(delta: Tensors, stress: Tensors) -> list[str]:
    """Error per block size of the codec's grid (mid-rise, bf16 scale rounded up) and of the mid-tread
    grid round(x / (absmax / (2**(bits-1) - 1))), with the 4-bit ratio each block size gives with 2-byte
    and with 4-byte scales; AdamW-like `delta` at every size, heavy-tailed `stress` at the codec's."""
    lines = [
        f"{'update':<13} {'block':>5} {'int4 ratio':>10} {'(fp32 s)':>9} {'int4 mid-rise':>14} {'mid-tread':>10} "
        f"{'int8 mid-rise':>14} {'mid-tread':>10}"
    ]
    rows = [("adamw-like", delta, block) for block in (32, 64, 128, 256)] + [("student-t(3)", stress, BLOCK_SIZE)]
    for label, tensors, block in rows:
        flat = {k: x.ravel() for k, x in tensors.items()}
        row = f"{label:<13} {block:>5} {32 / (4 + 16 / block):>9.2f}x {32 / (4 + 32 / block):>8.2f}x"
        for bits in (4, 8):
            rise = relative_error({k: _midrise(x, bits, block) for k, x in flat.items()}, flat)
            tread = relative_error({k: _midtread(x, bits, block) for k, x in flat.items()}, flat)
            row += f" {rise:>14.4f} {tread:>10.4f}"
        lines.append(row)
    return lines


def kurtosis(tensors: Tensors) -> float:
    """Kurtosis E[(x - mean)^4] / var^2 of all elements together (3 for a Gaussian)."""
    x = np.concatenate([t.ravel() for t in tensors.values()]).astype(np.float64)
    x -= x.mean()
    return float(np.mean(x**4) / np.mean(x**2) ** 2)


def _midrise(x: np.ndarray, bits: int, block: int) -> np.ndarray:
    scale_bits, codes = blockwise.quantize(x, bits, block)
    levels = codes.astype(np.float32) - np.float32(2 ** (bits - 1) - 0.5)
    return blockwise.apply_scales(levels, bf16.widen(scale_bits), block)


def _midtread(x: np.ndarray, bits: int, block: int) -> np.ndarray:
    qmax = 2 ** (bits - 1) - 1
    n = x.size
    padded = np.zeros(-(-n // block) * block, dtype=np.float32)
    padded[:n] = x
    x_NxB = padded.reshape(-1, block)
    scale = np.abs(x_NxB).max(axis=1) / np.float32(qmax)
    scale[scale == 0] = 1
    return (np.rint(x_NxB / scale[:, None]) * scale[:, None]).reshape(-1)[:n]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", type=int, default=10_000_000, help="approximate parameter count")
    parser.add_argument("--repeats", type=int, default=5, help="timed repetitions (best is reported)")
    parser.add_argument("--steps", type=int, default=16, help="AdamW steps behind the pseudo-gradient")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sweep", action="store_true", help="also measure other block sizes and grids")
    args = parser.parse_args(argv)

    shapes = pseudograd.transformer_shapes(args.params)
    numel = sum(int(np.prod(s)) for s in shapes.values())
    print(
        f"pseudo-gradient: {numel:,} float32 parameters in {len(shapes)} tensors, AdamW-like "
        f"({args.steps} steps, seed {args.seed}); block size {BLOCK_SIZE}; best of {args.repeats}; "
        f"numpy {np.__version__}, {platform.machine()}, {os.cpu_count()} cpus"
    )
    delta = pseudograd.adamw_delta(shapes, steps=args.steps, seed=args.seed)
    print(f"kurtosis of the update: {kurtosis(delta):.2f} (Gaussian: 3)")
    lines, figures = codec_table(delta, args.repeats)
    print("\n".join(lines))
    print("\ntargets:")
    print("\n".join(target_lines(figures)))
    others = {
        "gaussian": pseudograd.gaussian_delta(shapes, seed=args.seed),
        "student-t(3) (stress)": pseudograd.student_t_delta(shapes, seed=args.seed),
    }
    print("\nrelative error on other distributions (same shapes):")
    print("\n".join(other_distributions(others)))
    if args.sweep:
        print("\nblock-size and grid sweep (relative L2 error):")
        print("\n".join(sweep_lines(delta, others["student-t(3) (stress)"])))


if __name__ == "__main__":
    main()

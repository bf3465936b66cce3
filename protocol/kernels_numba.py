"""The numba code of :mod:`protocol.kernels` (imported, and compiled, at a kernel's first call: see there)."""

from __future__ import annotations

import math

import numpy as np
from numba import njit

from protocol.compression.blockwise import MIN_SCALE_BITS, max_scale_bits
from protocol.compression.formats import BLOCK_SIZE

#: bf16 bits of the largest int4 block scale a decoder accepts.
_MAX_SCALE_BITS_4 = max_scale_bits(4)


@njit(nogil=True, cache=True)
def _first_refused_scale(scale_bits: np.ndarray, packed: np.ndarray, n: int) -> int:
    """-1 when the span's ``n`` values have their bytes and every block scale is one a decoder accepts, else the
    first refused block (0 for missing bytes)."""
    blocks = (n + BLOCK_SIZE - 1) // BLOCK_SIZE
    if scale_bits.size < blocks or packed.size < (n + 1) // 2:
        return 0
    for b in range(blocks):
        bits = np.int64(scale_bits[b])
        if bits != 0 and (bits < MIN_SCALE_BITS or bits > _MAX_SCALE_BITS_4):
            return b
    return -1


@njit(nogil=True, cache=True)
def _scale(bits: int) -> np.float32:
    """The float32 value of an accepted bf16 scale: 0, or a positive normal (1 + mantissa/128) · 2^(exponent − 127),
    exact."""
    return np.float32(0.0) if bits == 0 else np.float32(math.ldexp(1.0 + (bits & 127) / 128.0, (bits >> 7) - 127))


@njit(nogil=True, cache=True, inline="always")
def _level(code: int) -> np.float32:
    """The level of a 4-bit code, ``code − 7.5`` (exact in float32): computed, not looked up in a table, so
    that the loop over a block has no gather and vectorises."""
    return np.float32(code) - np.float32(7.5)


@njit(nogil=True, cache=True, inline="always")
def _decode_block(packed: np.ndarray, s: np.float32, start: int, m: int, out: np.ndarray) -> None:
    """The ``m`` values of the block from element ``start`` (a multiple of the block size) into ``out``."""
    if m == BLOCK_SIZE:  # two values per byte, as decode_int4
        byte0 = start // 2
        for j in range(BLOCK_SIZE // 2):
            byte = np.int64(packed[byte0 + j])
            out[2 * j] = _level(byte & 15) * s
            out[2 * j + 1] = _level(byte >> 4) * s
    else:
        for k in range(m):
            byte = np.int64(packed[(start + k) >> 1])
            out[k] = _level((byte >> 4) if k & 1 else (byte & 15)) * s


@njit(nogil=True, cache=True)
def decode_int4(packed: np.ndarray, scale_bits: np.ndarray, out: np.ndarray) -> int:
    n = out.size
    refused = _first_refused_scale(scale_bits, packed, n)  # checked first: a refused span leaves ``out`` unwritten
    if refused >= 0:
        return refused
    for b in range((n + BLOCK_SIZE - 1) // BLOCK_SIZE):
        start = b * BLOCK_SIZE
        m = min(BLOCK_SIZE, n - start)
        _decode_block(packed, _scale(np.int64(scale_bits[b])), start, m, out[start:start + m])
    return -1


@njit(nogil=True, cache=True)
def accumulate_term(u: np.ndarray, x: np.ndarray, c: float, first: bool) -> None:
    if first:
        for k in range(u.size):
            u[k] = np.float64(x[k]) * c
    else:
        for k in range(u.size):
            u[k] += np.float64(x[k]) * c


@njit(nogil=True, cache=True)
def nesterov(theta: np.ndarray, v: np.ndarray, u: np.ndarray, scale: float, scaled: bool, eta: float,
              mu: float) -> None:
    for k in range(theta.size):
        g = u[k] * scale if scaled else np.float64(u[k])
        vk = np.float64(v[k]) * mu + g
        v[k] = vk
        theta[k] = np.float64(theta[k]) - (vk * mu + g) * eta


@njit(nogil=True, cache=True)
def fold_start(u: np.ndarray, d: np.ndarray, alpha: float) -> None:
    for k in range(d.size):
        d[k] = np.float64(u[k]) * alpha


@njit(nogil=True, cache=True)
def fold_term(u: np.ndarray, d: np.ndarray, x: np.ndarray, c: float, beta: float) -> None:
    for k in range(d.size):
        xk = np.float64(x[k])
        u[k] = np.float64(u[k]) + xk * c
        if beta != 0.0:
            d[k] += xk * beta


@njit(nogil=True, cache=True)
def fold_finish(theta: np.ndarray, v: np.ndarray, d: np.ndarray, a: float, k_or_ratio: float, reuse: bool) -> None:
    for k in range(d.size):
        dk = d[k] * a
        v[k] = np.float64(v[k]) + dk
        dk = dk * k_or_ratio if reuse else d[k] * k_or_ratio
        theta[k] = np.float64(theta[k]) - dk


@njit(nogil=True, cache=True)
def quantize_int4(x: np.ndarray, scale_bits: np.ndarray, packed: np.ndarray) -> int:
    n = x.size
    limit = np.float32(2.0**127)
    codes = np.empty(BLOCK_SIZE, dtype=np.float32)
    blocks = (n + BLOCK_SIZE - 1) // BLOCK_SIZE
    for b in range(blocks):
        first = b * BLOCK_SIZE
        count = min(BLOCK_SIZE, n - first)
        absmax = np.float32(0.0)
        for k in range(count):
            a = abs(x[first + k])
            if not a <= limit:  # NaN, ±Inf or above 2**127
                return first + k
            absmax = max(absmax, a)
        exact = absmax * np.float32(0.125)
        bits = 0
        divisor = np.float32(np.inf)
        if exact >= np.float32(2.0**-100):  # a normal float32: round its mantissa up to bf16's seven bits
            f, e = math.frexp(np.float64(exact))
            q = math.ceil(math.ldexp(f, 8))  # in [128, 256]: 256 carries into the exponent below
            bits = ((e - 1 + 127) << 7) + (q - 128)
            divisor = _scale(bits)
        scale_bits[b] = bits
        for k in range(count):
            codes[k] = min(np.rint(x[first + k] / divisor + np.float32(7.5)), np.float32(15.0))
        for k in range(count, BLOCK_SIZE):
            codes[k] = 0.0
        byte0 = first // 2
        for j in range((count + 1) // 2):
            packed[byte0 + j] = np.uint8(codes[2 * j]) | (np.uint8(codes[2 * j + 1]) << np.uint8(4))
    return -1


@njit(nogil=True, cache=True)
def decode_int4_add(packed: np.ndarray, scale_bits: np.ndarray, u: np.ndarray, c: float, first: bool,
                    x: np.ndarray) -> int:
    n = u.size
    keep = x.size == n
    refused = _first_refused_scale(scale_bits, packed, n)  # checked first: a refused span writes nothing
    if refused >= 0:
        return refused
    block = np.empty(BLOCK_SIZE, dtype=np.float32)
    for b in range((n + BLOCK_SIZE - 1) // BLOCK_SIZE):
        start = b * BLOCK_SIZE
        m = min(BLOCK_SIZE, n - start)
        _decode_block(packed, _scale(np.int64(scale_bits[b])), start, m, block)
        # one loop per case, each without a branch inside: they vectorise
        if keep:
            for k in range(m):
                x[start + k] = block[k]
        if first:
            for k in range(m):
                u[start + k] = np.float64(block[k]) * c
        else:
            for k in range(m):
                u[start + k] += np.float64(block[k]) * c
    return -1


@njit(nogil=True, fastmath=True, cache=True, inline="always")
def _dot_fast(x: np.ndarray, u: np.ndarray) -> float:
    s = 0.0
    for j in range(u.size):
        s += np.float64(x[j]) * u[j]
    return s


@njit(nogil=True, fastmath=True, cache=True)
def screen_estimate(xs: np.ndarray, n: int, cs: np.ndarray, along: np.ndarray) -> float:
    """fast-math on purpose (reassociated, vectorised sums): an estimate whose error is bounded, never bits a
    replica keeps (:func:`protocol.kernels.screen_estimate`)."""
    m = xs.shape[0]
    block = 2048  # U's block stays in L1 while every term's products with it are summed
    ub = np.empty(block)
    uu = 0.0
    for k in range(m):
        along[k] = 0.0
    for b0 in range(0, n, block):
        e = min(block, n - b0)
        u = ub[:e]
        for k in range(m):
            accumulate_term(u, xs[k, b0:b0 + e], cs[k], k == 0)  # elementwise: fast-math would buy it nothing
        uu += _dot_fast(u, u)
        for k in range(m):
            along[k] += _dot_fast(xs[k, b0:b0 + e], u)
    return uu

"""bfloat16 bit manipulation in plain integer numpy: rounding float32 to bf16 and widening it back.

Only integer operations on the uint32 view are used, so results are bit-identical on every machine
whatever its floating-point modes (no FMA, no flush-to-zero, no platform float path involved).
"""

from __future__ import annotations

import numpy as np

#: bf16 bit pattern of the exponent field; a value whose exponent bits are all ones is Inf or NaN.
EXP_MASK = 0x7F80


def round_nearest_even(x: np.ndarray) -> np.ndarray:
    """bf16 bits (uint16) of float32 `x`, rounded to nearest, ties to even.

    Precondition (the caller checks it): every element is finite with |x| <= 2**127, so no rounding
    carries into the exponent's all-ones pattern. Subnormals round like any other value.
    """
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    r = u >> 16
    r &= 1
    r += 0x7FFF
    r += u
    r >>= 16
    return r.astype(np.uint16)


def round_up(x: np.ndarray) -> np.ndarray:
    """bf16 bits (uint16) of the smallest bf16 >= `x`, for finite float32 `x` >= 0 below 2**127."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    return ((u + 0xFFFF) >> 16).astype(np.uint16)


def widen(bits: np.ndarray) -> np.ndarray:
    """float32 values of bf16 bit patterns `bits` (any unsigned int dtype): exact, by a 16-bit shift."""
    return (bits.astype(np.uint32) << 16).view(np.float32)

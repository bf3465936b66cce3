"""Chunked elementwise passes over large float arrays.

Every hot loop in the ledger walks a tensor's flat view in fixed chunks of ``CHUNK`` elements, doing all
its elementwise work on a chunk while it is in cache (numpy alone would make one memory pass per
operation). The per-element operation sequence is the same as the unchunked one, so results are
bit-identical to it; reductions (sums of squares) are the one place where the chunking is part of the
canonical evaluation order, so ``CHUNK`` is a fixed constant, never tuned per machine.
"""

from __future__ import annotations

import math

import numpy as np

from protocol.errors import LocalProtocolError

__all__ = ["CHUNK", "copy_with_norm", "flat", "spans", "tensor_norm"]

CHUNK = 1 << 16
_F64 = np.float64
def flat(a: np.ndarray) -> np.ndarray:
    """The flat *view* of a C-contiguous array (never a copy: writes must reach ``a``)."""
    if not a.flags.c_contiguous:
        raise LocalProtocolError("ledger arrays must be C-contiguous")
    return a.reshape(-1)


def spans(size: int) -> list[slice]:
    """The fixed chunking of ``range(size)``."""
    return [slice(i, min(i + CHUNK, size)) for i in range(0, size, CHUNK)]


def _sum_squares(chunk: np.ndarray, buf: np.ndarray) -> float:
    return float(np.sum(np.square(chunk, dtype=_F64, out=buf[: chunk.size])))


def tensor_norm(x: np.ndarray) -> float:
    """Euclidean norm in float64: per-chunk numpy pairwise sums of squares (no BLAS), chunks added with
    ``math.fsum``. Deterministic for a given numpy build; non-finite input gives a non-finite norm."""
    xf = np.ascontiguousarray(x).reshape(-1)
    buf = np.empty(min(CHUNK, xf.size), dtype=_F64)
    return math.sqrt(math.fsum(_sum_squares(xf[s], buf) for s in spans(xf.size)))


def copy_with_norm(x: np.ndarray) -> tuple[np.ndarray, float]:
    """A C-contiguous copy of ``x`` and its :func:`tensor_norm`, in one pass over memory."""
    xf = np.ascontiguousarray(x).reshape(-1)
    out = np.empty(x.shape, dtype=x.dtype)
    of = out.reshape(-1)
    buf = np.empty(min(CHUNK, xf.size), dtype=_F64)
    parts = []
    for s in spans(xf.size):
        np.copyto(of[s], xf[s])
        parts.append(_sum_squares(of[s], buf))
    return out, math.sqrt(math.fsum(parts))

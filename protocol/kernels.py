"""The outer work's hottest elementwise passes, in two implementations with the same bits: numpy (the
default) and compiled loops (numba), which a process turns on for real model sizes (:func:`use_compiled`).

numpy makes one pass over memory per operation and a temporary per intermediate; a decode of an int4 span
is five of them (gather, scale check, widen, reshape, multiply), a Nesterov step seven. Compiled, each is one
loop over the elements in cache. Bits do not change: every element goes through the same IEEE operations in
the same order (float32 × float32 rounded once; float64 products and sums of widened float32 values), with
no fast-math (no reassociation, no fused multiply-add: numba emits neither unless asked), so replicas agree
whichever path each runs. The tests compare the two on random data, bit for bit
(``tests/ledger/test_kernels.py``). One kernel is the exception, and says so: :func:`screen_estimate` sums
in any order (fast-math), because what it returns is only ever used with a bound on its error, to prove a
verdict that the canonical sums would give too.

Why a switch: loading numba and its cached machine code costs a process ~2 s of CPU and ~170 MB of
resident memory (mostly LLVM), which the outer work of a small model never wins back (a 115k-parameter
model's whole close is milliseconds) and which a restart pays before it contributes. From a few million
parameters on, the compiled passes halve a close (BENCHMARKS.md). The kernels are compiled, or loaded from
numba's cache beside this file (``NUMBA_CACHE_DIR`` moves it), at their first call after the switch
(``nogil``: they run side by side in the worker threads of :mod:`protocol.parallel`). No protocol I/O.
"""

from __future__ import annotations

from functools import cache
from types import ModuleType

import numpy as np

__all__ = ["COMPILED_FROM_PARAMS", "accumulate_term", "compiled", "decode_int4", "decode_int4_add", "fold_finish", "fold_start",
           "fold_term", "nesterov_chunk", "quantize_int4", "screen_estimate", "use_compiled"]

#: Models of at least this many parameters use the compiled passes (``use_compiled(params >= ...)``).
COMPILED_FROM_PARAMS = 1 << 22
_F64 = np.float64
_NO_OUTPUT = np.empty(0, dtype=np.float32)
_state = {"compiled": False}


def use_compiled(on: bool = True) -> None:
    """Run the compiled passes in this process from now on (``on``), or the numpy ones."""
    if on:
        _warm(_jit())  # load numba and every kernel's code now, not inside the first close
    _state["compiled"] = bool(on)


def _warm(jit: ModuleType) -> None:
    """Call each kernel once with the argument types the outer passes use (numba compiles, or loads, one
    machine code per signature; a payload's arrays are read-only views of its mapped blob)."""
    def ro(a: np.ndarray) -> np.ndarray:
        view = a.view()
        view.flags.writeable = False
        return view

    one, f64 = _F64(1.0), np.zeros(2)
    f32 = np.zeros(2, np.float32)
    bits, packed = np.zeros(1, np.uint16), np.zeros(1, np.uint8)
    jit.quantize_int4(f32, bits, packed)
    jit.decode_int4(ro(packed), ro(bits), f32)
    for x in (f32, f64, _NO_OUTPUT):
        jit.decode_int4_add(ro(packed), ro(bits), f64, one, True, x)
    for x in (f32, ro(f32)):
        jit.accumulate_term(f64, x, one, True)
        for u in (f32.copy(), f64.copy()):
            jit.fold_term(u, f64, x, one, one)
    for u in (f32, f64):
        jit.fold_start(u, f64.copy(), one)
    jit.nesterov(f32, f32.copy(), f64, one, True, one, one)
    jit.fold_finish(f32, f32.copy(), f64, one, one, True)
    jit.screen_estimate(np.zeros((1, 2), np.float32), 2, f64[:1].copy(), f64[:1].copy())


def compiled() -> bool:
    return _state["compiled"]


@cache
def _jit() -> ModuleType:
    from protocol import kernels_numba  # numba itself loads here, off the import path (and its ~0.3 s)

    return kernels_numba


def decode_int4(packed: np.ndarray, scale_bits: np.ndarray, out: np.ndarray) -> bool:
    """Compiled decode of ``out.size`` int4 values into the float32 ``out``: element ``k`` is
    ``(u_k − 7.5) · s`` (one float32 multiply) with ``u_k`` the ``k``-th nibble of the uint8 ``packed`` (low
    nibble first) and ``s`` the float32 value of block ``k // BLOCK_SIZE``'s bf16 pattern in the uint16
    ``scale_bits``. False when it did not decode (numpy passes in use, or a scale a decoder refuses): the
    caller's numpy path (``protocol.compression.tensors``) then decodes, or gives the reason."""
    return compiled() and _jit().decode_int4(packed, scale_bits, out) < 0


def decode_int4_add(packed: np.ndarray, scale_bits: np.ndarray, u: np.ndarray, c: float, first: bool,
                    x: np.ndarray | None = None) -> bool:
    """:func:`decode_int4` of ``u.size`` values and :func:`accumulate_term` of them into ``u``, block by block
    (each decoded value also written into ``x`` when given: float32, or float64 holding the same values).
    False when it did not run (numpy passes in use, or a scale a decoder refuses: nothing was written)."""
    return compiled() and _jit().decode_int4_add(packed, scale_bits, u, _F64(c), first,
                                                 _NO_OUTPUT if x is None else x) < 0


def quantize_int4(x: np.ndarray, scale_bits: np.ndarray, packed: np.ndarray) -> bool:
    """Compiled int4 encoding of the flat float32 ``x`` (``protocol.compression.blockwise.quantize`` then
    ``pack_nibbles``, the same bits) into ``scale_bits`` (uint16, one per block) and ``packed`` (uint8,
    ``(x.size + 1) // 2``). False when it did not encode (numpy passes in use, or a value an encoder refuses:
    non-finite, above 2**127; the outputs are then partly written and the caller's numpy path gives the
    reason)."""
    return compiled() and _jit().quantize_int4(x, scale_bits, packed) < 0


def accumulate_term(u: np.ndarray, x: np.ndarray, c: float, first: bool) -> None:
    """``u = float64(x)·c`` (``first``) or ``u += float64(x)·c``, elementwise, each product rounded once to
    float64 before the add; ``u`` float64, ``x`` float32 or float64, both flat and of one size."""
    if compiled():
        _jit().accumulate_term(u, x, _F64(c), first)
    elif first:
        np.multiply(x, _F64(c), out=u, dtype=_F64)
    else:
        u += np.multiply(x, _F64(c), dtype=_F64)


def nesterov_chunk(theta: np.ndarray, v: np.ndarray, u: np.ndarray, scale: float | None, eta: float, mu: float) -> None:
    """One outer step in place over flat arrays (``protocol.ledger.outer.nesterov_step``'s per-element
    arithmetic): ``g = u·scale`` (or ``u``), ``v' = float64(v)·μ + g``, ``θ' = float64(θ) − (v'·μ + g)·η``, all
    in float64, each of ``v'``, ``θ'`` rounded once into its array's dtype."""
    if compiled():
        _jit().nesterov(theta, v, u, _F64(1.0 if scale is None else scale), scale is not None, _F64(eta), _F64(mu))
        return
    m, e = _F64(mu), _F64(eta)
    g = u if scale is None else np.multiply(u, _F64(scale))
    vc = np.multiply(v, m, dtype=_F64)
    vc += g
    v[...] = vc
    vc *= m
    vc += g
    vc *= e
    np.subtract(theta, vc, out=theta, casting="same_kind")


def fold_start(u: np.ndarray, d: np.ndarray, alpha: float) -> None:
    """The fold of a late change (``protocol.ledger.outer.fold_change``), its three steps over a span:
    ``d = float64(u)·α``; then per term :func:`fold_term`; then :func:`fold_finish`."""
    if compiled():
        _jit().fold_start(u, d, _F64(alpha))
    else:
        np.multiply(u, _F64(alpha), out=d, dtype=_F64)


def fold_term(u: np.ndarray, d: np.ndarray, x: np.ndarray, c: float, beta: float) -> None:
    """``u ← float64(u) + float64(x)·c`` (rounded into ``u``'s dtype) and, unless ``β = 0``,
    ``d ← d + float64(x)·β``."""
    if compiled():
        _jit().fold_term(u, d, x, _F64(c), _F64(beta))
        return
    np.add(u, np.multiply(x, _F64(c), dtype=_F64), out=u, casting="same_kind")
    if beta != 0.0:
        d += np.multiply(x, _F64(beta), dtype=_F64)


def fold_finish(theta: np.ndarray, v: np.ndarray, d: np.ndarray, a: float, k: float, reuse: bool) -> None:
    """``v ← float64(v) + d·a``; ``θ ← float64(θ) − (d·a)·k`` when ``reuse`` (``k`` is then θ's
    coefficient ÷ ``a``), else ``θ ← float64(θ) − d·k``; each rounded once into its array's dtype."""
    if compiled():
        _jit().fold_finish(theta, v, d, _F64(a), _F64(k), reuse)
        return
    da = np.multiply(d, _F64(a))
    np.add(v, da, out=v, casting="same_kind")
    np.subtract(theta, np.multiply(da if reuse else d, _F64(k)), out=theta, casting="same_kind")


def screen_estimate(xs: np.ndarray, n: int, cs: np.ndarray) -> tuple[float, np.ndarray]:
    """For the float32 rows ``x_k = xs[k, :n]`` and float64 coefficients ``cs``: ``(Σ_j U_j², [Σ_j x_kj U_j for
    each k])`` with ``U = Σ_k cs[k]·x_k``, each sum in *some* order (compiled: reassociated and vectorised
    with fast-math; numpy: BLAS). Not bits any replica keeps: an estimate whose error any summation order
    bounds, for :func:`protocol.ledger.aggregate.screen_estimate` (with ``n`` elements and ``m`` rows, within
    ``(n + 2m)·2⁻⁵³·S²`` of the exact ``‖U‖²`` and ``(n + m)·2⁻⁵³·‖x_k‖·S`` of each exact product, ``S =
    Σ_k |cs[k]|·‖x_k‖``, to first order)."""
    along = np.empty(xs.shape[0])
    if compiled():
        return float(_jit().screen_estimate(xs, n, cs, along)), along
    x = xs[:, :n].astype(_F64)
    u = cs @ x
    np.matmul(x, u, out=along)
    return float(u @ u), along

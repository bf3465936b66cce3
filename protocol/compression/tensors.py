"""encode_tensors / decode_tensors: a named set of float32 tensors <-> one payload blob.

The payload is the concatenation, in sorted-name order, of one record per tensor; a record's length
depends only on the tensor's element count and the codec (`formats.tensor_bytes`), so a payload carries
no header: codec and shapes come from the signed update header and the receiver's own model. Layout per
codec: docs/payload-format.md.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import partial

import numpy as np

from protocol import kernels
from protocol.compression import bf16, blockwise
from protocol.compression.formats import (
    BLOCK_SIZE,
    CODE_BITS,
    MAX_ABS,
    Codec,
    as_codec_local,
    as_codec_remote,
    CodecSpec,
    check_shapes,
    num_blocks,
    registered_codec,
    tensor_bytes,
)
from protocol.errors import LocalProtocolError, Reason, RemoteProtocolError
from protocol.parallel import parallel_map


def encode_tensors(tensors: Mapping[str, np.ndarray], codec: Codec | str) -> bytes:
    """Encode float32 `tensors` with `codec` into a payload.

    Deterministic: the same tensors and codec give the same bytes, on any machine. Raises
    LocalProtocolError for an unknown codec, a name that is not a str, a value that is not a float32
    numpy array (or numpy float32 scalar), or an element that is NaN/Inf or above 2**127 in magnitude.
    """
    codec = as_codec_local(codec)
    if not isinstance(tensors, Mapping):
        raise LocalProtocolError(f"tensors must be a mapping of name -> array, got {type(tensors).__name__}")
    if not all(isinstance(name, str) for name in tensors):
        raise LocalProtocolError("tensor names must be str")
    arrays = {name: as_float32_array(name, tensors[name]) for name in sorted(tensors)}

    def one(name: str) -> list[np.ndarray]:
        try:
            return _encoder(codec)(arrays[name].ravel())
        except LocalProtocolError as e:
            raise LocalProtocolError(f"{name!r}: {e}") from None

    parts = [part for record in parallel_map(one, arrays) for part in record]  # tensors in parallel threads
    return b"".join(parts)  # one copy: the parts are little-endian numpy arrays, joined as buffers


def as_float32_array(name: str, x: object) -> np.ndarray:
    """`x` if it is a float32 numpy array, as a 0-d array if it is a numpy float32 scalar (what numpy
    arithmetic on 0-d arrays returns); LocalProtocolError for anything else."""
    if isinstance(x, np.float32):
        return np.asarray(x)
    if not isinstance(x, np.ndarray) or x.dtype != np.float32:
        what = x.dtype if isinstance(x, np.ndarray) else type(x).__name__
        raise LocalProtocolError(f"{name!r}: expected a float32 numpy array, got {what}")
    return x


def decode_tensors(
    payload: bytes | bytearray | memoryview, codec: Codec | str, shapes: Mapping[str, tuple[int, ...]]
) -> dict[str, np.ndarray]:
    """Decode a payload into fresh float32 arrays of the given `shapes`, keyed in sorted-name order.

    Returns the same bits on every machine for the same bytes. Checks, cheapest first: the codec
    (RemoteProtocolError BAD_CODEC), the exact payload length for these shapes (SHAPE_MISMATCH), then per
    tensor the scales and codes (NON_FINITE for Inf/NaN, MALFORMED for anything no encoder produces).
    `shapes` come from this side: a malformed one is a LocalProtocolError. Whatever the bytes, no other
    exception escapes.
    """
    codec = as_codec_remote(codec)
    shapes = check_shapes(shapes)
    try:
        buf = memoryview(payload).cast("B")
    except TypeError:
        what = type(payload).__name__
        raise LocalProtocolError(f"payload must be a contiguous bytes-like object, got {what}") from None
    names = sorted(shapes)
    numels = [math.prod(shapes[name]) for name in names]
    expected = sum(tensor_bytes(n, codec) for n in numels)
    if buf.nbytes != expected:
        raise RemoteProtocolError(
            Reason.SHAPE_MISMATCH, f"{codec} payload is {buf.nbytes} bytes, the shapes need {expected}"
        )
    offsets, sizes = record_offsets(shapes, codec), dict(zip(names, numels, strict=True))

    def one(name: str) -> np.ndarray:
        return _decoder(codec)(buf, offsets[name], sizes[name], name, 0, sizes[name]).reshape(shapes[name])

    return dict(zip(names, parallel_map(one, names), strict=True))  # tensors in parallel threads


def record_offsets(shapes: Mapping[str, tuple[int, ...]], codec: Codec) -> dict[str, int]:
    """Byte offset of each tensor's record in a payload of `codec` for `shapes` (sorted-name order)."""
    offsets, offset = {}, 0
    for name in sorted(shapes):
        offsets[name] = offset
        offset += tensor_bytes(math.prod(shapes[name]), codec)
    return offsets


def decode_span(
    payload: bytes | memoryview, codec: Codec, offset: int, numel: int, name: str, start: int, stop: int
) -> np.ndarray:
    """Elements ``[start, stop)`` of the flat tensor whose record (of `numel` elements) sits at byte
    `offset` of `payload` (see `record_offsets`), as a fresh float32 array: the same bits as the same
    slice of `decode_tensors`. `start` must be a multiple of BLOCK_SIZE (LocalProtocolError otherwise).
    Checks the span's scales and codes as `decode_tensors` does (RemoteProtocolError)."""
    if start % BLOCK_SIZE or not 0 <= start <= stop <= numel:
        raise LocalProtocolError(f"span [{start}, {stop}) of {numel} elements must start at a block boundary")
    return _decoder(codec)(memoryview(payload).cast("B"), offset, numel, name, start, stop)


def add_decoded_span(
    payload: bytes | memoryview, codec: Codec, offset: int, numel: int, name: str, start: int, stop: int,
    u: np.ndarray, c: float, first: bool, x: np.ndarray | None = None,
) -> bool:
    """``u = float64(x)·c`` (``first``) or ``u += float64(x)·c`` for ``x`` the decode of elements ``[start,
    stop)`` (as :func:`decode_span`), in one compiled pass that also writes ``x`` when given; False when it
    did not run (not int4, the compiled passes off, or a scale to refuse): the caller then decodes with
    :func:`decode_span`, which gives the reason for a bad span."""
    if codec is not Codec.INT4 or not kernels.compiled() or start % BLOCK_SIZE or not 0 <= start <= stop <= numel:
        return False
    scale_bits, packed = _blockwise_parts(codec, memoryview(payload).cast("B"), offset, numel, name, start, stop)
    return kernels.decode_int4_add(packed, scale_bits, u, c, first, x)


def decode_span_into(
    payload: bytes | memoryview, codec: Codec, offset: int, numel: int, name: str, start: int, stop: int,
    out: np.ndarray,
) -> bool:
    """:func:`decode_span` into the float32 ``out`` (its first ``stop − start`` elements), in one compiled pass;
    False when it did not run (not int4, the compiled passes off, or a scale to refuse: nothing was written),
    and the caller then decodes with :func:`decode_span`."""
    if codec is not Codec.INT4 or not kernels.compiled() or start % BLOCK_SIZE or not 0 <= start <= stop <= numel:
        return False
    scale_bits, packed = _blockwise_parts(codec, memoryview(payload).cast("B"), offset, numel, name, start, stop)
    return kernels.decode_int4(packed, scale_bits, out[: stop - start])


# --- per-tensor records ---------------------------------------------------------------------------


def _check_range(x: np.ndarray) -> None:
    if x.size and not np.abs(x).max() <= MAX_ABS:
        raise LocalProtocolError("non-finite value" if not np.isfinite(x).all() else "|x| above 2**127")


def _encode_fp32(x: np.ndarray) -> list[np.ndarray]:
    _check_range(x)
    return [x.astype("<f4", copy=False)]


def _encode_bf16(x: np.ndarray) -> list[np.ndarray]:
    _check_range(x)
    return [bf16.round_nearest_even(x).astype("<u2", copy=False)]


def _encode_blockwise(codec: Codec, x: np.ndarray) -> list[np.ndarray]:
    if codec is Codec.INT4 and kernels.compiled():
        scale_bits, packed = np.empty(num_blocks(x.size), dtype="<u2"), np.empty((x.size + 1) // 2, dtype=np.uint8)
        if kernels.quantize_int4(np.ascontiguousarray(x), scale_bits, packed):  # compiled, the same bits
            return [scale_bits, packed]
    return encode_blockwise_numpy(codec, x)


def encode_blockwise_numpy(codec: Codec, x: np.ndarray) -> list[np.ndarray]:
    """The blockwise encoder in numpy (int4 runs compiled when ``protocol.kernels.use_compiled`` is on, and
    comes here then only to report a value it refuses, ``LocalProtocolError``)."""
    scale_bits, codes = blockwise.quantize(x, CODE_BITS[codec], BLOCK_SIZE)
    if codec is Codec.INT4:
        codes = blockwise.pack_nibbles(codes)
    return [scale_bits.astype("<u2", copy=False), np.ascontiguousarray(codes)]


def _decode_fp32(buf: memoryview, offset: int, numel: int, name: str, start: int, stop: int) -> np.ndarray:
    x = np.frombuffer(buf, dtype="<f4", count=stop - start, offset=offset + 4 * start).astype(np.float32)
    if x.size and not np.abs(x).max() <= MAX_ABS:
        if not np.isfinite(x).all():
            raise RemoteProtocolError(Reason.NON_FINITE, f"{name}: Inf/NaN in fp32 payload")
        raise RemoteProtocolError(Reason.MALFORMED, f"{name}: fp32 value above 2**127")
    return x


def _decode_bf16(buf: memoryview, offset: int, numel: int, name: str, start: int, stop: int) -> np.ndarray:
    bits = np.frombuffer(buf, dtype="<u2", count=stop - start, offset=offset + 2 * start)
    magnitude = bits & np.uint16(0x7FFF)
    if (magnitude > 0x7F00).any():  # 0x7F00 is 2**127
        worst = int(magnitude.max())
        if worst & bf16.EXP_MASK == bf16.EXP_MASK:
            raise RemoteProtocolError(Reason.NON_FINITE, f"{name}: Inf/NaN in bf16 payload")
        raise RemoteProtocolError(Reason.MALFORMED, f"{name}: bf16 value above 2**127")
    return bf16.widen(bits)


def _blockwise_parts(
    codec: Codec, buf: memoryview, offset: int, numel: int, name: str, start: int, stop: int
) -> tuple[np.ndarray, np.ndarray]:
    """The span's bf16 scale patterns and its codes (int4: packed, the padding nibble checked), as views."""
    first, count = start // BLOCK_SIZE, num_blocks(stop) - start // BLOCK_SIZE
    scale_bits = np.frombuffer(buf, dtype="<u2", count=count, offset=offset + 2 * first)
    offset += 2 * num_blocks(numel)
    if codec is Codec.INT8:
        return scale_bits, np.frombuffer(buf, dtype=np.uint8, count=stop - start, offset=offset + start)
    packed = np.frombuffer(buf, dtype=np.uint8, count=(stop - start + 1) // 2, offset=offset + start // 2)
    if stop == numel and numel % 2 and packed[-1] >> 4:
        raise RemoteProtocolError(Reason.MALFORMED, f"{name}: nonzero padding nibble")
    return scale_bits, packed


def _decode_blockwise(
    codec: Codec, buf: memoryview, offset: int, numel: int, name: str, start: int, stop: int
) -> np.ndarray:
    scale_bits, codes = _blockwise_parts(codec, buf, offset, numel, name, start, stop)
    if codec is Codec.INT4 and kernels.compiled():
        out = np.empty(stop - start, dtype=np.float32)
        if kernels.decode_int4(codes, scale_bits, out):  # compiled, the bits of `decode_blockwise_numpy`
            return out
    return decode_blockwise_numpy(codec, scale_bits, codes, name, stop - start)


def decode_blockwise_numpy(codec: Codec, scale_bits: np.ndarray, codes: np.ndarray, name: str, count: int) -> np.ndarray:
    """The decode of a blockwise span in numpy: checks the scales (``RemoteProtocolError``), then levels ×
    scale (int4 runs compiled when ``protocol.kernels.use_compiled`` is on, and comes here then only to
    report a refused scale)."""
    scales = blockwise.check_scales(scale_bits, CODE_BITS[codec], name)
    levels = blockwise.levels_8(codes) if codec is Codec.INT8 else blockwise.levels_4(codes, count)
    return blockwise.apply_scales(levels, scales, BLOCK_SIZE)


_ENCODERS = {
    Codec.FP32: _encode_fp32,
    Codec.BF16: _encode_bf16,
    Codec.INT8: partial(_encode_blockwise, Codec.INT8),
    Codec.INT4: partial(_encode_blockwise, Codec.INT4),
}
_DECODERS = {
    Codec.FP32: _decode_fp32,
    Codec.BF16: _decode_bf16,
    Codec.INT8: partial(_decode_blockwise, Codec.INT8),
    Codec.INT4: partial(_decode_blockwise, Codec.INT4),
}


def _encoder(codec: Codec | str):
    spec = registered_codec(codec)
    return _ENCODERS[codec] if spec is None else partial(_encode_registered, spec)


def _decoder(codec: Codec | str):
    spec = registered_codec(codec)
    return _DECODERS[codec] if spec is None else partial(_decode_registered, spec)


def _encode_registered(spec: CodecSpec, x: np.ndarray) -> list[np.ndarray]:
    _check_range(x)
    record = np.frombuffer(bytes(spec.encode(x)), dtype=np.uint8)
    if record.size != spec.record_bytes(x.size):
        raise LocalProtocolError(f"codec {spec.name!r} encoded {x.size} values into {record.size} bytes, "
                                 f"not its record_bytes({x.size}) = {spec.record_bytes(x.size)}")
    return [record]


def _decode_registered(spec: CodecSpec, buf: memoryview, offset: int, numel: int, name: str, start: int,
                       stop: int) -> np.ndarray:
    """A registered codec's span, held to what every built-in decode guarantees: float32, the span's length,
    finite and at most 2**127 in magnitude (else the peer's bytes are refused)."""
    record = buf[offset: offset + spec.record_bytes(numel)].toreadonly()
    out = spec.decode(record, numel, start, stop)
    if not isinstance(out, np.ndarray) or out.dtype != np.float32 or out.shape != (stop - start,):
        raise RemoteProtocolError(Reason.MALFORMED, f"{name}: codec {spec.name!r} decoded no float32 span of "
                                  f"{stop - start} values")
    if out.size and not np.abs(out).max() <= MAX_ABS:
        raise RemoteProtocolError(Reason.NON_FINITE if not np.isfinite(out).all() else Reason.MALFORMED,
                                  f"{name}: codec {spec.name!r} decoded a value that is not finite or above 2**127")
    return out

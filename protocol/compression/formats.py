"""Codec names, wire constants and the payload size rule shared by encoder and decoder.

Everything a decoder needs to know before it touches a byte lives here: which codecs exist, how large a
payload for a given set of shapes must be, and the numeric limits both sides agree on. The byte layout
itself is specified in `docs/payload-format.md`; keep the two in step.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping

import numpy as np

from protocol.errors import LocalProtocolError, Reason, RemoteProtocolError


class Codec(enum.StrEnum):
    """A pseudo-gradient payload codec. The value is what travels in the signed update header."""

    FP32 = "fp32"
    BF16 = "bf16"
    INT8 = "int8"
    INT4 = "int4"


#: Elements per quantization block (int8, int4). Each tensor is cut into blocks on its own (row-major
#: order); the last block of a tensor may be short. Chosen from measurement, see docs/payload-format.md.
BLOCK_SIZE = 64

#: Bits per code of the blockwise codecs.
CODE_BITS = {Codec.INT8: 8, Codec.INT4: 4}

#: Encoders of every codec accept finite values with |x| <= MAX_ABS (2**127), and every decoded value
#: satisfies it too, so a decoded payload can always be encoded again, with any codec.
MAX_ABS = 2.0**127

#: Smallest nonzero block scale. A block whose exact scale (absmax / 2**(bits-1)) is below it is sent
#: as scale 0 (all zeros). Keeps every float operation of encoder and decoder away from subnormals, so
#: flush-to-zero / denormals-are-zero CPU modes cannot change a single bit.
MIN_SCALE = 2.0**-100

#: Bytes per block scale (a bfloat16) of the blockwise codecs.
_SCALE_BYTES = 2


def as_codec_local(codec: Codec | str) -> Codec:
    """`codec` as a Codec, or LocalProtocolError if this side named one that does not exist."""
    try:
        return Codec(codec)
    except ValueError:
        raise LocalProtocolError(f"unknown codec {codec!r}; expected one of {[c.value for c in Codec]}") from None


def as_codec_remote(codec: Codec | str) -> Codec:
    """`codec` as a Codec, or RemoteProtocolError(BAD_CODEC) if a peer named one that does not exist."""
    try:
        return Codec(codec)
    except (ValueError, TypeError):
        raise RemoteProtocolError(Reason.BAD_CODEC, f"unknown codec {codec!r}") from None


def num_blocks(numel: int) -> int:
    """Number of quantization blocks of a tensor with `numel` elements (0 for an empty tensor)."""
    return -(-numel // BLOCK_SIZE)


def tensor_bytes(numel: int, codec: Codec) -> int:
    """Size in bytes of one tensor's record in a payload of `codec`."""
    if codec is Codec.FP32:
        return 4 * numel
    if codec is Codec.BF16:
        return 2 * numel
    code_bytes = numel if codec is Codec.INT8 else (numel + 1) // 2
    return _SCALE_BYTES * num_blocks(numel) + code_bytes


def check_shapes(shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    """Validate a name -> shape mapping supplied by the local caller; return it with plain-int tuples.

    Raises LocalProtocolError for a non-str name or a shape that is not a sequence of ints >= 0.
    """
    if not isinstance(shapes, Mapping):
        raise LocalProtocolError(f"shapes must be a mapping of name -> shape, got {type(shapes).__name__}")
    out: dict[str, tuple[int, ...]] = {}
    for name, shape in shapes.items():
        if not isinstance(name, str):
            raise LocalProtocolError(f"tensor names must be str, got {type(name).__name__}")
        if not isinstance(shape, tuple | list) or not all(
            isinstance(d, int | np.integer) and not isinstance(d, bool) and d >= 0 for d in shape
        ):
            raise LocalProtocolError(f"shape of {name!r} must be a tuple of ints >= 0, got {shape!r}")
        out[name] = tuple(int(d) for d in shape)
    return out


def payload_size(shapes: Mapping[str, tuple[int, ...]], codec: Codec | str) -> int:
    """Exact payload length in bytes for tensors of these shapes under `codec` (no header, no padding
    between records). Lets a receiver check an announced blob size before downloading it."""
    codec = as_codec_local(codec)
    return sum(tensor_bytes(math.prod(s), codec) for s in check_shapes(shapes).values())


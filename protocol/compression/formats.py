"""Codec names, wire constants and the payload size rule shared by encoder and decoder.

Everything a decoder needs to know before it touches a byte lives here: which codecs exist, how large a
payload for a given set of shapes must be, and the numeric limits both sides agree on. The byte layout
itself is specified in `docs/payload-format.md`; keep the two in step.

The built-in codecs are `Codec`'s. Others are registered in this one place (`register_codec`, a `CodecSpec`:
its record size, encoder and span decoder), and from then on every path that takes a codec name takes
theirs: the update header, the payload size check, encoding with error feedback, the ledger's span
decodes, state sync and `--compression`. A registered codec's name is the plain `str`; a built-in's is the
`Codec` member (a `str` too).
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

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


@dataclass(frozen=True)
class CodecSpec:
    """A codec registered from outside the package. The payload stays one record per tensor in sorted-name
    order (docs/payload-format.md), each record laid out by the codec:

    - ``record_bytes(n)``: the bytes of the record of a tensor of ``n`` elements (a function of ``n`` alone);
    - ``encode(x)``: the record of the flat float32 array ``x`` (finite, ``|x| ≤ 2**127``: checked before),
      ``record_bytes(x.size)`` bytes, the same bytes on every machine;
    - ``decode(record, n, start, stop)``: elements ``[start, stop)`` of the tensor whose record (a read-only
      byte memoryview) holds ``n`` elements, as float32; ``start`` is a multiple of `BLOCK_SIZE`. Bytes a
      peer sent: a record it cannot have encoded raises ``RemoteProtocolError`` (the caller also refuses a
      non-finite or oversized value, or an array of another length or dtype, for it).
    """

    name: str
    record_bytes: Callable[[int], int]
    encode: Callable[[np.ndarray], bytes]
    decode: Callable[[memoryview, int, int, int], np.ndarray]


_REGISTERED: dict[str, CodecSpec] = {}


def register_codec(spec: CodecSpec) -> None:
    """Make ``spec.name`` a codec every path accepts (module docstring). A name is registered once."""
    if not isinstance(spec, CodecSpec):
        raise LocalProtocolError(f"register_codec needs a CodecSpec, got {type(spec).__name__}")
    if not isinstance(spec.name, str) or not 1 <= len(spec.name) <= 16 or not spec.name.isprintable():
        raise LocalProtocolError(f"a codec's name is 1-16 printable characters (the header's field), got {spec.name!r}")
    if spec.name in codec_names() and _REGISTERED.get(spec.name) is not spec:
        raise LocalProtocolError(f"a codec named {spec.name!r} is already registered")
    _REGISTERED[spec.name] = spec


def registered_codec(codec: str) -> CodecSpec | None:
    """The `CodecSpec` of a registered codec's name; None for a built-in (or unknown) one."""
    return None if isinstance(codec, Codec) else _REGISTERED.get(codec)


def codec_names() -> list[str]:
    """Every codec's name: the built-ins, then the registered ones."""
    return [c.value for c in Codec] + sorted(_REGISTERED)


def _lookup(codec: object) -> Codec | str | None:
    if isinstance(codec, Codec):
        return codec
    try:
        return Codec(codec)
    except (ValueError, TypeError):
        return codec if isinstance(codec, str) and codec in _REGISTERED else None


def as_codec_local(codec: Codec | str) -> Codec | str:
    """`codec` as a Codec (or a registered codec's name), or LocalProtocolError if this side named one that
    does not exist."""
    found = _lookup(codec)
    if found is None:
        raise LocalProtocolError(f"unknown codec {codec!r}; expected one of {codec_names()}")
    return found


def as_codec_remote(codec: Codec | str) -> Codec | str:
    """`codec` as a Codec (or a registered codec's name), or RemoteProtocolError(BAD_CODEC) if a peer named
    one that does not exist."""
    found = _lookup(codec)
    if found is None:
        raise RemoteProtocolError(Reason.BAD_CODEC, f"unknown codec {codec!r}")
    return found


def num_blocks(numel: int) -> int:
    """Number of quantization blocks of a tensor with `numel` elements (0 for an empty tensor)."""
    return -(-numel // BLOCK_SIZE)


def tensor_bytes(numel: int, codec: Codec | str) -> int:
    """Size in bytes of one tensor's record in a payload of `codec`."""
    if not isinstance(codec, Codec):
        spec = _REGISTERED.get(codec)
        if spec is not None:
            return int(spec.record_bytes(numel))
        codec = Codec(as_codec_local(codec))
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


"""A second decoder written from docs/payload-format.md alone (pure Python: struct, ints, one rounding
to binary32 per value), checked bit for bit against decode_tensors. If the document and the code ever
disagree, this fails."""

from __future__ import annotations

import math
import struct

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from protocol.compression import Codec, decode_tensors, encode_tensors, payload_size
from protocol.errors import RemoteProtocolError


def to_f32(value: float) -> float:
    """Round a Python float (binary64) to binary32, nearest-even, and back."""
    return struct.unpack("<f", struct.pack("<f", value))[0]


def bf16_value(word: int) -> float:
    return struct.unpack("<f", struct.pack("<I", word << 16))[0]


def reference_decode(payload: bytes, codec: str, shapes: dict[str, tuple[int, ...]]) -> dict[str, list[float]] | None:
    """The decoded values per tensor as Python floats, or None where the document says: refuse."""
    out, pos = {}, 0
    for name in sorted(shapes):
        n = math.prod(shapes[name])
        if codec == "fp32":
            values = list(struct.unpack_from(f"<{n}f", payload, pos)) if n else []
            pos += 4 * n
            if any(not math.isfinite(v) or abs(v) > 2.0**127 for v in values):
                return None
        elif codec == "bf16":
            words = struct.unpack_from(f"<{n}H", payload, pos) if n else ()
            pos += 2 * n
            if any((w & 0x7FFF) > 0x7F00 for w in words):
                return None
            values = [bf16_value(w) for w in words]
        else:
            bits = 8 if codec == "int8" else 4
            nb = -(-n // 64)
            scales = struct.unpack_from(f"<{nb}H", payload, pos) if nb else ()
            pos += 2 * nb
            top = 0x7B80 if bits == 8 else 0x7D80
            if any(not (s == 0 or 0x0D80 <= s <= top) for s in scales):
                return None
            if bits == 8:
                codes = list(payload[pos : pos + n])
                pos += n
            else:
                raw = payload[pos : pos + (n + 1) // 2]
                pos += (n + 1) // 2
                codes = [c for byte in raw for c in (byte & 15, byte >> 4)]
                if n % 2 and codes[-1] != 0:
                    return None
                codes = codes[:n]
            offset = 2 ** (bits - 1) - 0.5
            # level * s is exact in binary64 (<= 17 significant bits): one rounding to binary32.
            values = [to_f32((u - offset) * bf16_value(scales[i // 64])) for i, u in enumerate(codes)]
        out[name] = values
    assert pos == len(payload)
    return out


shapes_st = st.dictionaries(
    st.text(max_size=3), hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=70), min_size=1, max_size=3
)


def same_bits(a: list[float], b: np.ndarray) -> bool:
    return struct.pack(f"<{len(a)}f", *a) == b.astype("<f4").tobytes()


@given(shapes_st, st.sampled_from(list(Codec)), st.integers(0, 2**32 - 1), st.integers(-40, 30))
def test_reference_decoder_agrees_on_encoded_payloads(shapes: dict, codec: Codec, seed: int, exp10: int) -> None:
    rng = np.random.default_rng(seed)
    tensors = {k: (rng.standard_normal(s) * 10.0**exp10).astype(np.float32).reshape(s) for k, s in shapes.items()}
    payload = encode_tensors(tensors, codec)
    expected = reference_decode(payload, codec.value, shapes)
    assert expected is not None
    out = decode_tensors(payload, codec, shapes)
    assert all(same_bits(expected[k], out[k].ravel()) for k in shapes)


@given(shapes_st, st.sampled_from(list(Codec)), st.data())
def test_reference_decoder_agrees_on_arbitrary_bytes(shapes: dict, codec: Codec, data: st.DataObject) -> None:
    size = payload_size(shapes, codec)
    payload = data.draw(st.binary(min_size=size, max_size=size))
    expected = reference_decode(payload, codec.value, shapes)
    try:
        out = decode_tensors(payload, codec, shapes)
    except RemoteProtocolError:
        assert expected is None
        return
    assert expected is not None
    assert all(same_bits(expected[k], out[k].ravel()) for k in shapes)

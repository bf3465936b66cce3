"""Bad input on either side: the encoder raises LocalProtocolError, the decoder RemoteProtocolError
with the right reason, and arbitrary or mutated bytes never make decode_tensors raise anything else."""

from __future__ import annotations

import math
import struct

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from protocol.compression import Codec, decode_tensors, encode_tensors, payload_size
from protocol.errors import LocalProtocolError, ProtocolError, Reason, RemoteProtocolError

shapes_st = st.dictionaries(
    st.text(max_size=3), hnp.array_shapes(min_dims=0, max_dims=2, min_side=0, max_side=70), max_size=3
)
codecs = st.sampled_from(list(Codec))


def decode_or_refuse(payload: bytes, codec: Codec, shapes: dict[str, tuple[int, ...]]) -> None:
    """Decode; a refusal must be a RemoteProtocolError, a success must honour the contract."""
    try:
        out = decode_tensors(payload, codec, shapes)
    except RemoteProtocolError as e:
        assert isinstance(e.reason, Reason)
        return
    assert list(out) == sorted(shapes)
    for name, shape in shapes.items():
        assert out[name].shape == shape and out[name].dtype == np.float32
        assert np.isfinite(out[name]).all() and (np.abs(out[name]) <= 2.0**127).all()


@given(shapes_st, codecs, st.data())
def test_random_bytes_of_the_right_length(shapes: dict, codec: Codec, data: st.DataObject) -> None:
    size = payload_size(shapes, codec)
    decode_or_refuse(data.draw(st.binary(min_size=size, max_size=size)), codec, shapes)


@given(shapes_st, codecs, st.binary(max_size=300))
def test_random_bytes_of_any_length(shapes: dict, codec: Codec, payload: bytes) -> None:
    decode_or_refuse(payload, codec, shapes)


edits_st = st.lists(st.tuples(st.integers(0), st.integers(0, 255)), max_size=8)


@given(shapes_st, codecs, st.integers(0, 2**32 - 1), edits_st)
def test_mutated_valid_payloads(shapes: dict, codec: Codec, seed: int, edits: list) -> None:
    rng = np.random.default_rng(seed)
    tensors = {k: rng.standard_normal(s, dtype=np.float32).reshape(s) for k, s in shapes.items()}
    payload = bytearray(encode_tensors(tensors, codec))
    for pos, value in edits:
        if payload:
            payload[pos % len(payload)] = value
    decode_or_refuse(bytes(payload), codec, shapes)
    decode_or_refuse(bytes(payload[:-1]), codec, shapes)
    decode_or_refuse(bytes(payload) + b"\0", codec, shapes)


def refused(payload: bytes, codec: Codec | str, shapes: dict) -> Reason:
    with pytest.raises(RemoteProtocolError) as info:
        decode_tensors(payload, codec, shapes)
    return info.value.reason


@pytest.mark.parametrize("codec", list(Codec))
def test_length_mismatch_is_shape_mismatch(codec: Codec) -> None:
    payload = encode_tensors({"w": np.ones((3, 70), np.float32)}, codec)
    assert refused(payload[:-1], codec, {"w": (3, 70)}) is Reason.SHAPE_MISMATCH
    assert refused(payload + b"\0", codec, {"w": (3, 70)}) is Reason.SHAPE_MISMATCH
    assert refused(payload, codec, {"w": (3, 71)}) is Reason.SHAPE_MISMATCH
    assert refused(payload, codec, {"w": (3, 70), "x": (1,)}) is Reason.SHAPE_MISMATCH


def test_unknown_codec() -> None:
    assert refused(b"", "fp8", {}) is Reason.BAD_CODEC
    assert refused(b"", None, {}) is Reason.BAD_CODEC  # type: ignore[arg-type]
    with pytest.raises(LocalProtocolError):
        encode_tensors({}, "fp8")


def f32(*values: float) -> bytes:
    return struct.pack(f"<{len(values)}f", *values)


def test_non_finite_fp32_and_bf16() -> None:
    assert refused(f32(1.0, math.nan), Codec.FP32, {"w": (2,)}) is Reason.NON_FINITE
    assert refused(f32(-math.inf), Codec.FP32, {"w": ()}) is Reason.NON_FINITE
    assert refused(f32(3e38), Codec.FP32, {"w": ()}) is Reason.MALFORMED
    assert refused(struct.pack("<2H", 0x3F80, 0x7F80), Codec.BF16, {"w": (2,)}) is Reason.NON_FINITE
    assert refused(struct.pack("<H", 0xFFC1), Codec.BF16, {"w": (1,)}) is Reason.NON_FINITE
    # Finite but above 2**127: no encoder makes it.
    assert refused(struct.pack("<H", 0x7F01), Codec.BF16, {"w": (1,)}) is Reason.MALFORMED
    assert decode_tensors(struct.pack("<H", 0xFF00), Codec.BF16, {"w": ()})["w"] == -(2.0**127)


@pytest.mark.parametrize(
    ("scale", "reason"),
    [
        (0x7F80, Reason.NON_FINITE),  # +Inf
        (0x7FC0, Reason.NON_FINITE),  # NaN
        (0xFF80, Reason.NON_FINITE),  # -Inf
        (0x8000, Reason.MALFORMED),  # -0
        (0xBF80, Reason.MALFORMED),  # -1
        (0x0001, Reason.MALFORMED),  # subnormal
        (0x0D7F, Reason.MALFORMED),  # just below 2**-100
        (0x7D81, Reason.MALFORMED),  # above 2**124
    ],
)
def test_bad_scales(scale: int, reason: Reason) -> None:
    assert refused(struct.pack("<H", scale) + b"\x77", Codec.INT4, {"w": (2,)}) is reason
    assert refused(struct.pack("<H", scale) + b"\x77\x77", Codec.INT8, {"w": (2,)}) is reason


def test_scale_limits_per_codec() -> None:
    # 2**120 is the largest int8 scale, 2**124 the largest int4 scale; 2**-100 the smallest for both.
    assert refused(struct.pack("<HB", 0x7B81, 0), Codec.INT8, {"w": ()}) is Reason.MALFORMED
    top8 = decode_tensors(struct.pack("<HB", 0x7B80, 255), Codec.INT8, {"w": ()})["w"]
    top4 = decode_tensors(struct.pack("<HB", 0x7D80, 15), Codec.INT4, {"w": ()})["w"]
    low = decode_tensors(struct.pack("<HB", 0x0D80, 0), Codec.INT8, {"w": ()})["w"]
    assert top8 == 127.5 * 2.0**120 and top4 == 7.5 * 2.0**124 and low == -127.5 * 2.0**-100
    # Scale 0: every level times +0, with the IEEE sign rule (-7.5 * +0 = -0).
    zero = decode_tensors(struct.pack("<HB", 0, 0x80), Codec.INT4, {"w": (2,)})["w"]
    assert zero.view(np.uint32).tolist() == [0x80000000, 0]


def test_int4_padding_nibble_must_be_zero() -> None:
    assert decode_tensors(struct.pack("<HB", 0x3F80, 0x0F), Codec.INT4, {"w": (1,)})["w"].tolist() == [7.5]
    assert refused(struct.pack("<HB", 0x3F80, 0x1F), Codec.INT4, {"w": (1,)}) is Reason.MALFORMED


@pytest.mark.parametrize("codec", list(Codec))
@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
def test_encoder_refuses_non_finite(codec: Codec, bad: float) -> None:
    x = np.ones(100, np.float32)
    x[77] = bad
    with pytest.raises(LocalProtocolError, match="non-finite"):
        encode_tensors({"w": x}, codec)


@pytest.mark.parametrize("codec", list(Codec))
def test_encoder_refuses_values_above_2_pow_127(codec: Codec) -> None:
    with pytest.raises(LocalProtocolError, match="2\\*\\*127"):
        encode_tensors({"w": np.array([1.0, -3e38], np.float32)}, codec)
    assert len(encode_tensors({"w": np.array([2.0**127], np.float32)}, codec)) > 0


@pytest.mark.parametrize(
    "tensors",
    [
        {"w": np.ones(3, np.float64)},
        {"w": [1.0, 2.0]},
        {"w": np.ones(3, np.float16)},
        {1: np.ones(3, np.float32)},
    ],
)
def test_encoder_refuses_wrong_types(tensors: dict) -> None:
    with pytest.raises(LocalProtocolError):
        encode_tensors(tensors, Codec.INT8)


@pytest.mark.parametrize("shapes", [{"w": (-1,)}, {"w": (1.5,)}, {"w": "3"}, {"w": (True,)}, {2: (1,)}, [("w", (1,))]])
def test_decoder_refuses_bad_local_shapes(shapes: object) -> None:
    with pytest.raises(LocalProtocolError):
        decode_tensors(b"\0" * 4, Codec.FP32, shapes)  # type: ignore[arg-type]


def test_decoder_refuses_non_bytes_payload() -> None:
    with pytest.raises(LocalProtocolError):
        decode_tensors("abcd", Codec.FP32, {"w": ()})  # type: ignore[arg-type]
    strided = memoryview(bytearray(8))[::2]
    with pytest.raises(LocalProtocolError):
        decode_tensors(strided, Codec.FP32, {"w": ()})


def test_every_refusal_is_a_protocol_error() -> None:
    assert issubclass(RemoteProtocolError, ProtocolError) and issubclass(LocalProtocolError, ProtocolError)

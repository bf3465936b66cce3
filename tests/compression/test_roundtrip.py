"""Round trips, error bounds and determinism of every codec (property tests)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from protocol.compression import BLOCK_SIZE, Codec, decode_tensors, encode_tensors, payload_size

ml_dtypes = pytest.importorskip("ml_dtypes")

MAX_ABS = 2.0**127

#: Shapes with scalars, empty dims, odd sizes and sizes around multiples of the 64-element block.
shapes = st.one_of(
    st.just(()),
    st.tuples(st.sampled_from([0, 1, 2, 3, 63, 64, 65, 127, 128, 129, 191, 257])),
    hnp.array_shapes(min_dims=1, max_dims=3, min_side=0, max_side=9),
    st.tuples(st.integers(1, 5), st.sampled_from([1, 31, 64, 100])),
)

finite32 = st.floats(min_value=-MAX_ABS, max_value=MAX_ABS, width=32, allow_nan=False)


@st.composite
def tensors(draw: st.DrawFn, shape_strategy: st.SearchStrategy = shapes) -> np.ndarray:
    """A float32 array: either any finite values (subnormals and extremes included) or a realistic
    block of Gaussian values times a random power-of-ten scale."""
    shape = draw(shape_strategy)
    if draw(st.booleans()):
        return draw(hnp.arrays(np.float32, shape, elements=finite32))
    seed = draw(st.integers(0, 2**32 - 1))
    scale = np.float32(10.0 ** draw(st.integers(-30, 30)))
    return np.random.default_rng(seed).standard_normal(shape, dtype=np.float32) * scale


names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=0, max_size=6)
tensor_dicts = st.dictionaries(names, tensors(), max_size=4)


def shapes_of(t: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    return {k: v.shape for k, v in t.items()}


@pytest.mark.slow
@given(tensor_dicts, st.sampled_from(list(Codec)))
def test_roundtrip_keeps_names_shapes_and_length(t: dict[str, np.ndarray], codec: Codec) -> None:
    payload = encode_tensors(t, codec)
    assert isinstance(payload, bytes)
    assert len(payload) == payload_size(shapes_of(t), codec)
    out = decode_tensors(payload, codec, shapes_of(t))
    assert list(out) == sorted(t)
    for name, x in t.items():
        assert out[name].dtype == np.float32 and out[name].shape == x.shape
        assert out[name].flags.writeable
        assert np.isfinite(out[name]).all() and (np.abs(out[name]) <= 2.0**127).all()


@given(tensor_dicts)
def test_fp32_is_bit_exact(t: dict[str, np.ndarray]) -> None:
    out = decode_tensors(encode_tensors(t, Codec.FP32), Codec.FP32, shapes_of(t))
    for name, x in t.items():
        assert np.array_equal(out[name].view(np.uint32), x.view(np.uint32))


@given(tensors())
def test_bf16_matches_round_to_nearest_even_oracle(x: np.ndarray) -> None:
    out = decode_tensors(encode_tensors({"x": x}, Codec.BF16), Codec.BF16, {"x": x.shape})["x"]
    expected = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    assert np.array_equal(out.view(np.uint32), expected.view(np.uint32))


def test_bf16_rounding_at_every_low_half_pattern() -> None:
    """All 65536 low halves under high halves around 1, -1, the subnormals and the top of the range:
    ties, just-above-tie (0x8001) and carries into the exponent are all exercised."""
    low = np.arange(65536, dtype=np.uint32)
    words = np.concatenate([(np.uint32(high) << 16) | low for high in (0x3F80, 0x3F81, 0xBF80, 0x0000, 0x807F, 0x7EFF)])
    x = words.view(np.float32)
    out = decode_tensors(encode_tensors({"x": x}, Codec.BF16), Codec.BF16, {"x": x.shape})["x"]
    expected = x.astype(ml_dtypes.bfloat16).astype(np.float32)
    assert np.array_equal(out.view(np.uint32), expected.view(np.uint32))


def blockwise_bound(x: np.ndarray, bits: int) -> np.ndarray:
    """Per-element error bound from docs/payload-format.md, in float64: half a step of a scale at most
    2**-7 above absmax * 2**-(bits-1), float32 rounding slack, and the flush of tiny blocks."""
    flat = x.astype(np.float64).ravel()
    n = flat.size
    padded = np.zeros(math.ceil(n / BLOCK_SIZE) * BLOCK_SIZE)
    padded[:n] = flat
    absmax = np.abs(padded.reshape(-1, BLOCK_SIZE)).max(axis=1)
    step = absmax * 2.0 ** -(bits - 1) * (1 + 2.0**-7)
    per_block = step * (0.5 + 2.0**-14) + 2.0**-90
    return np.repeat(per_block, BLOCK_SIZE)[:n].reshape(x.shape) + 2.0**-23 * np.abs(x.astype(np.float64))


@pytest.mark.parametrize("codec", [Codec.INT8, Codec.INT4])
@given(x=tensors())
def test_blockwise_error_within_half_a_step(codec: Codec, x: np.ndarray) -> None:
    bits = 8 if codec is Codec.INT8 else 4
    out = decode_tensors(encode_tensors({"x": x}, codec), codec, {"x": x.shape})["x"]
    err = np.abs(out.astype(np.float64) - x.astype(np.float64))
    assert (err <= blockwise_bound(x, bits)).all()


@pytest.mark.parametrize(("codec", "limit"), [(Codec.BF16, 0.004), (Codec.INT8, 0.01), (Codec.INT4, 0.12)])
def test_relative_error_on_gaussian(codec: Codec, limit: float) -> None:
    x = np.random.default_rng(1).standard_normal((256, 256), dtype=np.float32) * np.float32(1e-3)
    out = decode_tensors(encode_tensors({"x": x}, codec), codec, {"x": x.shape})["x"]
    assert np.linalg.norm(out - x) / np.linalg.norm(x) < limit


@given(tensor_dicts, st.sampled_from(list(Codec)))
def test_encode_and_decode_are_deterministic(t: dict[str, np.ndarray], codec: Codec) -> None:
    payload = encode_tensors(t, codec)
    # Same values in another memory layout (Fortran order, reversed insertion order): same bytes.
    other = {k: np.asfortranarray(t[k]) for k in reversed(list(t))}
    assert encode_tensors(other, codec) == payload
    first = decode_tensors(payload, codec, shapes_of(t))
    second = decode_tensors(bytearray(payload), codec, shapes_of(t))
    for name in t:
        assert np.array_equal(first[name].view(np.uint32), second[name].view(np.uint32))


def test_golden_vectors() -> None:
    """The worked examples of docs/payload-format.md, byte for byte."""
    cases = [
        (Codec.INT8, [1.0, -1.0, 0.5, 0.0], "003cff00c080", [0.99609375, -0.99609375, 0.50390625, 0.00390625]),
        (Codec.INT4, [1.0, -1.0, 0.5, 0.0, 0.25], "003e0f8c0a", [0.9375, -0.9375, 0.5625, 0.0625, 0.3125]),
        (Codec.BF16, [1.0, -1.0, 1.00390625, 1.01171875], "803f80bf803f823f", [1.0, -1.0, 1.0, 1.015625]),
        (Codec.FP32, [1.0, -2.0], "0000803f000000c0", [1.0, -2.0]),
    ]
    for codec, values, hex_payload, decoded in cases:
        x = np.array(values, dtype=np.float32)
        payload = encode_tensors({"w": x}, codec)
        assert payload.hex() == hex_payload, codec
        assert decode_tensors(payload, codec, {"w": x.shape})["w"].tolist() == decoded


def test_records_are_in_sorted_name_order_and_independent() -> None:
    rng = np.random.default_rng(3)
    t = {"b": rng.standard_normal(70, dtype=np.float32), "a": rng.standard_normal(3, dtype=np.float32)}
    for codec in Codec:
        whole = encode_tensors(t, codec)
        assert whole == encode_tensors({"a": t["a"]}, codec) + encode_tensors({"b": t["b"]}, codec)


def test_tiny_blocks_flush_to_zero_and_large_values_survive() -> None:
    x = np.array([1e-35, -3e-38, 1e-45, 0.0] + [2.0**127, -(2.0**126)], dtype=np.float32)
    t = {"tiny": x[:4], "huge": x[4:]}
    for codec in (Codec.INT8, Codec.INT4):
        out = decode_tensors(encode_tensors(t, codec), codec, shapes_of(t))
        assert np.array_equal(out["tiny"], np.zeros(4, np.float32))
        assert np.isfinite(out["huge"]).all() and out["huge"][0] > 2.0**126

"""ErrorFeedback: the sender's numbers are the receivers', and the running sum of what was sent tracks
the running sum of the true deltas (drift bounded by one round's error instead of growing)."""

from __future__ import annotations

import numpy as np
import pytest

from protocol.compression import Codec, ErrorFeedback, decode_tensors, encode_tensors
from protocol.errors import LocalProtocolError

SHAPES = {"embed": (40, 64), "norm": (64,), "odd": (3, 5, 7), "scalar": ()}


def round_delta(rng: np.random.Generator, r: int) -> dict[str, np.ndarray]:
    """A drifting, per-tensor-scaled update: the same direction each round plus noise."""
    base = np.random.default_rng(99)
    return {
        name: (base.standard_normal(shape) * 0.7 + rng.standard_normal(shape) * (1 + 0.1 * r)).astype(np.float32)
        * np.float32(10.0 ** (-3 - i))
        for i, (name, shape) in enumerate(sorted(SHAPES.items()))
    }


@pytest.mark.parametrize("codec", [Codec.INT4, Codec.INT8, Codec.BF16])
def test_running_sum_tracks_true_deltas(codec: Codec) -> None:
    rng = np.random.default_rng(0)
    feedback = ErrorFeedback(codec)
    sent = {k: np.zeros(s) for k, s in SHAPES.items()}
    sent_plain = {k: np.zeros(s) for k, s in SHAPES.items()}
    true = {k: np.zeros(s) for k, s in SHAPES.items()}
    one_round_error = {k: 0.0 for k in SHAPES}
    for r in range(60):
        delta = round_delta(rng, r)
        payload, dequantized = feedback.compress(delta)
        # The sender's numbers are exactly what any receiver decodes.
        received = decode_tensors(payload, codec, SHAPES)
        for k in SHAPES:
            assert np.array_equal(received[k].view(np.uint32), dequantized[k].view(np.uint32))
            sent[k] += dequantized[k]
            true[k] += delta[k]
            plain = decode_tensors(_encode_one(k, delta[k], codec), codec, {k: SHAPES[k]})[k]
            sent_plain[k] += plain
            one_round_error[k] = max(one_round_error[k], float(np.abs(plain - delta[k]).max()))
        # Telescoping: sum(sent) = sum(true) - residual, up to float32 rounding of the two additions.
        for k in SHAPES:
            gap = true[k] - sent[k] - feedback.residual[k]
            assert np.abs(gap).max() <= 1e-5 * np.abs(true[k]).max() + 1e-12
    for k in SHAPES:
        drift = np.abs(true[k] - sent[k]).max()
        drift_plain = np.abs(true[k] - sent_plain[k]).max()
        # With feedback the drift stays within about one round's worst error ...
        assert drift <= 2.5 * one_round_error[k]
        # ... while without it the errors pile up (60 rounds of a biased-ish direction).
        assert drift < drift_plain
    total = sum(np.abs(true[k] - sent[k]).sum() for k in SHAPES)
    total_plain = sum(np.abs(true[k] - sent_plain[k]).sum() for k in SHAPES)
    assert total < 0.5 * total_plain


def _encode_one(name: str, x: np.ndarray, codec: Codec) -> bytes:
    return encode_tensors({name: x}, codec)


def test_fp32_feedback_has_zero_residual() -> None:
    feedback = ErrorFeedback("fp32")
    delta = round_delta(np.random.default_rng(1), 0)
    _, dequantized = feedback.compress(delta)
    assert all(np.array_equal(dequantized[k], delta[k]) for k in SHAPES)
    assert all(not r.any() for r in feedback.residual.values())


def test_state_dict_round_trip_continues_identically() -> None:
    rng = np.random.default_rng(2)
    deltas = [round_delta(rng, r) for r in range(4)]
    a = ErrorFeedback(Codec.INT4)
    for d in deltas[:2]:
        a.compress(d)
    state = a.state_dict()
    assert all(v.dtype == np.float32 for v in state.values())
    b = ErrorFeedback(Codec.INT4)
    b.load_state_dict(state)
    state["embed"][:] = 123.0  # the loaded copy is independent of the caller's arrays
    for d in deltas[2:]:
        assert a.compress(d)[0] == b.compress(d)[0]


def test_reset_forgets_the_residual() -> None:
    delta = round_delta(np.random.default_rng(3), 0)
    feedback = ErrorFeedback(Codec.INT4)
    first, _ = feedback.compress(delta)
    assert any(r.any() for r in feedback.residual.values())
    feedback.reset()
    assert feedback.residual == {} and feedback.state_dict() == {}
    assert feedback.compress(delta)[0] == first


def test_layout_changes_are_local_errors_and_leave_state_alone() -> None:
    rng = np.random.default_rng(4)
    feedback = ErrorFeedback(Codec.INT8)
    feedback.compress(round_delta(rng, 0))
    before = feedback.state_dict()
    delta = round_delta(rng, 1)
    bad_inputs = [
        {k: v for k, v in delta.items() if k != "norm"},
        delta | {"extra": np.zeros(3, np.float32)},
        delta | {"norm": np.zeros(65, np.float32)},
        delta | {"norm": np.zeros(64, np.float64)},
        delta | {"norm": np.full(64, np.nan, np.float32)},
        delta | {1: np.zeros(3, np.float32)},
    ]
    for bad in bad_inputs:
        with pytest.raises(LocalProtocolError):
            feedback.compress(bad)
        assert all(np.array_equal(before[k], feedback.residual[k]) for k in SHAPES)
    with pytest.raises(LocalProtocolError):
        ErrorFeedback("int3")
    with pytest.raises(LocalProtocolError):
        feedback.load_state_dict({"embed": np.full(3, np.inf, np.float32)})
    with pytest.raises(LocalProtocolError):
        feedback.load_state_dict({"embed": np.zeros(3)})


def test_residual_view_is_read_only() -> None:
    feedback = ErrorFeedback(Codec.INT4)
    feedback.compress(round_delta(np.random.default_rng(5), 0))
    with pytest.raises(ValueError):
        feedback.residual["embed"][0, 0] = 1.0


@pytest.mark.parametrize("codec", [Codec.INT4, Codec.INT8, Codec.BF16, Codec.FP32])
def test_compress_payload_gives_compress_bits_with_delta_as_the_residual(codec: Codec) -> None:
    """The node's path (Δ becomes the residual in place, no dequantized copy) sends the same payloads and
    keeps the same residual as `compress`, round after round."""
    rng = np.random.default_rng(3)
    copying, in_place = ErrorFeedback(codec), ErrorFeedback(codec)
    for r in range(4):
        delta = {k: np.array(v, dtype=np.float32) for k, v in round_delta(rng, r).items()}  # arrays, as make_delta's
        payload, _ = copying.compress({k: v.copy() for k, v in delta.items()})
        assert in_place.compress_payload(delta) == payload
        for name in SHAPES:
            assert in_place.residual[name].tobytes() == copying.residual[name].tobytes()
            assert np.shares_memory(in_place.residual[name], delta[name])  # no copy was made


def test_compress_payload_refuses_arrays_it_cannot_take_over() -> None:
    feedback = ErrorFeedback(Codec.INT4)
    frozen = np.ones(8, np.float32)
    frozen.flags.writeable = False
    for bad in (frozen, np.ones(8, np.float64), np.ones((8, 2), np.float32).T):
        with pytest.raises(LocalProtocolError):
            feedback.compress_payload({"w": bad})
    assert feedback.residual == {}


def test_compress_payload_shows_each_tensor_exactly_as_receivers_decode_it() -> None:
    seen: dict[str, np.ndarray] = {}
    delta = {k: np.array(v, dtype=np.float32) for k, v in round_delta(np.random.default_rng(4), 0).items()}
    payload = ErrorFeedback(Codec.INT4).compress_payload(delta, lambda name, t: seen.__setitem__(name, t.copy()))
    decoded = decode_tensors(payload, Codec.INT4, SHAPES)
    assert sorted(seen) == sorted(SHAPES)
    for name in SHAPES:
        assert seen[name].shape == decoded[name].shape and seen[name].tobytes() == decoded[name].tobytes()

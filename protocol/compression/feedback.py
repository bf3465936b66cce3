"""Error feedback: carry each round's quantization error into the next round's update.

The sender compresses `delta + residual`, decodes its own payload exactly as every receiver will, and
keeps `(delta + residual) - dequantized` as the next residual. Summed over rounds, the dequantized
updates then equal the true deltas minus the current residual (a telescoping sum), so the error does
not accumulate: it stays bounded by one round's quantization error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np

from protocol.compression.formats import Codec, as_codec_local
from protocol.compression.tensors import (as_float32_array, decode_span, decode_tensors, encode_tensors,
                                         record_offsets)
from protocol.errors import LocalProtocolError
from protocol.parallel import parallel_map


class ErrorFeedback:
    """Per-tensor residual of one sender's compressed updates. Not thread-safe; one owner.

    The first `compress` (or `load_state_dict`) fixes the set of tensor names and shapes; every later
    call must use the same ones until `reset`.
    """

    def __init__(self, codec: Codec | str) -> None:
        self.codec = as_codec_local(codec)
        self._residual: dict[str, np.ndarray] = {}

    def compress(self, delta: Mapping[str, np.ndarray]) -> tuple[bytes, dict[str, np.ndarray]]:
        """Encode `delta + residual`; return (payload, dequantized) where `dequantized` is exactly what
        `decode_tensors(payload, codec, shapes)` gives every receiver. Updates the residual.

        Raises LocalProtocolError (and leaves the residual untouched) if names, shapes or dtypes differ
        from the residual's, or if the corrected update cannot be encoded (non-finite, too large).
        """
        if not isinstance(delta, Mapping):
            raise LocalProtocolError(f"delta must be a mapping of name -> array, got {type(delta).__name__}")
        if not all(isinstance(name, str) for name in delta):
            raise LocalProtocolError("tensor names must be str")
        delta = {name: as_float32_array(name, x) for name, x in delta.items()}
        if self._residual:
            _check_same_layout(self._residual, delta)
        # Fresh arrays (np.asarray: numpy turns 0-d results into scalars), which become the next residual in
        # place: one model-sized buffer fewer than a separate difference.
        residual = self._residual

        def correct(name: str) -> np.ndarray:
            x = delta[name]
            return np.asarray(x + residual[name]) if residual else np.array(x, copy=True)

        corrected = dict(zip(delta, parallel_map(correct, delta), strict=True))
        payload = encode_tensors(corrected, self.codec)
        dequantized = decode_tensors(payload, self.codec, {name: x.shape for name, x in delta.items()})
        parallel_map(lambda name: np.subtract(corrected[name], dequantized[name], out=corrected[name]), corrected)
        self._residual = corrected
        return payload, dequantized

    def compress_payload(self, delta: dict[str, np.ndarray],
                         decoded: Callable[[str, np.ndarray], None] | None = None) -> bytes:
        """`compress` for a caller that gives up `delta` and needs no dequantized copy: `delta`'s arrays
        (writable, C-contiguous float32) become the next residual in place (`delta + residual`, encoded,
        minus its decode, tensor by tensor), so compressing holds no model-sized buffer beyond `delta`
        and the payload. Same payload and residual bits as `compress`. Raises LocalProtocolError (names,
        shapes, dtypes, or a corrected update that cannot be encoded) with the residual untouched;
        `delta` then holds `delta + residual`. `decoded(name, tensor)`, if given, sees each tensor's decode
        (what every receiver gets) once, e.g. to measure it without decoding the payload again; it is
        called from several threads."""
        for name, x in delta.items():
            if not isinstance(name, str) or not isinstance(x, np.ndarray) or x.dtype != np.float32 \
                    or not x.flags.writeable or not x.flags.c_contiguous:
                raise LocalProtocolError(f"{name!r}: expected a writable C-contiguous float32 numpy array")
        if self._residual:
            _check_same_layout(self._residual, delta)
            residual = self._residual
            parallel_map(lambda name: np.add(delta[name], residual[name], out=delta[name]), delta)
        payload = encode_tensors(delta, self.codec)
        offsets = record_offsets({name: x.shape for name, x in delta.items()}, self.codec)

        def settle(name: str) -> None:
            flat = delta[name].reshape(-1)
            tensor = decode_span(payload, self.codec, offsets[name], flat.size, name, 0, flat.size)
            if decoded is not None:
                decoded(name, tensor.reshape(delta[name].shape))
            flat -= tensor

        parallel_map(settle, delta)
        self._residual = dict(delta)
        return payload

    def reset(self) -> None:
        """Forget the residual (e.g. after the sender re-synchronised its parameters)."""
        self._residual = {}

    @property
    def residual(self) -> dict[str, np.ndarray]:
        """The current residual (read-only views); empty before the first `compress` or after `reset`."""
        return {name: _readonly(r) for name, r in self._residual.items()}

    def state_dict(self) -> dict[str, np.ndarray]:
        """A checkpointable copy of the residual: name -> float32 array."""
        return {name: r.copy() for name, r in self._residual.items()}

    def load_state_dict(self, state: Mapping[str, np.ndarray]) -> None:
        """Restore a residual saved by `state_dict`. Raises LocalProtocolError for a non-str name, an
        array that is not float32 or a non-finite value."""
        restored = {}
        for name, r in state.items():
            if not isinstance(name, str) or not isinstance(r, np.ndarray) or r.dtype != np.float32:
                raise LocalProtocolError(f"{name!r}: residual must be a float32 numpy array under a str name")
            if not np.isfinite(r).all():
                raise LocalProtocolError(f"{name!r}: non-finite residual")
            restored[name] = r.copy()
        self._residual = restored


def _check_same_layout(residual: Mapping[str, np.ndarray], delta: Mapping[str, np.ndarray]) -> None:
    if set(residual) != set(delta):
        missing, extra = sorted(set(residual) - set(delta)), sorted(set(delta) - set(residual))
        raise LocalProtocolError(f"delta names differ from the residual's: missing {missing}, extra {extra}")
    for name, x in delta.items():
        if x.shape != residual[name].shape:
            raise LocalProtocolError(f"{name!r}: shape {x.shape} differs from the residual's {residual[name].shape}")


def _readonly(a: np.ndarray) -> np.ndarray:
    view = a.view()
    view.flags.writeable = False
    return view

"""An outer rule and a codec written outside the package, as a user or researcher would, and registered by
name: `tests/ledger/test_outer_rule_seam.py` and `tests/compression/test_codec_registry.py` use them. Importing
this module registers them (once per process)."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from protocol.compression.formats import CodecSpec, codec_names, register_codec
from protocol.errors import Reason, RemoteProtocolError
from protocol.ledger.rules import OuterRule, register_rule, rule_names

_F64 = np.float64


class PlainSGD(OuterRule):
    """θ ← θ − η g; the second buffer is left alone. Linear: a change δ of slot r moves θ_n by −η_r δ."""

    name = "test-plain-sgd"
    linear = True

    def step(self, theta: np.ndarray, v: np.ndarray, u: np.ndarray, scale: float | None, eta: float) -> None:
        g = np.asarray(u, dtype=_F64) if scale is None else np.multiply(u, _F64(scale), dtype=_F64)
        np.subtract(theta, g * _F64(eta), out=theta, casting="same_kind")

    def fold_coefficients(self, r: int, n: int, eta: Callable[[int], float]) -> tuple[float, float]:
        assert 1 <= r <= n
        return 0.0, eta(r)


class SignStep(OuterRule):
    """θ ← θ − η·10⁻³·sign(g): not linear in the aggregates, so there is no closed-form fold."""

    name = "test-sign"

    def step(self, theta: np.ndarray, v: np.ndarray, u: np.ndarray, scale: float | None, eta: float) -> None:
        g = np.asarray(u, dtype=_F64) if scale is None else np.multiply(u, _F64(scale), dtype=_F64)
        np.subtract(theta, np.sign(g) * _F64(eta * 1e-3), out=theta, casting="same_kind")


FP16_MAX = 65504.0


def _fp16_encode(x: np.ndarray) -> bytes:
    """IEEE half precision, round to nearest even; beyond its range, its largest finite value."""
    return np.clip(x, -FP16_MAX, FP16_MAX).astype("<f2").tobytes()


def _fp16_decode(record: memoryview, numel: int, start: int, stop: int) -> np.ndarray:
    values = np.frombuffer(record, dtype="<f2", count=stop - start, offset=2 * start)
    if not np.isfinite(values).all():
        raise RemoteProtocolError(Reason.NON_FINITE, "Inf/NaN in an fp16 record")
    return values.astype(np.float32)


FP16 = CodecSpec(name="test-fp16", record_bytes=lambda n: 2 * n, encode=_fp16_encode, decode=_fp16_decode)

for _rule in (PlainSGD, SignStep):
    if _rule.name not in rule_names():
        register_rule(_rule.name, lambda config, rule=_rule: rule())
if FP16.name not in codec_names():
    register_codec(FP16)

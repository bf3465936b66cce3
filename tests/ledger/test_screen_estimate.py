"""The fast estimate of the direction screen's sums (`protocol.ledger.aggregate.screen_estimate`): on the
compiled path (sums in any order, fast-math) and the numpy one (BLAS), its intervals hold the exact sums the
screen's canonical pass takes (`screen_pass`), for payload and float32 terms, sizes across the chunk
boundary, values over many magnitudes and terms that nearly cancel; and they are tight enough to give a
fold its norm (`protocol.ledger.slot.ESTIMATED_NORM`)."""

import hashlib

import numpy as np
import pytest

from protocol import kernels
from protocol.compression import Codec, encode_tensors
from protocol.ledger import Payload, PayloadDeltas, UpdateMeta
from protocol.ledger.aggregate import SlotEntry, screen_estimate, screen_pass
from protocol.ledger.chunks import CHUNK, tensor_norm
from protocol.ledger.slot import ESTIMATED_NORM


@pytest.fixture(params=["compiled", "numpy"])
def path(request):
    kernels.use_compiled(request.param == "compiled")
    yield request.param
    kernels.use_compiled(False)


def _entry(k: int, x: np.ndarray, as_payload: bool) -> SlotEntry:
    meta = UpdateMeta(hashlib.sha256(b"%d" % k).digest(), f"p{k}", 0, 0, 100, 10)
    if as_payload:
        payload = Payload(Codec.INT4, encode_tensors({"w": x}, Codec.INT4))
        deltas = PayloadDeltas.validated(payload, {"w": x.shape})
        return SlotEntry(meta, 1, 1.0, deltas, dict(deltas.norms))
    return SlotEntry(meta, 1, 1.0, {"w": x}, {"w": tensor_norm(x)})


def _inside(value: float, interval: tuple[float, float]) -> bool:
    return interval[0] <= value <= interval[1]


@pytest.mark.parametrize("size", [1, 1000, CHUNK, CHUNK + 777, 3 * CHUNK + 5])
@pytest.mark.parametrize("case", ["honest", "magnitudes", "cancelling"])
def test_the_estimates_intervals_hold_the_exact_sums(path, size, case):
    rng = np.random.default_rng(size + len(case))
    base = rng.standard_normal(size)
    xs = []
    for k in range(5):
        if case == "honest":
            x = base + rng.standard_normal(size)
        elif case == "magnitudes":
            x = rng.standard_normal(size) * rng.lognormal(0.0, 5.0, size)
        else:  # pairs that cancel to ~1e-6 of their size
            x = (-1.0) ** k * base + 1e-6 * rng.standard_normal(size)
        xs.append(x.astype(np.float32))
    entries = [_entry(k, x, as_payload=k % 2 == 0) for k, x in enumerate(xs)]
    live = sorted(((e, float(c)) for e, c in zip(entries, rng.uniform(0.1, 3.0, len(entries)), strict=True)),
                  key=lambda t: t[0].meta.update_id)
    exact = screen_pass(live, "w", size)
    bounds = screen_estimate(live, "w", size)
    assert bounds is not None
    assert _inside(exact.u_squared, bounds.u_squared)
    for e, _ in live:
        assert _inside(exact.along[e.meta.update_id], bounds.along[e.meta.update_id])
    if case == "honest":  # terms that agree: tight enough for a fold's norm
        assert bounds.u_squared_within(ESTIMATED_NORM) == pytest.approx(exact.u_squared, rel=ESTIMATED_NORM)

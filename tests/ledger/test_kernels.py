"""Both paths of protocol.kernels, compiled and numpy, give the bits of the numpy evaluation of before."""

import hashlib

import numpy as np
import pytest

from protocol import kernels
from protocol.compression import Codec, encode_tensors
from protocol.ledger import Ledger, LedgerConfig, Outcome, Payload, PayloadDeltas, UpdateMeta
from protocol.compression.formats import BLOCK_SIZE
from protocol.compression.tensors import _blockwise_parts, decode_blockwise_numpy, decode_span, record_offsets
from protocol.errors import Reason, RemoteProtocolError


@pytest.fixture(params=["compiled", "numpy"])
def path(request):
    """Each test runs with the compiled passes and with the numpy ones; both must give the old bits."""
    kernels.use_compiled(request.param == "compiled")
    yield request.param
    kernels.use_compiled(False)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def drawn(rng: np.random.Generator, n: int) -> np.ndarray:
    """Values over many magnitudes, with all-zero and tiny blocks (scale 0) and exact ties."""
    x = (rng.standard_normal(n) * rng.lognormal(0.0, 6.0, n)).astype(np.float32)
    x[: min(n, BLOCK_SIZE)] = 0.0
    x[BLOCK_SIZE : 2 * BLOCK_SIZE] *= np.float32(1e-36)
    x[2 * BLOCK_SIZE : 3 * BLOCK_SIZE] = np.float32(0.5)
    return x


@pytest.mark.parametrize("n", [1, 63, 64, 65, 1000, 4097, 65536 + 37])
def test_int4_decode_matches_numpy_on_every_span(n, path):
    rng = np.random.default_rng(n)
    x = drawn(rng, n)
    data = encode_tensors({"t": x}, Codec.INT4)
    view = memoryview(data)
    starts = sorted({0, BLOCK_SIZE * (n // (3 * BLOCK_SIZE)), BLOCK_SIZE * (n // BLOCK_SIZE) if n % BLOCK_SIZE else 0})
    for start in starts:
        for stop in sorted({n, min(n, start + BLOCK_SIZE), min(n, start + 3 * BLOCK_SIZE + 5)}):
            if start >= stop:
                continue
            scale_bits, packed = _blockwise_parts(Codec.INT4, view, 0, n, "t", start, stop)
            compiled = np.empty(stop - start, dtype=np.float32)
            ran = kernels.decode_int4(packed, scale_bits, compiled)
            assert ran is (path == "compiled")
            reference = decode_blockwise_numpy(Codec.INT4, scale_bits, packed, "t", stop - start)
            assert not ran or same_bits(compiled, reference)
            assert same_bits(decode_span(data, Codec.INT4, 0, n, "t", start, stop), reference)


@pytest.mark.parametrize(
    ("bits", "reason"),
    [(0x7F80, Reason.NON_FINITE), (0x7FC1, Reason.NON_FINITE), (0x0001, Reason.MALFORMED),
     (0x8000 | (127 << 7), Reason.MALFORMED), (((127 + 128 - 4) << 7) + 1, Reason.MALFORMED)],
)
def test_a_refused_int4_scale_is_found_by_the_kernel_and_reported_as_before(bits, reason, path):
    x = np.random.default_rng(0).standard_normal(5 * BLOCK_SIZE).astype(np.float32)
    data = bytearray(encode_tensors({"t": x}, Codec.INT4))
    data[2 * 3 : 2 * 4] = int(bits).to_bytes(2, "little")  # block 3's scale
    scale_bits, packed = _blockwise_parts(Codec.INT4, memoryview(bytes(data)), 0, x.size, "t", 0, x.size)
    out = np.full(x.size, 7.0, dtype=np.float32)
    assert kernels.decode_int4(packed, scale_bits, out) is False
    assert (out == 7.0).all()  # nothing written
    with pytest.raises(RemoteProtocolError) as refused:
        decode_span(bytes(data), Codec.INT4, record_offsets({"t": x.shape}, Codec.INT4)["t"], x.size, "t", 0, x.size)
    assert refused.value.reason is reason


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_accumulate_term_matches_numpy(dtype, path):
    rng = np.random.default_rng(1)
    xs = [(rng.standard_normal(10_001) * rng.lognormal(0, 4, 10_001)).astype(dtype) for _ in range(4)]
    cs = [np.float64(c) for c in rng.lognormal(0, 3, 4)]
    compiled, reference, t = np.empty(10_001), np.empty(10_001), np.empty(10_001)
    for k, (x, c) in enumerate(zip(xs, cs)):
        kernels.accumulate_term(compiled, x, float(c), first=k == 0)
        if k == 0:
            np.multiply(x, c, out=reference, dtype=np.float64)
        else:
            np.multiply(x, c, out=t, dtype=np.float64)
            reference += t
        assert same_bits(compiled, reference)


def nesterov_numpy(theta, v, u, scale, eta, mu):
    """The numpy op sequence the kernel replaced (protocol.ledger.outer before 2026-11-27)."""
    m, e = np.float64(mu), np.float64(eta)
    g = u if scale is None else np.multiply(u, np.float64(scale))
    vc = np.multiply(v, m)
    vc += g
    v[...] = vc
    tmp = np.multiply(vc, m)
    tmp += g
    tmp *= e
    np.subtract(theta, tmp, out=theta, casting="same_kind")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("scale", [None, 0.37, 1e-30])
def test_nesterov_matches_numpy(dtype, scale, path):
    rng = np.random.default_rng(2)
    n = 20_003
    theta = (rng.standard_normal(n) * rng.lognormal(0, 3, n)).astype(dtype)
    v = (rng.standard_normal(n) * rng.lognormal(0, 3, n)).astype(dtype)
    u = rng.standard_normal(n) * rng.lognormal(0, 5, n)
    t1, v1, t2, v2 = theta.copy(), v.copy(), theta.copy(), v.copy()
    for eta, mu in ((0.7, 0.9), (1.3e-3, 0.0), (1.0, 0.99)):
        kernels.nesterov_chunk(t1, v1, u, scale, eta, mu)
        nesterov_numpy(t2, v2, u, scale, eta, mu)
        assert same_bits(t1, t2) and same_bits(v1, v2)


def fold_numpy(theta, v, u, terms, alpha, a, k, reuse, ratio):
    """The numpy op sequence of one span of the fold that the kernels replaced (protocol.ledger.outer)."""
    d, t = np.multiply(u, alpha), np.empty(u.size)
    for x, c, beta in terms:
        np.multiply(x, c, out=t, dtype=np.float64)
        np.add(u, t, out=u, casting="same_kind")
        if beta != 0.0:
            np.multiply(x, beta, out=t, dtype=np.float64)
            d += t
    if reuse:
        d *= a
        np.add(v, d, out=v, casting="same_kind")
        d *= np.float64(ratio)
    else:
        np.multiply(d, a, out=t)
        np.add(v, t, out=v, casting="same_kind")
        d *= k
    np.subtract(theta, d, out=theta, casting="same_kind")


@pytest.mark.parametrize("u_dtype", [np.float32, np.float64])
@pytest.mark.parametrize("reuse", [True, False])
def test_fold_matches_numpy(u_dtype, reuse, path):
    rng = np.random.default_rng(3)
    n = 9_999
    theta, v = rng.standard_normal(n).astype(np.float32), rng.standard_normal(n).astype(np.float32)
    u = (rng.standard_normal(n) * 40).astype(u_dtype)
    xs = [(rng.standard_normal(n) * rng.lognormal(0, 2, n)).astype(np.float32) for _ in range(3)]
    terms = [(xs[0], np.float64(0.31), np.float64(0.029)), (xs[1], np.float64(-0.02), np.float64(0.0)),
             (xs[2], np.float64(1.7), np.float64(-0.4))]
    alpha, a, k = np.float64(-3.1e-3), np.float64(0.81), np.float64(2.3)
    ratio = float(k) / float(a)
    t1, v1, u1, t2, v2, u2 = theta.copy(), v.copy(), u.copy(), theta.copy(), v.copy(), u.copy()
    d = np.empty(n)
    kernels.fold_start(u1, d, alpha)
    for x, c, beta in terms:
        kernels.fold_term(u1, d, x, c, beta)
    kernels.fold_finish(t1, v1, d, a, ratio if reuse else k, reuse)
    fold_numpy(t2, v2, u2, terms, alpha, a, k, reuse, ratio)
    assert same_bits(t1, t2) and same_bits(v1, v2) and same_bits(u1, u2)


@pytest.mark.parametrize("n", [1, 2, 63, 64, 65, 1001, 65536 + 37])
def test_int4_encode_matches_numpy(n, path):
    from protocol.compression.tensors import _encode_blockwise, encode_blockwise_numpy

    rng = np.random.default_rng(100 + n)
    for x in (drawn(rng, n), rng.standard_normal(n).astype(np.float32) * np.float32(2.0**-98),
              np.full(n, np.float32(2.0**127)), (np.arange(n, dtype=np.float32) - n // 2) / np.float32(8)):
        scale_bits, packed = np.empty((n + BLOCK_SIZE - 1) // BLOCK_SIZE, dtype="<u2"), np.empty((n + 1) // 2, np.uint8)
        reference = encode_blockwise_numpy(Codec.INT4, x)
        if kernels.quantize_int4(x, scale_bits, packed):  # the compiled path ran
            assert same_bits(scale_bits, reference[0]) and same_bits(packed, reference[1])
        assert kernels.compiled() is (path == "compiled")
        assert all(same_bits(a, b) for a, b in zip(_encode_blockwise(Codec.INT4, x), reference, strict=True))


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan, np.float32(2.0**127) * np.float32(1.5)])
def test_a_refused_value_is_found_by_the_int4_encoder_and_reported_as_before(bad, path):
    from protocol.compression.tensors import _encode_blockwise
    from protocol.errors import LocalProtocolError

    x = np.ones(300, dtype=np.float32)
    x[201] = bad
    scale_bits, packed = np.zeros(5, dtype="<u2"), np.zeros(150, np.uint8)
    assert kernels.quantize_int4(x, scale_bits, packed) is False
    with pytest.raises(LocalProtocolError, match="non-finite|above"):
        _encode_blockwise(Codec.INT4, x)


def _ledger_run() -> Ledger:
    """Five slots of int4 updates from four origins, two more origins late into each (one negated), a window
    of three: closes, late folds, screens and the window bottom's steps all run through protocol.kernels."""
    shapes = {"emb": (64, 8), "w": (300, 300)}  # "w" spans two chunks
    rng = np.random.default_rng(11)
    led = Ledger({k: np.zeros(s, np.float32) for k, s in shapes.items()},
                 LedgerConfig(window=3, embeddings=frozenset({"emb"})))

    def update(tag: str, slot: int, direction: dict, sign: float = 1.0):
        deltas = {k: (sign * (direction[k] + rng.standard_normal(shapes[k]))).astype(np.float32) for k in shapes}
        payload = Payload(Codec.INT4, encode_tensors(deltas, Codec.INT4))
        meta = UpdateMeta(hashlib.sha256(tag.encode()).digest(), tag.split("/")[0], slot, slot, 100, 10)
        return meta, PayloadDeltas.validated(payload, shapes), payload

    for slot in range(5):
        direction = {k: 2.0 * rng.standard_normal(s) for k, s in shapes.items()}
        for peer in range(4):
            meta, deltas, payload = update(f"p{peer}/{slot}", slot, direction)
            assert led.add(meta, deltas, payload=payload) is Outcome.APPLIED_OPEN
        led.close_slot()
        for peer in (4, 5):
            meta, deltas, payload = update(f"p{peer}/{slot}", slot, direction, -3.0 if slot == 2 and peer == 4 else 1.0)
            assert led.add(meta, deltas, payload=payload) is Outcome.FOLDED_LATE
    led.close_slot()
    return led


def test_a_ledger_on_the_compiled_passes_ends_in_the_bits_of_one_on_numpy():
    runs = {}
    for on in (False, True):
        kernels.use_compiled(on)
        try:
            runs[on] = _ledger_run()
        finally:
            kernels.use_compiled(False)
    numpy_run, compiled_run = runs[False], runs[True]
    assert compiled_run.params_digest() == numpy_run.params_digest()
    for mine, theirs in ((compiled_run.params(), numpy_run.params()), (compiled_run.momentum(), numpy_run.momentum()),
                         *zip(compiled_run.canonical_state(), numpy_run.canonical_state())):
        assert all(same_bits(mine[k], theirs[k]) for k in theirs)


@pytest.mark.parametrize("x_dtype", [np.float32, np.float64])
@pytest.mark.parametrize("n", [1, 65, 4097, 65536])
def test_decoding_while_adding_gives_the_decode_and_the_sum_of_the_numpy_passes(n, x_dtype, path):
    """The decoded values written into ``x`` (float32, or float64 as the direction screen's pass keeps them)
    and the sum are the numpy passes', bit for bit."""
    rng = np.random.default_rng(200 + n)
    payloads = [encode_tensors({"t": drawn(rng, n)}, Codec.INT4) for _ in range(3)]
    cs = [float(c) for c in rng.lognormal(0, 3, 3)]
    fused, reference = np.empty(n), np.empty(n)
    for k, (data, c) in enumerate(zip(payloads, cs)):
        x = np.empty(n, dtype=x_dtype)
        scale_bits, packed = _blockwise_parts(Codec.INT4, memoryview(data), 0, n, "t", 0, n)
        ran = kernels.decode_int4_add(packed, scale_bits, fused, c, k == 0, x)
        assert ran is (path == "compiled")
        decoded = decode_blockwise_numpy(Codec.INT4, scale_bits, packed, "t", n)
        if not ran:
            x = decoded
            kernels.accumulate_term(fused, x, c, k == 0)
        if k == 0:
            np.multiply(decoded, np.float64(c), out=reference, dtype=np.float64)
        else:
            reference += np.multiply(decoded, np.float64(c), dtype=np.float64)
        assert same_bits(x, decoded.astype(x.dtype)) and same_bits(fused, reference)

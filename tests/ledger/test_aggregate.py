"""Weights from the header and slot aggregates (mean, radial-directional, embeddings), canonical order."""

import hashlib
import itertools
import math

import numpy as np
import pytest

from protocol.errors import Reason, RemoteProtocolError
from protocol.ledger import Aggregation, LedgerConfig, UpdateMeta, Weighting, aggregate, staleness, update_weight
from protocol.ledger.aggregate import SlotEntry
from protocol.ledger.chunks import CHUNK, copy_with_norm, tensor_norm
from protocol.ledger.weights import check_meta


def meta(tag="a", base=0, publish=0, tokens=100, steps=10):
    return UpdateMeta(hashlib.sha256(tag.encode()).digest(), tag, base, publish, tokens, steps)


def entry(tag, weight, **arrays):
    deltas = {k: np.asarray(v, dtype=np.float32) for k, v in arrays.items()}
    return SlotEntry(meta(tag), 1, weight, deltas, {k: tensor_norm(v) for k, v in deltas.items()})


def test_slot_and_staleness_come_from_the_header():
    m = meta(base=3, publish=5)
    assert m.target_slot == 6
    assert staleness(m, 6) == 2  # applied at its own slot: publish − base
    assert staleness(m, 9) == 5  # applied late at the open slot 9 (stale policy "apply")


def test_weights():
    m = meta(base=3, publish=6, tokens=400, steps=8)  # staleness 3 at slot 7
    assert update_weight(m, 7, LedgerConfig()) == pytest.approx(400 / 2.0)  # (1+3)^-0.5
    assert update_weight(m, 7, LedgerConfig(staleness_alpha=1.0)) == pytest.approx(100.0)
    assert update_weight(m, 7, LedgerConfig(staleness_alpha=0.0)) == 400.0
    assert update_weight(m, 7, LedgerConfig(weighting=Weighting.TOKENS_PER_STEP, staleness_alpha=0.0)) == 400 * 50
    assert update_weight(m, 7, LedgerConfig(weighting="uniform")) == pytest.approx(0.5)


@pytest.mark.parametrize(
    "bad,reason",
    [
        (dict(base=2, publish=1), Reason.BAD_SLOT),
        (dict(base=-1, publish=1), Reason.BAD_SLOT),
        (dict(tokens=0), Reason.BAD_SCHEMA),
        (dict(steps=0), Reason.BAD_SCHEMA),
    ],
)
def test_bad_headers_are_remote_errors(bad, reason):
    with pytest.raises(RemoteProtocolError) as err:
        check_meta(meta(**bad))
    assert err.value.reason is reason
    with pytest.raises(RemoteProtocolError):
        check_meta(UpdateMeta(b"short", "x", 0, 0, 1, 1))


def test_radial_directional_by_hand():
    # Δ1 = (3, 4) (norm 5), Δ2 = (0, 1) (norm 1), equal weights: mean norm 3, direction ∝ (0.6, 0.8) + (0, 1)
    es = [entry("a", 1.0, w=[3.0, 4.0]), entry("b", 1.0, w=[0.0, 1.0])]
    g = aggregate(es, {"w": (2,)}, LedgerConfig())["w"]
    d = np.array([0.6, 1.8])
    np.testing.assert_allclose(g, 3.0 * d / np.linalg.norm(d), rtol=1e-15)
    # weights 3:1 → mean norm (15 + 1)/4 = 4, direction ∝ 3·(0.6, 0.8) + (0, 1)
    es = [entry("a", 3.0, w=[3.0, 4.0]), entry("b", 1.0, w=[0.0, 1.0])]
    g = aggregate(es, {"w": (2,)}, LedgerConfig())["w"]
    d = np.array([1.8, 3.4])
    np.testing.assert_allclose(g, 4.0 * d / np.linalg.norm(d), rtol=1e-15)


def test_mean_and_embeddings():
    es = [entry("a", 3.0, w=[3.0, 4.0], emb=[1.0]), entry("b", 1.0, w=[0.0, 1.0], emb=[5.0])]
    shapes = {"w": (2,), "emb": (1,)}
    mean = aggregate(es, shapes, LedgerConfig(aggregation=Aggregation.MEAN))
    np.testing.assert_allclose(mean["w"], [9.0 / 4, 13.0 / 4], rtol=1e-15)
    np.testing.assert_allclose(mean["emb"], [2.0], rtol=1e-15)
    radial = aggregate(es, shapes, LedgerConfig(embeddings=frozenset({"emb"})))
    np.testing.assert_allclose(radial["emb"], [2.0], rtol=1e-15)  # plain weighted mean
    # without the embedding exemption a 1-element tensor keeps its mean norm and the mean sign
    np.testing.assert_allclose(aggregate(es, shapes, LedgerConfig())["emb"], [2.0], rtol=1e-15)


def test_zero_and_empty_slots():
    shapes = {"w": (2,)}
    assert np.array_equal(aggregate([], shapes, LedgerConfig())["w"], [0.0, 0.0])
    assert np.array_equal(aggregate([], shapes, LedgerConfig(aggregation="mean"))["w"], [0.0, 0.0])
    # a zero update adds no direction but halves the mean norm
    es = [entry("a", 1.0, w=[3.0, 4.0]), entry("b", 1.0, w=[0.0, 0.0])]
    np.testing.assert_allclose(aggregate(es, shapes, LedgerConfig())["w"], [1.5, 2.0], rtol=1e-15)
    # opposite directions cancel exactly: zero aggregate, not NaN
    es = [entry("a", 1.0, w=[3.0, 4.0]), entry("b", 1.0, w=[-3.0, -4.0])]
    assert np.array_equal(aggregate(es, shapes, LedgerConfig())["w"], [0.0, 0.0])


@pytest.mark.parametrize("aggregation", list(Aggregation))
def test_aggregate_bits_do_not_depend_on_entry_order(aggregation):
    rng = np.random.default_rng(7)
    shapes = {"big": (CHUNK + 1001,), "m": (7, 3)}  # crosses a chunk boundary
    es = [
        entry(
            f"u{i}",
            float(rng.uniform(0.1, 10.0)),
            **{k: rng.standard_normal(s) * 10.0 ** rng.integers(-6, 6) for k, s in shapes.items()},
        )
        for i in range(5)
    ]
    config = LedgerConfig(aggregation=aggregation)
    first = aggregate(es, shapes, config)
    for perm in itertools.islice(itertools.permutations(es), 1, 30, 7):
        again = aggregate(list(perm), shapes, config)
        for name in shapes:
            assert again[name].tobytes() == first[name].tobytes()
    # and the value is right (float64 reference, sum in any order)
    for name in shapes:
        xs = [e.deltas[name].astype(np.float64) for e in es]
        ws = np.array([e.weight for e in es])
        if aggregation is Aggregation.MEAN:
            ref = sum(w * x for w, x in zip(ws, xs, strict=True)) / ws.sum()
        else:
            d = sum(w * x / np.linalg.norm(x) for w, x in zip(ws, xs, strict=True))
            ref = (
                d / np.linalg.norm(d) * sum(w * np.linalg.norm(x) for w, x in zip(ws, xs, strict=True)) / ws.sum()
            )
        np.testing.assert_allclose(first[name], ref, rtol=1e-10, atol=1e-12 * np.abs(ref).max())


def test_norms_and_copies():
    x = np.random.default_rng(3).standard_normal(3 * CHUNK + 5).astype(np.float32)
    copy, norm = copy_with_norm(x)
    assert copy is not x and np.array_equal(copy, x)
    assert norm == tensor_norm(x)
    assert norm == pytest.approx(math.sqrt(float(np.sum(x.astype(np.float64) ** 2))), rel=1e-14)
    fortran = np.asfortranarray(np.ones((4, 3), np.float32))
    assert copy_with_norm(fortran)[0].flags.c_contiguous
    assert not math.isfinite(tensor_norm(np.array([1.0, np.nan], np.float32)))
    assert not math.isfinite(tensor_norm(np.array([np.inf], np.float32)))

"""The outer Nesterov step and the closed-form fold, checked against a plain in-order replay."""

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from protocol.ledger.chunks import CHUNK
from protocol.ledger.outer import fold_change, fold_coefficients, nesterov_step
from protocol.ledger.slot import TermChange


def replay(theta0, v0, gs, etas, mu):
    """The textbook recurrence, one slot at a time (t = 1..n)."""
    theta, v = theta0.copy(), v0.copy()
    for g, eta in zip(gs, etas, strict=True):
        v = g + mu * v
        theta = theta - eta * (g + mu * v)
    return theta, v


def test_step_matches_the_recurrence_and_scales_the_accumulator():
    rng = np.random.default_rng(0)
    shape = (CHUNK + 17,)  # more than one chunk
    theta, v, u = (rng.standard_normal(shape) for _ in range(3))
    expect_theta, expect_v = replay(theta, v, [0.25 * u], [0.7], 0.9)
    t, vv = {"a": theta.copy()}, {"a": v.copy()}
    nesterov_step(t, vv, {"a": u}, {"a": 0.25}, 0.7, 0.9)
    np.testing.assert_allclose(t["a"], expect_theta, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(vv["a"], expect_v, rtol=1e-14, atol=1e-14)
    t2, v2 = {"a": theta.copy()}, {"a": v.copy()}
    nesterov_step(t2, v2, {"a": 0.25 * u}, None, 0.7, 0.9)
    np.testing.assert_allclose(t2["a"], t["a"], rtol=1e-15, atol=1e-15)


@given(
    n=st.integers(1, 8),
    r_back=st.integers(0, 7),
    mu=st.sampled_from([0.0, 0.5, 0.9, 0.99]),
    etas=st.lists(st.floats(0.0, 2.0), min_size=8, max_size=8),
    seed=st.integers(0, 2**32 - 1),
)
def test_fold_coefficients_equal_the_effect_of_changing_one_past_aggregate(n, r_back, mu, etas, seed):
    r = n - min(r_back, n - 1)
    rng = np.random.default_rng(seed)
    theta0, v0 = rng.standard_normal(5), rng.standard_normal(5)
    gs = [rng.standard_normal(5) for _ in range(n)]
    delta = rng.standard_normal(5)
    eta = lambda t: etas[t - 1]  # noqa: E731
    base_theta, base_v = replay(theta0, v0, gs, [eta(t) for t in range(1, n + 1)], mu)
    gs[r - 1] = gs[r - 1] + delta
    late_theta, late_v = replay(theta0, v0, gs, [eta(t) for t in range(1, n + 1)], mu)
    v_coef, theta_coef = fold_coefficients(r, n, eta, mu)
    np.testing.assert_allclose(base_v + v_coef * delta, late_v, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(base_theta - theta_coef * delta, late_theta, rtol=1e-12, atol=1e-12)


def test_fold_coefficients_by_hand():
    # r = n: η_n (1 + μ); one slot later adds η_{n+1} μ²
    assert fold_coefficients(3, 3, lambda t: 0.7, 0.9) == (1.0, pytest.approx(0.7 * 1.9))
    v_coef, theta_coef = fold_coefficients(2, 3, lambda t: {2: 0.5, 3: 0.25}[t], 0.9)
    assert v_coef == pytest.approx(0.9)
    assert theta_coef == pytest.approx(0.5 * 1.9 + 0.25 * 0.81)
    with pytest.raises(ValueError):
        fold_coefficients(4, 3, lambda t: 0.7, 0.9)


@pytest.mark.parametrize("v_coef,theta_coef", [(0.81, 1.2), (0.0, 1.2), (0.5, 0.0), (1e-300, 1.0)])
def test_fold_change_applies_the_aggregate_difference(v_coef, theta_coef):
    rng = np.random.default_rng(1)
    shape = (3, CHUNK // 2 + 5)
    u_old = rng.standard_normal(shape)
    x = rng.standard_normal(shape).astype(np.float32)
    change = TermChange(terms=(({"x": x}, 0.3),), s_old=0.8, s_new=0.6)
    u_new = u_old + 0.3 * x.astype(np.float64)
    delta = change.s_new * u_new - change.s_old * u_old
    theta, v = rng.standard_normal(shape), rng.standard_normal(shape)
    t, vv, u = theta.copy(), v.copy(), u_old.copy()
    fold_change(t, vv, u, "x", change, v_coef, theta_coef)
    np.testing.assert_allclose(vv, v + v_coef * delta, rtol=1e-13, atol=1e-13)
    np.testing.assert_allclose(t, theta - theta_coef * delta, rtol=1e-13, atol=1e-13)
    np.testing.assert_array_equal(u, u_new)  # the slot's sum took the update in the same pass


def test_a_light_slot_taking_a_heavy_update_folds_without_losing_digits():
    """δ from the sum before the add: a slot of weight 1 receiving an update of weight 1000, its sum kept
    in float32, still folds to within float32 rounding of the exact change (from the sum after the add,
    the two terms of δ are each ~1000× δ and cancel)."""
    rng = np.random.default_rng(2)
    x_old, x = rng.standard_normal(1000).astype(np.float32), rng.standard_normal(1000).astype(np.float32)
    u = x_old.astype(np.float32) * np.float32(1.0)  # mean aggregation: c = w; the slot held one update, w = 1
    change = TermChange(terms=(({"x": x}, 1000.0),), s_old=1.0, s_new=1.0 / 1001.0)
    exact = (x_old.astype(np.float64) + 1000.0 * x) / 1001.0 - x_old
    theta, v = np.zeros(1000, np.float32), np.zeros(1000, np.float32)
    fold_change(theta, v, u, "x", change, 1.0, 1.0)
    assert np.max(np.abs(v - exact)) <= 4e-7 * np.max(np.abs(exact))

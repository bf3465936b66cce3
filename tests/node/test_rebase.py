"""Train through the slot close: `BaseShift` hands moves of the global parameters to a running round, and
`InnerLoop.run` adds them before its next step; Δ against the moved base is the round's own progress."""

import pytest
import numpy as np

from node.island.model import init_params
from node.outer.rebase import BaseShift
from node.island.train import InnerLoop


def _params(config, seed):
    return init_params(config.model, seed=seed)


def test_moves_posted_before_a_take_add_up(config):
    start, mid, end = (_params(config, s) for s in (1, 2, 3))
    shift = BaseShift(start, base_slot=4)
    assert shift.take() is None
    shift.post(mid, slot=5)
    shift.post(end, slot=6)
    moved = shift.take()
    for name in start:
        np.testing.assert_allclose(moved[name], end[name] - start[name], atol=1e-6)
        np.testing.assert_allclose(shift.applied[name], end[name], atol=1e-6)
    assert shift.applied_slot == 6 and shift.moves == 1
    assert shift.take() is None  # taken once


@pytest.mark.slow
def test_a_move_before_the_first_step_equals_starting_from_the_moved_base(config, dataset):
    base, moved_to = _params(config, 1), _params(config, 2)
    followed = InnerLoop.byte_lm(config, dataset.batcher("peer-a"))
    direct = InnerLoop.byte_lm(config, dataset.batcher("peer-a"))  # same batches
    shift = BaseShift(base, base_slot=0)
    shift.post(moved_to, slot=1)
    followed.set_params(base)
    a = followed.run(4, shift=shift.take)
    direct.set_params(moved_to)
    b = direct.run(4)
    for name in base:
        np.testing.assert_allclose(a.params[name], b.params[name], rtol=1e-5, atol=1e-6)
    assert shift.applied_slot == 1


def test_the_delta_against_the_moved_base_is_the_rounds_own_progress(config, dataset):
    """A move in the middle of a round changes the parameters the later steps see, not what Δ measures:
    Δ = moved base − local = −(sum of the round's own inner updates), finite and of a round's size."""
    base, moved_to = _params(config, 1), _params(config, 2)
    loop = InnerLoop.byte_lm(config, dataset.batcher("peer-b"))
    shift = BaseShift(base, base_slot=0)
    calls = []

    def take():
        calls.append(1)
        if len(calls) == 3:  # before the third step
            shift.post(moved_to, slot=1)
        return shift.take()

    loop.set_params(base)
    result = loop.run(6, shift=take)
    naive = max(float(np.abs(base[k] - result.params[k]).max()) for k in base)
    delta = max(float(np.abs(shift.applied[k] - result.params[k]).max()) for k in base)
    jump = max(float(np.abs(moved_to[k] - base[k]).max()) for k in base)
    assert shift.moves == 1 and len(calls) == 6
    assert delta < 0.5 * jump < naive  # the move itself is not part of Δ
    assert 0 < delta

"""The inner loop: real steps on the CPU, rounds, early stop, evaluation, checkpoints, the baseline."""

import math

import numpy as np
import pytest

from node.island.baseline import run_baseline, worker_keys
from node.island.model import init_params
from node.island.bytelm import lr_schedule
from node.island.train import InnerLoop
from protocol.errors import LocalProtocolError


@pytest.fixture(scope="module")
def loop(config, dataset):
    return InnerLoop.byte_lm(config, dataset.batcher("peer-a"))


@pytest.mark.slow
def test_loss_falls_on_the_embedded_corpus(config, dataset):
    loop = InnerLoop.byte_lm(config, dataset.batcher("peer-a"))
    heldout = dataset.heldout_batches(4)
    before = loop.evaluate(heldout)
    result = loop.run(80)
    after = loop.evaluate(heldout)
    assert result.steps == 80 and result.step == 80 and len(result.losses) == 80
    assert result.tokens == 80 * 8 * 32
    assert np.mean(result.losses[-10:]) < np.mean(result.losses[:5]) - 1.5  # nats
    assert 7 < before < 8.5 and after < before - 2.0  # bits per byte
    assert all(math.isfinite(x) for x in result.losses)
    assert loop._train_step._cache_size() == 1  # jitted once


@pytest.mark.slow
def test_set_params_then_run_zero_returns_the_same_params(loop, config):
    flat = init_params(config.model, seed=7)
    loop.run(2)
    loop.set_params(flat)
    result = loop.run(0)
    assert result.steps == 0 and result.tokens == 0 and math.isnan(result.mean_loss)
    assert result.params.keys() == flat.keys()
    for name in flat:
        np.testing.assert_array_equal(result.params[name], flat[name])
    flat["norm.scale"][:] = 5.0  # the loop holds its own copy
    assert not np.array_equal(loop.params["norm.scale"], flat["norm.scale"])


def test_rounds_keep_the_step_count_and_move_the_params(loop, config):
    global_params = init_params(config.model, seed=7)
    kept = {k: v.copy() for k, v in global_params.items()}
    loop.set_params(global_params)
    step = loop.step
    result = loop.run(3)
    assert result.step == step + 3 == loop.step
    delta = {k: global_params[k] - result.params[k] for k in global_params}
    assert max(float(np.abs(d).max()) for d in delta.values()) > 0
    assert all(np.array_equal(kept[k], global_params[k]) for k in kept)  # donation never touches inputs
    fed_back = result.params
    kept = {k: v.copy() for k, v in fed_back.items()}
    loop.set_params(fed_back)
    loop.run(2)
    assert all(np.array_equal(kept[k], fed_back[k]) for k in kept)
    assert loop.learning_rate() == pytest.approx(float(lr_schedule(config.inner)(loop.step)))


def test_should_stop_ends_a_round_early(loop):
    calls = []

    def should_stop() -> bool:
        calls.append(1)
        return len(calls) > 4

    result = loop.run(100, should_stop=should_stop)
    assert result.steps == 4 and len(calls) == 5


def test_state_dict_round_trip_continues_identically(loop, config, dataset):
    loop.run(3)
    state = loop.state_dict()
    assert state["step"] == loop.step and state["data_position"] == loop.batches.position
    assert any(k.startswith("opt/") and "mu" in k for k in state)
    expected = loop.run(4)
    other = InnerLoop.byte_lm(config, dataset.batcher("peer-a"),
                      params=init_params(config.model, seed=99))
    other.load_state_dict(state)
    got = other.run(4)
    assert got.losses == expected.losses and got.step == expected.step
    for name in expected.params:
        np.testing.assert_array_equal(got.params[name], expected.params[name])
    with pytest.raises(LocalProtocolError, match="missing"):
        other.load_state_dict({k: v for k, v in state.items() if k != "step"})
    with pytest.raises(LocalProtocolError, match="shape"):
        other.load_state_dict({**state, "params/norm.scale": np.zeros(5, np.float32)})


def adam_count(loop: InnerLoop) -> int:
    import jax
    import optax

    is_adam = lambda node: isinstance(node, optax.ScaleByAdamState)  # noqa: E731
    (adam,) = [s for s in jax.tree_util.tree_leaves(loop._opt_state, is_leaf=is_adam) if is_adam(s)]
    return int(adam.count)


def test_set_schedule_step_moves_the_learning_rate_only(config, dataset):
    schedule = lr_schedule(config.inner)
    moved = InnerLoop.byte_lm(config, dataset.batcher("peer-join"))
    moved.run(2)
    compiled = moved._train_step._cache_size()
    reference = InnerLoop.byte_lm(config, dataset.batcher("peer-join"))
    reference.load_state_dict(moved.state_dict())  # same params, AdamW state and data position
    moved.set_schedule_step(400)
    assert (moved.schedule_step, moved.step, adam_count(moved)) == (400, 2, 2)
    assert moved.learning_rate() == pytest.approx(float(schedule(400)))
    before = moved.params
    step_moved, step_reference = moved.run(1).params, reference.run(1).params
    # Same gradients and AdamW moments (bias-corrected for 3 steps on both): the updates differ only by
    # the rate, lr(400) against lr(2). AdamW's decoupled decay is scaled by the rate too.
    ratio = float(schedule(400)) / float(schedule(2))
    for name in before:
        np.testing.assert_allclose(step_moved[name] - before[name], ratio * (step_reference[name] - before[name]),
                                   rtol=1e-3, atol=1e-6, err_msg=name)
    assert (moved.schedule_step, moved.step, adam_count(moved)) == (401, 3, 3)
    assert moved.learning_rate() == pytest.approx(float(schedule(401)))
    assert moved._train_step._cache_size() == compiled  # the moved count is an input like any other
    restored = InnerLoop.byte_lm(config, dataset.batcher("peer-join"))
    restored.load_state_dict(moved.state_dict())
    assert (restored.schedule_step, restored.step) == (401, 3)
    with pytest.raises(LocalProtocolError, match="schedule step"):
        moved.set_schedule_step(-1)


def test_evaluate_given_params_leaves_the_loop_alone(loop, dataset, config):
    heldout = dataset.heldout_batches(2)
    own = loop.evaluate(heldout)
    fresh = loop.evaluate(heldout, params=init_params(config.model, seed=0))
    assert fresh != own and loop.evaluate(heldout) == own


def test_set_params_refuses_wrong_names(loop, config):
    flat = init_params(config.model, seed=0)
    del flat["norm.scale"]
    with pytest.raises(LocalProtocolError, match="norm.scale"):
        loop.set_params(flat)


@pytest.mark.slow
def test_baseline_curve_falls_and_counts_tokens(config, dataset):
    per_node = config.with_overrides(batch_size=4)  # global batch 2 x 4 = the loop's 8: no new compile
    points = run_baseline(per_node, steps=20, shard_keys=worker_keys(2), eval_every=10, eval_batches=2,
                          dataset=dataset)
    assert [p.step for p in points] == [0, 10, 20]
    assert [p.tokens for p in points] == [0, 10 * 2 * 4 * 32, 20 * 2 * 4 * 32]
    assert points[-1].bits_per_byte < points[0].bits_per_byte - 1.0


@pytest.mark.slow
def test_evaluate_is_mean_cross_entropy_in_bits(loop, dataset, config):
    import jax

    from node.island.model import make_apply

    batch = dataset.heldout_batches(1)[0][:3, :21]
    logits = np.asarray(jax.jit(make_apply(config.model))(loop.params, batch[:, :-1]), np.float64)
    top = logits.max(-1, keepdims=True)
    log_probs = logits - top - np.log(np.exp(logits - top).sum(-1, keepdims=True))
    nats = -np.take_along_axis(log_probs, batch[:, 1:, None], axis=-1).mean()
    assert loop.evaluate([batch]) == pytest.approx(nats / math.log(2), rel=1e-5)


def test_run_works_from_a_worker_thread(loop):
    import threading

    results = []
    worker = threading.Thread(target=lambda: results.append(loop.run(2)))
    worker.start()
    worker.join(timeout=120)
    assert not worker.is_alive() and results[0].steps == 2


def test_warm_up_compiles_without_changing_the_state(config, dataset):
    loop = InnerLoop.byte_lm(config, dataset.batcher("peer-warm"))
    before = loop.state_dict()
    assert loop.warm_up(dataset.heldout_batches(2)) > 0
    after = loop.state_dict()
    assert before.keys() == after.keys()
    for name in before:
        np.testing.assert_array_equal(before[name], after[name], err_msg=name)
    assert loop._train_step._cache_size() >= 1
    result = loop.run(2)  # the donated copies were the warm-up's own: the loop still trains
    assert result.steps == 2 and all(math.isfinite(x) for x in result.losses)

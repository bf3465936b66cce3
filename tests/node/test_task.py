"""Tier (a)/(b): the library API's parts (`node.island.task`): a user's pytree in flat form and back, the
checks on a model's parameters, an iterable's batches resumed by position, a Flax NNX module as a model, and
an InnerLoop training a model that is not ours."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from node.island.task import IterableBatches, Model, Task
from node.island.train import InnerLoop
from protocol.errors import LocalProtocolError


def init(key: jax.Array) -> dict:
    k1, k2 = jax.random.split(key)
    return {"layers": [{"w": jax.random.normal(k1, (3, 4))}, {"w": jax.random.normal(k2, (4, 1))}], "bias": jnp.zeros(1)}


def loss(params: dict, batch: dict) -> jax.Array:
    h = jnp.tanh(batch["x"] @ params["layers"][0]["w"]) @ params["layers"][1]["w"] + params["bias"]
    return jnp.mean((h[:, 0] - batch["y"]) ** 2)


def regression(rng: np.random.Generator, n: int) -> dict:
    x = rng.normal(size=(n, 3)).astype(np.float32)
    return {"x": x, "y": np.sin(x.sum(axis=1)).astype(np.float32)}


def test_a_pytree_model_in_flat_form_and_back() -> None:
    model = Model(name="reg", init=init, loss=loss)
    assert model.shapes == {"bias": (1,), "layers.0.w": (3, 4), "layers.1.w": (4, 1)}
    assert model.param_count == 17
    flat = model.init_params(7)
    assert all(v.dtype == np.float32 for v in flat.values())
    assert all(np.array_equal(flat[k], model.init_params(7)[k]) for k in flat)  # same seed, same arrays
    tree = model.unflatten(flat)
    assert np.array_equal(tree["layers"][1]["w"], flat["layers.1.w"])
    fields = model.run_fields(regression(np.random.default_rng(0), 8))
    assert {k: fields[k] for k in ("model.name", "model.parameters", "inner.lr")} == {
        "model.name": "reg", "model.parameters": 17, "inner.lr": 1e-3}
    with pytest.raises(LocalProtocolError, match="missing"):
        model.check({k: v for k, v in flat.items() if k != "bias"})
    with pytest.raises(LocalProtocolError, match="shape"):
        model.check({**flat, "bias": np.zeros(2, np.float32)})


def test_a_model_refuses_parameters_it_cannot_train() -> None:
    with pytest.raises(LocalProtocolError, match="not a float array"):
        Model(name="ints", init=lambda key: {"count": jnp.zeros(3, jnp.int32)}, loss=loss)
    with pytest.raises(LocalProtocolError, match="share a name"):
        Model(name="twice", init=lambda key: {"a.b": jnp.zeros(1), "a": {"b": jnp.zeros(1)}}, loss=loss)
    with pytest.raises(LocalProtocolError, match="lr"):
        Model(name="no-lr", init=init, loss=loss, lr=0.0)
    with pytest.raises(LocalProtocolError, match="tokens_per_batch"):
        Task(Model(name="reg", init=init, loss=loss), batches=[], tokens_per_batch=0)


def test_iterable_batches_resume_by_position() -> None:
    def stream():
        for i in range(10):
            yield {"i": np.full((2,), i)}

    class Stream:  # an iterable: each iter() starts again
        def __iter__(self):
            return stream()

    source = IterableBatches(Stream())
    assert source.example()["i"][0] == 0 and source.position == 0  # peeked, not drawn
    assert [source.next_batch()["i"][0] for _ in range(3)] == [0, 1, 2]
    source.seek(7)
    assert source.next_batch()["i"][0] == 7 and source.position == 8
    once = IterableBatches(stream())
    once.next_batch(), once.next_batch()
    with pytest.raises(LocalProtocolError, match="cannot go back"):
        once.seek(1)
    with pytest.raises(LocalProtocolError, match="ran out"):
        for _ in range(20):
            once.next_batch()


@pytest.mark.slow
def test_an_inner_loop_trains_a_user_model_from_an_iterable_and_restores_it() -> None:
    model = Model(name="reg", init=init, loss=loss, lr=3e-2, optimizer=optax.adam(3e-2))
    heldout = [regression(np.random.default_rng(1), 256)]

    def batches(peer_id: str):
        rng = np.random.default_rng(len(peer_id))
        while True:
            yield regression(rng, 32)

    task = Task(model, batches=batches, heldout=heldout, tokens_per_batch=32)
    source, held = task.open("peer-a")
    loop = InnerLoop(model, source, seed=3, tokens_per_batch=task.tokens_per_batch)
    assert not loop.has_schedule and loop.learning_rate() == 3e-2
    loop.set_schedule_step(500)  # no schedule to move: nothing changes
    before = loop.evaluate(held)
    result = loop.run(150)
    assert result.tokens == 150 * 32 and loop.evaluate(held) < 0.5 * before
    state = loop.state_dict()
    again = InnerLoop(model, IterableBatches(batches("peer-a")), tokens_per_batch=32,
                      params={k[len("params/"):]: v for k, v in state.items() if k.startswith("params/")})
    again.load_state_dict(state)  # the stream skips the 150 batches drawn
    assert again.batches.position == 150
    assert np.array_equal(again.batches.next_batch()["x"], source.next_batch()["x"])


class Tiny(nnx.Module):
    def __init__(self, rngs: nnx.Rngs) -> None:
        self.hidden = nnx.Linear(3, 8, rngs=rngs)
        self.out = nnx.Linear(8, 1, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.out(nnx.relu(self.hidden(x)))[:, 0]


@pytest.mark.slow
def test_a_flax_nnx_module_is_a_model() -> None:
    model = Model.from_nnx("tiny-nnx", lambda rngs: Tiny(rngs), lambda net, b: jnp.mean((net(b["x"]) - b["y"]) ** 2),
                           lr=1e-2, evaluate=lambda net, b: (jnp.sum(jnp.abs(net(b["x"]) - b["y"])), b["y"].shape[0]))
    assert model.shapes == {"hidden.bias": (8,), "hidden.kernel": (3, 8), "out.bias": (1,), "out.kernel": (8, 1)}
    flat = model.init_params(0)
    reference = Tiny(nnx.Rngs(jax.random.key(0)))
    assert np.array_equal(flat["hidden.kernel"], np.asarray(reference.hidden.kernel.get_value()))
    batch = regression(np.random.default_rng(0), 16)
    summed, count = model.flat_evaluate(flat, batch)  # the given evaluation: mean absolute error, summed
    assert count == 16 and float(summed) == pytest.approx(float(np.abs(reference(batch["x"]) - batch["y"]).sum()),
                                                          rel=1e-5)


@pytest.mark.slow
def test_data_parallel_of_a_task_trains_on_the_workers_batches_concatenated() -> None:
    """`run_task_baseline`: the task's model and optimizer on its workers' batches side by side, as N nodes of
    those peer ids draw them (the benchmarks' data-parallel at equal tokens for a library task)."""
    from node.island.baseline import ConcatSources, run_task_baseline

    def batches(peer_id: str):
        rng = np.random.default_rng(sum(peer_id.encode()))
        while True:
            yield regression(rng, 4)

    heldout = [regression(np.random.default_rng(99), 16)]
    task = Task(Model(name="reg", init=init, loss=loss, lr=1e-2), batches=batches, heldout=heldout, tokens_per_batch=4)
    curve = run_task_baseline(task, steps=3, shard_keys=("p", "q"), eval_every=3)
    assert [(p.step, p.tokens) for p in curve] == [(0, 0), (3, 24)]
    by_hand = InnerLoop(task.model, ConcatSources([task.open("p")[0], task.open("q")[0]]), tokens_per_batch=8)
    assert by_hand.batches.example()["x"].shape == (8, 3)
    by_hand.run(3)
    assert by_hand.evaluate(heldout) == curve[-1].bits_per_byte

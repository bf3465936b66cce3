"""Tier (a): what a library model puts into the run configuration (`Model.run_fields`, `node.island.fingerprint`):
two models with the same tensors but another computation, optimizer or schedule differ in a named field; the
same model built twice does not; `config` adds fields and never replaces diloco's; bad arguments are one clear
error."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from node.island.task import Model, Task, default_optimizer
from protocol.errors import LocalProtocolError

WIDTH, CONTEXT, VOCAB = 16, 8, 11


class Attention(nnx.Module):
    """One fused query/key/value projection split into `heads`: the head count changes no tensor's shape."""

    def __init__(self, heads: int, activation: str, rngs: nnx.Rngs) -> None:
        self.heads, self.activation = heads, activation
        self.embed = nnx.Embed(VOCAB, WIDTH, rngs=rngs)
        self.qkv = nnx.Linear(WIDTH, 3 * WIDTH, rngs=rngs)
        self.head = nnx.Linear(WIDTH, VOCAB, rngs=rngs)

    def __call__(self, ids: jax.Array) -> jax.Array:
        x = self.embed(ids)
        b, t, d = x.shape
        q, k, v = jnp.split(self.qkv(x).reshape(b, t, 3, self.heads, d // self.heads), 3, axis=2)
        w = jax.nn.softmax(jnp.einsum("bqhd,bkhd->bhqk", q[:, :, 0], k[:, :, 0]) / math.sqrt(d // self.heads))
        y = jnp.einsum("bhqk,bkhd->bqhd", w, v[:, :, 0]).reshape(b, t, d)
        return self.head(getattr(jax.nn, self.activation)(y))


def loss(net: Attention, rows: jax.Array) -> jax.Array:
    return optax.softmax_cross_entropy_with_integer_labels(net(rows[:, :-1]), rows[:, 1:]).mean()


BATCH = np.zeros((4, CONTEXT + 1), np.int32)


def model(heads: int = 4, activation: str = "gelu", **kwargs) -> Model:
    return Model.from_nnx("attn", lambda rngs: Attention(heads, activation, rngs), loss, **kwargs)


def differing(a: Model, b: Model) -> set[str]:
    fa, fb = a.run_fields(BATCH), b.run_fields(BATCH)
    return {k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k)}


def test_the_same_model_built_twice_has_the_same_fields() -> None:
    assert model().run_fields(BATCH) == model().run_fields(BATCH)
    fields = model().run_fields(BATCH)
    assert set(fields) == {"model.name", "model.parameters", "model.structure", "model.computation", "inner.lr",
                           "inner.optimizer", "inner.schedule"}


def test_another_head_count_with_the_same_tensors_differs_in_its_computation() -> None:
    two, four = model(heads=2), model(heads=4)
    assert two.shapes == four.shapes and two.param_count == four.param_count
    assert differing(two, four) == {"model.computation"}
    assert differing(model(activation="relu"), four) == {"model.computation"}


def test_another_optimizer_or_schedule_differs_where_it_differs() -> None:
    tx, schedule = default_optimizer(1e-3)
    assert differing(model(optimizer=optax.adam(1e-3)), model(optimizer=optax.adam(2e-3))) == {"inner.optimizer"}
    other_tx, other_schedule = default_optimizer(1e-3, total_steps=500)
    assert differing(model(optimizer=tx, schedule=schedule), model(optimizer=other_tx, schedule=other_schedule)) == {
        "inner.optimizer", "inner.schedule"}
    assert differing(model(lr=1e-3), model(lr=3e-3)) == {"inner.lr", "inner.optimizer", "inner.schedule"}


def test_the_structure_names_every_tensor_and_shape() -> None:
    wider = Model(name="attn", init=lambda key: {"w": jnp.zeros((3, 4))}, loss=lambda p, b: jnp.sum(p["w"]))
    narrower = Model(name="attn", init=lambda key: {"w": jnp.zeros((4, 3))}, loss=lambda p, b: jnp.sum(p["w"]))
    assert {"model.structure", "model.computation"} <= differing(wider, narrower)


def test_config_adds_fields_and_cannot_replace_dilocos() -> None:
    fields = model(config={"model.heads": 4, "data.source": "shakespeare"}).run_fields(BATCH)
    assert fields["model.heads"] == 4 and fields["data.source"] == "shakespeare"
    assert fields["model.computation"] == model().run_fields(BATCH)["model.computation"]
    assert model(config={"inner.lr": 1e-3}).run_fields(BATCH)["inner.lr"] == 1e-3  # the same value: fine
    with pytest.raises(LocalProtocolError, match="leave it out"):
        model(config={"model.parameters": 1}).run_fields(BATCH)
    with pytest.raises(LocalProtocolError, match="dotted lowercase"):
        model(config={"Heads": 4})
    with pytest.raises(LocalProtocolError, match="config"):
        model(config={"model.table": {"a": 1}})


def test_trace_false_leaves_the_traced_hashes_out() -> None:
    fields = model(trace=False).run_fields(BATCH)
    assert "model.computation" not in fields and "inner.optimizer" not in fields
    assert "model.structure" in fields and "inner.schedule" in fields


def test_embeddings_take_any_collection_of_tensor_names() -> None:
    assert model(embeddings=["embed.embedding"]).embeddings == frozenset({"embed.embedding"})
    with pytest.raises(LocalProtocolError, match="not parameters"):
        model(embeddings=["embedding"])
    with pytest.raises(LocalProtocolError, match="tensor names"):
        model(embeddings="embed.embedding")


def test_a_task_peeks_at_its_first_batch_for_the_fields_and_keeps_it() -> None:
    drawn = []

    def batches(peer_id: str):
        while True:
            drawn.append(peer_id)
            yield BATCH

    task = Task(model(), batches=batches, tokens_per_batch=4 * CONTEXT)
    assert task.run_fields("p") == model().run_fields(BATCH)
    assert task.run_fields("q") == model().run_fields(BATCH) and drawn == ["p"]  # opened once

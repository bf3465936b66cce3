"""Model and its flat parameter form."""

import jax
import numpy as np
import pytest
from flax import nnx

from node.island.model import (Transformer, build_model, embedding_names, flatten_params, init_params, make_apply,
                        param_count, param_shapes, unflatten_params)
from protocol.errors import LocalProtocolError


def test_flat_names_are_stable_dotted_and_float32(config):
    flat = init_params(config.model, seed=0)
    assert list(flat) == sorted(flat)
    assert "blocks.0.attn.qkv.kernel" in flat and "blocks.1.mlp.proj.kernel" in flat
    assert flat["blocks.0.attn.qkv.kernel"].shape == (32, 96)
    assert all(v.dtype == np.float32 for v in flat.values())
    assert {k: v.shape for k, v in flat.items()} == param_shapes(config.model)
    assert sum(v.size for v in flat.values()) == param_count(config.model)


def test_flat_round_trip_is_exact(config):
    flat = init_params(config.model, seed=1)
    model = build_model(config.model, flat)
    assert isinstance(model, Transformer)
    back = flatten_params(model)
    assert list(back) == list(flat)
    for name in flat:
        np.testing.assert_array_equal(back[name], flat[name])
    other = init_params(config.model, seed=2)
    unflatten_params(model, other)
    assert all(np.array_equal(flatten_params(model)[k], other[k]) for k in other)
    other["norm.scale"][:] = 3.0  # the model holds copies
    assert not np.array_equal(flatten_params(model)["norm.scale"], other["norm.scale"])


@pytest.mark.slow
def test_a_built_model_computes_what_the_functional_apply_computes(config):
    flat = init_params(config.model, seed=1)
    tokens = np.random.default_rng(0).integers(0, 256, (3, 20))
    via_module = np.asarray(nnx.jit(lambda m, t: m(t))(build_model(config.model, flat), tokens))
    via_apply = np.asarray(jax.jit(make_apply(config.model))(flat, tokens))
    np.testing.assert_allclose(via_module, via_apply, rtol=1e-6, atol=1e-6)


def test_init_is_deterministic_per_seed(config):
    a, b, c = init_params(config.model, 3), init_params(config.model, 3), init_params(config.model, 4)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    assert not np.array_equal(a["blocks.0.mlp.fc.kernel"], c["blocks.0.mlp.fc.kernel"])


def test_functional_apply_is_causal_and_uses_the_given_params(config):
    apply = jax.jit(make_apply(config.model))
    flat = init_params(config.model, seed=0)
    tokens = np.random.default_rng(1).integers(0, 256, (3, 20))
    logits = np.asarray(apply(flat, tokens))
    assert logits.shape == (3, 20, 256) and logits.dtype == np.float32 and np.isfinite(logits).all()
    changed = tokens.copy()
    changed[:, 10:] = (changed[:, 10:] + 1) % 256  # the future must not change the past
    future = np.asarray(apply(flat, changed))
    np.testing.assert_allclose(future[:, :10], logits[:, :10], rtol=1e-5, atol=1e-5)
    assert not np.allclose(future[:, 10:], logits[:, 10:])
    other = np.asarray(apply(init_params(config.model, seed=1), tokens))
    assert not np.allclose(other, logits)


def test_embedding_names(config):
    assert embedding_names(config.model) == ("embed.embedding",)
    untied = config.with_overrides(tie_embeddings=False).model
    names = embedding_names(untied)
    assert names == ("embed.embedding", "lm_head.kernel")
    assert set(names) <= set(param_shapes(untied))


def test_wrong_names_or_shapes_are_refused(config):
    flat = init_params(config.model, seed=0)
    model = build_model(config.model, flat)
    with pytest.raises(LocalProtocolError, match="missing"):
        unflatten_params(model, {k: v for k, v in flat.items() if k != "norm.scale"})
    with pytest.raises(LocalProtocolError, match="shape"):
        unflatten_params(model, {**flat, "norm.scale": np.zeros(3, np.float32)})

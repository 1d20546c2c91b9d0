"""Optimizers: BERT weight-decay exclusions, warmup + linear decay, frozen parameters."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from flax import nnx

from dpbert.models import bert as model_lib
from dpbert.runtime import optimizers
from dpbert.dp import trees


def _config(**overrides):
    cfg = dict(name="adamw", learning_rate=1e-3, warmup_steps=10, total_steps=100,
               weight_decay=0.01, b1=0.9, b2=0.999, eps=1e-6)
    cfg.update(overrides)
    return ml_collections.ConfigDict(cfg)


@pytest.fixture(scope="module")
def bert_params():
    config = model_lib.BertConfig.preset("tiny", 97, max_position_embeddings=32)
    return nnx.split(model_lib.create_model(config))[1]


def test_weight_decay_mask_on_bert(bert_params):
    mask = optimizers.weight_decay_mask(bert_params)
    decayed, excluded = [], []
    jax.tree_util.tree_map_with_path(
        lambda path, m: (decayed if m else excluded).append(trees.path_string(path)), mask)
    # Kernels and embeddings decay; every LayerNorm parameter and every bias does not.
    assert decayed and excluded
    assert all(p.endswith(("kernel", "embedding")) for p in decayed), decayed
    assert all(p.endswith(("bias", "scale")) for p in excluded), excluded
    assert "cls/predictions/bias" in excluded  # the MLM output bias
    assert all("LayerNorm" not in p for p in decayed)
    # For BERT this is exactly "decay iff the parameter is a matrix".
    ndims = jax.tree.leaves(jax.tree.map(lambda x: x.ndim >= 2, bert_params))
    assert jax.tree.leaves(mask) == ndims


def test_schedule_warmup_then_linear_decay():
    sched = optimizers.make_schedule(_config(learning_rate=2.0, warmup_steps=10,
                                             total_steps=110))
    assert float(sched(0)) == 0.0
    assert float(sched(5)) == pytest.approx(1.0)
    assert float(sched(10)) == pytest.approx(2.0)
    assert float(sched(60)) == pytest.approx(1.0)
    assert float(sched(110)) == pytest.approx(0.0)
    no_warmup = optimizers.make_schedule(_config(learning_rate=2.0, warmup_steps=0,
                                                 total_steps=100))
    assert float(no_warmup(0)) == pytest.approx(2.0)


@pytest.mark.parametrize("name", ["adamw", "lamb", "sgd"])
def test_weight_decay_applies_only_to_decayed_leaves(name):
    params = {"dense": {"kernel": jnp.ones((3, 3)), "bias": jnp.ones((3,))},
              "LayerNorm": {"scale": jnp.ones((3,)), "bias": jnp.ones((3,))}}
    opt = optimizers.make_optimizer(_config(name=name, weight_decay=0.5, warmup_steps=0,
                                            learning_rate=0.1))
    state = opt.init(params)
    zeros = jax.tree.map(jnp.zeros_like, params)
    updates, _ = opt.update(zeros, state, params)
    new = optax.apply_updates(params, updates)
    assert np.all(np.asarray(new["dense"]["kernel"]) < 1.0)  # decayed
    for leaf in (new["dense"]["bias"], new["LayerNorm"]["scale"], new["LayerNorm"]["bias"]):
        np.testing.assert_array_equal(leaf, 1.0)


def test_frozen_parameters_get_no_update_and_no_state(bert_params):
    frozen = trees.freeze_paths_containing("word_embeddings")
    opt = optimizers.make_optimizer(_config(warmup_steps=0), bert_params, trainable=frozen)
    state = opt.init(bert_params)
    grads = jax.tree.map(jnp.ones_like, bert_params)
    updates, _ = jax.jit(opt.update)(grads, state, bert_params)
    word = updates["bert"]["embeddings"]["word_embeddings"]["embedding"][...]
    assert not np.any(np.asarray(word))
    other = updates["bert"]["pooler"]["dense"]["kernel"][...]
    assert np.all(np.asarray(other) != 0)
    # Adam moments exist only for trainable leaves.
    n_state = sum(x.size for x in jax.tree.leaves(state))
    n_params = sum(x.size for x in jax.tree.leaves(bert_params))
    n_word = word.size
    assert n_state < 2 * n_params - n_word


@pytest.mark.parametrize("overrides, match", [
    (dict(name="adam"), "name"),
    (dict(learning_rate=0.0), "learning_rate"),
    (dict(learning_rate=None), "learning_rate"),
    (dict(total_steps=10), "total_steps"),
    (dict(warmup_steps=-1), "warmup_steps"),
    (dict(weight_decay=-0.1), "weight_decay"),
    (dict(b2=1.0), "b2"),
    (dict(head_learning_rate_scale=0.0), "head_learning_rate_scale"),
])
def test_config_errors(overrides, match):
    with pytest.raises(ValueError, match=match):
        optimizers.make_optimizer(_config(**overrides))


def test_plain_dict_config_and_defaults():
    opt = optimizers.make_optimizer({"name": "lamb", "learning_rate": 1e-3, "total_steps": 5})
    params = {"w": jnp.ones((2, 2))}
    updates, _ = opt.update({"w": jnp.ones((2, 2))}, opt.init(params), params)
    assert updates["w"].shape == (2, 2)
    with pytest.raises(ValueError, match="needs params"):
        optimizers.make_optimizer(_config(), trainable=lambda path, leaf: True)


@pytest.mark.parametrize("name", ["adamw", "sgd"])
def test_head_learning_rate_scale_multiplies_only_the_head_step(name):
    """head_learning_rate_scale = s: the `classifier` leaves move s times as far as with s = 1,
    every other leaf exactly as far; frozen leaves still do not move."""
    params = {"bert": {"dense": {"kernel": jnp.ones((3, 3))}, "word": {"embedding": jnp.ones(4)}},
              "classifier": {"kernel": jnp.ones((3, 2)), "bias": jnp.ones(2)}}
    grads = jax.tree.map(lambda x: 0.3 * jnp.ones_like(x), params)
    frozen = trees.freeze_paths_containing("word")

    def step(scale):
        opt = optimizers.make_optimizer(
            _config(name=name, warmup_steps=0, learning_rate=1e-2, weight_decay=0.0,
                    b1=0.0, head_learning_rate_scale=scale), params, trainable=frozen)
        return opt.update(grads, opt.init(params), params)[0]

    one, ten = step(1.0), step(10.0)
    np.testing.assert_allclose(ten["classifier"]["kernel"], 10 * one["classifier"]["kernel"],
                               rtol=1e-6)
    np.testing.assert_allclose(ten["classifier"]["bias"], 10 * one["classifier"]["bias"],
                               rtol=1e-6)
    np.testing.assert_array_equal(ten["bert"]["dense"]["kernel"], one["bert"]["dense"]["kernel"])
    assert np.all(np.asarray(one["bert"]["dense"]["kernel"]) != 0)
    np.testing.assert_array_equal(ten["bert"]["word"]["embedding"], 0.0)
    with pytest.raises(ValueError, match="no trainable 'classifier'"):
        optimizers.make_optimizer(_config(head_learning_rate_scale=2.0),
                                  {"bert": params["bert"]})

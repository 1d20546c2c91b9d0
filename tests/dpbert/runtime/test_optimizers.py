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


# --- the optimizer's numbers as an argument of the train step (optimizers.SWEPT) -------------

@pytest.mark.parametrize("warmup, total", [(10, 110), (0, 7), (3, 4)])
def test_schedule_from_the_numbers_argument_is_optax_s(warmup, total):
    """The schedule (with constants, or with the numbers as an argument) is optax's
    join_schedules of two linear schedules, bit for bit with constants, to float32 rounding
    with the argument: with constants XLA turns the division by the number of steps into a
    multiplication by its reciprocal (an ulp apart at some steps; at and after total_steps
    the constants give -1e-11 where the argument gives exactly 0)."""
    config = _config(learning_rate=3e-4, warmup_steps=warmup, total_steps=total)
    counts = jnp.arange(total + 5, dtype=jnp.int32)
    reference = optax.join_schedules(
        [optax.linear_schedule(0.0, 3e-4, max(warmup, 1)),
         optax.linear_schedule(3e-4, 0.0, total - warmup)], boundaries=[warmup])
    want = np.asarray(jax.jit(jax.vmap(reference))(counts))
    constant = np.asarray(jax.jit(jax.vmap(optimizers.make_schedule(config)))(counts))
    np.testing.assert_array_equal(constant, want)
    got = jax.jit(lambda x, c: jax.vmap(optimizers.make_schedule(config, x))(c))(
        optimizers.numbers_argument(config), counts)
    np.testing.assert_allclose(np.asarray(got), want, rtol=3e-7, atol=1e-10)
    assert float(got[warmup]) == pytest.approx(3e-4) and np.all(np.asarray(got[total:]) == 0)


def _head_params():
    return {"bert": {"dense": {"kernel": jnp.linspace(0.5, 1.5, 9).reshape(3, 3),
                               "bias": jnp.ones(3)},
                     "word": {"embedding": jnp.ones(4)}},
            "classifier": {"kernel": jnp.ones((3, 2)), "bias": jnp.ones(2)}}


@pytest.mark.parametrize("name", ["adamw", "lamb", "sgd"])
def test_numbers_as_an_argument_update_as_the_constants_do(name):
    """Three updates with the numbers passed to the jitted step equal those with the config's
    constants, bit for bit (frozen leaves, decay mask and head scale included), and the state
    has one layout."""
    params = _head_params()
    frozen = trees.freeze_paths_containing("word")
    config = _config(name=name, warmup_steps=2, total_steps=5, weight_decay=0.1,
                     head_learning_rate_scale=3.0, b1=0.5)
    constant = optimizers.make_optimizer(config, params, trainable=frozen)

    @jax.jit
    def with_numbers(grads, state, params, numbers):
        opt = optimizers.make_optimizer(config, params, trainable=frozen, numbers=numbers)
        return opt.update(grads, state, params)

    numbers = optimizers.numbers_argument(config)
    a = b = constant.init(params)
    assert jax.tree.structure(a) == jax.tree.structure(
        optimizers.make_optimizer(config, params, trainable=frozen,
                                  numbers=jnp.asarray(numbers)).init(params))
    for i in range(3):
        grads = jax.tree.map(lambda x: (0.3 + i) * jnp.ones_like(x), params)
        ua, a = jax.jit(constant.update)(grads, a, params)
        ub, b = with_numbers(grads, b, params, numbers)
        jax.tree.map(np.testing.assert_array_equal, ub, ua)
        jax.tree.map(np.testing.assert_array_equal, b, a)
    assert np.any(np.asarray(ua["classifier"]["kernel"]) != 0)


def test_one_program_serves_every_value_of_the_numbers():
    """The program does not depend on the values: two learning rates, warmups and weight
    decays lower to the same text (the persistent cache's key), and the values still act."""
    params = _head_params()
    grads = jax.tree.map(jnp.ones_like, params)

    def step(config):
        numbers = optimizers.numbers_argument(config)

        def f(state, numbers):
            opt = optimizers.make_optimizer(config, params, numbers=numbers)
            return opt.update(grads, state, params)[0]

        state = optimizers.make_optimizer(config).init(params)
        state = jax.tree.map(lambda x: x + 5 if x.dtype == jnp.int32 else x, state)  # count 5
        return jax.jit(f).lower(state, numbers).as_text(), jax.jit(f)(state, numbers)

    text_a, upd_a = step(_config(learning_rate=1e-3, warmup_steps=2, weight_decay=0.01))
    text_b, upd_b = step(_config(learning_rate=5e-4, warmup_steps=4, weight_decay=0.1))
    assert text_a == text_b
    assert not np.allclose(upd_a["bert"]["dense"]["kernel"], upd_b["bert"]["dense"]["kernel"])
    # Control: with the numbers as constants the programs differ.
    const = lambda c: jax.jit(lambda s: optimizers.make_optimizer(c).update(  # noqa: E731
        grads, s, params)[0]).lower(optimizers.make_optimizer(c).init(params)).as_text()
    assert const(_config(learning_rate=1e-3)) != const(_config(learning_rate=5e-4))


def test_numbers_argument_checks_the_config():
    with pytest.raises(ValueError, match="learning_rate"):
        optimizers.numbers_argument(_config(learning_rate=-1.0))
    with pytest.raises(ValueError, match="total_steps"):
        optimizers.numbers_argument(_config(total_steps=2 ** 24))
    np.testing.assert_array_equal(
        optimizers.numbers_argument(_config(head_learning_rate_scale=2.0)),
        np.asarray([1e-3, 10, 100, 0.01, 2.0], np.float32))


def test_building_the_optimizer_starts_no_jax_backend():
    """The launchers check the config (which builds the optimizer) before
    jax.distributed.initialize, which must come before the backend starts: building the
    optimizer and its schedule runs no JAX computation (a fresh process, so the check means
    something)."""
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    code = ("import ml_collections, jax._src.xla_bridge as xb\n"
            "from dpbert.runtime import optimizers\n"
            "for name in ('adamw', 'lamb', 'sgd'):\n"
            "    optimizers.make_optimizer(ml_collections.ConfigDict(dict(name=name,\n"
            "        learning_rate=1e-3, warmup_steps=3, total_steps=10)), None)\n"
            "print('started' if xb._backends else 'not started')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip().splitlines()[-1] == "not started"

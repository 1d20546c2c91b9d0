"""DPAggregator: accumulation over calls, noise once per logical batch, optimizer wiring."""

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest

from dpbert.runtime import optimizers
from dpbert.dp import accumulation, trees
from tests.dpbert.dp import helpers

N = 16  # slots per logical batch
C = 20.0
E = 14.0  # expected batch size (public); the realised one below is 13


@pytest.fixture(scope="module")
def data():
    params = helpers.mlp_params()
    batch = helpers.mlp_batch(N)
    mask = np.ones(N, bool)
    mask[[3, 9, 15]] = False
    return params, batch, mask


def _run(params, batch, mask, optimizer, *, calls, microbatch_size=None, logical_steps=1,
         noise_multiplier=1.1, clip_norm=C, trainable=None, state=None):
    """Runs `logical_steps` logical batches, each the same 16 slots split into `calls` calls."""
    config = accumulation.DPConfig(clip_norm=clip_norm, noise_multiplier=noise_multiplier,
                                   expected_batch_size=E, microbatch_size=microbatch_size,
                                   accumulation_steps=calls)
    agg = accumulation.DPAggregator(config, helpers.mlp_loss, optimizer, trainable=trainable)
    state = agg.init(params, 0) if state is None else state
    opt_state = optimizer.init(params)
    step = jax.jit(agg.update)
    size = N // calls
    history = []
    for _ in range(logical_steps):
        for c in range(calls):
            sl = slice(c * size, (c + 1) * size)
            params, opt_state, state, metrics = step(
                state, params, opt_state, jax.tree.map(lambda x: x[sl], batch), mask[sl])
            history.append((params, opt_state, state, metrics))
    return agg, history


@pytest.fixture(scope="module")
def one_call_reference(data):
    """Two logical batches, each in ONE call (no accumulator), adam."""
    params, batch, mask = data
    return _run(params, batch, mask, optax.adam(0.1), calls=1, logical_steps=2)[1]


@pytest.mark.parametrize("calls, microbatch_size", [(2, 4), (4, None)])
def test_split_into_calls_and_microbatches_does_not_matter(data, one_call_reference, calls,
                                                          microbatch_size):
    params, batch, mask = data
    ref = one_call_reference
    _, got = _run(params, batch, mask, optax.adam(0.1), calls=calls,
                  microbatch_size=microbatch_size, logical_steps=2)
    helpers.assert_trees_close(got[-1][0], ref[-1][0], rtol=2e-6, atol_frac=1e-6)
    assert int(got[-1][2].step) == 2 and int(got[-1][2].micro_step) == 0


def _recorder() -> optax.GradientTransformation:
    """Passes gradients through and records the last one and the number of calls."""

    def init(params):
        return {"calls": jnp.zeros((), jnp.int32),
                "last": jax.tree.map(jnp.zeros_like, params)}

    def update(updates, state, params=None):
        del params
        return updates, {"calls": state["calls"] + 1, "last": updates}

    return optax.GradientTransformation(init, update)


def test_optimizer_sees_only_noisy_gradient_once_per_logical_batch(data):
    params, batch, mask = data
    agg, history = _run(params, batch, mask, _recorder(), calls=4, logical_steps=2)
    calls = [int(h[1]["calls"]) for h in history]
    assert calls == [0, 0, 0, 1, 1, 1, 1, 2]
    # Params change only on the applying calls.
    assert all(np.array_equal(history[i][0]["l1"]["kernel"], params["l1"]["kernel"])
               for i in range(3))
    # What it saw at the end of logical batch 0: (clipped sum + that step's noise) / E.
    state0 = agg.init(params, 0)
    clean, _, _ = helpers.brute_force_clipped_sum(helpers.mlp_loss, params, batch, mask,
                                                  agg.example_key(state0), C)
    expected = agg.noisy_gradient(state0, jax.tree.map(jnp.asarray, clean))
    seen = history[3][1]["last"]
    helpers.assert_trees_close(seen, expected, rtol=1e-5, atol_frac=1e-6)
    # ... which is not the un-noised gradient: the noise dominates at sigma = 1.1.
    diff = np.asarray(seen["l1"]["kernel"]) - np.asarray(clean["l1"]["kernel"]) / E
    assert np.std(diff) == pytest.approx(1.1 * C / E, rel=0.35)
    # The accumulator is reset after the update.
    assert not np.any(np.asarray(history[-1][2].grad_acc["l1"]["kernel"]))


def test_divides_by_expected_not_realised_batch_size(data):
    params, batch, mask = data
    _, history = _run(params, batch, mask, optax.sgd(1.0), calls=2, noise_multiplier=0.0,
                      clip_norm=math.inf)
    key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(0), 0), 0)
    total, _, _ = helpers.brute_force_clipped_sum(helpers.mlp_loss, params, batch, mask, key,
                                                  math.inf)
    expected = jax.tree.map(lambda p, g: p - g / E, params, total)
    helpers.assert_trees_close(history[-1][0], expected, rtol=1e-5, atol_frac=1e-6)
    assert float(history[0][3]["count"]) + float(history[1][3]["count"]) == 13


def test_frozen_leaves_unchanged_with_weight_decay(data):
    params, batch, mask = data
    frozen = trees.freeze_paths_containing("l1")
    opt = optimizers.make_optimizer(
        dict(name="adamw", learning_rate=0.1, warmup_steps=0, total_steps=10,
             weight_decay=0.5), params, trainable=frozen)
    _, history = _run(params, batch, mask, opt, calls=2, logical_steps=2, trainable=frozen)
    final = history[-1][0]
    np.testing.assert_array_equal(final["l1"]["kernel"], params["l1"]["kernel"])
    np.testing.assert_array_equal(final["l1"]["bias"], params["l1"]["bias"])
    assert np.all(np.asarray(final["l2"]["kernel"]) != np.asarray(params["l2"]["kernel"]))
    # Even an optimizer unaware of the filter cannot move frozen leaves.
    _, history = _run(params, batch, mask, optax.adamw(0.1, weight_decay=0.5), calls=1,
                      trainable=frozen)
    np.testing.assert_array_equal(history[-1][0]["l1"]["kernel"], params["l1"]["kernel"])


def test_metrics_are_batch_totals_only(data):
    params, batch, mask = data
    bad = dict(batch, x=batch["x"].at[0, 0].set(jnp.nan))
    _, history = _run(params, bad, mask, optax.sgd(0.1), calls=2)
    metrics = history[0][3]
    assert set(metrics) == {"loss_sum", "count", "num_nonfinite"}
    assert all(np.shape(v) == () for v in metrics.values())
    assert int(metrics["num_nonfinite"]) == 1
    assert all(np.all(np.isfinite(np.asarray(x))) for x in jax.tree.leaves(history[-1][0]))


def test_orbax_checkpoint_mid_batch_resumes_exactly(data, tmp_path):
    params, batch, mask = data
    opt = optax.sgd(0.1)
    agg, history = _run(params, batch, mask, opt, calls=4)
    # Save the state after 2 of 4 calls (non-zero accumulator), restore, finish the batch.
    p2, o2, s2, _ = history[1]
    assert int(s2.micro_step) == 2 and np.any(np.asarray(s2.grad_acc["l2"]["kernel"]))
    ckpt = ocp.StandardCheckpointer()
    ckpt.save(tmp_path / "dp_state", s2)
    ckpt.wait_until_finished()
    restored = ckpt.restore(tmp_path / "dp_state", jax.tree.map(ocp.utils.to_shape_dtype_struct,
                                                                s2))
    assert isinstance(restored, accumulation.DPState)
    step = jax.jit(agg.update)
    p, o, s = p2, o2, restored
    for c in (2, 3):
        sl = slice(c * 4, (c + 1) * 4)
        p, o, s, _ = step(s, p, o, jax.tree.map(lambda x: x[sl], batch), mask[sl])
    jax.tree.map(np.testing.assert_array_equal, p, history[-1][0])


def test_single_call_per_batch_has_no_accumulator(data):
    params, _, _ = data
    config = accumulation.DPConfig(clip_norm=1.0, noise_multiplier=1.0, expected_batch_size=8.0)
    state = accumulation.DPAggregator(config, helpers.mlp_loss, optax.sgd(1.0)).init(params, 3)
    assert state.grad_acc is None and state.rng.dtype == jnp.uint32


@pytest.mark.parametrize("kwargs, match", [
    (dict(clip_norm=0.0), "clip_norm"),
    (dict(noise_multiplier=-0.5), "noise_multiplier"),
    (dict(expected_batch_size=0), "expected_batch_size"),
    (dict(accumulation_steps=0), "accumulation_steps"),
    (dict(noise_mode="tf"), "noise_mode"),
    (dict(num_shards=0), "num_shards"),
    (dict(microbatch_size=0), "microbatch_size"),
    (dict(clip_norm=math.inf), "infinite"),
])
def test_config_errors(kwargs, match):
    base = dict(clip_norm=1.0, noise_multiplier=1.0, expected_batch_size=8.0)
    with pytest.raises(ValueError, match=match):
        accumulation.DPConfig(**{**base, **kwargs})


def test_config_from_config_dict():
    cfg = ml_collections.ConfigDict(dict(clip_norm=0.01, noise_multiplier=1.2,
                                         expected_batch_size=131072.0, microbatch_size=32,
                                         accumulation_steps=32, noise_mode="per_shard",
                                         num_shards=256, target_epsilon=8.0))
    config = accumulation.DPConfig.from_config(cfg)
    assert config.accumulation_steps == 32 and config.noise_mode == "per_shard"
    assert config.noise_stddev == pytest.approx(1.2 * 0.01 * 16)
    with pytest.raises(ValueError, match="clip_norm"):
        accumulation.DPConfig.from_config(dict(noise_multiplier=1.0, expected_batch_size=2.0))

"""The DP engine on tiny BERT with the real MLM+NSP per-example loss (dropout on)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from dpbert.models import losses

from dpbert.runtime import optimizers

from dpbert.runtime import sharding
from dpbert.models import bert as model_lib
from dpbert.dp import accumulation, clipping, trees
from tests.dpbert.dp import helpers

VOCAB = 97
FROZEN = trees.freeze_paths_containing("word_embeddings")  # dχ pretraining freezes it


@pytest.fixture(scope="module")
def bert():
    config = model_lib.BertConfig.preset("tiny", VOCAB, max_position_embeddings=32)
    graphdef, params = nnx.split(model_lib.create_model(config, seed=0))
    loss_fn = losses.make_pretraining_loss(graphdef)
    batch = helpers.bert_batch(16, VOCAB)
    mask = np.ones(16, bool)
    mask[[4, 7, 13]] = False  # three padding slots
    # The keys the aggregator gives logical step 0 (rng seed 0), used everywhere here.
    probe = accumulation.DPAggregator(
        accumulation.DPConfig(clip_norm=1.0, noise_multiplier=0.0, expected_batch_size=1.0),
        loss_fn, optax.sgd(1.0))
    key = probe.example_key(probe.init(params, 0))
    per_example = helpers.per_example_grads(loss_fn, params, batch, mask, key)
    return params, loss_fn, batch, mask, key, per_example


def _median_clip(per_example, params, trainable=None) -> float:
    """C = the median of the 13 unclipped norms: 6 above it get clipped, 6 below do not."""
    _, _, norms = helpers.clip_and_sum(per_example, params, math.inf, trainable)
    return float(np.median(norms))


def test_per_example_clipping_matches_per_example_loop(bert):
    """The engine's per-example clipped gradients: norms <= C and sum == brute force."""
    params, loss_fn, batch, mask, key, per_example = bert
    c = _median_clip(per_example, params)
    ref, ref_metrics, ref_norms = helpers.clip_and_sum(per_example, params, c)
    assert sum(n > c * (1 + 1e-6) for n in helpers.clip_and_sum(
        per_example, params, math.inf)[2]) == 6  # 6 of 13 get clipped
    clipper = clipping.VmapClipper(c)
    positions = jnp.arange(16, dtype=jnp.int32)
    clipped, metrics, nonfinite = jax.jit(
        lambda p, b, m: clipper.per_example_clipped(loss_fn, p, b, m, key, positions))(
            params, batch, mask)
    norms = np.sqrt(sum(np.sum(np.square(np.asarray(g, np.float64)).reshape(16, -1), axis=1)
                        for g in clipped))
    assert np.all(norms <= c * (1 + 1e-6)), norms
    # At the bound: the 6 clipped examples and the median one (norm exactly C).
    assert np.sum(norms > c * (1 - 1e-6)) == 7 and np.all(norms[~mask] == 0)
    flags = jax.tree.leaves(trees.resolve_trainable_mask(params, None))
    it = iter(clipped)
    total = jax.tree.unflatten(jax.tree.structure(params),
                               [np.asarray(next(it)).sum(0) for _ in flags])
    helpers.assert_trees_close(total, ref, rtol=1e-6, atol_frac=1e-6)
    assert not np.any(np.asarray(nonfinite))
    assert set(metrics) == {"mlm_loss_sum", "mlm_correct", "mlm_weight", "nsp_loss",
                            "nsp_correct", "count"}
    for k, v in ref_metrics.items():
        np.testing.assert_allclose(float(np.sum(metrics[k])), v, rtol=1e-5)
    assert float(np.sum(metrics["count"])) == mask.sum()


def test_aggregator_on_mesh_with_frozen_word_embedding(bert):
    """One logical batch in 2 calls of 8 on a (data=2, fsdp=2) mesh, 2 microbatches of 4
    per call, noise on, word embedding frozen.

    Expected result, computed without the mesh: sgd+decay step on
    (brute-force clipped sum + the step's noise) / expected_batch_size.
    """
    params, loss_fn, batch, mask, key, per_example = bert
    c = _median_clip(per_example, params, FROZEN)
    ref, _, _ = helpers.clip_and_sum(per_example, params, c, FROZEN)
    mesh = sharding.make_mesh(data=2, fsdp=2, devices=jax.devices()[:4])
    config = accumulation.DPConfig(clip_norm=c, noise_multiplier=0.7, expected_batch_size=12.0,
                                   microbatch_size=4, accumulation_steps=2,
                                   num_shards=sharding.num_batch_shards(mesh))
    opt_config = dict(name="sgd", learning_rate=0.1, warmup_steps=0, total_steps=10,
                      weight_decay=0.01, b1=0.0)
    optimizer = optimizers.make_optimizer(opt_config, params, trainable=FROZEN)
    agg = accumulation.DPAggregator(config, loss_fn, optimizer, trainable=FROZEN)
    state, opt_state = agg.init(params, 0), optimizer.init(params)
    assert bool(jnp.all(agg.example_key(state) == key))

    # Expected: the noisy gradient of the brute-force sum, one optimizer step.
    @jax.jit
    def expected_step(state, opt_state, ref):
        updates, _ = optimizer.update(agg.noisy_gradient(state, ref), opt_state, params)
        return optax.apply_updates(params, updates)

    expected = expected_step(state, opt_state, ref)

    # Shardings as the training loop declares them, so one compilation serves both calls.
    rep = sharding.replicated(mesh)
    p_sh = sharding.param_shardings(params, mesh)
    s_sh = agg.state_sharding(p_sh, rep)
    o_sh = jax.tree.map(lambda _: rep, opt_state)
    p, state, opt_state = (jax.device_put(params, p_sh), jax.device_put(state, s_sh),
                           jax.device_put(opt_state, o_sh))
    step = jax.jit(agg.update, out_shardings=(p_sh, o_sh, s_sh, rep))
    for call in range(2):
        half = slice(8 * call, 8 * call + 8)
        b = {k: jax.device_put(v[half], sharding.batch_sharding(mesh, v.ndim))
             for k, v in batch.items()}
        m = jax.device_put(mask[half], sharding.batch_sharding(mesh))
        p, opt_state, state, metrics = step(state, p, opt_state, b, m)
        assert int(state.step) == call and float(metrics["count"]) == mask[half].sum()
    assert int(state.micro_step) == 0
    got = jax.device_get(p)
    helpers.assert_trees_close(got, expected, rtol=1e-5, atol_frac=1e-6)
    word = lambda t: t["bert"]["embeddings"]["word_embeddings"]["embedding"][...]  # noqa: E731
    np.testing.assert_array_equal(word(got), word(params))
    changed = jax.tree.leaves(jax.tree.map(lambda a, b: bool(np.any(a != b)), got, params))
    flags = jax.tree.leaves(trees.resolve_trainable_mask(params, FROZEN))
    assert changed == flags

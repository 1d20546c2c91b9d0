"""MixedGhostClipper (ghost norms for dense layers and embeddings, book-keeping sum): its
pieces against dense references, its norms against brute force, and the sensitivity bound
of every clipper in float32 and bfloat16.  The clipped-sum equality with VmapClipper (mesh,
dropout, padding, non-finite example, targets, dχ input, frozen parameters) is tested beside
the ghost clipper's, in test_ghost.py."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dpbert.models import losses
from dpbert.models import bert as model_lib
from dpbert.dp import clipping, ghost, mixed_ghost, units
from tests.dpbert.dp import helpers


def test_gram_sq_norm_equals_dense_norm():
    rng = np.random.RandomState(0)
    for tokens, fan_in, fan_out in ((9, 5, 7), (1, 6, 2), (4, 3, 3)):
        a, g = rng.normal(size=(tokens, fan_in)), rng.normal(size=(tokens, fan_out))
        a[1 % tokens] = -a[0]  # cancellation between tokens
        dense = float(np.sum((a.T @ g) ** 2))
        got = float(mixed_ghost.gram_sq_norm(jnp.asarray(a, jnp.float32),
                                             jnp.asarray(g, jnp.bfloat16).astype(jnp.float32)))
        ref = float(np.sum((a.T @ np.asarray(jnp.asarray(g, jnp.bfloat16), np.float64)) ** 2))
        assert got == pytest.approx(ref, rel=1e-5)
        assert ref == pytest.approx(dense, rel=0.05)  # bf16 rounding of g only


def test_rules():
    """auto = flops: Gram form when T (I + O) < I O; bu: when 2 T^2 < I O; or forced."""
    assert mixed_ghost.use_gram(128, 768, 768)          # BERT-base, seq 128
    assert not mixed_ghost.use_gram(128, 128, 128)      # tiny: 32768 > 16384
    assert mixed_ghost.use_gram(1, 128, 2)              # pooled / NSP
    assert not mixed_ghost.use_gram(1024, 768, 768)     # long sequences
    assert mixed_ghost.use_gram(1024, 768, 768, "gram")
    assert not mixed_ghost.use_gram(1, 768, 768, "direct")
    # T = 128, I = O = 256: T (I + O) = I O, so not by flops; 2 T^2 = I O / 2, so by Bu et al.
    assert not mixed_ghost.use_gram(128, 256, 256)
    assert mixed_ghost.use_gram(128, 256, 256, "bu")
    assert not mixed_ghost.use_gram(128, 256, 256, "flops")
    with pytest.raises(ValueError, match="dense_norm='x'"):
        mixed_ghost.use_gram(1, 2, 3, "x")


def test_per_example_norms_equal_brute_force(tiny):
    """Norms over ALL trainable parameters (dense per-example gradients, float64 sum), dropout
    on, colliding embedding rows; every dense kernel in the Gram form."""
    graphdef, params, batch, mask, key, per_example = tiny
    _, _, ref_norms = helpers.clip_and_sum(per_example, params, math.inf)
    clipper = mixed_ghost.MixedGhostClipper(math.inf, dense_norm="gram")
    factored = losses.make_factored_pretraining_loss(graphdef)
    plan = clipper.plan(factored, params, jax.tree.map(lambda x: x[0], batch))
    assert len(plan.gram) == 2 * 6 + 3  # 6 per layer, pooler, MLM transform, NSP
    assert plan.table is not None and plan.position is not None
    positions = jnp.arange(16, dtype=jnp.int32)
    out = jax.jit(lambda p, b, m: clipper.per_example(factored, p, b, m, key, positions))(
        params, batch, mask)
    np.testing.assert_allclose(np.asarray(out["norm"])[mask], ref_norms, rtol=1e-5)
    assert not np.any(np.asarray(out["nonfinite"]))
    # Padding slots: everything zero.
    assert not np.any(np.asarray(out["scale"])[~mask])
    for name in plan.gram:
        assert not np.any(np.asarray(out["g"][name])[~mask])
        assert not np.any(np.asarray(out["a"][name], np.float32)[~mask])


@pytest.mark.parametrize("dtype,clippers", [
    ("float32", ("mixed",)),
    pytest.param("bfloat16", ("vmap", "ghost", "mixed"), marks=pytest.mark.slow)])
def test_each_clipper_adds_at_most_c_per_example(small, dtype, clippers):
    """Single-example batches: ||clipped_sum({i})|| <= C (1 + 1e-6), every example clipped; in
    bfloat16 compute (float32 norms and sums) for vmap, ghost and mixed (vmap and ghost in
    float32: test_bert.py, test_ghost.py); an all-padding batch of non-finite examples adds
    exactly 0."""
    _, params, batch = small
    config = model_lib.BertConfig(vocab_size=helpers.GHOST_VOCAB, hidden_size=32,
                                  num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=64, max_position_embeddings=32, dtype=dtype)
    graphdef = nnx.split(model_lib.create_model(config, seed=1))[0]
    c = 1e-3  # far below every norm: every example is clipped to exactly C
    key = jax.random.PRNGKey(4)
    factored = losses.make_factored_pretraining_loss(graphdef)
    cases = {"vmap": (clipping.VmapClipper(c), losses.make_pretraining_loss(graphdef)),
             "ghost": (ghost.TiedEmbeddingClipper(c), factored),
             "mixed": (mixed_ghost.MixedGhostClipper(c, dense_norm="gram"), factored)}
    sums = {}
    for name in clippers:
        clipper, loss_fn = cases[name]
        fn = jax.jit(lambda p, b, m, clipper=clipper, loss_fn=loss_fn: clipper.clipped_sum(
            loss_fn, p, b, m, key))
        sums[name] = []
        for i in range(8):
            grad_sum, metrics, nonfinite = fn(params, batch, np.arange(8) == i)
            assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(grad_sum))
            norm = float(clipping.global_norm(grad_sum))
            assert c * (1 - 1e-3) < norm <= c * (1 + 1e-6), (name, i, norm / c)
            assert float(metrics["count"]) == 1 and int(nonfinite) == 0
            sums[name].append(np.concatenate([np.ravel(x) for x in jax.tree.leaves(grad_sum)]))
        if name == "mixed":
            bad = dict(batch, masked_lm_weights=np.full_like(batch["masked_lm_weights"], np.nan))
            grad_sum, metrics, nonfinite = fn(params, bad, np.zeros(8, bool))
            assert all(not np.any(np.asarray(x)) for x in jax.tree.leaves(grad_sum))
            assert all(float(v) == 0 for v in metrics.values()) and int(nonfinite) == 0
    # The paths clip the same gradient: directions agree up to bfloat16 rounding.
    for name in set(sums) - {"vmap"} if "vmap" in sums else ():
        for x, y in zip(sums[name], sums["vmap"]):
            cosine = float(np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y)))
            assert cosine > 0.98, (name, cosine)


def test_errors(small):
    graphdef, params, batch = small
    mask = np.ones(8, bool)
    key = jax.random.PRNGKey(0)
    with pytest.raises(TypeError, match="make_factored_pretraining_loss"):
        mixed_ghost.MixedGhostClipper(1.0).clipped_sum(
            losses.make_pretraining_loss(graphdef), params, batch, mask, key)
    factored = losses.make_factored_pretraining_loss(graphdef)
    units_batch = dict(jax.tree.map(lambda x: x.reshape((4, 2) + x.shape[1:]), batch),
                       example_mask=np.ones((4, 2), bool))
    with pytest.raises(TypeError, match="per-unit loss"):
        mixed_ghost.MixedGhostClipper(1.0).clipped_sum(
            units.unit_loss(factored), params, units_batch, mask[:4], key)
    with pytest.raises(ValueError, match="dense_norm='ghost' must be one of"):
        mixed_ghost.MixedGhostClipper(1.0, dense_norm="ghost")
    with pytest.raises(ValueError, match="microbatch_size=3 does not divide"):
        mixed_ghost.MixedGhostClipper(1.0, 3).clipped_sum(factored, params, batch, mask, key)
    with pytest.raises(ValueError, match="clip_norm"):
        mixed_ghost.MixedGhostClipper(-1.0)
    with pytest.raises(ValueError, match="position-embedding table at bert/embeddings"):
        no_position = {k: v for k, v in params.items()}
        no_position["bert"] = dict(params["bert"])
        no_position["bert"]["embeddings"] = {
            k: v for k, v in params["bert"]["embeddings"].items() if k != "position_embeddings"}
        mixed_ghost.MixedGhostClipper(1.0).clipped_sum(factored, no_position, batch, mask, key)


def test_dense_tap_records_inputs_and_adds_probes(small):
    """The tap sees every dense layer once, adds its probe, and leaves the forward exact."""
    graphdef, params, batch = small
    model = nnx.merge(graphdef, params)
    ex = {k: v[:1] for k, v in batch.items()}
    plain = model(ex["input_ids"], ex["segment_ids"], ex["input_mask"],
                  ex["masked_lm_positions"])
    tap = model_lib.DenseTap(model, {"cls/seq_relationship": jnp.array([[1.0, -2.0]])})
    with model_lib.dense_tap(tap):
        tapped = model(ex["input_ids"], ex["segment_ids"], ex["input_mask"],
                       ex["masked_lm_positions"])
    assert len(tap.inputs) == 6 + 3
    assert tap.inputs["bert/encoder/layer/0/output/dense"].shape == (1, 16, 64)
    np.testing.assert_array_equal(np.asarray(tapped.mlm_logits), np.asarray(plain.mlm_logits))
    np.testing.assert_allclose(np.asarray(tapped.nsp_logits - plain.nsp_logits),
                               [[1.0, -2.0]], atol=1e-6)
    with pytest.raises(ValueError, match="called twice"):
        with model_lib.dense_tap(model_lib.DenseTap(model)):
            x = jnp.ones((1, 32))
            model.bert.pooler.dense(x)
            model.bert.pooler.dense(x)

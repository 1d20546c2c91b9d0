"""TiedEmbeddingClipper (ghost norms for BERT's tied word embedding) against the references:
dense numpy norms, brute-force per-example gradients, and VmapClipper on the real loss.

The clipped-sum equality tests also run `MixedGhostClipper` (ghost norms for the dense layers
and the position table too; test_mixed_ghost.py has its own unit tests)."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from dpbert.models import losses
from dpbert.runtime import sharding
from dpbert.dp import clipping, ghost, mixed_ghost, trees
from tests.dpbert.dp import helpers

VOCAB = helpers.GHOST_VOCAB
TABLE = ("bert", "embeddings", "word_embeddings", "embedding")
FROZEN = trees.freeze_paths_containing("word_embeddings")
ghost_batch, with_token_rep = helpers.ghost_batch, helpers.with_token_rep
# Fixtures `tiny` and `small`: tests/dpbert/dp/conftest.py (shared with test_mixed_ghost.py).


def test_embedding_sq_norm_equals_dense_norm():
    """The ghost identity against ||dense G||^2 in float64, with colliding rows."""
    rng = np.random.RandomState(0)
    v, h, s, p = 11, 6, 9, 4
    ids = np.array([3, 5, 3, 0, 10, 5, 5, 7, 3], np.int32)
    xbar, d, f = rng.normal(size=(s, h)), rng.normal(size=(p, v)), rng.normal(size=(p, h))
    d[:, 3] *= 20.0  # a row that is both looked up and strongly predicted
    dense = np.zeros((v, h))
    np.add.at(dense, ids, xbar)
    dense += d.T @ f
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    got = float(ghost.embedding_sq_norm(jnp.asarray(ids), f32(xbar), f32(d), f32(f)))
    assert got == pytest.approx(float(np.sum(dense ** 2)), rel=1e-5)
    got = float(ghost.embedding_sq_norm(None, None, f32(d), f32(f)))
    assert got == pytest.approx(float(np.sum((d.T @ f) ** 2)), rel=1e-5)
    # G = 0 exactly (two uses of one row cancel, no prediction): 0, not NaN from round-off.
    zero = ghost.embedding_sq_norm(jnp.array([2, 2]), f32([[0.1, 0.3], [-0.1, -0.3]]),
                                   jnp.zeros((1, 4)), f32([[1.0, 2.0]]))
    assert float(zero) == 0.0
    bad = ghost.embedding_sq_norm(jnp.array([2]), f32([[np.nan, 0.0]]), jnp.zeros((1, 4)),
                                  f32([[1.0, 2.0]]))
    assert np.isnan(float(bad))


def test_per_example_norms_equal_brute_force(tiny):
    """Norms over ALL trainable parameters (dense per-example gradient, float64 sum), with
    dropout on and the fixture's colliding rows."""
    graphdef, params, batch, mask, key, per_example = tiny
    ids = batch["input_ids"]
    assert all(len(set(r.tolist())) < len(r) for r in ids)  # repeated rows in every example
    assert all(batch["masked_lm_ids"][i, 0] in ids[i] for i in range(len(ids)))
    _, _, ref_norms = helpers.clip_and_sum(per_example, params, math.inf)
    clipper = ghost.TiedEmbeddingClipper(math.inf)
    factored = losses.make_factored_pretraining_loss(graphdef)
    positions = jnp.arange(16, dtype=jnp.int32)
    out = jax.jit(lambda p, b, m: clipper.per_example(factored, p, b, m, key, positions))(
        params, batch, mask)
    np.testing.assert_allclose(np.asarray(out["norm"])[mask], ref_norms, rtol=1e-5)
    assert not np.any(np.asarray(out["nonfinite"]))
    # The table's share of each norm is large: the test is about the ghost part.
    table_sq = [np.sum(np.square(g["bert"]["embeddings"]["word_embeddings"]["embedding"],
                                 dtype=np.float64)) for g, _ in per_example]
    assert min(t / n ** 2 for t, n in zip(table_sq, ref_norms)) > 0.05


def test_clipped_sum_equals_vmap_clipper_on_mesh(tiny):
    """(data=4, fsdp=2) mesh, 8 shards, 2 microbatches of 8, dropout on, 2 padding slots,
    one non-finite example; C = the median norm, so both clip branches are taken."""
    graphdef, params, batch, mask, key, per_example = tiny
    _, _, norms = helpers.clip_and_sum(per_example, params, math.inf)
    c = float(np.median(norms))
    bad = dict(batch, masked_lm_weights=batch["masked_lm_weights"].copy())
    bad["masked_lm_weights"][5, 0] = np.nan  # a non-finite loss, gradient and metric
    mesh = sharding.make_mesh(data=4, fsdp=2)
    rep = sharding.replicated(mesh)
    p_sh = sharding.param_shardings(params, mesh)
    # The table (and the output bias) are split over fsdp along the vocabulary.
    assert p_sh["bert"]["embeddings"]["word_embeddings"]["embedding"].spec[0] == "fsdp"
    args = (jax.device_put(params, p_sh),
            {k: jax.device_put(v, sharding.batch_sharding(mesh, v.ndim)) for k, v in bad.items()},
            jax.device_put(mask, sharding.batch_sharding(mesh)))
    n = sharding.num_batch_shards(mesh)
    factored = losses.make_factored_pretraining_loss(graphdef)
    cases = ((clipping.VmapClipper(c, 8, n), losses.make_pretraining_loss(graphdef)),
             (ghost.TiedEmbeddingClipper(c, 8, n), factored),
             (mixed_ghost.MixedGhostClipper(c, 8, n), factored))
    # One compiled program for the three clippers (one compile, not three): each output is
    # its own clipper's traced computation, placed as the training step places it.
    fn = jax.jit(lambda p, b, m: [clipper.clipped_sum(loss_fn, p, b, m, key, first_position=16)
                                  for clipper, loss_fn in cases],
                 out_shardings=[(p_sh, rep, rep)] * len(cases))
    results = jax.device_get(fn(*args))
    ref, ref_m, ref_nf = results[0]
    for got, got_m, got_nf in results[1:]:
        assert int(ref_nf) == int(got_nf) == 1
        helpers.assert_trees_close(got, ref, rtol=1e-5, atol_frac=1e-6)
        assert ref_m.keys() == got_m.keys()
        for k in ref_m:
            assert np.isfinite(got_m[k])
            np.testing.assert_allclose(got_m[k], ref_m[k], rtol=1e-6)
        assert float(got_m["count"]) == mask.sum() - 1
        assert np.any(got["bert"]["embeddings"]["word_embeddings"]["embedding"][...] != 0)


def _freeze_position_and_query_kernel(path, leaf):
    del leaf
    return not ("position_embeddings" in path or path[-2:] == ("query", "kernel"))


_SLOW = pytest.mark.slow  # ~30 s each on the shared 2-core machine (three compiles)


@pytest.mark.parametrize("target,token_rep,frozen_loss,trainable,dense_norm", [
    # Frozen by the filter: the position table and one Gram-form kernel (its bias trains).
    ("vanilla", False, False, _freeze_position_and_query_kernel, "gram"),
    pytest.param("prob", False, False, None, "auto", marks=_SLOW),
    # token_rep: E reaches the loss through the decoder only; dense kernels by vmap.
    pytest.param("denoising", True, False, None, "direct", marks=_SLOW),
    # The loss stops E's gradient (dχ pretraining); the trainable filter's way:
    # test_frozen_table_either_way_takes_the_vmap_path.
    pytest.param("vanilla", False, True, None, "auto", marks=_SLOW),
])
def test_every_target_input_and_frozen_table(small, target, token_rep, frozen_loss, trainable,
                                             dense_norm):
    """Every example clipped (C far below every norm), so every per-example norm and
    gradient direction enters the sum; dropout off here (the mesh test has it on)."""
    graphdef, params, batch = small
    if token_rep:
        batch = with_token_rep(batch, params)
    mask = np.ones(8, bool)
    mask[6] = False
    key = jax.random.PRNGKey(1)
    kwargs = dict(deterministic=True, mlm_target=target, frozen_word_embedding=frozen_loss)
    c = 1e-4
    factored = losses.make_factored_pretraining_loss(graphdef, **kwargs)
    cases = ((clipping.VmapClipper(c, 4, trainable=trainable),
              losses.make_pretraining_loss(graphdef, **kwargs)),
             (ghost.TiedEmbeddingClipper(c, 4, trainable=trainable), factored),
             (mixed_ghost.MixedGhostClipper(c, 4, trainable=trainable, dense_norm=dense_norm),
              factored))
    # One compiled program for the reference and both ghost clippers (one compile, not three).
    ref, *gots = jax.jit(lambda p, b, m: [clipper.clipped_sum(loss_fn, p, b, m, key)
                                          for clipper, loss_fn in cases])(params, batch, mask)
    assert len(gots) == 2
    for got in gots:
        helpers.assert_trees_close(got[0], ref[0], rtol=1e-5, atol_frac=1e-6)
        for k in ref[1]:
            np.testing.assert_allclose(got[1][k], ref[1][k], rtol=1e-6)
        table = np.asarray(got[0]["bert"]["embeddings"]["word_embeddings"]["embedding"][...])
        assert np.any(table != 0) == (not frozen_loss)
        emb = got[0]["bert"]["embeddings"]
        assert np.any(np.asarray(emb["position_embeddings"]["embedding"]) != 0) == (
            trainable is None)
        # Every example was clipped to norm C: the sum has norm <= 7 C.
        assert 0.5 * c < float(clipping.global_norm(got[0])) <= 7 * c * (1 + 1e-5)


def test_frozen_table_either_way_takes_the_vmap_path(small):
    """Freezing E by the loss or by the trainable filter both mean: no E gradient at all."""
    graphdef, params, _ = small
    for frozen_loss, trainable, trains in ((False, None, True), (True, None, False),
                                           (False, FROZEN, False), (True, FROZEN, False)):
        loss_fn = losses.make_factored_pretraining_loss(graphdef,
                                                        frozen_word_embedding=frozen_loss)
        clipper = ghost.TiedEmbeddingClipper(1.0, trainable=trainable)
        assert clipper.table_gets_gradient(loss_fn, params) == trains


def test_factored_loss_is_the_plain_loss(small):
    """Calling the factored loss is the plain loss; `factored` at x = E[ids] gives the same
    loss, and its pieces assemble the plain gradient of E."""
    graphdef, params, batch = small
    ex = jax.tree.map(lambda x: x[0], batch)
    rng = jax.random.PRNGKey(3)
    plain = losses.make_pretraining_loss(graphdef, deterministic=True)
    factored = losses.make_factored_pretraining_loss(graphdef, deterministic=True)
    table = params["bert"]["embeddings"]["word_embeddings"]["embedding"][...]
    ids = factored.lookup_ids(ex)
    x = jnp.take(table, ids, axis=0)
    probe = factored.zero_probe(ex, VOCAB)

    def everything(params, x, probe):  # one compiled program (one compile, not three)
        plain_loss_and_grads = jax.value_and_grad(lambda p: plain(p, ex, rng)[0])(params)
        called = factored(params, ex, rng)[0]
        pieces = jax.value_and_grad(lambda x, z: factored.factored(params, ex, rng, x, z),
                                    argnums=(0, 1), has_aux=True)(x, probe)
        return plain_loss_and_grads, called, pieces

    (loss, grads), called, ((loss2, (_, f)), (xbar, d)) = jax.jit(everything)(params, x, probe)
    assert float(called) == pytest.approx(float(loss), rel=1e-6)
    np.testing.assert_allclose(float(loss2), float(loss), rtol=1e-6)
    assembled = np.zeros(table.shape)
    np.add.at(assembled, np.asarray(ids), np.asarray(xbar))
    assembled += np.asarray(d).T @ np.asarray(f)
    np.testing.assert_allclose(
        assembled, grads["bert"]["embeddings"]["word_embeddings"]["embedding"][...],
        rtol=1e-4, atol=1e-7)


def test_errors(small):
    graphdef, params, batch = small
    mask = np.ones(8, bool)
    key = jax.random.PRNGKey(0)
    clipper = ghost.TiedEmbeddingClipper(1.0)
    with pytest.raises(TypeError, match="make_factored_pretraining_loss"):
        clipper.clipped_sum(losses.make_pretraining_loss(graphdef), params, batch, mask, key)
    factored = losses.make_factored_pretraining_loss(graphdef)
    with pytest.raises(ValueError, match="expected one parameter at bert/embeddings"):
        clipper.clipped_sum(factored, {"w": jnp.zeros(3)}, batch, mask, key)
    with pytest.raises(ValueError, match="microbatch_size=3 does not divide"):
        ghost.TiedEmbeddingClipper(1.0, 3).clipped_sum(factored, params, batch, mask, key)
    with pytest.raises(ValueError, match="clip_norm"):
        ghost.TiedEmbeddingClipper(0.0)
    with pytest.raises(ValueError, match="unknown MLM target"):
        losses.make_factored_pretraining_loss(graphdef, mlm_target="nope")

"""Clipped per-example gradient sums (dpbert.dp.clipping) against brute-force loops."""

import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from dpbert.dp import clipping, trees
from tests.dpbert.dp import helpers

B = 16
KEY = jax.random.PRNGKey(7)
# Per-example gradient norms of the fixture span ~4 to ~140: C = 20 clips some, not all.
C = 20.0


def _clipped_sum(clipper, params, batch, mask, key=KEY, loss_fn=helpers.mlp_loss):
    fn = jax.jit(lambda p, b, m, k: clipper.clipped_sum(loss_fn, p, b, m, k))
    return fn(params, batch, mask, key)


@pytest.fixture(scope="module")
def setup():
    params = helpers.mlp_params()
    batch = helpers.mlp_batch(B)
    mask = jnp.arange(B) < 13  # 3 padding slots at the end
    return params, batch, mask


def test_matches_brute_force_loop(setup):
    params, batch, mask = setup
    grads, metrics, nonfinite = _clipped_sum(clipping.VmapClipper(C, 4), params, batch, mask)
    ref, ref_metrics, norms = helpers.brute_force_clipped_sum(
        helpers.mlp_loss, params, batch, mask, KEY, C)
    # The test must exercise clipping: some examples above C, some below.
    assert max(norms) <= C * (1 + 1e-6)
    helpers.assert_trees_close(grads, ref)
    assert set(metrics) == set(ref_metrics)
    for k, v in ref_metrics.items():
        assert metrics[k].shape == ()
        np.testing.assert_allclose(float(metrics[k]), v, rtol=1e-6)
    assert int(nonfinite) == 0


def test_fixture_has_clipped_and_unclipped_examples(setup):
    params, batch, mask = setup
    _, _, norms = helpers.brute_force_clipped_sum(
        helpers.mlp_loss, params, batch, mask, KEY, math.inf)
    assert min(norms) < C < max(norms), norms


def test_every_clipped_norm_is_at_most_c(setup):
    params, batch, mask = setup
    clipper = clipping.VmapClipper(0.5)
    positions = jnp.arange(B, dtype=jnp.int32)
    clipped, _, _ = jax.jit(lambda p: clipper.per_example_clipped(
        helpers.mlp_loss, p, batch, mask, KEY, positions))(params)
    norms = np.sqrt(sum(np.sum(np.square(np.asarray(g, np.float64)).reshape(B, -1), axis=1)
                        for g in clipped))
    assert np.all(norms <= 0.5 * (1 + 1e-6)), norms
    assert np.sum(norms > 0.5 * (1 - 1e-6)) >= 5  # many are at the bound
    assert np.all(norms[~np.asarray(mask)] == 0)


def test_padding_contributes_exactly_zero(setup):
    params, batch, mask = setup
    clipper = clipping.VmapClipper(C, 4)
    # Garbage (including NaN / inf) in the padding slots must not change anything.
    junk = jax.tree.map(lambda x: x.at[13:].set(jnp.nan).at[14].set(jnp.inf), batch)
    a = _clipped_sum(clipper, params, batch, mask)
    b = _clipped_sum(clipper, params, junk, mask)
    jax.tree.map(lambda x, y: np.testing.assert_array_equal(np.asarray(x), np.asarray(y)), a, b)
    assert int(b[2]) == 0  # NaNs in padding are not counted as non-finite examples
    # And the same as a batch holding only the real examples (same positions).
    real = jax.tree.map(lambda x: x[:13], batch)
    c = _clipped_sum(clipping.VmapClipper(C), params, real, jnp.ones(13, bool))
    helpers.assert_trees_close(a[0], c[0])
    np.testing.assert_allclose(float(a[1]["count"]), 13.0)


@pytest.mark.parametrize("microbatch_size", [1, 2, 4, None])
def test_microbatch_size_invariance(setup, microbatch_size):
    params, batch, mask = setup
    full = _clipped_sum(clipping.VmapClipper(C, None), params, batch, mask)
    got = _clipped_sum(clipping.VmapClipper(C, microbatch_size), params, batch, mask)
    helpers.assert_trees_close(got[0], full[0])
    for k in full[1]:
        np.testing.assert_allclose(float(got[1][k]), float(full[1][k]), rtol=1e-6)


def test_no_clipping_no_noise_is_plain_summed_gradient(setup):
    params, batch, mask = setup
    grads, _, _ = _clipped_sum(clipping.VmapClipper(math.inf, 4), params, batch, mask)

    def total_loss(p):
        losses = [helpers.mlp_loss(p, jax.tree.map(lambda x: x[i], batch),
                                   jax.random.fold_in(KEY, i))[0] for i in range(13)]
        return sum(losses)

    helpers.assert_trees_close(grads, jax.grad(total_loss)(params), rtol=2e-6)


def test_nonfinite_examples_are_zeroed_and_counted(setup):
    params, batch, mask = setup
    bad = dict(batch, x=batch["x"].at[2, 0].set(jnp.nan).at[5, 1].set(jnp.inf))
    grads, metrics, nonfinite = _clipped_sum(clipping.VmapClipper(C, 4), params, bad, mask)
    assert int(nonfinite) == 2
    keep = mask & ~jnp.isin(jnp.arange(B), jnp.array([2, 5]))
    ref, ref_metrics, _ = helpers.brute_force_clipped_sum(
        helpers.mlp_loss, params, batch, keep, KEY, C)
    helpers.assert_trees_close(grads, ref)
    assert all(np.isfinite(float(v)) for v in metrics.values())
    np.testing.assert_allclose(float(metrics["count"]), 11.0)
    np.testing.assert_allclose(float(metrics["loss_sum"]), ref_metrics["loss_sum"], rtol=1e-6)


def test_per_example_rng_keys_are_distinct_and_positional():
    # loss = <params, u> with u ~ U(0,1) from the example's key: the gradient IS the noise u.
    params = {"w": jnp.zeros((4,))}

    def loss_fn(p, example, rng):
        u = jax.random.uniform(rng, (4,))
        return jnp.sum(p["w"] * u) + 0 * example["x"], {"count": jnp.ones(())}

    batch = {"x": jnp.zeros((8,))}
    clipper = clipping.VmapClipper(math.inf)
    positions = jnp.arange(8, dtype=jnp.int32) + 40
    clipped, _, _ = clipper.per_example_clipped(loss_fn, params, batch, jnp.ones(8, bool),
                                                KEY, positions)
    per_example = np.asarray(clipped[0])
    expected = np.stack([jax.random.uniform(jax.random.fold_in(KEY, 40 + i), (4,))
                         for i in range(8)])
    np.testing.assert_array_equal(per_example, expected)
    assert len({tuple(r) for r in per_example}) == 8


def test_trainable_filter_excludes_frozen_leaves(setup):
    params, batch, mask = setup
    frozen = trees.freeze_paths_containing("l1")
    grads, _, _ = _clipped_sum(clipping.VmapClipper(C, 4, trainable=frozen),
                               params, batch, mask)
    assert not np.any(np.asarray(grads["l1"]["kernel"]))
    assert not np.any(np.asarray(grads["l1"]["bias"]))
    ref, _, norms = helpers.brute_force_clipped_sum(
        helpers.mlp_loss, params, batch, mask, KEY, C, trainable=frozen)
    helpers.assert_trees_close(grads, ref)
    # Norms were computed over the trainable leaves only: the l2 gradient alone reaches C.
    assert max(norms) > 0.999 * C
    # A mask pytree works the same as the predicate.
    mask_tree = {"l1": {"kernel": False, "bias": False}, "l2": {"kernel": True, "bias": True}}
    grads2, _, _ = _clipped_sum(clipping.VmapClipper(C, 4, trainable=mask_tree),
                                params, batch, mask)
    helpers.assert_trees_close(grads2, grads)


@pytest.mark.parametrize("kwargs, batch_size, match", [
    (dict(microbatch_size=3), 16, "does not divide"),
    (dict(microbatch_size=4, num_shards=8), 16, "not a multiple of num_shards"),
])
def test_layout_errors(kwargs, batch_size, match):
    with pytest.raises(ValueError, match=match):
        clipping.VmapClipper(C, **kwargs).layout(batch_size)


def test_config_errors(setup):
    params, batch, mask = setup
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="clip_norm"):
            clipping.VmapClipper(bad)
    with pytest.raises(ValueError, match="microbatch_size"):
        clipping.VmapClipper(C, 0)
    with pytest.raises(ValueError, match="leading axis"):
        clipping.VmapClipper(C).clipped_sum(helpers.mlp_loss, params, batch,
                                              jnp.ones(8, bool), KEY)
    with pytest.raises(ValueError, match="leaves"):
        clipping.VmapClipper(C, trainable={"l1": True}).clipped_sum(
            helpers.mlp_loss, params, batch, mask, KEY)


def _loop_bodies_with_all_reduce(hlo: str) -> list[str]:
    """Names of while-loop body computations that contain an all-reduce."""
    bodies = set(re.findall(r"while\(.*?body=%?([\w.\-]+)", hlo))
    found = []
    for name, text in re.findall(r"\n%?([\w.\-]+) [^\n]*\{\n(.*?)\n\}", hlo, re.S):
        if name in bodies and "all-reduce" in text:
            found.append(name)
    return found


@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit])
def test_sharded_on_8_devices_matches_single_device(setup, axis_type):
    assert jax.device_count() == 8
    params, _, _ = setup
    n = 32
    batch = helpers.mlp_batch(n, seed=3)
    mask = jnp.arange(n) < 29
    single = _clipped_sum(clipping.VmapClipper(C, 8), params, batch, mask)
    mesh = jax.make_mesh((8,), ("data",), axis_types=(axis_type,))
    shard = NamedSharding(mesh, P("data"))
    rep = NamedSharding(mesh, P())
    args = (jax.device_put(params, rep), jax.device_put(batch, shard),
            jax.device_put(mask, shard))
    for num_shards in (1, 8):
        clipper = clipping.VmapClipper(C, 8, num_shards=num_shards)
        fn = jax.jit(lambda p, b, m: clipper.clipped_sum(helpers.mlp_loss, p, b, m, KEY),
                     out_shardings=rep)
        with jax.set_mesh(mesh):
            got = fn(*args)
            hlo = fn.lower(*args).compile().as_text()
        helpers.assert_trees_close(got[0], single[0])
        np.testing.assert_allclose(float(got[1]["loss_sum"]), float(single[1]["loss_sum"]),
                                   rtol=1e-6)
        if num_shards == 8:
            # Per-shard partial sums: no cross-device reduction inside the microbatch loop.
            assert _loop_bodies_with_all_reduce(hlo) == []
        else:
            # Sanity check of the HLO parsing: summing over the sharded axis inside
            # the loop does all-reduce every iteration.
            assert _loop_bodies_with_all_reduce(hlo)


@pytest.mark.parametrize("one_device", [True, False])
def test_all_finite_finds_every_non_finite_value(one_device):
    """Issue 32: the training loop's check of its parameters, one reduction over a float32
    concatenation on one device, one per leaf on a mesh; both must find a NaN, +inf or -inf
    anywhere, in any float dtype."""
    tree = {"a": jnp.ones((3, 4)), "b": [jnp.zeros((5,), jnp.bfloat16), jnp.ones((), jnp.float16)],
            "c": jnp.arange(6, dtype=jnp.int32).reshape(2, 3)}
    check = jax.jit(lambda t: trees.all_finite(t, one_device=one_device))
    assert bool(check(tree))
    leaves, treedef = jax.tree.flatten(tree)
    for i, leaf in enumerate(leaves):
        if not jnp.issubdtype(leaf.dtype, jnp.floating):
            continue
        for bad in (jnp.nan, jnp.inf, -jnp.inf):
            spoiled = list(leaves)
            spoiled[i] = leaf.reshape(-1).at[leaf.size - 1].set(bad).reshape(leaf.shape)
            assert not bool(check(jax.tree.unflatten(treedef, spoiled))), (i, bad)
    assert bool(trees.all_finite({}, one_device=one_device))


def test_all_finite_on_a_mesh_gathers_nothing():
    """On a mesh the leaves are checked one by one: their concatenation would gather every
    sharded leaf onto every device."""
    mesh = jax.make_mesh((2, 4), ("data", "fsdp"), axis_types=(AxisType.Auto,) * 2,
                         devices=jax.devices()[:8])
    tree = {"w": jax.device_put(jnp.ones((8, 16)), NamedSharding(mesh, P("fsdp", None))),
            "v": jax.device_put(jnp.ones((16, 8)), NamedSharding(mesh, P(None, "fsdp")))}
    check = jax.jit(lambda t, one: trees.all_finite(t, one_device=one), static_argnums=1)
    assert bool(check(tree, False)) and bool(check(tree, True))
    assert not bool(check(dict(tree, v=tree["v"].at[3, 5].set(jnp.nan)), False))
    per_leaf = check.lower(tree, False).compile().as_text()
    assert not re.search(r"all-gather|all-to-all", per_leaf)
    # The reason for the branch: the one-device form, run on a mesh, gathers.
    assert re.search(r"all-gather|all-to-all", check.lower(tree, True).compile().as_text())


@pytest.mark.parametrize("num_shards", [1, 2])
def test_the_non_private_gradient_flags_a_non_finite_batch(setup, num_shards):
    """`BatchGradient` (dp.clipping="none") sums the batch gradient unclipped; num_nonfinite is
    1 when any of it is not finite (the signal to stop the run)."""
    params, batch, mask = setup
    clipper = clipping.get_clipper("none").make(math.inf, 4, num_shards, None)
    loss = clipping.batch_loss(helpers.mlp_loss)
    grads, metrics, nonfinite = _clipped_sum(clipper, params, batch, mask, loss_fn=loss)
    assert int(nonfinite) == 0 and float(metrics["count"]) == 13.0
    ref = jax.grad(lambda p: sum(helpers.mlp_loss(p, jax.tree.map(lambda x: x[i], batch),
                                                  jax.random.fold_in(KEY, i))[0]
                                 for i in range(13)))(params)
    helpers.assert_trees_close(grads, ref, rtol=2e-6)
    for bad in (jnp.nan, jnp.inf):
        spoiled = dict(batch, x=batch["x"].at[6, 1].set(bad))
        assert int(_clipped_sum(clipper, params, spoiled, mask, loss_fn=loss)[2]) == 1, bad
    # A padding slot's value does not count (under jit XLA turns `losses * mask` into a
    # select, in the loss and in its gradient: a NaN in a padding slot does not reach either).
    padded = dict(batch, y=batch["y"].at[14].set(jnp.nan))
    assert int(_clipped_sum(clipper, params, padded, mask, loss_fn=loss)[2]) == 0

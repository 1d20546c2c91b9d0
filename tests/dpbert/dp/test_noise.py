"""Gaussian noise: exact std on 1 and 8 devices, per-shard mode, key uniqueness, dtype."""

import itertools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P
from scipy import stats

from dpbert import prng
from dpbert.dp import accumulation, noise, trees
from tests.dpbert.dp import helpers

SIGMA, C = 1.3, 0.7
N = 48_000  # samples per KS test: D_crit(1e-3) ~ 0.009; 0.67x / 1.5x give D ~ 0.12 / 0.16
E = 12.0  # expected batch size


def _aggregator(**overrides):
    kwargs = dict(clip_norm=C, noise_multiplier=SIGMA, expected_batch_size=E)
    kwargs.update(overrides)
    return accumulation.DPAggregator(accumulation.DPConfig(**kwargs), helpers.mlp_loss,
                                     optax.sgd(1.0))


def _noise(agg, zeros, steps=(0,)):
    """The noise the aggregator adds at logical steps `steps`, on a zero clipped sum."""
    state = agg.init(zeros, 0)
    fn = jax.jit(lambda s, z: jax.tree.map(lambda g: g * E, agg.noisy_gradient(s, z)))
    outs = [fn(state.replace(step=jnp.int32(t)), zeros) for t in steps]
    return outs[0] if len(outs) == 1 else outs


def _assert_std(x: np.ndarray, std: float):
    x = np.asarray(x, np.float64).ravel()
    assert stats.kstest(x, "norm", args=(0.0, std)).pvalue > 1e-3
    assert stats.kstest(x, "norm", args=(0.0, 0.67 * std)).pvalue < 1e-12
    assert stats.kstest(x, "norm", args=(0.0, 1.5 * std)).pvalue < 1e-12


def test_ks_std_sigma_c_on_one_device():
    zeros = {"w": jnp.zeros((N,), jnp.float32)}
    x = _noise(_aggregator(), zeros)["w"]
    assert x.dtype == jnp.float32
    _assert_std(x, SIGMA * C)


@pytest.mark.parametrize("axis_type", [AxisType.Auto, AxisType.Explicit])
def test_ks_std_sigma_c_on_8_devices_global_mode(axis_type):
    """One global draw: same values as on one device, total std sigma*C (not sigma*C*sqrt(8))."""
    mesh = jax.make_mesh((8,), ("data",), axis_types=(axis_type,))
    zeros = {"w": jnp.zeros((8, N // 8), jnp.float32)}
    agg = _aggregator(num_shards=8)
    single = np.asarray(_noise(agg, zeros)["w"])
    sharded_zeros = jax.device_put(zeros, NamedSharding(mesh, P("data")))
    with jax.set_mesh(mesh):
        out = _noise(agg, sharded_zeros)["w"]
    assert len(out.sharding.device_set) == 8 and not out.sharding.is_fully_replicated
    x = np.asarray(out)
    # Same random bits as one device (the float transform may differ by an ulp).
    np.testing.assert_allclose(x, single, rtol=1e-6, atol=1e-7)
    _assert_std(x, SIGMA * C)
    # Every shard drew different values (no key shared between devices).
    for i, j in itertools.combinations(range(8), 2):
        assert abs(np.corrcoef(x[i], x[j])[0, 1]) < 0.07
        assert not np.any(x[i] == x[j])


def test_per_shard_mode_std_is_sigma_c_sqrt_p():
    zeros = {"w": jnp.zeros((N,), jnp.float32)}
    agg = _aggregator(noise_mode="per_shard", num_shards=8)
    assert agg.config.noise_stddev == pytest.approx(SIGMA * C * math.sqrt(8))
    x = np.asarray(_noise(agg, zeros)["w"])
    _assert_std(x, SIGMA * C * math.sqrt(8))
    assert stats.kstest(x, "norm", args=(0.0, SIGMA * C)).pvalue < 1e-12


def test_noise_never_repeats_across_steps_and_leaves():
    zeros = {"a": jnp.zeros((5000,)), "b": jnp.zeros((5000,)), "c": jnp.zeros((50, 100))}
    agg = _aggregator()
    blocks = []
    for out in _noise(agg, zeros, steps=range(4)):
        blocks += [np.asarray(v).ravel() for v in jax.tree.leaves(out)]
    for x, y in itertools.combinations(blocks, 2):
        assert abs(np.corrcoef(x, y)[0, 1]) < 0.07  # ~5 sigma for n = 5000
        assert np.mean(x == y) < 1e-3
    # The keys themselves: noise keys differ across 1000 steps and from example keys.
    state = agg.init(zeros, 0)
    steps = jnp.arange(1000, dtype=jnp.int32)
    keys = jax.jit(jax.vmap(lambda t: (agg.noise_key(state.replace(step=t)),
                                       agg.example_key(state.replace(step=t)))))(steps)
    noise_keys, example_keys = ({tuple(k) for k in np.asarray(ks)} for ks in keys)
    assert len(noise_keys) == 1000 and len(example_keys) == 1000
    assert not noise_keys & example_keys
    # Bit for bit the derivation the module documents, with jax.random's own fold_in
    # (the aggregator computes it with prng.fold_in: one fusion instead of JAX's threefry loop).
    ref = jax.vmap(lambda t: (
        jax.random.fold_in(state.noise_key, t),
        jax.random.fold_in(jax.random.fold_in(state.rng, 0), t)))(steps)
    for got, want in zip(keys, ref):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def test_noise_is_float32_on_the_float32_sum_only():
    key = jax.random.PRNGKey(0)
    with pytest.raises(TypeError, match="float32"):
        noise.add_noise({"w": jnp.zeros((4,), jnp.bfloat16)}, key, 1.0)
    out = noise.add_noise({"w": jnp.ones((4,), jnp.float32)}, key, 0.5)
    assert out["w"].dtype == jnp.float32
    # sigma = 0: exactly the input.
    x = {"w": jnp.arange(4.0)}
    np.testing.assert_array_equal(noise.add_noise(x, key, 0.0)["w"], x["w"])


@pytest.mark.parametrize("typed", [False, True])
@pytest.mark.parametrize("value", [0.0, -3.5, math.nan, math.inf, -math.inf])
def test_the_noise_key_waits_for_the_sum_without_changing_a_bit(typed, value):
    """`add_noise` ties the key to the sum (so XLA draws the noise after the backward pass);
    the key's bits, hence the noise, are the same whatever the sum holds, NaN and inf too."""
    key = jax.random.key(5) if typed else jax.random.PRNGKey(5)
    x = jnp.full((3, 4), value, jnp.float32)
    after = jax.jit(noise._after)(key, x)
    data = (lambda k: jax.random.key_data(k)) if typed else (lambda k: k)  # noqa: E731
    np.testing.assert_array_equal(np.asarray(data(after)), np.asarray(data(key)))
    if typed:
        assert jax.random.key_impl(after) == jax.random.key_impl(key)
    # The whole path: finite sums get exactly sum + the draw of the untied key.
    tree = {"big": jnp.arange(12.0).reshape(3, 4), "small": jnp.full((2,), 7.0)}
    got = jax.jit(lambda t: noise.add_noise(t, key, 1.5))(tree)
    want = jax.jit(lambda t: jax.tree.map(jnp.add, t, noise.gaussian_noise(t, key, 1.5)))(tree)
    for k in tree:
        np.testing.assert_array_equal(np.asarray(got[k]), np.asarray(want[k]))


def test_the_noise_is_not_held_through_the_backward_pass():
    """Compile-only: a DP step's temp memory is the same with noise as without (the draw
    waits for the clipped sum).  Without the tie (`_after` an identity) XLA draws the noise
    during the backward pass of this step and holds a parameter-sized buffer there (+2 MiB,
    the parameters' size; BERT-base: +838 MiB)."""
    t, d, f = 64, 256, 1024

    def loss(p, ex, rng):
        h = jax.nn.gelu(ex["x"] @ p["w1"])
        h = jnp.where(jax.random.bernoulli(rng, 0.9, h.shape), h / 0.9, 0.0)
        err = jnp.mean((jnp.tanh(h @ p["w2"]) - ex["x"]) ** 2)
        return err, {"loss_sum": err}

    params = {"w1": jax.ShapeDtypeStruct((d, f), jnp.float32),
              "w2": jax.ShapeDtypeStruct((f, d), jnp.float32)}
    batch = {"x": jax.ShapeDtypeStruct((32, t, d), jnp.float32)}
    mask = jax.ShapeDtypeStruct((32,), jnp.bool_)
    opt = optax.adamw(1e-3)

    def temp(sigma):
        agg = accumulation.DPAggregator(accumulation.DPConfig(1.0, sigma, 32.0), loss, opt)
        state = jax.eval_shape(lambda p: agg.init(p, 0), params)
        compiled = jax.jit(agg.update, donate_argnums=(1, 2)).lower(
            state, params, jax.eval_shape(opt.init, params), batch, mask).compile()
        return compiled.memory_analysis().temp_size_in_bytes

    param_bytes = 4 * 2 * d * f
    assert temp(1.0) - temp(0.0) < 0.25 * param_bytes


def test_frozen_leaves_get_no_noise():
    tree = {"frozen": jnp.zeros((100,)), "train": jnp.zeros((100,))}
    out = noise.add_noise(tree, jax.random.PRNGKey(0), 1.0,
                          trees.freeze_paths_containing("frozen"))
    assert not np.any(np.asarray(out["frozen"]))
    assert np.all(np.asarray(out["train"]) != 0)


@pytest.mark.parametrize("args, match", [
    ((1.0, -1.0), "noise_multiplier"),
    ((1.0, math.inf), "noise_multiplier"),
    ((0.0, 1.0), "clip_norm"),
    ((math.inf, 1.0), "infinite"),
    ((1.0, 1.0, "sharded"), "noise_mode"),
    ((1.0, 1.0, "per_shard", 0), "num_shards"),
])
def test_noise_stddev_errors(args, match):
    with pytest.raises(ValueError, match=match):
        noise.noise_stddev(*args)


def test_noise_stddev_values():
    assert noise.noise_stddev(2.0, 1.5) == 3.0
    assert noise.noise_stddev(2.0, 1.5, "per_shard", 4) == 6.0
    assert noise.noise_stddev(math.inf, 0.0) == 0.0  # non-private test configuration


def _layout_case():
    from dpbert.runtime import sharding

    mesh = sharding.make_mesh(4, 2)
    rep = sharding.replicated(mesh)
    tree = {"a": jax.random.normal(jax.random.key(1), (64, 24)),
            "b": jax.random.normal(jax.random.key(2), (7,)),
            "c": jax.random.normal(jax.random.key(3), (3, 16)),
            "d": jax.random.normal(jax.random.key(4), (16, 8))}
    shardings = {"a": rep, "b": rep, "c": rep, "d": NamedSharding(mesh, P("fsdp"))}
    tree = jax.device_put(tree, shardings)
    return mesh, tree, shardings, sharding.noise_layouts(shardings, tree)


def test_noise_layouts_split_only_replicated_parameters():
    mesh, _, shardings, layouts = _layout_case()
    assert layouts["a"].spec == P(("data", "fsdp"))
    assert layouts["c"].spec == P(None, ("data", "fsdp"))
    assert layouts["b"] is None   # no axis divides 8
    assert layouts["d"] is None   # sharded: its noise is drawn in its own layout
    from dpbert.runtime import sharding

    one = sharding.make_mesh(1, 1, devices=jax.devices()[:1])
    rep1 = sharding.replicated(one)
    assert sharding.noise_layouts({"a": rep1}, {"a": jnp.zeros((64, 24))}) == {"a": None}


@pytest.mark.parametrize("trainable", [None, {"a": True, "b": True, "c": False, "d": True}])
def test_adding_the_noise_to_slices_of_the_sum_leaves_every_bit_unchanged(trainable):
    """The layouts of `sharding.noise_layouts` change where the noise is drawn and added,
    never the noisy sum: bitwise equal to the plain add_noise, and replicated again."""
    mesh, tree, shardings, layouts = _layout_case()
    key = jax.random.key(11)
    plain = jax.jit(lambda t: noise.add_noise(t, key, 2.5, trainable),
                    out_shardings=shardings)(tree)
    fn = jax.jit(lambda t: noise.add_noise(t, key, 2.5, trainable, layouts),
                 out_shardings=shardings)
    spread = fn(tree)
    for k in tree:
        np.testing.assert_array_equal(np.asarray(plain[k]), np.asarray(spread[k]))
        assert spread[k].sharding.is_equivalent_to(shardings[k], tree[k].ndim)
    if trainable is not None:
        np.testing.assert_array_equal(np.asarray(spread["c"]), np.asarray(tree["c"]))
    # Each device draws 1/8 of a's noise: the compiled program gathers the noisy slices.
    assert "all-gather" in fn.lower(tree).compile().as_text()
    assert "all-gather" not in jax.jit(lambda t: noise.add_noise(t, key, 2.5, trainable),
                                       out_shardings=shardings).lower(tree).compile().as_text()
    with pytest.raises(ValueError, match="noise layouts have 3 leaves"):
        noise.add_noise(tree, key, 2.5, None, [None] * 3)


@pytest.mark.parametrize("shape", [(), (1,), (7, 3, 5), (4099,), (98, 32)])
def test_fast_threefry_normal_is_jax_random_normal_bitwise(shape):
    """The unrolled generator draws exactly jax.random.normal's values (raw and typed keys),
    so the KS tests above are about the same numbers jax.random would give."""
    fast_fn = jax.jit(lambda k: noise.threefry_normal(k, shape))
    ref_fn = jax.jit(lambda k: jax.random.normal(k, shape, jnp.float32))
    for key in (jax.random.PRNGKey(5), jax.random.key(123), jax.random.fold_in(
            jax.random.PRNGKey(0), 2 ** 31 + 7)):
        fast, ref = fast_fn(key), ref_fn(key)
        assert fast.dtype == jnp.float32 and fast.shape == shape
        np.testing.assert_array_equal(np.asarray(fast), np.asarray(ref))


def test_fast_threefry_normal_sharded_over_8_devices_is_the_same_draw():
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
    key = jax.random.PRNGKey(9)
    ref = np.asarray(jax.random.normal(key, (64, 40), jnp.float32))
    sh = NamedSharding(mesh, P("data"))
    with jax.set_mesh(mesh):
        out = jax.jit(lambda k: noise.threefry_normal(k, (64, 40), sh))(key)
    assert out.sharding.spec == P("data", None)
    np.testing.assert_array_equal(np.asarray(out), ref)


@pytest.mark.parametrize("trainable", [None, {"a": True, "b": False, "c": True, "d": True}])
@pytest.mark.parametrize("generator", ["auto", "unrolled", "kernel", "jax"])
def test_one_flat_draw_and_every_generator_give_the_same_noise_bit_for_bit(
        trainable, generator, monkeypatch, request):
    """`flat` (one draw for all leaves, `prng.standard_normal_segments`) and the leaf-by-leaf
    draw, with the default generator (here the unrolled one), the unrolled generator, JAX's
    threefry primitive or jax.random (DPBERT_PRNG), draw the same noise, that of
    ``jax.random.normal(fold_in(key, i), leaf.shape)`` on leaf i, and the same noisy sum as the
    default leaf by leaf."""
    lowering = jax.config.jax_threefry_gpu_kernel_lowering  # "kernel" turns it on
    request.addfinalizer(lambda: jax.config.update("jax_threefry_gpu_kernel_lowering", lowering))
    tree = {"a": jnp.zeros((5, 7)), "b": jnp.zeros((3,)), "c": jnp.ones(()),
            "d": jnp.full((4099,), 2.0)}
    for key in (jax.random.PRNGKey(5), jax.random.key(123)):
        want = [jax.jit(lambda k, s=x.shape: 1.7 * jax.random.normal(k, s))(
                    jax.random.fold_in(key, i))
                if trainable is None or trainable[k] else jnp.zeros_like(x)
                for i, (k, x) in enumerate(sorted(tree.items()))]
        today = jax.jit(lambda t, k: noise.add_noise(t, k, 1.7, trainable))(tree, key)
        monkeypatch.setenv(prng.GENERATOR_ENV, generator)
        for flat in (False, True):
            drawn = jax.jit(lambda t, k: noise.gaussian_noise(t, k, 1.7, trainable, flat=flat))(
                tree, key)
            added = jax.jit(lambda t, k: noise.add_noise(t, k, 1.7, trainable, flat=flat))(
                tree, key)
            for x, w, d, a, b in zip(jax.tree.leaves(tree), want, jax.tree.leaves(drawn),
                                     jax.tree.leaves(added), jax.tree.leaves(today)):
                np.testing.assert_array_equal(np.asarray(d), np.asarray(w))
                # Leaf by leaf, XLA fuses the draw into the add (on the CPU a multiply-add of
                # one rounding); the flat draw (not with "jax") is added as drawn: sum + noise,
                # rounded once more (at most 1 ulp apart; the noise itself is the same).
                one_draw = flat and generator != "jax"
                np.testing.assert_array_equal(
                    np.asarray(a), np.asarray(jax.jit(jnp.add)(x, d) if one_draw else b))
        monkeypatch.delenv(prng.GENERATOR_ENV)


def test_the_flat_draw_is_one_copy_of_the_generator():
    """One unrolled generator in the compiled program, whatever the number of leaves."""
    tree = {f"w{i}": jnp.zeros((16 + i, 8)) for i in range(12)}
    key = jax.random.PRNGKey(1)

    def rotations(flat):
        text = jax.jit(lambda t, k: noise.add_noise(t, k, 1.0, flat=flat)).lower(
            tree, key).compile().as_text()
        return text.count("shift-left(")

    assert rotations(True) * 4 < rotations(False)


@pytest.mark.parametrize("one_gpu", [False, True])
@pytest.mark.parametrize("sizes", [(1, 0, 3000, 17), (17, 3000, 17, 1, 3000, 17)])
def test_the_segments_are_jax_random_normal_of_their_keys(sizes, one_gpu, monkeypatch):
    """Segments of a size no other has (sliced at constant offsets) and of shared sizes (sliced
    at offsets carried through the loop; on one GPU at constant offsets, the loop carrying
    nothing) alike."""
    monkeypatch.setenv(prng.GENERATOR_ENV, "unrolled")  # the layout alone follows `_one_gpu`
    monkeypatch.setattr(prng, "_one_gpu", lambda: one_gpu)
    keys = jax.random.split(jax.random.PRNGKey(3), len(sizes))
    draw = lambda k: prng.standard_normal_segments(k, sizes, loops=3)  # noqa: E731
    (scan,) = [e for e in jax.make_jaxpr(draw)(keys).eqns if e.primitive.name == "scan"]
    shared = sum(sizes.count(n) > 1 for n in sizes)
    assert scan.params["num_carry"] == (0 if one_gpu else shared)
    for loops in (1, 3, 16):
        got = jax.jit(lambda k: prng.standard_normal_segments(k, sizes, loops=loops))(keys)
        for k, n, g in zip(keys, sizes, got):
            assert g.shape == (n,) and g.dtype == jnp.float32
            np.testing.assert_array_equal(np.asarray(g), np.asarray(jax.random.normal(k, (n,))))


def _fusions(text: str) -> list[str]:
    """The fused computations of an optimized HLO text, names and metadata stripped."""
    bodies = re.findall(r"^%fused_computation[^\n]*\{\n(.*?)^\}", text, re.M | re.S)
    strip = lambda b: re.sub(r"%[\w.\-]+|, metadata=\{[^}]*\}", "%", b)  # noqa: E731
    return [strip(b) for b in bodies]


def test_the_flat_draw_gives_leaves_of_one_shape_one_fused_computation():
    """Leaves of one shape take their noise with the same fused computation (XLA:CPU compiles
    it once; issue 32): no leaf's offset is a constant in its consumer's code.  With the
    offsets as constants (the hand-out before) every leaf had its own."""
    tree = {f"w{i}": jnp.ones((64, 32)) for i in range(8)}
    key = jax.random.PRNGKey(1)
    text = jax.jit(lambda t, k: jax.tree.map(lambda x: x * 0.5, noise.add_noise(
        t, k, 1.0, flat=True))).lower(tree, key).compile().as_text()
    consumers = [b for b in _fusions(text) if "f32[64,32]" in b and "dynamic-slice" in b]
    assert len(consumers) >= len(tree) and len(set(consumers)) == 1


def test_an_unknown_generator_is_an_error(monkeypatch):
    monkeypatch.setenv(prng.GENERATOR_ENV, "philox")
    with pytest.raises(ValueError, match="DPBERT_PRNG"):
        prng.standard_normal(jax.random.PRNGKey(0), (3,))


@pytest.mark.parametrize("strategy", [None, (0.8, 0.6)])
@pytest.mark.parametrize("flat", [False, True])
def test_the_noise_std_as_an_argument_makes_one_program_for_every_sigma(strategy, flat):
    """`update`'s noise_stddev (the training loop passes it): the program holds no sigma, so
    aggregators of two sigmas lower to the same program (the persistent cache's key); the one
    compiled program gives the constant std's noise (to float rounding), exactly twice it for
    twice the std, std sigma * C (KS); with sigma = 0 in the config it draws nothing."""
    zeros = {"w": jnp.zeros((N,), jnp.float32), "b": jnp.zeros((7, 3), jnp.float32)}

    def make(sigma):
        agg = _aggregator(noise_multiplier=sigma, strategy=strategy)
        agg.noise_flat = flat
        return agg

    def lowered(agg, argument: bool):
        fn = (lambda s, z, sd: agg.noisy_gradient(s, z, sd)) if argument else (
            lambda s, z, sd: agg.noisy_gradient(s, z))
        return jax.jit(fn).lower(agg.init(zeros, 0), zeros, agg.stddev_argument())

    agg, other = make(SIGMA), make(2.1)
    assert lowered(agg, True).as_text() == lowered(other, True).as_text()
    assert lowered(agg, False).as_text() != lowered(other, False).as_text()  # the control

    state = agg.init(zeros, 0)
    compiled = jax.jit(lambda s, z, sd: jax.tree.map(
        lambda g: g * E, agg.noisy_gradient(s, z, sd))).lower(
            state, zeros, agg.stddev_argument()).compile()
    std = agg.stddev_argument()
    assert std.dtype == np.float32 and float(std) == pytest.approx(SIGMA * C)
    once, twice = compiled(state, zeros, std), compiled(state, zeros, 2 * std)
    constant = _noise(agg, zeros)
    for c, o, t in zip(jax.tree.leaves(constant), jax.tree.leaves(once),
                       jax.tree.leaves(twice)):
        np.testing.assert_allclose(np.asarray(o), np.asarray(c), rtol=2e-6, atol=1e-7)
        np.testing.assert_array_equal(np.asarray(t), 2 * np.asarray(o))
    if strategy is None:
        _assert_std(once["w"], SIGMA * C)
    silent = make(0.0)
    out = jax.jit(lambda s, z, sd: silent.noisy_gradient(s, z, sd))(
        silent.init(zeros, 0), zeros, np.float32(1.0))
    assert all(not np.any(np.asarray(x)) for x in jax.tree.leaves(out))

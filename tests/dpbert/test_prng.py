"""dpbert.prng: the unrolled threefry gives jax.random's bits, and its Dropout nnx.Dropout's."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

from dpbert.models import bert as model_lib
from dpbert import prng

SHAPES = [(), (1,), (7, 3, 5), (4099,), (2, 3, 128, 128)]


def _keys():
    return (jax.random.PRNGKey(5), jax.random.key(123),
            jax.random.fold_in(jax.random.PRNGKey(0), 2 ** 31 + 7))


@pytest.mark.parametrize("shape", SHAPES)
def test_random_bits_are_jax_random_bits(shape):
    fast_fn = jax.jit(lambda k: prng.random_bits(k, shape))
    ref_fn = jax.jit(lambda k: jax.random.bits(k, shape, jnp.uint32))
    for key in _keys():
        fast = fast_fn(key)
        assert fast.dtype == jnp.uint32 and fast.shape == shape
        np.testing.assert_array_equal(np.asarray(fast), np.asarray(ref_fn(key)))


@pytest.mark.parametrize("p", [0.9, 0.5, 0.0, 1.0, 1e-7])
def test_bernoulli_is_jax_random_bernoulli(p):
    shape = (5, 64, 33)
    for key in _keys():
        fast = jax.jit(lambda k: prng.bernoulli(k, p, shape))(key)
        ref = jax.jit(lambda k: jax.random.bernoulli(k, p, shape))(key)
        assert fast.dtype == jnp.bool_
        np.testing.assert_array_equal(np.asarray(fast), np.asarray(ref))


def test_vmapped_keys_give_each_key_its_own_stream():
    keys = jax.random.split(jax.random.key(7), 6)
    fast = jax.jit(jax.vmap(lambda k: prng.bernoulli(k, 0.8, (9, 11))))(keys)
    ref = jax.vmap(lambda k: jax.random.bernoulli(k, 0.8, (9, 11)))(keys)
    np.testing.assert_array_equal(np.asarray(fast), np.asarray(ref))
    assert len({np.asarray(row).tobytes() for row in fast}) == len(keys)


def test_sharded_bits_over_8_devices_are_the_same_draw():
    mesh = jax.make_mesh((8,), ("data",), axis_types=(AxisType.Explicit,))
    key = jax.random.key(9)
    sh = NamedSharding(mesh, P("data"))
    with jax.set_mesh(mesh):
        out = jax.jit(lambda k: prng.random_bits(k, (64, 40), sh))(key)
    assert out.sharding.spec == P("data", None)
    np.testing.assert_array_equal(np.asarray(out),
                                  np.asarray(jax.random.bits(key, (64, 40), jnp.uint32)))


def test_other_key_types_go_to_jax_random():
    key = jax.random.key(3, impl="rbg")
    np.testing.assert_array_equal(np.asarray(prng.random_bits(key, (4, 5))),
                                  np.asarray(jax.random.bits(key, (4, 5), jnp.uint32)))
    np.testing.assert_array_equal(np.asarray(prng.standard_normal(key, (4, 5))),
                                  np.asarray(jax.random.normal(key, (4, 5))))
    np.testing.assert_array_equal(np.asarray(prng.bernoulli(key, 0.3, (4, 5))),
                                  np.asarray(jax.random.bernoulli(key, 0.3, (4, 5))))


def _both(rate, **kw):
    return prng.Dropout(rate, **kw), nnx.Dropout(rate, **kw)


@pytest.mark.parametrize("broadcast_dims", [(), (0,), (-1,), (1, 2)])
@pytest.mark.parametrize("rate", [0.1, 0.5])
def test_dropout_output_and_gradient_are_nnx_dropouts(rate, broadcast_dims):
    x = jax.random.normal(jax.random.key(0), (4, 16, 8))
    ours, theirs = _both(rate, broadcast_dims=broadcast_dims)
    for make_rngs in (lambda: jax.random.key(1), lambda: jax.random.PRNGKey(2),
                      lambda: nnx.Rngs(dropout=3), lambda: nnx.Rngs(dropout=3).dropout):

        def loss(module, x):
            return jnp.sum(jnp.sin(module(x, deterministic=False, rngs=make_rngs())))

        a, b = ours(x, deterministic=False, rngs=make_rngs()), theirs(
            x, deterministic=False, rngs=make_rngs())
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        ga = jax.jit(jax.grad(lambda x: loss(ours, x)))(x)
        gb = jax.jit(jax.grad(lambda x: loss(theirs, x)))(x)
        np.testing.assert_array_equal(np.asarray(ga), np.asarray(gb))
    # Something was dropped, and the kept values are rescaled.
    x = jax.random.normal(jax.random.key(0), (64, 16, 8))
    out = np.asarray(ours(x, deterministic=False, rngs=jax.random.key(1)))
    dropped = out == 0
    assert 0 < dropped.mean() < 1
    np.testing.assert_allclose(out[~dropped], np.asarray(x)[~dropped] / (1 - rate), rtol=1e-6)


def test_dropout_edge_cases_match_nnx():
    x = jnp.arange(12.0).reshape(3, 4)
    for rate in (0.0, 1.0):
        ours, theirs = _both(rate)
        np.testing.assert_array_equal(
            np.asarray(ours(x, deterministic=False, rngs=jax.random.key(0))),
            np.asarray(theirs(x, deterministic=False, rngs=jax.random.key(0))))
    ours, _ = _both(0.5)
    np.testing.assert_array_equal(np.asarray(ours(x, deterministic=True)), np.asarray(x))
    with pytest.raises(ValueError, match="deterministic"):
        ours(x)
    with pytest.raises(ValueError, match="rngs"):
        ours(x, deterministic=False)
    with pytest.raises(TypeError, match="rngs must be"):
        ours(x, deterministic=False, rngs=3)


def test_bert_with_dropout_on_is_the_same_as_with_nnx_dropout():
    """The whole model, dropout on, vmapped over per-example keys as the DP clippers do it:
    the same activations as with flax's own Dropout in every place."""
    config = model_lib.BertConfig.preset("tiny", 97, max_position_embeddings=16)
    model = model_lib.create_model(config)
    ids = jax.random.randint(jax.random.key(4), (3, 16), 0, 97)
    batch = dict(input_ids=ids, segment_ids=jnp.zeros_like(ids),
                 input_mask=jnp.ones_like(ids))
    keys = jax.random.split(jax.random.key(11), 3)

    def run(m):
        def one(example, key):
            ex = {k: v[None] for k, v in example.items()}
            out = m(ex["input_ids"], ex["segment_ids"], ex["input_mask"], deterministic=False,
                    rngs=nnx.Rngs(dropout=key))
            return jax.tree.leaves(out)[0]
        return np.asarray(jax.vmap(one)(batch, keys))

    ours = run(model)
    swapped = 0
    for _, module in nnx.iter_graph(model):
        if type(module) is prng.Dropout:
            module.__class__ = nnx.Dropout
            swapped += 1
    assert swapped >= 1 + 3 * config.num_hidden_layers
    theirs = run(model)
    np.testing.assert_array_equal(ours, theirs)
    assert not np.array_equal(ours, run(lambda *a, **k: model(*a[:3], deterministic=True)))


@pytest.mark.parametrize("shape", [(), (5,), (2, 3)])
def test_fold_in_is_jax_random_fold_in_of_every_element(shape):
    data = (np.arange(int(np.prod(shape)), dtype=np.int64) * 2654435761 % 2 ** 32 - 2 ** 31
            ).astype(np.int32).reshape(shape)  # negative int32 too: jax.random casts
    words = lambda k: np.asarray(  # noqa: E731
        jax.random.key_data(k) if jnp.issubdtype(k.dtype, jax.dtypes.prng_key) else k)
    for key in (*_keys(), jax.random.key(3, impl="rbg")):  # rbg: jax.random itself
        got = jax.jit(prng.fold_in)(key, data)
        assert got.dtype == key.dtype and got.shape[:len(shape)] == shape
        want = [words(jax.random.fold_in(key, int(d) % 2 ** 32)) for d in data.reshape(-1)]
        np.testing.assert_array_equal(words(got).reshape(len(want), -1),
                                      np.stack(want).reshape(len(want), -1))


def test_shapes_only_leaves_the_input_as_it_is_and_ends_with_its_block():
    drop = prng.Dropout(0.5, rngs=nnx.Rngs(dropout=0))
    x = jnp.ones((4, 6))
    with prng.shapes_only():
        np.testing.assert_array_equal(np.asarray(drop(x)), np.asarray(x))
    assert (np.asarray(drop(x)) == 0).any()


def test_bernoulli_takes_a_traced_p_as_jax_random_does():
    key = jax.random.PRNGKey(1)
    got = jax.jit(lambda p: prng.bernoulli(key, p, (5, 7)))(jnp.float32(0.3))
    np.testing.assert_array_equal(np.asarray(got),
                                  np.asarray(jax.random.bernoulli(key, 0.3, (5, 7))))


@pytest.fixture
def kernel_generator(monkeypatch):
    """DPBERT_PRNG=kernel for one test; JAX's kernel-lowering switch put back afterwards."""
    before = jax.config.jax_threefry_gpu_kernel_lowering
    monkeypatch.setenv(prng.GENERATOR_ENV, "kernel")
    yield
    jax.config.update("jax_threefry_gpu_kernel_lowering", before)


def test_the_kernel_generator_draws_the_same_bits_through_jax_s_primitive(kernel_generator):
    """DPBERT_PRNG=kernel: every draw the same as jax.random's (here through the primitive's
    CPU lowering), each threefry block JAX's own primitive instead of the unrolled arithmetic,
    and JAX's switch to its GPU kernel on."""
    shape = (7, 3, 5)
    for key in _keys():
        np.testing.assert_array_equal(
            np.asarray(jax.jit(lambda k: prng.random_bits(k, shape))(key)),
            np.asarray(jax.random.bits(key, shape, jnp.uint32)))
        np.testing.assert_array_equal(
            np.asarray(jax.jit(lambda k: prng.bernoulli(k, 0.3, shape))(key)),
            np.asarray(jax.random.bernoulli(key, 0.3, shape)))
        np.testing.assert_array_equal(
            np.asarray(jax.jit(lambda k: prng.standard_normal(k, shape))(key)),
            np.asarray(jax.random.normal(key, shape)))
    keys = jax.random.split(jax.random.key(7), 6)  # vmapped: batched keys, shared counters
    np.testing.assert_array_equal(
        np.asarray(jax.jit(jax.vmap(lambda k: prng.bernoulli(k, 0.8, (9, 11))))(keys)),
        np.asarray(jax.vmap(lambda k: jax.random.bernoulli(k, 0.8, (9, 11)))(keys)))
    key = jax.random.key(11)
    got = jax.jit(prng.fold_in)(key, jnp.arange(6))
    want = jax.vmap(lambda d: jax.random.fold_in(key, d))(jnp.arange(6))
    np.testing.assert_array_equal(np.asarray(jax.random.key_data(got)),
                                  np.asarray(jax.random.key_data(want)))
    assert prng.generator() == "kernel" and jax.config.jax_threefry_gpu_kernel_lowering
    text = jax.jit(lambda k: prng.random_bits(k, (4, 9))).lower(key).as_text()
    assert "threefry2x32" in text  # JAX's primitive, lowered as its own function


def test_a_generator_the_module_does_not_know_is_refused(monkeypatch):
    monkeypatch.setenv(prng.GENERATOR_ENV, "philox")
    with pytest.raises(ValueError, match="DPBERT_PRNG=.philox.: expected one of auto, unrolled, "
                                         "kernel, jax"):
        prng.generator()


def test_auto_is_the_kernel_on_one_gpu_and_the_unrolled_rounds_elsewhere(monkeypatch,
                                                                          kernel_generator):
    """DPBERT_PRNG=auto (the default): here (CPU) the unrolled generator, JAX's switch left off;
    in a process with one GPU "kernel": a program for the GPU draws dpbert's bits and JAX's own
    threefry (flax's dropout keys) with jaxlib's CUDA kernel, the same bits (here through the
    primitive's CPU lowering)."""
    monkeypatch.delenv(prng.GENERATOR_ENV)
    jax.config.update("jax_threefry_gpu_kernel_lowering", False)
    key = jax.random.key(3)

    def step():  # a new function each time: JAX caches a function's trace
        return jax.jit(lambda k: (prng.random_bits(k, (4, 9)), prng.bernoulli(k, 0.3, (7,)),
                                  jax.random.key_data(jax.random.fold_in(k, 5))))

    def lowered(platform):
        return step().trace(key).lower(lowering_platforms=(platform,)).as_text()

    assert prng.generator() == "unrolled"
    assert not jax.config.jax_threefry_gpu_kernel_lowering
    assert prng.CUDA_KERNEL_TARGET not in lowered("cuda")
    unrolled = _program(step().lower(key).compile())
    monkeypatch.setattr(prng, "_one_gpu", lambda: True)
    assert prng.generator() == "kernel" and jax.config.jax_threefry_gpu_kernel_lowering
    assert lowered("cuda").count(prng.CUDA_KERNEL_TARGET) == 3
    assert _program(step().lower(key).compile()) != unrolled  # JAX's rolled loop on the CPU
    for got, want in zip(step()(key), (jax.random.bits(key, (4, 9), jnp.uint32),
                                       jax.random.bernoulli(key, 0.3, (7,)),
                                       jax.random.key_data(jax.random.fold_in(key, 5)))):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))


def _program(compiled) -> str:
    """A compiled program's computations without their metadata (source names, lines)."""
    text = compiled.as_text()
    return re.sub(r", metadata=\{[^}]*\}", "", text[text.index("\n%"):])

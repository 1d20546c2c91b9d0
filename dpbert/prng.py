"""Counter-based random bits, bit for bit JAX's, unrolled for speed: the DP noise and dropout.

`random_bits(key, shape)` equals ``jax.random.bits(key, shape, jnp.uint32)`` for threefry2x32
keys (raw uint32[2] or typed; the JAX default) with ``jax_threefry_partitionable`` on (the
default since JAX 0.5): element at row-major position n is ``out0 ^ out1`` of threefry2x32 with
20 rounds on the counter (0, n).  XLA's CPU lowering of JAX's own threefry runs the 20 rounds as
a rolled loop that writes the [2, n] state out between rounds; unrolled, the rounds and whatever
consumes the bits (the Gaussian transform of `dpbert.dp.noise`, dropout's comparison and
select) fuse into one loop over the array, about 3x faster on CPU for the noise.  Each device
computes only the counters of the slice it holds (`sharding`), so a sharded draw is the same
draw.  Any other key type, or an array of 2^32 elements or more, goes to ``jax.random`` itself.
`standard_normal_segments` draws many arrays' normals (every leaf's DP noise) in one loop, so
that the program holds one copy of the generator, not one per leaf (the DP step's compile time).
`fold_in` is ``jax.random.fold_in`` over an array of data, bit for bit, as one elementwise
fusion (the DP step's per-leaf and per-example keys).  `shapes_only` turns dropout off for an
abstract run that needs only shapes.
The environment variable DPBERT_PRNG picks the generator (`generator`): "auto" (the default:
"kernel" in a process with one GPU, else "unrolled"), "unrolled", "kernel" (each threefry block
JAX's own primitive, with JAX's switch to its precompiled GPU kernel on: a third to a half less
GPU compile time) or "jax" (every draw to ``jax.random`` itself).  All give the same bits.

`Dropout` is ``flax.nnx.Dropout`` with its mask taken from `random_bits`: the same mask, the
same output and gradient, bit for bit, for the same key (tested), in less time (BERT mini's
non-private step on one CPU device: 7-8 % less).
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import os

import jax
import jax.extend.random
import jax.numpy as jnp
import numpy as np
from flax import nnx
from flax.nnx.module import first_from

# The environment variable that picks the generator (`generator`), and its values.
GENERATOR_ENV = "DPBERT_PRNG"
GENERATORS = ("auto", "unrolled", "kernel", "jax")
# JAX's switch that lowers its threefry primitive to a precompiled kernel on GPUs ("kernel").
_KERNEL_LOWERING = "jax_threefry_gpu_kernel_lowering"
# jaxlib's CUDA threefry kernel (the XLA FFI target JAX's switch lowers threefry to on a GPU).
CUDA_KERNEL_TARGET = "cu_threefry2x32_ffi"
# Threefry-2x32 rotations (Salmon et al. 2011, as in jax.random).
_ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)


def _threefry2x32(k0: jax.Array, k1: jax.Array, x0: jax.Array, x1: jax.Array
                  ) -> tuple[jax.Array, jax.Array]:
    """Threefry-2x32, 20 rounds: the block function of JAX's threefry PRNG, by the generator
    `generator` picks (the unrolled arithmetic, or JAX's primitive)."""
    k0, k1, x0, x1 = (jnp.asarray(v, jnp.uint32) for v in (k0, k1, x0, x1))
    if generator() == "kernel":  # JAX's primitive: the same function, lowered per backend
        # Its lowerings want four operands of one shape, also under vmap (where a key may be
        # batched and the counters not, or the reverse): add a zero that has every operand's
        # shape and batch axes.
        zero = (k0 ^ k0) + (k1 ^ k1) + (x0 ^ x0) + (x1 ^ x1)
        return tuple(jax.extend.random.threefry2x32_p.bind(*(v + zero for v in (k0, k1, x0, x1))))
    return _threefry2x32_unrolled(k0, k1, x0, x1)


def _threefry2x32_unrolled(k0: jax.Array, k1: jax.Array, x0: jax.Array, x1: jax.Array
                           ) -> tuple[jax.Array, jax.Array]:
    """The 20 rounds unrolled, as uint32 arithmetic.

    Written with `jax.lax` ops on uint32 (jnp's operators each go through a jitted wrapper:
    the DP step traces this once per dropout layer under vmap and autodiff, where that
    overhead was a visible part of its compile time)."""
    def u32(v):
        return jax.lax.full((), v, jnp.uint32)

    ks = (k0, k1, jax.lax.bitwise_xor(jax.lax.bitwise_xor(k0, k1), u32(0x1BD11BDA)))
    x0, x1 = jax.lax.add(x0, ks[0]), jax.lax.add(x1, ks[1])
    for r in range(20):
        rot = _ROTATIONS[r % 8]
        x0 = jax.lax.add(x0, x1)
        x1 = jax.lax.bitwise_xor(
            jax.lax.bitwise_or(jax.lax.shift_left(x1, u32(rot)),
                               jax.lax.shift_right_logical(x1, u32(32 - rot))), x0)
        if r % 4 == 3:
            s = r // 4 + 1
            x0 = jax.lax.add(x0, ks[s % 3])
            x1 = jax.lax.add(jax.lax.add(x1, ks[(s + 1) % 3]), u32(s))
    return x0, x1


def _flat_index(shape: tuple[int, ...], sharding: jax.sharding.Sharding | None) -> jax.Array:
    """uint32 [shape]: the row-major position of every element (built from per-axis iotas,
    so that a sharded array's devices each compute only their own slice)."""
    index = None
    stride = 1
    for axis in reversed(range(len(shape))):
        iota = jax.lax.broadcasted_iota(jnp.uint32, shape, axis, out_sharding=sharding)
        term = iota if stride == 1 else iota * jnp.uint32(stride)
        index = term if index is None else index + term
        stride *= shape[axis]
    if index is None:  # a scalar
        index = jnp.zeros(shape, jnp.uint32, out_sharding=sharding)
    return index


def generator() -> str:
    """The generator in use: "unrolled", "kernel" or "jax" -- the environment variable
    DPBERT_PRNG ("auto", the default, resolves to "kernel" in a process with one GPU and to
    "unrolled" elsewhere), read when a function is traced.  All give the same bits.
    - "unrolled": threefry written out as arithmetic that XLA fuses with what consumes the bits
      (on the CPU ~3x faster than JAX's rolled loop).  On a GPU every such fusion is code for
      XLA to compile (BERT-base on an H200: the DP step 60 s, 26 s at sigma 0).
    - "kernel": the same draws and layout (one flat noise draw), but each threefry block is
      JAX's `threefry2x32_p`, with JAX's switch `jax_threefry_gpu_kernel_lowering` turned on
      for the process: on a GPU jaxlib's precompiled CUDA kernel (`CUDA_KERNEL_TARGET`) for
      dpbert's draws and for JAX's own threefry (flax's dropout keys), nothing for XLA to
      compile, the bits materialised; on the CPU JAX's rolled loop (slower; for checks).
      Compiled for one H100 without a GPU (`benchmarks/compile_fresh.py --target=h100`),
      BERT-base's non-private step in 28 s against 52 s unrolled, its DP step in 46 s against
      69 s (BENCHMARKS.md, issue 32).  Not chosen by "auto" on several devices: the kernel is
      a custom call with no partitioning rule (how XLA shards it is unchecked).
    - "jax": every draw of this module goes to ``jax.random`` itself, leaf by leaf (a check, or
      a comparison of speed and compile time)."""
    value = os.environ.get(GENERATOR_ENV, "").strip().lower() or "auto"
    if value not in GENERATORS:
        raise ValueError(f"{GENERATOR_ENV}={value!r}: expected one of {', '.join(GENERATORS)}")
    if value == "auto":
        value = "kernel" if _one_gpu() else "unrolled"
    if value == "kernel" and not getattr(jax.config, _KERNEL_LOWERING):
        jax.config.update(_KERNEL_LOWERING, True)
    return value


def _one_gpu() -> bool:
    """Whether this process's devices are one GPU ("auto" takes the kernel there). Asked when
    a function is traced, after a launcher started JAX's backends (jax.distributed first)."""
    return jax.default_backend() == "gpu" and jax.device_count() == 1


if os.environ.get(GENERATOR_ENV, "").strip().lower() == "kernel":
    generator()  # JAX's kernel lowering on before anything is traced (a later switch recompiles)


def threefry_key_words(key: jax.Array, shape: tuple[int, ...]) -> jax.Array | None:
    """The key's uint32[2] words when this module's threefry reproduces jax.random (and is
    the one chosen, `generator`: not "jax"), else None."""
    if generator() == "jax":
        return None
    typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    impl = str(jax.random.key_impl(key)) if typed else "threefry2x32"
    if ("threefry2x32" not in impl or not jax.config.jax_threefry_partitionable
            or math.prod(shape) >= 2 ** 32):
        return None
    data = jax.random.key_data(key) if typed else jnp.asarray(key, jnp.uint32)
    if data.shape != (2,):
        raise ValueError(f"expected a single threefry key (uint32[2]), got shape {data.shape}")
    return data


def random_bits(key: jax.Array, shape: tuple[int, ...],
                sharding: jax.sharding.Sharding | None = None) -> jax.Array:
    """uint32 bits of `shape`, bitwise equal to ``jax.random.bits(key, shape, jnp.uint32)``.

    `sharding`: the output's sharding under Explicit mesh axes (None otherwise).
    """
    shape = tuple(int(d) for d in shape)
    data = threefry_key_words(key, shape)
    if data is None:
        return jax.random.bits(key, shape, jnp.uint32, out_sharding=sharding)
    low = _flat_index(shape, sharding)
    # jax.random: counter (high word, low word) = (0, flat index); bits = out0 ^ out1.
    b0, b1 = _threefry2x32(data[0], data[1], jnp.zeros_like(low), low)
    return b0 ^ b1


def unit_float(bits: jax.Array) -> jax.Array:
    """float32 in [0, 1) from the 23 high mantissa bits, as ``jax.random.uniform`` makes it."""
    return jax.lax.bitcast_convert_type((bits >> jnp.uint32(9)) | jnp.uint32(0x3F800000),
                                        jnp.float32) - jnp.float32(1.0)


def fold_in(key: jax.Array, data: jax.Array | int) -> jax.Array:
    """``jax.vmap(jax.random.fold_in)`` of `key` and every element of `data` (keys of shape
    ``data.shape``), bit for bit, for threefry2x32 keys (raw uint32[2] or typed): fold_in(k, d)
    is threefry2x32 of k on the counter (0, d).  One elementwise fusion instead of JAX's
    threefry, which XLA:CPU lowers as a rolled loop of large fusions (the DP step's per-leaf
    and per-example keys: ~0.2 s of its compile).  Other keys go to ``jax.random.fold_in``."""
    data = jnp.asarray(data)
    if data.dtype != jnp.uint32:
        data = data.astype(jnp.uint32)
    typed = jnp.issubdtype(key.dtype, jax.dtypes.prng_key)
    words = threefry_key_words(key, ())
    if words is None:
        fold = lambda d: jax.random.fold_in(key, d)  # noqa: E731
        for _ in range(data.ndim):
            fold = jax.vmap(fold)
        return fold(data)
    o0, o1 = _threefry2x32(words[0], words[1], jnp.zeros_like(data), data)
    out = jnp.stack([o0, o1], axis=-1)
    return jax.random.wrap_key_data(out, impl=jax.random.key_impl(key)) if typed else out


def standard_normal(key: jax.Array, shape: tuple[int, ...],
                    sharding: jax.sharding.Sharding | None = None) -> jax.Array:
    """float32 N(0, 1) of `shape`, bitwise equal to ``jax.random.normal(key, shape)``
    (`random_bits`, then jax.random's uniform in [-1, 1) and sqrt(2) erfinv).

    Without `sharding` the draw is traced once per shape as its own jitted function (inlined
    by XLA), as `bernoulli`'s: the DP noise drawn leaf by leaf on a mesh traced the rounds
    once per leaf (tiny BERT: 46 draws of 11 shapes, 0.73 -> 0.37 s of tracing)."""
    shape = tuple(int(d) for d in shape)
    if sharding is None:
        return _traced_once(_standard_normal, key, (shape,), generator())
    return _standard_normal(key, shape, sharding)


def _standard_normal(key: jax.Array, shape: tuple[int, ...],
                     sharding: jax.sharding.Sharding | None) -> jax.Array:
    if threefry_key_words(key, shape) is None:
        return jax.random.normal(key, shape, jnp.float32, out_sharding=sharding)
    return _normal_from_unit(unit_float(random_bits(key, shape, sharding)))


def bernoulli(key: jax.Array, p: float, shape: tuple[int, ...],
              sharding: jax.sharding.Sharding | None = None) -> jax.Array:
    """bool of `shape`, bitwise equal to ``jax.random.bernoulli(key, p, shape)`` (float32 p).

    Without `sharding` the draw is traced as its own jitted function (inlined by XLA: the same
    program), so a model's dropout layers of one shape trace the 20 rounds once, not once per
    layer (the DP step traces them under vmap and autodiff: ~0.3 s of its lowering)."""
    shape = tuple(int(d) for d in shape)
    if sharding is None and isinstance(p, (int, float)):  # a static p: part of the cache key
        return _traced_once(_bernoulli, key, (float(p), shape), generator())
    return _bernoulli(key, p, shape, sharding)


def _bernoulli(key: jax.Array, p: float, shape: tuple[int, ...],
               sharding: jax.sharding.Sharding | None) -> jax.Array:
    if threefry_key_words(key, shape) is None:
        return jax.random.bernoulli(key, p, shape, out_sharding=sharding)
    return unit_float(random_bits(key, shape, sharding)) < jnp.float32(p)


@functools.partial(jax.jit, static_argnums=(0, 2, 3))
def _traced_once(draw, key: jax.Array, static: tuple, chosen: str) -> jax.Array:
    """``draw(key, *static, None)`` (an unsharded draw) as its own jitted function: traced
    once per `draw` and static arguments (shape, p), inlined by XLA (the same program); the
    key stays an argument (never a constant of a cached program)."""
    del chosen  # `generator()` is read while tracing: part of the cache key
    return draw(key, *static, None)


def standard_normal_segments(key_words: jax.Array, sizes: tuple[int, ...],
                             scale: float | jax.Array = 1.0, loops: int = 16
                             ) -> list[jax.Array]:
    """float32 [sizes[j]] for each j: ``scale * jax.random.normal(key_j, (sizes[j],))`` bit for
    bit as jitted, key_j = ``key_words[j]`` (uint32 [len(sizes), 2], threefry2x32 key data).
    (`scale` is applied inside the draw, as a leaf's own draw does: XLA folds a constant scale
    into sqrt(2), and the values must round the same.)

    One elementwise generator for every segment (the DP noise of all parameter leaves) instead
    of one per leaf: the code, and so the compile time, no longer grows with the number of
    segments (a leaf's generator is a large fusion, which XLA also copies into each of its
    consumers).  The segments are laid out in rows of a power-of-two length (each segment
    padded to whole rows, at most ~6 % more elements); a row's key and first counter come from
    small per-row tables, so the draw stays a plain vectorised loop.  It runs as `loops`
    iterations of a loop over blocks of rows: a loop's output is materialised, so XLA cannot
    copy the generator into the slices the caller takes (an optimization barrier does not
    stop it).
    """
    sizes = tuple(int(n) for n in sizes)
    if max(sizes, default=0) >= 2 ** 32 or not jax.config.jax_threefry_partitionable:
        raise ValueError("standard_normal_segments needs jax_threefry_partitionable and "
                         "segments of fewer than 2^32 elements")
    total = max(sum(sizes), 1)
    width = 1 << max(7, min(16, (total // (16 * max(len(sizes), 1))).bit_length() - 1))
    rows = [-(-n // width) for n in sizes]
    blocks = max(1, min(loops, sum(rows)))
    per_block = -(-max(sum(rows), 1) // blocks)
    pad = blocks * per_block - sum(rows)
    row_segment = np.concatenate([np.repeat(np.arange(len(sizes)), rows),
                                  np.zeros(pad, np.int64)]).astype(np.int32)
    row_start = np.concatenate([np.arange(r, dtype=np.int64) * width for r in rows]
                               + [np.zeros(pad, np.int64)]).astype(np.uint32)
    row_words = jnp.asarray(key_words, jnp.uint32)[jnp.asarray(row_segment)]
    row_start = jnp.asarray(row_start)

    def block(i):
        words = jax.lax.dynamic_slice_in_dim(row_words, i * per_block, per_block)
        low = (jax.lax.dynamic_slice_in_dim(row_start, i * per_block, per_block)[:, None]
               + jax.lax.broadcasted_iota(jnp.uint32, (per_block, width), 1))
        b0, b1 = _threefry2x32(words[:, :1], words[:, 1:], jnp.zeros_like(low), low)
        return scale * _normal_from_unit(unit_float(b0 ^ b1))

    first = np.cumsum([0] + rows)
    # On the CPU a segment whose size another segment shares gets its first row as a value
    # XLA cannot see (below); the others are sliced at their constant offsets.  On one GPU
    # (`_one_gpu`; the flat draw runs on one device) every segment is sliced at its constant
    # offset: there each carried offset was a kernel of its own on every trip of the loop
    # (BERT-base: 202 scalar adds a trip, 16 trips a step).
    shared = [] if _one_gpu() else [j for j, n in enumerate(sizes) if sizes.count(n) > 1]

    def body(starts, i):
        # The shared segments' first rows ride through the loop, plus a zero XLA cannot
        # prove zero (i < blocks always): after the loop each is a value of its own, so the
        # consumers of two segments of one shape are the same fused computation, compiled
        # once (XLA:CPU shares the kernel of identical fusions), where a static slice puts
        # each segment's offset, a constant, into its consumers' code.  Values: the same.
        zero = jax.lax.optimization_barrier((i >= blocks).astype(jnp.int32))
        return tuple(s + zero for s in starts), block(i)

    carried, out = jax.lax.scan(body, tuple(jnp.int32(first[j]) for j in shared),
                                jnp.arange(blocks, dtype=jnp.int32))
    out = out.reshape(-1, width)
    starts = dict(zip(shared, carried))
    return [(jax.lax.dynamic_slice_in_dim(out, starts[j], rows[j], allow_negative_indices=False)
             if j in starts else out[first[j]:first[j + 1]]).reshape(-1)[:n]
            for j, n in enumerate(sizes)]


def _normal_from_unit(one: jax.Array) -> jax.Array:
    """sqrt(2) erfinv of a uniform in [-1, 1) made from `one` in [0, 1), as jax.random.normal."""
    # uniform in [-1, 1), floored at nextafter(-1, 0), exactly as jax.random.normal does it.
    lo = np.nextafter(np.float32(-1.0), np.float32(0.0))
    u = jnp.maximum(lo, one * (jnp.float32(1.0) - lo) + lo)
    return jnp.float32(np.sqrt(2.0)) * jax.lax.erf_inv(u)


def explicit_sharding(x: jax.Array) -> jax.sharding.NamedSharding | None:
    """The sharding in `x`'s type on a mesh with Explicit axes, else None.

    Under Explicit mesh axes (the `jax.make_mesh` default) shardings are part of array types,
    so arrays created inside a step (dropout masks, the DP noise, zeros) must be given the
    sharding of the arrays they combine with; under Auto axes XLA propagates shardings itself
    and None is returned.
    """
    sharding = getattr(jax.typeof(x), "sharding", None)
    if isinstance(sharding, jax.sharding.NamedSharding) and any(
            t == jax.sharding.AxisType.Explicit for t in sharding.mesh.axis_types):
        return sharding
    return None


_SHAPES_ONLY = contextvars.ContextVar("dpbert_prng_shapes_only", default=False)


@contextlib.contextmanager
def shapes_only():
    """Inside, `Dropout` returns its input as it is (no key drawn, no mask): for an abstract
    run that only needs shapes (``jax.eval_shape``), which dropout leaves as they are.  The
    DP step's mixed-ghost plan traces the whole model once for the shapes of its dense
    layers; its dropout masks were most of that trace's time."""
    token = _SHAPES_ONLY.set(True)
    try:
        yield
    finally:
        _SHAPES_ONLY.reset(token)


class Dropout(nnx.Dropout):
    """``nnx.Dropout`` (same arguments, same mask for the same key) drawing its mask with
    `bernoulli` instead of ``jax.random.bernoulli``."""

    def __call__(self, inputs, *, deterministic: bool | None = None, rngs=None):
        deterministic = first_from(
            deterministic, self.deterministic,
            error_msg="no `deterministic` argument was provided to Dropout as either a "
                      "__call__ argument or class attribute")
        if self.rate == 0.0 or deterministic or _SHAPES_ONLY.get():
            return inputs
        if self.rate == 1.0:
            return jnp.zeros_like(inputs)
        rngs = first_from(
            rngs, self.rngs,
            error_msg="`deterministic` is False, but no `rngs` argument was provided to "
                      "Dropout as either a __call__ argument or class attribute.")
        if isinstance(rngs, nnx.Rngs):
            key = rngs[self.rng_collection]()
        elif isinstance(rngs, nnx.RngStream):
            key = rngs()
        elif isinstance(rngs, jax.Array):
            key = rngs
        else:
            raise TypeError(f"rngs must be a Rngs, RngStream or jax.Array, got {type(rngs)}")
        keep_prob = 1.0 - self.rate
        shape = list(inputs.shape)
        for dim in self.broadcast_dims:
            shape[dim] = 1
        mask = bernoulli(key, keep_prob, tuple(shape), explicit_sharding(inputs))
        mask = jnp.broadcast_to(mask, inputs.shape)
        return jax.lax.select(mask, inputs / keep_prob, jnp.zeros_like(inputs))

"""Gaussian noise for the clipped gradient sum (DP-SGD Eq. 2 of Hoory et al. 2021).

One draw per logical batch, float32, added directly to the float32 clipped sum:

    noisy = clipped_sum + N(0, std^2 I),   std = sigma * C            ("global")
                                           std = sigma * C * sqrt(P)  ("per_shard")

How the global mode stays exact on P shards: the noise is ONE global array per
parameter leaf, drawn with ``jax.random.normal(leaf_key, leaf.shape)`` inside
the jitted step.  JAX's threefry generator is partitionable (the default since
JAX 0.5, `jax_threefry_partitionable`): when the leaf is sharded, every device
computes its own slice of the same global counter-based stream, with no
communication and no repeated values, and the values are bit-identical to an
unsharded draw.  So the total noise has std exactly sigma * C whatever P, the
number of hosts, or how the batch was split over microbatches and calls.  When
the leaf is replicated, every device computes the same values (one draw, not P);
with `add_noise`'s `layouts` (what the trainer passes) each device instead adds its
slice of that one draw to its slice of the reduced sum, and the noisy slices are
all-gathered: the same values, 1/P of the drawing per device.

``noise_mode="per_shard"`` reproduces TF's CrossShardOptimizer (every one of P
shards adds its own N(0, sigma^2 C^2) to its partial sum).  The sum of P
independent N(0, sigma^2 C^2) draws is N(0, P sigma^2 C^2), so it is drawn as one
global array of std sigma * C * sqrt(P) (same distribution, 1/P of the work);
the accountant must then be given sigma * sqrt(P). Both come from one rule,
`dpbert.dp.noise_modes.shard_factor` (`noise_stddev`, `effective_noise_multiplier`).

Keys: leaf i of logical step t uses ``fold_in(fold_in(step_key_base, t), i)``
(see `accumulation.DPAggregator`), so keys never repeat across steps or leaves.

Speed: `threefry_normal` (`dpbert.prng`) is ``jax.random.normal`` re-written as one
elementwise function of a counter (threefry2x32 with 20 rounds, the mantissa trick for a
uniform, ``sqrt(2) erfinv``), bit for bit the same values for threefry keys.
XLA's CPU lowering of JAX's own threefry runs its 20 rounds as a rolled loop that
materialises the [2, n] state between rounds; unrolled, the whole draw (and the
add and the division that follow it) fuses into one loop over the leaf, about 3x
faster on CPU.  Each device computes only the counters of the slice it holds.
Compile time: one unrolled generator per leaf made the DP step compile in ~3x the
non-private step's time (XLA copies each into every consumer); with ``flat`` (the trainer's
choice on one device) all leaves' noise comes from one loop, `prng.standard_normal_segments`:
the same values, one copy of the generator (issue 32; BENCHMARKS.md).  It hands the leaves of
one shape their noise at offsets XLA cannot fold, so their consumers (the add, the optimizer)
stay one fused computation that XLA:CPU compiles once, as in the non-private step; the leaves'
keys come from `prng.fold_in`, one elementwise fusion.  In a process with one GPU each block of
the draw is JAX's threefry primitive, lowered to jaxlib's CUDA kernel (`prng.generator`: "auto",
the default, is "kernel" there; on a GPU the unrolled rounds are code for XLA to compile).
``DPBERT_PRNG=jax`` sends every draw to ``jax.random``.

Memory: `add_noise` makes the key wait for the clipped sum (`_after`, an identity on the
key's bits), so XLA draws the noise after the backward pass instead of holding the draw's
parameter-sized intermediates next to the activations (BERT-base: 1.13x -> 1.00x the
non-private step's temp memory).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dpbert import prng
from dpbert.dp import trees
from dpbert.dp.noise_modes import noise_stddev  # noqa: F401 - noise.noise_stddev is public

PyTree = Any


def threefry_normal(key: jax.Array, shape: tuple[int, ...],
                    sharding: jax.sharding.Sharding | None = None) -> jax.Array:
    """float32 N(0, 1) of `shape`, bitwise equal to ``jax.random.normal(key, shape)``.

    `dpbert.prng.standard_normal`: the unrolled threefry for threefry2x32 keys (a raw
    uint32[2] key or a typed key) with ``jax_threefry_partitionable`` on (the default since
    JAX 0.5); any other key type is passed to ``jax.random.normal``.  `sharding`: the
    output's sharding under Explicit mesh axes (None otherwise).
    """
    return prng.standard_normal(key, shape, sharding)


def draws(stddev: float | jax.Array) -> bool:
    """Whether noise of std `stddev` is drawn at all (decided when the step is traced): a
    number > 0, or an array (the train step's argument, `DPAggregator.update`'s
    `noise_stddev`: its value is not known while tracing, and the caller passes one only
    for a private run)."""
    if isinstance(stddev, (int, float, np.number)):
        return float(stddev) > 0
    return True


def layout_leaves(layouts: PyTree | None, n: int) -> list[jax.sharding.Sharding | None]:
    """The per-leaf layouts of `add_noise` as a list of n (None: no layout anywhere)."""
    if layouts is None:
        return [None] * n
    out = jax.tree.leaves(layouts, is_leaf=lambda x: x is None
                          or isinstance(x, jax.sharding.Sharding))
    if len(out) != n:
        raise ValueError(f"noise layouts have {len(out)} leaves, the gradient tree {n}")
    return out


def _flat_draw(leaves: list, flags: list, layouts: list, key: jax.Array,
               stddev: float | jax.Array) -> list | None:
    """The noise of every trained leaf from one draw (`prng.standard_normal_segments`), or
    None where it does not apply: a leaf with a layout or an Explicit sharding, a key that is
    not threefry2x32, the jax.random generator (`prng.generator`), 2^32 elements or more."""
    drawn = [i for i, t in enumerate(flags) if t and draws(stddev)]
    sizes = tuple(int(leaves[i].size) for i in drawn)
    if (not drawn or prng.generator() == "jax" or sum(sizes) >= 2 ** 32
            or any(layouts[i] is not None or trees.explicit_sharding(leaves[i]) is not None
                   for i in drawn)
            or prng.threefry_key_words(key, ()) is None):
        return None
    # fold_in(key, i) for every drawn leaf at once: the same keys as one fold_in per leaf.
    keys = prng.fold_in(key, jnp.asarray(drawn, jnp.uint32))
    if jnp.issubdtype(keys.dtype, jax.dtypes.prng_key):
        keys = jax.random.key_data(keys)
    out: list = [None] * len(leaves)
    for i, draw in zip(drawn, prng.standard_normal_segments(keys, sizes, stddev)):
        out[i] = draw.reshape(leaves[i].shape)
    return out


def gaussian_noise(tree: PyTree, key: jax.Array, stddev: float | jax.Array,
                   trainable: PyTree | None = None, layouts: PyTree | None = None,
                   flat: bool = False) -> PyTree:
    """float32 N(0, stddev^2) arrays shaped like `tree` (zeros on frozen leaves).

    Leaf i (in `jax.tree.leaves` order) uses ``fold_in(key, i)``.

    `layouts` (see `add_noise`): per leaf, None or a sharding in which to draw its noise. The
    values do not depend on it: the threefry draw is partitionable, so the noise is bitwise
    the same however it is laid out.

    `flat`: draw every leaf's noise in one loop (`prng.standard_normal_segments`: one copy
    of the generator in the program instead of one per leaf, so the DP step compiles in a
    fraction of the time) where it applies -- no layouts, no Explicit shardings, threefry
    keys, the unrolled generator; else leaf by leaf.  The same values, bit for bit.  It
    computes all of the noise wherever it runs: meant for one device (the trainer sets it
    when its mesh has one device).
    """
    leaves, treedef = jax.tree.flatten(tree)
    flags = ([True] * len(leaves) if trainable is None else jax.tree.leaves(trainable))
    if len(flags) != len(leaves):
        raise ValueError("trainable mask does not match the gradient tree")
    drawn = (_flat_draw(leaves, flags, layout_leaves(layouts, len(leaves)), key, stddev)
             if flat else None)
    if drawn is not None:
        return jax.tree.unflatten(treedef, [
            d if d is not None else jnp.zeros_like(x, jnp.float32)
            for x, d in zip(leaves, drawn)])
    out = []
    for i, (leaf, train, layout) in enumerate(zip(leaves, flags,
                                                  layout_leaves(layouts, len(leaves)))):
        if train and draws(stddev):
            # Drawn directly with the leaf's sharding (Explicit mesh axes); under
            # Auto axes XLA shards the partitionable threefry draw itself.
            draw = stddev * threefry_normal(jax.random.fold_in(key, i), leaf.shape,
                                            trees.explicit_sharding(leaf))
            if layout is not None and trees.explicit_sharding(leaf) is None:
                draw = jax.lax.with_sharding_constraint(draw, layout)
            out.append(draw)
        else:
            out.append(jnp.zeros_like(leaf, jnp.float32))
    return jax.tree.unflatten(treedef, out)


def _after(key: jax.Array, x: jax.Array) -> jax.Array:
    """`key`, bit for bit, made to wait for `x`.

    The noise does not depend on the data, so XLA's scheduler may draw it anywhere in the
    step, e.g. in the middle of the backward pass, and then holds the draw's
    parameter-sized intermediates (erfinv's log and sqrt of every leaf) next to the
    activations: BERT-base's DP step had 838 MiB more temp memory than the same step with
    sigma = 0 (1.13x the non-private step's, against 1.00x).  An optimization barrier on
    (sum, key) changed nothing (none is left in the optimized HLO, and the draw still came
    early), so the key takes a data dependency on `x` instead: with v = sum(x) (a reduction
    works on any sharding), ``isnan(v) & ~isnan(v)`` is False for every v (NaN and inf
    included), so the key's bits are unchanged whatever the data.
    """
    v = jnp.sum(x)
    nan = jnp.isnan(v)
    zero = (nan & ~nan).astype(jnp.uint32)
    if jnp.issubdtype(key.dtype, jax.dtypes.prng_key):
        return jax.random.wrap_key_data(jax.random.key_data(key) ^ zero,
                                        impl=jax.random.key_impl(key))
    return key ^ zero


def add_noise(clipped_sum: PyTree, key: jax.Array, stddev: float | jax.Array,
              trainable: trees.TrainableFilter = None,
              layouts: PyTree | None = None, flat: bool = False) -> PyTree:
    """clipped_sum + N(0, stddev^2 I), float32; frozen leaves get no noise.

    Args:
      clipped_sum: float32 pytree, the sum of clipped per-example gradients.
      key: PRNG key unique to this logical step.
      stddev: `noise_stddev(...)`: a number (a constant of the program), or a float32 []
        array (an argument of the jitted step: one compiled program for every sigma, e.g. the
        recalibrated sigma of a fresh start or a sweep over epsilon; `draws`).
      trainable: trainable filter (frozen leaves are left as they are).
      layouts: optional pytree like `clipped_sum` (None leaves allowed;
        `dpbert.runtime.sharding.noise_layouts`): for a REPLICATED leaf under Auto mesh axes, a
        sharding splitting it over the devices.  That leaf's sum is resharded to it (each
        device keeps its slice of the all-reduced sum), each device draws and adds only its
        slice of the noise, and the noisy leaf is all-gathered back to replicated, instead
        of every device drawing all of the noise.  Values are bitwise the same either way.
      flat: one draw for all leaves (`gaussian_noise`); bitwise the same values.

    Raises:
      TypeError: if a leaf is not float32 (the sum must not be cast before noise).
    """
    for leaf in jax.tree.leaves(clipped_sum):
        if leaf.dtype != jnp.float32:
            raise TypeError(f"clipped sum leaf has dtype {leaf.dtype}; noise is added to "
                            "the float32 sum, with nothing in between")
    mask = trees.resolve_trainable_mask(clipped_sum, trainable)
    leaves, treedef = jax.tree.flatten(clipped_sum)
    flags = jax.tree.leaves(mask)
    # Any trainable leaf will do: every clipped sum waits for every norm, i.e. for the
    # whole backward pass.  The smallest one costs least to reduce (in its own layout).
    trained = [leaf for leaf, t in zip(leaves, flags) if t]
    if trained and draws(stddev):
        key = _after(key, min(trained, key=lambda leaf: leaf.size))
    spread = [lay if draws(stddev) and t and trees.explicit_sharding(x) is None else None
              for x, t, lay in zip(leaves, flags, layout_leaves(layouts, len(leaves)))]
    leaves = [x if lay is None else jax.lax.with_sharding_constraint(x, lay)
              for x, lay in zip(leaves, spread)]
    noise = jax.tree.leaves(gaussian_noise(jax.tree.unflatten(treedef, leaves), key, stddev,
                                           mask, spread, flat))
    out = []
    for x, n, lay in zip(leaves, noise, spread):
        y = x + n
        if lay is not None:
            y = jax.lax.with_sharding_constraint(
                y, jax.sharding.NamedSharding(lay.mesh, jax.sharding.PartitionSpec()))
        out.append(y)
    return jax.tree.unflatten(treedef, out)


def add_correlated_noise(clipped_sum: PyTree, key: jax.Array, stddev: float | jax.Array,
                         strategy: tuple[float, ...], buffers: tuple,
                         trainable: trees.TrainableFilter = None,
                         layouts: PyTree | None = None,
                         flat: bool = False) -> tuple[PyTree, tuple]:
    """BandMF's noise (`dpbert.dp.bandmf`): clipped_sum + stddev * y_t, float32, and the new
    buffers.

    y = C^-1 z row by row: y_t = (z_t - sum_{j>=1} c_j y_{t-j}) / c_0, where z_t is the i.i.d.
    N(0, I) draw that `add_noise` would scale by `stddev` at this key (our generator, our
    secret key: the same bits) and c = `strategy` (C's first column). `buffers`: (y_{t-1}, ...,
    y_{t-b+1}), each a list of float32 arrays, one per TRAINABLE leaf of `clipped_sum` in
    `jax.tree.leaves` order (`buffer_zeros`: a frozen leaf gets no noise, so it has no y to
    keep; with train.trainable=head on MiniLM, buffers shaped like every parameter were
    3 x 91 MB of zeros and made the step 8x slower); returned shifted, y_t first. One band
    ((c_0,) and no buffers) is `add_noise` itself, bit for bit when c_0 = 1.

    `layouts` only spread the i.i.d. draw of one band (`add_noise`); with more bands every
    device computes its own copy of a replicated leaf's noise (the same values).
    """
    if len(buffers) != len(strategy) - 1:
        raise ValueError(f"a {len(strategy)}-band strategy keeps {len(strategy) - 1} buffers, "
                         f"got {len(buffers)}")
    if len(strategy) == 1 and strategy[0] == 1.0:
        return add_noise(clipped_sum, key, stddev, trainable, layouts, flat), ()
    for leaf in jax.tree.leaves(clipped_sum):
        if leaf.dtype != jnp.float32:
            raise TypeError(f"clipped sum leaf has dtype {leaf.dtype}; noise is added to "
                            "the float32 sum, with nothing in between")
    mask = trees.resolve_trainable_mask(clipped_sum, trainable)
    leaves, treedef = jax.tree.flatten(clipped_sum)
    trained = [i for i, t in enumerate(jax.tree.leaves(mask)) if t]
    for buffer in buffers:
        if len(buffer) != len(trained):
            raise ValueError(f"a BandMF buffer holds {len(buffer)} arrays, the sum has "
                             f"{len(trained)} trainable leaves")
    if trained:
        key = _after(key, min((leaves[i] for i in trained), key=lambda leaf: leaf.size))
    z = jax.tree.leaves(gaussian_noise(clipped_sum, key, 1.0, mask, None, flat))
    c = [jnp.float32(x) for x in strategy]
    noisy, y = list(leaves), []
    for j, i in enumerate(trained):  # frozen leaves: no noise, nothing kept
        acc = z[i]
        for c_k, previous in zip(c[1:], buffers):
            acc = acc - c_k * previous[j]
        y.append(acc / c[0])
        noisy[i] = leaves[i] + stddev * y[-1]
    return jax.tree.unflatten(treedef, noisy), (y, *buffers[:-1])


def buffer_zeros(params: PyTree, trainable: trees.TrainableFilter = None) -> list:
    """One BandMF buffer before the first step (`add_correlated_noise`): float32 zeros like
    each trainable leaf of `params`, in `jax.tree.leaves` order."""
    return trees.trainable_leaves(params, trainable,
                                  lambda x: jnp.zeros(x.shape, jnp.float32))

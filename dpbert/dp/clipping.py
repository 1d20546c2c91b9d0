"""Clipped sums of per-example gradients (DP-SGD Eq. 1 of Hoory et al. 2021).

    g_i     = grad_params loss(params, example_i, rng_i)        (one example, float32)
    clip(g) = g / max(1, ||g||_2 / C)                           (norm over the whole tree)
    output  = sum_i mask_i * clip(g_i)                          (float32)

The sum has L2 sensitivity C under adding or removing one example: this is the
quantity the Gaussian noise is calibrated to, so nothing may happen between it
and the noise (see `dpbert.dp.accumulation`).

`GradientClipper` is the interface; `VmapClipper` computes per-example gradients
with ``jax.vmap(jax.grad(...))`` in microbatches.  `dpbert.dp.ghost.TiedEmbeddingClipper`
gives the same sum for BERT without per-example gradients of the tied word
embedding (ghost norms); both share the microbatch layout below
(`scan_microbatches`).

Microbatching and sharding.  ``microbatch_size`` is GLOBAL (all devices
together).  A physical batch of B examples, sharded over the data axis in
contiguous blocks, is viewed as ``[num_shards, microbatch_size / num_shards,
n_chunks]`` (example r sits at ``(s, a, c)`` with ``r = (s * m/S + a) * n_chunks + c``),
which keeps the shard axis on the shard that owns the rows; ``lax.scan`` runs
over the ``n_chunks`` axis, so every iteration processes m/S examples on every
shard, and memory is bounded by one chunk of per-example gradients.  Partial
sums are kept per shard in the scan carry (``[num_shards, *param]``) and reduced
once at the end, so the cross-shard reduction happens once per call, not once
per microbatch.  No sharding constraint is placed inside the vmapped
per-example loss.

Per-example randomness (dropout): the example in slot r of a call gets
``fold_in(key, first_position + r)`` (its position in the logical batch); keys
are never shared between examples, and the result does not depend on the
microbatch size or on how a logical batch is split into calls.

Non-finite per-example gradients (or losses / metrics) are replaced by zeros
and counted; padding slots (mask False) contribute exactly zero.  Only batch
totals leave this module, never a per-example value.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Protocol

import jax
import jax.numpy as jnp

from dpbert import prng
from dpbert.dp import trees

PyTree = Any
Batch = dict[str, jax.Array]
# loss_fn(params, example, rng) -> (loss f32 [], metrics dict[str, f32 []]); one
# unbatched example.  Metrics must be per-example sums that are safe to add.
LossFn = Callable[[PyTree, Batch, jax.Array], tuple[jax.Array, dict[str, jax.Array]]]


class GradientClipper(Protocol):
    """Computes the clipped per-example gradient sum of a physical batch."""

    def clipped_sum(self, loss_fn: LossFn, params: PyTree, batch: Batch,
                    mask: jax.Array, key: jax.Array, *, first_position: jax.Array | int = 0
                    ) -> tuple[PyTree, dict[str, jax.Array], jax.Array]:
        """Returns (grad_sum, metric_sums, num_nonfinite).

        Args:
          loss_fn: per-example loss, see `LossFn`.
          params: parameter pytree (float32 leaves).
          batch: dict of arrays with leading batch axis [B, ...].
          mask: bool [B]; False marks padding slots.
          key: PRNG key; the example in slot r uses fold_in(key, first_position + r).
          first_position: int32 [] position of slot 0 in the logical batch (so keys
            do not depend on how a logical batch is split into calls).

        Returns:
          grad_sum: float32 pytree like params, sum of clipped per-example
            gradients of the real examples (frozen leaves: zeros).
          metric_sums: dict of float32 [] batch totals of the loss metrics.
          num_nonfinite: int32 [], real examples whose gradient was zeroed because
            it (or the loss / metrics) was not finite.
        """
        ...


def global_norm(tree: PyTree) -> jax.Array:
    """float32 [] L2 norm of all leaves of `tree` together."""
    leaves = jax.tree.leaves(tree)
    return jnp.sqrt(sum(jnp.sum(jnp.square(x.astype(jnp.float32))) for x in leaves))


def clip_scale(norm: jax.Array, clip_norm: float) -> jax.Array:
    """1 / max(1, norm / C): the factor that clips a gradient of this norm to C."""
    return 1.0 / jnp.maximum(1.0, norm / clip_norm)


def use_and_clip(norm: jax.Array, loss: jax.Array, metrics: dict[str, jax.Array],
                 keep: jax.Array, clip_norm: float):
    """What every clipper does with one example's norm: it is used when kept and finite (its
    norm, its loss and every metric), and then clipped to C.

    Returns (use bool [], scale float32 [], clip: g -> g * scale where used and 0 elsewhere,
    the metrics zeroed where not used, nonfinite bool []: kept but dropped as non-finite).
    `jnp.where`, not a multiplication by 0: NaN * 0 is NaN.
    """
    # One reduction over every checked value: a chain of isfinite-and ops is cheap enough
    # for XLA to copy into each fusion that clips a leaf (tiny BERT's DP step: 58 copies of
    # ~70 instructions), where a reduction's result is computed once (issue 32, the DP step's
    # compile time; BENCHMARKS.md).  Adding `zero` (like the norm: per example) makes every
    # value batched, as concatenating batched with unbatched values fails under Explicit
    # mesh axes inside vmap; x + 0 is x for every float, inf and NaN included.
    zero = jnp.zeros_like(norm, jnp.float32)
    checked = [(jnp.asarray(v, jnp.float32) + zero).reshape(-1)
               for v in (norm, loss, *metrics.values())]
    finite = jnp.all(jnp.isfinite(jnp.concatenate(checked)))
    use = keep & finite
    scale = clip_scale(norm, clip_norm)
    clip = lambda g: jnp.where(use, g * scale, 0.0)  # noqa: E731
    kept = {k: jnp.where(use, jnp.asarray(v, jnp.float32), 0.0) for k, v in metrics.items()}
    return use, scale, clip, kept, keep & ~finite


def _check_clip_norm(clip_norm: float) -> None:
    if not (isinstance(clip_norm, (int, float)) and clip_norm > 0) or math.isnan(clip_norm):
        raise ValueError(f"clip_norm={clip_norm!r} must be > 0 (math.inf disables clipping)")


@dataclasses.dataclass(frozen=True)
class VmapClipper:
    """`GradientClipper` with per-example gradients from vmap, in microbatches.

    Attributes:
      clip_norm: C > 0; ``math.inf`` disables clipping (testing only).
      microbatch_size: GLOBAL number of examples per scan iteration (all shards
        together); None = the whole physical batch at once.  Must divide the
        physical batch size and be a multiple of `num_shards`.
      num_shards: number of data shards the batch axis is split over (1 on a
        single device).  Only used for the layout described in the module
        docstring; results do not depend on it beyond float rounding.
      trainable: trainable filter (see `dpbert.dp.trees.TrainableFilter`);
        frozen leaves get no gradient, are excluded from the clipped norm, and
        come out as zeros.
    """

    clip_norm: float
    microbatch_size: int | None = None
    num_shards: int = 1
    trainable: trees.TrainableFilter = None

    def __post_init__(self):
        _check_clip_norm(self.clip_norm)
        if self.microbatch_size is not None and (
                not isinstance(self.microbatch_size, int) or self.microbatch_size < 1):
            raise ValueError(f"microbatch_size={self.microbatch_size!r} must be a positive int")
        if not isinstance(self.num_shards, int) or self.num_shards < 1:
            raise ValueError(f"num_shards={self.num_shards!r} must be a positive int")

    def layout(self, batch_size: int) -> tuple[int, int, int]:
        """(num_shards S, examples per shard per iteration m/S, n_chunks) for B examples."""
        m = batch_size if self.microbatch_size is None else self.microbatch_size
        s = self.num_shards
        if batch_size % m:
            raise ValueError(f"microbatch_size={m} does not divide the physical batch size "
                             f"{batch_size}")
        if m % s:
            raise ValueError(f"microbatch_size={m} (global) is not a multiple of "
                             f"num_shards={s}; every shard must get the same number of "
                             "examples per microbatch")
        return s, m // s, batch_size // m

    def per_example_clipped(self, loss_fn: LossFn, params: PyTree, batch: Batch,
                            mask: jax.Array, key: jax.Array, positions: jax.Array
                            ) -> tuple[list[jax.Array], dict[str, jax.Array], jax.Array]:
        """Clipped gradients of a chunk, per example (internal; tests use it).

        Args:
          batch, mask, positions: one chunk, leading axis [k]; positions int32 [k]
            are the examples' positions in the logical batch (RNG key fold_in(key, p)).

        Returns:
          clipped: list (trainable leaves in tree order) of float32 [k, *leaf].
          metrics: dict of float32 [k] (zero where dropped).
          nonfinite: bool [k], real examples dropped for non-finite values.
        """
        mask_tree = trees.resolve_trainable_mask(params, self.trainable)
        leaves, treedef = jax.tree.flatten(params)
        train_flags = jax.tree.leaves(mask_tree)
        train_leaves = [x for x, t in zip(leaves, train_flags) if t]
        frozen_leaves = [x for x, t in zip(leaves, train_flags) if not t]

        def merge(train: list[jax.Array]) -> PyTree:
            it_t, it_f = iter(train), iter(frozen_leaves)
            return jax.tree.unflatten(
                treedef, [next(it_t) if t else next(it_f) for t in train_flags])

        def one(example: Batch, keep: jax.Array, position: jax.Array):
            rng = prng.fold_in(key, position)

            def f(train):
                return loss_fn(merge(train), example, rng)

            (loss, metrics), grads = jax.value_and_grad(f, has_aux=True)(train_leaves)
            grads = [g.astype(jnp.float32) for g in grads]
            norm = global_norm(grads)
            _, _, clip, metrics, nonfinite = use_and_clip(norm, loss, metrics, keep,
                                                          self.clip_norm)
            return [clip(g) for g in grads], metrics, nonfinite

        return jax.vmap(one)(batch, mask, positions)

    def clipped_sum(self, loss_fn: LossFn, params: PyTree, batch: Batch,
                    mask: jax.Array, key: jax.Array, *, first_position: jax.Array | int = 0
                    ) -> tuple[PyTree, dict[str, jax.Array], jax.Array]:
        """See `GradientClipper.clipped_sum`."""
        s, per_shard, _ = self.layout(check_batch(batch, mask))
        mask_tree = trees.resolve_trainable_mask(params, self.trainable)
        train_flags = jax.tree.leaves(mask_tree)
        leaves, treedef = jax.tree.flatten(params)

        def chunk_sums(c_batch, c_mask, c_pos):
            clipped, metrics, nonfinite = self.per_example_clipped(
                loss_fn, params, c_batch, c_mask, key, c_pos)
            return ([shard_sum(g, s) for g in clipped],
                    {k: shard_sum(v, s) for k, v in metrics.items()},
                    shard_sum(nonfinite.astype(jnp.int32), s))

        g_parts, m_parts, nf_parts = scan_microbatches(
            chunk_sums, batch, mask, first_position, (s, per_shard))
        g_iter = iter([g.sum(0) for g in g_parts])
        grad_sum = jax.tree.unflatten(treedef, [
            next(g_iter) if t else jnp.zeros_like(x, jnp.float32)
            for x, t in zip(leaves, train_flags)])
        return grad_sum, {k: v.sum(0) for k, v in m_parts.items()}, nf_parts.sum(0)


# ----------------------------------------------------------------------------- registry

# What a clipper needs from the task's loss: "per_example" (`LossFn`), "factored" (a
# `dpbert.dp.ghost.FactoredLoss`, the per-example loss plus the factored view of the tied word
# embedding) or "batch" (`BatchLossFn`, the loss of a whole batch: non-private only).
LOSS_SHAPES = ("per_example", "factored", "batch")
# batch_loss(params, batch [B, ...], mask bool [B], keys uint32 [B, 2]) -> (loss summed over the
# real examples f32 [], metric sums dict[str, f32 []]). It may mix examples (TextHide).
BatchLossFn = Callable[[PyTree, Batch, jax.Array, jax.Array],
                       tuple[jax.Array, dict[str, jax.Array]]]


@dataclasses.dataclass(frozen=True)
class ClipperEntry:
    """A registered clipper: `make(clip_norm, microbatch_size, num_shards, trainable)` builds
    it; `loss_shape` says which loss it takes; `private` is False for the non-private path."""

    name: str
    make: Callable[..., GradientClipper]
    loss_shape: str
    private: bool


_CLIPPERS: dict[str, ClipperEntry] = {}


def register_clipper(name: str, *, loss_shape: str = "per_example", private: bool = True):
    """Class decorator: makes a `GradientClipper` selectable as `dp.clipping=name`.

    A new clipper is one module in `dpbert/dp/` with this decorator on its class (modules of
    the package are imported on the first lookup, so nothing else needs editing). The class
    is built as `cls(clip_norm, microbatch_size, num_shards, trainable)`.
    """
    if loss_shape not in LOSS_SHAPES:
        raise ValueError(f"loss_shape={loss_shape!r} is not one of {LOSS_SHAPES}")

    def register(cls):
        if name in _CLIPPERS and _CLIPPERS[name].make is not cls:
            raise ValueError(f"a clipper named {name!r} is already registered")
        _CLIPPERS[name] = ClipperEntry(name, cls, loss_shape, private)
        return cls

    return register


def _load_all() -> None:
    import importlib  # noqa: PLC0415
    import pkgutil  # noqa: PLC0415

    import dpbert.dp  # noqa: PLC0415

    for info in pkgutil.iter_modules(dpbert.dp.__path__):
        importlib.import_module(f"dpbert.dp.{info.name}")


def get_clipper(name: str) -> ClipperEntry:
    """The registered clipper `name` (ValueError listing the names if unknown)."""
    if name not in _CLIPPERS:
        _load_all()
    if name not in _CLIPPERS:
        raise ValueError(f"unknown clipper {name!r}; registered: {clipper_names()}")
    return _CLIPPERS[name]


def clipper_names(*, private: bool = True) -> tuple[str, ...]:
    """Names of the registered clippers (the DP ones by default)."""
    _load_all()
    return tuple(sorted(n for n, e in _CLIPPERS.items() if e.private == private))


register_clipper("vmap")(VmapClipper)


@register_clipper("none", loss_shape="batch", private=False)
@dataclasses.dataclass(frozen=True)
class BatchGradient:
    """The non-private gradient: d/dθ of the batch loss, no per-example gradient, no clipping.

    `clipped_sum` returns the gradient of the batch's summed loss (microbatched like the DP
    clippers; frozen leaves zero), so `DPAggregator` with no noise and the public batch size as
    `expected_batch_size` is plain mini-batch training. Refuses a finite clip norm: clipping
    needs per-example gradients, i.e. a DP clipper.
    """

    clip_norm: float = math.inf
    microbatch_size: int | None = None
    num_shards: int = 1
    trainable: trees.TrainableFilter = None

    def __post_init__(self):
        if self.clip_norm != math.inf:
            raise ValueError("the non-private gradient does not clip: clip_norm must be inf")
        VmapClipper(self.clip_norm, self.microbatch_size, self.num_shards)  # validates

    def clipped_sum(self, loss_fn: BatchLossFn, params: PyTree, batch: Batch,
                    mask: jax.Array, key: jax.Array, *, first_position: jax.Array | int = 0
                    ) -> tuple[PyTree, dict[str, jax.Array], jax.Array]:
        """See `GradientClipper.clipped_sum` (`loss_fn` is a batch loss; num_nonfinite is 1
        when the batch's loss or gradient is not finite, a signal to stop the run)."""
        layout = VmapClipper(self.clip_norm, self.microbatch_size, self.num_shards).layout(
            check_batch(batch, mask))
        flags = jax.tree.leaves(trees.resolve_trainable_mask(params, self.trainable))
        treedef = jax.tree.structure(params)

        def chunk_sums(c_batch, c_mask, c_pos):
            keys = prng.fold_in(key, c_pos)

            def f(p):
                return loss_fn(p, c_batch, c_mask, keys)

            (_, metrics), grads = jax.value_and_grad(f, has_aux=True)(params)
            grads = [jnp.where(t, g.astype(jnp.float32), 0.0)[None]
                     for g, t in zip(jax.tree.leaves(grads), flags)]
            return grads, {k: jnp.asarray(v, jnp.float32)[None] for k, v in metrics.items()}

        # The DP clippers' layout keeps every chunk's rows on the shards that hold them.
        g_parts, m_parts = scan_microbatches(chunk_sums, batch, mask, first_position,
                                             layout[:2])
        grad_sum = jax.tree.unflatten(treedef, [g[0] for g in g_parts])
        finite = jnp.all(jnp.stack([jnp.all(jnp.isfinite(g)) for g in g_parts]))
        return grad_sum, {k: v[0] for k, v in m_parts.items()}, (~finite).astype(jnp.int32)


def batch_loss(loss_fn: LossFn) -> BatchLossFn:
    """The batch loss of a per-example loss: the sum over the real examples."""

    def fn(params, batch, mask, keys):
        losses, metrics = jax.vmap(loss_fn, in_axes=(None, 0, 0))(params, batch, keys)
        w = mask.astype(jnp.float32)
        return (jnp.sum(losses * w),
                {k: jnp.sum(jnp.asarray(v, jnp.float32) * w) for k, v in metrics.items()})

    return fn


def check_batch(batch: Batch, mask: jax.Array) -> int:
    """The physical batch size B = len(mask); raises if a batch array has another one."""
    batch_size = mask.shape[0]
    for name, x in batch.items():
        if x.shape[:1] != (batch_size,):
            raise ValueError(f"batch[{name!r}] has shape {x.shape}; expected leading "
                             f"axis {batch_size} (the mask's)")
    return batch_size


def shard_sum(x: jax.Array, num_shards: int) -> jax.Array:
    """Per-shard partial sums of a chunk: [S * m/S, ...] -> [S, ...]."""
    return x.reshape((num_shards, x.shape[0] // num_shards) + x.shape[1:]).sum(1)


def scan_microbatches(chunk_sums: Callable[[Batch, jax.Array, jax.Array], PyTree],
                      batch: Batch, mask: jax.Array, first_position: jax.Array | int,
                      layout: tuple[int, int]) -> PyTree:
    """Sum over the microbatches of `chunk_sums`, in the layout of the module docstring.

    Args:
      chunk_sums: (batch [k, ...], mask bool [k], positions int32 [k]) -> pytree of
        per-shard partial sums [S, ...] of one microbatch (k = S * m/S examples, shard
        s owning rows s*m/S .. (s+1)*m/S - 1).
      batch, mask: the physical batch, leading axis [B].
      first_position: position of slot 0 in the logical batch.
      layout: (S, m/S) from `VmapClipper.layout` (B / m chunks).

    Returns:
      The pytree of `chunk_sums` summed over the chunks (still [S, ...] per shard).
    """
    s, per_shard = layout
    batch_size = mask.shape[0]
    n_chunks = batch_size // (s * per_shard)

    def to_chunks(x: jax.Array) -> jax.Array:
        # [B, ...] -> [S, m/S, n_chunks, ...] -> [n_chunks, S, m/S, ...]
        return jnp.moveaxis(x.reshape((s, per_shard, n_chunks) + x.shape[1:]), 2, 0)

    # Slot indices with the mask's sharding (replicated + sharded -> sharded), so
    # that under Explicit mesh axes vmap sees identically sharded inputs.
    positions = (jnp.zeros_like(mask, jnp.int32) + jnp.arange(batch_size, dtype=jnp.int32)
                 + jnp.asarray(first_position, jnp.int32))
    xs = jax.tree.map(to_chunks, (batch, mask.astype(bool), positions))

    def flat_chunk(chunk):
        flat = lambda x: x.reshape((s * per_shard,) + x.shape[2:])  # noqa: E731
        return chunk_sums(*jax.tree.map(flat, chunk))

    if n_chunks == 1:
        # No loop: a loop would carry the (read-only) parameters in its state, and when the
        # caller donates them XLA copies them into temp memory (params + optimizer state).
        return flat_chunk(jax.tree.map(lambda x: x[0], xs))

    # Zero carry with the right structure (e.g. metric names come from the loss).
    carry_shape = jax.eval_shape(flat_chunk, jax.tree.map(lambda x: x[0], xs))
    init = jax.tree.map(lambda sd: jnp.zeros(sd.shape, sd.dtype,
                                             out_sharding=getattr(sd, "sharding", None)),
                        carry_shape)

    def body(carry, chunk):
        return jax.tree.map(jnp.add, carry, flat_chunk(chunk)), None

    total, _ = jax.lax.scan(body, init, xs)
    return total

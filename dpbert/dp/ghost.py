"""Clipped per-example gradient sums without a per-example gradient of a tied embedding.

`TiedEmbeddingClipper` is a `dpbert.dp.clipping.GradientClipper` that gives the same
clipped sum as `VmapClipper` (same norms over all trainable parameters, same clip
factors, masking, non-finite handling, RNG keys, metric sums and microbatch layout)
but never forms the per-example gradient of the tied word-embedding table
E [V, H], which for BERT (V = 30,522) dominates the memory and time of the vmap path.

For one example, with ids t = 1..S looked up as input vectors x_t = E[id_t] and
masked positions p = 1..P whose MLM logits are logits_p = f_p E^T + b:

    xbar_t = dL/dx_t [H],   d_p = dL/dlogits_p [V],   f_p [H]   (all float32)
    G      = dL/dE   = sum_t onehot(id_t) xbar_t^T + sum_p d_p f_p^T            [V, H]
    ||G||^2 = sum_{t,t'} [id_t = id_t'] xbar_t.xbar_t'                 (input scatter)
            + sum_{p,p'} (d_p.d_p') (f_p.f_p')                          (decoder)
            + 2 sum_{t,p} d_p[id_t] (xbar_t.f_p)                       (cross term)

(Li et al. 2022 and Bu et al. 2023 use the same "ghost norm" identities for linear
and embedding layers.)  The other parameters' per-example gradients g_rest (small;
the MLM output bias b is one of them) are materialised by vmap as in `VmapClipper`:

    norm_i = sqrt(||g_rest,i||^2 + ||G_i||^2),  s_i = 1 / max(1, norm_i / C)

and the clipped sum of E over a microbatch is

    sum_i s_i G_i = scatter_add(rows id_{i,t} <- s_i xbar_{i,t}) + (s * D)^T F

with D [k*P, V] and F [k*P, H] the stacked d and f of the microbatch: one
[V, k*P] x [k*P, H] matmul instead of k dense [V, H] gradients.  With the dχ
token_rep input (the example carries its own `word_embeddings`) E is used by the
decoder only and the scatter and cross terms vanish.  If E gets no gradient
(frozen by the trainable filter or by the loss), this is exactly `VmapClipper`
without E.

The loss must expose the factored view (`FactoredLoss`, e.g.
`dpbert.models.losses.make_factored_pretraining_loss`).  Matmuls of the norm and of the
sum use Precision.HIGHEST: the norm must bound the gradient that is really added,
and TPUs (and TF32 GPUs) would otherwise round float32 operands to fewer bits.

Privacy: nothing here is per-example except inside the vmapped function; only
per-shard batch totals leave it, as in `VmapClipper`.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp

from dpbert import prng
from dpbert.dp import clipping
from dpbert.dp import trees

PyTree = Any
Batch = clipping.Batch
_HIGHEST = jax.lax.Precision.HIGHEST


@runtime_checkable
class FactoredLoss(Protocol):
    """A per-example loss whose tied table E [V, H] enters only as x = E[ids] and f E^T.

    See `dpbert.models.losses.FactoredPretrainingLoss` for the reference implementation.
    """

    # Path names of E in the params (`dpbert.dp.trees.path_names` form).
    table_path: tuple[str, ...]
    # True if the loss itself stops E's gradient (then E contributes nothing).
    frozen_word_embedding: bool

    def __call__(self, params: PyTree, example: Batch, rng: jax.Array
                 ) -> tuple[jax.Array, dict[str, jax.Array]]:
        """The plain per-example loss (`dpbert.dp.clipping.LossFn`)."""
        ...

    def lookup_ids(self, example: Batch) -> jax.Array | None:
        """int [S] rows of E looked up as inputs, or None if the inputs do not use E."""
        ...

    def zero_probe(self, example: Batch, vocab_size: int) -> jax.Array:
        """float32 zeros [P, V] added to the logits."""
        ...

    def factored(self, params: PyTree, example: Batch, rng: jax.Array,
                 x: jax.Array | None, probe: jax.Array
                 ) -> tuple[jax.Array, tuple[dict[str, jax.Array], jax.Array]]:
        """(loss, (metrics, f [P, H])) with inputs x [S, H] (None: no lookup) and the probe."""
        ...


def embedding_sq_norm(ids: jax.Array | None, xbar: jax.Array | None, d: jax.Array,
                      f: jax.Array) -> jax.Array:
    """||sum_t onehot(id_t) xbar_t^T + d^T f||_F^2 without forming the [V, H] matrix.

    Args:
      ids: int [S] looked-up rows, or None (no input lookup: decoder term only).
      xbar: float32 [S, H] gradients of the looked-up vectors (None with ids None).
      d: float32 [P, V] gradients of the logits.
      f: float32 [P, H] decoder inputs.

    Returns:
      float32 [], >= 0 unless an input is not finite (then NaN or inf).
    """
    dot = lambda a, b: jnp.einsum("ih,jh->ij", a, b, precision=_HIGHEST)  # noqa: E731
    sq = jnp.sum(dot(d, d) * dot(f, f))
    if ids is not None:
        same = ids[:, None] == ids[None, :]
        sq += jnp.sum(jnp.where(same, dot(xbar, xbar), 0.0))
        d_at_ids = jnp.take(d, ids, axis=1)  # [P, S]: d_p[id_t]
        sq += 2.0 * jnp.sum(d_at_ids * dot(f, xbar))
    # Round-off can push an (almost) zero norm below 0; NaN stays NaN (not < 0).
    return jnp.where(sq < 0.0, 0.0, sq)


def embedding_shard_sums(d: jax.Array, f: jax.Array, ids: jax.Array | None,
                         xbar: jax.Array | None, shards: int, per_shard: int) -> jax.Array:
    """The clipped sum of the tied embedding's per-example gradients, per batch shard, from
    the factors (both ghost clippers): sum_i s_i d_i^T f_i, one [V, a*P] x [a*P, H] matmul per
    shard, plus s_i xbar_{i,t} scattered into rows id_{i,t} (when the examples look E up).

    Args:
      d: float32 [k, P, V] clipped logit gradients; f: [k, P, H] decoder inputs (zero where
        dropped); ids: int [k, S] or None; xbar: float32 [k, S, H] clipped, or None;
      shards, per_shard: k = shards * per_shard.

    Returns:
      float32 [shards, V, H].
    """
    shard = lambda x: x.reshape((shards, per_shard) + x.shape[1:])  # noqa: E731
    table = jnp.einsum("sapv,saph->svh", shard(d), shard(f), precision=_HIGHEST)
    if ids is None:
        return table
    hidden = f.shape[-1]

    def scatter(acc, ids, xbar):
        return acc.at[ids.reshape(-1)].add(xbar.reshape(-1, hidden))

    return jax.vmap(scatter)(table, shard(ids), shard(xbar))


def _table_index(params: PyTree, table_path: tuple[str, ...]) -> int:
    paths = [trees.path_names(p) for p, _ in jax.tree_util.tree_leaves_with_path(params)]
    found = [i for i, p in enumerate(paths) if p == tuple(table_path)]
    if len(found) != 1:
        raise ValueError(f"TiedEmbeddingClipper: expected one parameter at "
                         f"{'/'.join(table_path)} (the tied embedding table), found {len(found)}")
    return found[0]


@clipping.register_clipper("ghost_embedding", loss_shape="factored")
@dataclasses.dataclass(frozen=True)
class TiedEmbeddingClipper:
    """`GradientClipper` with ghost norms for a tied embedding table (see module doc).

    Same attributes and layout rules as `dpbert.dp.clipping.VmapClipper`; the loss
    given to `clipped_sum` must be a `FactoredLoss`.

    Attributes:
      clip_norm: C > 0; ``math.inf`` disables clipping (testing only).
      microbatch_size: GLOBAL examples per scan iteration; None = the whole batch.
      num_shards: data shards the batch axis is split over.
      trainable: trainable filter (`dpbert.dp.trees.TrainableFilter`).
    """

    clip_norm: float
    microbatch_size: int | None = None
    num_shards: int = 1
    trainable: trees.TrainableFilter = None

    def __post_init__(self):
        self._vmap()  # validates the shared fields

    def _vmap(self, trainable: trees.TrainableFilter = None) -> clipping.VmapClipper:
        return clipping.VmapClipper(self.clip_norm, self.microbatch_size, self.num_shards,
                                    self.trainable if trainable is None else trainable)

    def layout(self, batch_size: int) -> tuple[int, int, int]:
        """See `VmapClipper.layout`."""
        return self._vmap().layout(batch_size)

    def table_gets_gradient(self, loss_fn: FactoredLoss, params: PyTree) -> bool:
        """False if E is frozen by the trainable filter or by the loss: then `clipped_sum`
        is `VmapClipper`'s without E (E comes out as zeros)."""
        return self._split(loss_fn, params)[2]

    def _split(self, loss_fn: FactoredLoss, params: PyTree
               ) -> tuple[int, list[bool], bool]:
        """(index of E among the leaves, trainable flags, whether E gets a gradient)."""
        if not isinstance(loss_fn, FactoredLoss):
            raise TypeError(
                f"TiedEmbeddingClipper needs a loss with the factored view of the tied "
                f"embedding (dpbert.models.losses.make_factored_pretraining_loss); got "
                f"{type(loss_fn).__name__}. Use VmapClipper (dp.clipping='vmap') for other "
                "losses.")
        index = _table_index(params, loss_fn.table_path)
        flags = jax.tree.leaves(trees.resolve_trainable_mask(params, self.trainable))
        return index, flags, flags[index] and not loss_fn.frozen_word_embedding

    def per_example(self, loss_fn: FactoredLoss, params: PyTree, batch: Batch,
                    mask: jax.Array, key: jax.Array, positions: jax.Array) -> dict[str, Any]:
        """Per-example pieces of a chunk (internal; tests use it).  E must get a gradient.

        Args:
          batch, mask, positions: one chunk, leading axis [k]; positions int32 [k]
            are the examples' positions in the logical batch (RNG key fold_in(key, p)).

        Returns a dict of:
          rest: list (trainable leaves other than E, in tree order) of float32
            [k, *leaf], clipped, zero where dropped.
          ids: int [k, S] looked-up rows, or None (no lookup).
          xbar: float32 [k, S, H] clipped input-vector gradients (s_i xbar_i), or None.
          d: float32 [k, P, V] clipped logit gradients (s_i d_i).
          f: float32 [k, P, H] decoder inputs (zero where dropped).
          norm: float32 [k] unclipped per-example norms over all trainable parameters.
          metrics: dict of float32 [k] (zero where dropped).
          nonfinite: bool [k], real examples dropped for non-finite values.
        """
        index, flags, table_trains = self._split(loss_fn, params)
        if not table_trains:
            raise ValueError("per_example: the embedding table gets no gradient here")
        leaves, treedef = jax.tree.flatten(params)
        table = leaves[index]
        rest_idx = [i for i, t in enumerate(flags) if t and i != index]
        rest_leaves = [leaves[i] for i in rest_idx]

        def merge(rest: list[jax.Array]) -> PyTree:
            new = list(leaves)
            for i, x in zip(rest_idx, rest):
                new[i] = x
            return jax.tree.unflatten(treedef, new)

        def one(example: Batch, keep: jax.Array, position: jax.Array):
            rng = prng.fold_in(key, position)
            ids = loss_fn.lookup_ids(example)
            x = None if ids is None else jnp.take(table, ids, axis=0).astype(jnp.float32)
            probe = loss_fn.zero_probe(example, table.shape[0])

            def f(rest, x, probe):
                return loss_fn.factored(merge(rest), example, rng, x, probe)

            argnums = (0, 2) if x is None else (0, 1, 2)
            (loss, (metrics, feats)), grads = jax.value_and_grad(
                f, argnums=argnums, has_aux=True)(rest_leaves, x, probe)
            rest = [g.astype(jnp.float32) for g in grads[0]]
            xbar = None if x is None else grads[1]
            d = grads[-1]
            sq = sum(jnp.sum(jnp.square(g)) for g in rest) + embedding_sq_norm(
                ids, xbar, d, feats)
            norm = jnp.sqrt(sq)
            use, _, clip, metrics, nonfinite = clipping.use_and_clip(norm, loss, metrics, keep,
                                                                     self.clip_norm)
            return {
                "rest": [clip(g) for g in rest],
                "ids": ids,
                "xbar": None if xbar is None else clip(xbar),
                "d": clip(d),
                "f": jnp.where(use, feats, 0.0),
                "norm": norm,
                "metrics": metrics,
                "nonfinite": nonfinite,
            }

        return jax.vmap(one)(batch, mask, positions)

    def clipped_sum(self, loss_fn: FactoredLoss, params: PyTree, batch: Batch,
                    mask: jax.Array, key: jax.Array, *, first_position: jax.Array | int = 0
                    ) -> tuple[PyTree, dict[str, jax.Array], jax.Array]:
        """See `GradientClipper.clipped_sum`; `loss_fn` must be a `FactoredLoss`."""
        index, flags, table_trains = self._split(loss_fn, params)
        if not table_trains:
            # No gradient for E at all: the vmap path minus E (E comes out as zeros).
            without = [t and i != index for i, t in enumerate(flags)]
            return self._vmap(jax.tree.unflatten(jax.tree.structure(params), without)
                              ).clipped_sum(loss_fn, params, batch, mask, key,
                                            first_position=first_position)
        s, per_shard, _ = self.layout(clipping.check_batch(batch, mask))
        leaves, treedef = jax.tree.flatten(params)

        def chunk_sums(c_batch, c_mask, c_pos):
            out = self.per_example(loss_fn, params, c_batch, c_mask, key, c_pos)
            table = embedding_shard_sums(out["d"], out["f"], out["ids"], out["xbar"], s,
                                         per_shard)
            return (table, [clipping.shard_sum(g, s) for g in out["rest"]],
                    {k: clipping.shard_sum(v, s) for k, v in out["metrics"].items()},
                    clipping.shard_sum(out["nonfinite"].astype(jnp.int32), s))

        t_part, r_parts, m_parts, nf_parts = clipping.scan_microbatches(
            chunk_sums, batch, mask, first_position, (s, per_shard))
        out = [jnp.zeros_like(x, jnp.float32) for x in leaves]
        out[index] = t_part.sum(0)
        rest_idx = [i for i, t in enumerate(flags) if t and i != index]
        for i, g in zip(rest_idx, r_parts):
            out[i] = g.sum(0)
        return (jax.tree.unflatten(treedef, out), {k: v.sum(0) for k, v in m_parts.items()},
                nf_parts.sum(0))

"""Clipped per-example gradient sums without per-example gradients of BERT's big parameters.

`MixedGhostClipper` is a `dpbert.dp.clipping.GradientClipper` that gives the same clipped sum
as `VmapClipper` (same norms over all trainable parameters, same clip factors, masking,
non-finite handling, RNG keys, metric sums and microbatch layout) from ONE forward and ONE
backward pass per microbatch, without the per-example gradients of:

* the dense kernels W [I, O] (attention, MLP, pooler, MLM transform, NSP): with a [T, I] the
  layer's input and g = dL/dy [T, O] its output gradient for one example (T = tokens),

      G = a^T g,    ||G||^2 = sum_{t,s} (a_t . a_s)(g_t . g_s)        ("ghost norm", Gram)

  computed either way per layer: the Gram form costs ~T^2 (I + O) per example, the direct
  form (an ordinary per-example gradient from vmap) T I O and an [I, O] array per example;
  `dense_norm="auto"` takes the Gram form when T (I + O) < I O (fewer multiply-adds; Bu et
  al. 2023's rule 2 T^2 < I O is `dense_norm="bu"`; BENCHMARKS.md, "Ghost norms for dense
  layers", has the per-shape measurement);
* the tied word embedding E [V, H]: ghost norm and clipped sum of `dpbert.dp.ghost`
  (input-vector gradients xbar [S, H], logit gradients d [P, V], decoder inputs f [P, H]);
* the position table P [512, H]: the model adds P[:S] to the input vectors, so its
  per-example gradient is xbar in rows 0..S-1 (norm ||xbar||, no collisions).

Everything else (biases, LayerNorm, the segment table, the MLM output bias, and dense kernels
for which the direct form is chosen) is differentiated per example by vmap, as in
`VmapClipper`; these gradients are small.

How a and g are obtained.  The per-example loss is run with every dense layer tapped
(`dpbert.models.bert.DenseTap`): a zero "probe" is added to the output of each Gram-form layer,
and the gradient with respect to the probe is g; the layer's input a comes back as an
auxiliary output.  The kernels themselves are constants of that function, so the backward
pass never forms a kernel gradient.  With s_i = 1 / max(1, norm_i / C) the clipped sum
of a Gram-form kernel over a microbatch is then one matmul (book-keeping, Bu et al. 2023):

    sum_i s_i G_i = sum_i a_i^T (s_i g_i) = A^T (s * Gout)        A [k T, I], Gout [k T, O]

reusing the a and g of the norm pass instead of a second backward.

Precision and dtypes.  Norms and sums are float32 from the same float32 values (a and g
cast from the compute dtype, exactly), with Precision.HIGHEST, so each example's norm bounds
what it adds to the sum also under bfloat16 compute.  Only per-shard batch totals leave the
clipper; padding slots and examples with a non-finite loss, metric or norm add exactly 0
(masked with `where`, which also clears a non-finite a or g).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Protocol, runtime_checkable

import jax
import jax.numpy as jnp

from dpbert import prng
from dpbert.dp import clipping
from dpbert.dp import ghost
from dpbert.dp import trees

PyTree = Any
Batch = clipping.Batch
_HIGHEST = jax.lax.Precision.HIGHEST
DENSE_NORMS = ("auto", "flops", "bu", "gram", "direct")


@runtime_checkable
class TappedLoss(ghost.FactoredLoss, Protocol):
    """A `ghost.FactoredLoss` that can also tap its dense layers and whose input vectors
    x enter as ``x + P[:S] + ...`` (see `dpbert.models.losses.FactoredPretrainingLoss`)."""

    # Path names of the position table P in the params.
    position_table_path: tuple[str, ...]

    def tapped(self, params: PyTree, example: Batch, rng: jax.Array, x: jax.Array,
               probe: jax.Array, dense_probes: dict[str, jax.Array]
               ) -> tuple[jax.Array, tuple[dict[str, jax.Array], jax.Array,
                                           dict[str, jax.Array]]]:
        """(loss, (metrics, f [P, H], inputs: layer name -> [..., I])); see the reference."""
        ...


def _input_vectors(loss_fn, table: jax.Array, example: Batch) -> jax.Array:
    """x [S, H], float32: the looked-up rows of E, else the loss's own input vectors
    (`input_vectors(example)`: a cached frozen prefix's output) or the example's
    `word_embeddings` (dχ token_rep)."""
    ids = loss_fn.lookup_ids(example)
    if ids is not None:
        x = jnp.take(table, ids, axis=0)
    elif hasattr(loss_fn, "input_vectors"):
        x = loss_fn.input_vectors(example)
    else:
        x = example["word_embeddings"]
    return x.astype(jnp.float32)


def gram_sq_norm(a: jax.Array, g: jax.Array) -> jax.Array:
    """||a^T g||_F^2 = sum_{t,s} (a_t . a_s)(g_t . g_s), float32 []; a [T, I], g [T, O]."""
    a = a.astype(jnp.float32)
    g = g.astype(jnp.float32)
    aa = jnp.einsum("ti,si->ts", a, a, precision=_HIGHEST)
    gg = jnp.einsum("to,so->ts", g, g, precision=_HIGHEST)
    return jnp.sum(aa * gg)


def use_gram(tokens: int, fan_in: int, fan_out: int, rule: str = "auto") -> bool:
    """Whether a dense layer's per-example norm is taken in the Gram form (see module doc).

    rule: "flops" -- Gram when T (I + O) < I O, i.e. when forming the two [T, T] Gram
    matrices (T^2 (I + O) multiply-adds per example) is cheaper than the per-example gradient
    (T I O); "bu" -- Bu et al. (2023)'s rule 2 T^2 < I O (their space comparison: two [T, T]
    matrices against one [I, O]); "auto" -- the rule chosen by measurement (currently
    "flops"); "gram" / "direct" -- always / never.
    """
    if rule not in DENSE_NORMS:
        raise ValueError(f"dense_norm={rule!r} must be one of {DENSE_NORMS}")
    if rule == "gram":
        return True
    if rule == "direct":
        return False
    if rule == "bu":
        return 2 * tokens * tokens < fan_in * fan_out
    return tokens * (fan_in + fan_out) < fan_in * fan_out


@dataclasses.dataclass(frozen=True)
class _Plan:
    """Which parameter is handled how (static; built at trace time from shapes)."""

    leaves: list[Any]
    treedef: Any
    direct: list[int]                  # leaf indices differentiated per example by vmap
    table_leaf: int                    # E's index (used for the input lookup either way)
    table: int | None                  # E's index when E gets a gradient, else None
    position: int | None               # P's index when P gets a gradient, else None
    gram: dict[str, tuple[int, int, int, int]]  # layer -> (kernel index, T, I, O)
    out_shapes: dict[str, tuple[int, ...]]      # layer -> output shape (one example)


@clipping.register_clipper("mixed_ghost", loss_shape="factored")
@dataclasses.dataclass(frozen=True)
class MixedGhostClipper:
    """`GradientClipper` with ghost norms for dense layers and embeddings (module doc).

    Same attributes and layout rules as `dpbert.dp.clipping.VmapClipper`, plus:

    Attributes:
      dense_norm: per layer, `use_gram`'s rule: "auto" (= "flops": Gram form when
        T (I + O) < I O), "bu" (when 2 T^2 < I O), "gram" (every dense kernel), or "direct"
        (no dense kernel: per-example gradients by vmap).

    The loss must be a `TappedLoss` (`dpbert.models.losses.make_factored_pretraining_loss`).
    """

    clip_norm: float
    microbatch_size: int | None = None
    num_shards: int = 1
    trainable: trees.TrainableFilter = None
    dense_norm: str = "auto"

    def __post_init__(self):
        self._vmap()  # validates the shared fields
        if self.dense_norm not in DENSE_NORMS:
            raise ValueError(f"dense_norm={self.dense_norm!r} must be one of {DENSE_NORMS}")

    def _vmap(self) -> clipping.VmapClipper:
        return clipping.VmapClipper(self.clip_norm, self.microbatch_size, self.num_shards,
                                    self.trainable)

    def layout(self, batch_size: int) -> tuple[int, int, int]:
        """See `VmapClipper.layout`."""
        return self._vmap().layout(batch_size)

    # ------------------------------------------------------------------------- planning

    def plan(self, loss_fn: TappedLoss, params: PyTree, example: Batch) -> _Plan:
        """How each parameter is handled, for one (unbatched) example's shapes."""
        if not isinstance(loss_fn, TappedLoss):
            if isinstance(loss_fn, ghost.FactoredLoss):  # e.g. dpbert.dp.units' unit loss
                raise TypeError(
                    f"MixedGhostClipper needs the dense-layer taps of one example's loss; "
                    f"{type(loss_fn).__name__} has only the factored view (a per-unit loss, "
                    "dp.privacy_unit note / patient, has no taps: the position-table identity "
                    "assumes one sequence). Use dp.clipping='ghost_embedding' or 'vmap'.")
            raise TypeError(
                f"MixedGhostClipper needs a loss with the factored and tapped views "
                f"(dpbert.models.losses.make_factored_pretraining_loss); got "
                f"{type(loss_fn).__name__}. Use VmapClipper (dp.clipping='vmap') for other "
                "losses.")
        leaves, treedef = jax.tree.flatten(params)
        flags = jax.tree.leaves(trees.resolve_trainable_mask(params, self.trainable))
        paths = ["/".join(trees.path_names(p))
                 for p, _ in jax.tree_util.tree_leaves_with_path(params)]
        where = {p: i for i, p in enumerate(paths)}

        def index(path: tuple[str, ...], what: str) -> int:
            name = "/".join(path)
            if name not in where:
                raise ValueError(f"MixedGhostClipper: expected the {what} at {name} in the "
                                 "parameters")
            return where[name]

        table = index(loss_fn.table_path, "tied word-embedding table")
        position = index(loss_fn.position_table_path, "position-embedding table")
        table_trains = flags[table] and not loss_fn.frozen_word_embedding

        # Shapes of every dense layer's input, from an abstract run of the tapped loss.
        def shapes(p, ex):
            x = _input_vectors(loss_fn, leaves[table], ex)
            return loss_fn.tapped(p, ex, jax.random.PRNGKey(0), x,
                                  loss_fn.zero_probe(ex, leaves[table].shape[0]), {})[1][2]

        with prng.shapes_only():  # dropout changes no shape; skipping it halves the trace
            inputs = jax.eval_shape(shapes, params, example)
        gram, out_shapes = {}, {}
        for name, a in inputs.items():
            kernel = index(tuple(name.split("/")) + ("kernel",), f"kernel of {name}")
            fan_in, fan_out = leaves[kernel].shape
            tokens = math.prod(a.shape[:-1])
            if flags[kernel] and use_gram(tokens, fan_in, fan_out, self.dense_norm):
                gram[name] = (kernel, tokens, fan_in, fan_out)
                out_shapes[name] = tuple(a.shape[:-1]) + (fan_out,)
        ghosted = {table, position} | {k for k, *_ in gram.values()}
        direct = [i for i, t in enumerate(flags) if t and i not in ghosted]
        return _Plan(leaves, treedef, direct, table, table if table_trains else None,
                     position if flags[position] else None, gram, out_shapes)

    # ------------------------------------------------------------------------- per example

    def per_example(self, loss_fn: TappedLoss, params: PyTree, batch: Batch,
                    mask: jax.Array, key: jax.Array, positions: jax.Array,
                    plan: _Plan | None = None) -> dict[str, Any]:
        """Per-example pieces of a chunk (internal; tests use it).

        Args:
          batch, mask, positions: one chunk, leading axis [k]; positions int32 [k] are the
            examples' positions in the logical batch (RNG key fold_in(key, p)).

        Returns a dict of (all zero where an example is dropped):
          direct: list (plan.direct order) of float32 [k, *leaf], clipped.
          ids: int [k, S] looked-up rows of E, or None (dχ token_rep input).
          xbar: float32 [k, S, H] clipped input-vector gradients, or None (unused).
          d, f: float32 [k, P, V] clipped logit gradients and [k, P, H] decoder inputs
            (None when E gets no gradient).
          a, g: layer -> [k, ..., I] inputs and [k, ..., O] output gradients (unclipped)
            of the Gram-form layers, both in the layer's compute dtype.
          scale: float32 [k] clip factors s_i (0 where dropped).
          norm: float32 [k] unclipped norms over all trainable parameters.
          metrics: dict of float32 [k]; nonfinite: bool [k] real examples dropped.
        """
        if plan is None:
            plan = self.plan(loss_fn, params, jax.tree.map(lambda x: x[0], batch))
        leaves = plan.leaves
        table = leaves[plan.table_leaf]
        direct_leaves = [leaves[i] for i in plan.direct]
        need_xbar = plan.table is not None or plan.position is not None

        def merge(direct: list[jax.Array]) -> PyTree:
            new = list(leaves)
            for i, x in zip(plan.direct, direct):
                new[i] = x
            return jax.tree.unflatten(plan.treedef, new)

        def one(example: Batch, keep: jax.Array, position: jax.Array):
            rng = prng.fold_in(key, position)
            ids = loss_fn.lookup_ids(example)
            x = _input_vectors(loss_fn, table, example)
            probe = loss_fn.zero_probe(example, table.shape[0])
            probes = {n: jnp.zeros(s, jnp.float32) for n, s in plan.out_shapes.items()}

            def f(direct, x, probe, probes):
                return loss_fn.tapped(merge(direct), example, rng, x, probe, probes)

            (loss, (metrics, feats, inputs)), (g_direct, xbar, d, g_dense) = (
                jax.value_and_grad(f, argnums=(0, 1, 2, 3), has_aux=True)(
                    direct_leaves, x, probe, probes))
            g_direct = [g.astype(jnp.float32) for g in g_direct]
            # a and g are kept in the layer's compute dtype (half the memory in bfloat16).
            g_dense = {n: g.astype(inputs[n].dtype) for n, g in g_dense.items()}
            # The norm and the sum must see the same numbers.  Without the barrier XLA may
            # compute the norm from an unrounded float32 value where the sum reads the stored
            # bfloat16 one (it folds convert(convert(x, bf16), f32) into x), and the norm
            # would no longer bound what the example adds.
            g_direct, xbar, d, feats, inputs, g_dense = jax.lax.optimization_barrier(
                (g_direct, xbar, d, feats, inputs, g_dense))
            sq = sum((jnp.sum(jnp.square(g)) for g in g_direct), jnp.zeros((), jnp.float32))
            if plan.table is not None:
                sq += ghost.embedding_sq_norm(ids, xbar, d, feats)
            if plan.position is not None:
                sq += jnp.sum(jnp.square(xbar))
            for name, (_, tokens, fan_in, fan_out) in plan.gram.items():
                sq += gram_sq_norm(inputs[name].reshape(tokens, fan_in),
                                   g_dense[name].reshape(tokens, fan_out))
            # Round-off can push an (almost) zero norm below 0; NaN stays NaN (not < 0).
            norm = jnp.sqrt(jnp.where(sq < 0.0, 0.0, sq))
            use, scale, clip, metrics, nonfinite = clipping.use_and_clip(
                norm, loss, metrics, keep, self.clip_norm)
            keep_if = lambda v: jnp.where(use, v, jnp.zeros((), v.dtype))  # noqa: E731
            return {
                "direct": [clip(g) for g in g_direct],
                "ids": ids if plan.table is not None else None,
                "xbar": clip(xbar) if need_xbar else None,
                "d": clip(d) if plan.table is not None else None,
                "f": keep_if(feats) if plan.table is not None else None,
                # Unscaled (s_i is applied in float32 in the sum).
                "a": {n: keep_if(inputs[n]) for n in plan.gram},
                "g": {n: keep_if(g_dense[n]) for n in plan.gram},
                "scale": jnp.where(use, scale, 0.0),
                "norm": norm,
                "metrics": metrics,
                "nonfinite": nonfinite,
            }

        return jax.vmap(one)(batch, mask, positions)

    # ------------------------------------------------------------------------- the sum

    def clipped_sum(self, loss_fn: TappedLoss, params: PyTree, batch: Batch,
                    mask: jax.Array, key: jax.Array, *, first_position: jax.Array | int = 0
                    ) -> tuple[PyTree, dict[str, jax.Array], jax.Array]:
        """See `GradientClipper.clipped_sum`; `loss_fn` must be a `TappedLoss`."""
        s, per_shard, _ = self.layout(clipping.check_batch(batch, mask))
        plan = self.plan(loss_fn, params, jax.tree.map(lambda x: x[0], batch))
        leaves = plan.leaves

        def chunk_sums(c_batch, c_mask, c_pos):
            out = self.per_example(loss_fn, params, c_batch, c_mask, key, c_pos, plan)
            shard = lambda x: x.reshape((s, per_shard) + x.shape[1:])  # noqa: E731
            sums = {"direct": [clipping.shard_sum(g, s) for g in out["direct"]],
                    "metrics": {k: clipping.shard_sum(v, s) for k, v in out["metrics"].items()},
                    "nonfinite": clipping.shard_sum(out["nonfinite"].astype(jnp.int32), s)}
            if plan.table is not None:
                sums["table"] = ghost.embedding_shard_sums(out["d"], out["f"], out["ids"],
                                                           out["xbar"], s, per_shard)
            if plan.position is not None:
                sums["position"] = shard(out["xbar"]).sum(1)  # [S, seq, H]
            sums["dense"] = {}
            for name, (_, tokens, fan_in, fan_out) in plan.gram.items():
                a = out["a"][name].reshape(s, per_shard * tokens, fan_in)
                g = (out["g"][name].reshape(s, per_shard, tokens, fan_out).astype(jnp.float32)
                     * out["scale"].reshape(s, per_shard, 1, 1))
                sums["dense"][name] = jnp.einsum(
                    "sti,sto->sio", a.astype(jnp.float32),
                    g.reshape(s, per_shard * tokens, fan_out), precision=_HIGHEST)
            return sums

        total = clipping.scan_microbatches(chunk_sums, batch, mask, first_position,
                                           (s, per_shard))
        out = [jnp.zeros_like(x, jnp.float32) for x in leaves]
        for i, g in zip(plan.direct, total["direct"]):
            out[i] = g.sum(0)
        if plan.table is not None:
            out[plan.table] = total["table"].sum(0)
        if plan.position is not None:
            rows = total["position"].sum(0)
            out[plan.position] = out[plan.position].at[:rows.shape[0]].set(rows)
        for name, (kernel, *_) in plan.gram.items():
            out[kernel] = total["dense"][name].sum(0)
        return (jax.tree.unflatten(plan.treedef, out),
                {k: v.sum(0) for k, v in total["metrics"].items()}, total["nonfinite"].sum(0))


"""The DP-SGD update: clip -> accumulate -> noise -> optimizer, inside one jitted step.

Call sequence (all inside the training loop's ONE jitted, sharded train step;
`DPAggregator.update` is that whole sequence):

    1. grad_sum, metrics, n_bad = clipper.clipped_sum(loss_fn, params, batch, mask, k)
         float32 sum of clipped per-example gradients of this physical batch
         (scan over microbatches; `VmapClipper` by default, or
         `ghost.TiedEmbeddingClipper` for BERT's tied word embedding).
    2. acc = state.grad_acc + grad_sum            (float32; skipped if accumulation_steps == 1)
    3. if this call completes the logical batch (lax.cond, same jitted function):
         noisy = acc + N(0, (sigma C)^2 I)        one float32 draw, nothing in between
         g     = noisy / expected_batch_size      the public expected size, never the realised one
         params, opt_state = optimizer step on g  frozen leaves left unchanged
         acc   = 0
    4. return params, opt_state, state, metrics   metrics: batch totals only

A logical batch (one noise draw, one optimizer update, one accountant step)
spans `accumulation_steps` calls (Hoory et al.'s "batch spread in time").  The
optimizer never sees an un-noised gradient: it is only called on `noisy`.  The
result does not depend (beyond float rounding) on how a logical batch is split
into calls and microbatches, because per-example RNG keys depend on the
example's position and the noise key on the logical step only.

Randomness is owned by the state (raw uint32[2] keys):
  example at position p of logical batch t: fold_in(fold_in(fold_in(rng, 0), t), p)
      (dropout; p = micro_step * physical_batch_size + slot in the call)
  noise of logical batch t, leaf i:         fold_in(fold_in(noise_key, t), i)
`DPState.noise_key` must be secret: the training loop draws it from OS entropy
(`dpbert.dp.randomness`). The training loop keeps `DPState.rng` secret too in a DP run
(`randomness.dropout_key`): a position's dropout mask must not be predictable, since positions
depend on which other units the sampler drew. Without an
explicit noise key, `init` derives it from `rng` as fold_in(rng, 1) -- reproducible and NOT
private (tests). Noise keys never repeat across steps or leaves.

Sharding: `DPAggregator.state_sharding(param_shardings, replicated)` gives the
state's shardings (grad_acc like the params, counters and rng replicated) for the
jit's in/out shardings.  Set `DPConfig.num_shards` to the number of devices the
batch is split over (`dpbert.runtime.sharding.num_batch_shards(mesh)`); `microbatch_size`
is global (see `dpbert.dp.clipping`).

Typical wiring (training loop, issue 4)::

    agg = DPAggregator(DPConfig.from_config(config.dp), loss_fn, optimizer,
                       trainable=trainable)
    step = jax.jit(agg.update, donate_argnums=(0, 1, 2),
                   out_shardings=(p_sh, o_sh, agg.state_sharding(p_sh, rep), rep))
    while budget.may_take_step():                      # dpbert.dp.accounting
        for _ in range(config.dp.accumulation_steps):  # one logical batch
            indices, mask = next(sampler)               # dpbert.dp.sampling
            params, opt_state, dp_state, metrics = step(dp_state, params, opt_state,
                                                        load(indices), mask,
                                                        agg.stddev_argument())
        budget.record_step()                            # one noise draw was added
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
import optax

from dpbert import prng
from dpbert.dp import clipping
from dpbert.dp import noise as noise_lib
from dpbert.dp import trees

PyTree = Any
_EXAMPLE_STREAM = 0
_NOISE_STREAM = 1


@dataclasses.dataclass(frozen=True)
class DPConfig:
    """DP-SGD engine configuration.

    Attributes:
      clip_norm: C, per-example L2 clip norm over all trainable parameters
        (math.inf only with noise_multiplier=0, for testing).
      noise_multiplier: sigma as configured; noise std per logical batch is sigma*C
        (sigma*C*sqrt(num_shards) with noise_mode="per_shard").  0 = no noise
        (NOT private; testing only).
      expected_batch_size: q * N, the public expected logical batch size; the
        noisy sum is divided by it.
      microbatch_size: GLOBAL examples per scan iteration (None = whole physical
        batch); must divide the physical batch and be a multiple of num_shards.
      accumulation_steps: jitted calls per logical batch (>= 1).
      noise_mode: "global" (total std sigma*C whatever the number of shards) or
        "per_shard" (TF CrossShardOptimizer compatible, std sigma*C*sqrt(P)).
      num_shards: P, the number of devices the batch axis is split over
        (`dpbert.runtime.sharding.num_batch_shards(mesh)`, i.e. data x fsdp on dpbert's mesh).
        It sets the microbatch layout (one partial sum per shard) and, with
        noise_mode="per_shard", the noise std and the accounted sigma * sqrt(P).
      strategy: None (DP-SGD: i.i.d. noise) or BandMF's Toeplitz coefficients (c_0, ...,
        c_{b-1}), norm 1 (`dpbert.dp.bandmf`): the noise of step t is noise_stddev * y_t, y =
        C^-1 z, with the last b - 1 y's kept in `DPState.buffers`.
      noise_stddev: (not an argument) the total noise std, computed once from the fields
        (`dpbert.dp.noise_modes.noise_stddev`; `DPPlan.make_updater` passes the plan's sigma).
    """

    clip_norm: float
    noise_multiplier: float
    expected_batch_size: float
    microbatch_size: int | None = None
    accumulation_steps: int = 1
    noise_mode: str = "global"
    num_shards: int = 1
    strategy: tuple[float, ...] | None = None
    # sigma * C (* sqrt(P) per shard): computed once, here, from the fields above
    # (`dpbert.dp.noise_modes.noise_stddev`, which also validates them).
    noise_stddev: float = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self):
        if not (isinstance(self.expected_batch_size, (int, float))
                and 0 < self.expected_batch_size < math.inf):
            raise ValueError(f"expected_batch_size={self.expected_batch_size!r} must be a "
                             "positive finite number")
        if not isinstance(self.accumulation_steps, int) or self.accumulation_steps < 1:
            raise ValueError(f"accumulation_steps={self.accumulation_steps!r} must be an "
                             "int >= 1")
        if self.strategy is not None:
            strategy = tuple(float(c) for c in self.strategy)
            if not strategy or not all(math.isfinite(c) for c in strategy) or strategy[0] <= 0:
                raise ValueError(f"strategy={self.strategy!r} must be finite with c_0 > 0")
            object.__setattr__(self, "strategy", strategy)
        object.__setattr__(self, "noise_stddev", noise_lib.noise_stddev(
            self.clip_norm, self.noise_multiplier, self.noise_mode, self.num_shards))
        clipping.VmapClipper(self.clip_norm, self.microbatch_size, self.num_shards)

    @classmethod
    def from_config(cls, config: Any) -> "DPConfig":
        """From an ml_collections.ConfigDict (or a mapping) with these field names.

        Missing optional fields take their defaults; unknown fields are ignored
        (the DP config section may hold accounting fields too).
        """
        get = config.get if hasattr(config, "get") else (
            lambda k, d=None: getattr(config, k, d))
        kwargs = {}
        for f in dataclasses.fields(cls):
            if not f.init:
                continue
            value = get(f.name, None)
            if value is None:
                if f.default is dataclasses.MISSING:
                    raise ValueError(f"DP config lacks the required field {f.name!r}")
                continue
            kwargs[f.name] = value
        return cls(**kwargs)


@flax.struct.dataclass
class DPState:
    """Engine state carried between jitted calls; a pytree orbax can checkpoint.

    Attributes:
      grad_acc: float32 pytree like params, clipped sums of the current logical
        batch's calls so far (None when accumulation_steps == 1).  It is a sum of
        private gradients WITHOUT noise: checkpoint it only to storage as trusted
        as the training data, and never log it.
      micro_step: int32 [], calls already accumulated in the current logical batch.
      step: int32 [], logical steps (noise draws, optimizer updates) completed.
      rng: uint32 [2], raw PRNG key of per-example randomness (dropout).
      noise_key: uint32 [2], raw PRNG key of the Gaussian noise (secret: it is private like
        the data, kept only in checkpoints; never logged).
      buffers: BandMF only (None otherwise): (y_{t-1}, ..., y_{t-b+1}), each a list of float32
        arrays, one per trainable parameter leaf (`noise.buffer_zeros`), the correlated
        noise of the last b - 1 steps in units of noise_stddev
        (`dpbert.dp.noise.add_correlated_noise`). Secret like the noise key (they are the noise
        of released updates: with them the next update's noise is partly predictable), kept
        only in checkpoints.
    """

    grad_acc: PyTree
    micro_step: jax.Array
    step: jax.Array
    rng: jax.Array
    noise_key: jax.Array
    buffers: PyTree = None


def init_state(rng: jax.Array | int, noise_key: jax.Array | None = None,
               grad_acc: PyTree = None, buffers: PyTree = None) -> DPState:
    """A `DPState` at step 0 (see `DPAggregator.init`)."""
    if isinstance(rng, int):
        rng = jax.random.PRNGKey(rng)
    rng = jnp.asarray(rng, jnp.uint32)
    if noise_key is None:
        noise_key = jax.random.fold_in(rng, _NOISE_STREAM)
    return DPState(grad_acc=grad_acc, micro_step=jnp.zeros((), jnp.int32),
                   step=jnp.zeros((), jnp.int32), rng=rng,
                   noise_key=jnp.asarray(noise_key, jnp.uint32), buffers=buffers)


class DPAggregator:
    """Wires clipping, accumulation, noise and an optax optimizer (see module doc).

    Args:
      config: `DPConfig`.
      loss_fn: per-example loss ``loss_fn(params, example, rng) -> (loss, metrics)``.
      optimizer: any optax GradientTransformation; it only ever sees the noisy,
        normalised gradient.
      trainable: trainable filter (`dpbert.dp.trees.TrainableFilter`): frozen
        leaves get no gradient, no noise, and are not updated.
      clipper: a `GradientClipper`; default `VmapClipper(config...)`.
      noise_layouts: optional per-leaf layouts in which to add the noise
        (`dpbert.dp.noise.add_noise`, `dpbert.runtime.sharding.noise_layouts`); a speed knob, the
        noisy gradient is bitwise the same.
      noise_flat: draw all of the noise in one loop (`dpbert.dp.noise.gaussian_noise`'s
        `flat`: one copy of the generator in the step, which compiles in a fraction of the
        time); bitwise the same.  For one device (the trainer sets it when its mesh has one).
    """

    def __init__(self, config: DPConfig, loss_fn: clipping.LossFn,
                 optimizer: optax.GradientTransformation, *,
                 trainable: trees.TrainableFilter = None,
                 clipper: clipping.GradientClipper | None = None,
                 noise_layouts: PyTree | None = None, noise_flat: bool = False):
        self.config = config
        self.noise_layouts = noise_layouts
        self.noise_flat = noise_flat
        self.loss_fn = loss_fn
        self.optimizer = optimizer
        self.trainable = trainable
        self.clipper = clipper or clipping.VmapClipper(
            config.clip_norm, config.microbatch_size, config.num_shards, trainable)

    def init(self, params: PyTree, rng: jax.Array | int,
             noise_key: jax.Array | None = None) -> DPState:
        """Initial state; `rng` is an int seed or a raw uint32[2] key; `noise_key` a raw
        uint32[2] secret key (None: fold_in(rng, 1), reproducible and NOT private)."""
        trees.resolve_trainable_mask(params, self.trainable)  # validate early
        acc = (None if self.config.accumulation_steps == 1 else
               jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), params))
        buffers = (None if self.config.strategy is None else
                   tuple(noise_lib.buffer_zeros(params, self.trainable)
                         for _ in self.config.strategy[1:]))
        return init_state(rng, noise_key, acc, buffers)

    def state_sharding(self, param_sharding: PyTree, replicated: Any) -> DPState:
        """Shardings of a `DPState`: grad_acc like the params, the rest replicated.

        Use them as jit in/out shardings so that the state keeps its layout from
        call to call (no recompilation, no resharding).
        """
        acc = None if self.config.accumulation_steps == 1 else param_sharding
        # A BandMF buffer: one array per trainable leaf, laid out like that parameter.
        buffer = (None if self.config.strategy is None else
                  trees.trainable_leaves(param_sharding, self.trainable))
        buffers = (None if buffer is None else
                   tuple(buffer for _ in self.config.strategy[1:]))
        return DPState(grad_acc=acc, micro_step=replicated, step=replicated, rng=replicated,
                       noise_key=replicated, buffers=buffers)

    def example_key(self, state: DPState) -> jax.Array:
        """Key of the current logical batch's examples (example at position p:
        fold_in(., p), p = micro_step * physical_batch_size + slot)."""
        return prng.fold_in(prng.fold_in(state.rng, _EXAMPLE_STREAM), state.step)

    def noise_key(self, state: DPState) -> jax.Array:
        """Key of the noise of logical step `state.step` (leaf i: fold_in(., i))."""
        return prng.fold_in(state.noise_key, state.step)

    def noisy_gradient(self, state: DPState, clipped_sum: PyTree,
                       noise_stddev: jax.Array | None = None) -> PyTree:
        """(clipped_sum + N(0, std^2 I)) / expected_batch_size, float32 (BandMF: its
        correlated noise, `noisy_gradient_and_buffers`)."""
        return self.noisy_gradient_and_buffers(state, clipped_sum, noise_stddev)[0]

    def stddev(self, noise_stddev: jax.Array | None = None) -> float | jax.Array:
        """The noise std a step uses: `config.noise_stddev`, or `noise_stddev` (`update`'s
        argument) in its place when the config draws noise.  Whether noise is drawn at all is
        the config's (sigma = 0 draws none, whatever is passed)."""
        if noise_stddev is None or not noise_lib.draws(self.config.noise_stddev):
            return self.config.noise_stddev
        return jnp.asarray(noise_stddev, jnp.float32)

    def stddev_argument(self) -> np.ndarray:
        """`config.noise_stddev` as `update`'s `noise_stddev` argument (float32 [])."""
        return np.asarray(self.config.noise_stddev, np.float32)

    def noisy_gradient_and_buffers(self, state: DPState, clipped_sum: PyTree,
                                   noise_stddev: jax.Array | None = None
                                   ) -> tuple[PyTree, PyTree]:
        """((clipped_sum + noise) / expected_batch_size, float32; the new `buffers`). The noise:
        N(0, std^2 I), or BandMF's correlated noise (`noise.add_correlated_noise`); std: see
        `stddev`."""
        if self.config.strategy is None:
            noisy = noise_lib.add_noise(clipped_sum, self.noise_key(state),
                                        self.stddev(noise_stddev), self.trainable,
                                        self.noise_layouts, self.noise_flat)
            buffers = state.buffers
        else:
            noisy, buffers = noise_lib.add_correlated_noise(
                clipped_sum, self.noise_key(state), self.stddev(noise_stddev),
                self.config.strategy, state.buffers, self.trainable, self.noise_layouts,
                self.noise_flat)
        return jax.tree.map(lambda g: g / self.config.expected_batch_size, noisy), buffers

    def _apply(self, state: DPState, params: PyTree, opt_state: PyTree,
               clipped_sum: PyTree, noise_stddev: jax.Array | None,
               optimizer: optax.GradientTransformation | None
               ) -> tuple[PyTree, PyTree, PyTree]:
        grads, buffers = self.noisy_gradient_and_buffers(state, clipped_sum, noise_stddev)
        updates, opt_state = (optimizer or self.optimizer).update(grads, opt_state, params)
        mask = trees.resolve_trainable_mask(params, self.trainable)
        updates = jax.tree.map(lambda u, t: u if t else jnp.zeros_like(u), updates, mask)
        return optax.apply_updates(params, updates), opt_state, buffers

    def update(self, state: DPState, params: PyTree, opt_state: PyTree,
               batch: clipping.Batch, mask: jax.Array, noise_stddev: jax.Array | None = None,
               optimizer: optax.GradientTransformation | None = None
               ) -> tuple[PyTree, PyTree, DPState, dict[str, jax.Array]]:
        """One jitted call on a physical batch (see module docstring).

        Args:
          state: `DPState`.
          params: parameter pytree (float32).
          opt_state: the optimizer's state.
          batch: dict of arrays [B, ...] (one physical batch).
          mask: bool [B], False for padding slots.
          noise_stddev: None (the noise std is `config.noise_stddev`, a constant of the
            compiled program), or float32 [] with that value (`stddev_argument`), passed as
            an argument of the jitted step: then the program does not depend on sigma, and
            one compiled step (JAX's persistent cache) serves every sigma -- a fresh start
            whose sigma was calibrated again on rebuilt data, a sweep over epsilon.  The
            training loop passes it.  Whether noise is drawn is the config's (`stddev`).
          optimizer: None (the aggregator's), or an optimizer with the same state layout built
            while the step is traced (the training loop's, from the step's argument of
            optimizer numbers: `dpbert.runtime.optimizers.make_optimizer`'s `numbers`).

        Returns:
          (params, opt_state, state, metrics): params/opt_state updated only when
          this call completes a logical batch; metrics are float32 [] batch totals
          of the loss's metric sums plus "num_nonfinite" (int32 []).  They are
          exact (un-noised) totals over private examples, outside the DP
          guarantee: fine for debugging, but a published training curve should
          come from public or held-out data.
        """
        grad_sum, metrics, nonfinite = self.clipper.clipped_sum(
            self.loss_fn, params, batch, mask, self.example_key(state),
            first_position=state.micro_step * mask.shape[0])
        metrics = dict(metrics, num_nonfinite=nonfinite)
        if self.config.accumulation_steps == 1:
            params, opt_state, buffers = self._apply(state, params, opt_state, grad_sum,
                                                     noise_stddev, optimizer)
            return params, opt_state, state.replace(step=state.step + 1,
                                                    buffers=buffers), metrics

        acc = jax.tree.map(jnp.add, state.grad_acc, grad_sum)
        is_last = state.micro_step == self.config.accumulation_steps - 1

        def apply_branch(operands):
            p, o, a, _ = operands
            p, o, buffers = self._apply(state, p, o, a, noise_stddev, optimizer)
            return p, o, jax.tree.map(jnp.zeros_like, a), buffers

        params, opt_state, acc, buffers = jax.lax.cond(
            is_last, apply_branch, lambda operands: operands,
            (params, opt_state, acc, state.buffers))
        state = state.replace(
            grad_acc=acc, buffers=buffers,
            micro_step=jnp.where(is_last, 0, state.micro_step + 1).astype(jnp.int32),
            step=state.step + is_last.astype(jnp.int32))
        return params, opt_state, state, metrics

"""Per-unit losses: a privacy unit (a note, a patient) made to look like ONE example.

(What the units are, and which group several sequences: `dpbert.core.units`.)

With `dp.privacy_unit` note or patient (issue 15) a physical batch holds units, not examples:
every feature is [units, K, ...] (K = `dp.max_examples_per_unit` slots per unit, filled by
`dpbert.dp.sampling.UnitPoissonSampler`) with `EXAMPLE_MASK` bool [units, K] saying which
slots hold a real example, and the clipper's mask [units] saying which rows hold a unit. The
clippers are not changed: they vmap a per-example loss over the leading axis and clip each
row's gradient once to C. So this module wraps the task's loss into a loss of ONE unit,

    L_u = sum_k m_k L(example_k)  /  max(1, sum_k m_k)     ("mean", the default)
    L_u = sum_k m_k L(example_k)                           ("sum")

computed inside the per-example function over the unit's K axis. Then any clipper gives
per-unit gradients, clips each once to C and sums them: one unit (all its examples in the
batch, at most K) changes the clipped sum by at most C, which is the sensitivity the noise
sigma * C and the accountant (N = number of units) assume. Nothing crosses units.

mean vs sum: the unit's gradient before clipping is the average (mean) or the total (sum) of
its examples' gradients. With mean a unit with many examples weighs like a unit with one, and
its gradient norm is like one example's (so C tuned per example still fits); with sum a unit
with n examples has n times the weight until it is clipped, so units with many examples are
clipped harder and C may need to grow with K. BENCHMARKS.md ("Privacy unit") measures both.

Randomness: the clipper gives the unit the key fold_in(key, position of the unit); its example
in slot k gets fold_in(that key, k), unique per example. Metrics are the sums over the unit's
real examples (metric sums stay per example: `count` counts examples).

The ghost clipper (`dpbert.dp.ghost`) needs the factored view of the tied embedding E. For a
sum of examples the ghost-norm identities hold with the unit's factors concatenated:
dL_u/dE = sum_k [sum_t onehot(id_kt) xbar_kt^T + d_k^T f_k], i.e. the identity of ONE example
whose lookups are the K*S ids and whose predictions are the K*P positions (the weights m_k and
1/n sit inside xbar and d). `UnitFactoredLoss` presents exactly that.

Not wrapped: the batch loss of the non-private path (a non-private run has no unit) and the
dense-layer taps of a mixed ghost clipper (its position-table identity assumes one sequence:
rows 0..S-1 would collide across a unit's examples).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from dpbert import prng
from dpbert.dp import clipping, ghost

PyTree = Any
EXAMPLE_MASK = "example_mask"  # = data_pipelines.datasets.EXAMPLE_MASK
REDUCTIONS = ("mean", "sum")


def _split(unit: dict) -> tuple[dict, jax.Array]:
    if EXAMPLE_MASK not in unit:
        raise KeyError(f"a unit batch needs the {EXAMPLE_MASK!r} feature [K] (bool)")
    return {k: v for k, v in unit.items() if k != EXAMPLE_MASK}, unit[EXAMPLE_MASK]


def _slot_keys(rng: jax.Array, k: int) -> jax.Array:
    """fold_in(rng, slot) for slots 0..k-1."""
    return prng.fold_in(rng, jnp.arange(k, dtype=jnp.int32))


def _reduce(losses: jax.Array, metrics: dict, mask: jax.Array, reduction: str):
    """The unit's loss from [K] example losses, and its metric sums."""
    # jnp.where, not a multiplication: a padding slot (a real example under mask False) adds
    # exactly nothing.
    total = jnp.sum(jnp.where(mask, losses.astype(jnp.float32), 0.0))
    if reduction == "mean":
        total = total / jnp.maximum(jnp.sum(mask.astype(jnp.float32)), 1.0)
    sums = {name: jnp.sum(jnp.where(mask, jnp.asarray(v, jnp.float32), 0.0))
            for name, v in metrics.items()}
    return total, sums


def _check_reduction(reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise ValueError(f"unit reduction must be one of {REDUCTIONS}, got {reduction!r}")


@dataclasses.dataclass(frozen=True)
class UnitLoss:
    """`clipping.LossFn` of one unit from the per-example loss `base` (module docstring).

    Call: (params, unit: features [K, ...] + EXAMPLE_MASK [K], rng) -> (loss, metric sums).
    """

    base: clipping.LossFn
    reduction: str = "mean"

    def __post_init__(self):
        _check_reduction(self.reduction)

    def __call__(self, params: PyTree, unit: dict, rng: jax.Array):
        examples, mask = _split(unit)
        keys = _slot_keys(rng, mask.shape[0])
        losses, metrics = jax.vmap(self.base, in_axes=(None, 0, 0))(params, examples, keys)
        return _reduce(losses, metrics, mask, self.reduction)


@dataclasses.dataclass(frozen=True)
class UnitFactoredLoss(UnitLoss):
    """`ghost.FactoredLoss` of one unit from a per-example `ghost.FactoredLoss`: the unit's
    factors are its K examples' factors concatenated (K*S lookups, K*P predictions)."""

    base: ghost.FactoredLoss

    @property
    def table_path(self) -> tuple[str, ...]:
        return self.base.table_path

    @property
    def frozen_word_embedding(self) -> bool:
        return self.base.frozen_word_embedding

    def lookup_ids(self, unit: dict) -> jax.Array | None:
        """int [K*S] rows of E the unit's examples look up (None: they bring their own)."""
        examples, _ = _split(unit)
        ids = self.base.lookup_ids(examples)  # [K, S] (the base indexes named features)
        return None if ids is None else ids.reshape(-1)

    def zero_probe(self, unit: dict, vocab_size: int) -> jax.Array:
        """float32 zeros [K*P, V]."""
        examples, _ = _split(unit)
        one = self.base.zero_probe(jax.tree.map(lambda x: x[0], examples), vocab_size)
        k = jax.tree.leaves(examples)[0].shape[0]
        return jnp.zeros((k * one.shape[0],) + one.shape[1:], one.dtype)

    def factored(self, params: PyTree, unit: dict, rng: jax.Array, x: jax.Array | None,
                 probe: jax.Array):
        """(loss, (metrics, f [K*P, H])) of the unit; x [K*S, H] (or None), probe [K*P, V]."""
        examples, mask = _split(unit)
        k = mask.shape[0]
        keys = _slot_keys(rng, k)
        probe = probe.reshape((k, -1) + probe.shape[1:])
        if x is None:
            fn = lambda e, key, p: self.base.factored(params, e, key, None, p)  # noqa: E731
            losses, (metrics, f) = jax.vmap(fn)(examples, keys, probe)
        else:
            x = x.reshape((k, -1) + x.shape[1:])
            fn = lambda e, key, xi, p: self.base.factored(params, e, key, xi, p)  # noqa: E731
            losses, (metrics, f) = jax.vmap(fn)(examples, keys, x, probe)
        loss, sums = _reduce(losses, metrics, mask, self.reduction)
        return loss, (sums, f.reshape((-1,) + f.shape[2:]))


def unit_loss(loss_fn: Any, reduction: str = "mean") -> UnitLoss:
    """The loss of one unit for a task's per-example loss: `UnitFactoredLoss` when the loss
    has the factored view (ghost clipper), else `UnitLoss`."""
    if isinstance(loss_fn, ghost.FactoredLoss):
        return UnitFactoredLoss(loss_fn, reduction)
    return UnitLoss(loss_fn, reduction)

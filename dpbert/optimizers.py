"""Optimizers for (DP) BERT pretraining, built with optax from a config.

    optimizer = make_optimizer(config.optimizer, params, trainable=...)

Config fields (an ml_collections.ConfigDict or any mapping / attribute object):
    name           "adamw" | "lamb" | "sgd"
    learning_rate  peak learning rate (float > 0)
    warmup_steps   linear warmup from 0 to the peak over this many updates (>= 0)
    total_steps    linear decay from the peak to 0 at this update (> warmup_steps)
    weight_decay   decoupled weight decay (>= 0; BERT: 0.01)
    b1, b2, eps    Adam/LAMB moments (defaults 0.9, 0.999, 1e-6 as in BERT);
                   b1 is the momentum for sgd (0 = plain SGD)

Steps count optimizer *updates* (logical DP batches), not jitted calls.

Weight decay follows BERT: no decay on LayerNorm parameters and on any bias
(`weight_decay_mask`).  Frozen parameters (`trainable` filter) get no update at
all (`optax.set_to_zero`) and no optimizer state.  No gradient clipping here:
with DP the per-example clipping in `dpbert.dp` is the only clipping.
"""

from __future__ import annotations

import math

from typing import Any

import jax
import optax

from dpbert.dp import trees

PyTree = Any
OPTIMIZERS = ("adamw", "lamb", "sgd")
_DEFAULTS = {"warmup_steps": 0, "weight_decay": 0.0, "b1": 0.9, "b2": 0.999, "eps": 1e-6}
# Leaf names that never get weight decay: biases (nnx.Linear/LayerNorm `bias`,
# the MLM output bias whatever its attribute name ends with) and LayerNorm `scale`.
_NO_DECAY_LEAF_NAMES = ("bias", "scale")
_NO_DECAY_MODULE_HINTS = ("layernorm", "layer_norm")


def _get(config: Any, name: str) -> Any:
    if hasattr(config, "get"):
        value = config.get(name, None)
    else:
        value = getattr(config, name, None)
    if value is None:
        if name in _DEFAULTS:
            return _DEFAULTS[name]
        raise ValueError(f"optimizer config lacks the required field {name!r}")
    return value


def _number(config: Any, name: str, *, minimum: float, strict: bool = False) -> float:
    value = _get(config, name)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"optimizer config {name}={value!r} must be a finite number")
    if value < minimum or (strict and value == minimum):
        raise ValueError(f"optimizer config {name}={value!r} must be "
                         f"{'>' if strict else '>='} {minimum}")
    return float(value)


def is_decayed(path: tuple[str, ...]) -> bool:
    """True if the parameter at `path` (see `trees.path_names`) gets weight decay."""
    leaf = path[-1].lower() if path else ""
    if leaf in _NO_DECAY_LEAF_NAMES or leaf.endswith("bias") or leaf.endswith("_scale"):
        return False
    return not any(hint in part.lower() for part in path for hint in _NO_DECAY_MODULE_HINTS)


def weight_decay_mask(params: PyTree) -> PyTree:
    """Pytree of bools like `params`: True where weight decay applies.

    Excluded: every leaf named `bias` or ending in `bias` (Linear biases, LayerNorm
    bias, the MLM output bias), LayerNorm `scale`, and anything under a module
    whose name contains "layernorm"/"layer_norm".  Kernels and embeddings decay.
    """
    return jax.tree_util.tree_map_with_path(
        lambda path, _: is_decayed(trees.path_names(path)), params)


def make_schedule(config: Any) -> optax.Schedule:
    """Linear warmup 0 -> learning_rate over warmup_steps, then linear decay to 0."""
    lr = _number(config, "learning_rate", minimum=0.0, strict=True)
    total = _get(config, "total_steps")
    warmup = _get(config, "warmup_steps")
    for name, value in (("total_steps", total), ("warmup_steps", warmup)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"optimizer config {name}={value!r} must be an int >= 0")
    if total <= warmup:
        raise ValueError(f"optimizer config total_steps={total} must exceed "
                         f"warmup_steps={warmup}")
    return optax.join_schedules(
        [optax.linear_schedule(0.0, lr, max(warmup, 1)),
         optax.linear_schedule(lr, 0.0, total - warmup)],
        boundaries=[warmup])


def make_optimizer(config: Any, params: PyTree | None = None, *,
                   trainable: trees.TrainableFilter = None) -> optax.GradientTransformation:
    """Builds the optax optimizer named by `config.name` (see module docstring).

    Args:
      config: optimizer config.
      params: the parameter pytree (needed when `trainable` is given; the decay
        mask is computed lazily from the params passed to `init`).
      trainable: trainable filter; frozen leaves get zero updates and no state.

    Raises:
      ValueError: on an unknown optimizer name or a bad field value.
    """
    name = _get(config, "name")
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer config name={name!r} is not one of {list(OPTIMIZERS)}")
    schedule = make_schedule(config)
    wd = _number(config, "weight_decay", minimum=0.0)
    b1 = _number(config, "b1", minimum=0.0)
    b2 = _number(config, "b2", minimum=0.0)
    eps = _number(config, "eps", minimum=0.0)
    if b1 >= 1 or b2 >= 1:
        raise ValueError(f"optimizer config b1={b1}, b2={b2} must be < 1")
    if name == "adamw":
        opt = optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=wd,
                          mask=weight_decay_mask)
    elif name == "lamb":
        opt = optax.lamb(schedule, b1=b1, b2=b2, eps=eps, weight_decay=wd,
                         mask=weight_decay_mask)
    else:
        opt = optax.chain(
            optax.add_decayed_weights(wd, mask=weight_decay_mask),
            optax.sgd(schedule, momentum=b1 or None))
    if trainable is None:
        return opt
    if params is None:
        raise ValueError("make_optimizer needs params to apply a trainable filter")
    mask = trees.resolve_trainable_mask(params, trainable)
    labels = jax.tree.map(lambda t: "train" if t else "frozen", mask)
    return optax.multi_transform({"train": opt, "frozen": optax.set_to_zero()}, labels)

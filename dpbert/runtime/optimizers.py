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
    head_learning_rate_scale
                   (default 1) the task head's parameters (everything under a top-level
                   `classifier`) train at this multiple of the schedule: a freshly
                   initialised head next to a pretrained encoder

Steps count optimizer *updates* (logical DP batches), not jitted calls.

The numbers a sweep varies (`SWEPT`: learning_rate, warmup_steps, total_steps, weight_decay,
head_learning_rate_scale) can be an argument of the jitted train step instead of constants of
its program: ``make_optimizer(config, params, numbers=x)`` with x a float32 array inside the
step (`numbers_argument(config)` outside it).  The optimizer is then built while the step is
traced, with the config's structure (which optimizer, which leaves decay or train, whether the
head has a scale of its own) and x's values, and one compiled step (JAX's persistent cache,
`dpbert.runtime.compile_cache`) serves every point of a sweep over them.  b1, b2 and eps stay
constants (b1 = 0 changes the SGD state's layout).

Weight decay follows BERT: no decay on LayerNorm parameters and on any bias
(`weight_decay_mask`).  Frozen parameters (`trainable` filter) get no update at
all (`optax.set_to_zero`) and no optimizer state.  No gradient clipping here:
with DP the per-example clipping in `dpbert.dp` is the only clipping.
"""

from __future__ import annotations

import math

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from dpbert.dp import trees

PyTree = Any
OPTIMIZERS = ("adamw", "lamb", "sgd")
_DEFAULTS = {"warmup_steps": 0, "weight_decay": 0.0, "b1": 0.9, "b2": 0.999, "eps": 1e-6,
             "head_learning_rate_scale": 1.0}
HEAD_MODULE = "classifier"   # the fine-tuning models' head (dpbert.models.heads), top-level attribute
# Leaf names that never get weight decay: biases (nnx.Linear/LayerNorm `bias`,
# the MLM output bias whatever its attribute name ends with) and LayerNorm `scale`.
_NO_DECAY_LEAF_NAMES = ("bias", "scale")
_NO_DECAY_MODULE_HINTS = ("layernorm", "layer_norm")
# The numbers `numbers_argument` passes to the train step, in this order (module docstring).
SWEPT = ("learning_rate", "warmup_steps", "total_steps", "weight_decay",
         "head_learning_rate_scale")


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


def _steps(config: Any) -> tuple[int, int]:
    """(warmup_steps, total_steps), checked."""
    total = _get(config, "total_steps")
    warmup = _get(config, "warmup_steps")
    for name, value in (("total_steps", total), ("warmup_steps", warmup)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"optimizer config {name}={value!r} must be an int >= 0")
    if total <= warmup:
        raise ValueError(f"optimizer config total_steps={total} must exceed "
                         f"warmup_steps={warmup}")
    return warmup, total


def _linear(start, end, steps) -> optax.Schedule:
    """``optax.linear_schedule(start, end, steps)`` (steps >= 1), also for values that are
    traced (optax's checks `steps` in Python): the same float32 operations."""
    def schedule(count):
        frac = 1 - jnp.clip(count, 0, steps) / steps
        return (start - end) * frac + end
    return schedule


def _warmup_decay(lr, warmup, total) -> optax.Schedule:
    """Linear warmup 0 -> lr over max(warmup, 1) updates, then linear decay to 0 at `total`:
    ``optax.join_schedules`` of two linear schedules, with numbers that may be traced."""
    def schedule(count):
        # Built when called, inside the step: building it runs no JAX (the launchers check the
        # config, which builds one, before jax.distributed.initialize starts the backend).
        up = _linear(0.0, lr, jnp.maximum(warmup, 1))
        down = _linear(lr, 0.0, total - warmup)
        return jnp.where(count < warmup, up(count), down(count - warmup))
    return schedule


def make_schedule(config: Any, numbers: jax.Array | None = None) -> optax.Schedule:
    """Linear warmup 0 -> learning_rate over warmup_steps, then linear decay to 0.
    `numbers`: see `make_optimizer` (the config is checked either way)."""
    lr = _number(config, "learning_rate", minimum=0.0, strict=True)
    warmup, total = _steps(config)
    if numbers is not None:
        lr, warmup, total = (numbers[SWEPT.index(k)]
                             for k in ("learning_rate", "warmup_steps", "total_steps"))
    return _warmup_decay(lr, warmup, total)


def numbers_argument(config: Any) -> np.ndarray:
    """float32 [len(SWEPT)]: the config's `SWEPT` numbers, checked, as `make_optimizer`'s
    `numbers` (an argument of the jitted train step)."""
    make_optimizer(config)  # every check
    if _get(config, "total_steps") >= 2 ** 24:  # exact in float32
        raise ValueError(f"optimizer config total_steps={_get(config, 'total_steps')} must be "
                         "< 2^24")
    return np.asarray([float(_get(config, k)) for k in SWEPT], np.float32)


def make_optimizer(config: Any, params: PyTree | None = None, *,
                   trainable: trees.TrainableFilter = None,
                   numbers: jax.Array | None = None) -> optax.GradientTransformation:
    """Builds the optax optimizer named by `config.name` (see module docstring).

    Args:
      config: optimizer config.
      params: the parameter pytree (needed when `trainable` is given; the decay
        mask is computed lazily from the params passed to `init`).
      trainable: trainable filter; frozen leaves get zero updates and no state.
      numbers: None (the config's numbers, constants of a compiled step), or float32
        [len(SWEPT)] (`numbers_argument`; inside a jitted step, its argument): the values of
        `SWEPT` used in place of the config's, which still decides the structure and is
        checked.  The optimizer's state has the same layout either way.

    Raises:
      ValueError: on an unknown optimizer name or a bad field value.
    """
    name = _get(config, "name")
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer config name={name!r} is not one of {list(OPTIMIZERS)}")
    schedule = make_schedule(config, numbers)
    wd = _number(config, "weight_decay", minimum=0.0)
    b1 = _number(config, "b1", minimum=0.0)
    b2 = _number(config, "b2", minimum=0.0)
    eps = _number(config, "eps", minimum=0.0)
    head_scale = _number(config, "head_learning_rate_scale", minimum=0.0, strict=True)
    if b1 >= 1 or b2 >= 1:
        raise ValueError(f"optimizer config b1={b1}, b2={b2} must be < 1")
    # The values (constants, or the step's argument); the structure below is the config's.
    wd_value, head_value = ((wd, head_scale) if numbers is None else
                            (numbers[SWEPT.index("weight_decay")],
                             numbers[SWEPT.index("head_learning_rate_scale")]))

    def build(lr: optax.Schedule) -> optax.GradientTransformation:
        if name == "adamw":
            return optax.adamw(lr, b1=b1, b2=b2, eps=eps, weight_decay=wd_value,
                               mask=weight_decay_mask)
        if name == "lamb":
            return optax.lamb(lr, b1=b1, b2=b2, eps=eps, weight_decay=wd_value,
                              mask=weight_decay_mask)
        return optax.chain(optax.add_decayed_weights(wd_value, mask=weight_decay_mask),
                           optax.sgd(lr, momentum=b1 or None))

    opt = build(schedule)
    if params is None:
        if trainable is not None:
            raise ValueError("make_optimizer needs params to apply a trainable filter")
        return opt   # (a config check: the head scale needs the parameters to apply)
    if trainable is None and head_scale == 1.0:
        return opt
    mask = (jax.tree.map(lambda _: True, params) if trainable is None
            else trees.resolve_trainable_mask(params, trainable))
    transforms = {"train": opt, "frozen": optax.set_to_zero()}

    def label(path, t):
        if not t:
            return "frozen"
        names = trees.path_names(path)
        return "head" if head_scale != 1.0 and names and names[0] == HEAD_MODULE else "train"

    labels = jax.tree_util.tree_map_with_path(label, mask)
    if head_scale != 1.0:
        if "head" not in jax.tree.leaves(labels):
            raise ValueError(f"optimizer config head_learning_rate_scale={head_scale} but the "
                             f"model has no trainable '{HEAD_MODULE}' parameters")
        transforms["head"] = build(lambda step: head_value * schedule(step))
    return optax.multi_transform(transforms, labels)

"""Parameter-tree helpers shared by the DP engine and the optimizers.

Parameters are any JAX pytree; for Flax NNX models this is the `nnx.State` from
``graphdef, params = nnx.split(model)``, whose leaf paths look like
``('bert', 'encoder', 'layer', 0, 'attention', 'query', 'kernel')`` once the
trailing ``.value`` attribute of each `nnx.Param` is dropped.
"""

from __future__ import annotations

from typing import Any, Callable, Union

import jax
import jax.numpy as jnp

from dpbert.prng import explicit_sharding  # noqa: F401  (re-exported: trees.explicit_sharding)

PyTree = Any
# A trainable filter: None (everything trainable), a pytree of bools with the
# structure of the params (True = trainable), or a predicate
# (path_names: tuple[str, ...], leaf) -> bool.
TrainableFilter = Union[None, PyTree, Callable[[tuple[str, ...], Any], bool]]


def path_names(path: tuple[Any, ...]) -> tuple[str, ...]:
    """Readable names of a `jax.tree_util` key path, without NNX's trailing 'value'."""
    names = []
    for key in path:
        if isinstance(key, jax.tree_util.DictKey):
            names.append(str(key.key))
        elif isinstance(key, jax.tree_util.GetAttrKey):
            names.append(key.name)
        elif isinstance(key, jax.tree_util.SequenceKey):
            names.append(str(key.idx))
        elif isinstance(key, jax.tree_util.FlattenedIndexKey):
            names.append(str(key.key))
        else:
            names.append(str(key))
    if names and names[-1] == "value":
        names.pop()
    return tuple(names)


def path_string(path: tuple[Any, ...]) -> str:
    """'bert/encoder/layer/0/attention/query/kernel' for a key path."""
    return "/".join(path_names(path))


def resolve_trainable_mask(params: PyTree, trainable: TrainableFilter) -> PyTree:
    """A pytree of Python bools with the structure of `params` (True = trainable).

    Raises:
      ValueError: if a mask pytree does not match the structure of `params`, or if
        nothing is trainable.
    """
    if trainable is None:
        mask = jax.tree.map(lambda _: True, params)
    elif callable(trainable) and not isinstance(trainable, (dict, list, tuple)):
        mask = jax.tree_util.tree_map_with_path(
            lambda path, leaf: bool(trainable(path_names(path), leaf)), params)
    else:
        p_def = jax.tree.structure(params)
        m_leaves, m_def = jax.tree.flatten(trainable)
        if m_def.num_leaves != p_def.num_leaves:
            raise ValueError(
                f"trainable mask has {m_def.num_leaves} leaves but params have "
                f"{p_def.num_leaves}; pass a pytree of bools with the params' structure "
                "or a predicate (path_names, leaf) -> bool")
        mask = jax.tree.unflatten(p_def, [bool(x) for x in m_leaves])
    if not any(jax.tree.leaves(mask)):
        raise ValueError("the trainable filter freezes every parameter")
    return mask


def trainable_leaves(tree: PyTree, trainable: TrainableFilter,
                     fn: Callable[[Any], Any] = lambda x: x) -> list:
    """[fn(leaf) for each trainable leaf of `tree`], in `jax.tree.leaves` order."""
    mask = resolve_trainable_mask(tree, trainable)
    return [fn(x) for x, t in zip(jax.tree.leaves(tree), jax.tree.leaves(mask)) if t]


def all_finite(tree: PyTree, *, one_device: bool) -> jax.Array:
    """bool []: every element of every leaf of `tree` is finite (no NaN, no +-inf).

    `one_device` (every leaf on one device): one reduction over a float32 concatenation of
    the leaves (float16 / bfloat16 NaN and inf stay so in float32): tiny BERT's parameters in
    6 fusions, compiled in 0.28 s, against 133 fusions (29 distinct) and 0.85-0.90 s for one
    reduction per leaf (issue 32; XLA splits a concatenation of the leaves' bool `isfinite`
    back into the per-leaf form). The concatenation is a copy of the leaves, in temp memory
    while the check runs. On a mesh the leaves are checked one by one: concatenating
    differently sharded leaves gathers them (tiny BERT on a 2 x 4 mesh: 45 all-gathers and 8
    all-to-alls, where the per-leaf check needs one all-reduce)."""
    leaves = jax.tree.leaves(tree)
    if not leaves:
        return jnp.asarray(True)
    if one_device:
        return jnp.all(jnp.isfinite(jnp.concatenate(
            [x.reshape(-1).astype(jnp.float32) for x in leaves])))
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def freeze_paths_containing(*names: str) -> Callable[[tuple[str, ...], Any], bool]:
    """Predicate making trainable every leaf whose path names contain none of `names`.

    Example: ``freeze_paths_containing("word_embeddings")`` freezes the word
    embedding (dχ privacy-adaptive pretraining).
    """
    if not names:
        raise ValueError("freeze_paths_containing needs at least one name")

    def predicate(path: tuple[str, ...], leaf: Any) -> bool:
        del leaf
        return not any(name in path for name in names)

    return predicate

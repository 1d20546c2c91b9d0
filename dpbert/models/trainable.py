"""What a run trains: `train.trainable`, one concept for pretraining and fine-tuning.

    all       every parameter (what the input mode leaves trainable)
    head      the task's head only: the classifier (+ the pooler it reads) for classification,
              the classifier for NER, the MLM transform and output bias for pretraining (the
              tied decoder is the word embedding, which stays frozen)
    top:K     the last K encoder layers and the head
    bitfit    every bias (and LayerNorm shift) of the encoder, and the head (Ben Zaken et al.
              2022)

The frozen rest is never in the optimizer state and gets no noise: DP-SGD's clipping, noise and
accounting cover exactly the trainable parameters (`dpbert.dp.trees` filters), so the d in
σ·√d / B is the trainable count. `prefix_layers` says where the frozen prefix ends (the encoder
layers below every trainable parameter), which fine-tuning uses to compute that prefix once
(`dpbert.tasks.prefix_cache`).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable

import jax
import numpy as np

from dpbert.dp import trees
from dpbert.errors import ConfigError

# The head of each model kind (`dpbert.models.heads`, `dpbert.models.bert`), as path prefixes.
HEADS = {
    "sequence_classification": (("classifier",), ("bert", "pooler")),
    "token_classification": (("classifier",),),
    "pretraining": (("cls", "predictions", "transform"), ("cls", "predictions", "bias"),
                    ("cls", "seq_relationship")),
}
CHOICES = "all, head, top:K (K = 1..layers), bitfit"


@dataclasses.dataclass(frozen=True)
class Trainable:
    """A parsed `train.trainable`: kind in {all, head, top, bitfit}; `layers` for top."""

    kind: str
    layers: int = 0

    @property
    def spec(self) -> str:
        return f"top:{self.layers}" if self.kind == "top" else self.kind

    def prefix_layers(self, num_layers: int) -> int | None:
        """Encoder layers below every trainable parameter (the frozen prefix ends after the
        embeddings and this many layers), or None when the embeddings train (all, bitfit)."""
        if self.kind == "head":
            return num_layers
        if self.kind == "top":
            return num_layers - self.layers
        return None

    def predicate(self, model_kind: str, num_layers: int) -> Callable[[tuple[str, ...], Any],
                                                                         bool] | None:
        """A `dpbert.dp.trees` predicate (path names, leaf) -> trainable; None for all."""
        if self.kind == "all":
            return None
        heads = HEADS[model_kind]
        first_trained = self.prefix_layers(num_layers)

        def trainable(path: tuple[str, ...], leaf: Any) -> bool:
            del leaf
            path = tuple(path)
            if any(path[:len(h)] == h for h in heads):
                return True
            if self.kind == "bitfit":
                return path[-1] in ("bias",)
            if path[:3] == ("bert", "encoder", "layer") and len(path) > 3:
                return int(path[3]) >= first_trained
            return False

        return trainable


def parse(spec: str, num_layers: int | None = None) -> Trainable:
    """`train.trainable` -> Trainable; a ConfigError names the field and the choices."""
    text = str(spec).strip().lower()
    if text in ("all", "head", "bitfit"):
        return Trainable(text)
    m = re.fullmatch(r"top:(\d+)", text)
    if m is None:
        raise ConfigError(f"config.train.trainable={spec!r}: must be one of {CHOICES}")
    k = int(m.group(1))
    if k < 1 or (num_layers is not None and k > num_layers):
        raise ConfigError(f"config.train.trainable={spec!r}: K must be in 1.."
                          f"{num_layers if num_layers is not None else 'the layer count'}"
                          f"{'' if num_layers is None else f' (the model has {num_layers} layers)'}")
    return Trainable("top", k)


def both(first, second):
    """The conjunction of two trainable filters (None = everything)."""
    if first is None:
        return second
    if second is None:
        return first
    return lambda path, leaf: bool(first(path, leaf)) and bool(second(path, leaf))


def describe(spec: str, params, trainable) -> dict:
    """run.json's / results.json's account of what trains: the spec, the trainable and total
    parameter counts (the trainable count is the d of σ·√d / B) and the trained groups
    (parameter paths up to the layer)."""
    mask = trees.resolve_trainable_mask(params, trainable)
    sizes, flags, groups = 0, 0, {}
    for (path, leaf), flag in zip(jax.tree_util.tree_flatten_with_path(params)[0],
                                  jax.tree.leaves(mask)):
        size = int(np.prod(np.shape(leaf)))
        sizes += size
        if flag:
            flags += size
            names = trees.path_names(path)
            group = "/".join(names[:4] if names[:3] == ("bert", "encoder", "layer")
                             else names[:-1])
            groups[group] = groups.get(group, 0) + size
    return {"spec": str(spec), "parameters": flags, "total_parameters": sizes,
            "groups": groups}

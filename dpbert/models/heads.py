"""Fine-tuning models: BERT with a sequence- or token-classification head (HF names and layout).

    BertForSequenceClassification:  logits = classifier(dropout(pooled))        [B, C]
    BertForTokenClassification:     logits = classifier(dropout(h))             [B, S, C]

Both mirror `transformers`' classes of the same name parameter for parameter, so `dpbert.models.hf_heads`
exports them to a folder that `transformers` loads with no missing or unexpected key. The token
model's encoder has no pooler (HF builds it with `add_pooling_layer=False`). `dropout` is
`classifier_dropout`, or the config's `hidden_dropout_prob` when that is None (HF's rule).

Inputs are `BertModel`'s: `input_ids, segment_ids, input_mask` [B, S] and the optional
`word_embeddings=` [B, S, H] that replaces the word lookup (dχ token_rep: the service receives
privatized vectors, never the ids). `BertForSequenceClassification.classify(features)` runs the
head alone on a [.., H] representation (dχ seq_rep: the service gets only z̃ = M_rep(s(x))), and
`sequence_representation` computes s(x) (the frozen user side of seq_rep).

The models hold their label names (`labels`, index = class id) so the export can write HF's
`id2label` / `label2id`.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from dpbert.models import bert as model_lib
from dpbert import prng

SEQ_REP_SOURCES = ("pooled", "cls_hidden")


def _label_names(labels: Sequence[str] | int) -> tuple[str, ...]:
    if isinstance(labels, int) and not isinstance(labels, bool):
        if labels < 1:
            raise ValueError(f"num_labels must be >= 1, got {labels}")
        return tuple(f"LABEL_{i}" for i in range(labels))
    names = tuple(str(x) for x in labels)
    if not names:
        raise ValueError("labels is empty; a classifier needs at least one label")
    if len(set(names)) != len(names):
        raise ValueError(f"labels has duplicates: {list(names)}")
    return names


def _dropout_rate(config: model_lib.BertConfig, classifier_dropout: float | None) -> float:
    rate = config.hidden_dropout_prob if classifier_dropout is None else classifier_dropout
    if not 0.0 <= rate < 1.0:
        raise ValueError(f"classifier_dropout must be in [0, 1), got {rate!r}")
    return float(rate)


def _check_dropout_rngs(deterministic: bool, rngs: nnx.Rngs | None) -> None:
    if not deterministic and rngs is None:
        raise ValueError("dropout is on (deterministic=False) but no rngs were given; pass "
                         "rngs=nnx.Rngs(dropout=key)")


class BertForSequenceClassification(nnx.Module):
    """HF `BertForSequenceClassification`: dropout + linear on the pooled output."""

    def __init__(self, config: model_lib.BertConfig, labels: Sequence[str] | int, *,
                 classifier_dropout: float | None = None, rngs: nnx.Rngs):
        self.config = config
        self.labels = _label_names(labels)
        self.classifier_dropout = classifier_dropout
        self.bert = model_lib.BertModel(config, rngs=rngs)
        self.dropout = prng.Dropout(_dropout_rate(config, classifier_dropout))
        self.classifier = model_lib._dense(config, config.hidden_size, len(self.labels),
                                           ("embed", "classes"), rngs=rngs)

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    def classify(self, features: jax.Array, *, deterministic: bool = True,
                 rngs: nnx.Rngs | None = None) -> jax.Array:
        """The head alone: features [..., H] -> float32 logits [..., C]."""
        _check_dropout_rngs(deterministic, rngs)
        x = self.dropout(features.astype(self.config.compute_dtype), deterministic=deterministic,
                         rngs=rngs)
        return self.classifier(x).astype(jnp.float32)

    def __call__(self, input_ids: jax.Array, segment_ids: jax.Array, input_mask: jax.Array, *,
                 deterministic: bool = True, rngs: nnx.Rngs | None = None,
                 word_embeddings: jax.Array | None = None) -> jax.Array:
        """[B, S] ids, segments, mask (1 = real token) -> float32 logits [B, C]."""
        _check_dropout_rngs(deterministic, rngs)
        _, pooled = self.bert(input_ids, segment_ids, input_mask, deterministic=deterministic,
                              rngs=rngs, word_embeddings=word_embeddings)
        return self.classify(pooled, deterministic=deterministic, rngs=rngs)

    def from_prefix(self, hidden: jax.Array, input_mask: jax.Array, start_layer: int, *,
                    deterministic: bool = True, rngs: nnx.Rngs | None = None) -> jax.Array:
        """`__call__` continued from the frozen prefix's output (`BertModel.prefix`):
        [B, S, H] hidden states after `start_layer` layers -> float32 logits [B, C]."""
        _check_dropout_rngs(deterministic, rngs)
        _, pooled = self.bert.from_prefix(hidden, input_mask, start_layer,
                                          deterministic=deterministic, rngs=rngs)
        return self.classify(pooled, deterministic=deterministic, rngs=rngs)

    def sequence_representation(self, input_ids: jax.Array, segment_ids: jax.Array,
                                input_mask: jax.Array, *, source: str = "pooled") -> jax.Array:
        """s(x), float32 [B, H], dropout off: the pooled output, or (`cls_hidden`) the last
        layer's hidden state at [CLS] before the pooler."""
        if source not in SEQ_REP_SOURCES:
            raise ValueError(f"seq_rep source must be one of {SEQ_REP_SOURCES}, got {source!r}")
        hidden, pooled = self.bert(input_ids, segment_ids, input_mask, deterministic=True)
        out = pooled if source == "pooled" else hidden[:, 0]
        return out.astype(jnp.float32)


class BertForTokenClassification(nnx.Module):
    """HF `BertForTokenClassification`: dropout + linear on the last hidden states (no pooler)."""

    def __init__(self, config: model_lib.BertConfig, labels: Sequence[str] | int, *,
                 classifier_dropout: float | None = None, rngs: nnx.Rngs):
        self.config = config
        self.labels = _label_names(labels)
        self.classifier_dropout = classifier_dropout
        self.bert = model_lib.BertModel(config, rngs=rngs, add_pooling_layer=False)
        self.dropout = prng.Dropout(_dropout_rate(config, classifier_dropout))
        self.classifier = model_lib._dense(config, config.hidden_size, len(self.labels),
                                           ("embed", "classes"), rngs=rngs)

    @property
    def num_labels(self) -> int:
        return len(self.labels)

    def __call__(self, input_ids: jax.Array, segment_ids: jax.Array, input_mask: jax.Array, *,
                 deterministic: bool = True, rngs: nnx.Rngs | None = None,
                 word_embeddings: jax.Array | None = None) -> jax.Array:
        """[B, S] ids, segments, mask -> float32 logits [B, S, C]."""
        _check_dropout_rngs(deterministic, rngs)
        hidden, _ = self.bert(input_ids, segment_ids, input_mask, deterministic=deterministic,
                              rngs=rngs, word_embeddings=word_embeddings)
        x = self.dropout(hidden, deterministic=deterministic, rngs=rngs)
        return self.classifier(x).astype(jnp.float32)


TASK_MODELS = {
    "sequence_classification": BertForSequenceClassification,
    "token_classification": BertForTokenClassification,
}


def create_task_model(task: str, config: model_lib.BertConfig, labels: Sequence[str] | int, *,
                      classifier_dropout: float | None = None, seed: int = 0) -> nnx.Module:
    """A freshly initialised task model (float32 parameters)."""
    if task not in TASK_MODELS:
        raise ValueError(f"unknown task {task!r}; choose one of {sorted(TASK_MODELS)}")
    return TASK_MODELS[task](config, labels, classifier_dropout=classifier_dropout,
                             rngs=nnx.Rngs(params=seed))

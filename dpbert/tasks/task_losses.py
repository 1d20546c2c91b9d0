"""Per-example fine-tuning losses in the DP engine's `LossFn` form, and their batched eval.

    loss_fn(params, example, rng) -> (loss float32 [], metrics dict of float32 [])

`params` is the `nnx.State` of a `dpbert.models.heads` model (`graphdef, params = nnx.split(model)`);
`example` is ONE unbatched example; `rng` drives dropout. Metrics are per-example SUMS, safe to
add over a batch (the engine only ever reports batch totals). So `dpbert.dp.VmapClipper` (and
every rule of the DP engine) runs on them unchanged: DP-SGD fine-tuning is the pretraining engine
with another loss.

What an example holds depends on the input-privacy mode (`dpbert.privacy.input_privacy` builds them):

* `input_ids, segment_ids, input_mask` int [S] — modes none and text_to_text (privatized ids);
* plus `word_embeddings` float [S, H] — token_rep: the model consumes the privatized vectors and
  never looks `input_ids` up (those hold [UNK] at every regular position anyway);
* `features` float [H] and no ids at all — seq_rep: the head alone runs on z̃.

Labels: `label` int [] for sequence classification; `labels` int [S] for token classification,
with `IGNORE_LABEL` (-100, as in HF) at special tokens, padding and non-first WordPieces.

Metrics:
* classification: `loss_sum` (CE), `correct` (argmax == label), `count` (1);
* token classification: `loss_sum` and `correct` summed over the example's labelled tokens,
  `token_count` (how many), `count` (1). The loss itself is the mean over the example's labelled
  tokens (0 for an example without any), so every example weighs the same before clipping.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from dpbert.models import bert as model_lib
from dpbert.models.losses import POSITION_EMBEDDING_PATH, WORD_EMBEDDING_PATH, cross_entropy

IGNORE_LABEL = -100

Example = dict[str, jax.Array]
Metrics = dict[str, jax.Array]
LossFn = Callable[[nnx.State, Example, jax.Array], tuple[jax.Array, Metrics]]


def _rngs(deterministic: bool, rng: jax.Array) -> nnx.Rngs | None:
    return None if deterministic else nnx.Rngs(dropout=rng)


def classification_logits(model: Any, example: Example, *, deterministic: bool,
                          rngs: nnx.Rngs | None, start_layer: int | None = None) -> jax.Array:
    """float32 [C] logits of one example of any input mode (see the module docstring)."""
    if "features" in example:        # seq_rep: the head alone, on z̃
        return model.classify(example["features"][None], deterministic=deterministic,
                              rngs=rngs)[0]
    if "prefix_hidden" in example:   # the frozen prefix's cached output (tasks.prefix_cache)
        if start_layer is None:
            raise ValueError("an example with prefix_hidden needs the prefix's layer count")
        return model.from_prefix(example["prefix_hidden"][None], example["input_mask"][None],
                                 start_layer, deterministic=deterministic, rngs=rngs)[0]
    batch = jax.tree.map(lambda x: x[None], example)
    return model(batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                 deterministic=deterministic, rngs=rngs,
                 word_embeddings=batch.get("word_embeddings"))[0]


def classification_metrics(logits: jax.Array, label: jax.Array) -> tuple[jax.Array, Metrics]:
    label = jnp.asarray(label, jnp.int32).reshape(())
    loss = cross_entropy(logits, label)
    return loss, {"loss_sum": loss,
                  "correct": (jnp.argmax(logits, -1) == label).astype(jnp.float32),
                  "count": jnp.ones((), jnp.float32)}


def classification_model_loss(model: Any, example: Example, *, deterministic: bool,
                              rng: jax.Array, start_layer: int | None = None
                              ) -> tuple[jax.Array, Metrics]:
    """Cross-entropy of a `BertForSequenceClassification` module on one example."""
    logits = classification_logits(model, example, deterministic=deterministic,
                                   rngs=_rngs(deterministic, rng), start_layer=start_layer)
    return classification_metrics(logits, example["label"])


def make_classification_loss(graphdef: nnx.GraphDef, *, deterministic: bool = False,
                             start_layer: int | None = None) -> LossFn:
    """Cross-entropy of a `BertForSequenceClassification` on one example (`label` int []);
    `start_layer`: examples carry the frozen prefix's output (`prefix_hidden`) after this
    many encoder layers."""

    def loss_fn(params: nnx.State, example: Example, rng: jax.Array):
        return classification_model_loss(nnx.merge(graphdef, params), example,
                                         deterministic=deterministic, rng=rng,
                                         start_layer=start_layer)

    return loss_fn


def token_metrics(logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, Metrics]:
    """logits [S, C], labels int [S] with IGNORE_LABEL -> (mean CE over labelled, metric sums)."""
    labels = jnp.asarray(labels, jnp.int32)
    scored = labels != IGNORE_LABEL
    safe = jnp.where(scored, labels, 0)
    weights = scored.astype(jnp.float32)
    per_token = cross_entropy(logits, safe)
    loss_sum = jnp.sum(weights * per_token)
    token_count = jnp.sum(weights)
    correct = jnp.sum(weights * (jnp.argmax(logits, -1) == safe).astype(jnp.float32))
    loss = loss_sum / jnp.maximum(token_count, 1.0)
    return loss, {"loss_sum": loss_sum, "correct": correct, "token_count": token_count,
                  "count": jnp.ones((), jnp.float32)}


def make_token_classification_loss(graphdef: nnx.GraphDef, *, deterministic: bool = False
                                   ) -> LossFn:
    """Token cross-entropy of a `BertForTokenClassification` (`labels` int [S], -100 ignored)."""

    def loss_fn(params: nnx.State, example: Example, rng: jax.Array):
        model = nnx.merge(graphdef, params)
        batch = jax.tree.map(lambda x: x[None], example)
        logits = model(batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                       deterministic=deterministic, rngs=_rngs(deterministic, rng),
                       word_embeddings=batch.get("word_embeddings"))[0]
        return token_metrics(logits, example["labels"])

    return loss_fn


def make_task_loss(task: str, graphdef: nnx.GraphDef, *, deterministic: bool = False) -> LossFn:
    """The loss of a task name ("sequence_classification" | "token_classification")."""
    makers = {"sequence_classification": make_classification_loss,
              "token_classification": make_token_classification_loss}
    if task not in makers:
        raise ValueError(f"unknown task {task!r}; choose one of {sorted(makers)}")
    return makers[task](graphdef, deterministic=deterministic)


# ----------------------------------------------------------------------------- ghost clipping


@dataclasses.dataclass(frozen=True)
class FactoredClassificationLoss:
    """The sequence-classification loss in the form the ghost clippers take
    (`dpbert.dp.ghost.FactoredLoss` and `dpbert.dp.mixed_ghost.TappedLoss`).

    Calling it is exactly `make_classification_loss(graphdef, deterministic=...)`. The word
    embedding E [V, H] of the model enters only as the input vectors x = E[input_ids]
    (a classifier has no decoder tied to it), so its per-example gradient is
    sum_t onehot(id_t) xbar_t^T with xbar = dL/dx: the ghost clippers get its norm and the
    clipped sum without a [V, H] array per example, and `mixed_ghost` also the dense kernels'
    (the classifier too). The decoder part of the factored form is empty (P = 0). Examples
    of dχ token_rep carry their own `word_embeddings` (then E is not used, and frozen);
    seq_rep / OME examples (`features`, the head alone) have no encoder input and are not
    for this loss (their modes do not offer the "factored" loss shape).
    """

    graphdef: nnx.GraphDef
    deterministic: bool = False
    # The loss never stops E's gradient itself; a frozen table is the trainable filter's.
    frozen_word_embedding: bool = False
    table_path: tuple[str, ...] = WORD_EMBEDDING_PATH
    position_table_path: tuple[str, ...] = POSITION_EMBEDDING_PATH
    # Examples carry a cached frozen prefix's output (`prefix_hidden`) after this many layers
    # (`dpbert.tasks.prefix_cache`): the input vectors x are those hidden states; E, P and
    # the prefix are frozen (train.trainable head / top:K), so only the dense layers above
    # are tapped.
    start_layer: int | None = None

    def __call__(self, params: nnx.State, example: Example, rng: jax.Array
                 ) -> tuple[jax.Array, Metrics]:
        return make_classification_loss(self.graphdef, deterministic=self.deterministic,
                                        start_layer=self.start_layer)(params, example, rng)

    @staticmethod
    def lookup_ids(example: Example) -> jax.Array | None:
        if "prefix_hidden" in example or "word_embeddings" in example:
            return None
        return example["input_ids"]

    @staticmethod
    def input_vectors(example: Example) -> jax.Array:
        """x when no ids are looked up: the cached prefix's output, or dχ's vectors."""
        return example.get("prefix_hidden", example.get("word_embeddings"))

    @staticmethod
    def zero_probe(example: Example, vocab_size: int) -> jax.Array:
        del example
        return jnp.zeros((0, vocab_size), jnp.float32)

    def factored(self, params: nnx.State, example: Example, rng: jax.Array,
                 x: jax.Array | None, probe: jax.Array
                 ) -> tuple[jax.Array, tuple[Metrics, jax.Array]]:
        """(loss, (metrics, f [0, H])) with the input vectors x [S, H] (None: the example's
        own `word_embeddings`); the probe [0, V] is empty."""
        del probe
        return self._factored(nnx.merge(self.graphdef, params), example, rng, x)

    def tapped(self, params: nnx.State, example: Example, rng: jax.Array,
               x: jax.Array | None, probe: jax.Array, dense_probes: dict[str, jax.Array]
               ) -> tuple[jax.Array, tuple[Metrics, jax.Array, dict[str, jax.Array]]]:
        """`factored` with every dense layer tapped (see `FactoredPretrainingLoss.tapped`)."""
        del probe
        model = nnx.merge(self.graphdef, params)
        with model_lib.dense_tap(model_lib.DenseTap(model, dense_probes)) as tap:
            loss, (metrics, f) = self._factored(model, example, rng, x)
        return loss, (metrics, f, tap.inputs)

    def _factored(self, model: Any, example: Example, rng: jax.Array, x: jax.Array | None
                  ) -> tuple[jax.Array, tuple[Metrics, jax.Array]]:
        key = "prefix_hidden" if "prefix_hidden" in example else "word_embeddings"
        if x is not None:
            # The model adds position and segment vectors to these (or continues from the
            # prefix's output) and runs the same calls in the same order (same dropout masks)
            # as when it looks the ids up itself.
            example = dict(example, **{key: x})
        loss, metrics = classification_model_loss(model, example,
                                                   deterministic=self.deterministic, rng=rng,
                                                   start_layer=self.start_layer)
        width = example[key].shape[-1]
        return loss, (metrics, jnp.zeros((0, width), jnp.float32))


# ----------------------------------------------------------------------------- evaluation


def batch_metric_sums(loss_fn: LossFn, params: nnx.State, batch: Example, mask: jax.Array
                      ) -> Metrics:
    """Sums of the (deterministic) loss's metrics over the real examples of a padded batch.

    `loss_fn` should be built with `deterministic=True`; mask bool [B] (False = padding slot).
    Jit it: `jax.jit(functools.partial(batch_metric_sums, loss_fn))`.
    """
    key = jax.random.key(0)   # unused by a deterministic loss
    _, metrics = jax.vmap(lambda ex: loss_fn(params, ex, key))(batch)
    keep = jnp.asarray(mask, bool)
    return {k: jnp.sum(jnp.where(keep, v, 0.0)) for k, v in metrics.items()}


def predict_classes(graphdef: nnx.GraphDef, params: nnx.State, batch: Example) -> jax.Array:
    """argmax predictions, dropout off: int32 [B] (sequence model) or [B, S] (token model).

    Runs the batch in one forward pass (no per-example vmap). Accepts every input mode.
    """
    model = nnx.merge(graphdef, params)
    if "features" in batch:
        logits = model.classify(batch["features"])
    else:
        logits = model(batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                       word_embeddings=batch.get("word_embeddings"))
    return jnp.argmax(logits, -1).astype(jnp.int32)


def summarize_classification(sums: dict[str, float]) -> dict[str, float]:
    """{eval_loss, eval_accuracy, num_examples} from summed metrics (host floats)."""
    n = float(sums["count"])
    return {"eval_loss": float(sums["loss_sum"]) / max(n, 1.0),
            "eval_accuracy": float(sums["correct"]) / max(n, 1.0), "num_examples": int(n)}


def summarize_token_classification(sums: dict[str, float]) -> dict[str, float]:
    """{eval_loss (per token), eval_token_accuracy, num_tokens, num_examples}."""
    t = float(sums["token_count"])
    return {"eval_loss": float(sums["loss_sum"]) / max(t, 1.0),
            "eval_token_accuracy": float(sums["correct"]) / max(t, 1.0), "num_tokens": int(t),
            "num_examples": int(float(sums["count"]))}

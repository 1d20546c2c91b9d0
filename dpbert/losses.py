"""Per-example BERT pretraining losses (MLM + NSP), written for `jax.vmap`.

The DP engine differentiates one example at a time, so every function here takes ONE unbatched
example (the feature dict of `data_pipelines`, no batch axis) and returns a scalar loss plus
per-example metric *sums*. Sums (not means) are what can be added over a batch; the training loop
only ever reports batch totals, never a per-example value (DESIGN.md, privacy rules).
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from flax import nnx

Example = dict[str, jax.Array]
Metrics = dict[str, jax.Array]
LossFn = Callable[[nnx.State, Example, jax.Array], tuple[jax.Array, Metrics]]


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """-log softmax(logits)[label], float32; logits [..., C], labels [...] int -> [...]."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(logp, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]


def mlm_nsp_loss(mlm_logits: jax.Array, nsp_logits: jax.Array, example: Example
                 ) -> tuple[jax.Array, Metrics]:
    """BERT's pretraining objective for one example.

    Args:
      mlm_logits: [P, V] logits at the example's masked positions.
      nsp_logits: [2] next-sentence logits.
      example: `masked_lm_ids` [P], `masked_lm_weights` [P], `next_sentence_labels` [].
    Returns:
      loss: mean MLM cross-entropy over the example's real predictions + NSP cross-entropy.
      metrics: per-example sums (mlm_loss_sum, mlm_correct, mlm_weight, nsp_loss, nsp_correct,
        count), safe to add over a batch.
    """
    ids = example["masked_lm_ids"]
    weights = example["masked_lm_weights"].astype(jnp.float32)
    nll = cross_entropy(mlm_logits, ids)
    mlm_loss_sum = jnp.sum(weights * nll)
    mlm_weight = jnp.sum(weights)
    # Weights are 0/1, so max(., 1) only matters for an example with no predictions (loss 0).
    mlm_loss = mlm_loss_sum / jnp.maximum(mlm_weight, 1.0)
    nsp_label = example["next_sentence_labels"].reshape(())
    nsp_loss = cross_entropy(nsp_logits, nsp_label)
    correct = (jnp.argmax(mlm_logits, axis=-1) == ids).astype(jnp.float32)
    metrics = {
        "mlm_loss_sum": mlm_loss_sum,
        "mlm_correct": jnp.sum(weights * correct),
        "mlm_weight": mlm_weight,
        "nsp_loss": nsp_loss,
        "nsp_correct": (jnp.argmax(nsp_logits, axis=-1) == nsp_label).astype(jnp.float32),
        "count": jnp.ones((), jnp.float32),
    }
    return mlm_loss + nsp_loss, metrics


def make_pretraining_loss(graphdef: nnx.GraphDef, *, deterministic: bool = False) -> LossFn:
    """A pure per-example loss `loss_fn(params, example, rng) -> (loss, metrics)`.

    `params` is the `nnx.State` from `nnx.split(model)`; `example` is one unbatched example;
    `rng` drives dropout (ignored when `deterministic`).
    """

    def loss_fn(params: nnx.State, example: Example, rng: jax.Array):
        model = nnx.merge(graphdef, params)
        batch = jax.tree.map(lambda x: x[None], example)
        out = model(batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                    batch["masked_lm_positions"], deterministic=deterministic,
                    rngs=None if deterministic else nnx.Rngs(dropout=rng))
        return mlm_nsp_loss(out.mlm_logits[0], out.nsp_logits[0], example)

    return loss_fn

"""Per-example BERT pretraining losses (MLM + NSP), written for `jax.vmap`, and the MLM targets.

The DP engine differentiates one example at a time, so every function here takes ONE unbatched
example (the feature dict of `data_pipelines`, no batch axis) and returns a scalar loss plus
per-example metric *sums*. Sums (not means) are what can be added over a batch; the training loop
only ever reports batch totals, never a per-example value (DESIGN.md, privacy rules).

## MLM targets (Qu et al. 2021, Eq. 5-7)

A target maps the MLM logits at the P masked positions and the example to a per-position loss
and a per-position "correct" indicator. Registered targets:

* `vanilla` (Eq. 5, the default): predict `masked_lm_ids`. On an ordinary batch these are the
  original tokens (plain BERT); after `dpbert.privacy.dchi` privatization they are the *privatized*
  tokens, i.e. BERT pretraining on a privatized corpus.
* `prob` (Eq. 6): soft cross-entropy against the empirical distribution of the K privatized draws
  in `prob_masked_lm_ids` [P, K]: Σ_w count(w)/K · (−log p(w)) = mean_k −log p(ŵ_k). "Correct" is
  the fraction of the draws equal to the argmax.
* `denoising` (Eq. 7): predict the original token, `original_masked_lm_ids`.

`original_masked_lm_ids` and `prob_masked_lm_ids` are written by `dpbert.privacy.dchi.privatize_batch`.
When they are absent the example was not privatized, and every target reduces to plain BERT
(the original token, or K copies of it), which is what they fall back to.

Adding a target takes a few lines::

    @losses.register_mlm_target("my_target")
    def my_target(mlm_logits, example):       # [P, V] float32, one unbatched example
        labels = example["original_masked_lm_ids"]
        return losses.hard_label_target(mlm_logits, labels)   # (loss [P], correct [P])

and `make_pretraining_loss(graphdef, mlm_target="my_target")` picks it by name.

## Frozen user-side embedding (privacy-adaptive pretraining)

With `frozen_word_embedding=True` the word-embedding table goes through `jax.lax.stop_gradient`
before the model is built, so its gradient is exactly zero. The table is φ, the user-side
embedding that dχ privatization uses: Qu et al. (Sec. 3.4) found that letting it train makes
tokens harder to perturb, i.e. silently weakens the privacy a given η stands for.

The MLM decoder is tied to that same table in dpbert (and in the HF export, which writes one
tensor for both), so it is frozen as well: both the input lookup and the decoder see the
stop-gradient table. We keep the tie rather than untying a trainable decoder copy because the
exported model must carry φ unchanged as its word embeddings: a user who privatizes their text
with the exported model's embeddings then gets exactly the η-guarantee the model was adapted to.
The MLM head can still adapt through its transform (dense + LayerNorm) and its output bias,
which stay trainable. Zero gradient alone does not keep a parameter fixed: DP noise and weight
decay would still move it, so the optimizer must skip it (`frozen_parameter_mask`).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

import jax
import jax.numpy as jnp
from flax import nnx

from dpbert.models import bert as model_lib
from dpbert.dp import trees

Example = dict[str, jax.Array]
Metrics = dict[str, jax.Array]
LossFn = Callable[[nnx.State, Example, jax.Array], tuple[jax.Array, Metrics]]
TargetFn = Callable[[jax.Array, Example], tuple[jax.Array, jax.Array]]

# Path of the word-embedding table in the parameter pytree of `BertForPreTraining`.
WORD_EMBEDDING_PATH = ("bert", "embeddings", "word_embeddings", "embedding")
POSITION_EMBEDDING_PATH = ("bert", "embeddings", "position_embeddings", "embedding")


def cross_entropy(logits: jax.Array, labels: jax.Array) -> jax.Array:
    """-log softmax(logits)[label], float32; logits [..., C], labels [...] int -> [...]."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.take_along_axis(logp, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]


# ----------------------------------------------------------------------------- target registry


@dataclasses.dataclass(frozen=True)
class MlmTarget:
    """A registered MLM target.

    fn: (mlm_logits float32 [P, V], example) -> (loss float32 [P], correct float32 [P]).
    multi_draw: True if the target reads K privatized draws per masked position
      (`prob_masked_lm_ids`); `dchi.Privatizer.create` then produces `prob_samples` of them.
    """

    name: str
    fn: TargetFn
    multi_draw: bool = False


_MLM_TARGETS: dict[str, MlmTarget] = {}


def register_mlm_target(name: str, *, multi_draw: bool = False) -> Callable[[TargetFn], TargetFn]:
    """Decorator registering `fn(mlm_logits [P, V], example) -> (loss [P], correct [P])`."""

    def register(fn: TargetFn) -> TargetFn:
        if name in _MLM_TARGETS:
            raise ValueError(f"MLM target {name!r} is already registered")
        _MLM_TARGETS[name] = MlmTarget(name, fn, multi_draw)
        return fn

    return register


def get_mlm_target(name: str) -> MlmTarget:
    if name not in _MLM_TARGETS:
        raise ValueError(f"unknown MLM target {name!r}; registered: {sorted(_MLM_TARGETS)}")
    return _MLM_TARGETS[name]


def mlm_target_names() -> tuple[str, ...]:
    return tuple(sorted(_MLM_TARGETS))


def hard_label_target(mlm_logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Cross-entropy against one label per position: logits [P, V], labels int [P]."""
    correct = (jnp.argmax(mlm_logits, axis=-1) == labels).astype(jnp.float32)
    return cross_entropy(mlm_logits, labels), correct


@register_mlm_target("vanilla")
def vanilla_target(mlm_logits: jax.Array, example: Example) -> tuple[jax.Array, jax.Array]:
    """Eq. 5: the token at the masked position of the (privatized) text: `masked_lm_ids`."""
    return hard_label_target(mlm_logits, example["masked_lm_ids"])


@register_mlm_target("denoising")
def denoising_target(mlm_logits: jax.Array, example: Example) -> tuple[jax.Array, jax.Array]:
    """Eq. 7: the original token, `original_masked_lm_ids` (= masked_lm_ids if not privatized)."""
    labels = example.get("original_masked_lm_ids", example["masked_lm_ids"])
    return hard_label_target(mlm_logits, labels)


@register_mlm_target("prob", multi_draw=True)
def prob_target(mlm_logits: jax.Array, example: Example) -> tuple[jax.Array, jax.Array]:
    """Eq. 6: soft cross-entropy against the empirical law of the draws `prob_masked_lm_ids`
    [P, K] (one draw of the original token when not privatized)."""
    draws = example.get("prob_masked_lm_ids", example["masked_lm_ids"][:, None])
    draws = draws.astype(jnp.int32)
    logp = jax.nn.log_softmax(mlm_logits.astype(jnp.float32), axis=-1)
    loss = -jnp.mean(jnp.take_along_axis(logp, draws, axis=-1), axis=-1)
    pred = jnp.argmax(mlm_logits, axis=-1)
    correct = jnp.mean((draws == pred[:, None]).astype(jnp.float32), axis=-1)
    return loss, correct


# ----------------------------------------------------------------------------- the loss


def mlm_nsp_loss(mlm_logits: jax.Array, nsp_logits: jax.Array, example: Example,
                 mlm_target: str | MlmTarget = "vanilla", nsp: bool = True
                 ) -> tuple[jax.Array, Metrics]:
    """BERT's pretraining objective for one example.

    Args:
      mlm_logits: [P, V] logits at the example's masked positions.
      nsp_logits: [2] next-sentence logits.
      example: `masked_lm_ids` [P], `masked_lm_weights` [P], `next_sentence_labels` [], plus
        whatever the MLM target reads.
      mlm_target: a registered target name (default "vanilla" = plain BERT on plain batches).
      nsp: add the NSP cross-entropy to the loss (`train.nsp`); without it the loss is the MLM
        loss alone (the NSP metrics are still reported, of an untrained head).
    Returns:
      loss: mean MLM loss over the example's real predictions (+ NSP cross-entropy).
      metrics: per-example sums (mlm_loss_sum, mlm_correct, mlm_weight, nsp_loss, nsp_correct,
        count), safe to add over a batch.
    """
    target = mlm_target if isinstance(mlm_target, MlmTarget) else get_mlm_target(mlm_target)
    weights = example["masked_lm_weights"].astype(jnp.float32)
    per_position, correct = target.fn(mlm_logits, example)
    mlm_loss_sum = jnp.sum(weights * per_position)
    mlm_weight = jnp.sum(weights)
    # Weights are 0/1, so max(., 1) only matters for an example with no predictions (loss 0).
    mlm_loss = mlm_loss_sum / jnp.maximum(mlm_weight, 1.0)
    nsp_label = example["next_sentence_labels"].reshape(())
    nsp_loss = cross_entropy(nsp_logits, nsp_label)
    metrics = {
        "mlm_loss_sum": mlm_loss_sum,
        "mlm_correct": jnp.sum(weights * correct),
        "mlm_weight": mlm_weight,
        "nsp_loss": nsp_loss,
        "nsp_correct": (jnp.argmax(nsp_logits, axis=-1) == nsp_label).astype(jnp.float32),
        "count": jnp.ones((), jnp.float32),
    }
    return (mlm_loss + nsp_loss if nsp else mlm_loss), metrics


def _is_word_embedding(path: tuple[Any, ...]) -> bool:
    """True for the pytree path of the word-embedding table (nnx.State or a plain dict)."""
    return trees.path_names(path) == WORD_EMBEDDING_PATH


def stop_word_embedding_gradient(params: Any) -> Any:
    """The same parameters with `stop_gradient` on the word-embedding table only."""
    found = []

    def visit(path, leaf):
        if _is_word_embedding(path):
            found.append(path)
            return jax.lax.stop_gradient(leaf)
        return leaf

    out = jax.tree_util.tree_map_with_path(visit, params)
    if len(found) != 1:
        raise ValueError(f"expected one word-embedding table at {'/'.join(WORD_EMBEDDING_PATH)} "
                         f"in the parameters, found {len(found)}")
    return out


def frozen_parameter_mask(params: Any, frozen_word_embedding: bool = True) -> Any:
    """Pytree of bools like `params`: True for parameters the optimizer must not update.

    Use e.g. `optax.multi_transform({False: opt, True: optax.set_to_zero()}, mask)`, so neither
    DP noise nor weight decay moves the frozen table.
    """
    return jax.tree_util.tree_map_with_path(
        lambda path, _: bool(frozen_word_embedding and _is_word_embedding(path)), params)


def make_pretraining_loss(graphdef: nnx.GraphDef, *, deterministic: bool = False,
                          mlm_target: str = "vanilla", frozen_word_embedding: bool = False,
                          nsp: bool = True) -> LossFn:
    """A pure per-example loss `loss_fn(params, example, rng) -> (loss, metrics)`.

    `params` is the `nnx.State` from `nnx.split(model)`; `example` is one unbatched example;
    `rng` drives dropout (ignored when `deterministic`). If the example carries
    `word_embeddings` [S, H] (dχ token_rep), the model consumes them instead of looking up
    `input_ids`. `mlm_target` names a registered target; `frozen_word_embedding` stops the
    gradient of the (tied) word-embedding table (privacy-adaptive pretraining); `nsp=False`
    leaves the NSP loss out (`mlm_nsp_loss`).
    """
    target = get_mlm_target(mlm_target)

    def loss_fn(params: nnx.State, example: Example, rng: jax.Array):
        if frozen_word_embedding:
            params = stop_word_embedding_gradient(params)
        model = nnx.merge(graphdef, params)
        batch = jax.tree.map(lambda x: x[None], example)
        out = model(batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                    batch["masked_lm_positions"], deterministic=deterministic,
                    rngs=None if deterministic else nnx.Rngs(dropout=rng),
                    word_embeddings=batch.get("word_embeddings"))
        return mlm_nsp_loss(out.mlm_logits[0], out.nsp_logits[0], example, target, nsp)

    return loss_fn


# ----------------------------------------------------------------------------- factored form


@dataclasses.dataclass(frozen=True)
class FactoredPretrainingLoss:
    """The pretraining loss with the tied word-embedding table E [V, H] factored out.

    Calling it is exactly `make_pretraining_loss(...)` (same function, same numerics); the
    extra methods expose the two places where E enters, for a clipper that computes the
    per-example norm and clipped sum of E's gradient without a per-example [V, H] array
    (`dpbert.dp.ghost.TiedEmbeddingClipper`):

        x      = E[lookup_ids(example)]              [S, H]  the input vectors, or the
                                                             example's `word_embeddings`
                                                             (dχ token_rep: E not used)
        f      = transform(encoder(x, ...))[masked]  [P, H]  MLM head features
        logits = f E^T + b + probe                   [P, V]  probe: zeros whose gradient is
                                                             d = dL/dlogits

    so that dL/dE = sum_t onehot(id_t) (dL/dx_t)^T + d^T f.  `factored` runs the same
    submodules as `BertForPreTraining.__call__` in the same order (so one dropout key gives
    the same dropout masks) and treats E as a constant: its gradient is not formed.

    Attributes:
      graphdef: from ``nnx.split(model)`` of a `BertForPreTraining`.
      deterministic: dropout off.
      mlm_target: a registered MLM target name.
      frozen_word_embedding: E gets no gradient at all (dχ privacy-adaptive pretraining).
      nsp: the NSP loss is part of the loss (`mlm_nsp_loss`).
    """

    graphdef: nnx.GraphDef
    deterministic: bool = False
    mlm_target: str = "vanilla"
    frozen_word_embedding: bool = False
    nsp: bool = True
    # Path names of E in the parameter pytree (`dpbert.dp.trees.path_names` form).
    table_path: tuple[str, ...] = WORD_EMBEDDING_PATH
    # Path names of the position table P, used as P[:S] added to the input vectors.
    position_table_path: tuple[str, ...] = POSITION_EMBEDDING_PATH

    def __post_init__(self):
        get_mlm_target(self.mlm_target)  # fails early on an unknown name

    @property
    def _reference(self) -> LossFn:
        return make_pretraining_loss(self.graphdef, deterministic=self.deterministic,
                                     mlm_target=self.mlm_target,
                                     frozen_word_embedding=self.frozen_word_embedding,
                                     nsp=self.nsp)

    def __call__(self, params: nnx.State, example: Example, rng: jax.Array
                 ) -> tuple[jax.Array, Metrics]:
        """Same as the `make_pretraining_loss` function with these settings."""
        return self._reference(params, example, rng)

    @staticmethod
    def lookup_ids(example: Example) -> jax.Array | None:
        """int [S] rows of E looked up as the input vectors, or None when the example carries
        its own `word_embeddings` (then E is used by the MLM decoder only)."""
        return None if "word_embeddings" in example else example["input_ids"]

    @staticmethod
    def zero_probe(example: Example, vocab_size: int) -> jax.Array:
        """float32 zeros [P, V]: the logits probe of `factored`."""
        return jnp.zeros((example["masked_lm_positions"].shape[-1], vocab_size), jnp.float32)

    def factored(self, params: nnx.State, example: Example, rng: jax.Array,
                 x: jax.Array | None, probe: jax.Array
                 ) -> tuple[jax.Array, tuple[Metrics, jax.Array]]:
        """The loss as a function of the input vectors and the logits probe.

        Args:
          params: parameter pytree (E inside it is used by the decoder only, as a constant
            the caller does not differentiate).
          example: one unbatched example.
          rng: dropout key (as for `__call__`).
          x: float32 [S, H] input vectors, normally E[lookup_ids(example)]; None when
            `lookup_ids` is None (the example's `word_embeddings` are used).
          probe: float32 [P, V] added to the MLM logits (zeros: the loss is unchanged).

        Returns:
          (loss, (metrics, f)): loss and metrics as `__call__` gives them for x = E[ids];
          f: float32 [P, H], the MLM head features at the masked positions.
        """
        return self._factored(nnx.merge(self.graphdef, params), example, rng, x, probe)

    def tapped(self, params: nnx.State, example: Example, rng: jax.Array,
               x: jax.Array | None, probe: jax.Array, dense_probes: dict[str, jax.Array]
               ) -> tuple[jax.Array, tuple[Metrics, jax.Array, dict[str, jax.Array]]]:
        """`factored` with every dense layer tapped (`dpbert.models.bert.DenseTap`).

        Also the input of the word/position/segment sum: x enters as ``x + P[:S] + T[seg]``,
        so dL/dx is also the gradient of the position rows P[:S] (`position_table_path`).

        Args:
          dense_probes: layer name -> float32 zeros shaped like its output (batch axis 1),
            added to that layer's output; layers not named are only recorded.

        Returns:
          (loss, (metrics, f, inputs)): as `factored`, plus inputs: layer name -> the array
          its kernel multiplied, [1, ..., in] in the compute dtype, for every dense layer
          (the kernel is at name + "/kernel").
        """
        model = nnx.merge(self.graphdef, params)
        with model_lib.dense_tap(model_lib.DenseTap(model, dense_probes)) as tap:
            loss, (metrics, f) = self._factored(model, example, rng, x, probe)
        return loss, (metrics, f, tap.inputs)

    def _factored(self, model: nnx.Module, example: Example, rng: jax.Array,
                  x: jax.Array | None, probe: jax.Array
                  ) -> tuple[jax.Array, tuple[Metrics, jax.Array]]:
        batch = jax.tree.map(lambda a: a[None], example)
        if x is None:
            x = example["word_embeddings"]
        rngs = None if self.deterministic else nnx.Rngs(dropout=rng)
        # The same calls, in the same order, as BertForPreTraining.__call__ (the MLM head has
        # no dropout), so the dropout stream yields the same masks.
        sequence_output, pooled = model.bert(
            batch["input_ids"], batch["segment_ids"], batch["input_mask"],
            deterministic=self.deterministic, rngs=rngs, word_embeddings=x[None])
        gathered = jnp.take_along_axis(
            sequence_output, batch["masked_lm_positions"][..., None].astype(jnp.int32), axis=1)
        head = model.cls.predictions
        f = head.transform(gathered)[0]
        table = jax.lax.stop_gradient(model.bert.embeddings.word_embeddings.embedding[...])
        # = BertLMPredictionHead.__call__ with the probe added.
        logits = jnp.einsum("ph,vh->pv", f, table.astype(f.dtype),
                            preferred_element_type=jnp.float32)
        logits = logits + head.bias[...] + probe
        nsp_logits = model.cls.seq_relationship(pooled)[0].astype(jnp.float32)
        loss, metrics = mlm_nsp_loss(logits, nsp_logits, example,
                                     get_mlm_target(self.mlm_target), self.nsp)
        return loss, (metrics, f.astype(jnp.float32))


def make_factored_pretraining_loss(graphdef: nnx.GraphDef, *, deterministic: bool = False,
                                   mlm_target: str = "vanilla",
                                   frozen_word_embedding: bool = False, nsp: bool = True
                                   ) -> FactoredPretrainingLoss:
    """`make_pretraining_loss` with the same arguments, plus the factored view of the tied word
    embedding (see `FactoredPretrainingLoss`); use it with `dpbert.dp.TiedEmbeddingClipper`."""
    return FactoredPretrainingLoss(graphdef, deterministic=deterministic, mlm_target=mlm_target,
                                   frozen_word_embedding=frozen_word_embedding, nsp=nsp)

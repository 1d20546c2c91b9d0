"""BERT in Flax NNX, numerically exact to Hugging Face `transformers` BERT.

The model is the original post-LayerNorm BERT (Devlin et al. 2019) with the pretraining heads:

    embeddings = LayerNorm(word[input_ids] + position[0..S) + token_type[segment_ids]) -> dropout
    L x encoder layer (post-LN):
        h = LayerNorm(h + dropout(Dense(MultiHeadSelfAttention(h, input_mask))))
        h = LayerNorm(h + dropout(Dense(gelu(Dense(h)))))
    pooled = tanh(Dense(h[:, 0]))                                   (the [CLS] token)
    mlm_logits = LayerNorm(gelu(Dense(h[masked positions]))) @ word_embeddings.T + bias
    nsp_logits = Dense(pooled)                                       (2 classes, 1 = random next)

Design points that other parts of dpbert rely on:

* **Pure function of a parameter pytree.** Dropout takes its randomness at call time
  (`rngs=nnx.Rngs(dropout=key)`), so the module holds no RNG state and
  `graphdef, params = nnx.split(model)` yields parameters only. The DP engine `jax.vmap`s the
  per-example loss over examples; the model has no cross-example operation (no BatchNorm, no
  batch-level statistics), so per-example gradients are exact.
* **Logical axis names, no mesh.** Every parameter carries logical axis names in its
  `out_sharding` metadata (`vocab`, `embed`, `heads`, `mlp`, `position`, `type_vocab`); the
  mapping to a device mesh lives in `dpbert.runtime.sharding`.
* **Dtypes.** Parameters are float32. The compute dtype (`BertConfig.dtype`) is float32 by
  default and may be bfloat16; attention softmax, LayerNorm statistics and the output logits are
  computed in float32 either way.
* **Exact GELU** (erf form), which is what HF calls `"gelu"`.
* **Dense taps.** Every dense layer is a `Dense` (an `nnx.Linear`: same parameters, same
  numerics). Inside `with dense_tap(tap):` each call also hands its input and output to `tap`,
  which may add a "probe" (zeros) to the output; DP clipping uses this to get the per-example
  input a and output gradient g = dL/dprobe of every dense layer, from which the per-example
  kernel gradient a^T g, its norm and a weighted sum over examples follow without a
  per-example [in, out] gradient (`dpbert.dp.mixed_ghost`). Outside a tap nothing changes.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import math
from typing import Any, Iterator, Mapping, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from dpbert import prng

# Size presets: (num_hidden_layers, hidden_size, num_attention_heads). The intermediate (MLP)
# size is 4 x hidden as in every published BERT.
PRESETS: dict[str, tuple[int, int, int]] = {
    "micro": (2, 64, 2),
    "tiny": (2, 128, 2),
    "mini": (4, 256, 4),
    "small": (4, 512, 8),
    "medium": (8, 512, 8),
    "base": (12, 768, 12),
    "large": (24, 1024, 16),
}

_COMPUTE_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}


@dataclasses.dataclass(frozen=True)
class BertConfig:
    """Architecture hyperparameters. Field names and meanings match HF `BertConfig`."""

    vocab_size: int
    hidden_size: int = 768
    num_hidden_layers: int = 12
    num_attention_heads: int = 12
    intermediate_size: int = 3072
    hidden_dropout_prob: float = 0.1
    attention_probs_dropout_prob: float = 0.1
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    initializer_range: float = 0.02
    layer_norm_eps: float = 1e-12
    pad_token_id: int = 0
    # Compute dtype ("float32" or "bfloat16"); parameters are always float32.
    dtype: str = "float32"

    def __post_init__(self):
        positive = ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                    "intermediate_size", "max_position_embeddings", "type_vocab_size")
        for name in positive:
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"BertConfig.{name} must be a positive integer, got {value!r}")
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"BertConfig.hidden_size ({self.hidden_size}) must be divisible by "
                f"num_attention_heads ({self.num_attention_heads})")
        for name in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ValueError(f"BertConfig.{name} must be in [0, 1), got {value!r}")
        if self.dtype not in _COMPUTE_DTYPES:
            raise ValueError(
                f"BertConfig.dtype must be one of {sorted(_COMPUTE_DTYPES)}, got {self.dtype!r}")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise ValueError(
                f"BertConfig.pad_token_id ({self.pad_token_id}) must be a valid id below "
                f"vocab_size ({self.vocab_size})")

    @classmethod
    def preset(cls, name: str, vocab_size: int, **overrides: Any) -> "BertConfig":
        """A named size (tiny, mini, small, medium, base, large) for a given vocabulary."""
        if name not in PRESETS:
            raise ValueError(f"unknown BERT size {name!r}; choose one of {sorted(PRESETS)}")
        layers, hidden, heads = PRESETS[name]
        fields = dict(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, intermediate_size=4 * hidden)
        fields.update(overrides)
        return cls(**fields)

    @property
    def compute_dtype(self) -> jnp.dtype:
        return _COMPUTE_DTYPES[self.dtype]

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    def replace(self, **changes: Any) -> "BertConfig":
        return dataclasses.replace(self, **changes)


class BertOutput(NamedTuple):
    """What `BertForPreTraining` returns.

    sequence_output: [B, S, H] final hidden states (compute dtype).
    pooled_output:   [B, H] tanh(Dense(h[:, 0])) (compute dtype).
    mlm_logits:      [B, P, V] at `masked_lm_positions`, or [B, S, V] when those are None (float32).
    nsp_logits:      [B, 2] next-sentence logits, class 1 = "B is random" (float32).
    """

    sequence_output: jax.Array
    pooled_output: jax.Array
    mlm_logits: jax.Array
    nsp_logits: jax.Array


def _with_axes(init, axes: tuple[str | None, ...]):
    """Attach logical axis names to an initialiser.

    `eager_sharding=False`: the names are metadata only; the model never places parameters on a
    mesh itself (dpbert.runtime.sharding does that from the names and the config's axis rules).
    """
    return nnx.with_partitioning(init, axes, eager_sharding=False)


def _init(config: BertConfig, axes: tuple[str | None, ...]):
    """BERT's weight initialiser (truncated normal, std initializer_range) with logical axes."""
    return _with_axes(nnx.initializers.truncated_normal(stddev=config.initializer_range), axes)


# ----------------------------------------------------------------------------- dense taps

_ACTIVE_TAP: contextvars.ContextVar["DenseTap | None"] = contextvars.ContextVar(
    "dpbert_dense_tap", default=None)


class Dense(nnx.Linear):
    """`nnx.Linear` that an active `DenseTap` observes (see the module docstring)."""

    def __call__(self, inputs: jax.Array, out_sharding=None) -> jax.Array:
        y = super().__call__(inputs, out_sharding)
        tap = _ACTIVE_TAP.get()
        return y if tap is None else tap(self, inputs, y)


class DenseTap:
    """Records every `Dense` call of one forward pass of `model` and adds probes.

    Args:
      model: the module whose forward pass is observed (its `Dense` submodules are named by
        their attribute path, e.g. ``bert/encoder/layer/0/attention/self/query``; the kernel
        is at that path + ``/kernel`` in the parameter pytree).
      probes: name -> array shaped like that layer's output (normally zeros), added to the
        output; layers without a probe are only recorded.

    After the pass, `inputs[name]` is the array the kernel multiplied (the input cast to the
    layer's compute dtype) and `output_shapes[name]` the output's shape.  A layer called
    twice in one pass raises (its per-example gradient would need both calls).
    """

    def __init__(self, model: nnx.Module, probes: Mapping[str, jax.Array] | None = None):
        self.names = {id(m): "/".join(str(k) for k in path)
                      for path, m in nnx.iter_modules(model) if isinstance(m, Dense)}
        self.probes = dict(probes or {})
        self.inputs: dict[str, jax.Array] = {}
        self.output_shapes: dict[str, tuple[int, ...]] = {}

    def __call__(self, module: Dense, inputs: jax.Array, y: jax.Array) -> jax.Array:
        name = self.names.get(id(module))
        if name is None:
            raise ValueError("DenseTap: a Dense layer outside the tapped model was called")
        if name in self.inputs:
            raise ValueError(f"DenseTap: {name} was called twice in one forward pass")
        self.inputs[name] = inputs if module.dtype is None else inputs.astype(module.dtype)
        self.output_shapes[name] = tuple(y.shape)
        probe = self.probes.get(name)
        if probe is not None:
            if probe.shape != y.shape:
                raise ValueError(f"DenseTap: probe for {name} has shape {probe.shape}, the "
                                 f"layer's output {y.shape}")
            y = y + probe.astype(y.dtype)
        return y


@contextlib.contextmanager
def dense_tap(tap: DenseTap) -> Iterator[DenseTap]:
    """Activates `tap` for the `Dense` calls made inside the block (one forward pass)."""
    token = _ACTIVE_TAP.set(tap)
    try:
        yield tap
    finally:
        _ACTIVE_TAP.reset(token)


def _dense(config: BertConfig, din: int, dout: int, axes: tuple[str, str], *,
           rngs: nnx.Rngs) -> Dense:
    return Dense(
        din, dout, dtype=config.compute_dtype, param_dtype=jnp.float32,
        kernel_init=_init(config, axes),
        bias_init=_with_axes(nnx.initializers.zeros_init(), (axes[1],)),
        rngs=rngs)


def _layer_norm(config: BertConfig, *, rngs: nnx.Rngs) -> nnx.LayerNorm:
    return nnx.LayerNorm(
        config.hidden_size, epsilon=config.layer_norm_eps, dtype=config.compute_dtype,
        param_dtype=jnp.float32,
        scale_init=_with_axes(nnx.initializers.ones_init(), ("embed",)),
        bias_init=_with_axes(nnx.initializers.zeros_init(), ("embed",)),
        rngs=rngs)


def _embed(config: BertConfig, num: int, axes: tuple[str, str], *, rngs: nnx.Rngs) -> nnx.Embed:
    return nnx.Embed(num, config.hidden_size, dtype=config.compute_dtype,
                     param_dtype=jnp.float32, embedding_init=_init(config, axes), rngs=rngs)


def gelu(x: jax.Array) -> jax.Array:
    """Exact (erf) GELU: HF's "gelu", not the tanh approximation."""
    return jax.nn.gelu(x, approximate=False)


class BertEmbeddings(nnx.Module):
    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.word_embeddings = _embed(config, config.vocab_size, ("vocab", "embed"), rngs=rngs)
        self.position_embeddings = _embed(
            config, config.max_position_embeddings, ("position", "embed"), rngs=rngs)
        self.token_type_embeddings = _embed(
            config, config.type_vocab_size, ("type_vocab", "embed"), rngs=rngs)
        self.LayerNorm = _layer_norm(config, rngs=rngs)
        self.dropout = prng.Dropout(config.hidden_dropout_prob)

    def __call__(self, input_ids: jax.Array, segment_ids: jax.Array, *, deterministic: bool,
                 rngs: nnx.Rngs | None, word_embeddings: jax.Array | None = None) -> jax.Array:
        """input_ids, segment_ids: [B, S] int -> [B, S, H]."""
        seq_len = input_ids.shape[-1]
        if seq_len > self.config.max_position_embeddings:
            raise ValueError(f"sequence length {seq_len} exceeds max_position_embeddings "
                             f"{self.config.max_position_embeddings}")
        if word_embeddings is None:
            words = self.word_embeddings(input_ids)
        else:
            words = word_embeddings.astype(self.config.compute_dtype)
        positions = self.position_embeddings.embedding[...][:seq_len].astype(words.dtype)
        x = words + positions + self.token_type_embeddings(segment_ids)
        x = self.LayerNorm(x)
        return self.dropout(x, deterministic=deterministic, rngs=rngs)


class BertSelfAttention(nnx.Module):
    """Multi-head self-attention with a key padding mask (no cross-example operation)."""

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.config = config
        h = config.hidden_size
        self.query = _dense(config, h, h, ("embed", "heads"), rngs=rngs)
        self.key = _dense(config, h, h, ("embed", "heads"), rngs=rngs)
        self.value = _dense(config, h, h, ("embed", "heads"), rngs=rngs)
        self.dropout = prng.Dropout(config.attention_probs_dropout_prob)

    def __call__(self, x: jax.Array, mask_bias: jax.Array, *, deterministic: bool,
                 rngs: nnx.Rngs | None) -> jax.Array:
        """x: [B, S, H]; mask_bias: [B, 1, 1, S] additive (0 or a large negative) -> [B, S, H]."""
        cfg = self.config
        batch, seq, _ = x.shape
        split = lambda t: t.reshape(batch, seq, cfg.num_attention_heads, cfg.head_dim)
        q, k, v = split(self.query(x)), split(self.key(x)), split(self.value(x))
        scores = jnp.einsum("bqnd,bknd->bnqk", q, k, preferred_element_type=jnp.float32)
        scores = scores / math.sqrt(cfg.head_dim) + mask_bias
        probs = jax.nn.softmax(scores, axis=-1)
        probs = self.dropout(probs, deterministic=deterministic, rngs=rngs)
        context = jnp.einsum("bnqk,bknd->bqnd", probs.astype(v.dtype), v)
        return context.reshape(batch, seq, cfg.hidden_size)


class BertSelfOutput(nnx.Module):
    def __init__(self, config: BertConfig, din: int, axes: tuple[str, str], *, rngs: nnx.Rngs):
        self.dense = _dense(config, din, config.hidden_size, axes, rngs=rngs)
        self.LayerNorm = _layer_norm(config, rngs=rngs)
        self.dropout = prng.Dropout(config.hidden_dropout_prob)

    def __call__(self, x: jax.Array, residual: jax.Array, *, deterministic: bool,
                 rngs: nnx.Rngs | None) -> jax.Array:
        x = self.dropout(self.dense(x), deterministic=deterministic, rngs=rngs)
        return self.LayerNorm(x + residual)


class BertAttention(nnx.Module):
    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.self = BertSelfAttention(config, rngs=rngs)
        self.output = BertSelfOutput(config, config.hidden_size, ("heads", "embed"), rngs=rngs)

    def __call__(self, x, mask_bias, *, deterministic, rngs):
        attended = self.self(x, mask_bias, deterministic=deterministic, rngs=rngs)
        return self.output(attended, x, deterministic=deterministic, rngs=rngs)


class BertIntermediate(nnx.Module):
    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.dense = _dense(config, config.hidden_size, config.intermediate_size,
                            ("embed", "mlp"), rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return gelu(self.dense(x))


class BertLayer(nnx.Module):
    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.attention = BertAttention(config, rngs=rngs)
        self.intermediate = BertIntermediate(config, rngs=rngs)
        self.output = BertSelfOutput(config, config.intermediate_size, ("mlp", "embed"), rngs=rngs)

    def __call__(self, x, mask_bias, *, deterministic, rngs):
        x = self.attention(x, mask_bias, deterministic=deterministic, rngs=rngs)
        return self.output(self.intermediate(x), x, deterministic=deterministic, rngs=rngs)


class BertEncoder(nnx.Module):
    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.layer = nnx.List([BertLayer(config, rngs=rngs)
                               for _ in range(config.num_hidden_layers)])

    def __call__(self, x, mask_bias, *, deterministic, rngs, layers: slice = slice(None)):
        """Runs layers[`layers`] (all by default; a frozen prefix and the trained top run
        separately: `BertModel.prefix` / `BertModel.from_prefix`)."""
        for layer in list(self.layer)[layers]:
            x = layer(x, mask_bias, deterministic=deterministic, rngs=rngs)
        return x


class BertPooler(nnx.Module):
    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.dense = _dense(config, config.hidden_size, config.hidden_size, ("embed", "embed_out"),
                            rngs=rngs)

    def __call__(self, sequence_output: jax.Array) -> jax.Array:
        return jnp.tanh(self.dense(sequence_output[:, 0]))


class BertModel(nnx.Module):
    """The encoder: embeddings, L post-LN layers, pooler (HF `BertModel`)."""

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs, add_pooling_layer: bool = True):
        self.config = config
        self.embeddings = BertEmbeddings(config, rngs=rngs)
        self.encoder = BertEncoder(config, rngs=rngs)
        # HF's BertForTokenClassification has no pooler (`add_pooling_layer=False`).
        self.pooler = BertPooler(config, rngs=rngs) if add_pooling_layer else None

    def __call__(self, input_ids: jax.Array, segment_ids: jax.Array, input_mask: jax.Array, *,
                 deterministic: bool = True, rngs: nnx.Rngs | None = None,
                 word_embeddings: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
        """[B, S] ids, segments, mask (1 = real token) -> ([B, S, H], [B, H] or None when the
        model has no pooler)."""
        if not deterministic and rngs is None:
            raise ValueError("dropout is on (deterministic=False) but no rngs were given; pass "
                             "rngs=nnx.Rngs(dropout=key)")
        mask_bias = _mask_bias(input_mask)
        x = self.embeddings(input_ids, segment_ids, deterministic=deterministic, rngs=rngs,
                            word_embeddings=word_embeddings)
        x = self.encoder(x, mask_bias, deterministic=deterministic, rngs=rngs)
        return x, None if self.pooler is None else self.pooler(x)

    def prefix(self, input_ids: jax.Array, segment_ids: jax.Array, input_mask: jax.Array,
               num_layers: int, *, word_embeddings: jax.Array | None = None) -> jax.Array:
        """The frozen prefix, dropout off: the embeddings and the first `num_layers` layers ->
        [B, S, H] (what `from_prefix` continues from; `dpbert.tasks.prefix_cache`)."""
        x = self.embeddings(input_ids, segment_ids, deterministic=True, rngs=None,
                            word_embeddings=word_embeddings)
        return self.encoder(x, _mask_bias(input_mask), deterministic=True, rngs=None,
                            layers=slice(0, num_layers))

    def from_prefix(self, hidden: jax.Array, input_mask: jax.Array, start_layer: int, *,
                    deterministic: bool = True, rngs: nnx.Rngs | None = None
                    ) -> tuple[jax.Array, jax.Array]:
        """The rest of `__call__` after `prefix(..., start_layer)`: layers start_layer.. and
        the pooler -> ([B, S, H], [B, H] or None)."""
        x = self.encoder(hidden.astype(self.config.compute_dtype), _mask_bias(input_mask),
                         deterministic=deterministic, rngs=rngs,
                         layers=slice(start_layer, None))
        return x, None if self.pooler is None else self.pooler(x)


def _mask_bias(input_mask: jax.Array) -> jax.Array:
    """Additive key-padding bias [B, 1, 1, S]; float32 so it is exact in the softmax."""
    return jnp.where(input_mask[:, None, None, :] > 0, 0.0,
                     jnp.finfo(jnp.float32).min).astype(jnp.float32)


class BertPredictionHeadTransform(nnx.Module):
    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.dense = _dense(config, config.hidden_size, config.hidden_size, ("embed", "embed_out"),
                            rngs=rngs)
        self.LayerNorm = _layer_norm(config, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.LayerNorm(gelu(self.dense(x)))


class BertLMPredictionHead(nnx.Module):
    """MLM head; the decoder is the (tied) word-embedding matrix plus its own output bias."""

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.transform = BertPredictionHeadTransform(config, rngs=rngs)
        self.bias = nnx.Param(jnp.zeros((config.vocab_size,), jnp.float32),
                              out_sharding=("vocab",), eager_sharding=False)

    def __call__(self, x: jax.Array, word_embeddings: jax.Array) -> jax.Array:
        """x: [B, P, H]; word_embeddings: [V, H] -> float32 logits [B, P, V]."""
        h = self.transform(x)
        logits = jnp.einsum("bph,vh->bpv", h, word_embeddings.astype(h.dtype),
                            preferred_element_type=jnp.float32)
        return logits + self.bias[...]


class BertPreTrainingHeads(nnx.Module):
    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.predictions = BertLMPredictionHead(config, rngs=rngs)
        self.seq_relationship = _dense(config, config.hidden_size, 2, ("embed", "classes"),
                                       rngs=rngs)


class BertForPreTraining(nnx.Module):
    """BERT with the MLM and NSP heads (HF `BertForPreTraining`)."""

    def __init__(self, config: BertConfig, *, rngs: nnx.Rngs):
        self.config = config
        self.bert = BertModel(config, rngs=rngs)
        self.cls = BertPreTrainingHeads(config, rngs=rngs)

    def __call__(self, input_ids: jax.Array, segment_ids: jax.Array, input_mask: jax.Array,
                 masked_lm_positions: jax.Array | None = None, *, deterministic: bool = True,
                 rngs: nnx.Rngs | None = None,
                 word_embeddings: jax.Array | None = None) -> BertOutput:
        """Runs the encoder and both heads.

        Args:
          input_ids, segment_ids, input_mask: [B, S] int arrays (mask: 1 = real token).
          masked_lm_positions: [B, P] int positions to predict; None predicts all S positions.
          deterministic: False turns dropout on (needs `rngs`).
          rngs: `nnx.Rngs(dropout=key)` when dropout is on.
          word_embeddings: optional [B, S, H] vectors used instead of the word-embedding lookup
            (dχ token-representation privatization). The MLM decoder still uses the table.
        """
        sequence_output, pooled = self.bert(
            input_ids, segment_ids, input_mask, deterministic=deterministic, rngs=rngs,
            word_embeddings=word_embeddings)
        if masked_lm_positions is None:
            gathered = sequence_output
        else:
            gathered = jnp.take_along_axis(
                sequence_output, masked_lm_positions[..., None].astype(jnp.int32), axis=1)
        table = self.bert.embeddings.word_embeddings.embedding[...]
        mlm_logits = self.cls.predictions(gathered, table)
        nsp_logits = self.cls.seq_relationship(pooled).astype(jnp.float32)
        return BertOutput(sequence_output, pooled, mlm_logits, nsp_logits)


def create_model(config: BertConfig, seed: int = 0) -> BertForPreTraining:
    """A freshly initialised model (float32 parameters)."""
    return BertForPreTraining(config, rngs=nnx.Rngs(params=seed))


def count_params(model: nnx.Module) -> int:
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))

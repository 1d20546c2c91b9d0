r"""dχ-privacy mechanisms for privacy-adaptive BERT pretraining (Qu et al. 2021, Eq. 3-4).

Two token-level mechanisms, both calibrated by one parameter η > 0 (larger η = less noise):

* **Token-representation privatization** `M_rep(x) = x + r·u` with `r ~ Gamma(n, scale 1/η)` and
  `u` uniform on the unit sphere of R^n, n = embedding width. The noise density is
  ∝ exp(-η‖N‖), which gives dχ-privacy for the Euclidean metric (Feyisetan et al. 2020).
  `jax.random.gamma` has unit scale, hence the division by η.
* **Text-to-text privatization** `M_txt(w) = argmin_{v ∈ V} ‖φ(v) - M_rep(φ(w))‖`: the nearest
  regular vocabulary token, computed EXACTLY as `argmin ‖e‖² - 2 e·z` (‖z‖² is the same for
  every candidate) by matmul over vocabulary chunks of `chunk_size` rows, with a running
  (min, argmin); memory stays at [tokens, chunk]. Ties go to the lowest id, as `numpy.argmin`.
  The matmul runs at `Precision.HIGHEST`: TPUs (bf16 passes) and GPUs (TF32) would otherwise
  round float32 products and change which token is nearest.

Special tokens ([PAD] [UNK] [CLS] [SEP] [MASK] [unusedN]) are never perturbed (their ids and
embeddings pass through) and never chosen as an output (they are not search candidates).

## Where privatization runs

`Privatizer` is a pytree (its arrays are leaves, its settings static), meant to be called inside
the jitted train step on the training devices: `privatize_batch(privatizer, batch, key)`.
Exact nearest-neighbour search over a 30k x 384 vocabulary is a [tokens, 30k] matmul; a 2-core
host manages ~7k tokens/s (issue 6), slower than even a tiny BERT consumes, while an accelerator
does it at matmul speed. The host pipeline only masks; the device privatizes. Every example is
privatized afresh each time it is seen: the per-example key is `fold_in(key, position in batch)`,
and the caller passes a key unique to the (step, microbatch) — `batch_key(base, step, micro)`.
The privatizer has no cross-example operation, so it shards along the batch like the model. Its
table is replicated on every device (30522 x 768 float32 = 94 MB for BERT-base).

## How masking and privatization interact

The host masks first (contracts.md: `input_ids` already carries [MASK] / random / kept tokens,
`masked_lm_ids` the original tokens). The device then reproduces *privatize-then-mask*, i.e.
BERT pretraining on a privatized corpus, which is what Qu et al. describe for the Vanilla MLM
("pretrain BERT on fully privatized corpora", the label ŵ of Eq. 5 is "the true privatized
token", Sec. 3.4):

* every non-special input token is privatized with its own noise draw;
* [MASK] is a special token, so masked positions that show [MASK] stay [MASK];
* at a masked position where the host *kept* the original token (BERT's 10 % "unchanged"), the
  model sees the same privatized draw that is the Vanilla label — as if the privatized token had
  been kept;
* a host *random* replacement is privatized with an independent draw (it must not share noise
  with the label: at small η the shared noise would dominate and the input would give the label
  away). In token_rep mode this also keeps every non-special input vector off the vocabulary
  points, so the model cannot spot replaced positions.

## Fields a privatized example carries (unbatched; a batch adds the leading axis)

* `input_ids` int32 [S]: text_to_text: privatized ids; token_rep / none: unchanged.
* `word_embeddings` float32 [S, n] (token_rep only): M_rep(φ(w)) for regular tokens, φ(w)
  exactly for special tokens; the model's `word_embeddings=` input (position and segment
  embeddings are added by the model, i.e. on the service side).
* `masked_lm_ids` int32 [P]: the privatized draw of each masked original token, i.e. the
  nearest-token image of the noisy vector the model would have seen there (Vanilla label, Eq. 5).
  In token_rep mode this is M_txt with the same noise as the `word_embeddings` row at kept
  positions. For `none` it is the original.
* `original_masked_lm_ids` int32 [P]: the host's original masked tokens (Denoising label, Eq. 7).
* `prob_masked_lm_ids` int32 [P, K]: K independent privatized draws per masked position, column
  0 being `masked_lm_ids` (Prob MLM, Eq. 6; K = `label_draws`, 10 in the paper).
All other fields pass through. Padding prediction slots (weight 0, id [PAD]) stay [PAD].

The token embedding φ used here is a fixed copy; the model's own word-embedding table must be
frozen during privacy-adaptive pretraining (see `dpbert.models.losses`, `frozen_word_embedding=True`).

## Wiring (training loop)

    privatizer = dchi.Privatizer.from_model(model, vocab_file, mechanism=cfg.dchi.mechanism,
                                            eta=cfg.dchi.eta, mlm_target=cfg.mlm_target,
                                            prob_samples=cfg.dchi.prob_samples)
    frozen = cfg.dchi.mechanism != "none"
    loss_fn = losses.make_pretraining_loss(graphdef, mlm_target=cfg.mlm_target,
                                           frozen_word_embedding=frozen)
    tx = optax.multi_transform({False: tx, True: optax.set_to_zero()},
                               losses.frozen_parameter_mask(params, frozen))

    @jax.jit   # privatizer is an argument, not a closure
    def train_step(state, batch, privatizer, base_key):
        batch = dchi.privatize_batch(privatizer, batch,
                                     dchi.batch_key(base_key, state.step, microbatch))
        ...   # per-example loss_fn as before; `word_embeddings` is picked up automatically
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
import pathlib
import re
from typing import Any, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np

from data_pipelines import tokenization
from dpbert import prng

MECHANISMS = ("none", "text_to_text", "token_rep")
# The five special tokens of every BERT vocabulary; [unusedN] placeholders are special too.
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
_UNUSED_TOKEN = re.compile(r"\[unused\d+\]")
DEFAULT_CHUNK_SIZE = 4096

Batch = dict[str, jax.Array]


# ----------------------------------------------------------------------------- special tokens


def is_special_token(token: str) -> bool:
    """True for [PAD] [UNK] [CLS] [SEP] [MASK] and [unusedN] (the paper's non-regular tokens)."""
    return token in SPECIAL_TOKENS or _UNUSED_TOKEN.fullmatch(token) is not None


def special_token_mask(vocab: Sequence[str]) -> np.ndarray:
    """bool [V]: True where the vocabulary entry is special (never perturbed, never chosen)."""
    return np.array([is_special_token(t) for t in vocab], dtype=bool)


def special_token_mask_from_file(vocab_file: str | os.PathLike) -> np.ndarray:
    """bool [V] special-token mask of a vocab.txt."""
    return special_token_mask(tokenization.load_vocab(vocab_file))


# ----------------------------------------------------------------------------- M_rep


def sample_noise(key: jax.Array, shape: tuple[int, ...], dim: int, eta: jax.Array | float
                 ) -> jax.Array:
    """dχ noise N with density ∝ exp(-η‖N‖) in R^dim, float32 [*shape, dim].

    N = r·u, r ~ Gamma(dim, scale 1/η) (the radial law of that density), u uniform on the unit
    sphere (a normalised standard Gaussian vector). The Gaussian is `prng.standard_normal`,
    bit for bit ``jax.random.normal(k_dir, ...)`` (tested) in about 2 s less compile on the CPU
    than JAX's rolled threefry; the gamma draw is JAX's own.
    """
    k_dir, k_rad = jax.random.split(key)
    direction = prng.standard_normal(k_dir, (*shape, dim))
    direction = direction / jnp.linalg.norm(direction, axis=-1, keepdims=True)
    radius = jax.random.gamma(k_rad, float(dim), shape, jnp.float32) / jnp.asarray(eta, jnp.float32)
    return radius[..., None] * direction


def m_rep(key: jax.Array, x: jax.Array, eta: jax.Array | float) -> jax.Array:
    """Token-representation privatization (Eq. 3): x [..., n] float -> x + N, float32 [..., n]."""
    x = jnp.asarray(x, jnp.float32)
    return x + sample_noise(key, x.shape[:-1], x.shape[-1], eta)


# ----------------------------------------------------------------------------- exact NN search


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class SearchIndex:
    """The embedding table laid out for chunked exact nearest-neighbour search.

    chunks: float32 [C, chunk, n], the table padded with zero rows to C·chunk rows.
    bias:   float32 [C, chunk], ‖e‖² for candidate rows, +inf for non-candidates and padding, so
            `bias - 2 z·e` is the squared distance minus ‖z‖² (or +inf).
    vocab_size: the real number of rows V (static).
    """

    chunks: jax.Array
    bias: jax.Array
    vocab_size: int = dataclasses.field(metadata=dict(static=True))

    @property
    def dim(self) -> int:
        return self.chunks.shape[-1]

    @property
    def chunk_size(self) -> int:
        return self.chunks.shape[1]

    def lookup(self, ids: jax.Array) -> jax.Array:
        """φ(ids): int [...] -> float32 [..., n] (rows of the unpadded table)."""
        return self.chunks.reshape(-1, self.dim)[ids]

    @property
    def table(self) -> jax.Array:
        """The unpadded table, float32 [V, n]."""
        return self.chunks.reshape(-1, self.dim)[: self.vocab_size]


def build_search_index(table: np.ndarray | jax.Array, candidate_mask: np.ndarray | jax.Array,
                       chunk_size: int = DEFAULT_CHUNK_SIZE) -> SearchIndex:
    """Pads and reshapes φ [V, n] for `nearest_token`; candidate_mask bool [V] (True = may be
    chosen). Done once, on the host or device, outside the training step."""
    table = np.asarray(table, np.float32)
    candidates = np.asarray(candidate_mask, bool)
    if table.ndim != 2:
        raise ValueError(f"embedding table must be [V, n], got shape {table.shape}")
    if candidates.shape != (table.shape[0],):
        raise ValueError(f"candidate mask has shape {candidates.shape}, expected "
                         f"({table.shape[0]},) to match the embedding table")
    if not candidates.any():
        raise ValueError("no candidate tokens: every vocabulary entry is special")
    if not np.all(np.isfinite(table)):
        raise ValueError("embedding table has non-finite entries")
    if not isinstance(chunk_size, int) or chunk_size <= 0:
        raise ValueError(f"chunk_size must be a positive integer, got {chunk_size!r}")
    vocab, dim = table.shape
    chunk_size = min(chunk_size, vocab)
    num_chunks = math.ceil(vocab / chunk_size)
    pad = num_chunks * chunk_size - vocab
    # ‖e‖² in float64 then rounded once, so the bias is the correctly rounded float32 value.
    sq = np.sum(table.astype(np.float64) ** 2, axis=1).astype(np.float32)
    bias = np.where(candidates, sq, np.inf).astype(np.float32)
    chunks = np.concatenate([table, np.zeros((pad, dim), np.float32)])
    bias = np.concatenate([bias, np.full((pad,), np.inf, np.float32)])
    return SearchIndex(jnp.asarray(chunks.reshape(num_chunks, chunk_size, dim)),
                       jnp.asarray(bias.reshape(num_chunks, chunk_size)), vocab)


def nearest_token(z: jax.Array, index: SearchIndex) -> jax.Array:
    """Exact Euclidean nearest candidate token: z float [..., n] -> int32 [...].

    Scans the vocabulary chunk by chunk keeping a running (min score, argmin); a later chunk
    replaces the running best only when strictly better, and `argmin` within a chunk returns the
    first minimum, so ties resolve to the lowest id. Peak memory: [tokens, chunk] scores.
    """
    lead_shape = z.shape[:-1]
    flat = jnp.asarray(z, jnp.float32).reshape(-1, index.dim)
    num_chunks, chunk, _ = index.chunks.shape
    offsets = jnp.arange(num_chunks, dtype=jnp.int32) * chunk

    def scan_chunk(carry, xs):
        best_score, best_id = carry
        rows, bias, offset = xs
        dots = jnp.dot(flat, rows.T, precision=jax.lax.Precision.HIGHEST,
                       preferred_element_type=jnp.float32)
        scores = bias[None, :] - 2.0 * dots                       # [T, chunk]
        local = jnp.argmin(scores, axis=1).astype(jnp.int32)
        local_min = jnp.take_along_axis(scores, local[:, None], axis=1)[:, 0]
        better = local_min < best_score
        return (jnp.where(better, local_min, best_score),
                jnp.where(better, local + offset, best_id)), None

    init = (jnp.full(flat.shape[:1], jnp.inf, jnp.float32), jnp.zeros(flat.shape[:1], jnp.int32))
    (_, best), _ = jax.lax.scan(scan_chunk, init, (index.chunks, index.bias, offsets))
    return best.reshape(lead_shape)


def m_txt(key: jax.Array, ids: jax.Array, index: SearchIndex, special: jax.Array,
          eta: jax.Array | float) -> jax.Array:
    """Text-to-text privatization (Eq. 4) of token ids int [...] -> int32 [...].

    Regular tokens map to the nearest candidate of M_rep(φ(w)); special ids (special bool [V])
    pass through unchanged.
    """
    ids = jnp.asarray(ids, jnp.int32)
    noisy = m_rep(key, index.lookup(ids), eta)
    return jnp.where(special[ids], ids, nearest_token(noisy, index))


# ----------------------------------------------------------------------------- the privatizer


def batch_key(base_key: jax.Array, step: int | jax.Array, microbatch: int | jax.Array = 0
              ) -> jax.Array:
    """The key for one (step, microbatch): never reused across steps or microbatches."""
    return jax.random.fold_in(jax.random.fold_in(base_key, step), microbatch)


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Privatizer:
    """On-device dχ privatization of pretraining batches.

    Build with `Privatizer.create` / `.from_hf` / `.from_model`; call (inside jit) with
    `privatize_batch(privatizer, batch, key)`. Pass it to `jax.jit` as an argument rather than
    closing over it, so the table is not baked into the program as a constant. On a mesh,
    replicate it once: `jax.device_put(privatizer, NamedSharding(mesh, PartitionSpec()))`.

    index:   `SearchIndex` over φ with the regular tokens as candidates (None for "none").
    special: bool [V], True = special token.
    eta:     float32 [] privacy parameter (an array, so sweeping η does not recompile).
    mechanism: "none" | "text_to_text" | "token_rep" (static).
    label_draws: K privatized draws per masked position (static; 1, or the Prob MLM's K).
    """

    index: SearchIndex | None
    special: jax.Array
    eta: jax.Array
    mechanism: str = dataclasses.field(metadata=dict(static=True))
    label_draws: int = dataclasses.field(metadata=dict(static=True))

    @classmethod
    def create(cls, table: np.ndarray | jax.Array | None, special_mask: np.ndarray, *,
               eta: float, mechanism: str, mlm_target: str = "vanilla", prob_samples: int = 10,
               chunk_size: int = DEFAULT_CHUNK_SIZE) -> "Privatizer":
        """A privatizer for φ = `table` (float [V, n]) and `special_mask` (bool [V]).

        `mlm_target` names the registered MLM target (dpbert.models.losses) the batches feed; a target
        that needs several draws per masked position (Prob MLM) gets `prob_samples` of them.
        """
        from dpbert.models import losses  # local import: losses does not depend on dchi

        if mechanism not in MECHANISMS:
            raise ValueError(f"dchi.mechanism must be one of {MECHANISMS}, got {mechanism!r}")
        if not isinstance(eta, numbers.Real) or isinstance(eta, bool) or not (
                math.isfinite(eta) and eta > 0):
            raise ValueError(f"dchi.eta must be a finite number > 0, got {eta!r}")
        target = losses.get_mlm_target(mlm_target)
        if target.multi_draw and (not isinstance(prob_samples, int) or prob_samples < 1):
            raise ValueError(f"prob_samples must be a positive integer, got {prob_samples!r}")
        draws = prob_samples if target.multi_draw else 1
        special = np.asarray(special_mask, bool)
        if mechanism == "none":
            index = None
        else:
            if table is None:
                raise ValueError(f"dchi.mechanism={mechanism!r} needs the embedding table φ")
            if special.shape != (np.shape(table)[0],):
                raise ValueError(f"special-token mask has shape {special.shape} but the "
                                 f"embedding table has {np.shape(table)[0]} rows")
            index = build_search_index(table, ~special, chunk_size)
        return cls(index, jnp.asarray(special), jnp.asarray(eta, jnp.float32), mechanism, draws)

    @classmethod
    def from_hf(cls, path: str | os.PathLike, **kwargs: Any) -> "Privatizer":
        """φ and the special tokens from a Hugging Face BERT folder (weights + vocab.txt)."""
        table, vocab = load_embedding_table(path)
        return cls.create(table, special_token_mask(vocab), **kwargs)

    @classmethod
    def from_model(cls, model: Any, vocab_file: str | os.PathLike, **kwargs: Any) -> "Privatizer":
        """φ = a dpbert `BertForPreTraining`'s word embeddings (copied now, then fixed)."""

        table = np.asarray(jax.device_get(model.bert.embeddings.word_embeddings.embedding[...]))
        vocab = tokenization.load_vocab(vocab_file)
        if len(vocab) != table.shape[0]:
            raise ValueError(f"{vocab_file}: has {len(vocab)} tokens but the model's word "
                             f"embeddings have {table.shape[0]} rows")
        return cls.create(table, special_token_mask(vocab), **kwargs)

    def __call__(self, batch: Mapping[str, jax.Array], key: jax.Array) -> Batch:
        return privatize_batch(self, batch, key)


def privatize_example(privatizer: Privatizer, example: Mapping[str, jax.Array], key: jax.Array
                      ) -> Batch:
    """Privatizes ONE unbatched example (see the module docstring for the fields it writes).

    example: input_ids int [S], masked_lm_positions int [P], masked_lm_ids int [P],
      masked_lm_weights float [P], plus any fields that pass through.
    key: this example's key (unique per example and step).
    """
    out = dict(example)
    ids = jnp.asarray(example["input_ids"], jnp.int32)
    positions = jnp.asarray(example["masked_lm_positions"], jnp.int32)
    originals = jnp.asarray(example["masked_lm_ids"], jnp.int32)
    weights = example["masked_lm_weights"]
    draws = privatizer.label_draws
    out["original_masked_lm_ids"] = originals
    if privatizer.mechanism == "none":
        out["prob_masked_lm_ids"] = jnp.repeat(originals[:, None], draws, axis=1)
        return out

    index, special, eta = privatizer.index, privatizer.special, privatizer.eta
    seq_len, num_pred = ids.shape[0], originals.shape[0]
    k_input, k_label = jax.random.split(key)
    phi_input = index.lookup(ids)                                             # [S, n]
    noisy_input = m_rep(k_input, phi_input, eta)                              # [S, n]
    noisy_label = m_rep(k_label, jnp.broadcast_to(
        index.lookup(originals)[:, None, :], (num_pred, draws, index.dim)), eta)  # [P, K, n]
    special_input = special[ids]
    special_label = special[originals]

    # Masked positions where the host kept the original token: the input shows draw 0 of the
    # label (privatize-then-mask). One-hot matching instead of a scatter, so duplicate padding
    # positions cannot overwrite a real slot.
    kept = (weights > 0) & (ids[positions] == originals) & ~special_label     # [P]
    hit = (positions[None, :] == jnp.arange(seq_len)[:, None]) & kept[None, :]  # [S, P]
    is_kept = jnp.any(hit, axis=1)                                            # [S]
    slot = jnp.argmax(hit, axis=1)                                            # [S]

    if privatizer.mechanism == "text_to_text":
        found = nearest_token(
            jnp.concatenate([noisy_input, noisy_label.reshape(-1, index.dim)]), index)
        new_ids = jnp.where(special_input, ids, found[:seq_len])
        labels = found[seq_len:].reshape(num_pred, draws)
        labels = jnp.where(special_label[:, None], originals[:, None], labels)
        out["input_ids"] = jnp.where(is_kept, labels[slot, 0], new_ids)
    elif privatizer.mechanism == "token_rep":
        labels = nearest_token(noisy_label, index)
        labels = jnp.where(special_label[:, None], originals[:, None], labels)
        embeddings = jnp.where(special_input[:, None], phi_input, noisy_input)
        out["word_embeddings"] = jnp.where(is_kept[:, None], noisy_label[slot, 0], embeddings)
    else:  # guarded in create(); a hand-built Privatizer could still get here
        raise ValueError(f"unknown dχ mechanism {privatizer.mechanism!r}")
    out["masked_lm_ids"] = labels[:, 0]
    out["prob_masked_lm_ids"] = labels
    return out


def _explicit_batch_axis(x: jax.Array) -> tuple[Any, Any] | None:
    """(abstract mesh, mesh axis of x's leading dim) when x is sharded over EXPLICIT mesh axes
    along its batch dimension, else None (no mesh, auto axes, or a replicated batch)."""
    sharding = getattr(jax.typeof(x), "sharding", None)
    spec = getattr(sharding, "spec", None)
    if not spec or spec[0] is None or sharding.mesh.empty:
        return None
    return sharding.mesh, spec[0]


def _privatize_vmapped(privatizer: Privatizer, batch: Batch, key: jax.Array) -> Batch:
    positions = jnp.arange(jnp.shape(batch["input_ids"])[0], dtype=jnp.uint32)
    keys = prng.fold_in(key, positions)  # bit for bit vmap(jax.random.fold_in), one fusion
    return jax.vmap(privatize_example, in_axes=(None, 0, 0))(privatizer, batch, keys)


def privatize_batch(privatizer: Privatizer, batch: Mapping[str, jax.Array], key: jax.Array
                    ) -> Batch:
    """Privatizes a batch (leading axis B); example i uses `fold_in(key, i)`.

    `key` must be unique to this step and microbatch (`batch_key`). Jit-able; the privatizer is
    an ordinary pytree argument. With the batch sharded over explicit mesh axes (jax's default
    `make_mesh`), the computation runs with those axes as auto axes (the gathers from the
    replicated table need no annotations) and the outputs are sharded along the batch like the
    input; the result is the same as unsharded.
    """
    batch = dict(batch)
    explicit = _explicit_batch_axis(batch["input_ids"])
    if explicit is None:
        return _privatize_vmapped(privatizer, batch, key)
    mesh, axis = explicit
    plain = {k: jax.ShapeDtypeStruct(jnp.shape(v), jnp.result_type(v)) for k, v in batch.items()}
    out_shapes = jax.eval_shape(_privatize_vmapped, privatizer, plain, key)
    out_sharding = jax.tree.map(
        lambda a: jax.sharding.NamedSharding(
            mesh, jax.sharding.PartitionSpec(axis, *([None] * (a.ndim - 1)))), out_shapes)
    return jax.sharding.auto_axes(_privatize_vmapped, out_sharding=out_sharding)(
        privatizer, batch, key)


# ----------------------------------------------------------------------------- reading φ


_EMBEDDING_KEYS = ("bert.embeddings.word_embeddings.weight", "embeddings.word_embeddings.weight")


def load_embedding_table(path: str | os.PathLike) -> tuple[np.ndarray, list[str]]:
    """Reads φ (float32 [V, n]) and the vocabulary from a Hugging Face BERT folder.

    Only the word-embedding tensor is read (lazily from safetensors). Errors name the file.
    """
    from dpbert.models import hf

    folder = pathlib.Path(path)
    if not folder.is_dir():
        raise FileNotFoundError(f"{folder}: not a directory (expected a Hugging Face BERT folder)")
    vocab = tokenization.load_vocab(folder / "vocab.txt")
    weights = next((folder / n for n in hf.WEIGHT_FILES if (folder / n).is_file()), None)
    index_file = folder / "model.safetensors.index.json"
    if weights is None and index_file.is_file():  # sharded checkpoint: open the right shard
        try:
            weight_map = json.loads(index_file.read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError, TypeError) as e:
            raise ValueError(f"{index_file}: not a safetensors index ({e})") from e
        shard = next((weight_map[k] for k in _EMBEDDING_KEYS if k in weight_map), None)
        if shard is None:
            raise ValueError(f"{index_file}: no word-embedding tensor (looked for "
                             f"{' or '.join(_EMBEDDING_KEYS)})")
        weights = folder / shard
    if weights is None:
        raise FileNotFoundError(f"{folder}: no weights found (looked for "
                                f"{', '.join(hf.WEIGHT_FILES)})")
    table = None
    if weights.suffix == ".safetensors":
        from safetensors import safe_open
        try:
            with safe_open(str(weights), framework="numpy") as f:
                key = next((k for k in _EMBEDDING_KEYS if k in f.keys()), None)
                if key is not None:
                    table = f.get_tensor(key)
        except Exception as e:  # safetensors raises its own error types
            raise ValueError(f"{weights}: not a readable safetensors file ({e})") from e
    else:
        state = hf.read_state_dict(weights)
        key = next((k for k in _EMBEDDING_KEYS if k in state), None)
        table = None if key is None else state[key]
    if table is None:
        raise ValueError(f"{weights}: no word-embedding tensor (looked for "
                         f"{' or '.join(_EMBEDDING_KEYS)})")
    table = np.asarray(table, np.float32)
    if table.ndim != 2 or table.shape[0] != len(vocab):
        raise ValueError(f"{weights}: word embeddings have shape {table.shape} but "
                         f"{folder / 'vocab.txt'} has {len(vocab)} tokens")
    return table, vocab


# ----------------------------------------------------------------------------- privacy analyses


def plausible_deniability(key: jax.Array, ids: jax.Array, index: SearchIndex,
                          eta: jax.Array | float, samples: int) -> tuple[jax.Array, jax.Array]:
    """Feyisetan et al.'s statistics from `samples` runs of M_txt on each token (Qu et al. 5.3).

    ids: int [T] regular tokens. Returns int32 [T] each:
      N_w: how many of the outputs equal the input token;
      S_w: how many distinct output tokens there were.
    Memory: [T·samples, chunk] scores, so keep T·samples to a few thousand.
    """
    ids = jnp.asarray(ids, jnp.int32)
    phi = jnp.broadcast_to(index.lookup(ids)[:, None, :], (ids.shape[0], samples, index.dim))
    out = nearest_token(m_rep(key, phi, eta), index)                          # [T, samples]
    n_w = jnp.sum(out == ids[:, None], axis=1, dtype=jnp.int32)
    ordered = jnp.sort(out, axis=1)
    s_w = 1 + jnp.sum(ordered[:, 1:] != ordered[:, :-1], axis=1, dtype=jnp.int32)
    return n_w, s_w


def inversion_hits(key: jax.Array, ids: jax.Array, index: SearchIndex, eta: jax.Array | float
                   ) -> jax.Array:
    """Token-embedding inversion (Qu et al. 5.4): bool [T], True where the nearest token to
    M_rep(φ(w)) is w itself, for corpus tokens ids int [T]."""
    ids = jnp.asarray(ids, jnp.int32)
    return nearest_token(m_rep(key, index.lookup(ids), eta), index) == ids

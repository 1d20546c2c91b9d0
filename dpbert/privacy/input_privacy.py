r"""Input privacy for fine-tuning: the users' dχ release of their text (Qu et al. 2021, §3.2-3.3).

The model is split between a *user side* that runs locally and is frozen, and a *service side*
that trains on what the users send. This module is the user side: it turns a split's feature
dict (`data_pipelines.classification` / `data_pipelines.ner`) into the `Release` the service
trains and evaluates on, and says which parameters the service may train.

| mode           | user side (frozen)                 | the service receives                 | trainable |
|----------------|------------------------------------|--------------------------------------|-----------|
| `none`         | —                                  | raw ids                              | all       |
| `token_rep`    | tokenizer, φ, M_rep                 | X̃_i = M_rep(φ(w_i)) per regular token | all but φ |
| `text_to_text` | tokenizer, φ₀ (fixed copy), M_txt   | privatized ids                       | all       |
| `seq_rep`      | tokenizer, embeddings+encoder+pooler| z̃ = M_rep(s(x)), s = pooled/cls_hidden| head only |

M_rep / M_txt are `dpbert.privacy.dchi`'s (`m_rep`, `nearest_token` on its `SearchIndex`): nothing is
re-implemented here. Special tokens ([CLS] [SEP] [PAD] [UNK] [MASK] [unusedN]) are never
perturbed: the service inserts them, so they are public.

## The release model

Users privatize each example ONCE and the service only ever sees that release:

* Token t of example e of split s uses the key
  `fold_in(fold_in(fold_in(fold_in(run_key, salt(s)), e), [epoch]), position_t)`: the run's
  SECRET key (OS entropy, kept in the private checkpoint; a public seed would let anyone subtract
  the noise), the split (train / eval never share noise), the example id (its row in the file),
  and the token's position. Windows of one document (NER) give `example_id` = the document and
  `position_ids` = the piece's offset in it, so overlapping windows carry the SAME release of a
  shared token instead of two independent ones (which would compose).
* The release is a pure function of (run_key, data), so every epoch and every rerun with the same
  key sees the same privatized data; another key gives another release.
* The eval split is privatized too (`split="eval"`): the service never sees raw text at
  inference either.
* `fresh_noise_each_epoch=True` folds the epoch in: E epochs are E independent releases of each
  training example, which compose to an (E·η)·d_χ guarantee; `report()` states it.

## What the service batch holds (the isolation argument)

* token_rep: `word_embeddings` float32 [S, n] (X̃ at regular positions, φ(special) at special
  positions) and `input_ids` with EVERY regular position replaced by [UNK]: the ids that reach
  the service carry only the public special-token layout. The model consumes
  `word_embeddings` and never looks `input_ids` up. The released vectors are stored once per
  token (`Release.vectors`, not a padded [N, S, n] array) and gathered per batch.
* text_to_text: privatized `input_ids`.
* seq_rep: `features` float32 [n] only; no ids, no mask.
Labels (`label` / `labels`) pass through: the mechanism protects the text, not the labels.
`example_id` / `position_ids` are consumed here and do not reach the service.

## Trainable parameters

`trainable_filter(mode)` is a `dpbert.dp.trees` predicate: give it to `VmapClipper(trainable=)`
(frozen leaves get no gradient and no clipping share) and, via
`trees.resolve_trainable_mask`, to `optax.multi_transform(..., set_to_zero)` so neither DP
noise nor weight decay moves a frozen parameter. token_rep freezes φ (letting it train would
silently change what a given η protects); seq_rep trains the classifier only.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
import os
import zlib
from typing import Any, Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from data_pipelines import tokenization
from dpbert.privacy import dchi
from dpbert.models import heads

MODES = ("none", "token_rep", "text_to_text", "seq_rep")
_TOKEN_MODES = ("token_rep", "text_to_text")
WORD_EMBEDDING = ("bert", "embeddings", "word_embeddings", "embedding")


@dataclasses.dataclass(frozen=True)
class InputPrivacyConfig:
    """Settings of the users' release.

    mode: one of MODES.
    eta: dχ parameter η > 0 (larger = less noise); ignored for mode none.
    fresh_noise_each_epoch: re-privatize the training set every epoch (E× the dχ cost).
    seq_rep_source: s(x) for seq_rep: "pooled" (tanh(Dense(h_[CLS])), what HF's
      BertForSequenceClassification classifies) or "cls_hidden" (h_[CLS] before the pooler).
    tokens_per_call: regular tokens privatized per jitted call (text_to_text memory: x
      chunk_size scores).
    examples_per_call: sentences per call of the frozen encoder (seq_rep).
    chunk_size: vocabulary rows per step of the exact nearest-token search.
    """

    mode: str = "none"
    eta: float | None = None
    fresh_noise_each_epoch: bool = False
    seq_rep_source: str = "pooled"
    tokens_per_call: int = 4096
    examples_per_call: int = 256
    chunk_size: int = dchi.DEFAULT_CHUNK_SIZE

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"privacy.mode must be one of {MODES}, got {self.mode!r}")
        if self.mode != "none":
            eta = self.eta
            if not isinstance(eta, numbers.Real) or isinstance(eta, bool) or not (
                    math.isfinite(eta) and eta > 0):
                raise ValueError(f"privacy.eta must be a finite number > 0 for mode "
                                 f"{self.mode!r}, got {eta!r}")
        if self.seq_rep_source not in heads.SEQ_REP_SOURCES:
            raise ValueError(f"privacy.seq_rep_source must be one of {heads.SEQ_REP_SOURCES}, "
                             f"got {self.seq_rep_source!r}")
        for name in ("tokens_per_call", "examples_per_call", "chunk_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"privacy.{name} must be a positive integer, got {value!r}")


# ----------------------------------------------------------------------------- keys


def split_salt(split: str) -> int:
    """A fixed 31-bit integer per split name (train and eval never share noise)."""
    return zlib.crc32(split.encode("utf-8")) & 0x7FFFFFFF


def example_key(run_key: jax.Array, split: str, example_id: int | jax.Array,
                epoch: int | None = None) -> jax.Array:
    """The key of one example's release; its tokens fold in their positions."""
    key = jax.random.fold_in(jax.random.fold_in(run_key, split_salt(split)), example_id)
    return key if epoch is None else jax.random.fold_in(key, epoch)


# ----------------------------------------------------------------------------- trainable sets


def trainable_filter(mode: str) -> Callable[[tuple[str, ...], Any], bool]:
    """`dpbert.dp.trees` predicate (path_names, leaf) -> trainable, for a task model's params."""
    if mode not in MODES:
        raise ValueError(f"privacy.mode must be one of {MODES}, got {mode!r}")
    if mode == "token_rep":
        return lambda path, leaf: tuple(path) != WORD_EMBEDDING
    if mode == "seq_rep":
        return lambda path, leaf: len(path) > 0 and path[0] == "classifier"
    return lambda path, leaf: True


def frozen_mask(params: Any, mode: str) -> Any:
    """Pytree of bools like `params`, True = frozen: the labels for
    `optax.multi_transform({False: tx, True: optax.set_to_zero()}, frozen_mask(params, mode))`."""
    from dpbert.dp import trees

    trainable = trees.resolve_trainable_mask(params, trainable_filter(mode))
    return jax.tree.map(lambda t: not t, trainable)


def frozen_parts(mode: str) -> list[str]:
    """Human-readable names of the frozen (user-side) parameters."""
    return {"none": [], "text_to_text": [],
            "token_rep": ["bert/embeddings/word_embeddings (φ)"],
            "seq_rep": ["bert (embeddings, encoder, pooler)"]}[mode]


# ----------------------------------------------------------------------------- the release


@dataclasses.dataclass
class Release:
    """One split as the service receives it.

    arrays: per-example arrays, leading axis N (see the module docstring for the fields).
    vectors: token_rep only: float32 [K + T, n]; rows 0..K-1 are φ of the K special tokens,
      the other T rows the released vectors of the regular tokens, each stored once.
    vector_index: token_rep only: int32 [N, S], the `vectors` row of each position.
    """

    mode: str
    arrays: dict[str, np.ndarray]
    vectors: np.ndarray | None = None
    vector_index: np.ndarray | None = None

    def __len__(self) -> int:
        return len(next(iter(self.arrays.values())))

    def batch(self, indices: Sequence[int] | np.ndarray) -> dict[str, np.ndarray]:
        """The service-side batch of examples `indices` (NumPy, leading axis len(indices))."""
        idx = np.asarray(indices, np.int64)
        out = {k: v[idx] for k, v in self.arrays.items()}
        if self.vectors is not None:
            out["word_embeddings"] = self.vectors[self.vector_index[idx]]
        return out


class InputPrivatizer:
    """The frozen user side: φ (token modes) or the encoder (seq_rep), and the mechanism."""

    def __init__(self, config: InputPrivacyConfig, *, table: np.ndarray | None = None,
                 special_mask: np.ndarray | None = None, unk_id: int | None = None,
                 encoder: Callable[[jax.Array, jax.Array, jax.Array], jax.Array] | None = None):
        """Prefer `from_model`. table: φ float [V, n]; special_mask bool [V]; unk_id: [UNK];
        encoder: (ids, segments, mask) [B, S] -> s(x) float32 [B, n] (seq_rep)."""
        self.config = config
        mode = config.mode
        self.privatizer = None
        self.encoder = encoder
        self.unk_id = unk_id
        if mode in _TOKEN_MODES:
            if table is None or special_mask is None or unk_id is None:
                raise ValueError(f"mode {mode!r} needs the embedding table, the special-token "
                                 "mask and the [UNK] id")
            # dchi's privatizer holds φ (a fixed copy), the search index and η.
            self.privatizer = dchi.Privatizer.create(
                np.array(table, np.float32, copy=True), special_mask, eta=float(config.eta),
                mechanism=mode, chunk_size=config.chunk_size)
            special = np.asarray(special_mask, bool)
            self.special_ids = np.flatnonzero(special).astype(np.int32)
            self._special_row = np.full(special.shape[0], -1, np.int32)
            self._special_row[self.special_ids] = np.arange(len(self.special_ids))
            self._special_vectors = np.asarray(table, np.float32)[self.special_ids]
            self._noisy = _noisy_tokens
            self._private_ids = _private_token_ids
        elif mode == "seq_rep":
            if encoder is None:
                raise ValueError("mode 'seq_rep' needs the frozen encoder")
            self._noisy_rows = _noisy_rows

    @classmethod
    def from_model(cls, config: InputPrivacyConfig, model: nnx.Module,
                   vocab: Sequence[str] | str | os.PathLike) -> "InputPrivatizer":
        """The user side of a `dpbert.models.heads` model at the start of fine-tuning.

        Token modes copy the model's word embeddings now (φ₀; in token_rep the service's φ is
        frozen, so they stay equal). seq_rep snapshots the whole encoder (the service trains the
        head only). `vocab`: the tokens (index = id) or a vocab.txt.
        """
        if isinstance(vocab, (str, os.PathLike)):
            vocab = tokenization.load_vocab(vocab)
        vocab = list(vocab)
        if config.mode in _TOKEN_MODES:
            table = np.asarray(jax.device_get(model.bert.embeddings.word_embeddings.embedding[...]))
            if table.shape[0] != len(vocab):
                raise ValueError(f"the vocabulary has {len(vocab)} tokens but the model's word "
                                 f"embeddings have {table.shape[0]} rows")
            if "[UNK]" not in vocab:
                raise ValueError("the vocabulary has no [UNK] token")
            return cls(config, table=table, special_mask=dchi.special_token_mask(vocab),
                       unk_id=vocab.index("[UNK]"))
        if config.mode == "seq_rep":
            if not isinstance(model, heads.BertForSequenceClassification):
                raise ValueError("seq_rep needs a BertForSequenceClassification (a sentence "
                                 f"representation), got {type(model).__name__}")
            graphdef, params = nnx.split(model)
            params = jax.tree.map(jnp.array, params)   # a snapshot, independent of training
            source = config.seq_rep_source

            def encoder(ids, segments, mask):
                return _encode(graphdef, source, params, ids, segments, mask)

            return cls(config, encoder=encoder)
        return cls(config)

    # ------------------------------------------------------------------------- release

    def release(self, features: Mapping[str, np.ndarray], run_key: jax.Array, *, split: str,
                epoch: int | None = None) -> Release:
        """Privatizes one split's features (see the module docstring for the key schedule).

        features: `input_ids`, `segment_ids`, `input_mask` int [N, S], `example_id` int [N],
          optional `position_ids` int [N, S] (default: the position in the row), labels and any
          other per-example arrays (passed through).
        run_key: the run's secret PRNG key.
        split: "train", "eval", ...
        epoch: the training epoch, used only with `fresh_noise_each_epoch`.
        """
        cfg = self.config
        if cfg.fresh_noise_each_epoch and split == "train":
            if epoch is None:
                raise ValueError("fresh_noise_each_epoch: pass the epoch to release()")
        else:
            epoch = None
        feats = {k: np.asarray(v) for k, v in features.items()}
        for name in ("input_ids", "example_id"):
            if name not in feats:
                raise ValueError(f"features lack {name!r}")
        ids = feats["input_ids"].astype(np.int32)
        example_ids = feats["example_id"].astype(np.int64)
        if len(np.unique(example_ids)) != len(example_ids) and "position_ids" not in feats:
            raise ValueError("example_id repeats without position_ids: two examples would share "
                             "one noise draw")
        positions = feats.get("position_ids")
        if positions is None:
            positions = np.broadcast_to(np.arange(ids.shape[1], dtype=np.int32), ids.shape)
        passthrough = {k: v for k, v in feats.items()
                       if k not in ("input_ids", "example_id", "position_ids")}
        keys = jax.vmap(lambda i: example_key(run_key, split, i, epoch))(
            jnp.asarray(example_ids, jnp.uint32))
        if cfg.mode == "none":
            return Release("none", dict(passthrough, input_ids=ids))
        if cfg.mode == "seq_rep":
            return self._release_seq_rep(feats, passthrough, keys)
        vocab_size = self.privatizer.special.shape[0]
        if ids.min() < 0 or ids.max() >= vocab_size:
            raise ValueError(f"token ids outside the vocabulary (0..{vocab_size - 1}): the data "
                             "was tokenized with another vocabulary than the model's")
        return self._release_tokens(ids, positions, passthrough, keys)

    def _release_tokens(self, ids, positions, passthrough, keys) -> Release:
        cfg, priv = self.config, self.privatizer
        special = self._special_row >= 0
        regular = ~special[ids]                                     # [N, S]
        rows, cols = np.nonzero(regular)                            # row-major token order
        tokens = ids[rows, cols]
        token_pos = np.asarray(positions)[rows, cols]
        total, dim = len(tokens), priv.index.dim
        t2t = cfg.mode == "text_to_text"
        out = np.empty((total,) if t2t else (total, dim), np.int32 if t2t else np.float32)
        block = cfg.tokens_per_call
        fn = self._private_ids if t2t else self._noisy
        for start in range(0, total, block):
            stop = min(start + block, total)
            take = _take_padded(total, start, block)
            result = fn(priv.index, priv.eta, keys[jnp.asarray(rows[take])],
                        jnp.asarray(tokens[take]), jnp.asarray(token_pos[take], jnp.uint32))
            out[start:stop] = np.asarray(result)[:stop - start]
        if t2t:
            private_ids = ids.copy()
            private_ids[rows, cols] = out
            return Release("text_to_text", dict(passthrough, input_ids=private_ids))
        service_ids = np.where(regular, np.int32(self.unk_id), ids).astype(np.int32)
        index = np.where(special[ids], self._special_row[ids], 0).astype(np.int32)
        index[rows, cols] = len(self.special_ids) + np.arange(total, dtype=np.int32)
        vectors = np.concatenate([self._special_vectors, out])
        return Release("token_rep", dict(passthrough, input_ids=service_ids), vectors, index)

    def _release_seq_rep(self, feats, passthrough, keys) -> Release:
        cfg = self.config
        ids, seg, mask = (feats[k].astype(np.int32) for k in ("input_ids", "segment_ids",
                                                               "input_mask"))
        reps = self.sentence_representations(ids, seg, mask)
        noisy = np.empty_like(reps)
        step = cfg.examples_per_call
        for start in range(0, len(reps), step):
            stop = min(start + step, len(reps))
            take = _take_padded(len(reps), start, step)
            noisy[start:stop] = np.asarray(self._noisy_rows(
                keys[jnp.asarray(take)], jnp.asarray(reps[take]), float(cfg.eta)))[:stop - start]
        out = {k: v for k, v in passthrough.items() if k not in ("segment_ids", "input_mask")}
        out["features"] = noisy.astype(np.float32)
        return Release("seq_rep", out)

    def sentence_representations(self, ids: np.ndarray, seg: np.ndarray, mask: np.ndarray
                                 ) -> np.ndarray:
        """s(x) of every row, float32 [N, n], from the frozen encoder.

        Rows are run in batches of similar length, padded to a multiple of 16 (the attention mask
        makes the padding irrelevant), so short sentences do not pay for max_seq_len.
        """
        n, s = ids.shape
        lengths = mask.sum(1)
        order = np.argsort(lengths, kind="stable")
        out = None
        step = self.config.examples_per_call
        for start in range(0, n, step):
            rows = order[start:start + step]
            width = int(min(s, max(16, -(-int(lengths[rows].max()) // 16) * 16)))
            size = len(rows)
            take = order[_take_padded(n, start, step)]
            rep = np.asarray(self.encoder(jnp.asarray(ids[take, :width]),
                                          jnp.asarray(seg[take, :width]),
                                          jnp.asarray(mask[take, :width])))[:size]
            if out is None:
                out = np.empty((n, rep.shape[1]), np.float32)
            out[rows] = rep
        return out

    # ------------------------------------------------------------------------- report

    def report(self, *, epochs: int, secret_key: bool = True) -> dict[str, Any]:
        """What the users' input privacy is, for results.json and the model card.
        `secret_key=False`: the run key came from a public seed (tests): the report says the
        release is NOT private."""
        return privacy_report(self.config, epochs=epochs, secret_key=secret_key,
                              dim=None if self.privatizer is None else self.privatizer.index.dim)


@functools.partial(jax.jit, static_argnums=(0, 1))
def _encode(graphdef: nnx.GraphDef, source: str, params: nnx.State, ids: jax.Array,
            segments: jax.Array, mask: jax.Array) -> jax.Array:
    """s(x) of a batch from the frozen encoder (jitted once per model structure and shape)."""
    return nnx.merge(graphdef, params).sequence_representation(ids, segments, mask,
                                                               source=source)


def _take_padded(n: int, start: int, cap: int) -> np.ndarray:
    """Indices start..stop-1 (stop = min(start + cap, n)), padded to `cap` by repeating `start`:
    every call has the same shape, so each function compiles once."""
    stop = min(start + cap, n)
    return np.concatenate([np.arange(start, stop), np.full(cap - (stop - start), start)])


@jax.jit
def _noisy_rows(keys: jax.Array, x: jax.Array, eta: jax.Array | float) -> jax.Array:
    """M_rep of each row of x [B, n] with its own key keys[b]."""
    return jax.vmap(dchi.m_rep, in_axes=(0, 0, None))(keys, x, eta)


@jax.jit
def _noisy_tokens(index: dchi.SearchIndex, eta: jax.Array, keys: jax.Array, ids: jax.Array,
                  positions: jax.Array) -> jax.Array:
    """M_rep(φ(w)) of T tokens, token t with key fold_in(keys[t], positions[t]): float32 [T, n].

    keys: [T] the example key of each token; ids int [T]; positions uint32 [T]."""
    def one_token(key, token, position):
        return dchi.m_rep(jax.random.fold_in(key, position), index.lookup(token), eta)

    return jax.vmap(one_token)(keys, ids, positions)


@jax.jit
def _private_token_ids(index: dchi.SearchIndex, eta: jax.Array, keys: jax.Array, ids: jax.Array,
                       positions: jax.Array) -> jax.Array:
    """M_txt of T regular tokens: the nearest regular token to `_noisy_tokens`, int32 [T]."""
    return dchi.nearest_token(_noisy_tokens(index, eta, keys, ids, positions), index)


SEEDED_NOTE = ("NOT private: the release keys derive from a public seed; anyone who knows it "
               "can regenerate the noise and undo the privatization. For tests and debugging "
               "only.")


def privacy_report(config: InputPrivacyConfig, *, epochs: int, dim: int | None = None,
                   secret_key: bool = True) -> dict[str, Any]:
    """The input-privacy part of a fine-tuning report (mode, η, releases, composed cost).

    `secret_key=False` (a run key from a public seed) makes every statement say NOT private."""
    mode = config.mode
    out: dict[str, Any] = {"mode": mode, "frozen": frozen_parts(mode)}
    if mode == "none":
        out["statement"] = "No input privacy: the service received the raw token ids."
        return out
    eta = float(config.eta)
    releases = epochs if config.fresh_noise_each_epoch else 1
    out.update({
        "eta": eta,
        "fresh_noise_each_epoch": bool(config.fresh_noise_each_epoch),
        "train_releases_per_example": int(releases),
        "eval_releases_per_example": 1,
        "composed_eta_train": eta * releases,
        "special_tokens": "never perturbed",
        "key": ("secret run key (OS entropy, kept only in the private checkpoint)" if secret_key
                else "public seed"),
    })
    if mode == "seq_rep":
        metric = f"‖s(x) − s(x')‖, s = {config.seq_rep_source} output of the frozen encoder"
        sent = (f"each example was released as z̃ = M_rep(s(x)) (s = the frozen encoder's "
                f"{config.seq_rep_source} output); the service saw only z̃ and trained the head. "
                "η here is per sentence representation and not comparable with token-level η.")
        out["seq_rep_source"] = config.seq_rep_source
    else:
        metric = "Σ_i ‖φ(x_i) − φ(x'_i)‖ over the tokens of same-length texts"
        if mode == "token_rep":
            sent = ("each regular token was released as M_rep(φ(w)) = φ(w) + N, density ∝ "
                    "exp(−η‖N‖); the service saw these vectors, never the token ids.")
        else:
            sent = ("each regular token was released as the nearest regular vocabulary token to "
                    "M_rep(φ₀(w)) (φ₀ = the checkpoint's word embeddings, a fixed copy); "
                    "post-processing of M_rep, so the same guarantee.")
    out["metric"] = metric
    if dim is not None:
        out["embedding_dim"] = int(dim)
        out["expected_noise_norm"] = dim / eta
    cost = (f"η·d_χ-privacy per example with d = {metric}, η = {eta:g}" if releases == 1 else
            f"fresh noise every epoch: {releases} independent releases of each training example "
            f"compose to ({releases}·η)·d_χ = {eta * releases:g}·d_χ-privacy (eval: η·d_χ)")
    out["statement"] = (("" if secret_key else SEEDED_NOTE + " ") +
                        f"Local dχ-privacy (Qu et al. 2021): {sent} Each example was privatized "
                        f"with a key derived from a secret run key and its id, the same release "
                        f"in every epoch unless stated; the eval set was privatized too. "
                        f"Guarantee: {cost}.")
    return out

"""Sentence representations from a FROZEN BERT encoder (user side of OME / seq_rep / attacks).

* `encode_texts(model, tokenizer, texts, pooling=...)`: `[CLS] text [SEP]` (truncated to
  `max_len`), batched by length (sequence lengths rounded up to a multiple of `length_step`, so
  only a handful of shapes compile), deterministic (no dropout). Poolings: "pooled" (BERT's
  tanh(Dense(h_[CLS])), the pooled output), "cls" (h_[CLS]), "mean" (mean of the last hidden
  states over real tokens, specials included — sentence-transformers' mean pooling).
* `static_mean_embeddings(table, tokenizer, texts)`: mean of the static WordPiece embeddings of
  the sentence's tokens (no [CLS]/[SEP]); with `random_projection` this is the project's
  GloVe-50 analogue (FINETUNE_SPEC §3.1). The projection is PUBLIC (part of the encoder), so it
  takes a plain seed.
"""

from __future__ import annotations

from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np

POOLINGS = ("pooled", "cls", "mean")


def tokenize_for_bert(tokenizer, texts: Sequence[str], max_len: int) -> list[np.ndarray]:
    """[CLS] ids [SEP] per text (int32), truncated so the total is ≤ max_len."""
    if max_len < 3:
        raise ValueError(f"max_len must be ≥ 3, got {max_len}")
    cls, sep = tokenizer.special.cls, tokenizer.special.sep
    out = []
    for ids in tokenizer.encode_batch(list(texts)):
        ids = ids[:max_len - 2]
        out.append(np.concatenate([[cls], ids, [sep]]).astype(np.int32))
    return out


def encode_texts(model, tokenizer, texts: Sequence[str], *, pooling: str | Sequence[str] = "pooled",
                 max_len: int = 128, batch_size: int = 64, length_step: int = 16
                 ) -> np.ndarray | dict[str, np.ndarray]:
    """Frozen-encoder features, float32 [N, H] (or {pooling: [N, H]} for several poolings).

    model: a dpbert `BertForPreTraining` (its `.bert` is used) or `BertModel`.
    """
    from flax import nnx

    several = not isinstance(pooling, str)
    poolings = tuple(pooling) if several else (pooling,)
    for p in poolings:
        if p not in POOLINGS:
            raise ValueError(f"pooling must be one of {POOLINGS}, got {p!r}")
    bert = getattr(model, "bert", model)
    graphdef, params = nnx.split(bert)
    pad = tokenizer.special.pad

    @jax.jit
    def forward(params, ids, mask):
        seq, pooled = nnx.merge(graphdef, params)(ids, jnp.zeros_like(ids), mask)
        m = mask[..., None].astype(seq.dtype)
        mean = jnp.sum(seq * m, 1) / jnp.maximum(jnp.sum(m, 1), 1.0)
        return {"pooled": pooled, "cls": seq[:, 0], "mean": mean}

    seqs = tokenize_for_bert(tokenizer, texts, max_len)
    order = np.argsort([len(s) for s in seqs], kind="stable")
    width = bert.config.hidden_size
    out = {p: np.zeros((len(seqs), width), np.float32) for p in poolings}
    for start in range(0, len(seqs), batch_size):
        idx = order[start:start + batch_size]
        longest = max(len(seqs[i]) for i in idx)
        length = min(max_len, -(-longest // length_step) * length_step)
        ids = np.full((batch_size, length), pad, np.int32)
        mask = np.zeros((batch_size, length), np.int32)
        for row, i in enumerate(idx):
            ids[row, :len(seqs[i])] = seqs[i]
            mask[row, :len(seqs[i])] = 1
        mask[len(idx):, 0] = 1  # padding rows: one real token, so no empty attention
        res = forward(params, jnp.asarray(ids), jnp.asarray(mask))
        for p in poolings:
            out[p][idx] = np.asarray(res[p])[:len(idx)]
    return out if several else out[poolings[0]]


def static_mean_embeddings(table: np.ndarray, tokenizer, texts: Sequence[str]) -> np.ndarray:
    """float32 [N, H]: mean of `table` rows over each text's WordPiece ids (zeros if none)."""
    table = np.asarray(table, np.float32)
    out = np.zeros((len(texts), table.shape[1]), np.float32)
    for i, ids in enumerate(tokenizer.encode_batch(list(texts))):
        if len(ids):
            out[i] = table[ids].mean(0)
    return out


def random_projection(seed: int, d_in: int, d_out: int) -> np.ndarray:
    """A fixed PUBLIC Gaussian projection [d_in, d_out] with entries N(0, 1/d_out)."""
    rng = np.random.default_rng(seed)
    return (rng.standard_normal((d_in, d_out)) / np.sqrt(d_out)).astype(np.float32)

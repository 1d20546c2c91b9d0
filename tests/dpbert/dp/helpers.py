"""Small models and brute-force references shared by the DP engine tests."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from dpbert.dp import trees

IN, HIDDEN = 5, 16


def mlp_params(seed: int = 0) -> dict:
    """A 2-layer MLP: params pytree (float32)."""
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    return {"l1": {"kernel": jax.random.normal(k1, (IN, HIDDEN)) * 0.7,
                   "bias": jnp.full((HIDDEN,), 0.1)},
            "l2": {"kernel": jax.random.normal(k2, (HIDDEN, 1)) * 0.7,
                   "bias": jnp.zeros((1,))}}


def mlp_loss(params, example, rng, dropout: float = 0.25):
    """Per-example squared error with dropout (uses `rng`); metrics are sums."""
    h = jnp.tanh(example["x"] @ params["l1"]["kernel"] + params["l1"]["bias"])
    keep = jax.random.bernoulli(rng, 1 - dropout, h.shape)
    h = jnp.where(keep, h / (1 - dropout), 0.0)
    y = (h @ params["l2"]["kernel"] + params["l2"]["bias"])[0]
    loss = (y - example["y"]) ** 2
    return loss, {"loss_sum": loss, "count": jnp.ones((), jnp.float32)}


def mlp_batch(n: int, seed: int = 1, scale: float = 3.0) -> dict:
    """n examples with features large enough that many gradients exceed C = 1."""
    kx, ky = jax.random.split(jax.random.PRNGKey(seed))
    return {"x": jax.random.normal(kx, (n, IN)) * scale, "y": jax.random.normal(ky, (n,)) * 3}


def per_example_grads(loss_fn, params, batch, mask, key, first_position=0):
    """Python loop over the real examples: [(grads pytree, metrics dict)] in float32.

    Example i uses rng fold_in(key, first_position + i), as the engine does.
    """
    grad_fn = jax.jit(jax.grad(loss_fn, has_aux=True))
    out = []
    for i in range(mask.shape[0]):
        if not bool(mask[i]):
            continue
        example = jax.tree.map(lambda x: x[i], batch)
        grads, metrics = grad_fn(params, example, jax.random.fold_in(key, first_position + i))
        out.append((jax.tree.map(lambda g: np.asarray(g, np.float32), grads),
                    {k: float(v) for k, v in metrics.items()}))
    return out


def clip_and_sum(per_example, params, clip_norm, trainable=None):
    """sum_i clip(g_i) over `per_example_grads` output, norms over trainable leaves only.

    Returns (grad_sum pytree, metric sums dict, clipped norms list).
    """
    flags = jax.tree.leaves(trees.resolve_trainable_mask(params, trainable))
    total = jax.tree.map(lambda x: np.zeros(x.shape, np.float32), params)
    metric_sums: dict[str, float] = {}
    norms = []
    for grads, metrics in per_example:
        leaves, treedef = jax.tree.flatten(grads)
        leaves = [g if f else np.zeros_like(g) for g, f in zip(leaves, flags)]
        norm = float(np.sqrt(sum(np.sum(np.square(g.astype(np.float64))) for g in leaves)))
        scale = np.float32(1.0 / max(1.0, norm / clip_norm))
        clipped = [g * scale for g in leaves]
        norms.append(float(np.sqrt(sum(np.sum(np.square(c.astype(np.float64)))
                                       for c in clipped))))
        total = jax.tree.map(np.add, total, jax.tree.unflatten(treedef, clipped))
        for k, v in metrics.items():
            metric_sums[k] = metric_sums.get(k, 0.0) + v
    return total, metric_sums, norms


def brute_force_clipped_sum(loss_fn, params, batch, mask, key, clip_norm, trainable=None,
                            first_position=0):
    """Python loop over single examples: sum_i mask_i * clip(grad_i), float32.

    Returns (grad_sum pytree, metric sums dict, per-example clipped norms list).
    """
    per_example = per_example_grads(loss_fn, params, batch, mask, key, first_position)
    return clip_and_sum(per_example, params, clip_norm, trainable)


def assert_trees_close(actual, expected, rtol=1e-6, atol_frac=1e-6):
    """Leafwise allclose(rtol) with atol = atol_frac * max |expected| over the WHOLE tree.

    The absolute floor matters only for entries that are zero up to float32
    round-off (e.g. BERT's attention key bias, whose exact gradient is 0).
    """
    a_leaves, a_def = jax.tree.flatten(actual)
    e_leaves, e_def = jax.tree.flatten(expected)
    assert a_def == e_def, (a_def, e_def)
    scale = max(float(np.max(np.abs(np.asarray(e)))) for e in e_leaves if np.size(e))
    for a, e in zip(a_leaves, e_leaves):
        np.testing.assert_allclose(np.asarray(a), np.asarray(e), rtol=rtol,
                                   atol=atol_frac * scale)


def bert_batch(n: int, vocab: int, seq: int = 16, preds: int = 4, seed: int = 0) -> dict:
    """n synthetic pretraining examples with the contract's feature set (NumPy)."""
    rng = np.random.RandomState(seed)
    ids = rng.randint(5, vocab, size=(n, seq)).astype(np.int32)
    lengths = rng.randint(seq // 2, seq + 1, size=n)
    mask = (np.arange(seq)[None, :] < lengths[:, None]).astype(np.int32)
    ids[mask == 0] = 0
    seg = ((np.arange(seq)[None, :] >= (lengths // 2)[:, None]) & (mask == 1)).astype(np.int32)
    positions = np.stack([np.sort(rng.choice(np.arange(1, l - 1), preds, replace=False))
                          for l in lengths]).astype(np.int32)
    weights = (rng.rand(n, preds) < 0.8).astype(np.float32)
    weights[:, 0] = 1.0
    return {
        "input_ids": ids, "input_mask": mask, "segment_ids": seg,
        "masked_lm_positions": positions * (weights > 0),
        "masked_lm_ids": (rng.randint(5, vocab, size=(n, preds)) * (weights > 0)).astype(np.int32),
        "masked_lm_weights": weights,
        "next_sentence_labels": rng.randint(0, 2, size=(n,)).astype(np.int32),
    }


# ----------------------------------------------------------------------------- ghost clippers

GHOST_VOCAB, GHOST_SEQ, GHOST_PREDS, GHOST_DRAWS = 98, 16, 4, 3  # 98: vocab splits over fsdp=2
MASK_ID = 4  # plays [MASK]: the same input row at most masked positions


def ghost_batch(n: int, seed: int = 0) -> dict:
    """Pretraining examples where embedding rows collide the way real BERT batches make them:
    [MASK] repeated at the masked positions, a repeated input token, a masked label that is
    also an input token; plus the dχ fields the prob / denoising targets read."""
    vocab, preds = GHOST_VOCAB, GHOST_PREDS
    b = bert_batch(n, vocab, seq=GHOST_SEQ, preds=preds, seed=seed)
    rng = np.random.RandomState(seed + 1)
    for i in range(n):
        real = b["masked_lm_weights"][i] > 0
        pos = b["masked_lm_positions"][i][real]
        b["input_ids"][i, pos] = MASK_ID
        length = int(b["input_mask"][i].sum())
        unmasked = [t for t in range(length) if t not in set(pos.tolist())]
        b["input_ids"][i, unmasked[1]] = b["input_ids"][i, unmasked[0]]
        b["masked_lm_ids"][i, 0] = b["input_ids"][i, unmasked[-1]]
    b["original_masked_lm_ids"] = rng.randint(5, vocab, size=(n, preds)).astype(np.int32)
    draws = rng.randint(5, vocab, size=(n, preds, GHOST_DRAWS)).astype(np.int32)
    draws[:, :, 0] = b["masked_lm_ids"]
    b["prob_masked_lm_ids"] = draws
    return b


def with_token_rep(batch: dict, params, seed: int = 0) -> dict:
    """The dχ token_rep input: noisy embedding rows instead of the lookup."""
    table = np.asarray(params["bert"]["embeddings"]["word_embeddings"]["embedding"][...])
    noise = np.random.RandomState(seed).normal(scale=0.02, size=table[batch["input_ids"]].shape)
    return dict(batch, word_embeddings=(table[batch["input_ids"]] + noise).astype(np.float32))

"""Fine-tuning losses: values against torch's cross-entropy, and the DP engine's clipper on them."""

import functools
import math

import jax
import numpy as np
import pytest
import torch
from flax import nnx

from dpbert.models import heads

from dpbert.tasks import task_losses
from dpbert.models import bert as model_lib
from dpbert.dp import clipping, trees
from tests.dpbert.dp import helpers

VOCAB = 61
N, S = 8, 12


def config():
    return model_lib.BertConfig(vocab_size=VOCAB, hidden_size=16, num_hidden_layers=1,
                                num_attention_heads=2, intermediate_size=32,
                                max_position_embeddings=16)


def cls_batch(seed=0, num_labels=3):
    rng = np.random.RandomState(seed)
    ids = rng.randint(5, VOCAB, size=(N, S)).astype(np.int32)
    lengths = rng.randint(4, S + 1, size=N)
    mask = (np.arange(S)[None] < lengths[:, None]).astype(np.int32)
    ids[:, 0] = 2
    ids[mask == 0] = 0
    seg = np.zeros_like(ids)
    labels = rng.randint(0, num_labels, size=N).astype(np.int32)
    tags = rng.randint(0, 7, size=(N, S)).astype(np.int32)
    tags[mask == 0] = task_losses.IGNORE_LABEL
    tags[:, 0] = task_losses.IGNORE_LABEL
    tags[rng.rand(N, S) < 0.3] = task_losses.IGNORE_LABEL   # non-first WordPieces
    tags[3] = task_losses.IGNORE_LABEL                       # an example with no labelled token
    return {"input_ids": ids, "segment_ids": seg, "input_mask": mask, "label": labels,
            "labels": tags}


@pytest.fixture(scope="module")
def seq_model():
    return nnx.split(heads.create_task_model("sequence_classification", config(), 3, seed=1))


@pytest.fixture(scope="module")
def tok_model():
    return nnx.split(heads.create_task_model("token_classification", config(), 7, seed=2))


def test_classification_loss_is_cross_entropy(seq_model):
    graphdef, params = seq_model
    b = cls_batch()
    logits = nnx.merge(graphdef, params)(b["input_ids"], b["segment_ids"], b["input_mask"])
    want = torch.nn.functional.cross_entropy(torch.tensor(np.asarray(logits)),
                                             torch.tensor(b["label"]).long(), reduction="none")
    loss_fn = task_losses.make_classification_loss(graphdef, deterministic=True)
    key = jax.random.key(0)
    losses, m = jax.jit(jax.vmap(loss_fn, (None, 0, None)))(
        params, {k: v for k, v in b.items() if k != "labels"}, key)
    np.testing.assert_allclose(np.asarray(losses), want.numpy(), rtol=1e-5)
    np.testing.assert_array_equal(np.asarray(m["correct"]),
                                  np.argmax(logits, -1) == b["label"])
    np.testing.assert_array_equal(np.asarray(m["count"]), np.ones(N))
    sums = jax.jit(functools.partial(task_losses.batch_metric_sums, loss_fn))(
        params, {k: v for k, v in b.items() if k != "labels"}, np.arange(N) < 6)
    np.testing.assert_allclose(float(sums["loss_sum"]), float(want[:6].sum()), rtol=1e-5)
    assert float(sums["count"]) == 6
    pred = task_losses.predict_classes(graphdef, params, b)
    assert float(sums["correct"]) == float(np.sum(np.asarray(pred)[:6] == b["label"][:6]))


def test_token_loss_ignores_minus_100(tok_model):
    graphdef, params = tok_model
    b = cls_batch(1)
    logits = np.asarray(nnx.merge(graphdef, params)(b["input_ids"], b["segment_ids"],
                                                    b["input_mask"]))
    loss_fn = task_losses.make_token_classification_loss(graphdef, deterministic=True)
    key = jax.random.key(0)
    tok_batch = {k: v for k, v in b.items() if k != "label"}
    all_losses, all_m = jax.jit(jax.vmap(loss_fn, (None, 0, None)))(params, tok_batch, key)
    for i in range(N):
        loss, m = all_losses[i], {k: v[i] for k, v in all_m.items()}
        scored = b["labels"][i] != -100
        assert float(m["token_count"]) == scored.sum()
        if scored.any():
            want = torch.nn.functional.cross_entropy(
                torch.tensor(logits[i]), torch.tensor(b["labels"][i]).long(), ignore_index=-100)
            np.testing.assert_allclose(float(loss), float(want), rtol=1e-5)
            np.testing.assert_allclose(float(m["loss_sum"]), float(want) * scored.sum(),
                                       rtol=1e-5)
            assert float(m["correct"]) == np.sum(logits[i].argmax(-1)[scored]
                                                 == b["labels"][i][scored])
        else:
            assert float(loss) == 0.0 and float(m["loss_sum"]) == 0.0
    # The example without labelled tokens has an exactly zero gradient (no NaN from 0/0).
    g = jax.jit(jax.grad(lambda p: loss_fn(p, {k: v[3] for k, v in tok_batch.items()}, key)[0]))(
        params)
    assert all(not np.asarray(x).any() for x in jax.tree.leaves(g))
    pred = np.asarray(task_losses.predict_classes(graphdef, params, b))
    np.testing.assert_array_equal(pred, logits.argmax(-1))


def _engine_vs_loop(loss_fn, params, batch, trainable=None, microbatch=4):
    mask = np.ones(N, bool)
    mask[5] = False
    key = jax.random.key(7)
    per_example = helpers.per_example_grads(loss_fn, params, batch, mask, key)
    # C = the median unclipped norm, so some examples are clipped and some are not.
    _, _, norms = helpers.clip_and_sum(per_example, params, math.inf, trainable)
    c = float(np.median(norms))
    assert min(norms) < c < max(norms)
    ref, ref_metrics, _ = helpers.clip_and_sum(per_example, params, c, trainable)
    clipper = clipping.VmapClipper(c, microbatch_size=microbatch, trainable=trainable)
    grads, metrics, nonfinite = jax.jit(
        lambda p, b, m: clipper.clipped_sum(loss_fn, p, b, m, key))(params, batch, mask)
    helpers.assert_trees_close(grads, ref, rtol=2e-5, atol_frac=1e-6)
    for k, v in ref_metrics.items():
        np.testing.assert_allclose(float(metrics[k]), v, rtol=1e-5)
    assert int(nonfinite) == 0
    return grads


def test_vmap_clipper_equals_per_example_loop(seq_model):
    """Mode none / text_to_text: ids in, every parameter trainable. Dropout is off in the
    encoder here (it doubles the compile time; the engine's own BERT tests run with it, and
    the seq_rep case below runs the head's dropout with the engine's per-example keys)."""
    graphdef, params = seq_model
    loss_fn = task_losses.make_classification_loss(graphdef, deterministic=True)
    b = cls_batch(2)
    b.pop("labels")
    _engine_vs_loop(loss_fn, params, b)


def test_vmap_clipper_on_token_rep_and_seq_rep_inputs(seq_model, tok_model):
    """The privatized input forms: word_embeddings with φ frozen (token model, NER under
    token_rep) and features with only the head trainable (seq_rep, dropout on)."""
    graphdef, params = tok_model
    loss_fn = task_losses.make_token_classification_loss(graphdef, deterministic=True)
    b = cls_batch(3)
    rng = np.random.RandomState(0)
    tok = {"input_ids": np.ones_like(b["input_ids"]), "segment_ids": b["segment_ids"],
           "input_mask": b["input_mask"], "labels": b["labels"],
           "word_embeddings": rng.normal(size=(N, S, 16)).astype(np.float32)}
    frozen_phi = trees.freeze_paths_containing("word_embeddings")
    grads = _engine_vs_loop(loss_fn, params, tok, trainable=frozen_phi)
    phi = grads["bert"]["embeddings"]["word_embeddings"]["embedding"]
    assert not np.asarray(phi[...]).any()

    graphdef, params = seq_model
    loss_fn = task_losses.make_classification_loss(graphdef, deterministic=False)
    seq = {"features": rng.normal(size=(N, 16)).astype(np.float32), "label": b["label"]}
    head_only = lambda path, _: path[0] == "classifier"  # noqa: E731
    grads = _engine_vs_loop(loss_fn, params, seq, trainable=head_only, microbatch=None)
    # Dropout is on: the loss depends on `rng` (same key, same loss; another key, another).
    one = jax.jit(loss_fn)
    example = {k: v[0] for k, v in seq.items()}
    k1, k2 = jax.random.key(1), jax.random.key(2)
    assert float(one(params, example, k1)[0]) == float(one(params, example, k1)[0])
    assert float(one(params, example, k1)[0]) != float(one(params, example, k2)[0])
    for path, leaf in jax.tree_util.tree_leaves_with_path(grads):
        names = trees.path_names(path)
        assert np.asarray(leaf).any() == (names[0] == "classifier"), names


def test_unknown_task():
    with pytest.raises(ValueError, match="unknown task"):
        task_losses.make_task_loss("regression", None)


@pytest.mark.parametrize("mode", ["ids", "token_rep"])
def test_ghost_clippers_equal_vmap_on_classification(seq_model, mode):
    """The ghost clippers on `FactoredClassificationLoss` give VmapClipper's clipped sum,
    metrics and dropped-example count (dropout on, padding, colliding ids, a clip factor
    below 1 for most examples, a non-finite example; every dense kernel in the Gram form for
    mixed_ghost "gram": the classifier too); token_rep: the example's own vectors,
    the word embedding frozen (the dχ trainable filter)."""
    from dpbert.privacy import input_privacy  # noqa: PLC0415
    from dpbert.dp import ghost, mixed_ghost  # noqa: PLC0415

    graphdef, params = seq_model
    b = cls_batch(seed=3)
    b["input_ids"][:, 3] = 7                                  # the same row in every example
    trainable = None
    if mode == "token_rep":
        rng = np.random.RandomState(4)
        b["word_embeddings"] = rng.normal(size=(N, S, 16)).astype(np.float32)
        b["word_embeddings"][5, 2, 0] = np.inf                # one non-finite example
        trainable = input_privacy.trainable_filter("token_rep")
    del b["labels"]
    mask = np.ones(N, bool)
    mask[6] = False                                           # a padding slot
    key = jax.random.key(11)
    reference = task_losses.make_classification_loss(graphdef, deterministic=False)
    factored = task_losses.FactoredClassificationLoss(graphdef)
    c = 0.05
    runs = [(clipping.VmapClipper(c, 4, trainable=trainable), reference),
            (ghost.TiedEmbeddingClipper(c, 4, trainable=trainable), factored),
            (mixed_ghost.MixedGhostClipper(c, 4, trainable=trainable, dense_norm="gram"),
             factored)]
    plan = runs[2][0].plan(factored, params, {k: v[0] for k, v in b.items()})
    assert set(plan.gram) >= {"classifier", "bert/pooler/dense"} and len(plan.gram) == 6 + 2
    results = []
    for clipper, loss_fn in runs:
        fn = jax.jit(lambda p, batch, m, clipper=clipper, loss_fn=loss_fn: clipper.clipped_sum(
            loss_fn, p, batch, m, key, first_position=8))
        results.append(jax.device_get(fn(params, b, mask)))
    ref, ref_m, ref_nf = results[0]
    assert int(ref_nf) == (1 if mode == "token_rep" else 0)
    table = ref["bert"]["embeddings"]["word_embeddings"]["embedding"]
    assert np.asarray(table[...]).any() == (mode == "ids")
    for got, got_m, got_nf in results[1:]:
        assert int(got_nf) == int(ref_nf)
        helpers.assert_trees_close(got, ref, rtol=1e-5, atol_frac=1e-6)
        for k in ref_m:
            np.testing.assert_allclose(got_m[k], ref_m[k], rtol=1e-6)
    # The factored loss is the classification loss (same dropout masks from the same key).
    example = {k: v[0] for k, v in b.items()}
    k1 = jax.random.key(1)
    assert float(factored(params, example, k1)[0]) == float(reference(params, example, k1)[0])

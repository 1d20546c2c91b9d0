"""The Flax NNX BERT: shapes, axes, masking, dropout, purity, per-example independence."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dpbert.models import losses
from dpbert.models import bert as model_lib

VOCAB = 97


@pytest.fixture(scope="module")
def tiny():
    config = model_lib.BertConfig.preset("tiny", VOCAB, max_position_embeddings=64)
    return model_lib.create_model(config, seed=0)


def random_batch(rng: np.random.RandomState, batch=3, seq=16, preds=4):
    ids = rng.randint(5, VOCAB, size=(batch, seq)).astype(np.int32)
    mask = np.ones_like(ids)
    mask[0, 10:] = 0
    ids[mask == 0] = 0
    seg = np.zeros_like(ids)
    seg[:, seq // 2:] = 1
    seg[mask == 0] = 0
    return {
        "input_ids": ids, "input_mask": mask, "segment_ids": seg,
        "masked_lm_positions": np.tile(np.arange(1, preds + 1, dtype=np.int32), (batch, 1)),
        "masked_lm_ids": rng.randint(5, VOCAB, size=(batch, preds)).astype(np.int32),
        "masked_lm_weights": np.array([[1, 1, 1, 0]] * batch, np.float32)[:, :preds],
        "next_sentence_labels": rng.randint(0, 2, size=(batch,)).astype(np.int32),
    }


def run(m, b, **kw):
    return m(b["input_ids"], b["segment_ids"], b["input_mask"], b.get("masked_lm_positions"), **kw)


@pytest.mark.parametrize("name,layers,hidden,heads", [
    ("micro", 2, 64, 2), ("tiny", 2, 128, 2), ("mini", 4, 256, 4), ("base", 12, 768, 12),
    ("large", 24, 1024, 16)])
def test_presets(name, layers, hidden, heads):
    c = model_lib.BertConfig.preset(name, 30522)
    assert (c.num_hidden_layers, c.hidden_size, c.num_attention_heads) == (layers, hidden, heads)
    assert c.intermediate_size == 4 * hidden and c.vocab_size == 30522


def test_base_parameter_count_matches_bert_base():
    # bert-base-uncased BertForPreTraining has 110,106,428 parameters (tied decoder counted once).
    c = model_lib.BertConfig.preset("base", 30522)
    shapes = nnx.eval_shape(lambda: model_lib.create_model(c))
    n = sum(x.size for x in jax.tree.leaves(nnx.state(shapes, nnx.Param)))
    assert n == 110_106_428


@pytest.mark.parametrize("bad,match", [
    (dict(hidden_size=100, num_attention_heads=3), "divisible"),
    (dict(dtype="float16"), "dtype"),
    (dict(vocab_size=0), "vocab_size"),
    (dict(hidden_dropout_prob=1.0), "hidden_dropout_prob"),
])
def test_config_validation(bad, match):
    fields = dict(vocab_size=10, hidden_size=12, num_attention_heads=2, intermediate_size=8)
    fields.update(bad)
    with pytest.raises(ValueError, match=match):
        model_lib.BertConfig(**fields)


def test_unknown_preset():
    with pytest.raises(ValueError, match="unknown BERT size 'huge'"):
        model_lib.BertConfig.preset("huge", 10)


def test_every_param_has_logical_axes_and_is_float32(tiny):
    state = nnx.state(tiny, nnx.Param)
    for path, var in nnx.to_flat_state(state):
        axes = var.get_metadata().get("out_sharding")
        assert axes is not None and len(axes) == var[...].ndim, path
        assert var[...].dtype == jnp.float32, path
    names = {a for _, v in nnx.to_flat_state(state) for a in v.get_metadata()["out_sharding"]}
    assert {"vocab", "embed", "heads", "mlp"} <= names


def test_output_shapes(tiny):
    b = random_batch(np.random.RandomState(0))
    out = run(tiny, b)
    assert out.sequence_output.shape == (3, 16, 128)
    assert out.pooled_output.shape == (3, 128)
    assert out.mlm_logits.shape == (3, 4, VOCAB) and out.mlm_logits.dtype == jnp.float32
    assert out.nsp_logits.shape == (3, 2) and out.nsp_logits.dtype == jnp.float32
    full = tiny(b["input_ids"], b["segment_ids"], b["input_mask"])
    assert full.mlm_logits.shape == (3, 16, VOCAB)
    # Gathered logits are the all-position logits at the masked positions.
    np.testing.assert_allclose(out.mlm_logits[0], full.mlm_logits[0, 1:5], atol=1e-5)


def test_padding_does_not_change_real_positions(tiny):
    b = random_batch(np.random.RandomState(1))
    out1 = run(tiny, b)
    b2 = dict(b, input_ids=b["input_ids"].copy())
    b2["input_ids"][0, 10:] = 7  # change padded tokens only
    out2 = run(tiny, b2)
    np.testing.assert_allclose(out1.sequence_output[0, :10], out2.sequence_output[0, :10],
                               atol=1e-6)
    np.testing.assert_allclose(out1.nsp_logits, out2.nsp_logits, atol=1e-6)


def test_no_cross_example_interaction(tiny):
    b = random_batch(np.random.RandomState(2))
    together = run(tiny, b)
    for i in range(3):
        alone = run(tiny, {k: v[i:i + 1] for k, v in b.items()})
        np.testing.assert_allclose(alone.mlm_logits[0], together.mlm_logits[i], atol=1e-5)


def test_dropout(tiny):
    b = random_batch(np.random.RandomState(3))
    det = run(tiny, b).mlm_logits
    d1 = run(tiny, b, deterministic=False, rngs=nnx.Rngs(dropout=1)).mlm_logits
    d1b = run(tiny, b, deterministic=False, rngs=nnx.Rngs(dropout=1)).mlm_logits
    d2 = run(tiny, b, deterministic=False, rngs=nnx.Rngs(dropout=2)).mlm_logits
    assert not np.allclose(det, d1)
    np.testing.assert_array_equal(d1, d1b)
    assert not np.allclose(d1, d2)
    with pytest.raises(ValueError, match="no rngs"):
        run(tiny, b, deterministic=False)


def test_bfloat16_compute_keeps_float32_params_and_logits():
    c = model_lib.BertConfig.preset("tiny", VOCAB, max_position_embeddings=64)
    m32 = model_lib.create_model(c, seed=0)
    m16 = model_lib.create_model(c.replace(dtype="bfloat16"), seed=0)
    for _, var in nnx.to_flat_state(nnx.state(m16, nnx.Param)):
        assert var[...].dtype == jnp.float32
    b = random_batch(np.random.RandomState(4))
    o32, o16 = run(m32, b), run(m16, b)
    assert o16.sequence_output.dtype == jnp.bfloat16
    assert o16.mlm_logits.dtype == jnp.float32
    np.testing.assert_allclose(o16.mlm_logits, o32.mlm_logits, atol=0.1)


def test_word_embeddings_override_equals_lookup(tiny):
    b = random_batch(np.random.RandomState(5))
    table = tiny.bert.embeddings.word_embeddings.embedding[...]
    out = run(tiny, b, word_embeddings=table[b["input_ids"]])
    np.testing.assert_allclose(out.mlm_logits, run(tiny, b).mlm_logits, atol=1e-6)


def test_per_example_loss_is_pure_and_vmappable(tiny):
    b = random_batch(np.random.RandomState(6))
    graphdef, params = nnx.split(tiny)
    loss_fn = losses.make_pretraining_loss(graphdef, deterministic=True)
    per_ex, metrics = jax.jit(jax.vmap(loss_fn, in_axes=(None, 0, 0)))(
        params, b, jax.random.split(jax.random.key(0), 3))
    out = run(tiny, b)
    # Hand computation in NumPy from the batched forward pass.
    logits = np.asarray(out.mlm_logits, np.float64)
    logp = logits - np.log(np.exp(logits - logits.max(-1, keepdims=True)).sum(-1, keepdims=True)) \
        - logits.max(-1, keepdims=True)
    nll = -np.take_along_axis(logp, b["masked_lm_ids"][..., None], -1)[..., 0]
    w = b["masked_lm_weights"]
    nsp = np.asarray(out.nsp_logits, np.float64)
    nsp_logp = nsp - np.log(np.exp(nsp).sum(-1, keepdims=True))
    nsp_nll = -nsp_logp[np.arange(3), b["next_sentence_labels"]]
    expected = (nll * w).sum(-1) / w.sum(-1) + nsp_nll
    np.testing.assert_allclose(per_ex, expected, rtol=1e-5)
    np.testing.assert_allclose(metrics["mlm_weight"], w.sum(-1))
    np.testing.assert_allclose(metrics["count"], 1.0)
    # Dropout on: the per-example key matters, and the loss is still a pure function.
    loss_drop = losses.make_pretraining_loss(graphdef, deterministic=False)
    ex0 = {k: v[0] for k, v in b.items()}
    l1, _ = loss_drop(params, ex0, jax.random.key(1))
    l1b, _ = loss_drop(params, ex0, jax.random.key(1))
    l2, _ = loss_drop(params, ex0, jax.random.key(2))
    assert l1 == l1b and l1 != l2

"""Per-example pretraining loss: MLM targets against hand-computed values, the registry, the
frozen (stop-gradient) word embedding, and the wiring with dχ-privatized batches."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from dpbert.privacy import dchi

from dpbert.models import losses
from dpbert.models import bert as model_lib

LOGITS = np.array([[2.0, 0.5, -1.0, 0.3, 1.2],
                   [0.1, 0.2, 3.0, -0.5, 0.0],
                   [1.0, 1.0, 1.0, 1.0, 1.0]], np.float32)
NSP_LOGITS = np.array([0.3, -0.2], np.float32)


def log_softmax(x):
    x = np.asarray(x, np.float64)
    return x - np.log(np.exp(x - x.max(-1, keepdims=True)).sum(-1, keepdims=True)) - x.max(
        -1, keepdims=True)


LP = log_softmax(LOGITS)
NSP = -log_softmax(NSP_LOGITS)[1]


def toy_example(privatized=True):
    ex = {"masked_lm_ids": np.array([1, 2, 0], np.int32),
          "masked_lm_weights": np.array([1, 1, 0], np.float32),
          "next_sentence_labels": np.array(1, np.int32)}
    if privatized:
        ex["original_masked_lm_ids"] = np.array([3, 2, 0], np.int32)
        ex["prob_masked_lm_ids"] = np.array([[1, 1, 4, 0], [2, 2, 2, 2], [0, 0, 0, 0]], np.int32)
    return ex


def run_target(name, example):
    loss, metrics = jax.jit(losses.mlm_nsp_loss, static_argnums=3)(
        LOGITS, NSP_LOGITS, example, name)
    return float(loss), {k: float(v) for k, v in metrics.items()}


def test_vanilla_is_cross_entropy_on_masked_lm_ids():
    loss, m = run_target("vanilla", toy_example())
    want_sum = -(LP[0, 1] + LP[1, 2])
    assert loss == pytest.approx(want_sum / 2 + NSP, rel=1e-6)
    assert m["mlm_loss_sum"] == pytest.approx(want_sum, rel=1e-6)
    assert m["mlm_correct"] == 1.0      # argmax row 0 is 0 (label 1), row 1 is 2 (label 2)
    assert m["mlm_weight"] == 2.0 and m["count"] == 1.0
    assert m["nsp_loss"] == pytest.approx(NSP, rel=1e-6)
    assert m["nsp_correct"] == 0.0


def test_denoising_predicts_the_original_token():
    loss, m = run_target("denoising", toy_example())
    assert loss == pytest.approx(-(LP[0, 3] + LP[1, 2]) / 2 + NSP, rel=1e-6)
    assert m["mlm_correct"] == 1.0


def test_prob_is_soft_cross_entropy_on_the_empirical_distribution():
    ex = toy_example()
    per_position = []
    for p in range(2):
        draws = ex["prob_masked_lm_ids"][p]
        counts = collections.Counter(draws.tolist())
        per_position.append(-sum(c / len(draws) * LP[p, w] for w, c in counts.items()))
    loss, m = run_target("prob", ex)
    assert loss == pytest.approx(sum(per_position) / 2 + NSP, rel=1e-6)
    assert m["mlm_loss_sum"] == pytest.approx(sum(per_position), rel=1e-6)
    # Row 0: argmax 0 is 1 of the 4 draws; row 1: argmax 2 is all 4.
    assert m["mlm_correct"] == pytest.approx(0.25 + 1.0)


def test_targets_reduce_to_plain_bert_on_unprivatized_examples():
    plain = run_target("vanilla", toy_example(privatized=False))
    for name in ("denoising", "prob"):
        got = run_target(name, toy_example(privatized=False))
        assert got[0] == pytest.approx(plain[0], rel=1e-6)
        assert got[1] == pytest.approx(plain[1], rel=1e-6)


def test_example_without_predictions_has_zero_mlm_loss():
    ex = toy_example()
    ex["masked_lm_weights"] = np.zeros(3, np.float32)
    for name in losses.mlm_target_names():
        loss, m = run_target(name, ex)
        assert loss == pytest.approx(NSP, rel=1e-6) and m["mlm_weight"] == 0.0


def test_registry():
    assert {"vanilla", "prob", "denoising"} <= set(losses.mlm_target_names())
    assert losses.get_mlm_target("prob").multi_draw
    assert not losses.get_mlm_target("denoising").multi_draw
    with pytest.raises(ValueError, match=r"unknown MLM target 'nope'; registered: .*vanilla"):
        losses.get_mlm_target("nope")
    with pytest.raises(ValueError, match="already registered"):
        losses.register_mlm_target("vanilla")(losses.vanilla_target)


@pytest.fixture
def custom_target():
    """A user-defined target, removed from the registry afterwards."""

    @losses.register_mlm_target("test_half_denoising")
    def half(mlm_logits, example):
        loss, correct = losses.hard_label_target(mlm_logits, example["original_masked_lm_ids"])
        return 0.5 * loss, correct

    yield "test_half_denoising"
    losses._MLM_TARGETS.pop("test_half_denoising")


def test_user_registered_target(custom_target):
    loss, _ = run_target(custom_target, toy_example())
    assert loss == pytest.approx(-(LP[0, 3] + LP[1, 2]) / 4 + NSP, rel=1e-6)


# ----------------------------------------------------------------------------- with the model

VOCAB = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + [f"w{i}" for i in range(42)]
SEQ, PRED = 16, 3


@pytest.fixture(scope="module")
def tiny():
    config = model_lib.BertConfig(vocab_size=len(VOCAB), hidden_size=16, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=32,
                                  max_position_embeddings=SEQ)
    model = model_lib.create_model(config, seed=0)
    graphdef, params = nnx.split(model)
    return model, graphdef, params


def batch_of(num, seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(6, len(VOCAB), size=(num, SEQ)).astype(np.int32)
    ids[:, 0], ids[:, 7], ids[:, 12] = 3, 4, 4
    ids[:, 13:] = 0
    positions = np.tile(np.array([2, 5, 9], np.int32), (num, 1))
    originals = ids[:, [2, 5, 9]].copy()
    ids[:, 2] = 5                                                     # [MASK]
    return {"input_ids": ids, "input_mask": (ids > 0).astype(np.int32),
            "segment_ids": (np.arange(SEQ) > 7).astype(np.int32)[None].repeat(num, 0),
            "masked_lm_positions": positions, "masked_lm_ids": originals,
            "masked_lm_weights": np.ones((num, PRED), np.float32),
            "next_sentence_labels": (np.arange(num) % 2).astype(np.int32)}


def unbatch(batch, i=0):
    return {k: v[i] for k, v in batch.items()}


def test_default_loss_is_plain_bert_mlm_plus_nsp(tiny):
    model, graphdef, params = tiny
    ex = unbatch(batch_of(1))
    loss, m = jax.jit(losses.make_pretraining_loss(graphdef, deterministic=True))(
        params, ex, jax.random.key(0))
    out = model(*(jnp.asarray(ex[k])[None] for k in ("input_ids", "segment_ids", "input_mask",
                                                     "masked_lm_positions")))
    lp = log_softmax(np.asarray(out.mlm_logits[0]))
    mlm = -lp[np.arange(PRED), ex["masked_lm_ids"]].mean()
    nsp = -log_softmax(np.asarray(out.nsp_logits[0]))[int(ex["next_sentence_labels"])]
    assert float(loss) == pytest.approx(mlm + nsp, rel=1e-5)
    assert float(m["mlm_loss_sum"]) == pytest.approx(mlm * PRED, rel=1e-5)


def test_without_nsp_the_loss_is_the_mlm_loss_in_both_forms(tiny):
    """train.nsp=False: the plain and the factored loss (the ghost clippers') are the MLM loss
    alone, with the same metrics as with NSP, and the NSP head gets no gradient."""
    _, graphdef, params = tiny
    ex = unbatch(batch_of(1))
    key = jax.random.key(0)
    with_nsp, m_with = losses.make_pretraining_loss(graphdef, deterministic=True)(
        params, ex, key)
    for make in (losses.make_pretraining_loss, losses.make_factored_pretraining_loss):
        loss_fn = make(graphdef, deterministic=True, nsp=False)
        loss, m = loss_fn(params, ex, key)
        mlm = float(m["mlm_loss_sum"]) / float(m["mlm_weight"])
        assert float(loss) == pytest.approx(mlm, rel=1e-6)
        assert float(with_nsp) == pytest.approx(mlm + float(m["nsp_loss"]), rel=1e-5)
        for k in m_with:
            assert float(m[k]) == pytest.approx(float(m_with[k]), rel=1e-6), k
    grads = jax.grad(lambda p: losses.make_pretraining_loss(
        graphdef, deterministic=True, nsp=False)(p, ex, key)[0])(params)
    assert all(np.all(np.asarray(g) == 0) for g in jax.tree.leaves(grads["cls"]["seq_relationship"]))
    assert all(np.all(np.asarray(g) == 0) for g in jax.tree.leaves(grads["bert"]["pooler"]))


def test_word_embeddings_field_replaces_the_lookup(tiny):
    model, graphdef, params = tiny
    ex = unbatch(batch_of(1))
    loss_fn = jax.jit(losses.make_pretraining_loss(graphdef, deterministic=True))
    plain, _ = loss_fn(params, ex, jax.random.key(0))
    table = np.asarray(model.bert.embeddings.word_embeddings.embedding[...])
    same, _ = loss_fn(params, dict(ex, word_embeddings=table[ex["input_ids"]]), jax.random.key(0))
    assert float(same) == pytest.approx(float(plain), rel=1e-6)
    # (A constant shift would be removed by the embedding LayerNorm: use a random one.)
    shifted = table[ex["input_ids"]] + np.random.default_rng(0).normal(size=table[:SEQ].shape)
    other, _ = loss_fn(params, dict(ex, word_embeddings=shifted), jax.random.key(0))
    assert abs(float(other) - float(plain)) > 1e-3


def table_grad(grads):
    return np.asarray(grads["bert"]["embeddings"]["word_embeddings"]["embedding"][...])


def test_frozen_word_embedding_gets_exactly_zero_gradient(tiny):
    """The table is both the input lookup and the tied decoder; both uses are stopped.
    (The token_rep path, where only the decoder uses it, is checked with privatized batches.)"""
    _, graphdef, params = tiny
    batch = batch_of(2)
    for frozen in (True, False):
        # Dropout off: it does not touch the stop-gradient and triples the compile time.
        loss_fn = losses.make_pretraining_loss(graphdef, deterministic=True,
                                               frozen_word_embedding=frozen)
        # The DP engine's form: per-example gradients by vmap over examples.
        grads = jax.jit(jax.vmap(jax.grad(loss_fn, has_aux=True), in_axes=(None, 0, 0)))(
            params, batch, jax.random.split(jax.random.key(1), 2))[0]
        g = table_grad(grads)
        if frozen:
            assert np.all(g == 0.0)
        else:
            assert np.abs(g).max() > 0
        others = [np.abs(np.asarray(x)).max() for path, x in
                  jax.tree_util.tree_leaves_with_path(grads)
                  if "word_embeddings" not in jax.tree_util.keystr(path)]
        assert min(others) > 0, "every other parameter must still train"


def test_frozen_parameter_mask(tiny):
    _, _, params = tiny
    mask = losses.frozen_parameter_mask(params)
    flagged = [jax.tree_util.keystr(p) for p, v in jax.tree_util.tree_leaves_with_path(mask) if v]
    assert len(flagged) == 1 and "word_embeddings" in flagged[0]
    assert not any(jax.tree.leaves(losses.frozen_parameter_mask(params, False)))
    with pytest.raises(ValueError, match="expected one word-embedding table"):
        losses.stop_word_embedding_gradient({"encoder": jnp.zeros(3)})


@pytest.mark.parametrize("mechanism,target", [("text_to_text", "denoising"),
                                              ("token_rep", "prob")])
def test_privatized_batches_feed_every_target(tiny, mechanism, target):
    """dχ privatizer -> per-example vmapped loss and gradients, as the train step wires them."""
    model, graphdef, params = tiny
    priv = dchi.Privatizer.from_model(model, _vocab_file(), eta=20.0, mechanism=mechanism,
                                      mlm_target=target, prob_samples=4, chunk_size=16)
    batch = jax.jit(dchi.privatize_batch)(priv, batch_of(4), jax.random.key(3))
    assert ("word_embeddings" in batch) == (mechanism == "token_rep")
    loss_fn = losses.make_pretraining_loss(graphdef, deterministic=True, mlm_target=target,
                                           frozen_word_embedding=True)
    keys = jax.random.split(jax.random.key(4), 4)
    if mechanism == "token_rep":   # the table reaches the loss only through the tied decoder
        (loss, metrics), grads = jax.jit(jax.vmap(jax.value_and_grad(loss_fn, has_aux=True),
                                                  in_axes=(None, 0, 0)))(params, batch, keys)
        assert np.all(table_grad(grads) == 0.0)
    else:                          # gradients of this path: test_frozen_word_embedding_...
        loss, metrics = jax.jit(jax.vmap(loss_fn, in_axes=(None, 0, 0)))(params, batch, keys)
    assert loss.shape == (4,) and np.isfinite(np.asarray(loss)).all()
    assert float(metrics["mlm_weight"].sum()) == 4 * PRED


_VOCAB_DIR = None


def _vocab_file():
    import pathlib
    import tempfile

    global _VOCAB_DIR
    if _VOCAB_DIR is None:
        _VOCAB_DIR = tempfile.TemporaryDirectory()
        pathlib.Path(_VOCAB_DIR.name, "vocab.txt").write_text("\n".join(VOCAB) + "\n")
    return pathlib.Path(_VOCAB_DIR.name, "vocab.txt")

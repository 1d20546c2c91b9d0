"""Input privacy for fine-tuning (FINETUNE_SPEC §1.6): the release model, isolation of the
service side, the mechanisms' laws on the released data, η → ∞, and the frozen parameters."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx
from scipy import stats

from dpbert.privacy import dchi

from dpbert.models import heads

from dpbert.privacy import input_privacy

from dpbert.tasks import task_losses
from dpbert.models import bert as model_lib
from dpbert.dp import trees

SPECIALS = ["[PAD]", "[unused0]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
PAD, UNK, CLS, SEP = 0, 2, 3, 4
V, H, S = 60, 16, 14
VOCAB = SPECIALS + [f"w{i}" for i in range(V - len(SPECIALS))]
KEY = jax.random.key(1234)
SMALL_CALLS = dict(tokens_per_call=256, examples_per_call=64)


@functools.lru_cache(maxsize=None)
def make_model(task="sequence_classification", seed=0):
    """One shared model per (task, seed): tests must not modify it."""
    config = model_lib.BertConfig(vocab_size=V, hidden_size=H, num_hidden_layers=1,
                                  num_attention_heads=2, intermediate_size=32,
                                  max_position_embeddings=16, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    model = heads.create_task_model(task, config, 2, seed=seed)
    # φ with unit-scale rows (BERT's 0.02 init would make every η look alike); unique rows.
    table = np.random.default_rng(seed).normal(size=(V, H)).astype(np.float32)
    model.bert.embeddings.word_embeddings.embedding.set_value(jnp.asarray(table))
    return model


def features(n=32, seed=0, pair=True):
    rng = np.random.default_rng(seed)
    ids = np.full((n, S), PAD, np.int32)
    seg = np.zeros((n, S), np.int32)
    for i in range(n):
        length = rng.integers(5, S + 1)
        body = rng.integers(len(SPECIALS), V, size=length - 3)
        cut = len(body) // 2
        row = [CLS, *body[:cut], SEP, *body[cut:], SEP] if pair else [CLS, *body, SEP, SEP]
        ids[i, :len(row)] = row
        seg[i, cut + 2:len(row)] = 1 if pair else 0
    return {"input_ids": ids, "segment_ids": seg, "input_mask": (ids != PAD).astype(np.int32),
            "label": rng.integers(0, 2, size=n).astype(np.int32),
            "example_id": np.arange(n, dtype=np.int32)}


@functools.lru_cache(maxsize=None)
def _cached_privatizer(mode, eta, kw):
    cfg = input_privacy.InputPrivacyConfig(mode=mode, eta=eta, **SMALL_CALLS, **dict(kw))
    return input_privacy.InputPrivatizer.from_model(cfg, make_model(), VOCAB)


def privatizer(mode, eta=3.0, **kw):
    """The user side of the shared model (one per setting: compilations are shared)."""
    return _cached_privatizer(mode, eta, tuple(sorted(kw.items())))


def special_mask():
    return dchi.special_token_mask(VOCAB)


# ----------------------------------------------------------------------------- release model


@pytest.mark.parametrize("mode", ["token_rep", "text_to_text", "seq_rep"])
def test_release_is_fixed_per_key_and_differs_across_keys_and_splits(mode):
    p = privatizer(mode)
    f = features()
    a = p.release(f, KEY, split="train")
    b = p.release(f, KEY, split="train", epoch=7)      # epoch ignored without fresh noise
    c = p.release(f, jax.random.key(99), split="train")
    d = p.release(f, KEY, split="eval")
    # A rerun (another privatizer object, same key) gives the same release.
    e = input_privacy.InputPrivatizer.from_model(p.config, make_model(), VOCAB).release(
        f, KEY, split="train")
    ba, bb, bc, bd, be = (r.batch(np.arange(32)) for r in (a, b, c, d, e))
    field = {"token_rep": "word_embeddings", "text_to_text": "input_ids",
             "seq_rep": "features"}[mode]
    for other in (bb, be):
        for k in ba:
            np.testing.assert_array_equal(ba[k], other[k])
    assert np.mean(ba[field] != bc[field]) > 0.3
    assert np.mean(ba[field] != bd[field]) > 0.3
    # Any order of examples gives each its own release (keys come from example_id).
    shuffled = {k: v[::-1] for k, v in f.items()}
    np.testing.assert_array_equal(p.release(shuffled, KEY, split="train").batch(
        np.arange(32))[field][::-1], ba[field])
    assert "example_id" not in ba


def test_fresh_noise_each_epoch_and_its_report():
    p = privatizer("text_to_text", fresh_noise_each_epoch=True)
    f = features()
    e0 = p.release(f, KEY, split="train", epoch=0).arrays["input_ids"]
    e0b = p.release(f, KEY, split="train", epoch=0).arrays["input_ids"]
    e1 = p.release(f, KEY, split="train", epoch=1).arrays["input_ids"]
    np.testing.assert_array_equal(e0, e0b)
    assert np.mean(e0 != e1) > 0.2
    with pytest.raises(ValueError, match="pass the epoch"):
        p.release(f, KEY, split="train")
    # The eval split is released once, whatever the epoch.
    np.testing.assert_array_equal(p.release(f, KEY, split="eval", epoch=0).arrays["input_ids"],
                                  p.release(f, KEY, split="eval", epoch=3).arrays["input_ids"])
    rep = p.report(epochs=3)
    assert rep["train_releases_per_example"] == 3 and rep["composed_eta_train"] == 9.0
    assert "compose to (3·η)·d_χ = 9·d_χ" in rep["statement"]
    once = privatizer("text_to_text").report(epochs=3)
    assert once["train_releases_per_example"] == 1 and once["composed_eta_train"] == 3.0
    assert once["frozen"] == [] and once["eval_releases_per_example"] == 1
    assert privatizer("token_rep").report(epochs=1)["frozen"] == [
        "bert/embeddings/word_embeddings (φ)"]
    seeded = p.report(epochs=3, secret_key=False)
    assert seeded["statement"].startswith("NOT private") and seeded["key"] == "public seed"
    assert "NOT private" not in rep["statement"] and "OS entropy" in rep["key"]
    assert input_privacy.privacy_report(input_privacy.InputPrivacyConfig(), epochs=2) == {
        "mode": "none", "frozen": [],
        "statement": "No input privacy: the service received the raw token ids."}


def test_windows_of_one_document_share_the_release_of_a_shared_token():
    """NER windows: example_id = document, position_ids = offset in it."""
    p = privatizer("token_rep")
    doc = np.random.default_rng(0).integers(len(SPECIALS), V, size=20).astype(np.int32)
    ids = np.full((2, S), PAD, np.int32)
    pos = np.zeros((2, S), np.int32)
    for w, start in enumerate((0, 8)):              # pieces 0..11 and 8..19
        ids[w, 0], ids[w, 1:13], ids[w, 13] = CLS, doc[start:start + 12], SEP
        pos[w, 1:13] = np.arange(start, start + 12)
    f = {"input_ids": ids, "segment_ids": np.zeros_like(ids), "input_mask": np.ones_like(ids),
         "example_id": np.array([5, 5]), "position_ids": pos}
    x = p.release(f, KEY, split="train").batch([0, 1])["word_embeddings"]
    np.testing.assert_array_equal(x[0, 9:13], x[1, 1:5])   # pieces 8..11 in both windows
    assert not np.allclose(x[0, 1:5], x[1, 1:5])
    with pytest.raises(ValueError, match="example_id repeats without position_ids"):
        p.release({k: v for k, v in f.items() if k != "position_ids"}, KEY, split="train")


# ----------------------------------------------------------------------------- mechanisms


def brute_force_release(f, table, eta, split="train"):
    """φ(w) + N per regular token with the documented key schedule, and the float64 nearest
    regular token to it."""
    special = special_mask()
    ids = f["input_ids"]
    noisy = np.zeros(ids.shape + (H,), np.float32)
    nearest = ids.copy()
    regular_rows = table[~special].astype(np.float64)
    regular_ids = np.flatnonzero(~special)
    noise_at = jax.jit(lambda k, j: dchi.sample_noise(jax.random.fold_in(k, j), (), H, eta))
    for i in range(ids.shape[0]):
        k = input_privacy.example_key(KEY, split, int(f["example_id"][i]))
        for j in range(ids.shape[1]):
            if special[ids[i, j]]:
                continue
            noisy[i, j] = table[ids[i, j]] + np.asarray(noise_at(k, j))
            d = ((regular_rows - noisy[i, j].astype(np.float64)) ** 2).sum(1)
            nearest[i, j] = regular_ids[np.argmin(d)]
    return noisy, nearest


def test_released_tokens_are_m_rep_and_m_txt_of_each_token():
    model = make_model()
    table = np.asarray(model.bert.embeddings.word_embeddings.embedding[...])
    f = features(6)
    noisy, nearest = brute_force_release(f, table, 3.0)
    regular = ~special_mask()[f["input_ids"]]
    tok = privatizer("token_rep").release(f, KEY, split="train").batch(np.arange(6))
    np.testing.assert_allclose(tok["word_embeddings"][regular], noisy[regular], atol=1e-5)
    # Special positions carry φ(special) exactly; the ids the service gets hold no regular id.
    np.testing.assert_array_equal(tok["word_embeddings"][~regular],
                                  table[f["input_ids"][~regular]])
    assert np.all(tok["input_ids"][regular] == UNK)
    np.testing.assert_array_equal(tok["input_ids"][~regular], f["input_ids"][~regular])
    t2t = privatizer("text_to_text").release(f, KEY, split="train")
    np.testing.assert_array_equal(t2t.arrays["input_ids"], nearest)
    assert not special_mask()[t2t.arrays["input_ids"][regular]].any()   # never a special


def test_token_rep_logits_do_not_depend_on_raw_ids():
    model = make_model()
    f = features(8)
    batch = privatizer("token_rep").release(f, KEY, split="eval").batch(
        np.arange(8))
    graphdef, params = nnx.split(model)
    forward = jax.jit(lambda b: task_losses.predict_classes(graphdef, params, b))
    logits = jax.jit(lambda b: nnx.merge(graphdef, params)(
        b["input_ids"], b["segment_ids"], b["input_mask"], word_embeddings=b["word_embeddings"]))
    base = np.asarray(logits(batch))
    rng = np.random.default_rng(0)
    for ids in (f["input_ids"], rng.integers(0, V, size=f["input_ids"].shape).astype(np.int32)):
        np.testing.assert_array_equal(np.asarray(logits(dict(batch, input_ids=ids))), base)
    np.testing.assert_array_equal(np.asarray(forward(batch)), base.argmax(-1))


def test_changed_token_fraction_matches_inversion_accuracy():
    """Fraction of tokens M_txt changes in the released eval set: within the binomial 99.9 %
    interval around 1 − inversion accuracy, the latter from dchi's analysis code on the same
    vocabulary and token distribution (independent noise, 20x the tokens)."""
    eta = 2.5
    p = privatizer("text_to_text", eta=eta)
    f = features(96, seed=5)
    out = p.release(f, KEY, split="eval").arrays["input_ids"]
    regular = ~special_mask()[f["input_ids"]]
    changed = int(np.sum(out[regular] != f["input_ids"][regular]))
    total = int(regular.sum())
    reps = 20
    ids = np.tile(f["input_ids"][regular], reps)
    hits = jax.jit(dchi.inversion_hits)(jax.random.key(77), ids, p.privatizer.index, eta)
    q = 1.0 - float(np.mean(np.asarray(hits)))
    assert 0.2 < q < 0.8, q            # an informative η: neither all kept nor all changed
    # The interval of the release's count, widened by the reference's own sampling error.
    sd = math.sqrt(q * (1 - q) * (1 / total + 1 / (reps * total)))
    z = stats.norm.ppf(0.9995)
    lo, hi = stats.binom.interval(0.999, total, q)
    assert min(lo, total * (q - z * sd)) <= changed <= max(hi, total * (q + z * sd)), (
        changed / total, q)


def test_seq_rep_noise_norm_law():
    model = make_model()
    eta, m = 4.0, 256
    p = privatizer("seq_rep", eta=eta)
    f = features(m, seed=2)
    z = p.release(f, KEY, split="train").arrays["features"]
    s = p.sentence_representations(f["input_ids"], f["segment_ids"], f["input_mask"])
    norms = np.linalg.norm(z.astype(np.float64) - s, axis=1)
    assert abs(norms.mean() - H / eta) < 4 * math.sqrt(H) / (eta * math.sqrt(m))
    # s(x) is the frozen model's pooled output (the bucketing by length changes nothing).
    want = jax.jit(model.sequence_representation)(f["input_ids"][:16], f["segment_ids"][:16],
                                                  f["input_mask"][:16])
    np.testing.assert_allclose(s[:16], np.asarray(want), atol=1e-5)
    assert set(p.release(f, KEY, split="train").batch([0, 1])) == {"features", "label"}
    cls = privatizer("seq_rep", eta=1e9, seq_rep_source="cls_hidden")
    hidden = jax.jit(lambda *a: model.bert(*a)[0])(f["input_ids"][:4], f["segment_ids"][:4],
                                                   f["input_mask"][:4])
    np.testing.assert_allclose(
        cls.release({k: v[:4] for k, v in f.items()}, KEY, split="train").arrays["features"],
        np.asarray(hidden[:, 0]), atol=1e-4)


def test_huge_eta_is_mode_none():
    model = make_model()
    table = np.asarray(model.bert.embeddings.word_embeddings.embedding[...])
    f = features(8)
    t2t = privatizer("text_to_text", eta=1e9).release(f, KEY, split="train")
    np.testing.assert_array_equal(t2t.arrays["input_ids"], f["input_ids"])
    tok = privatizer("token_rep", eta=1e9).release(f, KEY, split="train").batch(
        np.arange(8))
    assert np.abs(tok["word_embeddings"] - table[f["input_ids"]]).max() < 1e-3
    none = privatizer("none", eta=None).release(f, KEY, split="train").batch(
        np.arange(8))
    np.testing.assert_array_equal(none["input_ids"], f["input_ids"])
    graphdef, params = nnx.split(model)
    loss_fn = jax.jit(jax.vmap(task_losses.make_classification_loss(graphdef, deterministic=True),
                               (None, 0, None)))
    want = np.asarray(loss_fn(params, none, KEY)[0])
    np.testing.assert_allclose(np.asarray(loss_fn(params, tok, KEY)[0]), want, atol=1e-5)
    np.testing.assert_allclose(np.asarray(loss_fn(params, dict(none, **t2t.batch(np.arange(8))),
                                                  KEY)[0]), want, atol=1e-6)


# ----------------------------------------------------------------------------- frozen parts


def test_trainable_filters():
    _, params = nnx.split(make_model())
    def trainable(mode):
        mask = trees.resolve_trainable_mask(params, input_privacy.trainable_filter(mode))
        return {"/".join(trees.path_names(p)) for p, t in
                jax.tree_util.tree_leaves_with_path(mask) if t}
    everything = trainable("none")
    assert trainable("text_to_text") == everything and len(everything) == 25
    assert everything - trainable("token_rep") == {"bert/embeddings/word_embeddings/embedding"}
    assert trainable("seq_rep") == {"classifier/kernel", "classifier/bias"}
    frozen = input_privacy.frozen_mask(params, "seq_rep")
    assert sum(jax.tree.leaves(frozen)) == 23
    with pytest.raises(ValueError, match="privacy.mode"):
        input_privacy.trainable_filter("tokens")


def test_frozen_parts_are_bitwise_unchanged_by_noisy_updates():
    """DP noise lands on every leaf, frozen or not (the clipper gives frozen leaves exactly zero
    gradient: test_task_losses); an optimizer with weight decay (which moves a parameter even
    at zero gradient) through `frozen_mask` must leave the user side bitwise equal and move
    the rest."""
    _, params = nnx.split(make_model())
    modes = ("none", "token_rep", "seq_rep")
    decayed_sgd = optax.chain(optax.add_decayed_weights(0.1), optax.sgd(1e-2))
    txs = [optax.multi_transform({False: decayed_sgd, True: optax.set_to_zero()},
                                 input_privacy.frozen_mask(params, mode)) for mode in modes]

    rng = np.random.default_rng(0)
    noise = jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32), params)

    @jax.jit   # one compilation for the three modes
    def steps(params, noise):
        out = []
        for tx in txs:
            p, state = params, tx.init(params)
            for _ in range(2):
                updates, state = tx.update(noise, state, p)
                p = optax.apply_updates(p, updates)
            out.append(p)
        return out

    for mode, new in zip(modes, steps(params, noise)):
        keep = trees.resolve_trainable_mask(params, input_privacy.trainable_filter(mode))
        for flag, old, cur in zip(jax.tree.leaves(keep), jax.tree.leaves(params),
                                  jax.tree.leaves(new)):
            if flag:
                assert np.all(np.asarray(old) != np.asarray(cur)), mode
            else:
                np.testing.assert_array_equal(np.asarray(old), np.asarray(cur))


# ----------------------------------------------------------------------------- bad input


def test_bad_configuration_and_input():
    for kw, match in [(dict(mode="tokens"), "privacy.mode"),
                      (dict(mode="token_rep"), "privacy.eta"),
                      (dict(mode="text_to_text", eta=-1.0), "privacy.eta"),
                      (dict(mode="seq_rep", eta=math.inf), "privacy.eta"),
                      (dict(mode="seq_rep", eta=1.0, seq_rep_source="mean"), "seq_rep_source"),
                      (dict(tokens_per_call=0), "tokens_per_call")]:
        with pytest.raises(ValueError, match=match):
            input_privacy.InputPrivacyConfig(**kw)
    p = privatizer("token_rep")
    f = features(4)
    bad = dict(f, input_ids=np.where(f["input_ids"] == PAD, PAD, V + 3).astype(np.int32))
    with pytest.raises(ValueError, match="another vocabulary"):
        p.release(bad, KEY, split="train")
    with pytest.raises(ValueError, match="features lack 'example_id'"):
        p.release({k: v for k, v in f.items() if k != "example_id"}, KEY, split="train")
    with pytest.raises(ValueError, match="vocabulary has 59 tokens"):
        input_privacy.InputPrivatizer.from_model(
            input_privacy.InputPrivacyConfig("token_rep", 1.0), make_model(), VOCAB[:-1])
    with pytest.raises(ValueError, match="needs a BertForSequenceClassification"):
        input_privacy.InputPrivatizer.from_model(
            input_privacy.InputPrivacyConfig("seq_rep", 1.0),
            make_model("token_classification"), VOCAB)


# ----------------------------------------------------------------------------- real vocabulary


@pytest.mark.slow
@pytest.mark.minilm
@pytest.mark.shared_data
def test_text_to_text_on_rt_dev_with_minilm_matches_inversion_accuracy(minilm_dir, shared_data):
    """Spec §1.6 on the real setting: MiniLM's φ (n = 384, 30,522 tokens), RT dev sentences,
    η = 70 (inversion accuracy ≈ 0.45 for MiniLM)."""
    from data_pipelines import classification as clf

    table, vocab = dchi.load_embedding_table(minilm_dir)
    tok = clf.tokenizer_for_checkpoint(minilm_dir, vocab_size=len(vocab))
    rows = clf.read_tsv(shared_data / "sentiment" / "rt_dev.tsv")[:100]
    f = clf.build_features(rows, tok, clf.LabelMap.from_rows(rows), "rt_dev.tsv", 128)
    eta = 70.0
    cfg = input_privacy.InputPrivacyConfig("text_to_text", eta, tokens_per_call=1024)
    p = input_privacy.InputPrivatizer(cfg, table=table, special_mask=dchi.special_token_mask(vocab),
                                      unk_id=vocab.index("[UNK]"))
    out = p.release(f, KEY, split="eval").arrays["input_ids"]
    regular = ~dchi.special_token_mask(vocab)[f["input_ids"]]
    np.testing.assert_array_equal(out[~regular], f["input_ids"][~regular])
    total = int(regular.sum())
    changed = int(np.sum(out[regular] != f["input_ids"][regular]))
    reps = 4
    ids = np.tile(f["input_ids"][regular], reps)
    hits = jax.jit(dchi.inversion_hits)(jax.random.key(5), ids, p.privatizer.index, eta)
    q = 1.0 - float(np.mean(np.asarray(hits)))
    assert 0.3 < q < 0.8, q
    sd = math.sqrt(q * (1 - q) * (1 / total + 1 / (reps * total)))
    z = stats.norm.ppf(0.9995)
    assert abs(changed / total - q) < z * sd, (changed / total, q, total)

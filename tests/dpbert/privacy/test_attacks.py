"""Leakage attacks (dpbert.privacy.attacks) and frozen-encoder features (dpbert.models.features), on synthetic
data where the answer is known."""

import string

import jax
import numpy as np
import pytest
from flax import nnx

from dpbert.privacy import attacks

from dpbert.models import features

from dpbert.privacy import ome
from dpbert.models import bert as model_lib

WORDS = ["movie", "great", "bad", "plot", "actor", "boring", "fun", "story", "long", "short",
         "music", "scene", "funny", "sad", "dull", "smart", "cast", "script", "ending", "visual"]


def _corpus(n=400, seed=0, with_embeddings=True):
    rng = np.random.default_rng(seed)
    texts, seen = [], set()
    while len(texts) < n:
        t = " ".join(rng.choice(WORDS, size=rng.integers(3, 8)))
        if t not in seen:
            seen.add(t)
            texts.append(t)
    labels = rng.integers(0, 2, size=n)
    emb = rng.normal(size=(n, 12)) if with_embeddings else None
    return attacks.Corpus(texts, labels, emb)


def test_identical_representations_are_fully_recovered():
    corpus = _corpus()
    reps = np.random.default_rng(1).normal(size=(len(corpus), 32))
    q = np.arange(len(corpus))
    for metric in ("cosine", "euclidean"):
        got = attacks.rss(corpus, reps, q, reps, metric=metric)
        assert got == {"identity": 1.0, "jaccard": 1.0, "tfidf": pytest.approx(1.0),
                       "label": 1.0, "sentence_cosine": pytest.approx(1.0)}


def test_random_queries_score_at_the_random_baseline():
    corpus = _corpus(n=500)
    rng = np.random.default_rng(2)
    index = rng.normal(size=(500, 32))
    q = rng.integers(0, 500, size=2000)
    got = attacks.rss(corpus, index, q, rng.normal(size=(2000, 32)))
    rand = attacks.random_baseline(np.random.default_rng(3), corpus, q)
    assert got["identity"] <= 0.01 and rand["identity"] <= 0.01
    # Label agreement of random pairs ≈ P(same label) ≈ 1/2: both within 4 sd of each other.
    sd = np.sqrt(0.25 / 2000)
    assert abs(got["label"] - rand["label"]) < 4 * np.sqrt(2) * sd
    for name in ("jaccard", "tfidf", "sentence_cosine"):
        assert abs(got[name] - rand[name]) < 0.03, name
    # and well below the identical-representation score
    assert got["jaccard"] < 0.5


def test_abs_rss_sees_through_sign_masks():
    corpus = _corpus(n=300)
    rng = np.random.default_rng(4)
    reps = rng.normal(size=(300, 64))
    q = np.arange(300)
    masks = np.where(rng.random((300, 64)) < 0.5, -1.0, 1.0)
    assert attacks.rss(corpus, reps, q, masks * reps)["identity"] < 0.05
    assert attacks.abs_rss(corpus, reps, q, masks * reps)["identity"] == 1.0


def test_jaccard_and_tfidf_against_references():
    assert attacks.jaccard(attacks.word_set("A b, c!"), attacks.word_set("c d a")) == 2 / 4
    assert attacks.jaccard(frozenset(), frozenset()) == 1.0
    # TF-IDF by hand (scikit-learn's defaults): tokens of ≥ 2 word characters, raw counts,
    # idf = ln((1 + n) / (1 + df)) + 1, l2-normalised rows.
    tfidf = attacks.Tfidf(["Aa bb, BB! x", "bb cc", "dd"])
    i_a = i_c = np.log(4 / 2) + 1                      # aa, cc: df 1 of n = 3
    i_b = np.log(4 / 3) + 1                            # bb: df 2
    doc0 = np.array([i_a, 2 * i_b, 0.0]) / np.sqrt(i_a ** 2 + 4 * i_b ** 2)
    doc1 = np.array([0.0, i_b, i_c]) / np.sqrt(i_b ** 2 + i_c ** 2)
    np.testing.assert_allclose(tfidf.cosine([0, 0, 1, 2], [1, 0, 2, 2]),
                               [doc0 @ doc1, 1.0, 0.0, 1.0], rtol=1e-12)
    assert set(tfidf.vocabulary) == {"aa", "bb", "cc", "dd"}   # "x" is too short


def test_nearest_neighbours_match_brute_force():
    rng = np.random.default_rng(0)
    index, queries = rng.normal(size=(300, 8)), rng.normal(size=(50, 8))
    d2 = ((queries[:, None] - index[None]) ** 2).sum(-1)
    np.testing.assert_array_equal(attacks.nearest_neighbours(index, queries, "euclidean", 7),
                                  d2.argmin(1))
    cos = (queries / np.linalg.norm(queries, axis=1, keepdims=True)) @ (
        index / np.linalg.norm(index, axis=1, keepdims=True)).T
    np.testing.assert_array_equal(attacks.nearest_neighbours(index, 3 * queries), cos.argmax(1))


def test_ml_bit_recovery_is_the_likelihood_argmax():
    rng = np.random.default_rng(0)
    v = rng.normal(size=(200, 4))
    mech = ome.OME(eps=1.0, lam=3.0, r=4)
    index_bits = ome.encode(v)
    noisy = mech.privatize(jax.random.key(0), v)
    rand = mech.randomizer
    got = attacks.ml_bit_recovery(index_bits, noisy[:30], rand)
    lp1, lp0, lq1, lq0 = rand.log_probs()
    for qi in range(30):
        b = noisy[qi]
        ll = [np.sum(np.where(x == 1, np.where(b == 1, lp1, lp0), np.where(b == 1, lq1, lq0)))
              for x in index_bits]
        assert got[qi] == int(np.argmax(ll))


def test_ml_bit_recovery_separates_weak_and_strong_randomizers():
    rng = np.random.default_rng(1)
    v = ome.zscore(rng.normal(size=(500, 20)))
    index_bits = ome.encode(v)
    q = np.arange(500)
    leaky = ome.OME(eps=1.0, lam=100.0, r=20)          # claimed ε = 1, true ε ≈ 1.4e3
    hit = attacks.ml_bit_recovery(index_bits, leaky.privatize(jax.random.key(0), v),
                                  leaky.randomizer)
    assert np.mean(hit == q) > 0.95
    private = ome.CalibratedOME(eps=1.0, r=20)          # true ε = 1
    hit = attacks.ml_bit_recovery(index_bits, private.privatize(jax.random.key(0), v),
                                  private.randomizer)
    assert np.mean(hit == q) < 0.02


def test_reprecon_inverts_a_fixed_mask_but_not_noise():
    rng = np.random.default_rng(0)
    n, d = 1500, 16
    e = rng.normal(size=(n, d)).astype(np.float32)
    sigma = np.where(rng.random(d) < 0.5, -1.0, 1.0).astype(np.float32)
    train, test = slice(0, 1000), slice(1000, n)
    corpus = _corpus(n=n, with_embeddings=False)
    q = np.arange(1000, n)
    f = attacks.train_reprecon(jax.random.key(0), e[train] * sigma, e[train], hidden=(64, 64),
                               epochs=15)
    assert attacks.rss(corpus, e, q, f(e[test] * sigma))["identity"] > 0.9
    noise = rng.normal(size=(n, d)).astype(np.float32)
    g = attacks.train_reprecon(jax.random.key(0), noise[train], e[train], hidden=(64, 64),
                               epochs=15)
    assert attacks.rss(corpus, e, q, g(noise[test]))["identity"] < 0.02


# ----------------------------------------------------------------------------- features


@pytest.fixture(scope="module")
def tiny_encoder(tmp_path_factory):
    from data_pipelines import tokenization
    chars = sorted(set(string.ascii_lowercase + string.punctuation))
    vocab = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + chars + [f"##{c}" for c in chars]
             + WORDS)
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(vocab) + "\n")
    tok = tokenization.WordPieceTokenizer(path)
    cfg = model_lib.BertConfig.preset("tiny", len(vocab), hidden_size=16, num_attention_heads=2,
                                      intermediate_size=32, num_hidden_layers=1)
    return model_lib.create_model(cfg), tok


def test_encode_texts_is_batching_invariant_and_pools_correctly(tiny_encoder):
    model, tok = tiny_encoder
    texts = ["great movie", "a boring plot with a bad actor and a long ending", "fun",
             "sad story, dull script!"]
    # batch 2, every batch padded to 16: one compiled shape, examples split over batches
    batched = features.encode_texts(model, tok, texts, pooling=("pooled", "cls", "mean"),
                                    batch_size=2, length_step=16)
    # Reference: one batch padded to 32 (bucketing above used other batches and lengths).
    seqs = features.tokenize_for_bert(tok, texts, 128)
    ids = np.zeros((len(texts), 32), np.int32)
    mask = np.zeros_like(ids)
    for i, s in enumerate(seqs):
        ids[i, :len(s)], mask[i, :len(s)] = s, 1
    graphdef, params = nnx.split(model.bert)
    seq, pooled = jax.jit(lambda p: nnx.merge(graphdef, p)(ids, np.zeros_like(ids), mask))(params)
    for i, s in enumerate(seqs):
        np.testing.assert_allclose(batched["pooled"][i], pooled[i], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(batched["cls"][i], seq[i, 0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(batched["mean"][i], seq[i, :len(s)].mean(0), rtol=1e-5,
                                   atol=1e-5)
    with pytest.raises(ValueError, match="pooling"):
        features.encode_texts(model, tok, texts, pooling="max")


def test_static_mean_embeddings_and_projection(tiny_encoder):
    model, tok = tiny_encoder
    table = np.asarray(model.bert.embeddings.word_embeddings.embedding[...])
    got = features.static_mean_embeddings(table, tok, ["great movie", ""])
    ids = tok.encode("great movie")
    np.testing.assert_allclose(got[0], table[ids].mean(0), rtol=1e-6)
    np.testing.assert_array_equal(got[1], 0)
    proj = features.random_projection(0, 16, 5)
    np.testing.assert_array_equal(proj, features.random_projection(0, 16, 5))
    assert proj.shape == (16, 5)


def test_hide_corpus_rows_hold_their_own_sentence_first():
    """Row i of hide_corpus is the hidden row whose identity slot is sentence i: with k = 1 the
    clean corpus (m = 0) or its sign-masked copy (m ≥ 1, same absolute values); with k = 4 and
    public rows (inter), sentence i still dominates abs-RSS far above the random baseline,
    and different public sentences change the hiding."""
    rng = np.random.default_rng(0)
    n, d = 100, 16
    reps = rng.normal(size=(n, d)).astype(np.float32)
    labels = rng.integers(0, 2, size=n)
    plain = attacks.hide_corpus(reps, labels, 0, 1, batch=32, seed=1)
    np.testing.assert_array_equal(plain, reps)
    masked = attacks.hide_corpus(reps, labels, 8, 1, batch=32, seed=1)
    np.testing.assert_allclose(np.abs(masked), np.abs(reps))
    assert np.mean(np.sign(masked) != np.sign(reps)) > 0.3
    public = rng.normal(size=(64, d)).astype(np.float32)
    inter = attacks.hide_corpus(reps, labels, 8, 4, batch=32, seed=1, public_reps=public)
    assert inter.shape == reps.shape and np.all(np.isfinite(inter))
    nearest = attacks.nearest_neighbours(np.abs(reps), np.abs(inter))
    assert np.mean(nearest == np.arange(n)) > 0.2          # random: 0.01
    other = attacks.hide_corpus(reps, labels, 8, 4, batch=32, seed=1, public_reps=-public + 1)
    assert not np.allclose(other, inter)
    with pytest.raises(ValueError, match="public rows"):
        attacks.hide_corpus(reps, labels, 8, 4, batch=32, seed=1, public_reps=public[:16])

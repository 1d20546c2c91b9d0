"""Tests for data_pipelines.pretraining: BERT instance creation, masking, datasets, iterator."""

import random

import numpy as np
import pytest

from data_pipelines import datasets, documents, instances, masking, tokenized_corpus
from data_pipelines import tokenization

SPECIAL = tokenization.SpecialTokenIds(pad=0, unk=1, cls=2, sep=3, mask=4)
VOCAB = 1000
# Fake vocab: ids >= 5 with id % 4 == 0 are "##" continuation pieces.
IS_CONT = np.array([i >= 5 and i % 4 == 0 for i in range(VOCAB)])


def make_corpus(num_docs, sentences_per_doc, sentence_len, seed=0, subject=True):
    """A TokenizedCorpus of random word ids (5..VOCAB-1); lengths fixed or (lo, hi) ranges."""
    rng = np.random.default_rng(seed)
    b = tokenized_corpus.CorpusBuilder()
    for d in range(num_docs):
        n_s = (sentences_per_doc if isinstance(sentences_per_doc, int)
               else int(rng.integers(*sentences_per_doc)))
        sents = []
        for _ in range(n_s):
            n = sentence_len if isinstance(sentence_len, int) else int(rng.integers(*sentence_len))
            sents.append(rng.integers(5, VOCAB, size=n).astype(np.int32))
        b.add_document(sents, 1000 + d // 3 if subject else documents.NO_SUBJECT, d)
    return b.build()


# ------------------------------------------------------------------------------------------
# A direct transcription of create_pretraining_data's instance creation on Python lists (the
# algorithm, same random.Random call order), to compare the optimized code with exactly.
# ------------------------------------------------------------------------------------------

def reference_instances(docs, max_seq_length, short_seq_prob, dupe_factor, seed):
    rng = random.Random(seed)
    order = list(range(len(docs)))
    rng.shuffle(order)
    all_docs = [docs[i] for i in order]
    max_num_tokens = max_seq_length - 3
    out = []
    for _ in range(dupe_factor):
        for di in range(len(all_docs)):
            document = all_docs[di]
            target = max_num_tokens
            if rng.random() < short_seq_prob:
                target = rng.randint(2, max_num_tokens)
            chunk, length, i = [], 0, 0
            while i < len(document):
                seg = document[i]
                chunk.append(seg)
                length += len(seg)
                if i == len(document) - 1 or length >= target:
                    if chunk:
                        a_end = 1
                        if len(chunk) >= 2:
                            a_end = rng.randint(1, len(chunk) - 1)
                        a = [t for s in chunk[:a_end] for t in s]
                        b = []
                        if len(chunk) == 1 or rng.random() < 0.5:
                            is_random = True
                            target_b = target - len(a)
                            for _ in range(10):
                                rdi = rng.randint(0, len(all_docs) - 1)
                                if rdi != di:
                                    break
                            rdoc = all_docs[rdi]
                            start = rng.randint(0, len(rdoc) - 1)
                            for j in range(start, len(rdoc)):
                                b.extend(rdoc[j])
                                if len(b) >= target_b:
                                    break
                            i -= len(chunk) - a_end
                            bdoc = order[rdi]
                        else:
                            is_random = False
                            b = [t for s in chunk[a_end:] for t in s]
                            bdoc = order[di]
                        while len(a) + len(b) > max_num_tokens:
                            trunc = a if len(a) > len(b) else b
                            if rng.random() < 0.5:
                                del trunc[0]
                            else:
                                trunc.pop()
                        out.append((a, b, is_random, order[di], bdoc))
                    chunk, length = [], 0
                i += 1
    rng.shuffle(out)
    return out


def corpus_as_lists(corpus):
    docs = []
    for d in range(corpus.num_documents):
        s0, s1 = corpus.doc_offsets[d], corpus.doc_offsets[d + 1]
        docs.append([corpus.tokens[corpus.sentence_offsets[j]:corpus.sentence_offsets[j + 1]]
                     .tolist() for j in range(s0, s1)])
    return docs


@pytest.mark.parametrize("max_seq_length,short_seq_prob,dupe_factor,seed", [
    (128, 0.1, 1, 0), (32, 0.5, 2, 7), (9, 0.0, 1, 3), (64, 1.0, 1, 11)])
def test_instances_match_reference_transcription(max_seq_length, short_seq_prob, dupe_factor,
                                                  seed):
    corpus = make_corpus(60, (1, 12), (1, 40), seed=seed)
    got = instances.create_instances(corpus, instances.InstanceParams(max_seq_length, short_seq_prob,
                                                      dupe_factor, seed), progress=False)
    want = reference_instances(corpus_as_lists(corpus), max_seq_length, short_seq_prob,
                               dupe_factor, seed)
    assert len(got) == len(want) > 0
    for i, (a, b, is_random, doc_a, doc_b) in enumerate(want):
        ga, gb = got.segments(i)
        assert ga.tolist() == a and gb.tolist() == b
        assert bool(got.is_random_next[i]) == is_random
        assert got.doc_index[i] == doc_a and got.b_doc_index[i] == doc_b
        assert got.subject_id[i] == corpus.subject_ids[doc_a]
        assert got.b_subject_id[i] == corpus.subject_ids[doc_b]
        assert got.doc_key[i] == corpus.doc_keys[doc_a] and got.b_doc_key[i] == doc_b


def test_instance_statistics_follow_bert_recipe():
    """Lengths, NSP rate, short-sequence rate and segment structure on a fixed corpus."""
    # 2000 documents of 60 five-token sentences: a full-target (125-token) chunk is exactly 25
    # sentences, so every document with the full target has instances of length 125, and a
    # document with a short target t <= 120 has none.
    corpus = make_corpus(2000, 60, 5, seed=1)
    inst = instances.create_instances(corpus, instances.InstanceParams(128, 0.1, 1, 42), progress=False)
    lengths = inst.lengths
    assert lengths.max() == 125 and lengths.min() >= 2
    a_len = np.asarray(inst.a_lengths)
    assert (a_len >= 1).all() and (lengths - a_len >= 1).all()
    # NSP: a fair coin, except that a one-sentence chunk is always "random" (as in BERT), which
    # lifts the overall rate a little. Instances whose A has >= 2 sentences (>= 10 tokens here;
    # truncation never cuts such an A below 10) come from chunks of >= 2 sentences: exactly the
    # coin.
    assert 0.5 < inst.is_random_next.mean() < 0.58
    two_plus = np.asarray(inst.a_lengths) >= 10
    assert two_plus.sum() > 7000
    coin = inst.is_random_next[two_plus].mean()
    assert abs(coin - 0.5) < 4.5 * np.sqrt(0.25 / two_plus.sum()), coin
    assert (inst.b_doc_index[inst.is_random_next] != inst.doc_index[inst.is_random_next]).all()
    assert (inst.b_doc_index[~inst.is_random_next] == inst.doc_index[~inst.is_random_next]).all()
    # short_seq_prob: a non-random instance has the length of its whole chunk, 125 for a full
    # target and <= 120 for a short target t <= 120 (t ~ U{2..125}). So the count of
    # non-random length-125 instances shrinks by the factor 1 - 0.1 * 119/124 = 0.904 against
    # short_seq_prob = 0 (measured over 8 seeds: 0.905 +- 0.013; ignoring the option gives 1).
    def full_chunks(p, seed):
        x = instances.create_instances(corpus, instances.InstanceParams(128, p, 1, seed), progress=False)
        return np.sum((x.lengths == 125) & ~x.is_random_next)

    ratio = full_chunks(0.1, 42) / full_chunks(0.0, 43)
    assert abs(ratio - (1 - 0.1 * 119 / 124)) < 0.05, ratio


def test_create_instances_deterministic_and_seed_dependent():
    corpus = make_corpus(50, (2, 10), (3, 30))
    p = instances.InstanceParams(64, 0.1, 2, 5)
    a = instances.create_instances(corpus, p, progress=False)
    b = instances.create_instances(corpus, p, progress=False)
    c = instances.create_instances(corpus, instances.InstanceParams(64, 0.1, 2, 6), progress=False)
    for name in instances.Instances._ARRAYS:
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name))
    assert len(a) != len(c) or not np.array_equal(a.tokens, c.tokens)


def test_instances_save_load_roundtrip(tmp_path):
    inst = instances.create_instances(make_corpus(20, (2, 6), (3, 20)), instances.InstanceParams(32),
                              progress=False)
    inst.save(tmp_path / "x")
    for mmap in (True, False):
        back = instances.Instances.load(tmp_path / "x", mmap=mmap)
        for name in instances.Instances._ARRAYS:
            np.testing.assert_array_equal(getattr(back, name), getattr(inst, name))
    (tmp_path / "x" / "offsets.npy").unlink()
    with pytest.raises(FileNotFoundError, match="offsets.npy"):
        instances.Instances.load(tmp_path / "x")


def test_create_instances_bad_input():
    with pytest.raises(ValueError, match="no document"):
        instances.create_instances(tokenized_corpus.CorpusBuilder().build(), instances.InstanceParams(), progress=False)
    with pytest.raises(ValueError, match="max_seq_length"):
        instances.create_instances(make_corpus(3, 2, 3), instances.InstanceParams(max_seq_length=4),
                           progress=False)
    with pytest.raises(ValueError, match="dupe_factor"):
        instances.create_instances(make_corpus(3, 2, 3), instances.InstanceParams(dupe_factor=0),
                           progress=False)


# ------------------------------------------------------------------------------------------
# Masking
# ------------------------------------------------------------------------------------------

def make_dataset(num_docs=400, seq=128, wwm=False, seed=0, max_pred=20):
    corpus = make_corpus(num_docs, (2, 30), (3, 25), seed=seed)
    inst = instances.create_instances(corpus, instances.InstanceParams(seq, 0.1, 1, seed), progress=False)
    params = masking.MaskingParams(seq, max_pred, 0.15, wwm)
    return datasets.PretrainingDataset(inst, params, special=SPECIAL, vocab_size=VOCAB,
                                is_continuation=IS_CONT, seed=seed)


def unmasked_sequences(ds, indices):
    """The [CLS] A [SEP] B [SEP] sequences before masking."""
    out = []
    for i in indices:
        a, b = ds.instances.segments(int(i))
        out.append(np.concatenate([[SPECIAL.cls], a, [SPECIAL.sep], b, [SPECIAL.sep]]))
    return out


@pytest.mark.parametrize("wwm", [False, True])
def test_feature_layout_and_masking_invariants(wwm):
    ds = make_dataset(wwm=wwm)
    idx = np.arange(ds.num_examples)
    batch = ds.get_batch(idx, step=3)
    S = 128
    assert batch["input_ids"].shape == (len(idx), S) and batch["input_ids"].dtype == np.int32
    assert batch["masked_lm_weights"].dtype == np.float32
    assert batch["next_sentence_labels"].shape == (len(idx),)
    assert set(batch) == set(datasets.FEATURE_KEYS)
    for r, seq in enumerate(unmasked_sequences(ds, idx)):
        n = len(seq)
        len_a = int(ds.instances.a_lengths[r])
        ids = batch["input_ids"][r]
        np.testing.assert_array_equal(batch["input_mask"][r], (np.arange(S) < n).astype(int))
        np.testing.assert_array_equal(
            batch["segment_ids"][r], ((np.arange(S) >= len_a + 2) & (np.arange(S) < n)))
        assert (ids[n:] == 0).all()
        k = int(batch["masked_lm_weights"][r].sum())
        pos = batch["masked_lm_positions"][r][:k]
        want_k = masking.num_to_predict(n, ds.masking)
        if wwm:
            assert 1 <= k <= want_k
        else:
            assert k == want_k
        assert (np.diff(pos) > 0).all(), "positions sorted and distinct"
        assert not np.isin(pos, [0, len_a + 1, n - 1]).any(), "never [CLS]/[SEP]"
        np.testing.assert_array_equal(batch["masked_lm_ids"][r][:k], seq[pos])
        assert (batch["masked_lm_positions"][r][k:] == 0).all()
        assert (batch["masked_lm_ids"][r][k:] == 0).all()
        assert (batch["masked_lm_weights"][r][k:] == 0).all()
        # Unmasked positions keep their token; [CLS]/[SEP] where they belong.
        untouched = np.setdiff1d(np.arange(n), pos)
        np.testing.assert_array_equal(ids[untouched], seq[untouched])
        assert ids[0] == SPECIAL.cls and ids[len_a + 1] == SPECIAL.sep and ids[n - 1] == SPECIAL.sep
        assert batch["next_sentence_labels"][r] == int(ds.instances.is_random_next[r])
        if wwm:
            # Every word (start piece + following ## pieces, within a segment) is masked whole.
            masked = np.zeros(n, bool)
            masked[pos] = True
            for seg_start, seg_end in ((1, 1 + len_a), (len_a + 2, n - 1)):
                word_start = seg_start
                for p in range(seg_start + 1, seg_end + 1):
                    if p == seg_end or not IS_CONT[seq[p]]:
                        assert len(set(masked[word_start:p])) == 1, (r, word_start, p)
                        word_start = p


def test_masking_rates_80_10_10():
    ds = make_dataset(num_docs=1500)
    idx = np.arange(ds.num_examples)
    batch = ds.get_batch(idx, step=0)
    seqs = unmasked_sequences(ds, idx)
    w = batch["masked_lm_weights"] > 0
    orig = batch["masked_lm_ids"][w]
    now = np.take_along_axis(batch["input_ids"], batch["masked_lm_positions"], axis=1)[w]
    m = len(orig)
    assert m > 50_000
    frac_mask = np.mean(now == SPECIAL.mask)
    frac_same = np.mean(now == orig)
    frac_random = 1 - frac_mask - frac_same
    tol = 5 * np.sqrt(0.09 / m)
    # A random replacement equals the original with prob. 1/V; it is [MASK] with prob. 1/V.
    assert abs(frac_mask - (0.8 + 0.1 / VOCAB)) < tol
    assert abs(frac_same - (0.1 + 0.1 / VOCAB)) < tol
    assert abs(frac_random - 0.1 * (1 - 2 / VOCAB)) < tol
    # Random replacements are uniform over the whole vocab (mean and spread of the ids).
    rnd = now[(now != SPECIAL.mask) & (now != orig)]
    assert abs(rnd.mean() - (VOCAB - 1) / 2) < 5 * VOCAB / np.sqrt(12 * len(rnd))
    assert rnd.min() < 20 and rnd.max() > VOCAB - 20
    # Overall rate: masked / real tokens, about 15 %.
    n_tokens = sum(len(s) for s in seqs)
    assert abs(w.sum() / n_tokens - 0.15) < 0.01
    # Positions are uniform over the candidates: the relative position of masks is ~U(0, 1).
    rel = []
    for r in range(0, len(idx), 7):
        k = int(w[r].sum())
        rel.extend(batch["masked_lm_positions"][r][:k] / len(seqs[r]))
    assert abs(np.mean(rel) - 0.5) < 0.02


def test_num_to_predict_formula():
    p = masking.MaskingParams(max_seq_length=512, max_predictions_per_seq=20, masked_lm_prob=0.15)
    assert masking.num_to_predict(5, p) == 1          # max(1, round(0.75))
    assert masking.num_to_predict(10, p) == 2          # round(1.5) = 2 (half to even)
    assert masking.num_to_predict(30, p) == 4          # round(4.5) = 4 (half to even, as Python 3)
    assert masking.num_to_predict(128, p) == 19
    assert masking.num_to_predict(512, p) == 20        # capped


def test_get_batch_deterministic_and_independent_of_batch_and_host():
    ds = make_dataset()
    idx = np.random.default_rng(0).choice(ds.num_examples, 64, replace=False)
    full = ds.get_batch(idx, step=17)
    again = ds.get_batch(idx, step=17)
    perm = np.random.default_rng(1).permutation(64)
    permuted = ds.get_batch(idx[perm], step=17)
    # Four hosts, each loading its contiguous slice.
    hosts = [ds.get_batch(idx[h * 16:(h + 1) * 16], step=17) for h in range(4)]
    single = [ds.get_batch(idx[i:i + 1], step=17) for i in (0, 33)]
    other_step = ds.get_batch(idx, step=18)
    for k in datasets.FEATURE_KEYS:
        np.testing.assert_array_equal(full[k], again[k])
        np.testing.assert_array_equal(full[k][perm], permuted[k])
        np.testing.assert_array_equal(full[k], np.concatenate([h[k] for h in hosts]))
        np.testing.assert_array_equal(full[k][[0, 33]], np.concatenate([s[k] for s in single]))
    # A new step re-masks (almost every example changes).
    changed = (full["masked_lm_positions"] != other_step["masked_lm_positions"]).any(axis=1)
    assert changed.mean() > 0.9
    # A different dataset seed re-masks too.
    ds2 = make_dataset()
    ds2.seed = 1
    assert not np.array_equal(ds2.get_batch(idx, step=17)["input_ids"], full["input_ids"])


def test_get_batch_bad_indices():
    ds = make_dataset(num_docs=30)
    with pytest.raises(IndexError, match="out of range"):
        ds.get_batch(np.array([0, ds.num_examples]), step=0)
    with pytest.raises(IndexError, match="out of range"):
        ds.get_batch(np.array([-1]), step=0)
    with pytest.raises(ValueError, match="1-D"):
        ds.get_batch(np.zeros([2, 2], int), step=0)
    with pytest.raises(ValueError, match=">= 0"):
        ds.get_batch(np.array([0]), step=-1)
    assert ds.get_batch(np.array([], np.int64), step=0)["input_ids"].shape == (0, 128)


def test_dataset_rejects_instances_longer_than_max_seq_length():
    inst = instances.create_instances(make_corpus(10, 5, 20), instances.InstanceParams(128), progress=False)
    with pytest.raises(ValueError, match="max_seq_length"):
        datasets.PretrainingDataset(inst, masking.MaskingParams(max_seq_length=64), special=SPECIAL,
                             vocab_size=VOCAB)


# ------------------------------------------------------------------------------------------
# Prefetching
# ------------------------------------------------------------------------------------------

def test_prefetch_keeps_order_raises_errors_and_stops_early():
    assert list(datasets.prefetch(lambda x: x * x, 3, 50, buffer_size=3)) == [
        x * x for x in range(3, 50)]
    assert list(datasets.prefetch(lambda x: x, 5, 5)) == []

    def boom(x):
        if x == 5:
            raise RuntimeError("bad item 5")
        return x

    with pytest.raises(RuntimeError, match="bad item 5"):
        list(datasets.prefetch(boom, 0, 10))
    computed = []

    def record(x):
        computed.append(x)
        return x

    it = datasets.prefetch(record, 0, 10**9, buffer_size=2)
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    # Bounded read-ahead: a few items beyond what was consumed, not the whole range.
    assert len(computed) <= 3 + 2 + 2
    del it

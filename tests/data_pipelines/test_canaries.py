"""Tests for data_pipelines.canaries (secret-sharer canaries)."""

import numpy as np
import pytest
from scipy import stats

from data_pipelines import canaries, datasets, instances, masking, tokenization, tokenized_corpus


@pytest.fixture(scope="module")
def tok(notes_vocab):
    return tokenization.WordPieceTokenizer(notes_vocab)


def small_corpus(num_docs=200, seed=0):
    rng = np.random.default_rng(seed)
    b = tokenized_corpus.CorpusBuilder()
    for d in range(num_docs):
        sents = [rng.integers(5, 1000, size=int(rng.integers(1, 20))).astype(np.int32)
                 for _ in range(int(rng.integers(1, 30)))]
        b.add_document(sents, 7000 + d, 500 + d)
    return b.build()


def sentences_of(corpus, d):
    s0, s1 = corpus.doc_offsets[d], corpus.doc_offsets[d + 1]
    return [corpus.tokens[corpus.sentence_offsets[j]:corpus.sentence_offsets[j + 1]].tolist()
            for j in range(s0, s1)]


def test_forms_secrets_and_candidates(tok):
    cs = canaries.make_canaries(tok, repetitions=(1, 5, 50), canaries_per_setting=2, seed=3)
    assert len(cs) == 3 * 3 * 2
    cand = set(canaries.secret_candidates(tok).tolist())
    generic = {i for _, i in canaries.generic_word_ids(tok)}
    assert len({c.secret_id for c in cs}) == len(cs), "secrets are distinct"
    for c in cs:
        assert len(c.tokens) == len(c.form) == len(c.token_ids)
        assert c.tokens[c.secret_position] == c.secret == tok.vocab[c.secret_id]
        assert c.form[c.secret_position] == "S" and c.form.count("S") == 1
        assert c.secret_id in cand and c.secret_id not in generic
        for sym, t in zip(c.form, c.token_ids):
            assert (t in generic) == (sym == "H")
        # The canary text tokenizes to exactly its pieces: the secret is one vocab piece.
        assert tok.encode(c.text).tolist() == c.token_ids
    # Seeded.
    again = canaries.make_canaries(tok, repetitions=(1, 5, 50), canaries_per_setting=2, seed=3)
    assert [c.token_ids for c in again] == [c.token_ids for c in cs]
    other = canaries.make_canaries(tok, repetitions=(1, 5, 50), canaries_per_setting=2, seed=4)
    assert [c.token_ids for c in other] != [c.token_ids for c in cs]


def test_bad_canary_settings(tok):
    with pytest.raises(ValueError, match="unknown canary form 'SS'"):
        canaries.make_canaries(tok, forms=("SS",))
    with pytest.raises(ValueError, match="repetitions must be >= 0"):
        canaries.make_canaries(tok, repetitions=(-1,))
    with pytest.raises(ValueError, match="fewer than"):
        canaries.make_canaries(tok, canaries_per_setting=100_000)


def test_insertion_positions_recorded_and_text_preserved(tok):
    corpus = small_corpus()
    cs = canaries.make_canaries(tok, repetitions=(1, 7, 40), seed=1)
    planted = canaries.insert_canaries(corpus, cs, seed=11)
    assert planted.num_documents == corpus.num_documents
    assert planted.num_sentences == corpus.num_sentences + sum(c.repetitions for c in cs)
    np.testing.assert_array_equal(planted.subject_ids, corpus.subject_ids)
    np.testing.assert_array_equal(planted.doc_keys, corpus.doc_keys)
    recorded = {}
    for c in cs:
        assert len(c.insertions) == c.repetitions
        for ins in c.insertions:
            assert ins["doc_key"] == corpus.doc_keys[ins["doc_index"]]
            recorded[(ins["doc_index"], ins["sentence_index"])] = c.token_ids
    for d in range(corpus.num_documents):
        sents = sentences_of(planted, d)
        at = {j for (dd, j) in recorded if dd == d}
        for j in at:
            assert sents[j] == recorded[(d, j)]
        # Removing the canary sentences gives back the original document.
        assert [s for j, s in enumerate(sents) if j not in at] == sentences_of(corpus, d)
    # Same seed -> same placement; another seed -> another.
    cs2 = canaries.make_canaries(tok, repetitions=(1, 7, 40), seed=1)
    planted2 = canaries.insert_canaries(corpus, cs2, seed=11)
    np.testing.assert_array_equal(planted2.tokens, planted.tokens)
    cs3 = canaries.make_canaries(tok, repetitions=(1, 7, 40), seed=1)
    canaries.insert_canaries(corpus, cs3, seed=12)
    assert [c.insertions for c in cs3] != [c.insertions for c in cs]


def test_placement_is_uniform_over_sentence_slots(tok):
    """Chi-square: plantings per document are proportional to its n + 1 sentence slots."""
    corpus = small_corpus(num_docs=60, seed=2)
    (c,) = canaries.make_canaries(tok, forms=("HS",), repetitions=(30_000,), seed=0)
    canaries.insert_canaries(corpus, [c], seed=5)
    counts = np.bincount([i["doc_index"] for i in c.insertions], minlength=60)
    slots = np.diff(corpus.doc_offsets) + 1
    expected = slots / slots.sum() * c.repetitions
    assert stats.chisquare(counts, expected).pvalue > 1e-4
    # The test has power: uniform-over-documents placement is rejected.
    assert stats.chisquare(counts, np.full(60, c.repetitions / 60)).pvalue < 1e-10
    # Within a document, every slot (0..n) is used.
    big = int(np.argmax(slots))
    used = {i["sentence_index"] for i in c.insertions if i["doc_index"] == big}
    assert 0 in used


def test_canary_file_roundtrip(tmp_path, tok):
    cs = canaries.make_canaries(tok, seed=2)
    canaries.insert_canaries(small_corpus(), cs, seed=3)
    path = tmp_path / "sub" / "canaries.json"
    canaries.write_canary_file(path, cs, tok, seed=3, extra={"note": "x"})
    back, record = canaries.load_canary_file(path)
    assert [c.to_json() for c in back] == [c.to_json() for c in cs]
    assert record["num_candidates"] == len(record["candidate_ids"]) > 100
    assert record["vocab_fingerprint"] == tokenization.vocab_fingerprint(tok.vocab_file)
    assert record["note"] == "x"
    assert all(c.secret_id in record["candidate_ids"] for c in back)


def test_reference_canaries_are_never_planted(tok):
    corpus = small_corpus()
    cs = canaries.make_canaries(tok, repetitions=(0, 5), canaries_per_setting=2, seed=4)
    assert sorted(c.repetitions for c in cs) == [0] * 6 + [5] * 6
    planted = canaries.insert_canaries(corpus, cs, seed=1)
    assert planted.num_sentences == corpus.num_sentences + 6 * 5
    for c in cs:
        assert len(c.insertions) == c.repetitions
    # Reference secrets are distinct from the planted ones (same draw without replacement).
    assert len({c.secret_id for c in cs}) == len(cs)


def test_example_placement_appends_whole_examples(tok):
    corpus = small_corpus()
    base = instances.create_instances(corpus, instances.InstanceParams(max_seq_length=64),
                                        progress=False)
    cs = canaries.make_canaries(tok, repetitions=(0, 1, 3), seed=5)
    for c in cs[:6]:
        c.placement = "example"
    # Example-placed canaries are no sentences of the documents.
    planted_corpus = canaries.insert_canaries(corpus, cs, seed=2)
    assert planted_corpus.num_sentences == corpus.num_sentences + sum(
        c.repetitions for c in cs[6:])
    out = canaries.append_canary_examples(base, cs)
    n = len(base)
    assert len(out) == n + sum(c.repetitions for c in cs[:6])
    # The corpus's own examples are untouched.
    for i in (0, n // 2, n - 1):
        for x, y in zip(out.segments(i), base.segments(i)):
            np.testing.assert_array_equal(x, y)
    for c in cs[:6]:
        assert len(c.insertions) == c.repetitions
        for ins in c.insertions:
            a, b = out.segments(ins["example_index"])
            assert a.tolist() + b.tolist() == c.token_ids
            assert len(a) == (len(c.token_ids) + 1) // 2 and len(b) >= 1
            assert not out.is_random_next[ins["example_index"]]
            assert out.doc_index[ins["example_index"]] == -1
    # They load as ordinary examples: [CLS] A [SEP] B [SEP].
    ds = datasets.PretrainingDataset(out, masking.MaskingParams(max_seq_length=64),
                                        special=tok.special, vocab_size=tok.vocab_size)
    i = cs[5].insertions[0]["example_index"]
    row = ds.get_batch(np.asarray([i]), step=0)
    ids = row["input_ids"][0]
    k = len(cs[5].token_ids)
    assert ids[0] == tok.special.cls and ids[k + 2] == tok.special.sep
    # Positions that were masked hold their original ids in masked_lm_ids.
    restored = ids.copy()
    w = row["masked_lm_weights"][0] > 0
    restored[row["masked_lm_positions"][0][w]] = row["masked_lm_ids"][0][w]
    a_len = (k + 1) // 2
    assert restored[1:1 + a_len].tolist() + restored[2 + a_len:k + 2].tolist() == cs[5].token_ids


def test_canary_file_checks(tmp_path, tok):
    cs = canaries.make_canaries(tok, seed=2)
    cs[0].placement = "example"
    path = tmp_path / "c.json"
    canaries.write_canary_file(path, cs, tok, seed=0)
    back, _ = canaries.load_canary_file(path)
    assert back[0].placement == "example" and back[1].placement == "sentence"
    import json
    record = json.loads(path.read_text())
    record["canaries"][1]["placement"] = "document"
    path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match=r"c\.json: canary #1: placement \(8 characters: "
                                         r"letters\) is not one of"):
        canaries.load_canary_file(path)
    record["canaries"][1]["placement"] = "sentence"
    record["canaries"][1]["secret_id"] += 1
    path.write_text(json.dumps(record))
    with pytest.raises(ValueError, match="disagree"):
        canaries.load_canary_file(path)

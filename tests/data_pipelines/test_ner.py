"""NER data: the i2b2-shaped generator, CoNLL files, first-WordPiece labels and windows, folds."""

import string

import numpy as np
import pytest

from data_pipelines import ner, synthetic_ner, tokenization
from data_pipelines.classification import DataError
from data_pipelines import ner_metrics


@pytest.fixture(scope="module")
def docs():
    return synthetic_ner.generate_i2b2_like(12, seed=3)


@pytest.fixture(scope="module")
def char_tokenizer(tmp_path_factory):
    """A vocab of a few whole words plus single characters and ##characters, so most words
    split into several WordPieces."""
    chars = string.ascii_lowercase + string.digits + string.punctuation
    words = ["the", "was", "with", "and", "she", "he", "for", "showed"]
    vocab = (["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words + list(chars)
             + [f"##{c}" for c in chars])
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(vocab) + "\n")
    return tokenization.WordPieceTokenizer(path)


# ----------------------------------------------------------------------------- generator


def test_generator_is_deterministic_and_i2b2_shaped(docs):
    again = synthetic_ner.generate_i2b2_like(12, seed=3)
    assert again == docs
    assert synthetic_ner.generate_i2b2_like(5, seed=3) == docs[:5]     # note i does not depend on n
    assert synthetic_ner.generate_i2b2_like(12, seed=4) != docs
    assert len(synthetic_ner.generate_i2b2_like()) == 170
    assert ner.tag_names(docs) == ner.I2B2_TAGS
    counts = ner.entity_counts(docs)
    # i2b2-2010: problem 7,073 > treatment 4,844 ~ test 4,608 (170 notes); same order here.
    assert counts["problem"] > counts["test"] > 0 and counts["problem"] > counts["treatment"] > 0
    assert 40 < sum(counts.values()) / len(docs) < 160
    for d in docs:
        for s in d.sentences:
            assert s.words and all(w and not any(c.isspace() for c in w) for w in s.words)
            # Gold spans always open with B-: no I- after O or after another type.
            for prev, cur in zip(("O",) + s.tags, s.tags):
                if cur.startswith("I-"):
                    assert prev[2:] == cur[2:], s
    # The same word in different roles: context matters.
    roles = {}
    for d in docs:
        for s in d.sentences:
            for w, t in zip(s.words, s.tags):
                roles.setdefault(w.lower(), set()).add(t[2:] or "O")
    assert sum(len(r) > 1 for r in roles.values()) >= 5


# ----------------------------------------------------------------------------- CoNLL files


def test_conll_round_trip_and_layouts(tmp_path, docs):
    path = tmp_path / "notes.conll"
    assert ner.write_conll(path, docs) == 12
    back = ner.read_conll(path, tags=ner.I2B2_TAGS)
    assert [d.sentences for d in back] == [d.sentences for d in docs]
    assert back[0].doc_id == "notes.conll#0"
    # CoNLL-2003's four columns, tabs, no -DOCSTART-: one document per file.
    other = tmp_path / "a.txt"
    other.write_text("EU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\nPeter\tB-PER\nBlackburn\tI-PER\n")
    (d,) = ner.read_conll([other])
    assert d.doc_id == "a.txt" and len(d.sentences) == 2
    assert d.sentences[1] == ner.Sentence(("Peter", "Blackburn"), ("B-PER", "I-PER"))
    assert ner.tag_names([d]) == ("O", "B-ORG", "B-PER", "I-PER")


@pytest.mark.parametrize("content,match", [
    ("", r"x\.conll: no sentences"),
    ("-DOCSTART- O\n\n", "no sentences"),
    ("fever B-problem\nsecretword\n", r"x\.conll:2: expected 'token<space or TAB>tag'"),
    ("fever B-problem\nsecretword X-problem\n",
     r"x\.conll:2:12: tag \(9 characters: letters, punctuation\) is not 'O'"),
    ("fever B-problem\nsecretword B-drug\n",
     r"x\.conll:2:12: tag \(6 characters: letters, punctuation\) is not in the tag set "
     r"\['B-problem'"),
    # A name left untagged, a note given as CoNLL: the "tag" is a word, never echoed.
    ("fever B-problem\nMr secretword\n", r"x\.conll:2:4: tag \(10 characters: letters\) is not"),
])
def test_conll_errors_name_the_line_not_the_word(tmp_path, content, match):
    path = tmp_path / "x.conll"
    path.write_text(content)
    with pytest.raises(DataError, match=match) as e:
        ner.read_conll(path, tags=ner.I2B2_TAGS)
    assert "secretword" not in str(e.value)


# ----------------------------------------------------------------------------- features


@pytest.mark.parametrize("unit,max_len,stride", [("sentence", 128, 64), ("sentence", 12, 4),
                                                 ("document", 40, 16)])
def test_first_wordpiece_labels_round_trip_to_word_tags(docs, char_tokenizer, unit, max_len,
                                                        stride):
    enc = ner.encode_documents(docs, char_tokenizer, ner.I2B2_TAGS, max_seq_len=max_len,
                               stride=stride, unit=unit)
    f = enc.features
    assert f["input_ids"].shape[1] == max_len and all(v.dtype == np.int32 for v in f.values())
    assert enc.num_words == sum(d.num_words for d in docs)
    # Labels back to words: exactly the documents' tags; entity F1 against them is 1.
    words = ner.word_predictions(f["labels"], enc)
    assert words == ner.gold_tags(docs)
    assert ner_metrics.entity_f1(ner.sentences_of(ner.gold_tags(docs)),
                                 ner.sentences_of(words))["f1"] == 1.0
    # Each word is scored once, at a labelled (first) piece.
    scored = enc.word_index >= 0
    assert np.array_equal(np.sort(enc.word_index[scored]), np.arange(enc.num_words))
    assert np.all(f["labels"][scored] != ner.IGNORE_LABEL)
    # Specials and padding are never labelled; most words have more than one piece here.
    sp = char_tokenizer.special
    special = np.isin(f["input_ids"], [sp.cls, sp.sep, sp.pad])
    assert np.all(f["labels"][special] == ner.IGNORE_LABEL)
    labelled = (f["labels"] != ner.IGNORE_LABEL).sum()
    assert (~special).sum() > 2 * labelled
    # Windows of one unit agree on each piece (same example_id + position_ids -> same token).
    seen = {}
    for row in range(len(f["input_ids"])):
        for col in np.flatnonzero(~special[row]):
            k = (int(f["example_id"][row]), int(f["position_ids"][row, col]))
            assert seen.setdefault(k, f["input_ids"][row, col]) == f["input_ids"][row, col]
    if max_len < 128:
        assert len(f["input_ids"]) > len(set(f["example_id"].tolist()))   # some units windowed
    else:   # rows are whole sentences: rebuild them word by word
        tag_id = {t: i for i, t in enumerate(ner.I2B2_TAGS)}
        for row, sentence in enumerate(docs[0].sentences[:12]):
            ids, labels = [sp.cls], [ner.IGNORE_LABEL]
            for w, t in zip(sentence.words, sentence.tags):
                pieces = char_tokenizer.encode(w).tolist()
                ids += pieces
                labels += [tag_id[t]] + [ner.IGNORE_LABEL] * (len(pieces) - 1)
            n = len(ids)
            np.testing.assert_array_equal(f["input_ids"][row, :n + 1], ids + [sp.sep])
            np.testing.assert_array_equal(f["labels"][row, :n], labels)


def test_windows_and_max_context(char_tokenizer):
    # One sentence of 20 one-piece words ("a".."t"), windows of 8 pieces every 4.
    words = tuple(string.ascii_lowercase[:20])
    tags = tuple("B-test" if i % 3 == 0 else "O" for i in range(20))
    doc = ner.Document("d", (ner.Sentence(words, tags),))
    enc = ner.encode_documents([doc], char_tokenizer, ner.I2B2_TAGS, max_seq_len=10, stride=4)
    assert ner._windows(20, 8, 4) == [0, 4, 8, 12]
    np.testing.assert_array_equal(enc.features["position_ids"][:, 1:9],
                                  [np.arange(s, s + 8) for s in (0, 4, 8, 12)])
    # Word 5 sits at offset 1 of window 1 (context 1) and offset 5 of window 0 (context 2)...
    # best context: window 0 (min(5, 2) = 2) vs window 1 (min(1, 6) = 1).
    owner = {int(w): r for r, c in zip(*np.nonzero(enc.word_index >= 0))
             for w in [enc.word_index[r, c]]}
    assert owner[5] == 0 and owner[6] == 1 and owner[19] == 3 and owner[0] == 0
    with pytest.raises(ValueError, match="stride"):
        ner.encode_documents([doc], char_tokenizer, ner.I2B2_TAGS, max_seq_len=10, stride=9)
    bad = ner.Document("d", (ner.Sentence(("a",), ("B-drug",)),))
    with pytest.raises(DataError, match=r"document d, sentence 1: tag \(6 characters: letters, punctuation\) is not "
                                     r"one of the 7 tags"):
        ner.encode_documents([bad], char_tokenizer, ner.I2B2_TAGS)
    with pytest.raises(ValueError, match="no prediction"):
        pred = np.where(enc.word_index >= 0, 0, 0)
        enc2 = ner.NerFeatures(enc.features, np.where(enc.word_index == 3, -1, enc.word_index),
                               enc.sentence_lengths, enc.tag_names)
        ner.word_predictions(pred, enc2)


def test_kfold_by_document():
    docs = synthetic_ner.generate_i2b2_like(170, seed=0)
    folds = ner.kfold_documents(docs, 5, seed=0)
    tests = [t for _, t in folds]
    assert all(20 <= len(t) <= 50 for t in tests)  # balanced in expectation (34)
    assert np.array_equal(np.sort(np.concatenate(tests)), np.arange(170))
    for train, test in folds:
        assert len(train) + len(test) == 170 and not set(train) & set(test)
    again = ner.kfold_documents(docs, 5, seed=0)
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(folds, again))
    other = ner.kfold_documents(docs, 5, seed=1)
    assert not all(np.array_equal(a[1], b[1]) for a, b in zip(folds, other))
    # A document's fold is a function of its content: removing one document moves no other
    # between train and test (the held-out split of a neighbouring corpus).
    for drop in (0, 85, 169):
        rest = docs[:drop] + docs[drop + 1:]
        smaller = ner.kfold_documents(rest, 5, seed=0)
        for (_, test), (_, test_rest) in zip(folds, smaller):
            want = [docs[i].doc_id for i in test if i != drop]
            assert [rest[i].doc_id for i in test_rest] == want
    with pytest.raises(ValueError, match="cannot be split"):
        ner.kfold_documents(docs[:3], 5)
    with pytest.raises(ValueError, match="k must be"):
        ner.kfold_documents(docs, 1)
    with pytest.raises(ValueError, match="empty"):
        ner.kfold_documents(docs[:6], 5)




def test_document_overlap_counts_documents_with_the_same_words(docs):
    retagged = ner.Document("x", tuple(ner.Sentence(s.words, ("O",) * len(s.words))
                                       for s in docs[1].sentences))
    assert ner.document_overlap(docs[:4], [docs[0], retagged, docs[5]]) == 2
    assert ner.document_overlap(docs[:4], docs[4:]) == 0


def test_a_file_without_docstart_is_said_to_be_one_document(tmp_path, caplog):
    """Issue 35: no -DOCSTART- line made the whole file ONE document (one example, one privacy
    unit) silently, and the run failed with "expected_batch_size=8 exceeds the 1 training
    examples"; a lower-cased `-docstart- O` was read as a word tagged O."""
    import logging

    body = "fever B-problem\n. O\n\naspirin B-treatment\n. O\n\n"
    plain = tmp_path / "plain.conll"
    plain.write_text(body * 3)
    with caplog.at_level(logging.WARNING):
        (doc,) = ner.read_conll(plain)
    assert len(doc.sentences) == 6
    assert [r.getMessage() for r in caplog.records] == [
        f"{plain}: no -DOCSTART- line, so the whole file (6 sentences) is ONE document: one "
        "example and one privacy unit (a fine-tuning unit is a document); put a '-DOCSTART- O' "
        "line before each document"]
    with pytest.raises(DataError, match=r"plain\.conll: no -DOCSTART- line, .*; at least 2 "
                                        r"documents are needed, 1 found"):
        ner.read_conll(plain, min_documents=2)
    lower = tmp_path / "lower.conll"
    lower.write_text(("-docstart- O\n\n" + body) * 3)
    docs = ner.read_conll(lower, min_documents=2)
    assert len(docs) == 3 and all("-docstart-" not in s.words for d in docs for s in d.sentences)
    assert docs[2].doc_id == "lower.conll#2"
    with pytest.raises(ValueError, match="document separator"):
        ner.write_conll(tmp_path / "w.conll", [ner.Document("d", (ner.Sentence(
            ("-DocStart-",), ("O",)),))])


def test_the_synthetic_set_cli_writes_a_conll_file(tmp_path, capsys):
    out = tmp_path / "synthetic.conll"
    synthetic_ner.main(["--num_notes=3", "--seed=1", f"--out={out}"])
    assert "wrote 3 notes" in capsys.readouterr().out
    assert [d.sentences for d in ner.read_conll(out)] == \
        [d.sentences for d in synthetic_ner.generate_i2b2_like(3, seed=1)]

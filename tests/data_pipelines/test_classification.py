"""Classification TSVs -> features: layout, BERT truncation, transformers parity, bad input."""

import json

import numpy as np
import pytest

from data_pipelines import classification as clf
from data_pipelines import tokenization

SECRET = "private patient said xyzzy"


@pytest.fixture()
def vocab(tmp_path):
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "good", "bad", "movie", "very",
             "not", "a", "the", ".", "##s", "film"]
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join(words) + "\n")
    return path


@pytest.fixture()
def tok(vocab):
    return tokenization.WordPieceTokenizer(vocab)


def write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


def test_single_sentence_features(tmp_path, tok):
    f = write(tmp_path / "t.tsv", "label\tsentence\n1\tgood movie .\n0\tvery bad films\n\n"
                                  "1\tthe good , the bad\n")
    rows = clf.read_tsv(f)
    assert [r.line for r in rows] == [2, 3, 5]   # header and blank line skipped
    labels = clf.LabelMap.from_rows(rows)
    feats = clf.build_features(rows, tok, labels, f, max_seq_len=6)
    assert labels.names == ("0", "1")
    np.testing.assert_array_equal(feats["label"], [1, 0, 1])
    np.testing.assert_array_equal(feats["example_id"], [0, 1, 2])
    # [CLS] good movie . [SEP] [PAD] ; "films" -> film ##s ; "," is [UNK]; truncated to 4 pieces.
    np.testing.assert_array_equal(feats["input_ids"], [[2, 5, 7, 12, 3, 0],
                                                       [2, 8, 6, 14, 13, 3],
                                                       [2, 11, 5, 1, 11, 3]])
    np.testing.assert_array_equal(feats["input_mask"], [[1, 1, 1, 1, 1, 0], [1] * 6, [1] * 6])
    assert not feats["segment_ids"].any()
    assert all(v.dtype == np.int32 for v in feats.values())


def test_sentence_pair_features_and_bert_truncation(tmp_path, tok):
    f = write(tmp_path / "p.tsv", "a\tgood movie\tbad film\n"
                                  "b\tgood good good good\tbad\n"
                                  "a\tgood good good\tbad bad bad\n")
    rows = clf.read_tsv(f)
    feats = clf.build_features(rows, tok, clf.LabelMap.from_rows(rows), f, max_seq_len=8)
    np.testing.assert_array_equal(feats["input_ids"], [
        [2, 5, 7, 3, 6, 14, 3, 0],
        [2, 5, 5, 5, 5, 3, 6, 3],          # 5 pieces fit: a keeps 4
        [2, 5, 5, 5, 3, 6, 6, 3]])         # 6 pieces, room for 5: the tie pops b first
    np.testing.assert_array_equal(feats["segment_ids"], [
        [0, 0, 0, 0, 1, 1, 1, 0], [0, 0, 0, 0, 0, 0, 1, 1], [0, 0, 0, 0, 0, 1, 1, 1]])
    np.testing.assert_array_equal(feats["label"], [0, 1, 0])


@pytest.mark.parametrize("a,b,limit,want", [
    (5, 5, 7, (4, 3)), (5, 5, 6, (3, 3)), (8, 2, 6, (4, 2)), (2, 8, 6, (2, 4)),
    (1, 9, 3, (1, 2)), (3, 3, 10, (3, 3)), (7, 4, 9, (5, 4))])
def test_truncate_seq_pair_is_berts(a, b, limit, want):
    la, lb = list(range(a)), list(range(100, 100 + b))
    clf.truncate_seq_pair(la, lb, limit)
    assert (len(la), len(lb)) == want
    assert la == list(range(want[0])) and lb == list(range(100, 100 + want[1]))  # tail dropped


def test_numeric_labels_sort_numerically(tmp_path):
    rows = clf.read_tsv(write(tmp_path / "x.tsv", "10\tgood\n2\tbad\n-1\tgood\nneg\tbad\n"))
    assert clf.LabelMap.from_rows(rows).names == ("-1", "2", "10", "neg")


# ----------------------------------------------------------------------------- bad input


@pytest.mark.parametrize("content,match", [
    ("", r"x\.tsv: no examples"),
    ("label\tsentence\n\n", "no examples"),
    (f"1\t{SECRET}\n0\t{SECRET}\textra\tcolumn\n", r"x\.tsv:2: 4 tab-separated columns"),
    (f"1\t{SECRET}\n0\t{SECRET}\tpair\n", r"x\.tsv:2: 3 tab-separated columns, but line 1 has 2"),
    (f"{SECRET}\n", r"x\.tsv:1: 1 tab-separated columns"),
    (f"1\t{SECRET}\n\t{SECRET}\n", r"x\.tsv:2: empty label"),
    (f"1\t{SECRET}\n1\t  \n", r"x\.tsv:2: empty text \(column 2\)"),
])
def test_bad_files_name_the_line_but_not_the_text(tmp_path, content, match):
    f = write(tmp_path / "x.tsv", content)
    with pytest.raises(clf.DataError, match=match) as e:
        clf.read_tsv(f)
    assert "xyzzy" not in str(e.value) and "patient" not in str(e.value)


def test_undecodable_bytes(tmp_path):
    f = tmp_path / "x.tsv"
    f.write_bytes(b"1\tgood\n0\tb\xffad\n")
    with pytest.raises(clf.DataError, match=r"x\.tsv:2:4: a byte that is not valid UTF-8"):
        clf.read_tsv(f)
    with pytest.raises(clf.DataError, match="file not found"):
        clf.read_tsv(tmp_path / "missing.tsv")


def test_label_problems_between_train_and_eval(tmp_path, tok):
    train = write(tmp_path / "train.tsv", "pos\tgood\nneg\tbad\npos\tgood movie\n")
    ok = write(tmp_path / "ok.tsv", "neg\tbad\npos\tgood\n")
    data = clf.load_train_eval(train, ok, tok, max_seq_len=8)
    assert data.labels.names == ("neg", "pos") and not data.sentence_pair
    np.testing.assert_array_equal(data.eval["label"], [0, 1])

    unknown = write(tmp_path / "u.tsv", "neg\tbad\nneutral\tgood\n")
    # Labels read from a file are never shown: their length and classes of characters.
    with pytest.raises(clf.DataError, match=r"u\.tsv:2:1: unknown label \(7 characters: "
                                            r"letters\); no row of the training file "
                                            r".*train\.tsv has it \(2 labels\)") as e:
        clf.load_train_eval(train, unknown, tok)
    assert "neutral" not in str(e.value) and "'pos'" not in str(e.value)
    missing = write(tmp_path / "m.tsv", "neg\tbad\nneg\tgood\n")
    with pytest.raises(clf.DataError, match=r"label sets differ: .*m\.tsv has no row with 1 of "
                                            r"the 2 labels of .*train\.tsv \(the first training "
                                            r"row with one: .*train\.tsv:1:1\)") as e:
        clf.load_train_eval(train, missing, tok)
    assert "pos" not in str(e.value).replace("pytest", "")
    # A text column in the label position is not echoed.
    swapped = write(tmp_path / "s.tsv", f"{SECRET}\tneg\npos\tgood\n")
    with pytest.raises(clf.DataError,
                       match=r"s\.tsv:1:1: unknown label \(26 characters: letters, spaces") as e:
        clf.load_train_eval(train, swapped, tok)
    assert "xyzzy" not in str(e.value)
    one = write(tmp_path / "one.tsv", "pos\tgood\npos\tbad\n")
    with pytest.raises(clf.DataError, match=r"only one label \(every row's is 3 characters"):
        clf.load_train_eval(one, ok, tok)
    pairs = write(tmp_path / "pairs.tsv", "neg\tbad\tfilm\npos\tgood\tfilm\n")
    with pytest.raises(clf.DataError, match="pairs.tsv: pairs but .*train.tsv has single"):
        clf.load_train_eval(train, pairs, tok)
    # Explicit label order; a training label outside it is an error.
    data = clf.load_train_eval(train, ok, tok, labels=["pos", "neg"])
    np.testing.assert_array_equal(data.train["label"], [0, 1, 0])
    with pytest.raises(clf.DataError, match=r"train\.tsv:2:1: unknown label \(3 characters: "
                                            r"letters\); the labels given are \['pos', "
                                            r"'other'\]"):
        clf.load_train_eval(train, ok, tok, labels=["pos", "other"])
    with pytest.raises(clf.DataError, match=r"has no row with the given label\(s\) \['neg'\]"):
        clf.load_train_eval(train, write(tmp_path / "p.tsv", "pos\tgood\n"), tok,
                            labels=["pos", "neg"])


def test_vocabulary_checks(tmp_path, vocab):
    folder = tmp_path / "ckpt"
    folder.mkdir()
    (folder / "vocab.txt").write_bytes(vocab.read_bytes())
    (folder / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    tok = clf.tokenizer_for_checkpoint(folder, vocab_size=15)
    assert tok.vocab_size == 15 and tok.do_lower_case is False
    with pytest.raises(clf.DataError, match=r"has 15 tokens but the checkpoint's vocab_size is "
                                            r"30522"):
        clf.tokenizer_for_checkpoint(folder, vocab_size=30522)
    other = tmp_path / "other.txt"
    other.write_text(vocab.read_text().replace("film", "flick"))
    with pytest.raises(clf.DataError, match="differs from the checkpoint's"):
        clf.tokenizer_for_checkpoint(folder, vocab_file=other)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(clf.DataError, match="no vocab.txt"):
        clf.tokenizer_for_checkpoint(empty)


# ----------------------------------------------------------------------------- real data


@pytest.mark.minilm
@pytest.mark.shared_data
def test_features_match_transformers_bert_tokenizer_on_rt(minilm_dir, shared_data, tmp_path):
    from transformers import BertTokenizerFast

    rows = clf.read_tsv(shared_data / "sentiment" / "rt_dev.tsv")
    assert len(rows) == 1057
    tok = clf.tokenizer_for_checkpoint(minilm_dir, vocab_size=30522)
    ref = BertTokenizerFast.from_pretrained(minilm_dir)
    texts = [r.text_a for r in rows]
    for max_len in (128, 24):     # 24: many sentences are truncated
        ours = clf.encode_examples(texts, None, tok, max_len)
        want = ref(texts, truncation=True, max_length=max_len, padding="max_length",
                   return_tensors="np")
        np.testing.assert_array_equal(ours["input_ids"], want["input_ids"])
        np.testing.assert_array_equal(ours["segment_ids"], want["token_type_ids"])
        np.testing.assert_array_equal(ours["input_mask"], want["attention_mask"])
    # Pairs (consecutive sentences): at 128 at most one side is ever cut, where HF's
    # "longest_first" and BERT's truncate_seq_pair agree.
    a, b = texts[0::2][:500], texts[1::2][:500]
    ours = clf.encode_examples(a, b, tok, 128)
    want = ref(a, b, truncation=True, max_length=128, padding="max_length", return_tensors="np")
    np.testing.assert_array_equal(ours["input_ids"], want["input_ids"])
    np.testing.assert_array_equal(ours["segment_ids"], want["token_type_ids"])
    np.testing.assert_array_equal(ours["input_mask"], want["attention_mask"])


def test_eval_file_that_is_the_training_file(tmp_path, tok, caplog):
    train = write(tmp_path / "train.tsv", "pos\tgood\nneg\tbad\npos\tgood movie\n")
    copy = write(tmp_path / "copy.tsv", train.read_text())
    link = tmp_path / "link.tsv"
    link.symlink_to(train)
    for same in (train, copy, link, tmp_path / "." / "train.tsv"):
        with pytest.raises(clf.DataError, match=r"the evaluation file is the training file"):
            clf.load_train_eval(train, same, tok)
    # Rows of the eval file that are also in the training file: counted, a WARNING, no text.
    caplog.set_level("WARNING")
    part = write(tmp_path / "part.tsv", "neg\tbad\npos\t  good movie\npos\tthe film\n"
                                        "neg\tgood movie\n")
    data = clf.load_train_eval(train, part, tok)
    assert data.eval_overlap == 3
    (msg,) = [r.getMessage() for r in caplog.records if "verbatim" in r.getMessage()]
    assert "3 of 4 evaluation rows (75.0 %)" in msg and "movie" not in msg
    assert clf.load_train_eval(train, write(tmp_path / "new.tsv", "pos\tfilm\nneg\ta\n"),
                               tok).eval_overlap == 0


def test_numeric_labels_written_two_ways(tmp_path, tok):
    """Issue 35: `1` and `1.0` became two classes silently."""
    train = write(tmp_path / "train.tsv", "0\tbad movie\n1\tgood movie\n0\tbad film\n"
                                          "1.0\tgood film\n")
    eval_ = write(tmp_path / "eval.tsv", "0\tbad\n1.0\tgood\n")
    with pytest.raises(clf.DataError, match=r"train\.tsv: numeric labels written two ways: lines "
                                            r"2 and 4 hold the same number spelt differently "
                                            r"\(1 character: digits; 3 characters: digits, "
                                            r"punctuation\).* set data\.labels"):
        clf.load_train_eval(train, eval_, tok)
    # data.labels fixes it: a numeric label is matched by its value.
    data = clf.load_train_eval(train, eval_, tok, labels=("0", "1"))
    assert list(data.train["label"]) == [0, 1, 0, 1] and list(data.eval["label"]) == [0, 1]
    with pytest.raises(clf.DataError, match="name one number twice"):
        clf.load_train_eval(train, eval_, tok, labels=("0", "1", "1.0"))
    # Training one way, evaluation the other: the unknown label says so.
    one_way = write(tmp_path / "one_way.tsv", "0\tbad movie\n1\tgood movie\n")
    with pytest.raises(clf.DataError, match=r"eval\.tsv:2:1: unknown label .*the number of a "
                                            r"training label written another way"):
        clf.load_train_eval(one_way, eval_, tok)


def test_quoted_fields_and_a_label_in_the_last_column(tmp_path, caplog):
    """Issue 35: CSV-style quoting kept silently; the GLUE/SST-2 layout (text<TAB>label) read
    with the texts as labels ("unknown label (43 characters ...) ... (257 labels)")."""
    import logging

    quoted = write(tmp_path / "q.tsv", '"label"\t"sentence"\n"0"\t"bad film"\n"1"\t"good"\n')
    with caplog.at_level(logging.WARNING):
        rows = clf.read_tsv(quoted)
        clf.read_tsv(quoted)   # said once per file
    assert [r.label for r in rows] == ['"0"', '"1"']   # the header was recognised
    said = [r.getMessage() for r in caplog.records if "double quotes" in r.getMessage()]
    assert len(said) == 1 and said[0].startswith(f"{quoted}: every field of all 2 rows is "
                                                 "wrapped in double quotes")
    sst2 = write(tmp_path / "sst2.tsv", "sentence\tlabel\n" + SECRET + "\t0\n")
    with pytest.raises(clf.DataError, match=r"sst2\.tsv:1: the header names column 2, the LAST "
                                            r"one, 'label' .* expects the label in the FIRST "
                                            r"column"):
        clf.read_tsv(sst2)
    rows = "".join(f"{SECRET} {i}\t{i % 2}\n" for i in range(24))
    with pytest.raises(clf.DataError, match=r"headerless\.tsv: each of the 24 rows has a label "
                                            r"of its own in column 1, and the last column takes "
                                            r"only 2 value\(s\)") as e:
        clf.read_tsv(write(tmp_path / "headerless.tsv", rows))
    assert "xyzzy" not in str(e.value)
    # A labelled file with as many rows of unique text (the usual case) is fine.
    assert len(clf.read_tsv(write(tmp_path / "ok.tsv", "".join(
        f"{i % 2}\t{SECRET} {i}\n" for i in range(24))))) == 24

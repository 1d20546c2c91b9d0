"""Tests for pretraining.build_datasets / configs.common.data_config (corpus -> datasets, cache)."""

import gzip
import json
import os
import re

import numpy as np
import pytest

from configs import common
from data_pipelines import (canaries, corpora, datasets, pretraining, synthetic_notes,
                            tokenization)


def config(**overrides):
    c = common.data_config()
    c.synthetic_num_notes = 300
    c.max_seq_length = 64
    c.max_predictions_per_seq = 10
    c.eval_fraction = 0.1
    for k, v in overrides.items():
        if k.startswith("canaries_"):
            c.canaries[k[len("canaries_"):]] = v
        else:
            c[k] = v
    return c


def test_default_config_fields_are_commented():
    import inspect

    lines = [line.strip() for line in
             inspect.getsource(common.data_config).splitlines()]
    c = common.data_config()
    for key in list(c.keys()) + [f"canaries.{k}" for k in c.canaries.keys()]:
        i = next(i for i, line in enumerate(lines) if line.startswith(f"c.{key} ="))
        # A comment right above, or above the run of fields it introduces.
        while lines[i - 1].startswith("c."):
            i -= 1
        assert lines[i - 1].startswith("#"), key


def test_synthetic_end_to_end_with_eval_split(notes_vocab):
    train, ev = pretraining.build_datasets(config(), notes_vocab)
    assert train.num_examples > 500 and 20 < ev.num_examples < train.num_examples / 4
    batch = train.get_batch(np.arange(32), step=0)
    assert batch["input_ids"].shape == (32, 64)
    assert batch["masked_lm_positions"].shape == (32, 10)
    # Held out by document: no note is in both sets.
    train_keys = set(np.asarray(train.instances.doc_key).tolist())
    eval_keys = set(np.asarray(ev.instances.doc_key).tolist())
    assert train_keys and eval_keys and not train_keys & eval_keys
    # Random-next B segments come from the same side of the split.
    assert set(np.asarray(ev.instances.b_doc_key).tolist()) <= eval_keys
    meta = train.metadata
    assert meta["train_documents"] + meta["eval_documents"] == 300
    assert (train.subject_ids >= 10_000).all()


def test_subject_split_keeps_patients_apart(notes_vocab):
    train, ev = pretraining.build_datasets(config(eval_split_unit="subject", eval_fraction=0.2),
                                           notes_vocab)
    tr = set(np.asarray(train.instances.subject_id).tolist()) | set(
        np.asarray(train.instances.b_subject_id).tolist())
    te = set(np.asarray(ev.instances.subject_id).tolist())
    assert te and not tr & te


def test_cache_is_reused_and_keyed_by_inputs(tmp_path, notes_vocab):
    corpus = tmp_path / "corpus.txt"
    synthetic_notes.write_text_corpus(corpus, synthetic_notes.generate_notes(150, seed=1))
    cfg = config(corpus="text", paths=(str(corpus),), cache_dir=str(tmp_path / "cache"))
    train, ev = pretraining.build_datasets(cfg, notes_vocab)
    entry = train.metadata["cache_entry"]
    assert os.path.isfile(os.path.join(entry, "meta.json"))
    stamp = os.stat(os.path.join(entry, "train", "tokens.npy")).st_mtime_ns
    train2, ev2 = pretraining.build_datasets(cfg, notes_vocab)
    assert train2.metadata["cache_entry"] == entry
    assert os.stat(os.path.join(entry, "train", "tokens.npy")).st_mtime_ns == stamp
    assert isinstance(train2.instances.tokens, np.memmap)
    for a, b in ((train, train2), (ev, ev2)):
        x, y = a.get_batch(np.arange(20), step=4), b.get_batch(np.arange(20), step=4)
        for k in datasets.FEATURE_KEYS:
            np.testing.assert_array_equal(x[k], y[k])
    # Masking parameters are online: changing them reuses the entry.
    train3, _ = pretraining.build_datasets(config(corpus="text", paths=(str(corpus),),
                                                  cache_dir=str(tmp_path / "cache"),
                                                  masked_lm_prob=0.2), notes_vocab)
    assert train3.metadata["cache_entry"] == entry
    # Instance parameters and corpus content are part of the key.
    train4, _ = pretraining.build_datasets(config(corpus="text", paths=(str(corpus),),
                                                  cache_dir=str(tmp_path / "cache"),
                                                  short_seq_prob=0.2), notes_vocab)
    assert train4.metadata["cache_entry"] != entry
    with open(corpus, "a", encoding="utf-8") as f:
        f.write("\nOne more document.\nWith two sentences.\n")
    train5, _ = pretraining.build_datasets(cfg, notes_vocab)
    assert train5.metadata["cache_entry"] not in (entry, train4.metadata["cache_entry"])
    assert not [p for p in os.listdir(tmp_path / "cache") if p.startswith(".tmp")]


def test_canaries_planted_in_training_data(tmp_path, notes_vocab):
    out = tmp_path / "canaries.json"
    cfg = config(canaries_enabled=True, canaries_repetitions=(3, 30),
                 canaries_output_file=str(out))
    train, ev = pretraining.build_datasets(cfg, notes_vocab)
    assert train.metadata["canary_file"] == str(out)
    planted, record = canaries.load_canary_file(out)
    assert len(planted) == 6 and record["data_fingerprint"] == train.metadata["fingerprint"]
    train_tokens = np.asarray(train.instances.tokens)
    base, _ = pretraining.build_datasets(config(), notes_vocab)
    base_tokens = np.asarray(base.instances.tokens)
    def occurrences(tokens, ids):
        windows = np.lib.stride_tricks.sliding_window_view(tokens, len(ids))
        return int(np.all(windows == np.asarray(ids), axis=1).sum())

    extra = 0
    for c in planted:
        assert len(c.insertions) == c.repetitions
        assert occurrences(train_tokens, c.token_ids) >= 0.8 * c.repetitions, c.canary_id
        extra += occurrences(train_tokens, c.token_ids) - occurrences(base_tokens, c.token_ids)
    # Nearly every planted copy lands whole in an example (a B segment may even repeat it;
    # truncation may cut one; common H/S pairs also occur naturally, with +-1 noise).
    assert extra >= 0.8 * sum(c.repetitions for c in planted), extra
    with pytest.raises(ValueError, match="canaries.output_file"):
        pretraining.build_datasets(config(canaries_enabled=True), notes_vocab)


def test_canaries_planted_from_a_file(tmp_path, notes_vocab):
    """data.canaries.file plants exactly the listed canaries, each by its placement."""
    tok = tokenization.WordPieceTokenizer(notes_vocab)
    cs = canaries.make_canaries(tok, forms=("HSH",), repetitions=(0, 2, 20), seed=9)
    cs[1].placement = "example"
    src = tmp_path / "plant.json"
    canaries.write_canary_file(src, cs, tok, seed=9)
    out = tmp_path / "record.json"
    train, _ = pretraining.build_datasets(
        config(canaries_enabled=True, canaries_file=str(src), canaries_output_file=str(out)),
        notes_vocab)
    base, _ = pretraining.build_datasets(config(), notes_vocab)
    planted, _ = canaries.load_canary_file(out)
    assert [c.canary_id for c in planted] == [c.canary_id for c in cs]
    assert [len(c.insertions) for c in planted] == [0, 2, 20]
    for ins in planted[1].insertions:
        a, b = train.instances.segments(ins["example_index"])
        assert a.tolist() + b.tolist() == cs[1].token_ids
    # Example-placed canaries alone leave the corpus's examples exactly as they were and add
    # their copies at the end (what a one-run audit needs).
    only = tmp_path / "only.json"
    canaries.write_canary_file(only, [cs[0], cs[1]], tok, seed=9)
    ex, _ = pretraining.build_datasets(
        config(canaries_enabled=True, canaries_file=str(only), canaries_output_file=str(out)),
        notes_vocab)
    n = base.num_examples
    assert ex.num_examples == n + 2
    np.testing.assert_array_equal(ex.instances.tokens[:len(base.instances.tokens)],
                                  base.instances.tokens)
    np.testing.assert_array_equal(ex.instances.offsets[:n + 1], base.instances.offsets)
    batch = lambda ds: ds.get_batch(np.arange(0, n, 97), step=3)
    for k, v in batch(base).items():
        np.testing.assert_array_equal(batch(ex)[k], v)
    # The file's content is part of the cache key.
    cs[2].repetitions = 21
    canaries.write_canary_file(src, cs, tok, seed=9)
    again, _ = pretraining.build_datasets(
        config(canaries_enabled=True, canaries_file=str(src), canaries_output_file=str(out),
               cache_dir=str(tmp_path / "cache")), notes_vocab)
    assert again.metadata["fingerprint"] != train.metadata["fingerprint"]
    with pytest.raises(FileNotFoundError, match="data.canaries.file"):
        pretraining.build_datasets(config(canaries_enabled=True, canaries_output_file=str(out),
                                          canaries_file=str(tmp_path / "none.json")),
                                   notes_vocab)


@pytest.mark.parametrize("overrides,match", [
    (dict(corpus="wiki"), "data.corpus='wiki'"),
    (dict(max_seq_length=4), "data.max_seq_length=4"),
    (dict(masked_lm_prob=1.5), "data.masked_lm_prob=1.5"),
    (dict(max_predictions_per_seq=70), "data.max_predictions_per_seq=70"),
    (dict(eval_fraction=1.0), "data.eval_fraction=1.0"),
    (dict(eval_split_unit="patient"), "data.eval_split_unit='patient'"),
    (dict(corpus="text", eval_split_unit="subject", paths=("a",)), "data.eval_split_unit"),
    (dict(dupe_factor=0), "data.dupe_factor=0"),
    (dict(seed=-1), "data.seed=-1"),
    (dict(corpus="text"), "data.paths=()"),
    (dict(corpus="noteevents", paths=("a", "b")), "data.paths=('a', 'b')"),
    (dict(corpus="tfds", tfds_names=()), "data.tfds_names=()"),
])
def test_bad_config_values_name_the_key(notes_vocab, overrides, match):
    with pytest.raises(ValueError, match=re.escape(match)):
        pretraining.build_datasets(config(**overrides), notes_vocab)


def test_missing_and_empty_corpus_files(tmp_path, notes_vocab):
    missing = tmp_path / "nope.txt.gz"
    with pytest.raises(FileNotFoundError, match="nope.txt.gz"):
        pretraining.build_datasets(config(corpus="text", paths=(str(missing),)), notes_vocab)
    with pytest.raises(FileNotFoundError, match="NOTEEVENTS.csv"):
        pretraining.build_datasets(
            config(corpus="noteevents", paths=(str(tmp_path / "NOTEEVENTS.csv"),)), notes_vocab)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n  \n", encoding="utf-8")
    with pytest.raises(corpora.CorpusError, match="empty.txt"):
        pretraining.build_datasets(config(corpus="text", paths=(str(empty),)), notes_vocab)
    with pytest.raises(FileNotFoundError, match="vocab file not found"):
        pretraining.build_datasets(config(), tmp_path / "vocab.txt")


def test_eval_fraction_too_small_for_the_corpus(notes_vocab):
    with pytest.raises(ValueError, match="held out no document"):
        pretraining.build_datasets(config(synthetic_num_notes=5, eval_fraction=0.001),
                                   notes_vocab)
    train, ev = pretraining.build_datasets(config(synthetic_num_notes=5, eval_fraction=0.0),
                                           notes_vocab)
    assert ev is None and train.num_examples > 0


def test_noteevents_with_bad_rows_counted(tmp_path, notes_vocab):
    path = tmp_path / "NOTEEVENTS.csv.gz"
    # 2 bad rows in 252: under the 1 % that the reader accepts (corpora.DEFAULT_MAX_BAD_FRACTION).
    synthetic_notes.write_noteevents_csv(path, synthetic_notes.generate_synthetic(250, seed=4))
    with gzip.open(path, "ab") as f:
        f.write(b'999,12,13,,,,Radiology,X,,,"bad \xff byte"\n')
        f.write(b'1000,abc,13,,,,Radiology,X,,,"bad id"\n')
    train, ev = pretraining.build_datasets(
        config(corpus="noteevents", paths=(str(path),), eval_fraction=0.0), notes_vocab)
    assert "kept 250" in train.metadata["read_stats"][0]
    assert "1 malformed" in train.metadata["read_stats"][0]
    assert "1 not UTF-8" in train.metadata["read_stats"][0]


@pytest.mark.shared_data
def test_noteevents_sample_feeds_examples_with_subject_ids(shared_data, notes_vocab):
    path = shared_data / "clinical" / "NOTEEVENTS_sample.csv.gz"
    train, ev = pretraining.build_datasets(
        config(corpus="noteevents", paths=(str(path),), eval_split_unit="subject",
               max_seq_length=128, max_predictions_per_seq=20), notes_vocab)
    subjects = {n.subject_id for n in corpora.read_noteevents(path)}
    row_ids = {n.row_id for n in corpora.read_noteevents(path)}
    got = set(train.subject_ids.tolist())
    assert got <= subjects and len(got) > 200
    assert set(np.asarray(train.instances.doc_key).tolist()) <= row_ids
    assert not got & set(ev.subject_ids.tolist())
    assert train.num_examples > 1000
    batch = train.get_batch(np.arange(train.num_examples), step=0)
    # [UNK] stays rare with the synthetic-notes vocab on MIMIC-style radiology text.
    unk = tokenization.special_token_ids(notes_vocab).unk
    assert np.mean(batch["input_ids"][batch["input_mask"] > 0] == unk) < 0.01


@pytest.mark.shared_data
@pytest.mark.minilm
def test_web_bible_recipe_statistics(shared_data, minilm_dir):
    """BERT recipe on a fixed real corpus with the standard uncased vocab."""
    cfg = config(corpus="text", paths=(str(shared_data / "corpus" / "web_bible.txt.gz"),),
                 max_seq_length=128, max_predictions_per_seq=20, eval_fraction=0.02)
    train, ev = pretraining.build_datasets(cfg, minilm_dir / "vocab.txt")
    assert train.metadata["train_documents"] + train.metadata["eval_documents"] == 2438
    idx = np.arange(0, train.num_examples, 3)
    b = train.get_batch(idx, step=1)
    lengths = b["input_mask"].sum(1)
    assert lengths.max() == 128 and 0.5 < np.mean(lengths == 128) < 0.9
    masked = b["masked_lm_weights"].sum(1)
    expected = np.minimum(20, np.maximum(1, np.round(lengths * 0.15)))
    np.testing.assert_array_equal(masked, expected)
    assert abs(masked.sum() / lengths.sum() - 0.15) < 0.01
    assert 0.5 <= b["next_sentence_labels"].mean() < 0.6
    now = np.take_along_axis(b["input_ids"], b["masked_lm_positions"], 1)
    now = now[b["masked_lm_weights"] > 0]
    assert abs(np.mean(now == 103) - 0.8) < 0.01  # [MASK] = 103 in the uncased vocab
    unk = np.mean(b["input_ids"][b["input_mask"] > 0] == 100)
    assert unk < 0.001
    json.dumps(train.metadata)  # metadata is JSON-serializable (goes into reports)


def test_no_training_document_names_the_setting_that_removed_them(tmp_path, notes_vocab):
    """Issue 35: "the noteevents corpus yielded no training document with text (...)" when a
    setting removed every document; and a text file of one document says why it is one."""
    with pytest.raises(ValueError, match=r"^data\.eval_fraction=0\.99 held out all 3 "
                                         r"document\(s\) of the synthetic corpus, leaving no "
                                         r"training document"):
        pretraining.build_datasets(config(synthetic_num_notes=3, eval_fraction=0.99),
                                   notes_vocab)
    path = tmp_path / "NOTEEVENTS.csv"
    synthetic_notes.write_noteevents_csv(path, synthetic_notes.generate_synthetic(20, seed=4))
    with pytest.raises(ValueError, match=re.escape(
            "data.noteevents_categories=('Radiologyy',) matched none of the 20 notes of "
            f"{path} (CATEGORY values are compared case-insensitively")):
        pretraining.build_datasets(config(corpus="noteevents", paths=(str(path),),
                                          noteevents_categories=("Radiologyy",)), notes_vocab)
    one = tmp_path / "one.txt"
    one.write_text("".join(f"Sentence number {i}.\n" for i in range(30)))
    with pytest.raises(ValueError, match=re.escape(
            f"held out no document of 1: raise it, or set 0 for no eval set; {one}: 1 document "
            "(no blank line between documents in 30 lines)")):
        pretraining.build_datasets(config(corpus="text", paths=(str(one),), eval_fraction=0.01),
                                   notes_vocab)

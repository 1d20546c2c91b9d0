"""The demo's data stage through its fast paths (ascii_words for the vocabulary's words and for
encode_batch, note_cache for the reads) gives bit-identical outputs to the reference path (the
tokenizers Rust components for every note and sentence, the file parsed on every read): the DP
vocabulary's word counts and report, and every array of the training and held-out instances.
The synthetic notes (test_synthetic_notes) and the instances made from a tokenized corpus are
pinned to what the first implementation gave."""

import hashlib
import json
import random

import numpy as np
import pytest

from configs import common
from data_pipelines import (documents, dp_vocab, fast_random, instances, note_cache, pretraining,
                            synthetic_notes, tokenization, tokenized_corpus, wordpiece)


def _no_fast_paths(monkeypatch):
    monkeypatch.setattr(wordpiece, "ascii_words", lambda *a: None)
    monkeypatch.setattr(tokenization, "ascii_words", lambda *a: None)
    monkeypatch.setattr(note_cache, "MAX_CACHED_CHARS", -1)


def _stage(tmp_path, name, vocab_file):
    """The vocabulary (seeded) and the datasets of one CSV, as the demo makes them."""
    csv = tmp_path / "notes.csv.gz"
    out = tmp_path / name
    result = dp_vocab.build_vocab(csv, "noteevents", 1200, 4.0, 1e-5, 64, out / "vocab",
                                  seed=11, progress=False)
    assert (note_cache._ENTRY is None) == (note_cache.MAX_CACHED_CHARS < 0)
    cfg = common.data_config()
    cfg.corpus, cfg.paths, cfg.cache_dir = "noteevents", (str(csv),), str(out / "cache")
    cfg.max_seq_length, cfg.eval_fraction = 32, 0.05
    train, ev = pretraining.build_datasets(cfg, vocab_file)
    assert note_cache._ENTRY is None  # dropped once the corpus is read
    report = json.loads(result.privacy_path.read_text())
    report.pop("seconds")
    arrays = {f"{split}.{name}": np.asarray(getattr(ds.instances, name))
              for split, ds in (("train", train), ("eval", ev))
              for name in ds.instances._ARRAYS}
    meta = {k: train.metadata[k] for k in ("fingerprint", "train_documents", "eval_documents",
                                            "read_stats", "content_sha256")}
    return result.counts_path.read_text(), report, arrays, meta


def test_vocabulary_and_instances_identical_to_the_reference_path(tmp_path, monkeypatch,
                                                                  notes_vocab):
    synthetic_notes.write_noteevents_csv(tmp_path / "notes.csv.gz",
                                         synthetic_notes.generate_synthetic(400, seed=3))
    note_cache.clear()
    with monkeypatch.context() as m:
        _no_fast_paths(m)
        reference = _stage(tmp_path, "reference", notes_vocab)
    fast = _stage(tmp_path, "fast", notes_vocab)
    counts, report, arrays, meta = fast
    assert counts == reference[0] and counts.count("\n") > 20
    assert report == reference[1]
    assert arrays.keys() == reference[2].keys()
    for name, value in arrays.items():
        assert value.dtype == reference[2][name].dtype, name
        np.testing.assert_array_equal(value, reference[2][name], err_msg=name)
    assert meta == reference[3] and meta["eval_documents"] > 0


@pytest.mark.parametrize("lower", [True, False])
def test_word_histogram_identical(lower, monkeypatch):
    texts = [n.text for n in synthetic_notes.generate_notes(300, seed=4)]
    texts += ["Café naïve x", "ctl\x00chars", "[MASK] token"]
    fast = dp_vocab.word_histogram(texts, 16, entropy=5, do_lower_case=lower)
    monkeypatch.setattr(wordpiece, "ascii_words", lambda *a: None)
    assert fast == dp_vocab.word_histogram(texts, 16, entropy=5, do_lower_case=lower)


# sha256 of every instance array (names in Instances._ARRAYS order) for 200 synthetic notes
# (seed 6) with the conftest vocabulary, as the first implementation made them.
PINNED_INSTANCES = {
    "example": "fb470eb6ce414b0d5b8720210adcea6237d30afe49c56b719d3b45f2af08f5ad",
    "note": "f773c3d07d8f5a33557fc24505e6fa796aef17d93b454ad596bee433e41c25f7",
    "patient": "ae66988c607224f8752204ed7aabf5aadda8c25c9084e7f0a46f8acb8499c67c",
}


def _instances_digest(notes_vocab, privacy_unit: str) -> str:
    docs = documents.note_documents(synthetic_notes.generate_notes(200, seed=6))
    tok = tokenization.WordPieceTokenizer(notes_vocab)
    corpus = tokenized_corpus.tokenize_documents(docs, tok, progress=False)
    made = instances.create_instances(corpus, instances.InstanceParams(
        max_seq_length=24, short_seq_prob=0.2, dupe_factor=2, seed=9,
        privacy_unit=privacy_unit), progress=False)
    h = hashlib.sha256()
    for name in made._ARRAYS:
        h.update(np.ascontiguousarray(getattr(made, name)).tobytes())
    return h.hexdigest()


@pytest.mark.parametrize("privacy_unit", sorted(PINNED_INSTANCES))
def test_instances_are_pinned(notes_vocab, privacy_unit):
    assert _instances_digest(notes_vocab, privacy_unit) == PINNED_INSTANCES[privacy_unit]


def test_fast_random_draws_as_random_random():
    for seed in (0, 1, "7:note:3", 2**70):
        ours, ref = fast_random.Random(seed), random.Random(seed)
        for n in range(1, 300):
            assert ours.randint(-n, 3 * n) == ref.randint(-n, 3 * n)
            assert ours.choice("ab" * n) == ref.choice("ab" * n)
            assert ours.random() == ref.random()
            assert ours.randint(5, 5) == ref.randint(5, 5)
        assert ours.getstate() == ref.getstate()
    with pytest.raises(ValueError):
        fast_random.Random(0).randint(3, 2)
    with pytest.raises(IndexError):
        fast_random.Random(0).choice([])

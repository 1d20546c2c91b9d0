"""Fixtures for the data-pipeline tests: a small WordPiece vocab built from synthetic notes."""

import collections
import pathlib
import string

import pytest
from tokenizers import normalizers, pre_tokenizers

from data_pipelines import synthetic_notes


@pytest.fixture(scope="session")
def notes_vocab(tmp_path_factory) -> pathlib.Path:
    """A deterministic ~2k-entry uncased BERT vocab.txt for 600 synthetic notes.

    Special tokens, then every printable ASCII character and its ``##`` form (so any English
    text tokenizes without [UNK]), then the most frequent words after BERT normalization and
    pre-tokenization (ties broken alphabetically). Deterministic, unlike a trained vocab whose
    ties depend on thread scheduling.
    """
    normalizer = normalizers.BertNormalizer(lowercase=True)
    pre = pre_tokenizers.BertPreTokenizer()
    counts = collections.Counter()
    for note in synthetic_notes.generate_notes(600, seed=123):
        text = normalizer.normalize_str(note.text)
        counts.update(w for w, _ in pre.pre_tokenize_str(text))
    chars = sorted(set(string.ascii_lowercase + string.digits + string.punctuation))
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + chars + [f"##{c}" for c in chars]
    taken = set(vocab)
    for word, _ in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0])):
        if len(vocab) >= 2000:
            break
        if word not in taken:
            vocab.append(word)
            taken.add(word)
    path = tmp_path_factory.mktemp("vocab") / "vocab.txt"
    path.write_text("\n".join(vocab) + "\n", encoding="utf-8")
    return path

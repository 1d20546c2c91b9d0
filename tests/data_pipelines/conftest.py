"""Fixtures for the data-pipeline tests: a small WordPiece vocab learned from synthetic notes."""

import pathlib
import string

import pytest
from tokenizers import BertWordPieceTokenizer

from data_pipelines import synthetic_notes


@pytest.fixture(scope="session")
def notes_vocab(tmp_path_factory) -> pathlib.Path:
    """A ~2k-entry uncased BERT vocab.txt trained (HF tokenizers) on 600 synthetic notes.

    The alphabet covers printable ASCII so any English text tokenizes without [UNK] storms.
    """
    out = tmp_path_factory.mktemp("vocab")
    texts = [n.text for n in synthetic_notes.generate_notes(600, seed=123)]
    tok = BertWordPieceTokenizer(lowercase=True)
    tok.train_from_iterator(texts, vocab_size=2000, min_frequency=2, show_progress=False,
                            initial_alphabet=list(string.ascii_lowercase + string.digits
                                                  + string.punctuation))
    tok.save_model(str(out))
    path = out / "vocab.txt"
    assert path.is_file()
    return path

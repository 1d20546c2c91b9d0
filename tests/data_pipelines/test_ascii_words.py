"""data_pipelines.ascii_words and the paths built on it (WordSplitter, WordPieceTokenizer's
cached encode_batch): the same words and ids as the `tokenizers` Rust components."""

import random

import numpy as np
import pytest
from tokenizers import normalizers, pre_tokenizers

from data_pipelines import sentences, synthetic_notes, tokenization
from data_pipelines.ascii_words import ascii_words
from data_pipelines.wordpiece import WordSplitter


def _rust_words(text: str, lower: bool) -> list[str]:
    normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                            strip_accents=None, lowercase=lower)
    pre = pre_tokenizers.BertPreTokenizer()
    return [w for w, _ in pre.pre_tokenize_str(normalizer.normalize_str(text))]


def _ascii_samples() -> list[str]:
    chars = [chr(c) for c in range(128)]
    out = [""]
    for c in chars:  # every ASCII character alone and between letters, digits, punctuation
        out += [c, f"a{c}b", f"A{c}1", f"{c}{c}{c}", f"x {c} y", f".{c}.", f"Ab{c}\n{c}Cd"]
    rng = random.Random(0)
    out += ["".join(rng.choice(chars) for _ in range(rng.randint(1, 60))) for _ in range(3000)]
    return out


@pytest.mark.parametrize("lower", [True, False])
def test_matches_bert_normalizer_and_pre_tokenizer(lower):
    notes = [n.text for n in synthetic_notes.generate_notes(200, seed=5)]
    for text in _ascii_samples() + notes:
        assert ascii_words(text, lower) == _rust_words(text, lower), repr(text)


def test_non_ascii_is_left_to_tokenizers():
    assert ascii_words("café au lait") is None
    splitter = WordSplitter(True)
    for text in ("Café NAÏVE", "中文 test", "a\u00a0b", "x\u2019s"):
        assert splitter(text) == _rust_words(text, True)


@pytest.mark.parametrize("lower", [True, False])
def test_encode_batch_matches_the_rust_pipeline(notes_vocab, lower):
    tok = tokenization.WordPieceTokenizer(notes_vocab, do_lower_case=lower)
    texts = [s for n in synthetic_notes.generate_notes(150, seed=9)
             for s in sentences.split_sentences(n.text)]
    texts += ["", "a" * 150, "the [MASK] was [UNK]ed", "Héllo café", "ctl\x00chars\x0bjoin",
              "zzqx unseenword 12345678901234567890", "[CLS]", "tabs\tand\nnewlines"]
    texts += _ascii_samples()[:500]
    for chunk in (texts[:50], texts, texts[::-1]):  # a warm cache gives the same ids
        got = tok.encode_batch(chunk)
        want = tok.backend.encode_batch_fast(chunk, add_special_tokens=False)
        assert len(got) == len(want)
        for text, g, w in zip(chunk, got, want):
            assert g.dtype == np.int32 and g.shape == (len(w.ids),)
            assert g.tolist() == w.ids, repr(text)


def test_encode_batch_cache_is_bounded(notes_vocab, monkeypatch):
    monkeypatch.setattr(tokenization, "MAX_CACHED_WORDS", 5)
    tok = tokenization.WordPieceTokenizer(notes_vocab)
    texts = ["the patient was admitted", "with chest pain and fever today"]
    for text in texts * 2:
        assert tok.encode(text).tolist() == tok.backend.encode(
            text, add_special_tokens=False).ids
        assert len(tok._pieces) <= 6  # one text's words at most, when the cache overflows


def test_encode_batch_text_cache_hands_out_copies(notes_vocab, monkeypatch):
    monkeypatch.setattr(tokenization, "MAX_CACHED_SENTENCES", 2)
    tok = tokenization.WordPieceTokenizer(notes_vocab)
    texts = ["no pneumothorax.", "no pneumothorax.", "the heart is normal.", "x y z", "q."]
    want = [tok.backend.encode(t, add_special_tokens=False).ids for t in texts]
    for _ in range(2):
        got = tok.encode_batch(texts)
        assert [g.tolist() for g in got] == want
        got[0][:] = 0  # the caller's arrays are its own
        assert len(tok._sentences) <= 2
    assert tok.encode(texts[0]).tolist() == want[0]

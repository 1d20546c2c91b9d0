"""Tests for data_pipelines.tokenization."""

import numpy as np
import pytest

from data_pipelines import tokenization

TEXTS = [
    "Héllo WORLD, the patient received 2.5 mg p.o. b.i.d. for ___ pain.",
    "a" * 150,  # longer than max_input_chars_per_word -> [UNK]
    "",
    "中文 test\tcontrol\x00chars  and   spaces",
    "Ärzte über naïve café [MASK] unaffable",
]


@pytest.mark.minilm
def test_matches_transformers_bert_tokenizer(minilm_dir):
    from transformers import BertTokenizerFast

    tok = tokenization.WordPieceTokenizer(minilm_dir / "vocab.txt")
    ref = BertTokenizerFast.from_pretrained(minilm_dir)
    for text, ids in zip(TEXTS, tok.encode_batch(TEXTS)):
        assert ids.dtype == np.int32
        assert ids.tolist() == ref(text, add_special_tokens=False)["input_ids"], text
    assert tok.special == tokenization.SpecialTokenIds(pad=0, unk=100, cls=101, sep=102,
                                                       mask=103)
    assert tok.encode(TEXTS[1]).tolist() == [tok.special.unk]
    assert tok.vocab_size == 30522
    assert tok.is_continuation.sum() == sum(t.startswith("##") for t in tok.vocab)


def test_small_vocab_cased_and_uncased(notes_vocab):
    lower = tokenization.WordPieceTokenizer(notes_vocab, do_lower_case=True)
    cased = tokenization.WordPieceTokenizer(notes_vocab, do_lower_case=False)
    text = "The Patient was Diuresed"
    assert lower.tokenize(text)[0] == "the"
    # The vocab is lower-case: without lower-casing "The" is not a whole word.
    assert cased.tokenize(text)[0] != "the"
    ids = lower.encode("furosemide 40 mg")
    assert lower.decode(ids) == "furosemide 40 mg"
    assert tokenization.special_token_ids(notes_vocab) == lower.special
    assert lower.token_to_id("[MASK]") == lower.special.mask
    assert lower.token_to_id("no-such-token") is None
    assert lower.encode_batch([]) == []


@pytest.mark.parametrize("content,match", [
    ("", "is empty"),
    ("[PAD]\n[UNK]\n[CLS]\n[SEP]\n", r"lacks the special token\(s\) \['\[MASK\]'\]"),
    ("[PAD]\n[UNK]\n[CLS]\n[SEP]\n[MASK]\nfoo\nfoo\n", "'foo' appears twice"),
    ("[PAD]\n\n[UNK]\n[CLS]\n[SEP]\n[MASK]\n", "empty token on line 2"),
])
def test_bad_vocab_files(tmp_path, content, match):
    path = tmp_path / "vocab.txt"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(ValueError, match=match):
        tokenization.WordPieceTokenizer(path)


def test_missing_vocab_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nope.txt"):
        tokenization.WordPieceTokenizer(tmp_path / "nope.txt")

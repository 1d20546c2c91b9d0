"""BERT's word split of pure-ASCII text in Python: the same words as ``tokenizers``'
``BertNormalizer`` (clean text, CJK spacing, lowercase / accent stripping) followed by
``BertPreTokenizer`` (whitespace, punctuation), without a Python <-> Rust crossing per text.

Counting the DP vocabulary's words and tokenizing the pretraining corpus split every note into
words; through the Rust components that costs one call and one Python object per word and
offset, which dominated both stages. On ASCII text the two components reduce to a few rules:

* ``clean_text`` deletes NUL and every control character but tab, newline and CR (a deleted
  character joins its neighbours: ``"a\\x0bb"`` is the word ``ab``), and turns tab, newline
  and CR into spaces; CJK spacing and accent stripping do nothing to ASCII; ``lowercase``
  lower-cases A-Z;
* the pre-tokenizer splits at whitespace and makes every ASCII punctuation character
  (``!"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~``, i.e. every printable character that is not a letter or
  a digit) a word of its own.

So a word is a run of letters and digits or one punctuation character. Text with any non-ASCII
character returns None here, and callers use the ``tokenizers`` components (Unicode
punctuation, CJK and accents are theirs to decide). ``tests/data_pipelines/
test_ascii_words.py`` checks the equivalence on every ASCII character in several contexts,
random ASCII strings and the synthetic notes.
"""

from __future__ import annotations

import re

# The control characters that clean_text deletes (all but tab, newline and CR).
_DELETE = {c: None for c in (*range(0, 9), 11, 12, *range(14, 32), 127)}
_HAS_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_WORDS = re.compile(r"[A-Za-z0-9]+|[!-/:-@\[-`{-~]")


def ascii_words(text: str, do_lower_case: bool = True) -> list[str] | None:
    """The words of ``text`` as BERT's normalizer + pre-tokenizer give them (module doc), in
    order with repeats; None when ``text`` is not pure ASCII."""
    if not text.isascii():
        return None
    if _HAS_CONTROL.search(text):
        text = text.translate(_DELETE)
    if do_lower_case:
        text = text.lower()
    return _WORDS.findall(text)

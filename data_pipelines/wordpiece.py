"""WordPiece learning for the DP vocabulary: the public alphabet, BERT's special tokens and
the `tokenizers` WordPiece trainer run on the noisy word counts.

Everything here is post-processing of the DP histogram (`data_pipelines.vocab_privacy`) or
public: character coverage comes from Unicode blocks, never from private counts.
"""

from __future__ import annotations

import functools
import unicodedata
from typing import Iterator, Mapping

from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

from data_pipelines.ascii_words import ascii_words
from data_pipelines.vocab_privacy import VocabError

# BERT's own layout: [PAD]=0, [unused0..98]=1..99, [UNK]=100, [CLS]=101, [SEP]=102,
# [MASK]=103, so the special ids match bert-base vocabularies.
DEFAULT_NUM_UNUSED = 99

# Cap on the words fed to the WordPiece trainer (see learn_wordpiece).
MAX_TRAINING_WORDS = 100_000_000
_CONTINUATION = "##"

# Public alphabet: Unicode blocks, not data.  Printable ASCII, Latin-1 Supplement,
# Latin Extended-A, Greek, Cyrillic, General Punctuation and a few common symbols.
_PUBLIC_RANGES = (
    (0x21, 0x7E), (0xA1, 0xFF), (0x100, 0x17F), (0x391, 0x3C9), (0x400, 0x45F),
    (0x2010, 0x2027), (0x2030, 0x203A), (0x20A0, 0x20BF), (0x2100, 0x2122),
    (0x2190, 0x2193), (0x2200, 0x2265),
)



class WordSplitter:
    """Text -> words, exactly as a BERT tokenizer splits before WordPiece.

    Uses ``tokenizers``' ``BertNormalizer`` (clean text, CJK spacing, lowercase and
    accent stripping when ``do_lower_case``) and ``BertPreTokenizer`` (whitespace and
    punctuation), the same components ``BertTokenizerFast`` uses.
    """

    def __init__(self, do_lower_case: bool = True):
        self.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=None,
            lowercase=do_lower_case)
        self.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        self.do_lower_case = do_lower_case

    def __call__(self, text: str) -> list[str]:
        """Returns the words of ``text`` in order (with repeats)."""
        # Pure ASCII: the same words without the Rust calls (``ascii_words``).
        words = ascii_words(text, self.do_lower_case)
        if words is not None:
            return words
        # One call per example: the pre-tokenizer splits on newlines like on spaces.
        return [w for w, _ in self.pre_tokenizer.pre_tokenize_str(
            self.normalizer.normalize_str(text))]



@functools.lru_cache(maxsize=4)
def public_alphabet(do_lower_case: bool = True) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The public character set, normalised as the tokenizer will normalise text.

    Built from fixed Unicode blocks (``_PUBLIC_RANGES``), never from data.  Each
    character is passed through the BERT normaliser (so uncased ``É`` becomes ``e``) and
    every resulting character is kept.  A continuation ``##c`` is added for characters
    that can occur inside a word (the BERT pre-tokenizer does not split them off);
    punctuation is always a word of its own and needs no ``##`` form.

    Returns:
      (word-initial characters, ``##`` continuations), each sorted by code point.
    """
    splitter = WordSplitter(do_lower_case)
    chars: set[str] = set()
    for lo, hi in _PUBLIC_RANGES:
        for cp in range(lo, hi + 1):
            if unicodedata.category(chr(cp)) == "Cn":
                continue  # unassigned code point
            for ch in splitter.normalizer.normalize_str(chr(cp)):
                if not ch.isspace():
                    chars.add(ch)
    initial = tuple(sorted(chars))
    inside = tuple(_CONTINUATION + ch for ch in initial
                   if len(splitter.pre_tokenizer.pre_tokenize_str(f"a{ch}a")) == 1)
    return initial, inside


def special_tokens(num_unused: int = DEFAULT_NUM_UNUSED) -> list[str]:
    """``[PAD]``, ``[unused0..num_unused-1]``, ``[UNK]``, ``[CLS]``, ``[SEP]``, ``[MASK]``."""
    return (["[PAD]"] + [f"[unused{i}]" for i in range(num_unused)]
            + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"])


def min_vocab_size(do_lower_case: bool = True,
                   num_unused: int = DEFAULT_NUM_UNUSED) -> int:
    """Specials + the public alphabet: the smallest vocabulary this builder writes."""
    initial, inside = public_alphabet(do_lower_case)
    return len(special_tokens(num_unused)) + len(initial) + len(inside)


def vocab_size_floor(do_lower_case: bool = True, num_unused: int = DEFAULT_NUM_UNUSED, *,
                     lower_case_field: str = "do_lower_case") -> str:
    """Why no vocabulary is smaller than `min_vocab_size`, in words, for a message about a
    vocabulary size below it: the tokens it takes, and, for cased text, that the cased
    alphabet is why (`lower_case_field`: how the caller's user spells the setting)."""
    floor = min_vocab_size(do_lower_case, num_unused)
    text = (f"{floor} tokens: the special tokens ({num_unused} unused) and the public "
            "alphabet")
    if do_lower_case:
        return text
    uncased = min_vocab_size(True, num_unused)
    return (f"{text} of CASED text: {lower_case_field}=False keeps upper- and lower-case letters "
            f"(and accented ones) apart, {floor - uncased} more tokens than the {uncased} of "
            f"uncased text ({lower_case_field}=True)")


def _training_items(word_counts: Mapping[str, float], max_words: int,
                    batch_words: int = 1_000_000) -> Iterator[str]:
    """Strings that hold each word as many times as its (rounded, scaled) count.

    ``tokenizers`` trainers take text, not counts; repeating a word c times gives the
    trainer exactly the count c.  If the total exceeds ``max_words`` all counts are
    scaled by the same factor (keeping at least 1): merge ranks depend on relative
    frequencies, and this bounds the trainer's work.
    """
    rounded = {w: max(1, int(round(c))) for w, c in word_counts.items()}
    total = sum(rounded.values())
    scale = min(1.0, max_words / total) if total else 1.0
    batch: list[str] = []
    size = 0
    for word in sorted(rounded):
        reps = max(1, int(round(rounded[word] * scale)))
        batch.append(" ".join([word] * reps))
        size += reps
        if size >= batch_words:
            yield " ".join(batch)
            batch, size = [], 0
    if batch:
        yield " ".join(batch)


def learn_wordpiece(word_counts: Mapping[str, float], vocab_size: int,
                    do_lower_case: bool = True, num_unused: int = DEFAULT_NUM_UNUSED,
                    max_training_words: int = MAX_TRAINING_WORDS) -> tuple[list[str], int]:
    """Learns a BERT WordPiece vocabulary from (word, count) pairs.

    Learner: ``tokenizers``' ``WordPieceTrainer`` (frequency-ranked merges with ``##``
    continuations, the learner HF uses for BERT vocabularies), fed through
    ``train_from_iterator`` with each word repeated by its count and a whitespace-only
    pre-tokenizer (the words are already normalised and pre-tokenised).  sentencepiece
    trains from counts directly but its pieces would need converting to ``##`` form;
    the HF trainer emits it natively and matches ``BertTokenizerFast``.

    Reproducibility: the trainer breaks ties between equally frequent pairs in an
    order that depends on Rust's randomised hash maps, so two runs on the same counts
    can differ in a few tied merges (the noisy counts themselves are bit-identical for
    a given seed; ``word_counts.tsv`` keeps them).

    Layout of the result (``vocab_size`` lines): :func:`special_tokens`, the public
    alphabet (initial characters, then ``##`` characters), then learned tokens in the
    trainer's order (its alphabet, then merges, most frequent first), then
    ``[unused{num_unused}]``, ... padding if fewer tokens were learned than fit.

    Args:
      word_counts: word -> count (noisy counts for DP; they are rounded).
      vocab_size: total number of lines.
      do_lower_case: must match how the words were normalised.
      num_unused: ``[unusedN]`` slots between ``[PAD]`` and ``[UNK]``.
      max_training_words: cap on the total count fed to the trainer.

    Returns:
      (tokens, number of learned tokens beyond specials + public alphabet).

    Raises:
      VocabError: ``vocab_size`` below :func:`min_vocab_size`.
    """
    floor = min_vocab_size(do_lower_case, num_unused)
    if vocab_size < floor:
        raise VocabError(f"vocab_size={vocab_size} is below the "
                         f"{vocab_size_floor(do_lower_case, num_unused)}")
    initial, inside = public_alphabet(do_lower_case)
    tokens = special_tokens(num_unused) + list(initial) + list(inside)
    seen = set(tokens)
    fixed = len(tokens)
    if word_counts:
        tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, min_frequency=0, special_tokens=[],
            initial_alphabet=list(initial), continuing_subword_prefix=_CONTINUATION,
            show_progress=False)
        tokenizer.train_from_iterator(_training_items(word_counts, max_training_words),
                                      trainer=trainer)
        learned = tokenizer.get_vocab()
        for token in sorted(learned, key=learned.get):
            if len(tokens) >= vocab_size:
                break
            if token not in seen:
                tokens.append(token)
                seen.add(token)
    num_learned = len(tokens) - fixed
    extra = num_unused
    while len(tokens) < vocab_size:
        tokens.append(f"[unused{extra}]")
        extra += 1
    return tokens, num_learned

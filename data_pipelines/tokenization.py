"""Fast WordPiece tokenization for BERT pretraining from a BERT ``vocab.txt``.

The tokenizer is HF ``tokenizers``' Rust implementation assembled to behave exactly like
``BertWordPieceTokenizer`` / ``transformers.BertTokenizerFast``: BERT normalizer (control
characters removed, whitespace unified, CJK characters spaced, optional lower-casing with accent
stripping), BERT pre-tokenizer (split on whitespace and punctuation), WordPiece model with
``[UNK]`` and ``max_input_chars_per_word=100``. Special tokens are never added by ``encode*``:
the pretraining stage places ``[CLS]``/``[SEP]`` itself.

Token ids are returned as NumPy ``int32`` arrays.

``encode_batch`` splits pure-ASCII texts into words in Python (``ascii_words``: the same words
as the normalizer + pre-tokenizer) and looks each word's pieces up in a per-tokenizer cache
(WordPiece splits a word whatever surrounds it); only words not seen yet, and texts with a
non-ASCII character or a ``[`` (a special token such as ``[MASK]`` may be written in the text),
go through the Rust pipeline. The ids are the same; the corpus's few thousand distinct words
cost a few thousand Rust calls instead of one per sentence. A text seen before (clinical notes
repeat many sentences: "No pneumothorax.") is answered from a second, bounded cache, with a
copy of its ids.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from collections.abc import Sequence

import numpy as np
import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers

from data_pipelines.ascii_words import ascii_words

# The special tokens every BERT vocab must contain (BERT's order; ids are read from the file).
SPECIAL_TOKENS = ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")
CONTINUATION_PREFIX = "##"
MAX_INPUT_CHARS_PER_WORD = 100
# Words whose pieces one tokenizer remembers (encode_batch); the cache is emptied when full.
MAX_CACHED_WORDS = 200_000
# Texts (sentences) whose ids one tokenizer remembers (encode_batch); the first ones seen.
MAX_CACHED_SENTENCES = 100_000


@dataclasses.dataclass(frozen=True)
class SpecialTokenIds:
    """Ids of BERT's special tokens in one vocabulary."""

    pad: int
    unk: int
    cls: int
    sep: int
    mask: int


def load_vocab(vocab_file: str | os.PathLike) -> list[str]:
    """Reads a BERT ``vocab.txt`` (one token per line, line number = id).

    Raises:
      FileNotFoundError: the file does not exist.
      ValueError: the file is empty, has a duplicate or empty token, or lacks a special token.
    """
    path = os.fspath(vocab_file)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"vocab file not found: {path}")
    with open(path, encoding="utf-8") as f:
        # BERT's reader strips each line; a token never contains whitespace.
        tokens = [line.strip() for line in f]
    # A trailing newline at the end of the file is not an (empty) token.
    while tokens and not tokens[-1]:
        tokens.pop()
    if not tokens:
        raise ValueError(f"vocab file {path} is empty")
    seen: dict[str, int] = {}
    for i, tok in enumerate(tokens):
        if not tok:
            raise ValueError(f"vocab file {path}: empty token on line {i + 1}")
        if tok in seen:
            raise ValueError(f"vocab file {path}: token {tok!r} appears twice "
                             f"(lines {seen[tok] + 1} and {i + 1})")
        seen[tok] = i
    missing = [t for t in SPECIAL_TOKENS if t not in seen]
    if missing:
        raise ValueError(f"vocab file {path} lacks the special token(s) {missing} (a BERT "
                         f"vocab.txt has each of {', '.join(SPECIAL_TOKENS)} on a line of its "
                         "own)")
    return tokens


def vocab_fingerprint(vocab_file: str | os.PathLike) -> str:
    """SHA-256 (hex) of the vocab file's bytes: part of cache keys of tokenized data."""
    with open(vocab_file, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


class WordPieceTokenizer:
    """BERT WordPiece tokenizer (HF ``tokenizers`` backend) for a ``vocab.txt``.

    Attributes:
      vocab: list of tokens, index = id.
      vocab_size: ``len(vocab)``.
      special: ``SpecialTokenIds`` of this vocab.
      is_continuation: bool ``[vocab_size]``, True for ``##`` pieces (whole-word masking).
      do_lower_case: whether text is lower-cased (and accents stripped) before WordPiece.
    """

    def __init__(self, vocab_file: str | os.PathLike, *, do_lower_case: bool = True,
                 max_input_chars_per_word: int = MAX_INPUT_CHARS_PER_WORD):
        self.vocab_file = os.fspath(vocab_file)
        self.vocab = load_vocab(self.vocab_file)
        self.vocab_size = len(self.vocab)
        self.do_lower_case = do_lower_case
        token_to_id = {tok: i for i, tok in enumerate(self.vocab)}
        self.special = SpecialTokenIds(
            pad=token_to_id["[PAD]"], unk=token_to_id["[UNK]"], cls=token_to_id["[CLS]"],
            sep=token_to_id["[SEP]"], mask=token_to_id["[MASK]"])
        self.is_continuation = np.array(
            [t.startswith(CONTINUATION_PREFIX) and len(t) > len(CONTINUATION_PREFIX)
             for t in self.vocab], dtype=bool)
        tok = tokenizers.Tokenizer(models.WordPiece(
            token_to_id, unk_token="[UNK]", continuing_subword_prefix=CONTINUATION_PREFIX,
            max_input_chars_per_word=max_input_chars_per_word))
        # strip_accents=None: follows `lowercase`, as in the original BERT uncased/cased models.
        tok.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=None,
            lowercase=do_lower_case)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix=CONTINUATION_PREFIX)
        # Registering the specials keeps literal "[MASK]" etc. in text as single tokens, like
        # BertTokenizerFast does.
        tok.add_special_tokens(list(SPECIAL_TOKENS))
        self._tok = tok
        self._pieces: dict[str, list[int]] = {}  # word -> its ids (encode_batch)
        self._sentences: dict[str, np.ndarray] = {}  # text -> its ids (encode_batch)

    @property
    def backend(self) -> tokenizers.Tokenizer:
        """The underlying ``tokenizers.Tokenizer``."""
        return self._tok

    def encode(self, text: str) -> np.ndarray:
        """Token ids of one text, int32 ``[n]``, without special tokens."""
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """Token ids of many texts (parallel in Rust), each int32 ``[n_i]``, no specials."""
        if not texts:
            return []
        known = self._sentences
        out: list = [None] * len(texts)
        todo: dict[str, list[int]] = {}  # text not seen yet -> where it goes in `out`
        for i, text in enumerate(texts):
            ids = known.get(text)
            if ids is None:
                todo.setdefault(text, []).append(i)
            else:
                out[i] = ids.copy()
        fresh = list(todo)
        for text, ids in zip(fresh, self._encode_new(fresh)):
            where = todo[text]
            out[where[0]] = ids
            for i in where[1:]:
                out[i] = ids.copy()
            if len(known) < MAX_CACHED_SENTENCES:
                known[text] = ids.copy()
        return out

    def _encode_new(self, texts: list[str]) -> list[np.ndarray]:
        """encode_batch without the text cache: ASCII texts by their words' cached pieces."""
        if not texts:
            return []
        lower = self.do_lower_case
        words = [None if "[" in t else ascii_words(t, lower) for t in texts]
        pieces = self._pieces
        new = {w for ws in words if ws is not None for w in ws if w not in pieces}
        if len(pieces) + len(new) > MAX_CACHED_WORDS:
            pieces.clear()
            new = {w for ws in words if ws is not None for w in ws}
        if new:
            new_words = sorted(new)
            for w, e in zip(new_words, self._tok.encode_batch_fast(
                    new_words, add_special_tokens=False)):
                pieces[w] = e.ids
        others = [t for t, ws in zip(texts, words) if ws is None]
        encoded = iter(self._tok.encode_batch_fast(others, add_special_tokens=False)
                       if others else ())
        out = []
        for ws in words:
            if ws is None:
                out.append(np.asarray(next(encoded).ids, dtype=np.int32))
                continue
            ids: list[int] = []
            for w in ws:
                ids += pieces[w]
            out.append(np.asarray(ids, dtype=np.int32))
        return out

    def tokenize(self, text: str) -> list[str]:
        """Word pieces (strings) of one text."""
        return [self.vocab[i] for i in self.encode(text)]

    def convert_ids_to_tokens(self, ids: Sequence[int] | np.ndarray) -> list[str]:
        """Tokens for ids (``[UNK]``-safe: raises IndexError for ids outside the vocab)."""
        return [self.vocab[int(i)] for i in ids]

    def token_to_id(self, token: str) -> int | None:
        """Id of a token, or None when it is not in the vocab."""
        return self._tok.token_to_id(token)

    def decode(self, ids: Sequence[int] | np.ndarray) -> str:
        """Text for ids (``##`` pieces joined)."""
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False)


def special_token_ids(vocab_file: str | os.PathLike) -> SpecialTokenIds:
    """Ids of [PAD] [UNK] [CLS] [SEP] [MASK] in ``vocab_file``."""
    token_to_id = {tok: i for i, tok in enumerate(load_vocab(vocab_file))}
    return SpecialTokenIds(**{name: token_to_id[tok] for name, tok in zip(
        ("pad", "unk", "cls", "sep", "mask"), SPECIAL_TOKENS)})

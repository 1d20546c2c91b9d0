"""Tokenized documents: the corpus as BERT's instance creation reads it.

A ``TokenizedCorpus`` holds documents of WordPiece-tokenized sentences back to back (token ids
+ sentence and document offsets, with each document's SUBJECT_ID and source key). It is built
with ``CorpusBuilder`` or by ``tokenize_and_split``, which also splits off the held-out
documents (``heldout_draw``: a hash of the document's or patient's key, so the split does not
depend on the reading order).
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import numpy as np
import tqdm

from data_pipelines import tokenization


@dataclasses.dataclass
class TokenizedCorpus:
    """Documents of tokenized sentences, concatenated.

    Attributes:
      tokens: int32 [T], all sentences' token ids back to back.
      sentence_offsets: int64 [num_sentences + 1]; sentence j is
        ``tokens[sentence_offsets[j]:sentence_offsets[j + 1]]`` (never empty).
      doc_offsets: int64 [num_documents + 1]; document d is sentences
        ``doc_offsets[d]:doc_offsets[d + 1]`` (never empty).
      subject_ids: int64 [num_documents], the document's SUBJECT_ID or ``NO_SUBJECT``.
      doc_keys: int64 [num_documents], the document's key in its source (ROW_ID for notes, a
        hash of its text for text corpora: ``documents.content_key``); never a position.
    """

    tokens: np.ndarray
    sentence_offsets: np.ndarray
    doc_offsets: np.ndarray
    subject_ids: np.ndarray
    doc_keys: np.ndarray

    @property
    def num_documents(self) -> int:
        return len(self.doc_offsets) - 1

    @property
    def num_sentences(self) -> int:
        return len(self.sentence_offsets) - 1

    def select(self, doc_indices: Sequence[int] | np.ndarray) -> "TokenizedCorpus":
        """A new corpus made of the given documents, in that order."""
        builder = CorpusBuilder()
        for d in doc_indices:
            s0, s1 = self.doc_offsets[d], self.doc_offsets[d + 1]
            builder.add_document(
                [self.tokens[self.sentence_offsets[j]:self.sentence_offsets[j + 1]]
                 for j in range(s0, s1)], int(self.subject_ids[d]), int(self.doc_keys[d]))
        return builder.build()


class CorpusBuilder:
    """Accumulates tokenized documents into a ``TokenizedCorpus``."""

    def __init__(self):
        self._tokens: list[np.ndarray] = []
        self._sentence_lengths: list[int] = []
        self._doc_lengths: list[int] = []
        self._subjects: list[int] = []
        self._keys: list[int] = []

    def add_document(self, sentences: Sequence[np.ndarray], subject_id: int,
                     doc_key: int) -> bool:
        """Adds a document, skipping empty sentences; returns False when nothing was left."""
        kept = [s for s in sentences if len(s)]
        if not kept:
            return False
        self._tokens.extend(kept)
        self._sentence_lengths.extend(len(s) for s in kept)
        self._doc_lengths.append(len(kept))
        self._subjects.append(int(subject_id))
        self._keys.append(int(doc_key))
        return True

    def build(self) -> TokenizedCorpus:
        tokens = (np.concatenate(self._tokens).astype(np.int32) if self._tokens
                  else np.zeros([0], np.int32))
        return TokenizedCorpus(
            tokens=tokens,
            sentence_offsets=np.concatenate([[0], np.cumsum(self._sentence_lengths)]).astype(
                np.int64),
            doc_offsets=np.concatenate([[0], np.cumsum(self._doc_lengths)]).astype(np.int64),
            subject_ids=np.asarray(self._subjects, dtype=np.int64),
            doc_keys=np.asarray(self._keys, dtype=np.int64))


def heldout_draw(seed: int, key: int) -> float:
    """A uniform number in [0, 1) that is a pure function of (seed, key).

    The held-out split puts a document (or a subject) in the eval set when its draw is below
    ``eval_fraction``: deterministic, streaming (no document list needed), and stable when the
    corpus grows.
    """
    digest = hashlib.sha256(f"heldout:{seed}:{key}".encode()).digest()
    return int.from_bytes(digest[:8], "little") / 2.0**64


def tokenize_and_split(documents: Iterable[Any], tokenizer: tokenization.WordPieceTokenizer, *,
                       is_eval: Callable[[Any], bool] | None = None,
                       chunk_documents: int = 512, progress: bool = True,
                       desc: str = "tokenizing") -> tuple[TokenizedCorpus, TokenizedCorpus]:
    """Tokenizes documents into a training and a held-out corpus, streaming.

    Args:
      documents: objects with ``.sentences: list[str]``, ``.subject_id: int`` and
        ``.key: int`` (``documents.Document``).
      tokenizer: the WordPiece tokenizer.
      is_eval: document -> True when it belongs to the held-out set (None: nothing held out).

    Returns:
      (train, eval) corpora. Sentences that tokenize to nothing and documents left without
      sentences are dropped (BERT drops empty documents too). Tokenization runs in batches in
      Rust (multi-threaded).
    """
    builders = (CorpusBuilder(), CorpusBuilder())
    pending: list[Any] = []

    def flush() -> None:
        flat = [s for doc in pending for s in doc.sentences]
        ids = tokenizer.encode_batch(flat)
        k = 0
        for doc in pending:
            n = len(doc.sentences)
            target = builders[1] if is_eval is not None and is_eval(doc) else builders[0]
            target.add_document(ids[k:k + n], doc.subject_id, doc.key)
            k += n
        pending.clear()

    for doc in tqdm.tqdm(documents, desc=desc, unit=" docs", disable=not progress,
                         mininterval=2.0):
        pending.append(doc)
        if len(pending) >= chunk_documents:
            flush()
    if pending:
        flush()
    return builders[0].build(), builders[1].build()


def tokenize_documents(documents: Iterable[Any], tokenizer: tokenization.WordPieceTokenizer,
                       **kwargs: Any) -> TokenizedCorpus:
    """Tokenizes documents into one corpus (see ``tokenize_and_split``)."""
    return tokenize_and_split(documents, tokenizer, is_eval=None, **kwargs)[0]

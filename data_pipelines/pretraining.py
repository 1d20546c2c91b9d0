"""BERT pretraining examples: offline instance creation, online masking, host-side datasets.

Faithful to google-research/bert ``create_pretraining_data.py``, split in two stages so that
DP training counts a FIXED set of examples:

1. **Offline** (``create_instances``): documents of tokenized sentences -> N unmasked instances
   ``[CLS] A [SEP] B [SEP]`` (target length ``max_seq_length - 3``, shorter with
   ``short_seq_prob``; B is a random segment of another document half the time, the unused
   segments are put back; ``truncate_seq_pair`` trims the longer segment at the front or back at
   random). Deterministic in ``seed``; ``dupe_factor`` repeats the whole pass (different random
   segmentations of the same text). These N instances are the examples the accountant counts
   (privacy unit "example" = one sequence). Per instance we keep the documents and SUBJECT_IDs
   of segment A and of a random B, so a later "patient" privacy unit can be built.
   ``Instances`` stores them compactly (token ids concatenated + offsets) and saves/loads a
   cache directory of ``.npy`` files (memory-mapped on load).
2. **Online** (``PretrainingDataset.get_batch``): masking (``masked_lm_prob`` = 15 %, 80 % [MASK]
   / 10 % random token / 10 % unchanged, ``num_to_predict = min(max_predictions_per_seq,
   max(1, round(len(tokens) * masked_lm_prob)))``, optional whole-word masking, positions
   sorted) done afresh on every load with an RNG derived from ``(seed, step, index)``: the result
   depends on nothing else (not on the host, the batch composition or the order).

One way to read the examples: ``PretrainingDataset.get_batch(indices, step=...)``, random access
with fresh masking. The trainer's sampler (``dpbert.dp.sampling``: Poisson for DP, shuffled
epochs for public data) decides which indices make up each batch, every host loads only its own
rows, and ``prefetch`` (grain) prepares them ahead of the training step.

``build_datasets(config, vocab_file)`` wires corpus reading, sentence splitting, tokenization,
an optional canary stage, the document-level held-out split and the cache together;
``default_data_config()`` documents every field.

Feature layout (one example; a batch adds a leading axis B), see the shared contracts:
  input_ids int32 [S], input_mask int32 [S], segment_ids int32 [S],
  masked_lm_positions int32 [P], masked_lm_ids int32 [P], masked_lm_weights float32 [P],
  next_sentence_labels int32 [] (1 = B is random).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import random
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, TypeVar

import grain
import ml_collections
import numpy as np
import tqdm

from data_pipelines import tokenization

_log = logging.getLogger(__name__)

FEATURE_KEYS = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions",
                "masked_lm_ids", "masked_lm_weights", "next_sentence_labels")
NO_SUBJECT = -1  # subject id of documents whose patient is unknown (plain-text corpora)
# Bump when the instance-creation code changes in a way that changes its output: part of the
# cache fingerprint.
INSTANCES_FORMAT_VERSION = 2


# --------------------------------------------------------------------------------------------
# Tokenized documents
# --------------------------------------------------------------------------------------------

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
      doc_keys: int64 [num_documents], the document's key in its source (ROW_ID for notes, the
        document's ordinal in the stream for text corpora).
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
        builder = _CorpusBuilder()
        for d in doc_indices:
            s0, s1 = self.doc_offsets[d], self.doc_offsets[d + 1]
            builder.add_document(
                [self.tokens[self.sentence_offsets[j]:self.sentence_offsets[j + 1]]
                 for j in range(s0, s1)], int(self.subject_ids[d]), int(self.doc_keys[d]))
        return builder.build()


class _CorpusBuilder:
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
    builders = (_CorpusBuilder(), _CorpusBuilder())
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


# --------------------------------------------------------------------------------------------
# Offline stage: instances
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class InstanceParams:
    """Parameters of instance creation (the offline stage)."""

    max_seq_length: int = 128
    short_seq_prob: float = 0.1
    dupe_factor: int = 1
    seed: int = 12345

    def validate(self) -> None:
        if self.max_seq_length < 5:
            # [CLS] A [SEP] B [SEP] with A and B non-empty after truncation needs 2 tokens of room.
            raise ValueError(f"max_seq_length must be >= 5, got {self.max_seq_length}")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ValueError(f"short_seq_prob must be in [0, 1], got {self.short_seq_prob}")
        if self.dupe_factor < 1:
            raise ValueError(f"dupe_factor must be >= 1, got {self.dupe_factor}")


@dataclasses.dataclass
class Instances:
    """N unmasked pretraining instances, stored compactly.

    Attributes:
      tokens: int32 [T]: for instance i, segment A then segment B (no [CLS]/[SEP]) in
        ``tokens[offsets[i]:offsets[i + 1]]``.
      offsets: int64 [N + 1].
      a_lengths: int32 [N], length of segment A (B's length is the rest).
      is_random_next: bool [N], True when B comes from another document.
      doc_index: int32 [N], document of segment A (index in the corpus the instances were made
        from).
      b_doc_index: int32 [N], document of segment B (== doc_index unless is_random_next).
      subject_id: int64 [N], SUBJECT_ID of A's document (``NO_SUBJECT`` when unknown).
      b_subject_id: int64 [N], SUBJECT_ID of B's document.
      doc_key: int64 [N], source key of A's document (ROW_ID for notes, stream ordinal for
        text corpora).
      b_doc_key: int64 [N], source key of B's document.
    """

    tokens: np.ndarray
    offsets: np.ndarray
    a_lengths: np.ndarray
    is_random_next: np.ndarray
    doc_index: np.ndarray
    b_doc_index: np.ndarray
    subject_id: np.ndarray
    b_subject_id: np.ndarray
    doc_key: np.ndarray
    b_doc_key: np.ndarray

    _ARRAYS = ("tokens", "offsets", "a_lengths", "is_random_next", "doc_index", "b_doc_index",
               "subject_id", "b_subject_id", "doc_key", "b_doc_key")

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        """int64 [N]: len(A) + len(B) (the sequence length is this + 3)."""
        return np.diff(self.offsets)

    def segments(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        """(A, B) token ids of instance ``i``, int32 [len_a], [len_b]."""
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        mid = start + int(self.a_lengths[i])
        return self.tokens[start:mid], self.tokens[mid:end]

    def save(self, directory: str | os.PathLike) -> None:
        """Writes one ``.npy`` per array into ``directory`` (created)."""
        os.makedirs(directory, exist_ok=True)
        for name in self._ARRAYS:
            np.save(os.path.join(directory, f"{name}.npy"), getattr(self, name))

    @classmethod
    def load(cls, directory: str | os.PathLike, *, mmap: bool = True) -> "Instances":
        """Reads what ``save`` wrote (memory-mapped by default: large caches stay on disk)."""
        arrays = {}
        for name in cls._ARRAYS:
            path = os.path.join(directory, f"{name}.npy")
            if not os.path.isfile(path):
                raise FileNotFoundError(f"instance cache is incomplete: {path} is missing")
            arrays[name] = np.load(path, mmap_mode="r" if mmap else None)
        return cls(**arrays)


def _truncate_seq_pair(len_a: int, len_b: int, max_num_tokens: int,
                       rng: random.Random) -> tuple[int, int, int, int]:
    """BERT's ``truncate_seq_pair`` on lengths.

    Removes one token at a time from the longer segment (B on ties), from its front or its back
    with probability 1/2 each, until ``len_a + len_b <= max_num_tokens``.

    Returns:
      (cut_a_front, cut_a_back, cut_b_front, cut_b_back).
    """
    cuts = [0, 0, 0, 0]
    while len_a + len_b > max_num_tokens:
        if len_a > len_b:
            len_a -= 1
            cuts[0 if rng.random() < 0.5 else 1] += 1
        else:
            len_b -= 1
            cuts[2 if rng.random() < 0.5 else 3] += 1
    return cuts[0], cuts[1], cuts[2], cuts[3]


def create_instances(corpus: TokenizedCorpus, params: InstanceParams, *,
                     progress: bool = True) -> Instances:
    """The offline stage: ``create_pretraining_data``'s instance creation without masking.

    Follows the original algorithm step for step with a ``random.Random(seed)``: documents are
    shuffled once; for each of ``dupe_factor`` passes and each document, sentences are gathered
    into a chunk until the target length is reached (the target is ``max_seq_length - 3``, or
    with probability ``short_seq_prob`` a uniform integer in [2, max_seq_length - 3], drawn once
    per document and pass, as in the original); A is the first ``a_end`` sentences of the chunk
    (``a_end`` uniform in [1, len(chunk) - 1]); B is the rest of the chunk, or (always when the
    chunk has one sentence, else with probability 1/2) a run of sentences from a random other
    document starting at a random sentence, in which case the unused sentences of the chunk are
    put back; the pair is truncated to ``max_seq_length - 3`` tokens. Finally the instances are
    shuffled.

    Args:
      corpus: the tokenized documents (at least one).
      params: ``InstanceParams``.

    Returns:
      ``Instances`` (N >= 1).

    Raises:
      ValueError: the corpus has no document, or no instance could be made.
    """
    params.validate()
    num_docs = corpus.num_documents
    if num_docs == 0:
        raise ValueError("cannot create pretraining instances: the corpus has no document "
                         "with text")
    if num_docs == 1:
        _log.warning("the corpus has a single document: 'random next' segments come from it")
    rng = random.Random(params.seed)
    # Plain lists: indexing them is much faster than indexing NumPy arrays element-wise.
    sent_len = np.diff(corpus.sentence_offsets).tolist()
    sent_start = corpus.sentence_offsets[:-1].tolist()
    doc_first = corpus.doc_offsets[:-1].tolist()
    doc_count = np.diff(corpus.doc_offsets).tolist()
    order = list(range(num_docs))
    rng.shuffle(order)  # the original shuffles its document list once, before all passes

    max_num_tokens = params.max_seq_length - 3
    tokens = corpus.tokens

    def gather(first_sentence: int, n: int, cut_front: int, cut_back: int) -> np.ndarray:
        start = sent_start[first_sentence]
        end = sent_start[first_sentence + n - 1] + sent_len[first_sentence + n - 1]
        return tokens[start + cut_front:end - cut_back]

    pieces: list[np.ndarray] = []
    a_lengths: list[int] = []
    is_random: list[bool] = []
    doc_a: list[int] = []
    doc_b: list[int] = []
    total = params.dupe_factor * num_docs
    bar = tqdm.tqdm(total=total, desc="creating instances", unit=" docs", disable=not progress,
                    mininterval=2.0)
    for _ in range(params.dupe_factor):
        for position in range(num_docs):
            doc = order[position]
            first, count = doc_first[doc], doc_count[doc]
            target = max_num_tokens
            if rng.random() < params.short_seq_prob:
                target = rng.randint(2, max_num_tokens)
            chunk_start, chunk_len, chunk_tokens = 0, 0, 0
            i = 0
            while i < count:
                chunk_len += 1
                chunk_tokens += sent_len[first + i]
                if i == count - 1 or chunk_tokens >= target:
                    # chunk = sentences [first + chunk_start, first + chunk_start + chunk_len)
                    a_end = rng.randint(1, chunk_len - 1) if chunk_len >= 2 else 1
                    c0 = first + chunk_start
                    len_a = sum(sent_len[c0:c0 + a_end])
                    if chunk_len == 1 or rng.random() < 0.5:
                        random_next = True
                        target_b = target - len_a
                        other = position
                        for _ in range(10):  # the original tries 10 times to avoid itself
                            other = rng.randint(0, num_docs - 1)
                            if other != position:
                                break
                        other_doc = order[other]
                        o_first, o_count = doc_first[other_doc], doc_count[other_doc]
                        b_first = o_first + rng.randint(0, o_count - 1)
                        b_n, len_b = 0, 0
                        for j in range(b_first, o_first + o_count):
                            b_n += 1
                            len_b += sent_len[j]
                            if len_b >= target_b:
                                break
                        # Put the unused segments of the chunk back for the next instance.
                        i -= chunk_len - a_end
                        b_document = other_doc
                    else:
                        random_next = False
                        b_first, b_n = c0 + a_end, chunk_len - a_end
                        len_b = sum(sent_len[b_first:b_first + b_n])
                        b_document = doc
                    cfa, cba, cfb, cbb = _truncate_seq_pair(len_a, len_b, max_num_tokens, rng)
                    a = gather(c0, a_end, cfa, cba)
                    b = gather(b_first, b_n, cfb, cbb)
                    # Non-empty by construction (the longer segment is cut, max_num_tokens >= 2).
                    assert len(a) >= 1 and len(b) >= 1, (len(a), len(b))
                    pieces.append(a)
                    pieces.append(b)
                    a_lengths.append(len(a))
                    is_random.append(random_next)
                    doc_a.append(doc)
                    doc_b.append(b_document)
                    chunk_start, chunk_len, chunk_tokens = i + 1, 0, 0
                i += 1
            bar.update(1)
    bar.close()
    n = len(a_lengths)
    if n == 0:
        raise ValueError("no pretraining instance could be created from the corpus")
    perm = list(range(n))
    rng.shuffle(perm)  # the original shuffles its instance list at the end
    lengths = np.asarray([len(pieces[2 * k]) + len(pieces[2 * k + 1]) for k in perm], np.int64)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    flat = np.concatenate([p for k in perm for p in (pieces[2 * k], pieces[2 * k + 1])])
    perm_arr = np.asarray(perm)
    doc_a_arr = np.asarray(doc_a, np.int32)[perm_arr]
    doc_b_arr = np.asarray(doc_b, np.int32)[perm_arr]
    return Instances(
        tokens=flat.astype(np.int32),
        offsets=offsets,
        a_lengths=np.asarray(a_lengths, np.int32)[perm_arr],
        is_random_next=np.asarray(is_random, bool)[perm_arr],
        doc_index=doc_a_arr,
        b_doc_index=doc_b_arr,
        subject_id=corpus.subject_ids[doc_a_arr].astype(np.int64),
        b_subject_id=corpus.subject_ids[doc_b_arr].astype(np.int64),
        doc_key=corpus.doc_keys[doc_a_arr].astype(np.int64),
        b_doc_key=corpus.doc_keys[doc_b_arr].astype(np.int64))


# --------------------------------------------------------------------------------------------
# Online stage: masking
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class MaskingParams:
    """Parameters of the masked-LM stage."""

    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    whole_word_masking: bool = False

    def validate(self) -> None:
        if not 0.0 < self.masked_lm_prob < 1.0:
            raise ValueError(f"masked_lm_prob must be in (0, 1), got {self.masked_lm_prob}")
        if self.max_predictions_per_seq < 1:
            raise ValueError(
                f"max_predictions_per_seq must be >= 1, got {self.max_predictions_per_seq}")


def num_to_predict(num_tokens: int, params: MaskingParams) -> int:
    """BERT's count of masked positions for a sequence of ``num_tokens`` (incl. [CLS]/[SEP])."""
    # Python's round (half to even), as in the original under Python 3.
    return min(params.max_predictions_per_seq,
               max(1, int(round(num_tokens * params.masked_lm_prob))))


def mask_sequence(input_ids: np.ndarray, len_a: int, len_b: int, params: MaskingParams,
                  special: tokenization.SpecialTokenIds, vocab_size: int,
                  is_continuation: np.ndarray | None, rng: np.random.Generator,
                  ) -> tuple[np.ndarray, np.ndarray]:
    """BERT's masked-LM selection on one ``[CLS] A [SEP] B [SEP]`` sequence, in place.

    Candidates are all positions except [CLS] and the two [SEP]s. Without whole-word masking,
    ``num_to_predict`` distinct candidates are chosen uniformly. With it, candidates are grouped
    into words (a ``##`` piece joins the previous piece of the same segment), the words are
    shuffled and taken greedily, skipping a word that would overshoot ``num_to_predict``.
    Every chosen position independently becomes [MASK] (80 %), stays (10 %) or becomes a token
    drawn uniformly from the whole vocabulary (10 %), as in the original.

    Args:
      input_ids: int32 [n] with n = len_a + len_b + 3; modified in place.
      len_a, len_b: segment lengths.
      is_continuation: bool [vocab_size] (``##`` pieces); needed for whole-word masking.
      rng: the example's generator.

    Returns:
      (positions int32 [k] sorted, original ids int32 [k]) with k <= max_predictions_per_seq.
    """
    n = len_a + len_b + 3
    k = num_to_predict(n, params)
    candidates = np.concatenate([np.arange(1, 1 + len_a), np.arange(2 + len_a, 2 + len_a + len_b)])
    if not params.whole_word_masking:
        chosen = candidates[rng.permutation(len(candidates))[:k]]
    else:
        if is_continuation is None:
            raise ValueError("whole_word_masking needs the vocab's continuation flags")
        starts = ~is_continuation[input_ids[candidates]]
        # A segment's first piece always starts a word (the original's group could cross [SEP]).
        starts[0] = True
        starts[len_a] = True
        group_starts = np.flatnonzero(starts)
        group_ends = np.append(group_starts[1:], len(candidates))
        chosen_list: list[int] = []
        for g in rng.permutation(len(group_starts)):
            if len(chosen_list) >= k:
                break
            size = group_ends[g] - group_starts[g]
            if len(chosen_list) + size > k:
                continue
            chosen_list.extend(candidates[group_starts[g]:group_ends[g]].tolist())
        chosen = np.asarray(chosen_list, dtype=np.int64)
    chosen = np.sort(chosen)
    original = input_ids[chosen].copy()
    m = len(chosen)
    u = rng.random(m)
    keep = rng.random(m) < 0.5
    random_ids = rng.integers(0, vocab_size, size=m)
    replacement = np.where(u < 0.8, special.mask, np.where(keep, original, random_ids))
    input_ids[chosen] = replacement
    return chosen.astype(np.int32), original.astype(np.int32)


# Domain tags keep the masking RNG streams of different uses apart.
_MASK_DOMAIN_STEP = 1


class PretrainingDataset:
    """Random-access BERT pretraining examples with fresh masking at every load.

    The masking of example ``index`` at ``step`` uses
    ``np.random.default_rng([seed, domain, step, index])``: it is a pure function of those
    numbers, so results do not depend on which host loads the example, on the other examples in
    the batch, or on their order.

    Attributes:
      num_examples: N, the number of examples (what a DP accountant counts).
      instances: the underlying ``Instances``.
      metadata: free-form facts about how the examples were made (corpus, counts, fingerprint,
        canary file, ...).
    """

    def __init__(self, instances: Instances, masking: MaskingParams, *,
                 special: tokenization.SpecialTokenIds, vocab_size: int,
                 is_continuation: np.ndarray | None = None, seed: int = 0,
                 metadata: dict[str, Any] | None = None):
        masking.validate()
        if len(instances) == 0:
            raise ValueError("PretrainingDataset needs at least one instance")
        max_len = int(instances.lengths.max()) + 3
        if max_len > masking.max_seq_length:
            raise ValueError(f"instances are up to {max_len} tokens long but max_seq_length is "
                             f"{masking.max_seq_length}")
        if masking.whole_word_masking and is_continuation is None:
            raise ValueError("whole_word_masking=True needs is_continuation")
        self.instances = instances
        self.masking = masking
        self.special = special
        self.vocab_size = int(vocab_size)
        self.is_continuation = is_continuation
        self.seed = int(seed)
        self.metadata = dict(metadata or {})
        self.num_examples = len(instances)
        # Copies of small per-instance arrays: fast element access even when memory-mapped.
        self._offsets = np.asarray(instances.offsets, dtype=np.int64)
        self._a_lengths = np.asarray(instances.a_lengths, dtype=np.int64)
        self._is_random = np.asarray(instances.is_random_next, dtype=bool)

    def __len__(self) -> int:
        return self.num_examples

    @property
    def subject_ids(self) -> np.ndarray:
        """int64 [N]: SUBJECT_ID of each example's segment A (``NO_SUBJECT`` when unknown)."""
        return np.asarray(self.instances.subject_id)

    def _rng(self, domain: int, step: int, index: int) -> np.random.Generator:
        return np.random.default_rng([self.seed, domain, step, index])

    def _fill(self, out: dict[str, np.ndarray], row: int, index: int,
              rng: np.random.Generator) -> None:
        start, end = self._offsets[index], self._offsets[index + 1]
        len_a = int(self._a_lengths[index])
        len_b = int(end - start) - len_a
        n = len_a + len_b + 3
        seq = np.empty([n], np.int32)
        seq[0] = self.special.cls
        seq[1:1 + len_a] = self.instances.tokens[start:start + len_a]
        seq[1 + len_a] = self.special.sep
        seq[2 + len_a:2 + len_a + len_b] = self.instances.tokens[start + len_a:end]
        seq[n - 1] = self.special.sep
        positions, labels = mask_sequence(seq, len_a, len_b, self.masking, self.special,
                                          self.vocab_size, self.is_continuation, rng)
        out["input_ids"][row, :n] = seq
        out["input_mask"][row, :n] = 1
        out["segment_ids"][row, 2 + len_a:n] = 1
        k = len(positions)
        out["masked_lm_positions"][row, :k] = positions
        out["masked_lm_ids"][row, :k] = labels
        out["masked_lm_weights"][row, :k] = 1.0
        out["next_sentence_labels"][row] = int(self._is_random[index])

    def _empty_batch(self, batch_size: int) -> dict[str, np.ndarray]:
        s, p = self.masking.max_seq_length, self.masking.max_predictions_per_seq
        return {
            "input_ids": np.zeros([batch_size, s], np.int32),
            "input_mask": np.zeros([batch_size, s], np.int32),
            "segment_ids": np.zeros([batch_size, s], np.int32),
            "masked_lm_positions": np.zeros([batch_size, p], np.int32),
            "masked_lm_ids": np.zeros([batch_size, p], np.int32),
            "masked_lm_weights": np.zeros([batch_size, p], np.float32),
            "next_sentence_labels": np.zeros([batch_size], np.int32),
        }

    def _batch(self, indices: np.ndarray, keys: np.ndarray, domain: int) -> dict[str, np.ndarray]:
        indices = np.asarray(indices)
        if indices.ndim != 1:
            raise ValueError(f"indices must be 1-D, got shape {indices.shape}")
        if not np.issubdtype(indices.dtype, np.integer) and indices.size:
            raise ValueError(f"indices must be integers, got dtype {indices.dtype}")
        if indices.size and (indices.min() < 0 or indices.max() >= self.num_examples):
            raise IndexError(f"example index out of range [0, {self.num_examples}): "
                             f"min {indices.min()}, max {indices.max()}")
        out = self._empty_batch(len(indices))
        for row, (index, key) in enumerate(zip(indices.tolist(), keys.tolist())):
            if key < 0:
                raise ValueError(f"step/epoch must be >= 0, got {key}")
            self._fill(out, row, index, self._rng(domain, key, index))
        return out

    def get_batch(self, indices: np.ndarray, *, step: int) -> dict[str, np.ndarray]:
        """Features of the examples ``indices``, masked for training step ``step``.

        Args:
          indices: int [B], example indices in [0, num_examples) (repeats allowed).
          step: the training step (>= 0); the same (step, index) always gives the same masking.

        Returns:
          The feature dict (see module docstring) with leading axis B.
        """
        indices = np.asarray(indices)
        return self._batch(indices, np.full(indices.shape, int(step), np.int64),
                           _MASK_DOMAIN_STEP)



# --------------------------------------------------------------------------------------------
# Prefetching
# --------------------------------------------------------------------------------------------

U = TypeVar("U")


def prefetch(fn: Callable[[int], U], start: int, stop: int, *, buffer_size: int = 2
             ) -> Iterator[U]:
    """``fn(start), fn(start + 1), ..., fn(stop - 1)``, computed up to ``buffer_size`` items
    ahead of the consumer by a grain reader thread.

    The trainer uses it with ``fn = call -> this host's rows of that call's batch``. Order is
    kept; an exception in ``fn`` is raised in the consumer; dropping the iterator stops the
    reader. One thread: ``fn`` need not be thread-safe.
    """
    if buffer_size < 1:
        raise ValueError(f"buffer_size must be >= 1, got {buffer_size}")
    if stop <= start:
        return iter(())
    items = grain.MapDataset.range(start, stop).map(fn)
    return iter(items.to_iter_dataset(
        grain.ReadOptions(num_threads=1, prefetch_buffer_size=buffer_size)))


# --------------------------------------------------------------------------------------------
# Configuration and the factory
# --------------------------------------------------------------------------------------------

CORPUS_KINDS = ("text", "noteevents", "synthetic", "tfds")


def default_data_config() -> ml_collections.ConfigDict:
    """Defaults of the ``data`` section of an experiment config (every field commented)."""
    c = ml_collections.ConfigDict()
    # Which corpus: "text" (BERT text files), "noteevents" (MIMIC-III NOTEEVENTS.csv(.gz)),
    # "synthetic" (generated clinical notes, no files needed) or "tfds" (prepared TFDS datasets).
    c.corpus = "synthetic"
    # Input files. text: one or more files, one sentence per line, blank line between documents
    # (.gz allowed). noteevents: one NOTEEVENTS.csv or NOTEEVENTS.csv.gz.
    c.paths = ()
    # noteevents / tfds mimic_noteevents: keep only notes of these CATEGORY values, e.g.
    # ("Discharge summary",); () keeps all.
    c.noteevents_categories = ()
    # synthetic: number of generated notes and their seed.
    c.synthetic_num_notes = 2000
    c.synthetic_seed = 0
    # tfds: dataset names read with tfds.data_source (must be prepared; nothing downloads),
    # e.g. ("wikipedia/20230601.en", "bookcorpus") or ("mimic_noteevents",).
    c.tfds_names = ("wikipedia/20230601.en",)
    # tfds: data directory ("" = $TFDS_DATA_DIR or ~/tensorflow_datasets) and split.
    c.tfds_data_dir = ""
    c.tfds_split = "train"
    # tfds: name of the text feature.
    c.tfds_text_key = "text"
    # tfds: datasets whose examples are single sentences (e.g. a sentence-level BookCorpus);
    # tfds_sentences_per_document consecutive sentences of them form one document.
    c.tfds_sentence_datasets = ()
    c.tfds_sentences_per_document = 256
    # Use at most this many documents per source (0 = all); for quick runs.
    c.max_documents = 0
    # Sentences longer than this many characters are cut at whitespace (pasted tables).
    c.max_sentence_chars = 1000
    # Sequence length S of every example ([CLS] A [SEP] B [SEP] + padding).
    c.max_seq_length = 128
    # P: the maximum number of masked positions per example.
    c.max_predictions_per_seq = 20
    # Fraction of tokens masked (BERT: 0.15), then 80 % [MASK] / 10 % random / 10 % unchanged.
    c.masked_lm_prob = 0.15
    # Probability that a document's target length is drawn shorter (BERT: 0.1).
    c.short_seq_prob = 0.1
    # Number of instance-creation passes over the corpus (different segmentations). Each pass
    # adds examples containing the same text: with example-level DP a sentence then appears in
    # up to dupe_factor examples (group privacy). 1 is right for DP; BERT used 10 offline.
    c.dupe_factor = 1
    # Mask whole words (all ## pieces of a word together).
    c.whole_word_masking = False
    # Lower-case (and strip accents) before WordPiece; must match the vocab (uncased: True).
    c.do_lower_case = True
    # Fraction of documents held out for evaluation (0 = no eval set).
    c.eval_fraction = 0.01
    # Hold out whole "document"s, or whole "subject"s (patients: all their notes; needs
    # SUBJECT_IDs, i.e. noteevents / synthetic / mimic_noteevents).
    c.eval_split_unit = "document"
    # Seed of the held-out split, instance creation and masking.
    c.seed = 12345
    # Directory for the cache of created instances ("" = no cache: rebuilt in memory each run).
    # Entries are keyed by a fingerprint of (corpus files, vocab, parameters).
    c.cache_dir = ""
    # Secret-sharer canaries planted in the TRAINING documents (Hoory et al. Sec. 5.2).
    c.canaries = ml_collections.ConfigDict()
    c.canaries.enabled = False
    # Forms: H = generic word, S = secret word piece drawn from the vocab.
    c.canaries.forms = ("HS", "HSH", "HHSHH")
    # Each canary is planted this many times; one (or per_setting) canary per (form, count).
    # 0 makes reference canaries that are never planted (the exposure floor).
    c.canaries.repetitions = (0, 1, 10, 100)
    c.canaries.per_setting = 1
    # Seed of the secrets and of the planting positions.
    c.canaries.seed = 0
    # Where to write the canary JSON record ("" = canaries.json in the cache entry; one of the
    # two is required).
    c.canaries.output_file = ""
    # Plant exactly the canaries of this canary file (data_pipelines.canaries format, same
    # vocab), each by its own placement and repetitions, instead of generating them from forms /
    # repetitions / per_setting ("" = generate). Privacy audits plant their examples this way.
    c.canaries.file = ""
    # Batches prepared ahead of the trainer by background threads.
    c.prefetch = 2
    return c


def _check_config(cfg: ml_collections.ConfigDict) -> None:
    """One clear error per bad field (names the key and the value)."""
    def bad(key: str, why: str) -> ValueError:
        return ValueError(f"data.{key}={cfg.get(key)!r}: {why}")

    if cfg.corpus not in CORPUS_KINDS:
        raise bad("corpus", f"must be one of {CORPUS_KINDS}")
    if cfg.max_seq_length < 5:
        raise bad("max_seq_length", "must be >= 5")
    if not 0.0 < cfg.masked_lm_prob < 1.0:
        raise bad("masked_lm_prob", "must be in (0, 1)")
    if cfg.max_predictions_per_seq < 1:
        raise bad("max_predictions_per_seq", "must be >= 1")
    if cfg.max_predictions_per_seq > cfg.max_seq_length - 3:
        raise bad("max_predictions_per_seq", f"must be <= max_seq_length - 3 = "
                                             f"{cfg.max_seq_length - 3}")
    if not 0.0 <= cfg.short_seq_prob <= 1.0:
        raise bad("short_seq_prob", "must be in [0, 1]")
    if cfg.dupe_factor < 1:
        raise bad("dupe_factor", "must be >= 1")
    if not 0.0 <= cfg.eval_fraction < 1.0:
        raise bad("eval_fraction", "must be in [0, 1)")
    if cfg.eval_split_unit not in ("document", "subject"):
        raise bad("eval_split_unit", "must be 'document' or 'subject'")
    if cfg.eval_split_unit == "subject" and cfg.corpus == "text":
        raise bad("eval_split_unit", "plain-text corpora have no subjects; use 'document'")
    if cfg.seed < 0:
        raise bad("seed", "must be >= 0")
    if cfg.max_documents < 0:
        raise bad("max_documents", "must be >= 0 (0 = all)")
    if isinstance(cfg.paths, str):
        raise bad("paths", "must be a tuple of paths, e.g. ('a.txt',)")
    if cfg.corpus in ("text", "noteevents") and not cfg.paths:
        raise bad("paths", f"the {cfg.corpus} corpus needs its file path(s)")
    if cfg.corpus == "noteevents" and len(cfg.paths) != 1:
        raise bad("paths", "noteevents needs exactly one NOTEEVENTS.csv(.gz) path")
    if cfg.corpus == "synthetic" and cfg.synthetic_num_notes < 2:
        raise bad("synthetic_num_notes", "must be >= 2")
    if cfg.corpus == "tfds" and not cfg.tfds_names:
        raise bad("tfds_names", "give at least one prepared TFDS dataset name")
    if cfg.canaries.enabled and not (cfg.cache_dir or cfg.canaries.output_file):
        raise ValueError("data.canaries.enabled=True needs data.canaries.output_file or "
                         "data.cache_dir (where the canary record is written)")
    if cfg.canaries.enabled and cfg.canaries.file and not os.path.isfile(cfg.canaries.file):
        raise FileNotFoundError(f"data.canaries.file={cfg.canaries.file!r}: file not found")


def _file_identity(path: str) -> dict[str, Any]:
    """Cheap identity of a (possibly huge) file: path, size, mtime and hashes of its ends."""
    st = os.stat(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        if st.st_size > 2 << 20:
            f.seek(-(1 << 20), os.SEEK_END)
            h.update(f.read(1 << 20))
    return {"path": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "ends_sha256": h.hexdigest()}


def _tfds_identity(cfg: ml_collections.ConfigDict) -> list[dict[str, Any]]:
    from data_pipelines import tfds_data  # noqa: PLC0415 - TFDS import only when used

    root = tfds_data._resolve_data_dir(cfg.tfds_data_dir or None)  # noqa: SLF001
    out = []
    for name in cfg.tfds_names:
        folder = os.path.join(root, *name.replace(":", "/").split("/"))
        files = []
        if os.path.isdir(folder):
            for dirpath, _, filenames in sorted(os.walk(folder)):
                for fn in sorted(filenames):
                    st = os.stat(os.path.join(dirpath, fn))
                    files.append([os.path.relpath(os.path.join(dirpath, fn), folder),
                                  st.st_size, st.st_mtime_ns])
        out.append({"name": name, "root": root, "files": files})
    return out


def _corpus_spec(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    """What identifies the corpus (part of the cache fingerprint); checks files exist."""
    from data_pipelines import documents  # noqa: PLC0415

    spec: dict[str, Any] = {"corpus": cfg.corpus, "max_documents": cfg.max_documents,
                            "max_sentence_chars": cfg.max_sentence_chars}
    if cfg.corpus == "text":
        paths = documents.check_paths(list(cfg.paths), "text")
        spec["files"] = [_file_identity(p) for p in paths]
    elif cfg.corpus == "noteevents":
        paths = documents.check_paths(list(cfg.paths), "noteevents")
        spec["files"] = [_file_identity(p) for p in paths]
        spec["categories"] = sorted(cfg.noteevents_categories)
    elif cfg.corpus == "synthetic":
        spec["synthetic"] = [cfg.synthetic_num_notes, cfg.synthetic_seed]
    else:
        spec["tfds"] = _tfds_identity(cfg)
        spec["tfds_options"] = [cfg.tfds_split, cfg.tfds_text_key,
                                sorted(cfg.tfds_sentence_datasets),
                                cfg.tfds_sentences_per_document,
                                sorted(cfg.noteevents_categories)]
    return spec


def _capped(docs: Iterable[Any], limit: int) -> Iterator[Any]:
    for i, d in enumerate(docs):
        if limit and i >= limit:
            return
        yield d


def _documents(cfg: ml_collections.ConfigDict, read_stats: list) -> Iterator[Any]:
    """All documents of the configured corpus."""
    from data_pipelines import corpora, documents  # noqa: PLC0415

    limit = cfg.max_documents
    if cfg.corpus == "text":
        yield from _capped(documents.text_documents(list(cfg.paths), read_stats), limit)
    elif cfg.corpus == "noteevents":
        st = corpora.ReadStats()
        read_stats.append(st)
        yield from _capped(documents.noteevents_documents(
            cfg.paths[0], categories=cfg.noteevents_categories,
            max_sentence_chars=cfg.max_sentence_chars, stats=st), limit)
    elif cfg.corpus == "synthetic":
        yield from documents.synthetic_documents(cfg.synthetic_num_notes,
                                                 seed=cfg.synthetic_seed,
                                                 max_sentence_chars=cfg.max_sentence_chars)
    else:
        from data_pipelines import tfds_data  # noqa: PLC0415

        key_base = 0
        for name in cfg.tfds_names:
            per_doc = (cfg.tfds_sentences_per_document if name in cfg.tfds_sentence_datasets
                       else 0)
            docs = tfds_data.tfds_documents(
                name, split=cfg.tfds_split, data_dir=cfg.tfds_data_dir or None,
                text_key=cfg.tfds_text_key, sentences_per_document=per_doc,
                max_documents=limit, max_sentence_chars=cfg.max_sentence_chars)
            if cfg.noteevents_categories and name == tfds_data.NOTEEVENTS_NAME:
                _log.warning("noteevents_categories is not applied to TFDS sources")
            last = -1
            for d in docs:
                # Keys must be unique across sources for the held-out split.
                last = d.key
                yield dataclasses.replace(d, key=key_base + d.key)
            key_base += last + 1


def _instances_fingerprint(cfg: ml_collections.ConfigDict, vocab_file: str) -> str:
    payload = {
        "format": INSTANCES_FORMAT_VERSION,
        "corpus": _corpus_spec(cfg),
        "vocab_sha256": tokenization.vocab_fingerprint(vocab_file),
        "do_lower_case": cfg.do_lower_case,
        "max_seq_length": cfg.max_seq_length,
        "short_seq_prob": cfg.short_seq_prob,
        "dupe_factor": cfg.dupe_factor,
        "eval": [cfg.eval_fraction, cfg.eval_split_unit],
        "seed": cfg.seed,
        "canaries": (cfg.canaries.to_dict() if cfg.canaries.enabled else None),
    }
    if payload["canaries"]:
        payload["canaries"].pop("output_file", None)
        if payload["canaries"].get("file"):
            with open(payload["canaries"]["file"], "rb") as f:
                payload["canaries"]["file"] = hashlib.sha256(f.read()).hexdigest()
    blob = json.dumps(payload, sort_keys=True, default=list).encode()
    return hashlib.sha256(blob).hexdigest()[:20]


def _build_instances(cfg: ml_collections.ConfigDict, tok: tokenization.WordPieceTokenizer,
                     ) -> tuple[Instances, Instances | None, dict[str, Any], list]:
    """Reads, splits, tokenizes, plants canaries and creates instances (the offline stage)."""
    read_stats: list = []
    is_eval = None
    if cfg.eval_fraction > 0:
        by_subject = cfg.eval_split_unit == "subject"

        def is_eval(doc: Any) -> bool:
            if by_subject and doc.subject_id == NO_SUBJECT:
                raise ValueError(f"eval_split_unit='subject' but document {doc.key} has no "
                                 f"SUBJECT_ID")
            key = doc.subject_id if by_subject else doc.key
            return heldout_draw(cfg.seed, key) < cfg.eval_fraction

    train_corpus, eval_corpus = tokenize_and_split(_documents(cfg, read_stats), tok,
                                                   is_eval=is_eval)
    info: dict[str, Any] = {
        "read_stats": [s.summary() for s in read_stats],
        "train_documents": train_corpus.num_documents,
        "eval_documents": eval_corpus.num_documents,
        "train_subjects": int(len(np.unique(train_corpus.subject_ids[
            train_corpus.subject_ids != NO_SUBJECT]))),
    }
    if train_corpus.num_documents == 0:
        raise ValueError(f"the {cfg.corpus} corpus yielded no training document with text "
                         f"({'; '.join(info['read_stats']) or 'no reader statistics'})")
    if cfg.eval_fraction > 0 and eval_corpus.num_documents == 0:
        raise ValueError(f"data.eval_fraction={cfg.eval_fraction} held out no document of "
                         f"{train_corpus.num_documents}: raise it, or set 0 for no eval set")
    canary_list: list = []
    if cfg.canaries.enabled:
        from data_pipelines import canaries  # noqa: PLC0415

        if cfg.canaries.file:
            canary_list, record = canaries.load_canary_file(cfg.canaries.file)
            if record["vocab_fingerprint"] != tokenization.vocab_fingerprint(tok.vocab_file):
                raise ValueError(f"data.canaries.file={cfg.canaries.file!r} was made for another "
                                 f"vocabulary ({record.get('vocab_file')})")
        else:
            canary_list = canaries.make_canaries(
                tok, forms=cfg.canaries.forms, repetitions=cfg.canaries.repetitions,
                canaries_per_setting=cfg.canaries.per_setting, seed=cfg.canaries.seed)
        train_corpus = canaries.insert_canaries(train_corpus, canary_list,
                                                seed=cfg.canaries.seed)
    params = InstanceParams(max_seq_length=cfg.max_seq_length,
                            short_seq_prob=cfg.short_seq_prob,
                            dupe_factor=cfg.dupe_factor, seed=cfg.seed)
    train = create_instances(train_corpus, params)
    if canary_list:
        train = canaries.append_canary_examples(train, canary_list)
    eval_instances = None
    if eval_corpus.num_documents:
        eval_instances = create_instances(
            eval_corpus, dataclasses.replace(params, dupe_factor=1, seed=cfg.seed + 1))
    return train, eval_instances, info, canary_list


def build_datasets(data_config: ml_collections.ConfigDict, vocab_file: str | os.PathLike,
                   ) -> tuple[PretrainingDataset, PretrainingDataset | None]:
    """Corpus -> (train, eval) ``PretrainingDataset``s, through the instance cache.

    The offline stage (read, split held-out documents, tokenize, plant canaries, create
    instances) runs once per fingerprint of (corpus files, vocab, parameters) and is saved under
    ``cache_dir/<fingerprint>/``; later runs load it (memory-mapped). Every host computes the
    same result, so hosts may share the cache directory or each build their own.

    Args:
      data_config: ``default_data_config()`` with overrides.
      vocab_file: a BERT ``vocab.txt``.

    Returns:
      (train_ds, eval_ds); eval_ds is None when ``eval_fraction`` is 0. ``train_ds.metadata``
      holds the fingerprint, document / example counts and the canary file path.

    Raises:
      ValueError: a bad config value (naming the key), or a corpus without text.
      FileNotFoundError: a missing corpus file / vocab / unprepared TFDS dataset (naming it).
    """
    cfg = data_config
    _check_config(cfg)
    vocab_file = os.fspath(vocab_file)
    tok = tokenization.WordPieceTokenizer(vocab_file, do_lower_case=cfg.do_lower_case)
    fingerprint = _instances_fingerprint(cfg, vocab_file)
    entry = os.path.join(os.path.expanduser(cfg.cache_dir), fingerprint) if cfg.cache_dir else ""
    meta_path = os.path.join(entry, "meta.json") if entry else ""
    if entry and os.path.isfile(meta_path):
        _log.info("loading pretraining instances from the cache %s", entry)
        with open(meta_path, encoding="utf-8") as f:
            meta = json.load(f)
        train = Instances.load(os.path.join(entry, "train"))
        eval_instances = (Instances.load(os.path.join(entry, "eval"))
                          if meta["eval_examples"] else None)
        canary_file = meta.get("canary_file", "")
        if cfg.canaries.enabled and cfg.canaries.output_file and canary_file:
            if os.path.abspath(cfg.canaries.output_file) != os.path.abspath(canary_file):
                shutil.copyfile(canary_file, cfg.canaries.output_file)
                canary_file = os.path.abspath(cfg.canaries.output_file)
    else:
        train, eval_instances, info, canary_list = _build_instances(cfg, tok)
        meta = {
            "fingerprint": fingerprint, "corpus": cfg.corpus, **info,
            "train_examples": len(train),
            "eval_examples": len(eval_instances) if eval_instances is not None else 0,
            "train_tokens": int(len(train.tokens)),
            "max_seq_length": cfg.max_seq_length, "dupe_factor": cfg.dupe_factor,
            "privacy_unit_note": "one example = one instance ([CLS] A [SEP] B [SEP]); A and B "
                                 "may come from different documents/subjects "
                                 "(subject_id, b_subject_id)",
        }
        canary_file = ""
        write_canaries = None
        if canary_list:
            from data_pipelines import canaries  # noqa: PLC0415

            def write_canaries(target: str) -> None:
                canaries.write_canary_file(target, canary_list, tok, seed=cfg.canaries.seed,
                                           extra={"data_fingerprint": fingerprint})

            meta["canaries"] = len(canary_list)
            if cfg.canaries.output_file:
                write_canaries(cfg.canaries.output_file)
                canary_file = os.path.abspath(cfg.canaries.output_file)
        if entry:
            meta["canary_file"] = os.path.join(entry, "canaries.json") if canary_list else ""
            _save_entry(entry, train, eval_instances, meta, write_canaries)
            canary_file = canary_file or meta["canary_file"]
    masking = MaskingParams(max_seq_length=cfg.max_seq_length,
                            max_predictions_per_seq=cfg.max_predictions_per_seq,
                            masked_lm_prob=cfg.masked_lm_prob,
                            whole_word_masking=cfg.whole_word_masking)
    common = dict(special=tok.special, vocab_size=tok.vocab_size,
                  is_continuation=tok.is_continuation)
    meta = {**meta, "canary_file": canary_file, "cache_entry": entry}
    train_ds = PretrainingDataset(train, masking, seed=cfg.seed, metadata=meta, **common)
    eval_ds = None
    if eval_instances is not None:
        eval_ds = PretrainingDataset(eval_instances, masking, seed=cfg.seed + 1,
                                     metadata={**meta, "split": "eval"}, **common)
    _log.info("pretraining data: %d train examples, %s eval examples (fingerprint %s)",
              train_ds.num_examples, eval_ds.num_examples if eval_ds else 0, fingerprint)
    return train_ds, eval_ds


def _save_entry(entry: str, train: Instances, eval_instances: Instances | None,
                meta: dict[str, Any], write_canaries: Callable[[str], None] | None) -> None:
    """Writes a cache entry atomically (a temp folder renamed into place)."""
    parent = os.path.dirname(entry)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-", dir=parent)
    try:
        train.save(os.path.join(tmp, "train"))
        if eval_instances is not None:
            eval_instances.save(os.path.join(tmp, "eval"))
        if write_canaries is not None:
            write_canaries(os.path.join(tmp, "canaries.json"))
        with open(os.path.join(tmp, "meta.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=1)
        try:
            os.replace(tmp, entry)
        except OSError:
            # Another host/process finished the same entry first: identical content.
            if not os.path.isfile(os.path.join(entry, "meta.json")):
                raise
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)

"""Offline stage of BERT pretraining data: unmasked instances ``[CLS] A [SEP] B [SEP]``.

Faithful to google-research/bert ``create_pretraining_data.py`` (``create_instances``):
documents of tokenized sentences -> N unmasked instances (target length ``max_seq_length - 3``,
shorter with ``short_seq_prob``; B is a random segment of another document half the time, the
unused segments are put back; ``truncate_seq_pair`` trims the longer segment at the front or
back at random). Deterministic in ``seed``; ``dupe_factor`` repeats the whole pass. These N
instances are the examples the accountant counts (privacy unit "example" = one sequence). Per
instance we keep the documents, SUBJECT_IDs and sentence ranges of segments A and B, so the
report can state how many examples one sentence / document / subject touches
(``unit_multiplicities``), and a stable ``example_key`` that online masking is keyed by.
``Instances`` stores them compactly and saves/loads ``.npy`` files (memory-mapped on load).

Privacy units other than one sequence (``InstanceParams.privacy_unit`` "note" or "patient",
issue 15). Neighbours are corpora that differ in one unit, so:

* every example belongs to exactly ONE unit. BERT's 'random next' segment B comes from another
  document (another note, often another patient); for these units it is drawn from the SAME
  unit instead: from another document of the unit when it has several (another note of the
  patient; another row with the same ROW_ID), else from a non-adjacent part of the same
  document ("non-adjacent": B neither overlaps A nor touches it, one sentence at least lies
  between them). A chunk that has no such part keeps its actual next segment, or yields no
  example when it is a single sentence.
* what a unit yields is a function of its own documents and of public randomness keyed by its
  IDENTITY alone (``unit_instances.create_unit_local``: a ``random.Random`` seeded from a hash
  of (seed, unit kind, identity) runs BERT's steps over the unit's documents in corpus order,
  for every dupe pass, then shuffles the unit's examples; units are ordered by a hash of their
  identity; example keys: ``example_keys``).
  Adding or removing one unit leaves every other unit's examples, their order and their keys
  bitwise unchanged. A unit's identity: "note" the document key (ROW_ID; the content key of a
  text document), "patient" the SUBJECT_ID (the document key in corpora without SUBJECT_IDs).
  Documents sharing an identity are one unit.

``unit_instances.unit_ids`` gives each example's unit and checks that A and B share it. The
"example" path is BERT's algorithm, unchanged (one ``random.Random(seed)`` over the shuffled
corpus). What a unit is, and which units group several sequences, is `dpbert.core.units`'.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import random
from collections.abc import Callable
from typing import Any

import numpy as np
import tqdm

from data_pipelines import fast_random
from data_pipelines.documents import NO_SUBJECT
from data_pipelines.example_keys import KeyRecorder
from data_pipelines.tokenized_corpus import TokenizedCorpus
from data_pipelines.unit_instances import create_unit_local
from dpbert.core import units as privacy_units

_log = logging.getLogger(__name__)

# Bump when the instance-creation code changes in a way that changes its output: part of the
# cache fingerprint.
INSTANCES_FORMAT_VERSION = 4


@dataclasses.dataclass(frozen=True)
class InstanceParams:
    """Parameters of instance creation (the offline stage)."""

    max_seq_length: int = 128
    short_seq_prob: float = 0.1
    dupe_factor: int = 1
    seed: int = 12345
    # "example" (BERT's algorithm), or "note" / "patient": 'random next' segments B come from
    # the example's own unit (module docstring).
    privacy_unit: str = "example"

    def validate(self) -> None:
        if self.max_seq_length < 5:
            # [CLS] A [SEP] B [SEP] with A and B non-empty after truncation needs 2 tokens of room.
            raise ValueError(f"max_seq_length must be >= 5, got {self.max_seq_length}")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ValueError(f"short_seq_prob must be in [0, 1], got {self.short_seq_prob}")
        if self.dupe_factor < 1:
            raise ValueError(f"dupe_factor must be >= 1, got {self.dupe_factor}")
        privacy_units.get(self.privacy_unit)  # ValueError naming the units


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
      doc_key: int64 [N], source key of A's document (ROW_ID for notes, the content key of a
        text document: ``documents.content_key``).
      b_doc_key: int64 [N], source key of B's document.
      a_sentence_start, b_sentence_start: int64 [N], first corpus sentence of A / of B (index
        into the corpus's sentences; truncation may cut the edge sentences short).
      a_sentence_count, b_sentence_count: int32 [N], sentences of A / of B.
      example_key: int64 [N], non-negative: the example's stable identity (``example_keys``: a
        hash of its unit's or A's document's identity, the dupe pass and its ordinal among that
        identity's examples of the pass; canaries: the canary id and the copy). Masking is keyed
        by it, not by the example's index, so removing other examples or units changes no
        example's masks.
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
    a_sentence_start: np.ndarray
    a_sentence_count: np.ndarray
    b_sentence_start: np.ndarray
    b_sentence_count: np.ndarray
    example_key: np.ndarray

    _ARRAYS = ("tokens", "offsets", "a_lengths", "is_random_next", "doc_index", "b_doc_index",
               "subject_id", "b_subject_id", "doc_key", "b_doc_key", "a_sentence_start",
               "a_sentence_count", "b_sentence_start", "b_sentence_count", "example_key")
    # Arrays with one entry per example (all but tokens and offsets).
    _PER_EXAMPLE = _ARRAYS[2:]

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

    def select(self, rows: np.ndarray | list[int]) -> "Instances":
        """A new ``Instances`` of the examples ``rows`` (int [M]), in that order."""
        rows = np.asarray(rows, np.int64).reshape(-1)
        offsets = np.asarray(self.offsets, np.int64)
        starts, ends = offsets[rows], offsets[rows + 1]
        lengths = ends - starts
        new_offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        # Token positions of the selected examples, back to back.
        where = (np.repeat(starts - new_offsets[:-1], lengths)
                 + np.arange(int(new_offsets[-1]), dtype=np.int64))
        arrays = {name: np.asarray(getattr(self, name))[rows] for name in self._PER_EXAMPLE}
        return Instances(tokens=np.asarray(self.tokens)[where].astype(np.int32),
                         offsets=new_offsets, **arrays)

    def content_hash(self) -> str:
        """sha256 of the examples' content (tokens, segment layout and the keys their masking
        uses): equal for the same examples wherever the corpus file lies or whenever it was
        touched."""
        h = hashlib.sha256()
        for name in ("tokens", "offsets", "a_lengths", "is_random_next", "example_key"):
            h.update(np.ascontiguousarray(getattr(self, name)).tobytes())
        return h.hexdigest()

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
    draw = rng.random
    a_front = a_back = b_front = b_back = 0
    for _ in range(len_a + len_b - max_num_tokens):  # one token per step
        if len_a > len_b:
            len_a -= 1
            if draw() < 0.5:
                a_front += 1
            else:
                a_back += 1
        else:
            len_b -= 1
            if draw() < 0.5:
                b_front += 1
            else:
                b_back += 1
    return a_front, a_back, b_front, b_back


class _Maker:
    """BERT's chunking of one document in one pass (``create_instances_from_document``),
    appending the examples to flat lists; the caller chooses the ``random.Random`` and where a
    'random next' segment comes from."""

    def __init__(self, corpus: TokenizedCorpus, params: InstanceParams):
        # Plain lists: indexing them is much faster than indexing NumPy arrays element-wise.
        self.sent_len = np.diff(corpus.sentence_offsets).tolist()
        self.sent_start = corpus.sentence_offsets[:-1].tolist()
        self.doc_first = corpus.doc_offsets[:-1].tolist()
        self.doc_count = np.diff(corpus.doc_offsets).tolist()
        self.tokens = corpus.tokens
        self.max_num_tokens = params.max_seq_length - 3
        self.short_seq_prob = params.short_seq_prob
        # Token spans of A and B in corpus.tokens: a_start, a_stop, b_start, b_stop per example.
        self.spans: list[int] = []
        self.a_lengths: list[int] = []
        self.is_random: list[bool] = []
        self.doc_a: list[int] = []
        self.doc_b: list[int] = []
        self.sentences: list[tuple[int, int, int, int]] = []  # (A first, A count, B first, B n)

    def __len__(self) -> int:
        return len(self.a_lengths)

    def _span(self, first_sentence: int, n: int, cut_front: int, cut_back: int
              ) -> tuple[int, int]:
        """The tokens of sentences ``first_sentence ..`` (n of them), cut at both ends."""
        last = first_sentence + n - 1
        return (self.sent_start[first_sentence] + cut_front,
                self.sent_start[last] + self.sent_len[last] - cut_back)

    def document(self, doc: int, rng: random.Random,
                 source: Callable[[int, int, int], tuple[int, int, int] | None]) -> int:
        """Appends the examples of one pass over document ``doc``; returns how many.

        ``source(doc, c0, a_end)``: where a 'random next' B starts, ``(document, first sentence,
        sentence limit)``, or None when there is no such segment (then B is the actual next
        segment, or a one-sentence chunk yields no example).
        """
        sent_len, max_num_tokens = self.sent_len, self.max_num_tokens
        first, count = self.doc_first[doc], self.doc_count[doc]
        made = len(self.a_lengths)
        target = max_num_tokens
        if rng.random() < self.short_seq_prob:
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
                random_next = chunk_len == 1 or rng.random() < 0.5
                found = source(doc, c0, a_end) if random_next else None
                if found is not None:
                    # B: sentences b_first.. (before b_limit) up to the target length.
                    b_document, b_first, b_limit = found
                    target_b = target - len_a
                    b_n, len_b = 0, 0
                    for j in range(b_first, b_limit):
                        b_n += 1
                        len_b += sent_len[j]
                        if len_b >= target_b:
                            break
                    # Put the unused segments of the chunk back for the next instance.
                    i -= chunk_len - a_end
                elif chunk_len >= 2:
                    random_next = False
                    b_first, b_n = c0 + a_end, chunk_len - a_end
                    len_b = sum(sent_len[b_first:b_first + b_n])
                    b_document = doc
                else:
                    # One sentence, and its unit has no other part to pair it with: no
                    # example (only with privacy_unit note / patient).
                    chunk_start, chunk_len, chunk_tokens = i + 1, 0, 0
                    i += 1
                    continue
                cfa, cba, cfb, cbb = _truncate_seq_pair(len_a, len_b, max_num_tokens, rng)
                a0, a1 = self._span(c0, a_end, cfa, cba)
                b0, b1 = self._span(b_first, b_n, cfb, cbb)
                # Non-empty by construction (the longer segment is cut, max_num_tokens >= 2).
                assert a1 > a0 and b1 > b0, (a1 - a0, b1 - b0)
                self.spans += (a0, a1, b0, b1)
                self.a_lengths.append(a1 - a0)
                self.is_random.append(random_next)
                self.doc_a.append(doc)
                self.doc_b.append(b_document)
                self.sentences.append((c0, a_end, b_first, b_n))
                chunk_start, chunk_len, chunk_tokens = i + 1, 0, 0
            i += 1
        return len(self.a_lengths) - made

    def build(self, corpus: TokenizedCorpus, perm: list[int], keys: np.ndarray) -> Instances:
        """The examples in the order ``perm``, with their stable keys (in creation order)."""
        perm_arr = np.asarray(perm, np.int64)
        spans = np.asarray(self.spans, np.int64).reshape(-1, 4)[perm_arr]
        # A then B of each example, back to back: segment s is tokens[starts[s]:stops[s]].
        starts, stops = spans[:, 0::2].reshape(-1), spans[:, 1::2].reshape(-1)
        seg_lengths = stops - starts
        lengths = seg_lengths[0::2] + seg_lengths[1::2]
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        seg_offsets = np.concatenate([[0], np.cumsum(seg_lengths)])
        where = (np.repeat(starts - seg_offsets[:-1], seg_lengths)
                 + np.arange(int(seg_offsets[-1]), dtype=np.int64))
        flat = np.asarray(self.tokens)[where]
        doc_a_arr = np.asarray(self.doc_a, np.int32)[perm_arr]
        doc_b_arr = np.asarray(self.doc_b, np.int32)[perm_arr]
        sent = np.asarray(self.sentences, np.int64).reshape(-1, 4)[perm_arr]
        return Instances(
            tokens=flat.astype(np.int32),
            offsets=offsets,
            a_lengths=np.asarray(self.a_lengths, np.int32)[perm_arr],
            is_random_next=np.asarray(self.is_random, bool)[perm_arr],
            doc_index=doc_a_arr,
            b_doc_index=doc_b_arr,
            subject_id=corpus.subject_ids[doc_a_arr].astype(np.int64),
            b_subject_id=corpus.subject_ids[doc_b_arr].astype(np.int64),
            doc_key=corpus.doc_keys[doc_a_arr].astype(np.int64),
            b_doc_key=corpus.doc_keys[doc_b_arr].astype(np.int64),
            a_sentence_start=sent[:, 0], a_sentence_count=sent[:, 1].astype(np.int32),
            b_sentence_start=sent[:, 2], b_sentence_count=sent[:, 3].astype(np.int32),
            example_key=np.asarray(keys, np.int64)[perm_arr])


def create_instances(corpus: TokenizedCorpus, params: InstanceParams, *,
                     progress: bool = True) -> Instances:
    """The offline stage: ``create_pretraining_data``'s instance creation without masking.

    privacy_unit "example": the original algorithm step for step with one
    ``random.Random(seed)``: documents are shuffled once; for each of ``dupe_factor`` passes and
    each document, sentences are gathered into a chunk until the target length is reached (the
    target is ``max_seq_length - 3``, or with probability ``short_seq_prob`` a uniform integer
    in [2, max_seq_length - 3], drawn once per document and pass, as in the original); A is the
    first ``a_end`` sentences of the chunk (``a_end`` uniform in [1, len(chunk) - 1]); B is the
    rest of the chunk, or (always when the chunk has one sentence, else with probability 1/2) a
    run of sentences from a random other document starting at a random sentence, in which case
    the unused sentences of the chunk are put back; the pair is truncated to
    ``max_seq_length - 3`` tokens. Finally the instances are shuffled.

    privacy_unit "note" / "patient": the same steps, unit by unit (``create_unit_local``):
    what one unit yields is a function of its own documents and of a ``random.Random`` seeded
    from its identity alone.

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
    maker = _Maker(corpus, params)
    keys = KeyRecorder()
    bar = tqdm.tqdm(total=params.dupe_factor * num_docs, desc="creating instances",
                    unit=" docs", disable=not progress, mininterval=2.0)
    if privacy_units.get(params.privacy_unit).per_unit:
        perm = create_unit_local(corpus, params, maker, keys, bar)
    else:
        perm = _create_global(corpus, params, maker, keys, bar)
    bar.close()
    if len(maker) == 0:
        raise ValueError("no pretraining instance could be created from the corpus")
    return maker.build(corpus, perm, keys.keys())


def _create_global(corpus: TokenizedCorpus, params: InstanceParams, maker: _Maker,
                   keys: KeyRecorder, bar: Any) -> list[int]:
    """BERT's algorithm over the whole corpus (privacy unit "example"); returns the final
    order of the examples."""
    num_docs = corpus.num_documents
    if num_docs == 1:
        _log.warning("the corpus has a single document: 'random next' segments come from it")
    rng = fast_random.Random(params.seed)  # random.Random's draws, cheaper randint
    doc_first, doc_count = maker.doc_first, maker.doc_count
    doc_keys = corpus.doc_keys.tolist()
    order = list(range(num_docs))
    rng.shuffle(order)  # the original shuffles its document list once, before all passes

    def other_document(position: int):
        def source(doc: int, c0: int, a_end: int) -> tuple[int, int, int]:
            """BERT's 'random next': a random sentence of a random other document, to its
            end."""
            other = position
            for _ in range(10):  # the original tries 10 times to avoid itself
                other = rng.randint(0, num_docs - 1)
                if other != position:
                    break
            other_doc = order[other]
            o_first, o_count = doc_first[other_doc], doc_count[other_doc]
            return other_doc, o_first + rng.randint(0, o_count - 1), o_first + o_count

        return source

    for dupe_pass in range(params.dupe_factor):
        for position in range(num_docs):
            doc = order[position]
            made = maker.document(doc, rng, other_document(position))
            keys.add("doc", doc_keys[doc], dupe_pass, made)
            bar.update(1)
    perm = list(range(len(maker)))
    rng.shuffle(perm)  # the original shuffles its instance list at the end
    return perm


def unit_multiplicities(instances: Instances, num_sentences: int, num_documents: int
                        ) -> dict[str, Any]:
    """How many examples one sentence / document / subject of the corpus touches.

    An example touches a sentence if the sentence lies in its segment A or B (a sentence cut
    short by truncation still counts: an upper bound), a document or a subject if A or B comes
    from it (once per example). Returns {"sentence" | "document" | "subject": {"max", "mean"}}
    (means over every sentence / document / known subject of the corpus, untouched ones
    included; "subject" only when SUBJECT_IDs are known) plus "documents_per_example_max" and
    "subjects_per_example_max" (1, or 2 when a 'random next' segment B comes from elsewhere).
    These are exact statistics of the (private) corpus: a report must say they are not
    privatized.
    """
    def stats(counts: np.ndarray, units: int) -> dict[str, float]:
        return {"max": int(counts.max()) if counts.size else 0,
                "mean": round(float(counts.sum()) / max(units, 1), 3)}

    # Examples appended outside the corpus (example-placed canaries) have document -1.
    real = np.asarray(instances.doc_index) >= 0
    delta = np.zeros(num_sentences + 1, np.int64)
    for start, count in ((instances.a_sentence_start, instances.a_sentence_count),
                         (instances.b_sentence_start, instances.b_sentence_count)):
        start, count = np.asarray(start)[real], np.asarray(count)[real]
        np.add.at(delta, start, 1)
        np.add.at(delta, start + count, -1)
    per_sentence = np.cumsum(delta[:-1])
    doc_a = np.asarray(instances.doc_index)[real]
    doc_b = np.asarray(instances.b_doc_index)[real]
    other_doc = doc_b != doc_a
    per_doc = np.bincount(doc_a, minlength=num_documents) + np.bincount(
        doc_b[other_doc], minlength=num_documents)
    out: dict[str, Any] = {
        "sentence": stats(per_sentence, num_sentences),
        "document": stats(per_doc, num_documents),
        "documents_per_example_max": 2 if other_doc.any() else 1,
    }
    subj_a = np.asarray(instances.subject_id)[real]
    subj_b = np.asarray(instances.b_subject_id)[real]
    known = subj_a != NO_SUBJECT
    if known.any():
        other_subj = (subj_b != subj_a) & (subj_b != NO_SUBJECT)
        ids, counts = np.unique(np.concatenate([subj_a[known], subj_b[other_subj]]),
                                return_counts=True)
        out["subject"] = stats(counts, len(ids))
        out["subjects_per_example_max"] = 2 if other_subj.any() else 1
    return out

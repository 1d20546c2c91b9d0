"""Offline stage of BERT pretraining data: unmasked instances ``[CLS] A [SEP] B [SEP]``.

Faithful to google-research/bert ``create_pretraining_data.py`` (``create_instances``):
documents of tokenized sentences -> N unmasked instances (target length ``max_seq_length - 3``,
shorter with ``short_seq_prob``; B is a random segment of another document half the time, the
unused segments are put back; ``truncate_seq_pair`` trims the longer segment at the front or
back at random). Deterministic in ``seed``; ``dupe_factor`` repeats the whole pass. These N
instances are the examples the accountant counts (privacy unit "example" = one sequence). Per
instance we keep the documents, SUBJECT_IDs and sentence ranges of segments A and B, so the
report can state how many examples one sentence / document / subject touches
(``unit_multiplicities``). ``Instances`` stores them compactly and saves/loads ``.npy`` files
(memory-mapped on load).

Privacy units other than one sequence (``InstanceParams.privacy_unit`` "note" or "patient",
issue 15): every example must belong to exactly ONE unit, or the per-unit sensitivity bound
fails. BERT's 'random next' segment B comes from another document (another note, often another
patient); for these units it is drawn from the SAME unit instead: for "patient", from another
note of the same patient (SUBJECT_ID), else from a non-adjacent part of the same note; for
"note", from a non-adjacent part of the same note ("non-adjacent": B neither overlaps A nor
touches it, one sentence at least lies between them). A chunk that has no such part keeps its
actual next segment, or yields no example when it is a single sentence. In a plain-text corpus
(no SUBJECT_IDs) a patient is a document. ``unit_ids`` gives each example's unit and checks
that A and B share it. The "example" path is BERT's algorithm, unchanged.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import random
from typing import Any

import numpy as np
import tqdm

from data_pipelines.tokenized_corpus import TokenizedCorpus
from data_pipelines.documents import NO_SUBJECT

_log = logging.getLogger(__name__)

# Bump when the instance-creation code changes in a way that changes its output: part of the
# cache fingerprint.
INSTANCES_FORMAT_VERSION = 3
# What one privacy unit is: one sequence, one note (document), one patient (SUBJECT_ID; a
# document in corpora without SUBJECT_IDs).
PRIVACY_UNITS = ("example", "note", "patient")


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
        if self.privacy_unit not in PRIVACY_UNITS:
            raise ValueError(f"privacy_unit must be one of {PRIVACY_UNITS}, got "
                             f"{self.privacy_unit!r}")


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
      a_sentence_start, b_sentence_start: int64 [N], first corpus sentence of A / of B (index
        into the corpus's sentences; truncation may cut the edge sentences short).
      a_sentence_count, b_sentence_count: int32 [N], sentences of A / of B.
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

    _ARRAYS = ("tokens", "offsets", "a_lengths", "is_random_next", "doc_index", "b_doc_index",
               "subject_id", "b_subject_id", "doc_key", "b_doc_key", "a_sentence_start",
               "a_sentence_count", "b_sentence_start", "b_sentence_count")

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

    def content_hash(self) -> str:
        """sha256 of the examples' content (tokens and segment layout): equal for the same
        examples wherever the corpus file lies or whenever it was touched."""
        h = hashlib.sha256()
        for name in ("tokens", "offsets", "a_lengths", "is_random_next"):
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

    def other_document(position: int) -> tuple[int, int, int]:
        """BERT's 'random next': a random sentence of a random other document, to its end."""
        other = position
        for _ in range(10):  # the original tries 10 times to avoid itself
            other = rng.randint(0, num_docs - 1)
            if other != position:
                break
        other_doc = order[other]
        o_first, o_count = doc_first[other_doc], doc_count[other_doc]
        return other_doc, o_first + rng.randint(0, o_count - 1), o_first + o_count

    same_unit = (None if params.privacy_unit == "example" else
                 _same_unit_source(corpus, params.privacy_unit, rng, doc_first, doc_count))

    def gather(first_sentence: int, n: int, cut_front: int, cut_back: int) -> np.ndarray:
        start = sent_start[first_sentence]
        end = sent_start[first_sentence + n - 1] + sent_len[first_sentence + n - 1]
        return tokens[start + cut_front:end - cut_back]

    pieces: list[np.ndarray] = []
    a_lengths: list[int] = []
    is_random: list[bool] = []
    doc_a: list[int] = []
    doc_b: list[int] = []
    sentences: list[tuple[int, int, int, int]] = []  # (A first, A count, B first, B count)
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
                    random_next = chunk_len == 1 or rng.random() < 0.5
                    source = None
                    if random_next:
                        source = (other_document(position) if same_unit is None
                                  else same_unit(doc, c0, a_end))
                    if source is not None:
                        # B: sentences b_first.. (before b_limit) up to the target length.
                        b_document, b_first, b_limit = source
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
                    sentences.append((c0, a_end, b_first, b_n))
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
    sent = np.asarray(sentences, np.int64).reshape(-1, 4)[perm_arr]
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
        b_doc_key=corpus.doc_keys[doc_b_arr].astype(np.int64),
        a_sentence_start=sent[:, 0], a_sentence_count=sent[:, 1].astype(np.int32),
        b_sentence_start=sent[:, 2], b_sentence_count=sent[:, 3].astype(np.int32))


def _same_unit_source(corpus: TokenizedCorpus, privacy_unit: str, rng: random.Random,
                      doc_first: list[int], doc_count: list[int]):
    """`source(doc, c0, a_end) -> (document, first sentence, sentence limit) | None`: where a
    'random next' segment B comes from when it must stay in the example's unit (module doc).

    patient: a random sentence of another note of the same SUBJECT_ID, to that note's end;
    else (and for note): a random start in the same document outside A, not touching it:
    before A (B then ends one sentence before A) or after A's true next sentence. None when
    the document has no such sentence.
    """
    groups: list[list[int]] = []
    group_of = [-1] * corpus.num_documents
    if privacy_unit == "patient":
        subjects = np.asarray(corpus.subject_ids)
        known = subjects != NO_SUBJECT
        if known.any() and not known.all():
            missing = int(np.flatnonzero(~known)[0])
            raise ValueError(
                f"privacy_unit='patient' needs a SUBJECT_ID on every note, but document "
                f"{int(corpus.doc_keys[missing])} (and {int((~known).sum()) - 1} more) has none")
        if known.any():  # corpora without SUBJECT_IDs: a patient is a document
            ids, inverse = np.unique(subjects, return_inverse=True)
            groups = [[] for _ in range(len(ids))]
            for d, g in enumerate(inverse.tolist()):
                groups[g].append(d)
                group_of[d] = g
    position_in_group = [0] * corpus.num_documents
    for members in groups:
        for k, d in enumerate(members):
            position_in_group[d] = k

    def source(doc: int, c0: int, a_end: int) -> tuple[int, int, int] | None:
        g = group_of[doc]
        if g >= 0 and len(groups[g]) > 1:
            k = rng.randrange(len(groups[g]) - 1)
            if k >= position_in_group[doc]:
                k += 1  # a uniform choice among the other notes
            other = groups[g][k]
            o_first, o_count = doc_first[other], doc_count[other]
            return other, o_first + rng.randint(0, o_count - 1), o_first + o_count
        first, end = doc_first[doc], doc_first[doc] + doc_count[doc]
        n_before = max(c0 - 1 - first, 0)  # starts in [first, c0 - 1), B stops before c0 - 1
        after = c0 + a_end + 1  # after A's true next sentence (c0 + a_end)
        n_after = max(end - after, 0)
        if n_before + n_after == 0:
            return None
        j = rng.randrange(n_before + n_after)
        if j < n_before:
            return doc, first + j, c0 - 1
        return doc, after + j - n_before, end

    return source


def unit_ids(instances: Instances, privacy_unit: str) -> np.ndarray:
    """int64 [N]: the privacy unit of every example, numbered 0..U-1.

    "example": every example its own unit. "note": its document. "patient": its SUBJECT_ID, or
    its document where the corpus has no SUBJECT_IDs (plain text). Examples outside the corpus
    (example-placed canaries, document -1) are each a unit of their own.

    Raises:
      ValueError: an example whose segment B lies in another unit than A (instances made for
        privacy_unit="example" cannot serve a larger unit).
    """
    if privacy_unit not in PRIVACY_UNITS:
        raise ValueError(f"privacy_unit must be one of {PRIVACY_UNITS}, got {privacy_unit!r}")
    n = len(instances)
    if privacy_unit == "example":
        return np.arange(n, dtype=np.int64)
    doc_a = np.asarray(instances.doc_index, np.int64)
    doc_b = np.asarray(instances.b_doc_index, np.int64)
    # Keys: subject ids >= 0; documents -(d + 2) <= -2; outside examples below all of them.
    key_a, key_b = -(doc_a + 2), -(doc_b + 2)
    if privacy_unit == "patient":
        subj_a = np.asarray(instances.subject_id, np.int64)
        subj_b = np.asarray(instances.b_subject_id, np.int64)
        key_a = np.where(subj_a != NO_SUBJECT, subj_a, key_a)
        key_b = np.where(subj_b != NO_SUBJECT, subj_b, key_b)
    outside = doc_a < 0
    crossing = ~outside & (key_a != key_b)
    if crossing.any():
        i = int(np.flatnonzero(crossing)[0])
        raise ValueError(
            f"{int(crossing.sum())} examples take segment B from another {privacy_unit} than A "
            f"(e.g. example {i}: documents {int(doc_a[i])} and {int(doc_b[i])}); such instances "
            f"were made for privacy_unit='example' and cannot be used per {privacy_unit}")
    lowest = int(key_a[~outside].min()) if (~outside).any() else 0
    key_a = np.where(outside, lowest - 1 - np.cumsum(outside), key_a)
    return np.unique(key_a, return_inverse=True)[1].astype(np.int64).reshape(-1)


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

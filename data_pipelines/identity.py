"""Record identity: what makes two records of a corpus the same record, and duplicated ids.

The one place that defines a record's identity, for the vocabulary builder (``dp_vocab``) and
the pretraining data (``documents``, ``pretraining``):

* a MIMIC-III note (NOTEEVENTS, the synthetic notes, the ``mimic_noteevents`` TFDS set) is its
  **ROW_ID**. Many notes of one SUBJECT_ID are normal (a patient's notes), not duplicates:
  under ``privacy_unit="patient"`` too, only a repeated ROW_ID is a duplicate;
* a document of a plain-text corpus (or of a TFDS set without ``row_id``) is its **text**:
  ``content_key``, 63 bits of the SHA-256 of its sentences. Two copies of one text are one
  document by identity, always with identical content.

Why duplicates are refused. Every privacy unit of dpbert is keyed by identity (a note by its
ROW_ID, a patient by SUBJECT_ID, a text document by its content), and the DP vocabulary counts
one record per note / document. A NOTEEVENTS file with a row twice would otherwise give that
note two vocabulary records (its words counted twice under a per-note epsilon: group privacy at
2) and two documents in one training unit. So a corpus whose ids repeat is refused, before
anything is counted, with ONE error naming the file, how many ids repeat and where the first
copies are (data rows / document numbers, never the text or the id), and how to proceed.
The same rule applies to every corpus kind (text documents included: a document that appears
twice is counted twice by the vocabulary, and a per-sequence guarantee then covers its text
only as a group of 2); the message says how to merge.

``duplicate_ids="merge_identical"`` (``data.duplicate_ids``, ``launch/build_vocab.py
--duplicate_ids``) keeps the first copy of each id and drops the others when the copies are
identical (a note: the same SUBJECT_ID, HADM_ID, CATEGORY and TEXT; a text document: always),
and still refuses ids whose copies differ: those are different notes under one ROW_ID, and no
choice between them is right. How many copies were dropped is an exact statistic of the
private corpus: it goes to the console and the workdir's private reports, never into a
shipped report.

How: two passes over the source. The first keeps only ids, a 64-bit hash of each record's
content and its position (32 bytes per record: MIMIC-III's 2.1 M notes take ~70 MB), and
decides; the second streams the records and drops the merged copies by their ordinal. The
first pass costs one more read of the corpus (NOTEEVENTS and text files: the parse, no
sentence splitting or tokenization; TFDS sets: the whole read, sentence splitting included);
a refusal comes before any counting, tokenization or budget. A NOTEEVENTS file small enough
for ``note_cache`` is parsed once per process: the later passes (and the vocabulary's and the
pretraining data's reads of one run) replay it from memory.

Fine-tuning is different: there the privacy unit is one labelled row (classification) or one
document (NER), a duplicated row is two examples, and the task says so and warns with the
number of exact copies (``count_exact_duplicates``).
"""

from __future__ import annotations

import array
import collections
import dataclasses
import hashlib
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np
from absl import logging

from data_pipelines import corpora, note_cache

RULES = ("refuse", "merge_identical")
DEFAULT_RULE = "refuse"
# Duplicated ids whose positions an error message shows.
MAX_SHOWN = 3

NOTE_IDENTITY = "ROW_ID"
TEXT_IDENTITY = "document text (SHA-256)"


class DuplicateRecordsError(corpora.CorpusError):
    """A corpus holds records that share an identity (ROW_ID, or a text document's content)
    and the rule refuses them. The message names the source, counts and positions only."""


def check_rule(rule: Any) -> str:
    """``rule`` if it is one of ``RULES``, else a ValueError naming them."""
    if rule not in RULES:
        raise ValueError(f"duplicate_ids={rule!r}: must be one of {', '.join(RULES)}")
    return rule


# --------------------------------------------------------------------------- identities


def content_key(sentences: Sequence[str]) -> int:
    """A document's identity from its text alone: a 63-bit non-negative integer from the
    SHA-256 of its sentences (joined by newlines).

    Independent of the document's place in the stream, so removing one document changes no
    other document's key. Documents with the same text get the same key (a duplicate: refused,
    or merged with ``merge_identical``).
    """
    digest = hashlib.sha256(("dpbert-document\n" + "\n".join(sentences)).encode()).digest()
    return int.from_bytes(digest[:8], "little") >> 1


def _digest(*parts: Any) -> int:
    h = hashlib.sha256()
    for part in parts:
        h.update(repr(part).encode("utf-8", "surrogatepass"))
        h.update(b"\x1f")
    return int.from_bytes(h.digest()[:8], "little") >> 1


def note_digest(note: corpora.Note) -> int:
    """What two copies of a ROW_ID must share to be identical: SUBJECT_ID, HADM_ID, CATEGORY
    and TEXT (63 bits of a SHA-256)."""
    return _digest(note.subject_id, note.hadm_id, note.category, note.text)


def document_digest(subject_id: int, sentences: Sequence[str]) -> int:
    """The content of a document that has an id of its own (TFDS ``row_id``)."""
    return _digest(subject_id, tuple(sentences))


# --------------------------------------------------------------------------- the scan


@dataclasses.dataclass(frozen=True)
class Source:
    """One input of a corpus, for messages: its name (a path, a TFDS name), the identity of
    its records, and what a position counts ("data row", "document", ...)."""

    name: str
    identity: str
    position: str


@dataclasses.dataclass
class Duplicates:
    """What the first pass found (``scan``): counts, the first duplicated ids' positions, and
    the ordinals of the copies that merging drops. Counts are exact statistics of the private
    corpus (console and private reports only)."""

    rule: str
    sources: tuple[Source, ...]
    num_records: int = 0
    duplicated_ids: int = 0          # ids that occur more than once
    extra_copies: int = 0            # records beyond the first of each such id
    conflicting_ids: int = 0         # ids whose copies differ in content
    shown: list = dataclasses.field(default_factory=list)            # [[(source, pos), ...]]
    shown_conflicts: list = dataclasses.field(default_factory=list)
    drop: frozenset = frozenset()    # ordinals of the identical copies merging drops
    drop_keys: dict = dataclasses.field(default_factory=dict)        # ordinal -> key

    @property
    def identity(self) -> str:
        kinds = sorted({s.identity for s in self.sources})
        return " / ".join(kinds) if kinds else NOTE_IDENTITY

    def where(self) -> str:
        """The source(s), for messages."""
        names = sorted({s.name for s in self.sources})
        return ", ".join(names) if names else "the corpus"

    def _positions(self, groups: list) -> str:
        """"data rows 1 and 101; 2 and 102" (one source), else each position with its
        source's name."""
        def joined(parts: list[str]) -> str:
            return ", ".join(parts[:-1]) + " and " + parts[-1]

        used = {s for g in groups for s, _ in g}
        if len(used) == 1:
            word = self.sources[next(iter(used))].position
            return f"{word}s " + "; ".join(joined([str(p) for _, p in g]) for g in groups)
        return "; ".join(joined([f"{self.sources[s].position} {p} of {self.sources[s].name}"
                                 for s, p in g]) for g in groups)

    def _how_to_merge(self) -> str:
        return ("keep one copy of each with duplicate_ids='merge_identical' (training: "
                "--config.data.duplicate_ids=merge_identical; build_vocab, or python -m "
                "data_pipelines.tfds_data: --duplicate_ids=merge_identical)")

    def error(self) -> DuplicateRecordsError | None:
        """The refusal this scan calls for under its rule (None: nothing to refuse)."""
        ident = self.identity
        if self.duplicated_ids == 0:
            return None
        if self.rule == "merge_identical" and self.conflicting_ids == 0:
            return None
        text_only = all(s.identity == TEXT_IDENTITY for s in self.sources)
        what = ("document(s) occur" if text_only else f"{ident}(s) occur")
        if self.rule == "refuse":
            same = ("all copies are identical" if self.conflicting_ids == 0 else
                    f"the copies of {self.conflicting_ids} of them differ in content")
            if text_only:
                why = ("a plain-text document's identity is its text, so each copy would be "
                       "counted again as another record by the vocabulary and by training")
            else:
                why = (f"one {ident} is one note, and its copies would be counted as separate "
                       "notes (as vocabulary records and training documents), so a per-note "
                       "guarantee would cover it only as a group")
            fix = ("Remove the copies, or " + self._how_to_merge()
                   if self.conflicting_ids == 0 else
                   "Give each note its own ROW_ID or remove the wrong copies (merging keeps "
                   "only identical copies)")
            return DuplicateRecordsError(
                f"{self.where()}: {self.duplicated_ids} {what} more than once "
                f"({self.extra_copies} extra record(s) among {self.num_records}; {same}); "
                f"the first: {self._positions(self.shown)}. Refused: {why}. {fix}")
        return DuplicateRecordsError(
            f"{self.where()}: {self.conflicting_ids} {ident}(s) occur more than once with "
            f"different content (SUBJECT_ID, HADM_ID, CATEGORY or TEXT differ); the first: "
            f"{self._positions(self.shown_conflicts)}. duplicate_ids='merge_identical' keeps "
            f"one copy only where the copies are identical, so these are refused: they are "
            f"different records under one {ident}; give each its own ROW_ID or remove the "
            f"wrong copies")

    def summary(self) -> dict[str, Any]:
        """For the private reports (exact counts of the corpus)."""
        ids = ("documents" if all(s.identity == TEXT_IDENTITY for s in self.sources)
               else f"{self.identity}s")
        if self.rule == "merge_identical" and self.extra_copies:
            text = (f"duplicate {ids} merged: {self.extra_copies} identical copies dropped "
                    f"({self.duplicated_ids} {ids} had copies)")
        elif self.rule == "merge_identical":
            text = f"duplicate {ids} merged if identical (none found)"
        else:
            text = f"duplicate {ids} refused (none found)"
        return {"identity": self.identity, "duplicate_ids": self.rule,
                "duplicated_ids": self.duplicated_ids, "copies_dropped": len(self.drop),
                "text": text}


def scan(records: Iterable[tuple[int, int, int, int]], sources: Sequence[Source],
         rule: str) -> Duplicates:
    """The first pass: ``records`` yields (key, content digest, source index, position) in
    stream order; the result says which ids repeat, whether their copies are identical, and
    which ordinals merging drops (every copy after the first of an identical id)."""
    check_rule(rule)
    keys, digests, srcs, positions = (array.array("q") for _ in range(4))
    for key, digest, src, pos in records:
        keys.append(key)
        digests.append(digest)
        srcs.append(src)
        positions.append(pos)
    out = Duplicates(rule=rule, sources=tuple(sources), num_records=len(keys))
    if len(keys) < 2:
        return out
    k = np.frombuffer(keys, np.int64)
    order = np.argsort(k, kind="stable")          # stream order within one key
    sk = k[order]
    starts = np.flatnonzero(np.r_[True, sk[1:] != sk[:-1]])
    sizes = np.diff(np.r_[starts, len(sk)])
    repeated = np.flatnonzero(sizes > 1)
    if not repeated.size:
        return out
    d = np.frombuffer(digests, np.int64)
    s, p = np.frombuffer(srcs, np.int64), np.frombuffer(positions, np.int64)
    groups = []
    for g in repeated:
        members = order[starts[g]:starts[g] + sizes[g]]
        groups.append((int(members[0]), members, bool((d[members] == d[members[0]]).all())))
    groups.sort(key=lambda group: group[0])        # by the first copy's place in the stream
    drop: dict[int, int] = {}

    def show(members) -> list:
        return [(int(s[i]), int(p[i])) for i in members[:MAX_SHOWN]]

    for _, members, identical in groups:
        out.duplicated_ids += 1
        out.extra_copies += len(members) - 1
        if len(out.shown) < MAX_SHOWN:
            out.shown.append(show(members))
        if identical:
            drop.update((int(i), int(k[i])) for i in members[1:])
        else:
            out.conflicting_ids += 1
            if len(out.shown_conflicts) < MAX_SHOWN:
                out.shown_conflicts.append(show(members))
    if rule == "merge_identical":
        out.drop, out.drop_keys = frozenset(drop), drop
    return out


Stream = Iterator[tuple[Any, int, int, int, int]]


def unique(make_stream: Callable[[bool], Stream], sources: Sequence[Source], rule: str,
           summary: dict | None = None) -> Iterator[Any]:
    """Records of a source with unique identities, or a ``DuplicateRecordsError``.

    ``make_stream(first_pass)`` yields (record, key, content digest, source index, position),
    the same records in the same order every time (``first_pass`` tells it that this is the
    scan, e.g. to count reader statistics only once). The scan runs when the iteration starts,
    so a refusal comes before the caller has done anything with the records. ``summary``
    (optional) receives ``Duplicates.summary()``.
    """
    check_rule(rule)
    found = scan(((key, digest, src, pos) for _, key, digest, src, pos in make_stream(True)),
                 sources, rule)
    error = found.error()
    if error is not None:
        raise error
    if summary is not None:
        summary.update(found.summary())
    if found.drop:
        logging.warning("%s: %s (data.duplicate_ids / --duplicate_ids='merge_identical')",
                        found.where(), found.summary()["text"])
    changed = f"{found.where()}: changed while being read (the second pass differs from the first"
    n = 0
    for n, (record, key, _, _, _) in enumerate(make_stream(False), start=1):
        ordinal = n - 1
        if ordinal in found.drop:
            if found.drop_keys[ordinal] != key:
                raise corpora.CorpusError(changed + ")")
            continue
        yield record
    if n != found.num_records:
        raise corpora.CorpusError(f"{changed}: {n} records, {found.num_records} before)")


# --------------------------------------------------------------------------- sources


def unique_notes(path: str, stats: corpora.ReadStats | None = None,
                 max_bad_fraction: float = corpora.DEFAULT_MAX_BAD_FRACTION,
                 rule: str = DEFAULT_RULE, summary: dict | None = None
                 ) -> Iterator[corpora.Note]:
    """The notes of a NOTEEVENTS file (``corpora.read_noteevents``), one per ROW_ID (module
    doc). Positions are data rows of the file (as in the reader's messages); ``stats`` is
    filled by the second pass. A file read completely once is replayed from memory
    (``note_cache``: bounded, one file)."""
    def stream(first: bool) -> Stream:
        st = corpora.ReadStats() if first or stats is None else stats
        # note_cache: the file is parsed (and its notes hashed) once per process.
        for note, digest, position in note_cache.read(path, st, max_bad_fraction, note_digest):
            yield note, note.row_id, digest, 0, position

    return unique(stream, [Source(str(path), NOTE_IDENTITY, "data row")], rule, summary)


def unique_generated_notes(make_notes: Callable[[], Iterable[corpora.Note]], name: str,
                           rule: str = DEFAULT_RULE, summary: dict | None = None
                           ) -> Iterator[corpora.Note]:
    """Notes from a generator (synthetic notes), one per ROW_ID; positions count notes."""
    def stream(first: bool) -> Stream:
        del first
        for i, note in enumerate(make_notes(), start=1):
            yield note, note.row_id, note_digest(note), 0, i

    return unique(stream, [Source(name, NOTE_IDENTITY, "note")], rule, summary)


def unique_text_documents(paths: Sequence[str], stats: list | None = None,
                          max_bad_fraction: float = corpora.DEFAULT_MAX_BAD_FRACTION,
                          rule: str = DEFAULT_RULE, summary: dict | None = None
                          ) -> Iterator[tuple[list[str], int]]:
    """(sentences, content_key) of the documents of BERT text files, one per text (module
    doc). Positions count documents (blank-line-separated blocks) per file. ``stats`` (a list)
    is filled by the second pass: ``stats[i]`` for file i, appended where the list has none."""
    def stream(first: bool) -> Stream:
        for i, path in enumerate(paths):
            st = corpora.ReadStats()
            if not first and stats is not None:
                if i < len(stats):
                    st = stats[i]
                else:
                    stats.append(st)
            for sents in corpora.read_text_documents(path, st, max_bad_fraction):
                key = content_key(sents)
                yield (sents, key), key, key, i, st.records_read

    return unique(stream, [Source(str(p), TEXT_IDENTITY, "document") for p in paths], rule,
                  summary)


def unique_documents(make_docs: Callable[[], Iterable[tuple[int, Any]]],
                     sources: Sequence[Source], rule: str = DEFAULT_RULE,
                     summary: dict | None = None) -> Iterator[Any]:
    """``documents.Document``s from several sources (TFDS sets), one per ``Document.key``: a
    ROW_ID where the source has ids, else the text's ``content_key`` (then the key is the
    content). ``make_docs()`` yields (source index, document); positions count a source's
    documents."""
    def stream(first: bool) -> Stream:
        del first
        counts: collections.Counter = collections.Counter()
        for src, doc in make_docs():
            counts[src] += 1
            has_id = doc.key != content_key(doc.sentences)
            digest = document_digest(doc.subject_id, doc.sentences) if has_id else doc.key
            yield doc, doc.key, digest, src, counts[src]

    return unique(stream, sources, rule, summary)


# --------------------------------------------------------------------------- fine-tuning


def count_exact_duplicates(items: Iterable[Hashable]) -> int:
    """How many items are exact copies of an earlier one (fine-tuning rows or documents)."""
    counts = collections.Counter(items)
    return sum(c - 1 for c in counts.values())


def fine_tuning_warning(source: str, copies: int, total: int, what: str = "row") -> str:
    """The warning a fine-tuning task prints when ``copies`` of its ``total`` training
    ``what``s (rows, documents) are exact copies of an earlier one: counts only, no text."""
    return (f"WARNING: {source}: {copies} of the {total} training {what}s are exact copies of "
            f"an earlier {what}; each copy is a separate training example (the privacy unit is "
            f"one {what}, duplicates are not merged), so a {what} that appears k times is "
            f"covered by the guarantee only as a group of k. Remove the copies if they are one "
            f"record")

"""Documents of sentences from every corpus kind, for BERT pretraining.

A ``Document`` is what BERT's instance creation consumes: an ordered list of sentences from one
source document, plus the SUBJECT_ID of its patient when known (privacy unit "patient") and a
stable key that identifies it whatever else the corpus holds: ROW_ID for notes; for text
corpora (which have no ids) ``content_key`` of its sentences, so that removing or adding another
document changes no key (the held-out split and the note-level privacy unit are keyed by it).
Keys are unique: a corpus whose ids repeat is refused, or its identical copies merged
(``identity``, ``data.duplicate_ids``).

Sources:
  * plain text (``corpora.read_text_documents``: one sentence per line, blank line between
    documents, ``.gz`` allowed);
  * MIMIC-III NOTEEVENTS (``corpora.read_noteevents``): one note = one document, sentences from
    ``sentences.split_sentences``;
  * synthetic notes (``synthetic_notes.generate_notes``), same treatment as NOTEEVENTS;
  * TFDS data sources (``tfds_data.tfds_documents``), including the NOTEEVENTS TFDS builder.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Iterator, Sequence

from data_pipelines import corpora, identity, sentences
from data_pipelines.identity import content_key  # noqa: F401 - documents' public API

NO_SUBJECT = -1


@dataclasses.dataclass(frozen=True)
class Document:
    """One document.

    Attributes:
      sentences: the sentences, in order (strings, not yet tokenized).
      subject_id: the patient's SUBJECT_ID, or ``NO_SUBJECT`` (-1) when unknown.
      key: a stable key of the document in its source (ROW_ID, or ``content_key``).
    """

    sentences: list[str]
    subject_id: int = NO_SUBJECT
    key: int = -1


class CorpusNotFoundError(FileNotFoundError):
    """A configured corpus file or directory does not exist."""


def check_paths(paths: Sequence[str], what: str) -> list[str]:
    """Checks that every path exists; raises ONE error naming all missing ones."""
    if not paths:
        raise CorpusNotFoundError(f"no corpus path given for {what} (set data.paths)")
    missing = [p for p in paths if not os.path.isfile(p)]
    if missing:
        raise CorpusNotFoundError(f"{what} corpus file(s) not found: {', '.join(missing)}")
    return [os.path.abspath(p) for p in paths]


def text_documents(paths: Sequence[str],
                   stats: list[corpora.ReadStats] | None = None,
                   max_bad_fraction: float = corpora.DEFAULT_MAX_BAD_FRACTION,
                   duplicate_ids: str = identity.DEFAULT_RULE,
                   identity_summary: dict | None = None) -> Iterator[Document]:
    """Documents of BERT-format text files, in file order; keys are ``content_key``s.

    ``max_bad_fraction``: per file, the largest share of unreadable lines accepted
    (``corpora.read_text_documents``). A text that occurs twice (in one file or across files)
    is a duplicated identity: refused, or one copy kept with ``duplicate_ids=
    "merge_identical"`` (``identity``; ``identity_summary`` receives what was done)."""
    for sents, key in identity.unique_text_documents(paths, stats, max_bad_fraction,
                                                     duplicate_ids, identity_summary):
        yield Document(sentences=sents, subject_id=NO_SUBJECT, key=key)


def note_documents(notes: Iterable[corpora.Note], *, categories: Sequence[str] = (),
                   max_sentence_chars: int = 1000,
                   counts: dict[str, int] | None = None) -> Iterator[Document]:
    """One document per note (optionally only the given CATEGORY values, compared
    case-insensitively), sentence-split. ``counts`` (optional) receives ``notes`` (seen) and
    ``in_categories`` (kept by the category filter), so that an empty result can say why."""
    wanted = {c.strip().lower() for c in categories}
    counts = counts if counts is not None else {}
    counts.setdefault("notes", 0)
    counts.setdefault("in_categories", 0)
    for note in notes:
        counts["notes"] += 1
        if wanted and note.category.strip().lower() not in wanted:
            continue
        counts["in_categories"] += 1
        sents = sentences.split_sentences(note.text, max_chars=max_sentence_chars)
        if sents:
            yield Document(sentences=sents, subject_id=note.subject_id, key=note.row_id)


def noteevents_documents(path: str, *, categories: Sequence[str] = (),
                         max_sentence_chars: int = 1000,
                         stats: corpora.ReadStats | None = None,
                         max_bad_fraction: float = corpora.DEFAULT_MAX_BAD_FRACTION,
                         duplicate_ids: str = identity.DEFAULT_RULE,
                         identity_summary: dict | None = None,
                         counts: dict[str, int] | None = None) -> Iterator[Document]:
    """Documents of a MIMIC-III NOTEEVENTS.csv(.gz) (bad rows counted and skipped; more than
    ``max_bad_fraction`` of them is an error, see ``corpora.read_noteevents``). A ROW_ID that
    occurs twice in the file (whatever the categories kept) is refused, or merged where the
    copies are identical with ``duplicate_ids="merge_identical"`` (``identity``). ``counts``:
    see ``note_documents``."""
    return note_documents(identity.unique_notes(path, stats, max_bad_fraction, duplicate_ids,
                                                identity_summary),
                          categories=categories,
                          max_sentence_chars=max_sentence_chars, counts=counts)


def synthetic_documents(num_notes: int, *, seed: int = 0,
                        max_sentence_chars: int = 1000,
                        duplicate_ids: str = identity.DEFAULT_RULE,
                        identity_summary: dict | None = None) -> Iterator[Document]:
    """Documents of ``num_notes`` synthetic clinical notes (ROW_IDs are unique by
    construction; checked like a file's)."""
    from data_pipelines import synthetic_notes  # noqa: PLC0415 - keeps imports light

    make: Callable[[], Iterable[corpora.Note]] = (
        lambda: synthetic_notes.generate_notes(num_notes, seed=seed))
    return note_documents(identity.unique_generated_notes(
        make, f"synthetic notes (seed {seed})", duplicate_ids, identity_summary),
        max_sentence_chars=max_sentence_chars)

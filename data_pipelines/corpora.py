"""Raw corpus readers: plain-text documents and MIMIC-III ``NOTEEVENTS.csv(.gz)``.

Both readers stream: they hold one document (or one CSV row) at a time, so memory is
bounded by the longest document, whatever the file size.

* :func:`read_text_documents` reads the BERT pretraining text format (one sentence per
  line, a blank line between documents; ``.gz`` allowed) and yields each document as a
  ``list[str]`` of its non-empty sentences.
* :func:`read_noteevents` reads the MIMIC-III ``NOTEEVENTS`` table (quoted, multi-line
  ``TEXT`` fields) and yields :class:`Note` objects that keep ``SUBJECT_ID`` and
  ``HADM_ID`` so that the privacy unit can later be the patient.

Bad input is never dropped silently.  Rows that cannot be used (wrong field count,
non-integer ids, an unknown ``ISERROR`` value, bytes that are not UTF-8, empty notes,
rows flagged ``ISERROR=1``) are skipped and counted in a :class:`ReadStats`; a summary is
logged when the file ends.  A missing file, a header that is not the ``NOTEEVENTS``
schema, and a file with no usable record raise :class:`CorpusError` naming the file and
the problem.

Undecodable bytes are detected without giving up streaming: the file is decoded with
``errors="surrogateescape"``, which maps every invalid byte to a lone surrogate
(U+DC80..U+DCFF) that valid UTF-8 can never produce, and the record containing such a
character is skipped and counted.
"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import io
import os
import re
from typing import IO, Iterator

from absl import logging

# The MIMIC-III NOTEEVENTS schema, in the file's column order.
NOTEEVENTS_COLUMNS: tuple[str, ...] = (
    "ROW_ID", "SUBJECT_ID", "HADM_ID", "CHARTDATE", "CHARTTIME", "STORETIME",
    "CATEGORY", "DESCRIPTION", "CGID", "ISERROR", "TEXT",
)

# Lone surrogates that `surrogateescape` uses for undecodable bytes.
_BAD_BYTE_RE = re.compile("[\udc80-\udcff]")

# Real MIMIC-III notes reach ~100 k characters; csv's default field limit (128 KiB) is
# too close.  Fields longer than this are counted as malformed rather than crashing.
_MAX_FIELD_CHARS = 16 * 1024 * 1024


class CorpusError(ValueError):
    """A corpus file cannot be read as asked (missing, wrong schema, or empty)."""


@dataclasses.dataclass(frozen=True)
class Note:
    """One MIMIC-III note.

    Attributes:
      row_id: ``ROW_ID``, unique per note.
      subject_id: ``SUBJECT_ID`` (the patient): the unit for patient-level privacy.
      hadm_id: ``HADM_ID`` (the hospital admission), ``None`` where the field is empty
        (outpatient notes, e.g. many radiology and ECG reports).
      category: ``CATEGORY`` (e.g. ``"Radiology"``, ``"Discharge summary"``).
      text: ``TEXT``, the note body with its original line breaks.
    """

    row_id: int
    subject_id: int
    hadm_id: int | None
    category: str
    text: str


@dataclasses.dataclass
class ReadStats:
    """Counters that a reader fills while it streams (read them after the loop).

    Attributes:
      path: the file being read.
      records_read: data records seen (CSV rows after the header, or text documents).
      records_kept: records yielded to the caller.
      skipped_iserror: NOTEEVENTS rows with ``ISERROR=1`` (MIMIC flags these as wrong).
      skipped_malformed: rows with a wrong field count, a non-integer id, an unknown
        ``ISERROR`` value, or a field over the size limit.
      skipped_empty: notes whose text is only whitespace; for text corpora, documents
        left with no sentence.
      skipped_bad_utf8: NOTEEVENTS rows, or text-corpus lines, with bytes that are not
        UTF-8.
    """

    path: str = ""
    records_read: int = 0
    records_kept: int = 0
    skipped_iserror: int = 0
    skipped_malformed: int = 0
    skipped_empty: int = 0
    skipped_bad_utf8: int = 0

    @property
    def skipped(self) -> int:
        """Total number of skipped records (text-corpus bad lines included)."""
        return (self.skipped_iserror + self.skipped_malformed + self.skipped_empty
                + self.skipped_bad_utf8)

    def summary(self) -> str:
        """One human-readable line with every counter."""
        return (f"{self.path}: read {self.records_read} records, kept {self.records_kept}; "
                f"skipped {self.skipped_iserror} ISERROR=1, {self.skipped_malformed} malformed, "
                f"{self.skipped_empty} empty, {self.skipped_bad_utf8} not UTF-8")


def open_text(path: str | os.PathLike[str]) -> IO[str]:
    """Opens a UTF-8 text file for streaming, decompressing ``*.gz`` on the fly.

    Invalid bytes become lone surrogates (``errors="surrogateescape"``) so the caller can
    count and skip the records that hold them; ``newline=""`` keeps ``\\r\\n`` inside
    quoted CSV fields intact, as the csv module requires.

    Raises:
      CorpusError: the file does not exist or is not a regular file.
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise CorpusError(f"corpus file not found: {path!r}")
    raw: IO[bytes]
    if path.endswith(".gz"):
        raw = gzip.open(path, "rb")
    else:
        raw = open(path, "rb")
    return io.TextIOWrapper(raw, encoding="utf-8", errors="surrogateescape", newline="")


def has_bad_bytes(text: str) -> bool:
    """Whether ``text`` (decoded by :func:`open_text`) held bytes that are not UTF-8."""
    return _BAD_BYTE_RE.search(text) is not None


def read_text_documents(path: str | os.PathLike[str],
                        stats: ReadStats | None = None) -> Iterator[list[str]]:
    """Streams documents from a BERT pretraining text file.

    Format: one sentence per line, a blank (whitespace-only) line between documents;
    ``.gz`` is decompressed.  Sentences are stripped of surrounding whitespace.  A line
    with bytes that are not UTF-8 is dropped and counted in ``stats.skipped_bad_utf8``;
    a document left without any sentence is counted in ``stats.skipped_empty``.

    Args:
      path: the corpus file.
      stats: optional counters, filled while iterating (``records`` are documents).

    Yields:
      Each document as a non-empty ``list[str]`` of sentences, in file order.

    Raises:
      CorpusError: the file is missing, or holds no document at all (checked when the
        iteration reaches the end of the file).
    """
    stats = stats if stats is not None else ReadStats()
    stats.path = os.fspath(path)
    with open_text(path) as f:
        doc: list[str] = []
        saw_lines = False  # whether the current block had any line (bad ones included)
        for line in f:
            line = line.strip()
            if not line:
                if saw_lines:
                    yield from _finish_document(doc, stats)
                doc, saw_lines = [], False
                continue
            saw_lines = True
            if has_bad_bytes(line):
                stats.skipped_bad_utf8 += 1
                continue
            doc.append(line)
        if saw_lines:
            yield from _finish_document(doc, stats)
    _log_and_check(stats)


def _finish_document(doc: list[str], stats: ReadStats) -> Iterator[list[str]]:
    """Counts one finished document and yields it unless it is empty."""
    stats.records_read += 1
    if doc:
        stats.records_kept += 1
        yield doc
    else:
        stats.skipped_empty += 1


def _parse_int(value: str) -> int:
    """Parses a MIMIC id (``"123"``, spaces tolerated); anything else raises ValueError."""
    value = value.strip()
    # isdecimal() alone would accept non-ASCII digits; MIMIC ids are ASCII.
    if not (value.isascii() and value.isdecimal()):
        raise ValueError(value)
    return int(value)


def _check_header(header: list[str] | None, path: str) -> dict[str, int]:
    """Maps NOTEEVENTS column names to their indices, or raises a CorpusError."""
    if header is None:
        raise CorpusError(f"{path}: the file is empty (expected a NOTEEVENTS header: "
                          f"{','.join(NOTEEVENTS_COLUMNS)})")
    names = [h.strip().lstrip("\ufeff").strip('"').upper() for h in header]
    missing = [c for c in NOTEEVENTS_COLUMNS if c not in names]
    if missing:
        raise CorpusError(f"{path}: not a MIMIC-III NOTEEVENTS header; missing column(s) "
                          f"{', '.join(missing)} (found: {', '.join(names) or 'nothing'})")
    return {name: names.index(name) for name in NOTEEVENTS_COLUMNS}


def read_noteevents(path: str | os.PathLike[str],
                    stats: ReadStats | None = None) -> Iterator[Note]:
    """Streams notes from a MIMIC-III ``NOTEEVENTS.csv`` or ``NOTEEVENTS.csv.gz``.

    Columns are found by name in the header (any order; extra columns are allowed).
    Rows with ``ISERROR=1`` are skipped (MIMIC marks them as erroneous notes); rows with
    a wrong field count, a non-integer ``ROW_ID``/``SUBJECT_ID``/``HADM_ID`` (``HADM_ID``
    may be empty), an ``ISERROR`` other than empty/0/1, bytes that are not UTF-8, or an
    empty ``TEXT`` are skipped and counted in ``stats``; one summary line is logged at
    the end.

    Args:
      path: the NOTEEVENTS file.
      stats: optional counters, filled while iterating.

    Yields:
      :class:`Note` per usable row, in file order.

    Raises:
      CorpusError: the file is missing, its header lacks NOTEEVENTS columns (named in
        the message), or it yields no note at all (raised at the end of the iteration).
    """
    stats = stats if stats is not None else ReadStats()
    path_str = os.fspath(path)
    stats.path = path_str
    # The limit is process-global in the csv module; raising it only admits longer
    # fields and changes nothing else.
    csv.field_size_limit(max(csv.field_size_limit(), _MAX_FIELD_CHARS))
    with open_text(path) as f:
        # strict: a quote left open at the end of the file is an error (counted as a
        # malformed row) instead of a silently accepted note.
        reader = csv.reader(f, strict=True)
        try:
            header = next(reader, None)
        except csv.Error as e:
            raise CorpusError(f"{path_str}: cannot parse the CSV header: {e}") from e
        col = _check_header(header, path_str)
        num_fields = len(header)
        while True:
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error:
                # A field over the size limit, a stray quote, a quote left open at the
                # end of the file: count the row; the reader resumes on the next line.
                stats.records_read += 1
                stats.skipped_malformed += 1
                continue
            if not row:
                continue  # blank line between records: not a record
            stats.records_read += 1
            note = _parse_row(row, col, num_fields, stats)
            if note is not None:
                stats.records_kept += 1
                yield note
    _log_and_check(stats)


def _parse_row(row: list[str], col: dict[str, int], num_fields: int,
               stats: ReadStats) -> Note | None:
    """Turns one CSV row into a Note, or counts why it is skipped and returns None."""
    if len(row) != num_fields:
        stats.skipped_malformed += 1
        return None
    if any(has_bad_bytes(field) for field in row):
        stats.skipped_bad_utf8 += 1
        return None
    iserror = row[col["ISERROR"]].strip()
    if iserror not in ("", "0", "1"):
        stats.skipped_malformed += 1
        return None
    try:
        row_id = _parse_int(row[col["ROW_ID"]])
        subject_id = _parse_int(row[col["SUBJECT_ID"]])
        hadm = row[col["HADM_ID"]].strip()
        hadm_id = _parse_int(hadm) if hadm else None
    except ValueError:
        stats.skipped_malformed += 1
        return None
    if iserror == "1":
        stats.skipped_iserror += 1
        return None
    text = row[col["TEXT"]]
    if not text.strip():
        stats.skipped_empty += 1
        return None
    return Note(row_id=row_id, subject_id=subject_id, hadm_id=hadm_id,
                category=row[col["CATEGORY"]].strip(), text=text)


def _log_and_check(stats: ReadStats) -> None:
    """Logs the summary; raises CorpusError when nothing usable was found."""
    if stats.skipped:
        # WARNING, so skipped records are visible at the default absl verbosity.
        logging.warning("%s", stats.summary())
    else:
        logging.info("%s", stats.summary())
    if stats.records_kept == 0:
        raise CorpusError(f"no usable record in {stats.path} ({stats.summary()})")

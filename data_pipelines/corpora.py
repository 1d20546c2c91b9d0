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
ids that are not integers in [0, 2^63), an unknown ``ISERROR`` value, bytes that are not UTF-8 or control
characters, empty notes, rows flagged ``ISERROR=1``) are skipped and counted in a
:class:`ReadStats`; a summary is logged when the file ends (with where the first bad row
is).  When more than ``max_bad_fraction`` (default :data:`DEFAULT_MAX_BAD_FRACTION`, 1 %) of
the rows (text corpora: lines) cannot be parsed (malformed, not UTF-8, control characters),
the reader raises :class:`CorpusError` at the end of the file, naming the line (and, for bad
bytes, the column) of the first bad row: one unterminated quote can swallow the rest of a
CSV file, and training on what is left would be a silent wrong result.  A
missing file, a directory, a file that is not gzip although its name ends in ``.gz``, a
truncated or corrupt ``.gz``, a header that is not the ``NOTEEVENTS`` schema, a
NOTEEVENTS CSV read as a text corpus, and a file with no usable record also raise
:class:`CorpusError` naming the file and the problem.

Error messages never quote the file's content (it is private text): they name the file,
columns, line numbers and counts only.

The byte-level rules are those of every text reader (``data_pipelines.textcheck``): gzip is
read by its magic bytes (a ``.gz`` name that is not gzip is refused), UTF-16 is refused, a
UTF-8 byte-order mark at the start is skipped and said once, and a line (text) or row
(NOTEEVENTS) holding bytes that are not UTF-8 or a control character other than tab, newline
and CR is skipped and counted, its position remembered.  Undecodable bytes are detected
without giving up streaming: the file is decoded with ``errors="surrogateescape"``, which maps
every invalid byte to a lone surrogate (U+DC80..U+DCFF) that valid UTF-8 can never produce.
"""

from __future__ import annotations

import csv
import dataclasses
import os
import re
import zlib
from typing import IO, Iterator

from absl import logging

from data_pipelines import textcheck

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


# Largest share of unparseable rows (text corpora: lines) a reader accepts before it fails.
DEFAULT_MAX_BAD_FRACTION = 0.01


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
      skipped_malformed: rows with a wrong field count, an id that is not an integer in
        [0, 2^63) (ids are int64 downstream), an unknown ``ISERROR`` value, or a field over
        the size limit.
      skipped_empty: notes whose text is only whitespace; for text corpora, documents
        left with no sentence.
      skipped_bad_utf8: NOTEEVENTS rows, or text-corpus lines, with bytes that are not
        UTF-8 or a control character (NUL included; tab, newline and CR are text).
      lines_read: text corpora only: non-blank lines seen.
      first_bad_line: line (1-based, of the decompressed file) where the first
        unparseable row or line starts; None if there is none.
      first_bad_column: the column (1-based, in characters) of the first refused
        character when that is why the row was rejected, else None.
      first_bad_reason: why that row was rejected (never its content), with the record
        number for NOTEEVENTS rows.
    """

    path: str = ""
    records_read: int = 0
    records_kept: int = 0
    skipped_iserror: int = 0
    skipped_malformed: int = 0
    skipped_empty: int = 0
    skipped_bad_utf8: int = 0
    lines_read: int = 0
    first_bad_line: int | None = None
    first_bad_reason: str = ""
    first_bad_column: int | None = None

    def bad(self, line: int, reason: str, column: int | None = None) -> None:
        """Remembers the first unparseable row (its line, column and reason, not its
        content)."""
        if self.first_bad_line is None:
            self.first_bad_line, self.first_bad_reason = line, reason
            self.first_bad_column = column

    def single_document(self) -> str | None:
        """For a text corpus read as one document although it has several lines (no blank
        line between documents): ``"PATH: 1 document (no blank line between documents in N
        lines)"``; else None. One document is one vocabulary record and one training unit, so
        such a file blocks a run that needs two (the vocabulary's "need at least 2 examples",
        an empty training or held-out split)."""
        if self.records_read == 1 and self.lines_read >= 2:
            return (f"{self.path}: 1 document (no blank line between documents in "
                    f"{self.lines_read} lines)")
        return None

    def first_bad(self) -> str:
        """Where the first unparseable row starts and why (no content)."""
        where = f"line {self.first_bad_line}"
        if self.first_bad_column is not None:
            where += f", column {self.first_bad_column}"
        return f"{where}: {self.first_bad_reason}"

    @property
    def skipped(self) -> int:
        """Total number of skipped records (text-corpus bad lines included)."""
        return (self.skipped_iserror + self.skipped_malformed + self.skipped_empty
                + self.skipped_bad_utf8)

    def summary(self) -> str:
        """One human-readable line with every counter."""
        return (f"{self.path}: read {self.records_read} records, kept {self.records_kept}; "
                f"skipped {self.skipped_iserror} ISERROR=1, {self.skipped_malformed} malformed, "
                f"{self.skipped_empty} empty, {self.skipped_bad_utf8} not UTF-8 text (bad bytes "
                f"or control characters)")


def open_text(path: str | os.PathLike[str]) -> IO[str]:
    """Opens a UTF-8 text file for streaming, decompressing gzip data on the fly.

    The byte-level rules of ``data_pipelines.textcheck``: gzip data is recognised by its magic
    bytes (a file named ``*.gz`` must be gzip data), UTF-16 is refused, a UTF-8 byte-order mark
    at the start is skipped (and said once). Invalid bytes become lone surrogates
    (``errors="surrogateescape"``) so the caller can count and skip the records that hold them;
    ``newline=""`` keeps ``\\r\\n`` inside quoted CSV fields intact, as the csv module requires.

    Raises:
      CorpusError: the file does not exist, is a directory, cannot be opened, is named
        ``*.gz`` without being gzip data, or is UTF-16.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        raise CorpusError(f"{path}: is a directory; expected a corpus file")
    if not os.path.isfile(path):
        raise CorpusError(f"corpus file not found: {path!r}")
    return textcheck.open_text(path, CorpusError, newline="")


def _read_error(path: str, line: int, e: BaseException) -> CorpusError:
    """A CorpusError for a decompression or I/O failure after ``line`` lines."""
    return textcheck.read_error(path, line, e, CorpusError)


def has_bad_bytes(text: str) -> bool:
    """Whether ``text`` (decoded by :func:`open_text`) held bytes that are not UTF-8."""
    return _BAD_BYTE_RE.search(text) is not None


def read_text_documents(path: str | os.PathLike[str],
                        stats: ReadStats | None = None,
                        max_bad_fraction: float = DEFAULT_MAX_BAD_FRACTION
                        ) -> Iterator[list[str]]:
    """Streams documents from a BERT pretraining text file.

    Format: one sentence per line, a blank (whitespace-only) line between documents;
    gzip is decompressed.  Sentences are stripped of surrounding whitespace.  A line with
    bytes that are not UTF-8 or a control character (NUL included; tab and CR are text) is
    dropped and counted in ``stats.skipped_bad_utf8`` (the first one's line and column are
    remembered); a document left without any sentence is counted in ``stats.skipped_empty``.
    A file of several lines and no blank line is ONE document: a WARNING says so (once per
    file), since one record is what blocks a vocabulary or a split that needs two.

    Args:
      path: the corpus file.
      stats: optional counters, filled while iterating (``records`` are documents).
      max_bad_fraction: largest accepted share of dropped lines among non-blank lines.

    Yields:
      Each document as a non-empty ``list[str]`` of sentences, in file order.

    Raises:
      CorpusError: the file is missing or unreadable, is a MIMIC NOTEEVENTS CSV (read it
        as ``noteevents``), holds no document at all, or more than ``max_bad_fraction``
        of its lines are not text (checked when the iteration reaches the end).
    """
    _check_fraction(max_bad_fraction)
    stats = stats if stats is not None else ReadStats()
    stats.path = os.fspath(path)
    line_no = 0
    with open_text(path) as f:
        doc: list[str] = []
        saw_lines = False  # whether the current block had any line (bad ones included)
        lines = iter(f)
        while True:
            try:
                line = next(lines)
            except StopIteration:
                break
            except (OSError, EOFError, zlib.error) as e:
                raise _read_error(stats.path, line_no, e) from None
            line_no += 1
            if line_no == 1 and looks_like_noteevents_header(line):
                raise CorpusError(
                    f"{stats.path}: line 1 is a MIMIC-III NOTEEVENTS header; this reader "
                    "expects plain text (one sentence per line, blank line between "
                    "documents). Read it as format/corpus 'noteevents' (one note = one "
                    "example)")
            bad = textcheck.bad_char(line)
            line = line.strip()
            if not line and bad is None:
                if saw_lines:
                    yield from _finish_document(doc, stats)
                doc, saw_lines = [], False
                continue
            saw_lines = True
            stats.lines_read += 1
            if bad is not None:
                stats.skipped_bad_utf8 += 1
                stats.bad(line_no, bad[1], column=bad[0] + 1)
                continue
            doc.append(line)
        if saw_lines:
            yield from _finish_document(doc, stats)
    _log_and_check(stats, stats.skipped_bad_utf8, stats.lines_read, "lines",
                   max_bad_fraction)
    single = stats.single_document()
    if single:
        _warn_once(stats.path, f"{single}: a document is one record of the DP vocabulary and "
                               "one privacy unit of training, so the whole file counts as ONE; "
                               "put a blank line between documents")


# (file, size, mtime, message) of the warnings already given (once per file and process: the
# record-identity check reads a corpus twice).
_WARNED: set[tuple] = set()


def _warn_once(path: str, message: str) -> None:
    try:
        st = os.stat(path)
        key = (os.path.abspath(path), st.st_size, st.st_mtime_ns, message)
    except OSError:
        key = (os.path.abspath(path), message)
    if key not in _WARNED:
        _WARNED.add(key)
        logging.warning("%s", message)


class _ScannedLines:
    """The lines of a file, for csv.reader, remembering the first refused character (a byte
    that is not UTF-8, a control character) since the last :meth:`take`, with its line and
    column: csv.reader reads exactly the lines of one record per row, so after each row
    ``take()`` says whether that row held one."""

    def __init__(self, lines):
        self._lines = lines
        self.line = 0
        self._first: tuple[int, int, str] | None = None

    def __iter__(self):
        for text in self._lines:
            self.line += 1
            if self._first is None and textcheck.has_bad_char(text):
                index, what = textcheck.bad_char(text)
                self._first = (self.line, index + 1, what)
            yield text

    def take(self) -> tuple[int, int, str] | None:
        first, self._first = self._first, None
        return first


def looks_like_noteevents_header(line: str) -> bool:
    """Whether ``line`` is a CSV header with the NOTEEVENTS key columns (ROW_ID, TEXT, ...)."""
    names = {h.strip().lstrip("\ufeff").strip('"').upper() for h in line.split(",")}
    return {"ROW_ID", "SUBJECT_ID", "TEXT"} <= names


def _check_fraction(value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise CorpusError(f"max_bad_fraction must be a number in [0, 1], got {value!r}")


check_max_bad_fraction = _check_fraction


def _finish_document(doc: list[str], stats: ReadStats) -> Iterator[list[str]]:
    """Counts one finished document and yields it unless it is empty."""
    stats.records_read += 1
    if doc:
        stats.records_kept += 1
        yield doc
    else:
        stats.skipped_empty += 1


# Ids are kept as int64 downstream (record identity, tokenized corpora, instances).
MAX_ID = 2**63 - 1


def _parse_int(value: str) -> int:
    """Parses a MIMIC id (``"123"``, spaces tolerated) in [0, MAX_ID]; anything else raises
    ValueError (its message says why, never the value)."""
    value = value.strip()
    # isdecimal() alone would accept non-ASCII digits; MIMIC ids are ASCII.
    if not (value.isascii() and value.isdecimal()):
        raise ValueError("is not an integer")
    if len(value.lstrip("0")) > 19 or int(value) > MAX_ID:
        raise ValueError(f"is too large ({len(value.lstrip('0'))} digits; ids must be below "
                         "2^63)")
    return int(value)


def _check_header(header: list[str] | None, path: str) -> dict[str, int]:
    """Maps NOTEEVENTS column names to their indices, or raises a CorpusError."""
    if header is None:
        raise CorpusError(f"{path}: the file is empty (expected a NOTEEVENTS header: "
                          f"{','.join(NOTEEVENTS_COLUMNS)})")
    names = [h.strip().lstrip("\ufeff").strip('"').upper() for h in header]
    for column in NOTEEVENTS_COLUMNS:
        fields = [i + 1 for i, n in enumerate(names) if n == column]
        if len(fields) > 1:
            # Which copy holds the column is anyone's guess (a shifted or hand-edited header):
            # reading either could take another column's values for this one.
            times = "twice" if len(fields) == 2 else f"{len(fields)} times"
            where = ", ".join(map(str, fields[:-1])) + f" and {fields[-1]}"
            raise CorpusError(f"{path}: line 1: column {column} appears {times} (fields "
                              f"{where}); each NOTEEVENTS column must be named once")
    missing = [c for c in NOTEEVENTS_COLUMNS if c not in names]
    if missing:
        # Never echo the line: without a header it is the first note (private text).
        known = [c for c in NOTEEVENTS_COLUMNS if c in names]
        hint = ("; the first field is a number, so the header line is probably missing"
                if names and names[0].strip().isdecimal() else "")
        raise CorpusError(
            f"{path}: line 1 is not a MIMIC-III NOTEEVENTS header: it has {len(names)} "
            f"field(s), missing column(s) {', '.join(missing)}"
            + (f" (present: {', '.join(known)})" if known else "") + hint)
    return {name: names.index(name) for name in NOTEEVENTS_COLUMNS}


def read_noteevents(path: str | os.PathLike[str],
                    stats: ReadStats | None = None,
                    max_bad_fraction: float = DEFAULT_MAX_BAD_FRACTION) -> Iterator[Note]:
    """Streams notes from a MIMIC-III ``NOTEEVENTS.csv`` or ``NOTEEVENTS.csv.gz``.

    Columns are found by name in the header (any order; extra columns are allowed; a
    NOTEEVENTS column named twice is refused).
    Rows with ``ISERROR=1`` are skipped (MIMIC marks them as erroneous notes); rows with
    a wrong field count, a ``ROW_ID``/``SUBJECT_ID``/``HADM_ID`` that is not an integer in
    [0, 2^63) (``HADM_ID`` may be empty), an ``ISERROR`` other than empty/0/1, bytes that are
    not UTF-8 or a control character (NUL included, in any field; tab, newline and CR are text), or an
    empty ``TEXT`` are skipped and counted in ``stats``; one summary line is logged at
    the end.

    Args:
      path: the NOTEEVENTS file.
      stats: optional counters, filled while iterating.
      max_bad_fraction: largest accepted share of unparseable rows (malformed or not
        UTF-8) among the data rows.

    Yields:
      :class:`Note` per usable row, in file order.

    Raises:
      CorpusError: the file is missing or unreadable (not gzip, truncated), its header
        lacks NOTEEVENTS columns (named in the message), or, at the end of the
        iteration, it yielded no note at all or more than ``max_bad_fraction`` of its
        rows could not be parsed (the message names the line where the first bad row
        starts).
    """
    _check_fraction(max_bad_fraction)
    stats = stats if stats is not None else ReadStats()
    path_str = os.fspath(path)
    stats.path = path_str
    # The limit is process-global in the csv module; raising it only admits longer
    # fields and changes nothing else.
    csv.field_size_limit(max(csv.field_size_limit(), _MAX_FIELD_CHARS))
    with open_text(path) as f:
        # strict: a quote left open at the end of the file is an error (counted as a
        # malformed row) instead of a silently accepted note.
        scanned = _ScannedLines(f)
        reader = csv.reader(scanned, strict=True)
        try:
            header = next(reader, None)
        except csv.Error as e:
            raise CorpusError(f"{path_str}: cannot parse the CSV header on line 1 "
                              f"({_csv_reason(e)})") from None
        except (OSError, EOFError, zlib.error) as e:
            raise _read_error(path_str, 0, e) from None
        col = _check_header(header, path_str)
        num_fields = len(header)
        scanned.take()  # the header's (its names were checked)
        while True:
            start = reader.line_num + 1  # the line where the next record starts
            try:
                row = next(reader)
            except StopIteration:
                break
            except csv.Error as e:
                # A field over the size limit, a stray quote, a quote left open at the
                # end of the file: count the row; the reader resumes on the next line.
                stats.records_read += 1
                stats.skipped_malformed += 1
                stats.bad(start, f"data row {stats.records_read}, CSV error: "
                                 f"{_csv_reason(e)}")
                scanned.take()
                continue
            except (OSError, EOFError, zlib.error) as e:
                raise _read_error(path_str, reader.line_num, e) from None
            refused = scanned.take()
            if not row:
                continue  # blank line between records: not a record
            stats.records_read += 1
            if refused is not None and len(row) == num_fields:
                line, column, what = refused
                stats.skipped_bad_utf8 += 1
                stats.bad(line, f"data row {stats.records_read}, {what}", column=column)
                continue
            note = _parse_row(row, col, num_fields, stats,
                              lambda why: stats.bad(start, f"data row {stats.records_read}, "
                                                           f"{why}"))
            if note is not None:
                stats.records_kept += 1
                yield note
    check_noteevents_read(stats, max_bad_fraction)


def check_noteevents_read(stats: ReadStats, max_bad_fraction: float) -> None:
    """What ``read_noteevents`` does at the end of the file: the summary logged, a
    CorpusError for too many bad rows or no note (``note_cache`` replays a read with it)."""
    _log_and_check(stats, stats.skipped_malformed + stats.skipped_bad_utf8,
                   stats.records_read, "rows", max_bad_fraction)


def _csv_reason(e: csv.Error) -> str:
    """The csv module's message without any quoted content (it can quote a character)."""
    msg = str(e)
    if "field larger than field limit" in msg:
        return f"a field longer than {_MAX_FIELD_CHARS} characters"
    if "unexpected end of data" in msg or "EOF" in msg:
        return "a quote left open at the end of the file"
    if "expected after" in msg:
        return "text after a closing quote (an unterminated or stray quote earlier?)"
    if "NUL" in msg or "null byte" in msg:
        return "NUL bytes (binary data)"
    return "malformed CSV"


def _parse_row(row: list[str], col: dict[str, int], num_fields: int,
               stats: ReadStats, bad=lambda why: None) -> Note | None:
    """Turns one CSV row into a Note, or counts why it is skipped and returns None.

    ``bad(reason)`` is called with the reason of a malformed row (never its content).
    """
    if len(row) != num_fields:
        stats.skipped_malformed += 1
        bad(f"{len(row)} fields, the header has {num_fields}")
        return None
    if any(textcheck.has_bad_char(field) for field in row):
        stats.skipped_bad_utf8 += 1
        bad("bytes that are not UTF-8 or a control character")
        return None
    iserror = row[col["ISERROR"]].strip()
    if iserror not in ("", "0", "1"):
        stats.skipped_malformed += 1
        bad("ISERROR is not empty, 0 or 1")
        return None
    for name in ("ROW_ID", "SUBJECT_ID", "HADM_ID"):
        value = row[col[name]].strip()
        if name == "HADM_ID" and not value:
            continue
        try:
            _parse_int(value)
        except ValueError as e:
            stats.skipped_malformed += 1
            bad(f"{name} {e}")
            return None
    row_id = _parse_int(row[col["ROW_ID"]])
    subject_id = _parse_int(row[col["SUBJECT_ID"]])
    hadm = row[col["HADM_ID"]].strip()
    hadm_id = _parse_int(hadm) if hadm else None
    if iserror == "1":
        stats.skipped_iserror += 1
        return None
    text = row[col["TEXT"]]
    if not text.strip():
        stats.skipped_empty += 1
        return None
    return Note(row_id=row_id, subject_id=subject_id, hadm_id=hadm_id,
                category=row[col["CATEGORY"]].strip(), text=text)


def _log_and_check(stats: ReadStats, num_bad: int, num_total: int, unit: str,
                   max_bad_fraction: float) -> None:
    """Raises CorpusError when more than ``max_bad_fraction`` of the rows/lines could not be
    parsed or nothing usable was found (the message holds the summary); else logs the
    summary (WARNING when records were skipped)."""
    if num_bad and num_bad > max_bad_fraction * num_total:
        raise CorpusError(
            f"{stats.path}: {num_bad} of {num_total} {unit} "
            f"({100.0 * num_bad / max(num_total, 1):.1f} %) cannot be parsed, more than the "
            f"{100.0 * max_bad_fraction:g} % allowed (max_bad_fraction); the first bad one "
            f"starts at {stats.first_bad()}. Fix the "
            f"file there, or accept the loss with a larger share (training: "
            f"--config.data.max_bad_fraction; build_vocab: --max_bad_fraction) "
            f"[{stats.summary()}]")
    if stats.records_kept == 0:
        raise CorpusError(f"no usable record in {stats.path} ({stats.summary()})")
    if stats.skipped:
        # WARNING, so skipped records are visible at the default absl verbosity; with where
        # the first unparseable one is (never its content).
        where = (f"; the first unparseable one starts at {stats.first_bad()}"
                 if stats.first_bad_line is not None else "")
        logging.warning("%s%s", stats.summary(), where)
    else:
        logging.info("%s", stats.summary())

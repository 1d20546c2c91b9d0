"""Byte-level input rules shared by every text reader, and messages that never show a value.

Every reader of text that may be private (plain-text corpora and NOTEEVENTS in
``data_pipelines.corpora``, fine-tuning TSVs in ``classification``, CoNLL files in ``ner``, the
canary file, TFDS text features) applies the same rules:

* **gzip** is read everywhere: gzip data is recognised by its magic bytes whatever the file is
  called; a file whose name ends in ``.gz`` but that is not gzip data is refused, naming it.
* **UTF-16** (a UTF-16 byte-order mark) is refused: corpora must be UTF-8.
* A **UTF-8 byte-order mark** (``EF BB BF``) at the start of the file is skipped, and said
  once (a WARNING naming the file): an Excel or Notepad export is otherwise fine, and the mark
  must not become part of a header name, a label or the first word.
* **Bytes that are not UTF-8** and **control characters** (C0: U+0000-U+001F except TAB, LF and
  CR; and DEL, U+007F) are refused with their position ``file:line:column`` (1-based, the column
  counts characters). What refusing means for the file follows the reader's rule for a bad
  row: the fine-tuning readers (TSV, CoNLL) and the canary file refuse the whole file; the
  corpus readers (text, NOTEEVENTS, TFDS) drop the line or row, count it, and refuse the file
  when more than ``max_bad_fraction`` of its rows are bad (the message names the first one's
  position).

Messages name files, line and column numbers, counts, lengths and classes of characters, never
a value read from a data file: :func:`describe` says what a bad value looks like without
showing it ("9 characters: letters, digits").
"""

from __future__ import annotations

import gzip
import io
import os
import re
import unicodedata
import zlib
from typing import IO

from absl import logging

GZIP_MAGIC = b"\x1f\x8b"
UTF8_BOM = b"\xef\xbb\xbf"
_UTF16_BOMS = (b"\xff\xfe", b"\xfe\xff")

# What a reader refuses in decoded text: C0 controls but TAB/LF/CR, DEL, and the lone
# surrogates that errors="surrogateescape" makes of bytes that are not UTF-8.
_BAD_CHAR_RE = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\udc80-\udcff]")

READ_ERRORS = (OSError, EOFError, zlib.error)

# Files whose byte-order mark was already reported (said once per file and process).
_SAID_BOM: set[tuple] = set()


def open_text(path: str | os.PathLike, error: type[Exception] = ValueError, *,
              newline: str | None = "") -> IO[str]:
    """Opens an existing UTF-8 text file for streaming under the rules of this module.

    gzip data is decompressed (by its magic bytes, whatever the name); a UTF-8 byte-order mark
    at the start is skipped (and said once); bytes that are not UTF-8 become lone surrogates
    (``errors="surrogateescape"``) that :func:`bad_char` finds with their position.

    Args:
      path: the file (the caller has checked that it exists).
      error: the exception class raised (the reader's own, e.g. ``CorpusError``).
      newline: passed to ``io.TextIOWrapper``: ``""`` (csv; lines end at LF, CR or CRLF,
        untranslated) or ``"\\n"`` (lines end at LF only, so a lone CR stays inside its line).

    Raises:
      error: the file cannot be opened, is named ``*.gz`` without being gzip data, its gzip
        data is cut or corrupt before the first line, or it is UTF-16.
    """
    path = os.fspath(path)
    try:
        raw: IO[bytes] = open(path, "rb")
    except OSError as e:
        raise error(f"{path}: cannot open ({e.strerror or e})") from None
    try:
        head = raw.read(4)
        raw.seek(0)
        if head[:2] == GZIP_MAGIC:
            raw = gzip.GzipFile(fileobj=raw, mode="rb")
            head = raw.read(4)
            raw.seek(0)
        elif path.endswith(".gz"):
            raise error(f"{path}: not gzip data although the name ends in .gz "
                        "(rename it without .gz if it is plain text)")
    except READ_ERRORS as e:
        raw.close()
        raise read_error(path, 0, e, error) from None
    except BaseException:
        raw.close()
        raise
    if head[:2] in _UTF16_BOMS:
        raw.close()
        raise error(f"{path}: UTF-16 text (a byte-order mark); corpora must be UTF-8 "
                    "(convert it, e.g. iconv -f UTF-16 -t UTF-8)")
    if head[:3] == UTF8_BOM:
        raw.read(3)
        _say_bom(path)
    return io.TextIOWrapper(raw, encoding="utf-8", errors="surrogateescape", newline=newline)


def _say_bom(path: str) -> None:
    try:
        st = os.stat(path)
        key = (os.path.abspath(path), st.st_size, st.st_mtime_ns)
    except OSError:
        key = (os.path.abspath(path),)
    if key not in _SAID_BOM:
        _SAID_BOM.add(key)
        logging.warning("%s: skipped the UTF-8 byte-order mark (BOM) at the start of the file",
                        path)


def read_error(path: str, line: int, e: BaseException,
               error: type[Exception] = ValueError) -> Exception:
    """The reader's error for a decompression or I/O failure after ``line`` lines."""
    if isinstance(e, EOFError):
        what = "the gzip data ends early (a truncated or partly copied file)"
    elif isinstance(e, (zlib.error, gzip.BadGzipFile)):
        what = "corrupt gzip data"
    else:
        what = f"read error ({getattr(e, 'strerror', None) or type(e).__name__})"
    return error(f"{path}: {what} after line {line}; nothing of this file was used")


def bad_char(text: str) -> tuple[int, str] | None:
    """(0-based index, what it is) of the first refused character of decoded ``text``: a byte
    that is not UTF-8, a NUL byte, another control character; None if there is none. The
    description names the code point of a control character, never the text around it."""
    m = _BAD_CHAR_RE.search(text)
    if m is None:
        return None
    c = m.group()
    if "\udc80" <= c <= "\udcff":
        return m.start(), "a byte that is not valid UTF-8"
    if c == "\x00":
        return m.start(), "a NUL byte (binary data?)"
    return m.start(), f"a control character (U+{ord(c):04X})"


def has_bad_char(text: str) -> bool:
    return _BAD_CHAR_RE.search(text) is not None


def line_problem(path: str | os.PathLike, line_no: int, line: str) -> str | None:
    """``"path:line:column: what"`` for the first refused character of a line (with the rule,
    for a control character), or None."""
    bad = bad_char(line)
    if bad is None:
        return None
    rule = ("" if "UTF-8" in bad[1] else
            "; text may hold no control character but tab, newline and CR")
    return f"{os.fspath(path)}:{line_no}:{bad[0] + 1}: {bad[1]}{rule}"


# ----------------------------------------------------------------------------- describing values


def _char_class(c: str) -> str:
    cat = unicodedata.category(c)
    if cat[0] == "L" or cat == "Mn" or cat == "Mc":
        return "letters"
    if cat[0] == "N":
        return "digits"
    if c.isspace() or cat[0] == "Z":
        return "spaces"
    if cat[0] in "PS":
        return "punctuation"
    return "other characters"


_CLASS_ORDER = ("letters", "digits", "spaces", "punctuation", "other characters")


def describe(value: str) -> str:
    """What a value read from a data file looks like, without showing it: its length and the
    classes of its characters, e.g. ``"9 characters: letters, digits"``."""
    if not value:
        return "an empty value"
    classes = {_char_class(c) for c in value}
    n = len(value)
    return (f"{n} character{'s' if n != 1 else ''}: "
            + ", ".join(c for c in _CLASS_ORDER if c in classes))


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether two paths are the same file (one path, a link to it) or byte-identical copies."""
    a, b = os.fspath(a), os.fspath(b)
    try:
        if os.path.samefile(a, b):
            return True
        if os.path.getsize(a) != os.path.getsize(b):
            return False
        with open(a, "rb") as fa, open(b, "rb") as fb:
            while True:
                ca, cb = fa.read(1 << 20), fb.read(1 << 20)
                if ca != cb:
                    return False
                if not ca:
                    return True
    except OSError:
        return False

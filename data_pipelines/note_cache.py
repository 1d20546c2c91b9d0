"""The parsed notes of one NOTEEVENTS file, kept in memory between the reads of one process.

A run that builds its DP vocabulary reads its NOTEEVENTS file four times: the vocabulary's
record-identity scan and count (``identity.unique``: a scan, then the stream), then the same
two passes for the pretraining documents. Each read decompresses, parses the CSV, checks every
field's bytes and hashes every note (``identity.note_digest``). :func:`read` does that once:
the first complete read of a file keeps its notes, their digests, their positions and the
reader's statistics; a later read of the same file (same path, size, mtime, inode) replays
them, and fills ``stats``, logs the summary and applies ``max_bad_fraction`` exactly as
``corpora.read_noteevents`` does.

Bounded: one file at a time, and only a file whose notes hold at most ``MAX_CACHED_CHARS``
characters of text (the embedded demo's 40,000 notes: ~35 M); a larger corpus (MIMIC-III's
~4 G characters) is streamed on every read as before. ``clear`` drops the kept file
(``pretraining.build_datasets`` calls it when it has read the corpus).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterator

from data_pipelines import corpora

# Characters of note text that the kept file may hold (its notes are kept only below this).
MAX_CACHED_CHARS = 1 << 27

# What a skipped row changes in ReadStats (besides records_read / records_kept).
_SKIP_FIELDS = ("skipped_iserror", "skipped_malformed", "skipped_empty", "skipped_bad_utf8",
                "first_bad_line", "first_bad_reason", "first_bad_column")


@dataclasses.dataclass
class _Entry:
    key: tuple
    digest: Callable[[corpora.Note], int]
    notes: list
    digests: list
    positions: list          # records_read when each note was yielded
    skips: dict              # note index -> _SKIP_FIELDS values, where they changed before it
    final: corpora.ReadStats


_ENTRY: _Entry | None = None


def clear() -> None:
    """Forgets the kept file."""
    global _ENTRY
    _ENTRY = None


def _file_key(path: str) -> tuple | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (os.path.realpath(path), st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev)


def _skips(stats: corpora.ReadStats) -> tuple:
    return tuple(getattr(stats, f) for f in _SKIP_FIELDS)


def read(path: str, stats: corpora.ReadStats | None, max_bad_fraction: float,
         digest: Callable[[corpora.Note], int]) -> Iterator[tuple[corpora.Note, int, int]]:
    """(note, ``digest(note)``, data row) for each note of ``corpora.read_noteevents(path,
    stats, max_bad_fraction)``, in file order, with the same statistics, log lines and errors;
    from memory when this file was read completely before (module doc)."""
    key = _file_key(path)
    entry = _ENTRY
    if entry is not None and key is not None and entry.key == key and entry.digest is digest:
        return _replay(entry, path, stats, max_bad_fraction)
    return _read(path, stats, max_bad_fraction, digest, key)


def _read(path: str, stats: corpora.ReadStats | None, max_bad_fraction: float,
          digest: Callable[[corpora.Note], int], key: tuple | None
          ) -> Iterator[tuple[corpora.Note, int, int]]:
    global _ENTRY
    st = stats if stats is not None else corpora.ReadStats()
    keep = key is not None
    notes, digests, positions, skips = [], [], [], {}
    last, chars = _skips(corpora.ReadStats()), 0
    for note in corpora.read_noteevents(path, st, max_bad_fraction):
        d = digest(note)
        if keep:
            now = _skips(st)
            if now != last:
                skips[len(notes)], last = now, now
            notes.append(note)
            digests.append(d)
            positions.append(st.records_read)
            chars += len(note.text)
            if chars > MAX_CACHED_CHARS:
                keep, notes, digests, positions, skips = False, [], [], [], {}
        yield note, d, st.records_read
    if keep and _file_key(path) == key:  # not kept when the file changed while being read
        _ENTRY = _Entry(key, digest, notes, digests, positions, skips,
                        dataclasses.replace(st))


def _replay(entry: _Entry, path: str, stats: corpora.ReadStats | None,
            max_bad_fraction: float) -> Iterator[tuple[corpora.Note, int, int]]:
    corpora.check_max_bad_fraction(max_bad_fraction)
    st = stats if stats is not None else corpora.ReadStats()
    st.path = os.fspath(path)
    skips = entry.skips
    for i, (note, d, position) in enumerate(zip(entry.notes, entry.digests, entry.positions)):
        if i in skips:
            for field, value in zip(_SKIP_FIELDS, skips[i]):
                setattr(st, field, value)
        st.records_read, st.records_kept = position, i + 1
        yield note, d, position
    for field in dataclasses.fields(corpora.ReadStats):
        if field.name != "path":
            setattr(st, field.name, getattr(entry.final, field.name))
    corpora.check_noteevents_read(st, max_bad_fraction)

"""data_pipelines.note_cache: a NOTEEVENTS file replayed from memory gives what reading it gives
(notes, positions, statistics at every note, the end's log line and errors), and is bounded."""

import dataclasses
import logging
import os

import pytest

from data_pipelines import corpora, identity, note_cache, synthetic_notes

HEADER = ",".join(corpora.NOTEEVENTS_COLUMNS)


def _row(row_id, subject, text, iserror="") -> str:
    quoted = '"' + text.replace('"', '""') + '"'
    return f"{row_id},{subject},7,2150-01-01,,,Radiology,X,,{iserror},{quoted}\n"


@pytest.fixture(autouse=True)
def _fresh_cache():
    note_cache.clear()
    yield
    note_cache.clear()


def _bad_rows_file(tmp_path):
    data = HEADER + "\n" + _row(1, 101, "first\nnote.") + _row(2, 102, "flagged", "1")
    data += _row(3, "abc", "bad id") + _row(4, 104, "  \n ") + _row(5, 105, "kept. Yes.")
    data += _row(6, 106, "bad iserror", "x") + _row(7, 107, "last one.") + _row(8, 108, " ")
    path = tmp_path / "NOTEEVENTS.csv"
    path.write_text(data, encoding="utf-8")
    return str(path)


def _pass(path, max_bad_fraction=1.0):
    """[(note, digest, position, stats at that note)], final stats."""
    stats = corpora.ReadStats()
    out = [(n, d, p, dataclasses.replace(stats))
           for n, d, p in note_cache.read(path, stats, max_bad_fraction, identity.note_digest)]
    return out, stats


def test_replay_equals_the_read(tmp_path, caplog):
    path = _bad_rows_file(tmp_path)
    with caplog.at_level(logging.INFO):
        reference = list(corpora.read_noteevents(path, corpora.ReadStats(), 1.0))
        first, first_stats = _pass(path)
        assert note_cache._ENTRY is not None
        second, second_stats = _pass(path)
    assert [n for n, *_ in first] == reference
    assert first == second and first_stats == second_stats
    assert [p for _, _, p, _ in first] == [1, 5, 7]
    assert first_stats.skipped_iserror == 1 and first_stats.skipped_empty == 2
    summaries = [r.getMessage() for r in caplog.records if "kept 3" in r.getMessage()]
    assert len(summaries) == 3 and len(set(summaries)) == 1  # the reference, the read, the replay


def test_replay_applies_max_bad_fraction(tmp_path):
    path = _bad_rows_file(tmp_path)
    _pass(path)
    with pytest.raises(corpora.CorpusError, match="cannot be parsed") as cached:
        _pass(path, max_bad_fraction=0.01)
    note_cache.clear()
    with pytest.raises(corpora.CorpusError, match="cannot be parsed") as fresh:
        _pass(path, max_bad_fraction=0.01)
    assert str(cached.value) == str(fresh.value)
    with pytest.raises(corpora.CorpusError, match="max_bad_fraction"):
        _pass(path, max_bad_fraction=2.0)


def test_a_changed_file_is_read_again(tmp_path):
    path = _bad_rows_file(tmp_path)
    _pass(path)
    with open(path, "a", encoding="utf-8") as f:
        f.write(_row(9, 109, "appended."))
    notes, _ = _pass(path)
    assert [n.row_id for n, *_ in notes] == [1, 5, 7, 9]


def test_bounded(tmp_path, monkeypatch):
    path = tmp_path / "notes.csv"
    synthetic_notes.write_noteevents_csv(path, synthetic_notes.generate_synthetic(20, seed=1))
    monkeypatch.setattr(note_cache, "MAX_CACHED_CHARS", 1000)
    notes, _ = _pass(str(path))
    assert len(notes) == 20 and note_cache._ENTRY is None  # too large to keep: streamed
    monkeypatch.setattr(note_cache, "MAX_CACHED_CHARS", 10**9)
    assert _pass(str(path))[0] == notes and note_cache._ENTRY is not None


def test_duplicates_refused_alike_from_memory(tmp_path):
    data = HEADER + "\n" + _row(1, 101, "a.") + _row(2, 102, "b.") + _row(1, 101, "a.")
    path = tmp_path / "dup.csv"
    path.write_text(data, encoding="utf-8")
    messages = []
    for _ in range(2):
        with pytest.raises(identity.DuplicateRecordsError) as e:
            list(identity.unique_notes(str(path)))
        messages.append(str(e.value))
        assert note_cache._ENTRY is not None
    assert messages[0] == messages[1] and "data rows 1 and 3" in messages[0]
    stats = [corpora.ReadStats(), corpora.ReadStats()]
    kept = [list(identity.unique_notes(str(path), st, rule="merge_identical")) for st in stats]
    assert kept[0] == kept[1] and [n.row_id for n in kept[0]] == [1, 2]
    assert stats[0] == stats[1] and stats[0].records_read == 3
    os.utime(path, ns=(1, 1))  # another mtime: read again
    assert list(identity.unique_notes(str(path), rule="merge_identical")) == kept[0]

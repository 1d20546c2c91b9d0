"""Tests for data_pipelines.corpora: plain-text and MIMIC-III NOTEEVENTS readers."""

import csv
import gzip
import logging
import pathlib

import pytest

from data_pipelines import corpora

HEADER = ",".join(corpora.NOTEEVENTS_COLUMNS)


def _row(row_id, subject, hadm, text, iserror="", category="Radiology") -> str:
    """One NOTEEVENTS CSV record with a quoted (possibly multi-line) TEXT."""
    quoted = '"' + text.replace('"', '""') + '"'
    return (f"{row_id},{subject},{hadm},2150-01-01,2150-01-01 10:00:00,,{category},"
            f"CHEST (PA),,{iserror},{quoted}\n")


def _write(path: pathlib.Path, data: bytes) -> pathlib.Path:
    if path.suffix == ".gz":
        with gzip.open(path, "wb") as f:
            f.write(data)
    else:
        path.write_bytes(data)
    return path


# --------------------------------------------------------------------------- NOTEEVENTS


@pytest.mark.shared_data
def test_noteevents_sample_parses_with_ids(shared_data):
    path = shared_data / "clinical" / "NOTEEVENTS_sample.csv.gz"
    stats = corpora.ReadStats()
    notes = list(corpora.read_noteevents(path, stats))
    # Brute-force reference: the csv module over the whole decompressed file.
    with gzip.open(path, "rt", encoding="utf-8", newline="") as f:
        ref = list(csv.DictReader(f))
    assert len(notes) == len(ref) == 900
    assert stats.records_read == stats.records_kept == 900 and stats.skipped == 0
    for note, r in zip(notes, ref):
        assert note.row_id == int(r["ROW_ID"])
        assert note.subject_id == int(r["SUBJECT_ID"])
        assert note.hadm_id == (int(r["HADM_ID"]) if r["HADM_ID"] else None)
        assert note.category == r["CATEGORY"] == "Radiology"
        assert note.text == r["TEXT"]
    assert all(isinstance(n.subject_id, int) for n in notes)
    assert sum("\n" in n.text for n in notes) > 800  # multi-line quoted fields kept whole
    assert any("___" in n.text for n in notes)
    assert len({n.subject_id for n in notes}) > 1


def test_note_is_frozen():
    note = corpora.Note(row_id=1, subject_id=2, hadm_id=None, category="c", text="t")
    with pytest.raises(AttributeError):
        note.text = "other"  # type: ignore[misc]


@pytest.mark.parametrize("suffix", [".csv", ".csv.gz"])
def test_noteevents_bad_rows_counted_and_skipped(tmp_path, suffix, caplog):
    good_multiline = 'FINAL REPORT\r\nLine two, with "quotes".\n\nIMPRESSION: ok.'
    data = (HEADER + "\n").encode()
    data += _row(1, 101, 1001, good_multiline).encode()
    data += _row(2, 102, "", "No HADM id here.").encode()               # hadm None
    data += _row(3, 103, 1003, "flagged wrong", iserror="1").encode()   # ISERROR=1
    data += _row(4, "abc", 1004, "bad subject").encode()                # non-integer id
    data += _row(5, 105, "1.5", "bad hadm").encode()                    # non-integer id
    data += b'6,106,1006,2150-01-01,,,Radiology,X,,,"too",many,fields\n'  # field count
    data += _row(7, 107, 1007, "   \n  ").encode()                      # empty note
    data += _row(8, 108, 1008, "bad byte \xff here").encode("latin-1")  # not UTF-8
    data += _row(9, 109, 1009, "bad iserror", iserror="x").encode()     # malformed
    data += _row(10, 110, 1010, "kept, ISERROR=0", iserror="0").encode()
    data += _row(11, 111, 1011, "accents \u00e9 fine").encode()          # valid UTF-8
    path = _write(tmp_path / f"NOTEEVENTS{suffix}", data)

    stats = corpora.ReadStats()
    with caplog.at_level(logging.INFO):
        notes = list(corpora.read_noteevents(path, stats))
    assert [n.row_id for n in notes] == [1, 2, 10, 11]
    assert notes[0] == corpora.Note(1, 101, 1001, "Radiology", good_multiline)
    assert notes[1].hadm_id is None and notes[1].subject_id == 102
    assert notes[3].text == "accents \u00e9 fine"
    assert (stats.records_read, stats.records_kept) == (11, 4)
    assert stats.skipped_iserror == 1
    assert stats.skipped_malformed == 4
    assert stats.skipped_empty == 1
    assert stats.skipped_bad_utf8 == 1
    assert stats.skipped == 7
    assert "4 malformed" in stats.summary() and "1 not UTF-8" in stats.summary()
    assert any("kept 4" in r.getMessage() for r in caplog.records)


def test_noteevents_columns_found_by_name(tmp_path):
    cols = list(corpora.NOTEEVENTS_COLUMNS)
    order = [cols.index(c) for c in reversed(cols)]
    values = ["7", "70", "700", "d", "t", "", "Nursing", "desc", "", "", "hello\nworld"]
    with open(tmp_path / "n.csv", "w", newline="", encoding="utf-8") as f:
        w = csv.writer(f)
        w.writerow([cols[i] for i in order] + ["EXTRA"])
        w.writerow([values[i] for i in order] + ["x"])
    (note,) = corpora.read_noteevents(tmp_path / "n.csv")
    assert note == corpora.Note(7, 70, 700, "Nursing", "hello\nworld")


def test_noteevents_missing_file_names_it(tmp_path):
    missing = tmp_path / "nope" / "NOTEEVENTS.csv.gz"
    with pytest.raises(corpora.CorpusError, match="NOTEEVENTS.csv.gz"):
        list(corpora.read_noteevents(missing))


def test_noteevents_wrong_header_names_missing_columns(tmp_path):
    path = _write(tmp_path / "x.csv", b"ROW_ID,SUBJECT_ID,TEXT\n1,2,hello\n")
    with pytest.raises(corpora.CorpusError) as e:
        list(corpora.read_noteevents(path))
    msg = str(e.value)
    assert "x.csv" in msg
    for col in ("HADM_ID", "CATEGORY", "ISERROR", "CHARTDATE"):
        assert col in msg
    assert "ROW_ID," not in msg.split("missing")[1].split("(found")[0]


def test_noteevents_empty_file_is_an_error(tmp_path):
    path = _write(tmp_path / "empty.csv.gz", b"")
    with pytest.raises(corpora.CorpusError, match="empty"):
        list(corpora.read_noteevents(path))


def test_noteevents_no_usable_row_is_an_error(tmp_path):
    data = (HEADER + "\n" + _row(1, 1, 1, "x", iserror="1") + _row(2, 2, 2, " ")).encode()
    path = _write(tmp_path / "bad.csv", data)
    stats = corpora.ReadStats()
    with pytest.raises(corpora.CorpusError, match="no usable record.*bad.csv"):
        list(corpora.read_noteevents(path, stats))
    assert (stats.skipped_iserror, stats.skipped_empty) == (1, 1)
    # Header only: also an error, not an empty dataset.
    path = _write(tmp_path / "header_only.csv", (HEADER + "\n").encode())
    with pytest.raises(corpora.CorpusError, match="no usable record"):
        list(corpora.read_noteevents(path))


def test_noteevents_unterminated_quote_is_malformed_not_silent(tmp_path):
    data = (HEADER + "\n" + _row(1, 1, 1, "good")).encode()
    data += b'2,2,2,2150-01-01,,,Radiology,X,,,"never closed\nmore text\n'
    path = _write(tmp_path / "t.csv", data)
    stats = corpora.ReadStats()
    notes = list(corpora.read_noteevents(path, stats))
    assert [n.row_id for n in notes] == [1]
    assert stats.skipped_malformed + stats.skipped_empty == 1


def test_noteevents_is_lazy(tmp_path):
    """The reader yields the first note before it reaches a later bad row."""
    data = (HEADER + "\n" + _row(1, 1, 1, "first")).encode() + b"\xff" * 10
    path = _write(tmp_path / "lazy.csv", data)
    it = corpora.read_noteevents(path)
    assert next(it).text == "first"


# --------------------------------------------------------------------------- plain text


@pytest.mark.parametrize("suffix", [".txt", ".txt.gz"])
def test_text_documents(tmp_path, suffix):
    data = (b"Doc one, sentence one.\n  Sentence two.  \n\n\n \t\n"
            b"Doc two only sentence.\r\n\r\n"
            b"Doc three \xff bad line.\nDoc three good line.\n\n"
            b"\xfe\xfe only bad\n\n"
            b"Last doc without final newline.")
    path = _write(tmp_path / f"c{suffix}", data)
    stats = corpora.ReadStats()
    docs = list(corpora.read_text_documents(path, stats))
    assert docs == [["Doc one, sentence one.", "Sentence two."],
                    ["Doc two only sentence."],
                    ["Doc three good line."],
                    ["Last doc without final newline."]]
    assert (stats.records_read, stats.records_kept) == (5, 4)
    assert stats.skipped_bad_utf8 == 2 and stats.skipped_empty == 1


def test_text_errors(tmp_path):
    with pytest.raises(corpora.CorpusError, match="missing.txt"):
        list(corpora.read_text_documents(tmp_path / "missing.txt"))
    path = _write(tmp_path / "blank.txt.gz", b"\n\n  \n")
    with pytest.raises(corpora.CorpusError, match="no usable record.*blank.txt.gz"):
        list(corpora.read_text_documents(path))


@pytest.mark.shared_data
def test_web_bible_documents(shared_data):
    stats = corpora.ReadStats()
    docs = corpora.read_text_documents(shared_data / "corpus" / "web_bible.txt.gz", stats)
    num_docs = num_sents = 0
    for doc in docs:
        num_docs += 1
        num_sents += len(doc)
        assert doc and all(s and s == s.strip() for s in doc)
    assert num_docs == 2438 and 60_000 < num_sents < 66_000  # README: 2,438 docs, 63 k sents
    assert stats.skipped == 0


def test_noteevents_stray_quote_row_skipped_and_reading_resumes(tmp_path):
    data = (HEADER + "\n").encode()
    data += b'1,1,1,2150-01-01,,,Radiology,X,,,"closed"garbage\n'
    data += _row(2, 2, 2, "after the bad row").encode()
    path = _write(tmp_path / "q.csv", data)
    stats = corpora.ReadStats()
    notes = list(corpora.read_noteevents(path, stats))
    assert [n.row_id for n in notes] == [2]
    assert stats.skipped_malformed == 1

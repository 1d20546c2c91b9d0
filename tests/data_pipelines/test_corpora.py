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
        # Half the rows are bad on purpose: allow it to check each is counted.
        notes = list(corpora.read_noteevents(path, stats, max_bad_fraction=1.0))
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
    assert "present: ROW_ID, SUBJECT_ID, TEXT" in msg and "3 field(s)" in msg


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
    notes = list(corpora.read_noteevents(path, stats, max_bad_fraction=0.5))
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
    docs = list(corpora.read_text_documents(path, stats, max_bad_fraction=0.5))
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
    notes = list(corpora.read_noteevents(path, stats, max_bad_fraction=0.5))
    assert [n.row_id for n in notes] == [2]
    assert stats.skipped_malformed == 1


# --------------------------------------------------------------------------- bad input (issue 16)


def _notes_csv(n: int = 900) -> list[str]:
    """The lines of a NOTEEVENTS CSV of ``n`` synthetic notes, TEXT always quoted (as in
    MIMIC's file)."""
    from data_pipelines import synthetic_notes

    rows = "".join(_row(nt.row_id, nt.subject_id, nt.hadm_id or "", nt.text)
                   for nt in synthetic_notes.generate_notes(n, seed=3))
    return (HEADER + "\n" + rows).split("\n")


def _unclose_quote_of_row(lines: list[str], row: int) -> tuple[int, str]:
    """Removes the closing quote of data row ``row``'s TEXT; returns (its first line, its
    text's first line)."""
    ends = []  # the last physical line of each record (header = record 0)
    reader = csv.reader("\n".join(lines).splitlines(keepends=True))
    for _ in reader:
        ends.append(reader.line_num)
    first, last = ends[row - 1] + 1, ends[row]
    assert lines[last - 1].endswith('"'), lines[last - 1][-20:]
    lines[last - 1] = lines[last - 1][:-1]
    return first, lines[first - 1].split('"', 1)[1]


def _assert_private_text_absent(message: str, *texts: str) -> None:
    for text in texts:
        for word in text.split():
            if len(word) >= 6 and word.isalpha():
                assert word not in message, f"note text {word!r} printed in: {message}"


def test_unterminated_quote_in_row_50_fails_naming_the_line(tmp_path):
    """One open quote swallows every later row; keeping the first 49 notes with a WARNING was
    a silent wrong result. Now: an error naming the line where row 50 starts, no note text."""
    lines = _notes_csv()
    first_line, text_start = _unclose_quote_of_row(lines, 50)
    path = tmp_path / "NOTEEVENTS.csv.gz"
    _write(path, "\n".join(lines).encode())
    with pytest.raises(corpora.CorpusError) as e:
        list(corpora.read_noteevents(path))
    msg = str(e.value)
    assert f"starts at line {first_line}: data row 50," in msg, msg
    assert "max_bad_fraction" in msg and "\n" not in msg
    _assert_private_text_absent(msg, text_start, *lines[first_line:first_line + 20])
    # Accepting the loss explicitly still works (and counts it).
    stats = corpora.ReadStats()
    notes = list(corpora.read_noteevents(path, stats, max_bad_fraction=1.0))
    # How many later rows are lost depends on where the next quote falls (all but 49 in the
    # real sample, see below); here the reader resynchronises after a few rows.
    assert len(notes) < 900 and stats.skipped_malformed > 9, stats.summary()


@pytest.mark.shared_data
def test_unterminated_quote_in_row_50_of_the_real_sample(shared_data, tmp_path):
    with gzip.open(shared_data / "clinical" / "NOTEEVENTS_sample.csv.gz", "rt",
                   encoding="utf-8", newline="") as f:
        lines = f.read().split("\n")
    first_line, _ = _unclose_quote_of_row([ln.rstrip("\r") for ln in lines], 50)
    last = next(i for i in range(first_line - 1, len(lines)) if lines[i].endswith('"\r'))
    lines[last] = lines[last][:-2] + "\r"
    path = _write(tmp_path / "NOTEEVENTS.csv.gz", "\n".join(lines).encode())
    with pytest.raises(corpora.CorpusError, match=f"starts at line {first_line}: data row 50,"):
        list(corpora.read_noteevents(path))


def test_bad_row_share_threshold(tmp_path):
    good = [_row(i, i, i, f"note {i}") for i in range(1, 200)]
    bad = _row(900, "x", 1, "bad subject")
    # 1 bad row in 200 (0.5 %) is under the default 1 %: kept going, counted.
    path = _write(tmp_path / "one.csv", (HEADER + "\n" + "".join(good) + bad).encode())
    stats = corpora.ReadStats()
    assert len(list(corpora.read_noteevents(path, stats))) == 199
    assert stats.skipped_malformed == 1 and stats.first_bad_line == 201
    # 3 bad rows (1.5 %): an error naming the first one's line and reason.
    data = HEADER + "\n" + "".join(good[:120] + [bad] + good[120:] + [bad, bad])
    path = _write(tmp_path / "three.csv", data.encode())
    with pytest.raises(corpora.CorpusError,
                       match=r"3 of 202 rows \(1\.5 %\).*starts at line 122: data row 121, "
                             r"SUBJECT_ID is not an integer"):
        list(corpora.read_noteevents(path))
    assert len(list(corpora.read_noteevents(path, max_bad_fraction=0.02))) == 199
    with pytest.raises(corpora.CorpusError, match="max_bad_fraction must be"):
        list(corpora.read_noteevents(path, max_bad_fraction=float("nan")))


def test_gzip_problems_are_one_clear_error(tmp_path):
    csv_bytes = (HEADER + "\n" + "".join(_row(i, i, i, f"note {i} " * 50)
                                          for i in range(1, 400))).encode()
    # Named .gz but plain text.
    plain = tmp_path / "NOTEEVENTS.csv.gz"
    plain.write_bytes(csv_bytes)
    with pytest.raises(corpora.CorpusError, match="not gzip data although the name ends"):
        list(corpora.read_noteevents(plain))
    # Truncated gzip: nothing from it is used.
    whole = gzip.compress(csv_bytes)
    cut = tmp_path / "cut.csv.gz"
    cut.write_bytes(whole[:len(whole) // 2])
    with pytest.raises(corpora.CorpusError, match="gzip data ends early.*after line"):
        list(corpora.read_noteevents(cut))
    text = gzip.compress(b"".join(b"Sentence %d of a document.\n\n" % i for i in range(9999)))
    (tmp_path / "cut.txt.gz").write_bytes(text[:len(text) // 2])
    with pytest.raises(corpora.CorpusError, match="gzip data ends early.*after line"):
        list(corpora.read_text_documents(tmp_path / "cut.txt.gz"))
    # Corrupt gzip (bytes flipped in the middle).
    bad = bytearray(whole)
    bad[len(bad) // 2: len(bad) // 2 + 64] = bytes(64)
    corrupt = tmp_path / "corrupt.csv.gz"
    corrupt.write_bytes(bytes(bad))
    with pytest.raises(corpora.CorpusError, match="corrupt gzip data|ends early"):
        list(corpora.read_noteevents(corrupt))
    # gzip data without .gz in the name is read (magic bytes).
    (tmp_path / "zipped.csv").write_bytes(whole)
    assert len(list(corpora.read_noteevents(tmp_path / "zipped.csv"))) == 399
    # A directory instead of a file.
    with pytest.raises(corpora.CorpusError, match="is a directory"):
        list(corpora.read_noteevents(tmp_path))
    # UTF-16 (a Windows export), plain or gzipped: named, not 'binary data'.
    utf16 = "Sentence one.\n\nSentence two.\n".encode("utf-16")
    for name, data in (("u16.txt", utf16), ("u16.txt.gz", gzip.compress(utf16))):
        (tmp_path / name).write_bytes(data)
        with pytest.raises(corpora.CorpusError, match="UTF-16 text .* must be UTF-8"):
            list(corpora.read_text_documents(tmp_path / name))
    # A gzip stream cut inside its header.
    (tmp_path / "head.txt.gz").write_bytes(whole[:12])
    with pytest.raises(corpora.CorpusError, match="ends early .* after line 0"):
        list(corpora.read_text_documents(tmp_path / "head.txt.gz"))


def test_headerless_noteevents_never_prints_the_note(tmp_path):
    text = "FINAL REPORT\nPatient Johnathan Smithers, seen for pneumonia, doing well."
    path = _write(tmp_path / "noheader.csv", (_row(1, 2, 3, text) + _row(2, 2, 3, text)).encode())
    with pytest.raises(corpora.CorpusError) as e:
        list(corpora.read_noteevents(path))
    msg = str(e.value)
    assert "header line is probably missing" in msg and "missing column(s) ROW_ID" in msg
    _assert_private_text_absent(msg, text, "Radiology CHEST")


def test_text_reader_refuses_noteevents_and_binary(tmp_path):
    path = _write(tmp_path / "notes.csv", (HEADER + "\n" + _row(1, 1, 1, "a b c")).encode())
    with pytest.raises(corpora.CorpusError, match="line 1 is a MIMIC-III NOTEEVENTS header"):
        list(corpora.read_text_documents(path))
    import random
    rng = random.Random(0)
    binary = _write(tmp_path / "random.bin", bytes(rng.randrange(256) for _ in range(20000)))
    with pytest.raises(corpora.CorpusError, match=r"lines \(\d+\.\d %\) cannot be parsed"):
        list(corpora.read_text_documents(binary))
    nul = _write(tmp_path / "nul.txt", b"ok line\n" + b"a\x00b\n" * 5 + b"\nmore\n")
    with pytest.raises(corpora.CorpusError, match=r"starts at line 2, column 2: a NUL byte"):
        list(corpora.read_text_documents(nul))


# --------------------------------------------------------------------------- issue 35, part 2


def test_ids_outside_int64_are_malformed_rows_in_every_reader(tmp_path):
    """A ROW_ID, SUBJECT_ID or HADM_ID >= 2^63 is a malformed row (counted, skipped, its
    position named): it crashed the record-identity scan (ROW_ID: OverflowError) and
    training's int64 arrays (SUBJECT_ID)."""
    from data_pipelines import documents, identity

    good = [_row(i, 100 + i, 1000 + i, f"note {i} text.") for i in range(1, 400)]
    for column, bad in (("ROW_ID", _row(2**64 + 5, 7, 8, "x.")),
                        ("SUBJECT_ID", _row(900, 2**63, 8, "x.")),
                        ("HADM_ID", _row(901, 7, "0" * 30 + str(2**63), "x."))):
        path = _write(tmp_path / f"{column}.csv", (HEADER + "\n" + "".join(good[:50]) + bad
                                                    + "".join(good[50:])).encode())
        stats = corpora.ReadStats()
        notes = list(identity.unique_notes(str(path), stats))   # the vocabulary's reader
        assert len(notes) == 399 and stats.skipped_malformed == 1
        assert stats.first_bad() == (f"line 52: data row 51, {column} is too large "
                                     f"({20 if column == 'ROW_ID' else 19} digits; ids must "
                                     "be below 2^63)")
        docs = list(documents.noteevents_documents(str(path)))   # training's reader
        assert max(d.subject_id for d in docs) < 2**63 and len(docs) == 399
    ok = _write(tmp_path / "max.csv", (HEADER + "\n" + _row(2**63 - 1, 0, "", "x.")).encode())
    assert [n.row_id for n in corpora.read_noteevents(ok)] == [2**63 - 1]


@pytest.mark.parametrize("header,match", [
    (HEADER + ",TEXT", r"line 1: column TEXT appears twice \(fields 11 and 12\)"),
    (HEADER.replace("CGID", "ROW_ID") + ",ROW_ID",
     r"line 1: column ROW_ID appears 3 times \(fields 1, 9 and 12\)"),
])
def test_a_noteevents_column_named_twice_is_refused(tmp_path, header, match):
    """`...,ISERROR,TEXT,TEXT`: the first TEXT column was read (it held CATEGORY)."""
    path = _write(tmp_path / "n.csv", (header + "\n1,2,3,,,,Radiology,d,,,Radiology,secret\n")
                  .encode())
    with pytest.raises(corpora.CorpusError, match=r"n\.csv: " + match) as e:
        list(corpora.read_noteevents(path))
    assert "secret" not in str(e.value)


def test_a_text_file_without_blank_lines_is_said_to_be_one_document(tmp_path, caplog):
    path = tmp_path / "one.txt"
    path.write_text("".join(f"Sentence {i}.\n" for i in range(40)))
    stats = corpora.ReadStats()
    with caplog.at_level(logging.WARNING):
        for _ in range(2):   # the record-identity check reads a corpus twice: said once
            assert len(list(corpora.read_text_documents(path, stats))) == 1
    said = [r.getMessage() for r in caplog.records if "1 document" in r.getMessage()]
    assert said == [f"{path}: 1 document (no blank line between documents in 40 lines): a "
                    "document is one record of the DP vocabulary and one privacy unit of "
                    "training, so the whole file counts as ONE; put a blank line between "
                    "documents"]
    two = tmp_path / "two.txt"
    two.write_text("a.\nb.\n\nc.\n")
    with caplog.at_level(logging.WARNING):
        list(corpora.read_text_documents(two))
    assert not any(str(two) in r.getMessage() for r in caplog.records)

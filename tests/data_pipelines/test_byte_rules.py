"""One set of byte-level rules for every text reader (`data_pipelines.textcheck`): a UTF-8 BOM is
skipped and said once, NUL / control characters / bytes that are not UTF-8 are refused with
their position, gzip is read by its magic bytes (and a `.gz` name that is not gzip refused), for
the plain-text corpus, NOTEEVENTS, fine-tuning TSV, CoNLL and canary-file readers, and the
TFDS text features."""

import gzip
import logging

import pytest

from data_pipelines import canaries, corpora, ner, textcheck, tfds_data
from data_pipelines import classification as clf

_NOTEEVENTS_HEADER = ",".join(corpora.NOTEEVENTS_COLUMNS)


def _note(row_id: int, text: str) -> str:
    return (f'{row_id},{row_id},{row_id},2150-01-01,,,Radiology,CHEST,,,"{text}"\n')


# name: (file name, content with "@" where a bad character goes, (line, column) of "@", the
# reader, how the position reads in its message)
READERS = {
    "text": ("c.txt", "first sentence .\nsecond @ sentence\n\nthird doc\n", (2, 8),
             lambda p: list(corpora.read_text_documents(p)), "line {0}, column {1}"),
    "noteevents": ("n.csv", _NOTEEVENTS_HEADER + "\n" + _note(1, "note one") +
                   _note(2, "line a\nline b @ x"), (4, 8),
                   lambda p: list(corpora.read_noteevents(p)), "line {0}, column {1}"),
    "tsv": ("t.tsv", "label\tsentence\n1\tgood film\n0\tbad @ film\n", (3, 7),
            lambda p: clf.read_tsv(p), "t.tsv:{0}:{1}"),
    "conll": ("x.conll", "fever B-problem\nbad@ O\n", (2, 4),
              lambda p: [d.sentences for d in ner.read_conll(p)], "x.conll:{0}:{1}"),
    "canary": ("c.json", '{"format_version": 1,\n "x": "a@", "canaries": []}\n', (2, 9),
               lambda p: canaries.load_canary_file(p)[0], "c.json:{0}:{1}"),
}


def _write(path, data: bytes, compress: bool = False):
    path.write_bytes(gzip.compress(data) if compress else data)
    return path


@pytest.mark.parametrize("reader", list(READERS))
def test_bom_gzip_and_refused_characters(tmp_path, reader, caplog):
    name, content, (line, column), read, where = READERS[reader]
    clean = content.replace("@", "x").encode()
    want = read(_write(tmp_path / name, clean))
    # A UTF-8 byte-order mark is skipped (not part of a header, label or word) and said once.
    caplog.set_level(logging.WARNING)
    with_bom = _write(tmp_path / f"bom_{name}", textcheck.UTF8_BOM + clean)
    assert read(with_bom) == want and read(with_bom) == want
    said = [r for r in caplog.records if "byte-order mark" in r.getMessage()]
    assert len(said) == 1 and f"bom_{name}" in said[0].getMessage()
    # gzip: read by its magic bytes, with or without .gz in the name.
    assert read(_write(tmp_path / f"{name}.gz", clean, compress=True)) == want
    assert read(_write(tmp_path / f"z_{name}", clean, compress=True)) == want
    with pytest.raises(ValueError, match=rf"{name}\.gz: not gzip data although the name ends "):
        read(_write(tmp_path / f"plain_{name}.gz", clean))
    # NUL, other control characters, bytes that are not UTF-8: refused at their position.
    at = where.format(line, column)
    for bad, what in ((b"\x00", "a NUL byte"), (b"\x1b", r"a control character \(U\+001B\)"),
                      (b"\x7f", r"a control character \(U\+007F\)"),
                      (b"\xff", "a byte that is not valid UTF-8")):
        path = _write(tmp_path / name, content.encode().replace(b"@", bad))
        with pytest.raises(ValueError, match=rf"{at}: [^:]*{what}"):
            read(path)
    # Tab (where a column allows it) and CR are text.
    if reader in ("text", "noteevents"):
        assert read(_write(tmp_path / name, content.replace("@", "\tx").encode()))


def test_tsv_header_with_bom_is_a_header_not_a_class(tmp_path):
    data = textcheck.UTF8_BOM + b"label\tsentence\n1\tgood\n0\tbad\n"
    rows = clf.read_tsv(_write(tmp_path / "t.tsv", data))
    assert [r.label for r in rows] == ["1", "0"]


def test_lone_cr_stays_inside_a_fine_tuning_line(tmp_path):
    rows = clf.read_tsv(_write(tmp_path / "t.tsv", b"1\tgood\rfilm\n0\tbad\n"))
    assert [r.line for r in rows] == [1, 2] and rows[0].text_a == "good\rfilm"


class _Source:
    def __init__(self, texts):
        self.records = [{"text": t.encode("utf-8", "surrogateescape")} for t in texts]

    def __len__(self):
        return len(self.records)

    def __getitems__(self, indices):
        return [self.records[i] for i in indices]


def test_tfds_text_features(monkeypatch, caplog):
    caplog.set_level(logging.WARNING)
    texts = [f"Note {i} is here. It ends." for i in range(300)]
    texts[7] = "\ufeff" + texts[7]
    texts[9] = "First line.\nSecond \x00 line."
    texts[12] = "bad \udcff byte"
    monkeypatch.setattr(tfds_data, "load_data_source", lambda *a, **k: _Source(texts))
    docs = list(tfds_data.tfds_documents("fake"))
    assert len(docs) == 298 and docs[7].sentences[0] == "Note 7 is here."
    logged = " ".join(r.getMessage() for r in caplog.records)
    assert "byte-order mark at the start of 1 record" in logged
    assert "skipped 2 of 300 records (0.7 %)" in logged
    assert "the first: record 9, line 2, column 8: a NUL byte" in logged
    monkeypatch.setattr(tfds_data, "load_data_source", lambda *a, **k: _Source(texts[:20]))
    with pytest.raises(corpora.CorpusError, match=r"2 of 20 records \(10\.0 %\) hold bytes "
                                                  r".*the first is record 9, line 2, column 8"):
        list(tfds_data.tfds_documents("fake"))
    # One sentence per record (BookCorpus-like): the same rules.
    monkeypatch.setattr(tfds_data, "load_data_source",
                        lambda *a, **k: _Source(["a", "b\x07c"] * 10))
    with pytest.raises(corpora.CorpusError, match="the first is record 1, line 1, column 2: a "
                                                  r"control character \(U\+0007\)"):
        list(tfds_data.tfds_documents("fake", sentences_per_document=2))


def test_describe_never_shows_the_value():
    assert textcheck.describe("Smithers") == "8 characters: letters"
    assert textcheck.describe("B-x 7!") == "6 characters: letters, digits, spaces, punctuation"
    assert textcheck.describe("\x00") == "1 character: other characters"
    assert textcheck.describe("") == "an empty value"

"""configs/own_corpus.py: the format read off the file, the unit, the held-out split's unit set
from it, and one clear line for every bad arg (issue 36)."""

import gzip

import pytest

from configs import own_corpus
from data_pipelines import synthetic_notes


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("own")
    notes = d / "notes.csv.gz"
    synthetic_notes.write_noteevents_csv(notes, synthetic_notes.generate_synthetic(12, seed=0))
    plain = d / "notes.csv"  # the same CSV, not gzipped
    plain.write_bytes(gzip.decompress(notes.read_bytes()))
    text = d / "books.txt.gz"
    with gzip.open(text, "wt") as f:
        f.write("One sentence.\nTwo sentences.\n\nAnother document.\n")
    empty = d / "empty.txt"
    empty.write_text("")
    return {"notes": notes, "plain": plain, "text": text, "empty": empty, "dir": d}


@pytest.mark.parametrize("file, unit, corpus, privacy_unit, split", [
    ("notes", "patient", "noteevents", "patient", "subject"),
    ("notes", None, "noteevents", "patient", "subject"),      # NOTEEVENTS: per patient
    ("plain", "note", "noteevents", "note", "document"),
    ("notes", "document", "noteevents", "note", "document"),  # a synonym of note
    ("notes", "example", "noteevents", "example", "document"),
    ("text", "document", "text", "note", "document"),
    ("text", None, "text", "note", "document"),               # plain text: per document
    ("text", "example", "text", "example", "document"),
])
def test_format_and_unit_set_the_corpus_the_unit_and_the_split(files, file, unit, corpus,
                                                               privacy_unit, split):
    arg = f"path={files[file]}" + (f",unit={unit}" if unit else "")
    c = own_corpus.get_config(arg)
    assert c.data.corpus == corpus and c.data.paths == (str(files[file]),)
    assert c.dp.privacy_unit == privacy_unit and c.data.eval_split_unit == split
    assert c.data.preflight and c.vocab.dp and c.dp.enabled and c.model.size == "tiny"
    assert c.dp.noise_multiplier is None and c.dp.target_epsilon == 8.0  # sigma calibrated
    # batch sizes count units per note / patient
    assert c.batch.expected_batch_size == (128 if privacy_unit == "example" else 16)


def test_format_and_size_can_be_forced_and_no_arg_still_loads(files):
    c = own_corpus.get_config(f"path={files['notes']},format=text,size=mini")
    assert c.data.corpus == "text" and c.model.size == "mini"
    c = own_corpus.get_config()   # --config.data.paths given instead: validate says what is missing
    assert c.data.corpus == "text" and c.data.paths == () and c.dp.privacy_unit == "note"
    assert own_corpus.get_config("unit=patient").data.corpus == "noteevents"


@pytest.mark.parametrize("arg, match", [
    ("path={text},unit=patient", r"unit=patient needs patients \(SUBJECT_IDs\), which only a "
                                 r"NOTEEVENTS CSV has; .* use unit=document"),
    ("path={dir}/missing.csv.gz", r"path='.*missing.csv.gz' does not exist"),
    ("path={dir}", r"is a directory"),
    ("path={empty}", r"the file is empty"),
    ("path={notes},unit=patients", r"unit='patients' must be one of patient, note, document"),
    ("path={notes},unti=patient", r"unknown config arg 'unti'; did you mean 'unit'"),
    ("path={notes},format=csv", r"format='csv' must be one of auto, noteevents, text"),
])
def test_bad_args_are_one_clear_line(files, arg, match):
    with pytest.raises(ValueError, match=match) as e:
        own_corpus.get_config(arg.format(**{k: str(v) for k, v in files.items()}))
    assert "configs/own_corpus.py" in str(e.value) and "\n" not in str(e.value)

"""Tests for data_pipelines.tfds_data: TFDS builds and reads without TensorFlow."""

import subprocess
import sys

import numpy as np
import pytest
import tensorflow_datasets as tfds

from configs import common
from data_pipelines import documents, pretraining, synthetic_notes, tfds_data


class _NoChecksums:
    """Test builders download nothing: no checksum file lookup (see MimicNoteevents)."""

    @tfds.core.utils.classproperty
    @classmethod
    def code_path(cls):
        return None


class Wikipedia(_NoChecksums, tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """A tiny stand-in with the real wikipedia features (title, text) and config name."""

    VERSION = tfds.core.Version("1.0.0")
    BUILDER_CONFIGS = [tfds.core.BuilderConfig(name="20230601.en")]

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
            "title": tfds.features.Text(), "text": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        for i in range(30):
            yield i, {"title": f"Article {i}",
                      "text": f"Article {i} is about topic {i}. It has two sentences.\n\n"
                              f"A second paragraph of article {i} follows here."}


class Bookcorpus(_NoChecksums, tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """A sentence-level stand-in for BookCorpus (one sentence per example)."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return tfds.core.DatasetInfo(builder=self, features=tfds.features.FeaturesDict({
            "text": tfds.features.Text()}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        for i in range(100):
            yield i, {"text": f"the hero walked {i} miles before dawn ."}


@pytest.fixture(scope="module")
def fake_public(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("tfds")
    for cls in (Wikipedia, Bookcorpus):
        cls(data_dir=str(data_dir), file_format="array_record").download_and_prepare()
    return data_dir


@pytest.fixture(scope="module")
def notes_tfds(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("notes")
    csv_path = tmp / "my_notes.csv.gz"  # any file name: it is linked under the expected one
    synthetic_notes.write_noteevents_csv(csv_path, synthetic_notes.generate_synthetic(60,
                                                                                     seed=9))
    data_dir = tmp / "tfds"
    tfds_data.prepare_noteevents(csv_path, data_dir)
    return csv_path, data_dir


def test_noteevents_builder_roundtrip(notes_tfds):
    csv_path, data_dir = notes_tfds
    source = tfds_data.load_data_source(tfds_data.NOTEEVENTS_NAME, data_dir=str(data_dir))
    assert len(source) == 60
    record = source[0]
    assert set(record) == {"text", "row_id", "subject_id", "hadm_id", "category"}
    got = sorted(tfds_data.tfds_documents(tfds_data.NOTEEVENTS_NAME, data_dir=str(data_dir)),
                 key=lambda d: d.key)
    want = list(documents.noteevents_documents(str(csv_path)))
    assert got == want  # same notes, SUBJECT_IDs and ROW_IDs, same sentences
    notes = {n.row_id: n for n in synthetic_notes.generate_notes(60, seed=9)}
    for i in range(len(source)):
        r = source[i]
        n = notes[int(r["row_id"])]
        assert r["text"].decode() == n.text and int(r["subject_id"]) == n.subject_id
        assert int(r["hadm_id"]) == (-1 if n.hadm_id is None else n.hadm_id)
    # Preparing again is a no-op.
    assert tfds_data.prepare_noteevents(csv_path, data_dir).endswith("1.0.0")


def test_builds_and_reads_without_tensorflow(tmp_path):
    """In a fresh interpreter: build from CSV, read back, and TensorFlow was never imported."""
    code = f"""
import sys
from data_pipelines import synthetic_notes, tfds_data
synthetic_notes.write_noteevents_csv({str(tmp_path / 'NOTEEVENTS.csv')!r},
                                     synthetic_notes.generate_synthetic(5))
tfds_data.prepare_noteevents({str(tmp_path / 'NOTEEVENTS.csv')!r}, {str(tmp_path / 'd')!r})
docs = list(tfds_data.tfds_documents('mimic_noteevents', data_dir={str(tmp_path / 'd')!r}))
assert len(docs) == 5, docs
assert 'tensorflow' not in sys.modules, 'TensorFlow was imported'
try:
    import tensorflow
    print('TF_INSTALLED')
except ImportError:
    print('NO_TF')
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "TF_INSTALLED" in out.stdout or "NO_TF" in out.stdout


@pytest.mark.shared_data
def test_noteevents_sample_through_tfds(shared_data, tmp_path):
    path = shared_data / "clinical" / "NOTEEVENTS_sample.csv.gz"
    tfds_data.prepare_noteevents(path, tmp_path)
    docs = list(tfds_data.tfds_documents(tfds_data.NOTEEVENTS_NAME, data_dir=str(tmp_path)))
    assert len(docs) == 900
    assert len({d.subject_id for d in docs}) > 200 and all(d.subject_id > 0 for d in docs)
    assert sorted(d.key for d in docs) == list(range(1, 901))


def test_public_stage_documents(fake_public):
    wiki = list(tfds_data.tfds_documents("wikipedia/20230601.en", data_dir=str(fake_public)))
    assert len(wiki) == 30
    assert all(len(d.sentences) == 3 and d.subject_id == -1 for d in wiki)
    # Keys identify a document by its text, never by its place in the dataset.
    assert [d.key for d in wiki] == [documents.content_key(d.sentences) for d in wiki]
    assert len({d.key for d in wiki}) == 30 and min(d.key for d in wiki) >= 0
    books = list(tfds_data.tfds_documents("bookcorpus", data_dir=str(fake_public),
                                          sentences_per_document=16))
    assert [len(d.sentences) for d in books] == [16] * 6 + [4]
    assert len(list(tfds_data.tfds_documents("wikipedia/20230601.en", max_documents=7,
                                             data_dir=str(fake_public)))) == 7


def test_build_datasets_from_tfds_sources(fake_public, notes_tfds, notes_vocab):
    cfg = common.data_config()
    cfg.corpus = "tfds"
    cfg.tfds_names = ("wikipedia/20230601.en", "bookcorpus")
    cfg.tfds_sentence_datasets = ("bookcorpus",)
    cfg.tfds_sentences_per_document = 10
    cfg.tfds_data_dir = str(fake_public)
    cfg.max_seq_length = 64
    cfg.eval_fraction = 0.1
    train, ev = pretraining.build_datasets(cfg, notes_vocab)
    assert train.metadata["train_documents"] + train.metadata["eval_documents"] == 30 + 10
    # Document keys are the documents' content keys, distinct across the two sources (the
    # held-out split relies on them).
    keys = set(np.asarray(train.instances.doc_key).tolist()) | set(
        np.asarray(ev.instances.doc_key).tolist())
    docs = [*tfds_data.tfds_documents("wikipedia/20230601.en", data_dir=str(fake_public)),
            *tfds_data.tfds_documents("bookcorpus", data_dir=str(fake_public),
                                      sentences_per_document=10)]
    content = {documents.content_key(d.sentences) for d in docs}
    assert len(content) == 40 and keys <= content and len(keys) > 30
    assert train.get_batch(np.arange(4), step=0)["input_ids"].shape == (4, 64)
    # The MIMIC builder as a corpus keeps SUBJECT_IDs for a subject-level split.
    cfg2 = common.data_config()
    cfg2.corpus = "tfds"
    cfg2.tfds_names = (tfds_data.NOTEEVENTS_NAME,)
    cfg2.tfds_data_dir = str(notes_tfds[1])
    cfg2.eval_fraction = 0.2
    cfg2.eval_split_unit = "subject"
    train2, ev2 = pretraining.build_datasets(cfg2, notes_vocab)
    assert (train2.subject_ids >= 10_000).all()
    assert not set(train2.subject_ids.tolist()) & set(ev2.subject_ids.tolist())


def test_unprepared_dataset_errors_clearly(tmp_path, notes_vocab):
    with pytest.raises(tfds_data.DataNotPreparedError,
                       match=r"'wikipedia/20230601.en' is not prepared in .*tfds build"):
        tfds_data.load_data_source("wikipedia/20230601.en", data_dir=str(tmp_path))
    cfg = common.data_config()
    cfg.corpus = "tfds"
    cfg.tfds_names = ("bookcorpus",)
    cfg.tfds_data_dir = str(tmp_path)
    with pytest.raises(FileNotFoundError, match="'bookcorpus' is not prepared"):
        pretraining.build_datasets(cfg, notes_vocab)
    with pytest.raises(tfds_data.DataNotPreparedError, match="NOTEEVENTS.csv.gz"):
        builder = tfds_data.MimicNoteevents(data_dir=str(tmp_path / "d"),
                                            file_format="array_record")
        builder.download_and_prepare(download_config=tfds.download.DownloadConfig(
            manual_dir=str(tmp_path)))


def test_missing_noteevents_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="nothere.csv.gz"):
        tfds_data.prepare_noteevents(tmp_path / "nothere.csv.gz", tmp_path / "d")

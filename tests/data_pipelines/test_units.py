"""Privacy units in the data (issue 15): every example in exactly one unit (no cross-unit
'random next'), units per note / patient, whole units held out, the DP vocabulary per patient."""

import collections
import json

import numpy as np
import pytest

from configs import common
from data_pipelines import (corpora, datasets, documents, dp_vocab, instances, pretraining,
                            unit_instances)
from tests.data_pipelines.test_pretraining import make_corpus


def doc_units(corpus, unit: str) -> np.ndarray:
    """The unit of each document of a corpus: itself, or its SUBJECT_ID."""
    if unit == "note" or (corpus.subject_ids == documents.NO_SUBJECT).all():
        return np.arange(corpus.num_documents)
    return np.asarray(corpus.subject_ids)


@pytest.mark.parametrize("unit,subject", [("note", True), ("patient", True),
                                          ("patient", False)])
def test_each_example_lies_in_exactly_one_unit(unit, subject):
    """A and B of every example come from one unit; a 'random next' B from the same note is
    neither A's true continuation nor touching A; per patient, B comes from another note of
    the patient when there is one."""
    corpus = make_corpus(40, (1, 9), (3, 25), seed=3, subject=subject)  # 3 notes per patient
    # (seed 13: the one-note patient's 3 sentences draw a 'random next' at least once)
    params = instances.InstanceParams(max_seq_length=48, dupe_factor=2, seed=13,
                                      privacy_unit=unit)
    inst = instances.create_instances(corpus, params, progress=False)
    of_doc = doc_units(corpus, unit)
    a, b = np.asarray(inst.doc_index), np.asarray(inst.b_doc_index)
    np.testing.assert_array_equal(of_doc[a], of_doc[b])
    ids = unit_instances.unit_ids(inst, unit)
    assert ids.max() + 1 == len(np.unique(of_doc[a]))
    for u in range(ids.max() + 1):  # one id per unit, one unit per id
        assert len(np.unique(of_doc[a[ids == u]])) == 1
    rnd = np.asarray(inst.is_random_next)
    assert 0.3 < rnd.mean() < 0.7  # BERT's NSP task survives
    same = rnd & (a == b)
    a0, an = np.asarray(inst.a_sentence_start), np.asarray(inst.a_sentence_count)
    b0, bn = np.asarray(inst.b_sentence_start), np.asarray(inst.b_sentence_count)
    assert np.all((b0[same] > a0[same] + an[same]) | (b0[same] + bn[same] < a0[same]))
    assert np.all(b0[~rnd] == a0[~rnd] + an[~rnd])  # actual next: right after A
    if unit == "patient" and subject:
        # Patients have 3 notes, but the last one has 1: only its B comes from its own note.
        notes = collections.Counter(corpus.subject_ids.tolist())
        single = np.array([notes[s] == 1 for s in corpus.subject_ids.tolist()])
        assert same.any() and np.all(single[a[same]]) and not single[a[rnd & ~same]].any()
    else:
        assert same.any() and not (a != b).any()


def test_example_instances_cannot_serve_a_larger_unit():
    inst = instances.create_instances(make_corpus(30, (2, 6), (3, 20)),
                                      instances.InstanceParams(max_seq_length=48),
                                      progress=False)
    np.testing.assert_array_equal(unit_instances.unit_ids(inst, "example"), np.arange(len(inst)))
    with pytest.raises(ValueError, match="take segment B from another patient"):
        unit_instances.unit_ids(inst, "patient")


def test_patient_needs_a_subject_on_every_note():
    corpus = make_corpus(6, 3, 5)
    corpus.subject_ids[2] = documents.NO_SUBJECT
    with pytest.raises(ValueError, match="SUBJECT_ID on every note"):
        instances.create_instances(
            corpus, instances.InstanceParams(max_seq_length=32, privacy_unit="patient"),
            progress=False)


def test_unit_batch_layout():
    """[units, K] example slots of any dataset, with the example mask as a feature."""
    class Rows:
        def get_batch(self, indices, *, step):
            return {"x": np.asarray(indices)[:, None] * 10 + step}

    got = datasets.get_unit_batch(Rows(), np.array([[1, 2], [3, 0]]),
                                  np.array([[True, True], [True, False]]), step=1)
    np.testing.assert_array_equal(got["x"][..., 0], [[11, 21], [31, 1]])
    np.testing.assert_array_equal(got[datasets.EXAMPLE_MASK], [[True, True], [True, False]])


def patient_config(path, **overrides):
    c = common.data_config()
    c.update(corpus="noteevents", paths=(str(path),), max_seq_length=128,
             max_predictions_per_seq=20, eval_fraction=0.1, eval_split_unit="subject")
    c.update(overrides)
    return c


@pytest.mark.shared_data
def test_noteevents_sample_units_are_the_training_patients(shared_data, notes_vocab):
    """Per patient: one unit per SUBJECT_ID of the training split, none held out in part."""
    path = shared_data / "clinical" / "NOTEEVENTS_sample.csv.gz"
    train, ev = pretraining.build_datasets(patient_config(path), notes_vocab, "patient")
    notes = list(corpora.read_noteevents(path))
    train_notes = set(np.asarray(train.instances.doc_key).tolist())
    train_subjects = {n.subject_id for n in notes if n.row_id in train_notes}
    units = train.metadata["units"]
    assert units["unit_key"] == "SUBJECT_ID" and units["privacy_unit"] == "patient"
    assert units["num_units"] == len(train_subjects) == units["train_subjects"] > 200
    assert train.unit_ids.max() + 1 == units["num_units"]
    for u in (0, 17, units["num_units"] - 1):
        assert len(np.unique(train.subject_ids[train.unit_ids == u])) == 1
    assert not train_subjects & set(ev.subject_ids.tolist())
    per_unit = np.bincount(train.unit_ids)
    assert units["examples_per_unit"]["max"] == per_unit.max() > 1
    assert units["documents_per_unit_max"] == max(
        collections.Counter(n.subject_id for n in notes if n.row_id in train_notes).values())
    with pytest.raises(ValueError, match="eval_split_unit='subject'"):
        pretraining.build_datasets(patient_config(path, eval_split_unit="document"),
                                   notes_vocab, "patient")


@pytest.mark.shared_data
def test_dp_vocabulary_per_patient_groups_the_notes(shared_data, tmp_path):
    """One vocabulary example per SUBJECT_ID: a patient's notes share one bound of K words."""
    path = shared_data / "clinical" / "NOTEEVENTS_sample.csv.gz"
    notes = list(corpora.read_noteevents(path))
    grouped = list(dp_vocab.iter_examples(path, "noteevents", unit="patient"))
    subjects = sorted({n.subject_id for n in notes})
    assert len(grouped) == len(subjects)
    first = [n.text for n in notes if n.subject_id == subjects[0]]
    assert grouped[0] == "\n".join(first)
    result = dp_vocab.build_vocab(path, "noteevents", 1000, 4.0, 1e-6, 32, tmp_path / "v",
                                  seed=0, progress=False, unit="patient")
    report = json.loads(result.privacy_path.read_text())
    assert report["num_examples"] == len(subjects) and report["unit"] == "patient"
    assert report["neighbouring_relation"] == "add or remove one patient (all their notes)"
    assert "SUBJECT_ID" in report["example_definition"]
    with pytest.raises(dp_vocab.VocabError, match="unit='patient'"):
        dp_vocab.build_vocab(path, "text", 1000, 4.0, 1e-6, 32, tmp_path / "w", unit="patient")

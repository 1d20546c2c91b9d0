"""Patient- and note-level privacy in the report and end to end (issue 15): the unit sentence,
the vocabulary's group-privacy factor per unit, and the acceptance run of configs/mimic_dp.py on
the NOTEEVENTS sample whose report counts patients (checked against the CSV and the accountant)."""

import json
import os
import pathlib
import subprocess
import sys

import dp_accounting
import pytest

from data_pipelines import corpora, tokenized_corpus
from dpbert import report as report_lib

REPO = pathlib.Path(__file__).resolve().parents[2]


def test_unit_sentences():
    assert report_lib.unit_definition("patient", 128, 8, "SUBJECT_ID") == (
        "one patient (SUBJECT_ID) with all the training sequences made from their notes, at "
        "most 8 per batch")
    assert "here one document (the corpus has no SUBJECT_IDs)" in report_lib.unit_definition(
        "patient", 128, 8, "document")
    assert report_lib.unit_definition("note", 128, 4) == (
        "one note (document) with all the training sequences made from it, at most 4 per batch")
    assert report_lib.unit_definition("example", 64).startswith("one training sequence of at "
                                                                "most 64 tokens")


@pytest.mark.parametrize("vocab_unit,unit,key,expected", [
    ("document", "example", "", 2),          # A and B from two notes
    ("patient", "example", "", 1),           # ... of one patient
    ("document", "note", "document", 1),
    ("patient", "note", "document", 1),      # a note lies in one patient
    ("patient", "patient", "SUBJECT_ID", 1),  # the same unit: no lifting
    ("document", "patient", "SUBJECT_ID", 7),  # per-note vocabulary: 7 notes of a patient
    ("document", "patient", "document", 1),  # no SUBJECT_IDs: a patient is a document
])
def test_vocabulary_counts_once_per_unit_when_its_unit_holds_the_training_unit(
        vocab_unit, unit, key, expected):
    vocab = {"dp": True, "epsilon": 2.0, "delta": 1e-6, "unit": vocab_unit}
    multiplicity = {"documents_per_example_max": 2, "subjects_per_example_max": 1,
                    "documents_per_subject_max": 7}
    k = report_lib.vocab_documents_per_unit(vocab, unit, multiplicity, {"unit_key": key})
    assert k == expected
    part = report_lib.vocabulary_part(vocab, "built", k)
    assert part["epsilon"] == pytest.approx(2.0 * k)
    assert ("lifted" in part) == (k > 1)
    assert ("unit_relation" in part) == (k == 1 and vocab_unit == "patient")
    # Reports written before the field existed are per document.
    legacy = {k: v for k, v in vocab.items() if k != "unit"}
    assert report_lib.vocab_unit(legacy) == "document"


def training_subjects(path: pathlib.Path, eval_fraction: float, seed: int) -> set[int]:
    """The SUBJECT_IDs of the training split, computed from the CSV as the data split does."""
    return {n.subject_id for n in corpora.read_noteevents(path)
            if tokenized_corpus.heldout_draw(seed, n.subject_id) >= eval_fraction}


@pytest.mark.slow
@pytest.mark.shared_data
def test_mimic_config_trains_per_patient_and_counts_patients(shared_data, tmp_path):
    """The issue's acceptance command, shrunk: the report's N is the number of distinct
    SUBJECT_IDs of the training split, and epsilon is dp_accounting's for (N, q, the sampler's
    truncation in patients, sigma, steps)."""
    path = shared_data / "clinical" / "NOTEEVENTS_sample.csv.gz"
    workdir = tmp_path / "w"
    flags = {"data.paths": f"('{path}',)", "train.num_steps": 3, "batch.expected_batch_size": 24,
             "batch.physical_batch_size": 8, "batch.microbatch_size": 8,
             "dp.max_examples_per_unit": 4, "data.max_seq_length": 64,
             "data.max_predictions_per_seq": 8, "vocab.size": 1000,
             "data.eval_fraction": 0.05, "train.eval_every": 0, "train.eval_batches": 1,
             "train.log_every": 3, "checkpoint.every_steps": 0, "optimizer.warmup_steps": 1}
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one CPU device
    out = subprocess.run(
        [sys.executable, "launch/train.py", "--config=configs/mimic_dp.py:size=tiny",
         f"--workdir={workdir}", *[f"--config.{k}={v}" for k, v in flags.items()]],
        cwd=REPO, env=dict(env, PYTHONPATH=str(REPO)), capture_output=True, text=True,
        timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    report = json.loads((workdir / "privacy_report.json").read_text())
    patients = training_subjects(path, 0.05, 12345)
    t = report["training"]
    assert report["privacy_unit"] == t["privacy_unit"] == "patient"
    assert t["num_examples"] == t["num_units"] == report["units"]["num_units"] == len(patients)
    assert report["units"]["train_subjects"] == len(patients) > 200
    assert report["units"]["num_examples"] > 2 * len(patients)  # sequences, not patients
    assert t["max_examples_per_unit"] == report["units"]["max_examples_per_unit"] == 4
    q = 24 / len(patients)
    assert t["sampling_probability"] == pytest.approx(q)
    accountant = dp_accounting.pld.PLDAccountant()
    accountant.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.TruncatedSubsampledGaussianDpEvent(len(patients), q, t["max_batch_size"],
                                                         1.5), 3))
    assert t["epsilon"] == pytest.approx(accountant.get_epsilon(1e-8), rel=1e-9)
    v = report["vocabulary"]
    assert v["unit"] == "patient" and v["documents_per_unit"] == 1 and "lifted" not in v
    assert report["epsilon"] == pytest.approx(t["epsilon"] + v["epsilon"])
    sentence = ("one patient (SUBJECT_ID) with all the training sequences made from their "
                "notes, at most 4 per batch")
    assert report["unit_definition"] == sentence and sentence in report["headline"]
    card = (workdir / "hf" / "README.md").read_text()
    assert f"poisson sampling of {len(patients)} patients" in card
    assert "The guarantee covers a whole patient directly" in card

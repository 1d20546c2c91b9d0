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
from data_pipelines import vocab_privacy
from dpbert.reporting import report as report_lib
from dpbert.errors import ConfigError

REPO = pathlib.Path(__file__).resolve().parents[3]


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


@pytest.mark.parametrize("vocab_unit,unit,key,cap,observed,relation,records", [
    ("document", "example", "", None, None, "replace", 2),  # A and B: two notes modified
    ("patient", "example", "", None, None, "replace", 2),   # ... of up to two patients
    ("document", "note", "document", None, 1, "add_remove", 1),
    ("patient", "note", "document", None, None, "replace", 1),  # a note modifies its patient
    ("patient", "patient", "SUBJECT_ID", None, None, "add_remove", 1),  # the same unit
    ("document", "patient", "SUBJECT_ID", 7, 7, "add_remove", 7),  # the public cap, checked
    ("document", "patient", "document", None, None, "add_remove", 1),  # a patient = a document
])
def test_vocabulary_relation_under_the_training_unit_is_computed_from_public_facts(
        vocab_unit, unit, key, cap, observed, relation, records):
    vocab = {"dp": True, "epsilon": 2.0, "delta": 1e-6, "K": 64, "unit": vocab_unit}
    rel = report_lib.vocab_relation(vocab, unit, unit_key=key, max_records_per_unit=cap,
                                    observed_records_per_unit=observed)
    assert (rel.relation, rel.records) == (relation, records)
    part = report_lib.vocabulary_part(vocab, "built", rel, "f" * 64)
    want = vocab_privacy.histogram_guarantee(vocab_privacy.calibrate_histogram(2.0, 1e-6, 64),
                                             relation, records)
    assert (part["epsilon"], part["delta"]) == (want.epsilon, want.delta)
    assert (part["vocabulary_epsilon"], part["vocabulary_delta"]) == (2.0, 1e-6)
    assert part["relation"] == relation and part["records"] == records
    if (relation, records) == ("add_remove", 1):
        assert part["epsilon"] == 2.0  # the vocabulary's own guarantee, no lifting
    else:
        assert part["epsilon"] > 2.0
    # Reports written before the field existed are per document.
    legacy = {k: v for k, v in vocab.items() if k != "unit"}
    assert report_lib.vocab_unit(legacy) == "document"


def test_patient_vocabulary_with_note_training_counts_the_replaced_record():
    """The issue's repro: a per-patient vocabulary (epsilon 2) under per-note training costs
    at least the PLD of 2K Laplace mechanisms (2.97), not 2."""
    vocab = {"dp": True, "epsilon": 2.0, "delta": 1e-6, "K": 64, "unit": "patient"}
    part = report_lib.vocabulary_part(
        vocab, "file", report_lib.vocab_relation(vocab, "note", unit_key="document"))
    assert part["epsilon"] >= 2.97 - 5e-3 and part["epsilon"] == pytest.approx(2.9656, abs=1e-3)


def test_a_per_document_vocabulary_needs_a_public_cap_for_larger_units():
    vocab = {"dp": True, "epsilon": 2.0, "delta": 1e-6, "K": 64, "unit": "document"}
    for cap in (None, 5):  # 7 notes of one patient exceed both
        with pytest.raises(ConfigError, match="vocab.max_records_per_unit"):
            report_lib.vocab_relation(vocab, "patient", unit_key="SUBJECT_ID",
                                      max_records_per_unit=cap, observed_records_per_unit=7)
    # A note unit of two vocabulary records (defence in depth: duplicated ROW_IDs are refused
    # or merged when the corpus is read, data_pipelines.identity).
    with pytest.raises(ConfigError, match="spans more documents"):
        report_lib.vocab_relation(vocab, "note", unit_key="document",
                                  observed_records_per_unit=2)


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
    assert v["unit"] == "patient" and (v["relation"], v["records"]) == ("add_remove", 1)
    assert v["epsilon"] == v["vocabulary_epsilon"]  # the same unit: no lifting
    assert report["epsilon"] == pytest.approx(t["epsilon"] + v["epsilon"])
    sentence = ("one patient (SUBJECT_ID) with all the training sequences made from their "
                "notes, at most 4 per batch")
    assert report["unit_definition"] == sentence and sentence in report["headline"]
    card = (workdir / "hf" / "README.md").read_text()
    assert f"poisson sampling of {len(patients)} patients" in card
    assert "The guarantee covers a whole patient directly" in card
    # The shipped report is the public one: no exact corpus statistic.
    shipped = json.loads((workdir / "hf" / "privacy_report.json").read_text())
    assert "units" not in shipped and "unit_multiplicity" not in shipped
    assert str(report["units"]["num_examples"]) not in card

"""dpbert.core: the privacy units defined once, the shared checks, and dpbert.errors.need."""

import pytest

from dpbert.core import checks, units
from dpbert.errors import ConfigError, need


def test_the_registry_names_three_units_and_which_group_sequences():
    assert units.NAMES == ("example", "note", "patient")
    assert [units.get(n).per_unit for n in units.NAMES] == [False, True, True]
    assert [units.get(n).by_subject for n in units.NAMES] == [False, False, True]
    assert units.get(units.NOTE) is units.NOTE and units.find("document") is None
    with pytest.raises(ValueError, match=r"privacy_unit must be one of \('example', 'note', "
                                         r"'patient'\), got 'document'"):
        units.get("document")


def test_definitions_and_keys():
    assert units.EXAMPLE.definition(64) == (
        "one training sequence of at most 64 tokens ([CLS] A [SEP] B [SEP])")
    assert units.PATIENT.definition(64, 4, units.SUBJECT_KEY).endswith("notes, at most 4 per batch")
    assert units.PATIENT.definition(None, None, units.DOCUMENT_KEY).startswith(
        "one patient, here one document")
    assert units.PATIENT.key(has_subjects=True) == units.SUBJECT_KEY
    assert units.PATIENT.key(has_subjects=False) == units.NOTE.key(True) == units.DOCUMENT_KEY
    assert {u.vocab_record for u in units.UNITS.values()} == set(units.VOCAB_RECORDS)


def test_checks_name_the_value():
    assert checks.check_int("steps", 3.0, minimum=0) == 3
    with pytest.raises(ValueError, match="steps=2.5 must be an integer"):
        checks.check_int("steps", 2.5, minimum=0)
    with pytest.raises(ValueError, match=r"delta=0.1 must be < 1/num_examples"):
        checks.validate_delta(0.1, 100)
    with pytest.raises(ValueError, match="sigma=nan must be a positive finite number"):
        checks.check_positive("sigma", float("nan"))


def test_need_names_the_field_and_its_value():
    need(True, "dp.clip_norm", -1.0, "never raised")
    with pytest.raises(ConfigError, match=r"^config.dp.clip_norm=-1.0: must be > 0$"):
        need(False, "dp.clip_norm", -1.0, "must be > 0")

"""What one neighbouring record of the training is: the privacy unit, defined once.

`dp.privacy_unit` names one of the units of `UNITS`, the registry every user reads: the data
pipeline (how instances are made and grouped, `data_pipelines.instances` and
`data_pipelines.pretraining`), the DP plan (what the sampler draws and the clipper clips,
`dpbert.dp.plan`), the accountant's report (`dpbert.dp.accounting.privacy_report`) and the
run's report and model card (`dpbert.reporting.report`).

    example  one training sequence ([CLS] A [SEP] B [SEP]); BERT's algorithm makes them, and a
             'random next' segment B may come from another document
    note     one note: one document (a NOTEEVENTS row, i.e. one ROW_ID; a document of a text
             corpus) with every sequence made from it
    patient  one patient: one SUBJECT_ID with every sequence made from their notes; a document
             in corpora without SUBJECT_IDs

A unit of several sequences (`PrivacyUnit.per_unit`) is sampled whole (Poisson over units),
contributes at most K sequences to a logical batch, and its gradient is clipped once; the data
pipeline keeps every sequence inside its unit (`docs/threat_model.md`).

The DP vocabulary has its own records (`VOCAB_RECORDS`: a document, or a patient's notes
together); `PrivacyUnit.vocab_record` is the record a run of the unit builds its vocabulary
over, and `dpbert.reporting.report.vocab_relation` relates the two.
"""

from __future__ import annotations

import dataclasses

# What a unit of several documents is keyed by in the data (`data_pipelines.pretraining`'s unit
# summary, the report's `unit_key`): SUBJECT_IDs, or a document where the corpus has none.
SUBJECT_KEY = "SUBJECT_ID"
DOCUMENT_KEY = "document"

# What one record of the DP vocabulary is (`data_pipelines.dp_vocab`, `--unit`): one document
# (a note, or a document of a text corpus) or one patient (all their notes together).
DOCUMENT_RECORD = "document"
PATIENT_RECORD = "patient"
VOCAB_RECORDS = (DOCUMENT_RECORD, PATIENT_RECORD)


@dataclasses.dataclass(frozen=True)
class PrivacyUnit:
    """One privacy unit (module docstring).

    Attributes:
      name: its name in configs and reports (`dp.privacy_unit`, `privacy_unit`).
      per_unit: True when one unit groups several training sequences: the sampler draws whole
        units (N = the number of units, [units, K] batches), the clipper clips each unit's
        gradient once, and the data pipeline keeps 'random next' segments inside the unit.
      by_subject: True when units are grouped by SUBJECT_ID (a document where the corpus has
        none): held-out splits must hold out whole subjects.
      vocab_record: the DP vocabulary record (`VOCAB_RECORDS`) that a run of this unit builds
        its vocabulary over.
      noun: the unit in an error message ("note (ROW_ID)").
      definition_text: `definition`'s sentence, with {length} and {per_batch} to fill.
      definition_without_subjects: the sentence where a `by_subject` unit is one document (the
        corpus has no SUBJECT_IDs).
    """

    name: str
    per_unit: bool
    by_subject: bool
    vocab_record: str
    noun: str
    definition_text: str
    definition_without_subjects: str = ""

    def definition(self, max_seq_length: int | None = None,
                   max_examples_per_unit: int | None = None, unit_key: str = "") -> str:
        """One sentence: what the guarantee protects (the report's `unit_definition`).

        `max_seq_length`: the sequences' length bound; `max_examples_per_unit`: K (units of
        several sequences); `unit_key`: what the data keyed the units by (`key`).
        """
        length = f" of at most {max_seq_length} tokens" if max_seq_length else ""
        per_batch = (f", at most {max_examples_per_unit} per batch"
                     if max_examples_per_unit else "")
        text = (self.definition_without_subjects
                if self.by_subject and unit_key == DOCUMENT_KEY else self.definition_text)
        return text.format(length=length, per_batch=per_batch)

    def key(self, has_subjects: bool) -> str:
        """What the units of a corpus are keyed by: SUBJECT_ID (a `by_subject` unit in a corpus
        with SUBJECT_IDs) or the document."""
        return SUBJECT_KEY if self.by_subject and has_subjects else DOCUMENT_KEY


EXAMPLE = PrivacyUnit(
    "example", per_unit=False, by_subject=False, vocab_record=DOCUMENT_RECORD,
    noun="training sequence",
    definition_text="one training sequence{length} ([CLS] A [SEP] B [SEP])")
NOTE = PrivacyUnit(
    "note", per_unit=True, by_subject=False, vocab_record=DOCUMENT_RECORD,
    noun="note (ROW_ID)",
    definition_text="one note (document) with all the training sequences made from "
                    "it{per_batch}")
PATIENT = PrivacyUnit(
    "patient", per_unit=True, by_subject=True, vocab_record=PATIENT_RECORD,
    noun="patient",
    definition_text="one patient (SUBJECT_ID) with all the training sequences made from "
                    "their notes{per_batch}",
    definition_without_subjects="one patient, here one document (the corpus has no "
                                "SUBJECT_IDs), with all the training sequences made from "
                                "it{per_batch}")

UNITS: dict[str, PrivacyUnit] = {u.name: u for u in (EXAMPLE, NOTE, PATIENT)}
# The names, in the order error messages list them.
NAMES = tuple(UNITS)


def get(unit: str | PrivacyUnit) -> PrivacyUnit:
    """The unit named `unit` (a `PrivacyUnit` is returned as it is); ValueError naming the
    choices for any other name."""
    if isinstance(unit, PrivacyUnit):
        return unit
    if unit not in UNITS:
        raise ValueError(f"privacy_unit must be one of {NAMES}, got {unit!r}")
    return UNITS[unit]


def find(name: object) -> PrivacyUnit | None:
    """The unit named `name`, or None (a report written by another program may name any)."""
    return UNITS.get(name) if isinstance(name, str) else None

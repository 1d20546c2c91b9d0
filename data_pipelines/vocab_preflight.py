"""Before a DP vocabulary is built: are there enough records for it to be useful?

The DP histogram (``vocab_privacy``) releases a word only if its noisy count of records (a
document, a note, or a patient's notes) reaches the threshold tau, about 91 records at epsilon
8, K = 64, delta 1e-6 (tau falls as epsilon grows). A corpus of n records can release only
the words used by more than tau of them: below ``MIN_RECORDS_PER_THRESHOLD`` x tau records at
most a handful do (the vocabulary is the public alphabet and little else: text splits into
characters), and below ``GOOD_RECORDS_PER_THRESHOLD`` x tau expect tens of words, not
hundreds. Measured on the 900 synthetic radiology reports of ``../shared/data`` (282
patients): per patient at epsilon 8 (n = 3.1 tau) 37 words survive, at epsilon 4 (1.7 tau)
3, at epsilon 2 (0.9 tau) none; per note at epsilon 8 (9.9 tau) 108.

``count_records`` reads the corpus once (the readers' checks included: a malformed file or a
repeated ROW_ID fails here, before anything is spent) and counts the vocabulary's records;
``assess`` compares the count with tau and words the fix: the records needed, the
vocabulary epsilon at which this corpus would do, or a public vocabulary. The count is an
exact statistic of the private corpus: it reaches only the operator's console (as the
vocabulary build's own checks against n do), never a report.
"""

from __future__ import annotations

import dataclasses
import math
import os
from typing import Mapping

from data_pipelines import corpora, identity
from data_pipelines.vocab_privacy import calibrate_histogram
from dpbert.core import units as privacy_units

# Below this many records per threshold tau a DP vocabulary is refused (a handful of words at
# most); below GOOD_... a warning (a thin vocabulary: tens of words).
MIN_RECORDS_PER_THRESHOLD = 2.0
GOOD_RECORDS_PER_THRESHOLD = 10.0
# The largest vocabulary epsilon `assess` proposes (beyond it the per-word epsilon nears the
# build's own limits, and the run's total would be meaningless).
MAX_SUGGESTED_EPSILON = 64.0

# What a record is, in words, by (format, vocabulary record).
RECORD_WORDS = {("noteevents", privacy_units.PATIENT_RECORD): "patients (SUBJECT_IDs)",
                ("noteevents", privacy_units.DOCUMENT_RECORD): "notes (rows)",
                ("text", privacy_units.DOCUMENT_RECORD): "documents"}


def count_records(path: str | os.PathLike, fmt: str, unit: str = privacy_units.DOCUMENT_RECORD,
                  max_bad_fraction: float = corpora.DEFAULT_MAX_BAD_FRACTION,
                  duplicate_ids: str = identity.DEFAULT_RULE) -> int:
    """The vocabulary records of a corpus file, as `dp_vocab.iter_examples` would yield them
    (one per ROW_ID / text document; with ``unit="patient"`` one per SUBJECT_ID), without
    keeping their text. Raises the readers' errors (``corpora.CorpusError``, repeated ids)."""
    path = os.fspath(path)
    if fmt == "noteevents":
        notes = identity.unique_notes(path, None, max_bad_fraction, duplicate_ids)
        if unit == privacy_units.PATIENT_RECORD:
            return len({note.subject_id for note in notes})
        return sum(1 for _ in notes)
    if unit == privacy_units.PATIENT_RECORD:
        raise ValueError(f"unit='patient' needs a noteevents corpus (SUBJECT_IDs), got {fmt!r}")
    return sum(1 for _ in identity.unique_text_documents([path], None, max_bad_fraction,
                                                         duplicate_ids))


@dataclasses.dataclass(frozen=True)
class Assessment:
    """A corpus of ``records`` records against the DP threshold ``threshold`` (tau).

    Attributes:
      needed: records below which the vocabulary is refused (MIN_... x tau, rounded up).
      good: records for a vocabulary of hundreds of words (GOOD_... x tau, rounded up).
      epsilon_needed: the smallest vocabulary epsilon (2 significant digits, rounded up) at
        which ``records`` reach MIN_... x tau; None above MAX_SUGGESTED_EPSILON (or when
        not refused: not searched).
    """

    records: int
    threshold: float
    needed: int
    good: int
    epsilon_needed: float | None

    @property
    def refused(self) -> bool:
        return self.records < self.needed

    @property
    def thin(self) -> bool:
        return self.records < self.good


def threshold(epsilon: float, delta: float, max_words_per_example: int,
              accounting: str = "pld") -> float:
    """tau of the DP histogram at these targets (`vocab_privacy.calibrate_histogram`)."""
    return calibrate_histogram(epsilon, delta, max_words_per_example, accounting).threshold


def epsilon_for(records: int, per_threshold: float, delta: float, max_words_per_example: int,
                accounting: str = "pld", *, start: float = 8.0) -> float | None:
    """The smallest epsilon, rounded up to 2 significant digits, with per_threshold x tau <=
    records; None when even MAX_SUGGESTED_EPSILON does not get there. tau is close to
    proportional to 1/epsilon, so a few proportional steps from `start` find it (each
    calibration takes about a second)."""
    def tau(eps: float) -> float:
        return threshold(eps, delta, max_words_per_example, accounting)

    goal = records / per_threshold
    eps = start
    for _ in range(4):   # eps <- eps * tau(eps) / goal, a little above (tau ~ 1/eps)
        eps = min(MAX_SUGGESTED_EPSILON, eps * tau(eps) / goal * 1.02)
    for _ in range(8):   # then up in steps until it fits
        digits = 1 - math.floor(math.log10(eps))
        eps = math.ceil(eps * 10 ** digits) / 10 ** digits
        if tau(eps) <= goal:
            return eps
        if eps >= MAX_SUGGESTED_EPSILON:
            return None
        eps = min(MAX_SUGGESTED_EPSILON, eps * 1.05)
    return None


def assess(records: int, epsilon: float, delta: float, max_words_per_example: int,
           accounting: str = "pld") -> Assessment:
    """`records` against the threshold of a vocabulary built at (epsilon, delta, K); the
    vocabulary epsilon that would do is searched only when the corpus is refused."""
    tau = threshold(epsilon, delta, max_words_per_example, accounting)
    needed = math.ceil(MIN_RECORDS_PER_THRESHOLD * tau)
    good = math.ceil(GOOD_RECORDS_PER_THRESHOLD * tau)
    eps_needed = None
    if records < needed:
        eps_needed = epsilon_for(records, MIN_RECORDS_PER_THRESHOLD, delta,
                                 max_words_per_example, accounting, start=epsilon)
    return Assessment(records, tau, needed, good, eps_needed)


def explain(a: Assessment, *, what: str, where: str, fields: Mapping[str, tuple]) -> str:
    """The refusal (``a.refused``) or the warning (``a.thin``) in words. ``what``: the records
    ("patients (SUBJECT_IDs)"); ``where``: the file; ``fields``: (flag, value) of "epsilon",
    "delta", "max_words_per_example" and "file", the flags the message names."""
    eps_flag, eps = fields["epsilon"]
    targets = (f"{eps_flag}={eps}, {fields['delta'][0]}={fields['delta'][1]}, "
               f"{fields['max_words_per_example'][0]}={fields['max_words_per_example'][1]}")
    tau = (f"a word survives only if about {a.threshold:.0f} of them use it (the DP "
           f"threshold at {targets})")
    public = (f"a public vocabulary ({fields['file'][0]}=PATH/vocab.txt, e.g. a released "
              "BERT's: nothing of this corpus is spent on it)")
    if a.refused:
        raise_eps = (f"{eps_flag}={a.epsilon_needed:g} or more (its cost enters the run's "
                     "total)" if a.epsilon_needed is not None else
                     f"no {eps_flag} up to {MAX_SUGGESTED_EPSILON:g} does for {a.records}")
        return (f"{eps_flag}={eps}: too few {what} for a useful DP vocabulary: {where} has "
                f"{a.records}; {tau}. Below {a.needed} (2 x the threshold) at most a handful "
                f"of words survive and text splits into characters. Use a corpus of at least "
                f"{a.needed} {what} ({a.good} for a vocabulary of a few hundred words), "
                f"{raise_eps}, or {public}")
    return (f"{where} has {a.records} {what}, {a.records / a.threshold:.1f} x the DP "
            f"vocabulary's threshold; {tau}. Expect a thin vocabulary (tens of words, most "
            f"text split into pieces); {a.good} {what}, a larger {eps_flag} or {public} give "
            "a fuller one")

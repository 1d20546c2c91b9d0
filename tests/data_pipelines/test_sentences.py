"""Tests for data_pipelines.sentences (clinical sentence splitting)."""

import random

import pytest

from data_pipelines import corpora
from data_pipelines.sentences import _two_letters_all_upper, split_sentences


@pytest.mark.parametrize("text,expected", [
    # Abbreviations, titles, initials, decimals, placeholders.
    ("The patient was seen by Dr. Smith on ___. He was given Tylenol 650 mg p.o. b.i.d. for "
     "pain. Lesion measures 2.5 cm. No change.",
     ["The patient was seen by Dr. Smith on ___.",
      "He was given Tylenol 650 mg p.o. b.i.d. for pain.",
      "Lesion measures 2.5 cm.", "No change."]),
    ("Seen by J. Doe, e.g. daily. Stable.", ["Seen by J. Doe, e.g. daily.", "Stable."]),
    ("Given aspirin p.o. Then discharged.", ["Given aspirin p.o.", "Then discharged."]),
    ("___ is a ___ y/o M. ___ was admitted.", ["___ is a ___ y/o M.", "___ was admitted."]),
    # Inline numbered list after a header.
    ("IMPRESSION: 1. No pneumonia. 2. Small left effusion. 3. Cardiomegaly.",
     ["IMPRESSION: 1. No pneumonia.", "2. Small left effusion.", "3. Cardiomegaly."]),
    # Header alone on its line is attached to the next sentence; wrapped lines are joined.
    ("FINAL REPORT\nINDICATION: ___ year old woman with multifocal pna now s/p intubation //\n"
     "interval change.\n\nIMPRESSION:\nMinimally improved pulmonary edema.\n\nFINDINGS:\n"
     "The ETT tip ends approximately 2 cm from the carina.\nThe stomach is non-distended.\n",
     ["FINAL REPORT",
      "INDICATION: ___ year old woman with multifocal pna now s/p intubation // interval change.",
      "IMPRESSION: Minimally improved pulmonary edema.",
      "FINDINGS: The ETT tip ends approximately 2 cm from the carina.",
      "The stomach is non-distended."]),
    # Line lists, bullets, short field lines, mixed-case headers.
    ("Medications:\n1. Aspirin 81 mg daily\n2. Lisinopril 10 mg\n- metoprolol 25 mg b.i.d.\n\n"
     "History of Present Illness:\nMr. ___ is a 60 y/o M who presents with\nshortness of "
     "breath.\nVitals: T 98.6 HR 88\nBP 120/80",
     ["Medications: 1. Aspirin 81 mg daily", "2. Lisinopril 10 mg",
      "- metoprolol 25 mg b.i.d.",
      "History of Present Illness: Mr. ___ is a 60 y/o M who presents with shortness of breath.",
      "Vitals: T 98.6 HR 88", "BP 120/80"]),
    # Headers in a row are merged; windows line endings; tabs.
    ("PROCEDURE:\r\n\r\nFINDINGS:\r\nNo pneumothorax.\tNo effusion.",
     ["PROCEDURE: FINDINGS: No pneumothorax.", "No effusion."]),
    ("FINDINGS:\n\nPORTABLE CHEST (2 VIEWS):\nNo pneumothorax. IMPRESSION:",
     ["FINDINGS: PORTABLE CHEST (2 VIEWS): No pneumothorax.", "IMPRESSION:"]),
    ("Patient is a 60 y/o M. He was admitted. Seen by Dr. A. Jones.",
     ["Patient is a 60 y/o M.", "He was admitted.", "Seen by Dr. A. Jones."]),
    ("Hospital course: # CHF: diuresed. # AFib: rate controlled.",
     ["Hospital course: # CHF: diuresed.", "# AFib: rate controlled."]),
    # Only punctuation / placeholders: nothing.
    ("___\n//\n\n", []),
    ("", []),
])
def test_clinical_cases(text, expected):
    assert split_sentences(text) == expected


def _words(text):
    return [w for w in text.split() if any(c.isalnum() for c in w)]


def test_long_sentences_are_cut_at_whitespace():
    text = " ".join(f"w{i}" for i in range(1000))
    out = split_sentences(text, max_chars=100)
    assert all(len(s) <= 100 for s in out)
    assert " ".join(out) == text


@pytest.mark.shared_data
def test_noteevents_sample_splits_sanely(shared_data):
    notes = list(corpora.read_noteevents(shared_data / "clinical" / "NOTEEVENTS_sample.csv.gz"))
    total = 0
    lower_starts = 0
    for note in notes:
        sents = split_sentences(note.text)
        assert sents, note.row_id
        total += len(sents)
        for s in sents:
            assert s == s.strip() and "\n" not in s and "  " not in s
            lower_starts += s[0].islower()
        # No text is lost: every word with a letter or digit is kept, in order.
        assert _words(" ".join(sents)) == _words(note.text), note.row_id
        # A bare header never stands alone when text follows it.
        assert not any(s in ("IMPRESSION:", "FINDINGS:") for s in sents[:-1])
    assert 4 < total / len(notes) < 40
    assert lower_starts / total < 0.02  # wrapped lines are joined, not split mid-sentence


def test_letter_checks_match_the_per_character_rule():
    """_two_letters_all_upper (regexes on ASCII text) == the per-character rule it replaced."""
    rng = random.Random(0)
    alphabet = "aAbZz09 .:-_/#'()\u00e9\u00c9\u4e2d\u00df\u0130"
    samples = ["", "A", "AB", "A1B", "Ab", "ÉCHO", "Échos", "中文 AB", "ß", "FINAL REPORT"]
    samples += ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 12)))
                for _ in range(5000)]
    for text in samples:
        letters = [c for c in text if c.isalpha()]
        want = (len(letters) >= 2, all(c.isupper() for c in letters))
        got = _two_letters_all_upper(text)
        assert got[0] == want[0] and (not want[0] or got[1] == want[1]), repr(text)

"""Synthetic MIMIC-style clinical notes: seeded, varied, with made-up identifiers.

Feeds the embedded demo (a tiny BERT trained with DP on a CPU) and tests, where real notes
cannot be shipped. Nothing here comes from real patients: names, dates, MRNs, doses and
findings are drawn from small hand-written tables.

The notes are structured like MIMIC-III notes so the sentence splitter, the readers and the
pretraining examples see realistic input: section headers ("History of Present Illness:",
"FINDINGS:", "IMPRESSION:"), numbered medication lists with doses / routes / frequencies,
vital signs, lab values, abbreviations ("p.o.", "b.i.d."), line-wrapped prose. Each patient
(SUBJECT_ID) has a small set of conditions that drives the findings, medications and plan of
all of that patient's notes (discharge summaries, radiology, nursing, ECG and echo reports),
so the text has learnable structure: a tiny BERT's masked-LM accuracy rises within a few
hundred steps.

Records are ``corpora.Note`` (ROW_ID, SUBJECT_ID, HADM_ID, CATEGORY, TEXT), the type the
NOTEEVENTS reader yields. ``write_noteevents_csv`` writes the full NOTEEVENTS schema
(``.csv`` or ``.csv.gz``) and ``write_text_corpus`` the BERT text format (one sentence per line,
a blank line between notes).

CLI: ``python -m data_pipelines.synthetic_notes --num_notes=2000 --csv=notes.csv.gz
--text=notes.txt``.
"""

from __future__ import annotations

import csv
import dataclasses
import datetime
import functools
import gzip
import io
import os
import random
import textwrap
from collections.abc import Iterable, Iterator

from data_pipelines import corpora, fast_random, sentences
from data_pipelines import synthetic_tables as T

@dataclasses.dataclass(frozen=True)
class _Patient:
    subject_id: int
    first: str
    last: str
    sex: str  # "M" | "F"
    age: int
    mrn: str
    conditions: tuple[str, ...]
    dob: datetime.date
    allergy: str
    weight: int


@dataclasses.dataclass(frozen=True)
class SyntheticNote:
    """A generated note with the NOTEEVENTS fields the ``Note`` record does not carry."""

    note: corpora.Note
    chartdate: str
    charttime: str
    description: str
    cgid: int


# ------------------------------------------------------------------------------ helpers

def _rng_for(seed: int, *key: object) -> random.Random:
    """An independent Random for (seed, key): note i does not depend on how many are made."""
    return fast_random.Random(f"{seed}:" + ":".join(map(str, key)))


@functools.lru_cache(maxsize=1024)  # a patient's notes are consecutive
def _patient(seed: int, subject_id: int) -> _Patient:
    rng = _rng_for(seed, "patient", subject_id)
    sex = rng.choice("MF")
    first = rng.choice(T.FIRST_NAMES_M if sex == "M" else T.FIRST_NAMES_F)
    conditions = tuple(rng.sample(T.CONDITION_KEYS, rng.randint(1, 3)))
    age = rng.randint(28, 94)
    year = rng.randint(2100, 2190)
    dob = datetime.date(year - age, rng.randint(1, 12), rng.randint(1, 28))
    return _Patient(subject_id=subject_id, first=first, last=rng.choice(T.LAST_NAMES), sex=sex,
                    age=age, mrn=str(rng.randint(1_000_000, 99_999_999)),
                    conditions=conditions, dob=dob, allergy=rng.choice(T.ALLERGIES),
                    weight=rng.randint(48, 130))


def _fmt_date(d: datetime.date, rng: random.Random) -> str:
    return rng.choice((f"{d.year}-{d.month:02d}-{d.day:02d}", f"{d.month}/{d.day}/{d.year}"))


def _fill(template: str, rng: random.Random, p: _Patient) -> str:
    """Fills the {placeholders} the condition tables use."""
    he = "he" if p.sex == "M" else "she"
    return template.format(
        weight=p.weight, weight2=p.weight + rng.randint(2, 7), days=rng.choice((5, 7, 10, 14)),
        a1c=round(rng.uniform(6.1, 12.5), 1), chads=rng.randint(1, 6), rate=rng.choice((80, 90,
        100, 110, 120)), o2=rng.randint(1, 4), cr=round(rng.uniform(1.4, 5.2), 1),
        hct1=round(rng.uniform(32, 40), 1), hct2=round(rng.uniform(21, 28), 1),
        stage=rng.randint(2, 5), n=rng.randint(2, 6), he=he, He=he.capitalize())


def _cond(key: str) -> dict:
    return T.CONDITIONS[key]


def _med_line(rng: random.Random, med: tuple) -> str:
    name, doses, routes, freqs = med
    route = rng.choice(routes)
    forms = ["{name} {dose} {route} {freq}"]
    if route == "PO":
        forms.append("{name} {dose} Tablet Sig: One (1) Tablet {route} {freq}.")
    form = rng.choice(forms)
    return form.format(name=name, dose=rng.choice(doses), route=route.replace("PO", rng.choice(
        ("PO", "p.o.", "by mouth"))), freq=rng.choice(freqs).replace("BID", rng.choice(
            ("BID", "b.i.d.", "twice a day"))))


def _pronoun(p: _Patient) -> tuple[str, str, str]:
    return ("he", "his", "man") if p.sex == "M" else ("she", "her", "woman")


def _vitals(rng: random.Random) -> str:
    return (f"T {rng.uniform(96.8, 101.9):.1f} BP {rng.randint(90, 180)}/{rng.randint(50, 100)} "
            f"HR {rng.randint(52, 128)} RR {rng.randint(12, 28)} O2 sat {rng.randint(86, 100)}% "
            f"on {rng.choice(('RA', '2L NC', '4L NC', 'room air', 'NRB'))}")


def _labs(rng: random.Random, d: datetime.date) -> str:
    chosen = rng.sample(T.LABS, rng.randint(5, len(T.LABS)))
    vals = " ".join(f"{name}-{round(rng.uniform(lo, hi), nd) if nd else rng.randint(lo, hi)}"
                    for name, lo, hi, nd in chosen)
    return (f"{d.year}-{d.month:02d}-{d.day:02d} {rng.randint(1, 12):02d}:{rng.randint(0, 59):02d}"
            f"{rng.choice(('AM', 'PM'))} BLOOD {vals}")


def _doctor(rng: random.Random) -> str:
    return f"Dr. {rng.choice(T.FIRST_NAMES_F + T.FIRST_NAMES_M)} {rng.choice(T.LAST_NAMES)}"


def _wrap(text: str, rng: random.Random) -> str:
    """Wraps prose lines at a MIMIC-like width half the time (exercises the splitter)."""
    if rng.random() < 0.5:
        return text
    width = rng.randint(68, 80)
    return "\n".join(textwrap.fill(line, width) if len(line) > width else line
                     for line in text.split("\n"))


# ------------------------------------------------------------------------------ note types

def _discharge_summary(rng: random.Random, p: _Patient, admit: datetime.date) -> str:
    he, his, man = _pronoun(p)
    main = _cond(p.conditions[0])
    discharge = admit + datetime.timedelta(days=rng.randint(2, 12))
    complaint, complaint2 = rng.sample(main["complaints"], 2)
    histories = ", ".join(_fill(_cond(c)["name"], rng, p) for c in p.conditions)
    parts = [
        f"Admission Date: {_fmt_date(admit, rng)} Discharge Date: {_fmt_date(discharge, rng)}",
        "",
        f"Date of Birth: {_fmt_date(p.dob, rng)} Sex: {p.sex}",
        "",
        f"Service: {rng.choice(T.SERVICES)}",
        "",
        f"Patient: {p.first} {p.last} MRN: {p.mrn}",
        f"Attending: {_doctor(rng)}",
        "",
        f"Allergies:\n{p.allergy}",
        "",
        f"Chief Complaint:\n{complaint.capitalize()}",
        "",
        "History of Present Illness:",
        _wrap(f"Mr. {p.last} is a {p.age} year old {man} with a history of {histories} who "
              f"presents with {rng.randint(1, 10)} days of {complaint}"
              f" and {complaint2}. "
              f"{he.capitalize()} was seen at {rng.choice(T.HOSPITALS)} on "
              f"{_fmt_date(admit - datetime.timedelta(days=rng.randint(0, 3)), rng)} and "
              f"transferred for further management. In the ED, initial vitals were "
              f"{_vitals(rng)}. {he.capitalize()} received "
              f"{rng.choice(main['meds'])[0].lower()} and was admitted to the floor."
              .replace("Mr. ", "Mr. " if p.sex == "M" else "Ms. "), rng),
        "",
        "Past Medical History:",
    ]
    parts += [f"{i + 1}. {_fill(_cond(c)['name'], rng, p).capitalize()}"
              for i, c in enumerate(p.conditions)]
    parts += ["", "Physical Exam:", f"Vitals: {_vitals(rng)}"]
    abnormal = {}
    for c in p.conditions:
        for section, text in _cond(c)["exam"]:
            if rng.random() < 0.6:
                abnormal[section] = text
    for section, options in T.NORMAL_EXAM.items():
        parts.append(f"{section}: {abnormal.get(section, rng.choice(options))}")
    parts += ["", "Pertinent Results:", _labs(rng, admit), _labs(rng, discharge), "",
              "Brief Hospital Course:"]
    for c in p.conditions:
        cond = _cond(c)
        sents = [_fill(s, rng, p) for s in rng.sample(cond["course"], rng.randint(1, len(
            cond["course"])))]
        parts.append(_wrap(f"# {_fill(cond['name'], rng, p).capitalize()}: " + " ".join(sents),
                           rng))
    parts += ["", "Discharge Medications:"]
    meds = [m for c in p.conditions for m in _cond(c)["meds"]]
    for i, med in enumerate(rng.sample(meds, min(len(meds), rng.randint(2, 6)))):
        parts.append(f"{i + 1}. {_med_line(rng, med)}")
    parts += ["", "Discharge Disposition:", rng.choice(("Home", "Home With Service",
                                                         "Extended Care Facility")),
              "", "Discharge Diagnosis:", f"Primary: {_fill(main['name'], rng, p)}"]
    if len(p.conditions) > 1:
        parts.append("Secondary: " + ", ".join(_fill(_cond(c)["name"], rng, p)
                                               for c in p.conditions[1:]))
    parts += ["", "Discharge Condition:", rng.choice((
        "Mental Status: Clear and coherent. Level of Consciousness: Alert and interactive.",
        "Stable, ambulating with assistance.", "Good, tolerating a regular diet.")), "",
        "Discharge Instructions:",
        _wrap(f"You were admitted to the hospital with {complaint} due to "
              f"{_fill(main['name'], rng, p)}. Please take your medications as prescribed and "
              f"keep your follow up appointments. Call your doctor or return to the emergency "
              f"department if you develop {rng.choice(main['complaints'])}, fevers or chest "
              f"pain.", rng),
        "", "Followup Instructions:",
        f"Please follow up with {_doctor(rng)} on "
        f"{_fmt_date(discharge + datetime.timedelta(days=rng.randint(5, 30)), rng)} at "
        f"{rng.randint(8, 16)}:{rng.choice(('00', '15', '30', '45'))}."]
    return "\n".join(parts)


def _radiology(rng: random.Random, p: _Patient, day: datetime.date) -> tuple[str, str]:
    he, his, man = _pronoun(p)
    exam = rng.choice(T.RADIOLOGY_EXAMS)
    main = _cond(rng.choice(p.conditions))
    question = rng.choice(("eval for interval change", "eval for pneumonia",
                           "eval for effusion", "assess line placement", "r/o acute process"))
    findings = rng.sample(main["cxr"], rng.randint(1, len(main["cxr"])))
    if rng.random() < 0.4:
        findings.append(_fill(rng.choice(T.LINES), rng, p))
    findings.append(rng.choice(("No pneumothorax.", "There is no pneumothorax.",
                                "The osseous structures are unremarkable.")))
    rng.shuffle(findings)
    impression = findings[:rng.randint(1, min(2, len(findings)))]
    prior = day - datetime.timedelta(days=rng.randint(1, 400))
    if rng.random() < 0.5:
        impression = [f"{i + 1}. {s}" for i, s in enumerate(impression)]
    text = "\n".join([
        "FINAL REPORT",
        f"EXAMINATION: {exam}",
        "",
        _wrap(f"INDICATION: {p.age} year old {man} with {_fill(main['name'], rng, p)} // "
              f"{question}", rng),
        "",
        f"COMPARISON: {rng.choice(('None.', _fmt_date(prior, rng)))}",
        "",
        "FINDINGS:",
        "",
        _wrap(" ".join(findings), rng),
        "",
        "IMPRESSION:",
        "",
        "\n".join(impression),
    ])
    return text, exam


def _nursing(rng: random.Random, p: _Patient, day: datetime.date) -> str:
    he, his, man = _pronoun(p)
    lungs = [t for c in p.conditions for sec, t in _cond(c)["exam"] if sec == "Lungs"]
    lungs = lungs or ["LS clear bilat.", "LS clear, diminished at bases.", "Coarse BS."]
    lines = [
        f"Nursing Progress Note {rng.randint(7, 19):02d}00-{rng.randint(19, 23):02d}00",
        f"Neuro: A&Ox{rng.choice((1, 2, 3))}, follows commands, MAE. "
        f"{rng.choice(('Denies pain.', 'C/o pain 4/10, medicated with tylenol with relief.'))}",
        f"CV: HR {rng.randint(60, 120)}s {rng.choice(('NSR', 'SR', 'AFib'))}, BP "
        f"{rng.randint(95, 160)}/{rng.randint(50, 90)}.",
        f"Resp: {rng.choice(lungs)} "
        f"O2 sat {rng.randint(90, 100)}% on {rng.choice(('RA', '2L NC', '40% FM'))}.",
        f"GI/GU: Abd soft, +BS. Foley draining {rng.choice(('clear yellow', 'amber'))} urine, "
        f"{rng.randint(30, 120)} cc/hr.",
        f"ID: Tmax {rng.uniform(97.5, 101.5):.1f}. {rng.choice(('On ceftriaxone.', 'No abx.'))}",
        f"Social: {rng.choice(('Wife', 'Husband', 'Daughter', 'Son'))} in to visit, updated on "
        f"plan of care.",
        "Plan: Continue to monitor. " + rng.choice(("Diurese as ordered.", "Wean O2 as "
                                                     "tolerated.", "Follow up AM labs.",
                                                     "PT consult.")),
    ]
    return "\n".join(lines)


def _ecg(rng: random.Random, p: _Patient, day: datetime.date) -> str:
    rhythm = "Atrial fibrillation" if "afib" in p.conditions else rng.choice(T.RHYTHMS)
    found = rng.sample(T.ECG_FINDINGS, rng.randint(1, 3))
    comparison = rng.choice((f"Compared to the previous tracing of "
                             f"{_fmt_date(day - datetime.timedelta(days=rng.randint(1, 900)), rng)}"
                             f" there is no significant change.",
                             "No previous tracing available for comparison."))
    return f"{rhythm}. Rate {rng.randint(48, 140)}. " + " ".join(found) + " " + comparison


_AORTIC = ("There is no aortic valve stenosis.", "Mild (1+) aortic regurgitation is seen.")
_MITRAL = ("Trivial mitral regurgitation is seen.", "Moderate (2+) mitral regurgitation is seen.")


def _echo(rng: random.Random, p: _Patient, day: datetime.date) -> str:
    ef = rng.randint(20, 35) if "chf" in p.conditions else rng.randint(50, 70)
    size = rng.choice(("normal in size", "mildly dilated", "moderately dilated"))
    return "\n".join([
        "PATIENT/TEST INFORMATION:",
        "Indication: " + rng.choice(("Congestive heart failure.", "Murmur.",
                                     "Shortness of breath.", "Atrial fibrillation.")),
        f"Height: (in) {rng.randint(58, 76)} Weight (lb): {int(p.weight * 2.2)} BP (mm Hg): "
        f"{rng.randint(95, 160)}/{rng.randint(50, 90)} HR (bpm): {rng.randint(55, 110)}",
        "",
        "Conclusions:",
        _wrap(f"The left atrium is {size}. Left ventricular wall thickness, cavity size and "
              f"regional wall motion are normal. The left ventricular ejection fraction is "
              f"{ef}%. {rng.choice(_AORTIC)} {rng.choice(_MITRAL)} "
              f"There is {rng.choice(('no', 'a small'))} pericardial effusion.", rng),
        "",
        f"IMPRESSION: {'Depressed' if ef < 45 else 'Preserved'} left ventricular systolic "
        f"function.",
    ])


_CATEGORY_WEIGHTS = (("Discharge summary", 0.25), ("Radiology", 0.35), ("Nursing", 0.2),
                     ("ECG", 0.1), ("Echo", 0.1))


# ------------------------------------------------------------------------------ public API

def concept_tables() -> dict[str, dict[str, tuple[str, ...]]]:
    """Medical concepts per condition key, as i2b2-2010's three types.

    Returns {condition: {"problem": ..., "test": ..., "treatment": ...}}: problems are the
    condition's name (placeholders filled with typical values), complaints and findings; tests
    its tests; treatments its drug names and non-drug treatments. Plus the key "_labs" with the
    lab names of the notes' lab lines (tests). Deterministic (no randomness).
    """
    out: dict[str, dict[str, tuple[str, ...]]] = {}
    for key, cond in T.CONDITIONS.items():
        extra = T.CONCEPT_EXTRAS[key]
        name = cond["name"].replace("{stage}", "3")
        out[key] = {
            "problem": (name, *cond["complaints"], *extra["findings"]),
            "test": tuple(extra["tests"]),
            "treatment": (*(m[0] for m in cond["meds"]), *extra["procedures"]),
        }
    out["_labs"] = {"problem": (), "test": tuple(lab[0] for lab in T.LABS), "treatment": ()}
    return out


def condition_keys() -> tuple[str, ...]:
    return T.CONDITION_KEYS


def patient(seed: int, subject_id: int):
    """The made-up patient (name, sex, age, conditions, ...) behind `subject_id` for `seed`."""
    return _patient(seed, subject_id)


def rng_for(seed: int, *key: object) -> random.Random:
    """An independent `random.Random` for (seed, key)."""
    return _rng_for(seed, *key)


def _poisson(rng: random.Random, lam: float) -> int:
    """A Poisson(lam) draw (Knuth's method; lam is small here)."""
    limit, k, prod = pow(2.718281828459045, -lam), 0, rng.random()
    while prod > limit:
        k += 1
        prod *= rng.random()
    return k


def generate_synthetic(num_notes: int, *, seed: int = 0, notes_per_subject: float = 3.0,
                       first_row_id: int = 1, first_subject_id: int = 10_000,
                       ) -> Iterator[SyntheticNote]:
    """Generates ``num_notes`` notes with every NOTEEVENTS field.

    Note ``i`` does not depend on ``num_notes``: the first k notes of a longer run are the same
    notes.

    Args:
      num_notes: how many notes (>= 0).
      seed: the seed.
      notes_per_subject: average notes per patient (SUBJECT_ID); >= 1. A patient's notes are
        consecutive in the stream.

    Yields:
      ``SyntheticNote``s, ROW_ID ascending from ``first_row_id``.
    """
    if num_notes < 0:
        raise ValueError(f"num_notes must be >= 0, got {num_notes}")
    if notes_per_subject < 1:
        raise ValueError(f"notes_per_subject must be >= 1, got {notes_per_subject}")
    categories = [c for c, _ in _CATEGORY_WEIGHTS]
    weights = [w for _, w in _CATEGORY_WEIGHTS]
    subject, left = -1, 0
    for i in range(num_notes):
        if left == 0:
            # Patients come one after another, each with 1 + Poisson(notes_per_subject - 1)
            # notes, so the stream's prefixes do not depend on num_notes.
            subject += 1
            left = 1 + _poisson(_rng_for(seed, "count", subject), notes_per_subject - 1.0)
        left -= 1
        rng = _rng_for(seed, "note", i)
        subject_id = first_subject_id + subject
        p = _patient(seed, subject_id)
        category = rng.choices(categories, weights)[0]
        admission = _rng_for(seed, "admission", subject_id, rng.randrange(2))
        admit = datetime.date(p.dob.year + p.age, admission.randint(1, 12),
                              admission.randint(1, 28))
        hadm_id = 100_000 + (subject_id * 7 + admission.randrange(1000)) % 900_000
        day = admit + datetime.timedelta(days=rng.randint(0, 5))
        description = "Report"
        if category == "Discharge summary":
            text = _discharge_summary(rng, p, admit)
        elif category == "Radiology":
            text, description = _radiology(rng, p, day)
        elif category == "Nursing":
            text = _nursing(rng, p, day)
            description = "Nursing Progress Note"
        elif category == "ECG":
            text = _ecg(rng, p, day)
        else:
            text = _echo(rng, p, day)
        note = corpora.Note(row_id=first_row_id + i, subject_id=subject_id,
                            hadm_id=None if category == "ECG" and rng.random() < 0.3 else hadm_id,
                            category=category, text=text)
        yield SyntheticNote(note=note, chartdate=f"{day.year}-{day.month:02d}-{day.day:02d}",
                            charttime=f"{day.year}-{day.month:02d}-{day.day:02d} "
                                      f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}:00",
                            description=description, cgid=rng.randint(14000, 21000))


def generate_notes(num_notes: int, *, seed: int = 0, **kwargs) -> Iterator[corpora.Note]:
    """``corpora.Note`` records (what ``corpora.read_noteevents`` yields); see
    ``generate_synthetic`` for the arguments."""
    for s in generate_synthetic(num_notes, seed=seed, **kwargs):
        yield s.note


def _open_write(path: str | os.PathLike) -> io.TextIOBase:
    path = os.fspath(path)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    if path.endswith(".gz"):
        return io.TextIOWrapper(gzip.open(path, "wb"), encoding="utf-8", newline="")
    return open(path, "w", encoding="utf-8", newline="")


def write_noteevents_csv(path: str | os.PathLike,
                         notes: Iterable[corpora.Note | SyntheticNote]) -> int:
    """Writes notes in the MIMIC-III NOTEEVENTS schema (``.gz`` by suffix); returns the count.

    ``SyntheticNote``s fill CHARTDATE/CHARTTIME/DESCRIPTION/CGID; plain ``Note``s leave them
    empty. TEXT is quoted with its line breaks, as in the real file.
    """
    n = 0
    with _open_write(path) as f:
        writer = csv.writer(f, quoting=csv.QUOTE_MINIMAL, lineterminator="\n")
        writer.writerow(corpora.NOTEEVENTS_COLUMNS)
        for item in notes:
            extra = item if isinstance(item, SyntheticNote) else None
            note = item.note if extra else item
            writer.writerow([
                note.row_id, note.subject_id, "" if note.hadm_id is None else note.hadm_id,
                extra.chartdate if extra else "", extra.charttime if extra else "", "",
                note.category, extra.description if extra else "",
                extra.cgid if extra else "", "", note.text])
            n += 1
    return n


def write_text_corpus(path: str | os.PathLike,
                      notes: Iterable[corpora.Note | SyntheticNote]) -> int:
    """Writes notes as a BERT text corpus: one sentence per line (``sentences.split_sentences``),
    a blank line between notes (``.gz`` by suffix); returns the number of documents."""
    n = 0
    with _open_write(path) as f:
        for item in notes:
            note = item.note if isinstance(item, SyntheticNote) else item
            sents = sentences.split_sentences(note.text)
            if not sents:
                continue
            if n:
                f.write("\n")
            f.write("\n".join(sents) + "\n")
            n += 1
    return n


def main(argv: list[str] | None = None) -> None:
    """CLI: writes a synthetic NOTEEVENTS CSV and/or text corpus."""
    import argparse  # noqa: PLC0415 - CLI only

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--num_notes", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--csv", default="", help="NOTEEVENTS-schema output (.csv or .csv.gz)")
    parser.add_argument("--text", default="", help="text-corpus output (.txt or .txt.gz)")
    args = parser.parse_args(argv)
    if not args.csv and not args.text:
        parser.error("give --csv and/or --text")
    if args.csv:
        n = write_noteevents_csv(args.csv, generate_synthetic(args.num_notes, seed=args.seed))
        print(f"wrote {n} notes to {args.csv}")
    if args.text:
        n = write_text_corpus(args.text, generate_synthetic(args.num_notes, seed=args.seed))
        print(f"wrote {n} documents to {args.text}")


if __name__ == "__main__":
    main()

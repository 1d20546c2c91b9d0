"""The i2b2-2010-shaped synthetic NER set: discharge summaries with problem / test / treatment
BIO tags (`data_pipelines.ner` documents), and a CLI that writes it as a CoNLL file.

i2b2-2010 concept extraction (Uzuner et al. 2011) has 170 labelled discharge summaries with
problem / test / treatment concepts (7,073 / 4,608 / 4,844), but it is behind a data-use
agreement. `generate_i2b2_like` writes notes of the same shape from `synthetic_notes`' own
tables (conditions with their complaints, findings, tests, drugs and other treatments; lab
names): history, past medical history, hospital course, labs, discharge medications, diagnoses
and instructions, sentences pre-split into words (punctuation apart), BIO over the 3 types
(`ner.I2B2_TAGS`, 7 tags). Each note's concepts mostly come from its patient's conditions, so
context matters (the same word can be O, a test or a treatment). Deterministic in the seed;
note i does not depend on how many notes are made.

    python -m data_pipelines.synthetic_ner --num_notes=170 --seed=0 --out=i2b2_like.conll
"""

from __future__ import annotations

import random

from data_pipelines import synthetic_notes, synthetic_tables
from data_pipelines.ner import Document, Sentence, entity_counts, write_conll


def _split_words(text: str) -> list[str]:
    return text.split()


class _NoteBuilder:
    """Builds one note's sentences from word/slot templates.

    Slots: {P} problem, {T} test, {R} treatment, {DRUG} a drug line (the drug is a treatment;
    dose, route and frequency are O), {PMH} a problem of the patient's own conditions; plain
    fillers: {He} {he} {his} {man} {age} {n} {Last} {value}.
    """

    def __init__(self, rng: random.Random, patient, tables: dict):
        self.rng, self.p, self.tables = rng, patient, tables
        self.conditions = [c for c in patient.conditions]
        self.all_conditions = list(synthetic_notes.condition_keys())

    def _condition(self) -> str:
        if self.rng.random() < 0.8:
            return self.rng.choice(self.conditions)
        return self.rng.choice(self.all_conditions)

    def concept(self, kind: str) -> str:
        if kind == "test" and self.rng.random() < 0.25:
            return self.rng.choice(self.tables["_labs"]["test"])
        return self.rng.choice(self.tables[self._condition()][kind])

    def _drug(self) -> tuple[str, list[str]]:
        meds = synthetic_tables.CONDITIONS[self._condition()]["meds"]
        name, doses, routes, freqs = self.rng.choice(meds)
        tail = f"{self.rng.choice(doses)} {self.rng.choice(routes)} {self.rng.choice(freqs)}"
        return name, _split_words(tail)

    def fill(self, template: str) -> Sentence:
        rng, p = self.rng, self.p
        he = "he" if p.sex == "M" else "she"
        plain = {"{He}": he.capitalize(), "{he}": he, "{his}": "his" if p.sex == "M" else "her",
                 "{man}": "man" if p.sex == "M" else "woman", "{age}": str(p.age),
                 "{n}": str(rng.randint(2, 10)), "{Last}": p.last,
                 "{value}": str(round(rng.uniform(0.5, 140.0), rng.choice((0, 1))))}
        kinds = {"{P}": "problem", "{T}": "test", "{R}": "treatment"}
        words: list[str] = []
        tags: list[str] = []

        def entity(phrase: str, kind: str):
            pieces = _split_words(phrase)
            words.extend(pieces)
            tags.extend([f"B-{kind}"] + [f"I-{kind}"] * (len(pieces) - 1))

        for token in template.split():
            if token in kinds:
                entity(self.concept(kinds[token]), kinds[token])
            elif token == "{PMH}":
                cond = rng.choice(self.conditions)
                entity(self.tables[cond]["problem"][0], "problem")
            elif token == "{DRUG}":
                name, tail = self._drug()
                entity(name, "treatment")
                words.extend(tail)
                tags.extend(["O"] * len(tail))
            else:
                for w in _split_words(plain.get(token, token)):
                    words.append(w)
                    tags.append("O")
        return Sentence(tuple(words), tuple(tags))


_HISTORY = (
    ("Mr. {Last} is a {age} year old {man} with a history of {PMH} who presents with {P} .", 3),
    ("{He} reports {P} and {P} for {n} days .", 3),
    ("{He} denies {P} , {P} or {P} .", 2),
    ("In the ED , {T} was {value} and {T} showed {P} .", 2),
    ("{He} was given {R} in the ED with some relief of {his} {P} .", 2),
    ("{He} was recently treated with {R} for {P} .", 1),
)
_COURSE = (
    ("# {P} : {He} was started on {DRUG} .", 4),
    ("{T} showed {P} .", 4),
    ("{T} was negative for {P} .", 2),
    ("{P} was treated with {R} and {R} .", 3),
    ("{He} underwent {T} which revealed {P} .", 3),
    ("{R} was held in the setting of {P} .", 2),
    ("{He} was given {R} for {P} with improvement .", 3),
    ("Repeat {T} was unremarkable .", 2),
    ("{T} and {T} were within normal limits .", 2),
    ("{His} {P} resolved with {R} .", 1),
    ("The patient remained hemodynamically stable on the floor .", 1),
    ("{He} was seen by the consult team who recommended {R} .", 2),
    ("{T} was checked daily and remained stable .", 2),
)
_DISCHARGE = (
    ("Return to the emergency department if you develop {P} or {P} .", 2),
    ("Please follow up with Dr. {Last} in {n} weeks .", 2),
    ("Please continue {R} and have your {T} checked in {n} days .", 2),
)


def _weighted(rng: random.Random, table) -> str:
    return rng.choices([t for t, _ in table], [w for _, w in table])[0]


def _note_sentences(seed: int, index: int, tables: dict) -> list[Sentence]:
    rng = synthetic_notes.rng_for(seed, "i2b2", index)
    p = synthetic_notes.patient(seed, 50_000 + index)
    b = _NoteBuilder(rng, p, tables)
    his = "His" if p.sex == "M" else "Her"
    out = [b.fill("Admission Date : {n} / {n} / 2150"),
           b.fill("Service : " + rng.choice(synthetic_tables.SERVICES)),
           b.fill("History of Present Illness :")]
    out += [b.fill(_weighted(rng, _HISTORY)) for _ in range(rng.randint(5, 9))]
    out.append(b.fill("Past Medical History :"))
    out += [b.fill(f"{i + 1} . {{PMH}}") for i in range(len(b.conditions))]
    out.append(b.fill("Brief Hospital Course :"))
    for _ in range(rng.randint(20, 32)):
        out.append(b.fill(_weighted(rng, _COURSE).replace("{His}", his)))
    out.append(b.fill("Pertinent Results :"))
    for _ in range(rng.randint(2, 3)):
        out.append(b.fill(" , ".join("{T} {value}" for _ in range(rng.randint(3, 5)))
                          + " ."))
    out.append(b.fill("Discharge Medications :"))
    out += [b.fill(f"{i + 1} . {{DRUG}}") for i in range(rng.randint(5, 10))]
    out.append(b.fill("Discharge Diagnosis : {PMH} , {P}"))
    out.append(b.fill("Discharge Instructions :"))
    out += [b.fill(_weighted(rng, _DISCHARGE)) for _ in range(rng.randint(2, 4))]
    return [s for s in out if s.words]


def generate_i2b2_like(num_notes: int = 170, *, seed: int = 0) -> list[Document]:
    """`num_notes` synthetic discharge summaries with problem / test / treatment BIO tags."""
    if num_notes < 0:
        raise ValueError(f"num_notes must be >= 0, got {num_notes}")
    tables = synthetic_notes.concept_tables()
    return [Document(f"note-{i:04d}", tuple(_note_sentences(seed, i, tables)))
            for i in range(num_notes)]


def main(argv: list[str] | None = None) -> None:
    """CLI: writes the synthetic i2b2-shaped set as a CoNLL file."""
    import argparse  # noqa: PLC0415 - CLI only

    parser = argparse.ArgumentParser(description="Write the synthetic i2b2-2010-shaped NER set")
    parser.add_argument("--num_notes", type=int, default=170)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="output .conll file")
    args = parser.parse_args(argv)
    docs = generate_i2b2_like(args.num_notes, seed=args.seed)
    write_conll(args.out, docs)
    counts = entity_counts(docs)
    print(f"wrote {len(docs)} notes, {sum(d.num_words for d in docs)} words, entities "
          f"{counts} to {args.out}")


if __name__ == "__main__":
    main()

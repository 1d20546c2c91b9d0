"""Neighbouring corpora (DESIGN.md, "Privacy sharp edges"): removing ONE unit from the corpus
leaves every other unit's training and held-out examples bitwise unchanged: their text (A, B,
'random next'), their identity fields, their masks at any step, and their held-out membership.

DP-SGD bounds what one unit changes in the clipped gradient sum; that bound holds for the
CORPUS only if the data pipeline derives a unit's examples from the unit alone. Units: one
sequence ("example": the instance set is the data set, so removing one row must change no other
row's masks), one note, one patient (a document where the corpus has no SUBJECT_IDs)."""

import dataclasses

import numpy as np
import pytest

from configs import common
from data_pipelines import (datasets, documents, identity, instances, masking, pretraining,
                            sentences, synthetic_notes, tokenization, tokenized_corpus)
from tests.data_pipelines.test_pretraining import IS_CONT, SPECIAL, VOCAB, make_corpus

STEPS = (0, 1, 7, 1000)


def unit_identity(inst: instances.Instances, unit: str) -> np.ndarray:
    """int64 [N]: each example's unit identity (document key, or SUBJECT_ID for patients)."""
    key = np.asarray(inst.doc_key)
    if unit == "patient":
        subject = np.asarray(inst.subject_id)
        return np.where(subject != documents.NO_SUBJECT, subject, key)
    return key


def examples_by_unit(ds: datasets.PretrainingDataset, unit: str) -> dict[int, list[tuple]]:
    """identity -> its examples in data set order: (A, B, is_random_next, doc keys, subject ids,
    example key, the masked features at every step of STEPS), all as comparable values."""
    inst = ds.instances
    ident = unit_identity(inst, unit)
    every = np.arange(ds.num_examples)
    batches = [ds.get_batch(every, step=s) for s in STEPS]
    out: dict[int, list[tuple]] = {}
    for i in every.tolist():
        a, b = inst.segments(i)
        record = (a.tobytes(), b.tobytes(), bool(inst.is_random_next[i]), int(inst.doc_key[i]),
                  int(inst.b_doc_key[i]), int(inst.subject_id[i]), int(inst.b_subject_id[i]),
                  int(inst.example_key[i]),
                  tuple(batch[k][i].tobytes() for batch in batches
                        for k in datasets.FEATURE_KEYS))
        out.setdefault(int(ident[i]), []).append(record)
    return out


def assert_other_units_unchanged(full: dict, minus: dict, removed: int) -> None:
    assert removed in full, "the removed unit must have had examples"
    assert set(minus) == set(full) - {removed}
    assert len(minus) >= 5
    for u in minus:
        assert minus[u] == full[u], f"unit {u}: its examples or masks changed"


def dataset(inst: instances.Instances, seed: int = 3) -> datasets.PretrainingDataset:
    return datasets.PretrainingDataset(inst, masking.MaskingParams(64, 10, 0.15, True),
                                       special=SPECIAL, vocab_size=VOCAB,
                                       is_continuation=IS_CONT, seed=seed)


# ------------------------------------------------------------------------------ example unit

def test_example_unit_masks_do_not_depend_on_other_examples():
    """Unit = one sequence: the data set minus row j masks every other row as before."""
    inst = instances.create_instances(make_corpus(60, (1, 12), (3, 30), seed=5),
                                      instances.InstanceParams(64, 0.1, 2, 9), progress=False)
    keys = np.asarray(inst.example_key)
    assert (keys >= 0).all() and len(np.unique(keys)) == len(inst)
    full = dataset(inst)
    n = full.num_examples
    batches = [full.get_batch(np.arange(n), step=s) for s in STEPS]
    for j in (0, n // 2, n - 1):
        rest = np.delete(np.arange(n), j)
        minus = dataset(inst.select(rest))
        assert minus.num_examples == n - 1
        for step, want in zip(STEPS, batches):
            got = minus.get_batch(np.arange(n - 1), step=step)
            for k in datasets.FEATURE_KEYS:
                np.testing.assert_array_equal(got[k], want[k][rest], err_msg=f"{k} at {step}")


def test_select_keeps_every_field():
    inst = instances.create_instances(make_corpus(20, (2, 6), (3, 20)),
                                      instances.InstanceParams(32), progress=False)
    rows = np.array([3, 0, 3, len(inst) - 1])
    sub = inst.select(rows)
    for r, i in enumerate(rows.tolist()):
        for x, y in zip(sub.segments(r), inst.segments(i)):
            np.testing.assert_array_equal(x, y)
    for name in instances.Instances._PER_EXAMPLE:
        np.testing.assert_array_equal(getattr(sub, name), np.asarray(getattr(inst, name))[rows])


# --------------------------------------------------------------------- note / patient units

@pytest.mark.parametrize("unit,subject,removed_doc", [
    ("note", True, 20), ("note", True, 0), ("patient", True, 19), ("patient", True, 39),
    ("patient", False, 7)])
def test_instances_of_other_units_do_not_change(unit, subject, removed_doc):
    """Instance creation alone: the corpus minus one unit (all its documents) gives every other
    unit the same examples, in the same order, with the same keys and masks."""
    corpus = make_corpus(40, (1, 10), (3, 25), seed=3, subject=subject)  # 3 notes per patient
    params = instances.InstanceParams(max_seq_length=64, short_seq_prob=0.3, dupe_factor=2,
                                      seed=7, privacy_unit=unit)
    if unit == "patient" and subject:
        removed = int(corpus.subject_ids[removed_doc])
        keep = np.flatnonzero(corpus.subject_ids != removed)
    else:
        removed = int(corpus.doc_keys[removed_doc])
        keep = np.flatnonzero(corpus.doc_keys != removed)
    assert len(keep) < corpus.num_documents
    full = instances.create_instances(corpus, params, progress=False)
    minus = instances.create_instances(corpus.select(keep), params, progress=False)
    assert_other_units_unchanged(examples_by_unit(dataset(full), unit),
                                 examples_by_unit(dataset(minus), unit), removed)


def notes(num_notes: int = 150) -> list:
    return list(synthetic_notes.generate_synthetic(num_notes, seed=4, notes_per_subject=3.0))


def build(path, vocab, unit: str, corpus: str = "noteevents", **overrides):
    c = common.data_config()
    c.update(corpus=corpus, paths=(str(path),), max_seq_length=64, max_predictions_per_seq=10,
             short_seq_prob=0.2, dupe_factor=2, eval_fraction=0.25, cache_dir="",
             eval_split_unit="subject" if unit == "patient" and corpus != "text"
             else "document")
    c.update(overrides)
    return pretraining.build_datasets(c, vocab, unit)


def assert_neighbours(full, minus, unit: str, removed: int) -> None:
    """Training and held-out examples of every other unit unchanged; nobody changed sides."""
    (train, ev), (train2, ev2) = full, minus
    tr, te = examples_by_unit(train, unit), examples_by_unit(ev, unit)
    tr2, te2 = examples_by_unit(train2, unit), examples_by_unit(ev2, unit)
    assert not set(tr) & set(te)  # a unit is held out whole
    side = tr if removed in tr else te
    assert_other_units_unchanged(side, tr2 if side is tr else te2, removed)
    other, other2 = (te, te2) if side is tr else (tr, tr2)
    assert other2 == other  # the side the unit was not on: entirely the same
    if unit != "example":
        # The unit numbering of the trainer's sampler follows the identities.
        assert train2.unit_ids.max() + 1 == len(tr2)


@pytest.mark.parametrize("unit", ["note", "patient"])
@pytest.mark.parametrize("side", ["train", "eval"])
def test_noteevents_minus_one_unit_end_to_end(tmp_path, notes_vocab, unit, side):
    """build_datasets on a NOTEEVENTS file and on the file without one note / one patient
    (all of their rows): held-out split, training and eval examples of everybody else are
    bitwise the same."""
    rows = notes()
    path = tmp_path / "NOTEEVENTS.csv"
    synthetic_notes.write_noteevents_csv(path, rows)
    full = build(path, notes_vocab, unit)
    # The unit with the most examples on the chosen side.
    by = examples_by_unit(full[0] if side == "train" else full[1], unit)
    removed = max(by, key=lambda u: (len(by[u]), u))
    kept = [r for r in rows
            if (r.note.subject_id if unit == "patient" else r.note.row_id) != removed]
    assert len(kept) < len(rows) and (unit == "note" or len(rows) - len(kept) >= 2)
    path2 = tmp_path / "NOTEEVENTS_minus.csv"
    synthetic_notes.write_noteevents_csv(path2, kept)
    assert_neighbours(full, build(path2, notes_vocab, unit), unit, removed)


def random_text_documents(vocab, num_docs: int, seed: int = 0) -> list[list[str]]:
    """Documents of random whole words of the vocab (2..12 sentences of 2..14 words): any two
    words in a row tell the document they come from."""
    words = [w for w in vocab.read_text().split("\n") if w.isalpha() and len(w) >= 3]
    rng = np.random.default_rng(seed)
    return [[" ".join(rng.choice(words, int(rng.integers(2, 15)))) + " ."
             for _ in range(int(rng.integers(2, 13)))] for _ in range(num_docs)]


def write_text(path, docs: list[list[str]]) -> None:
    path.write_text("\n\n".join("\n".join(d) for d in docs) + "\n", encoding="utf-8")


def held_out_rows(pair, docs: list[list[str]], vocab) -> tuple[set[int], set[int]]:
    """(rows in training, rows held out): which documents of the file (by their position in
    ``docs``) each side's examples come from, found from the examples' token content (so the
    answer does not rely on the document keys under test)."""
    tok = tokenization.WordPieceTokenizer(str(vocab), do_lower_case=True)
    text = [" " + " ".join(map(str, np.concatenate(tok.encode_batch(d)).tolist())) + " "
            for d in docs]
    sides = []
    for ds in pair:
        inst, candidates = ds.instances, {}
        for i in range(ds.num_examples):  # a key's document holds the A of all its examples
            a = " " + " ".join(map(str, inst.segments(i)[0].tolist())) + " "
            hits = {r for r, d in enumerate(text) if a in d}
            k = int(inst.doc_key[i])
            candidates[k] = candidates.get(k, hits) & hits
        assert all(len(c) == 1 for c in candidates.values())
        sides.append({r for c in candidates.values() for r in c})
    return sides[0], sides[1]


@pytest.mark.parametrize("unit", ["note", "patient", "example"])
def test_text_corpus_minus_one_document(tmp_path, notes_vocab, unit):
    """A plain-text corpus (documents identified by their content): removing one document
    keeps every other document's held-out membership, and for note / patient (a patient is a
    document here) its training and eval examples."""
    docs = random_text_documents(notes_vocab, 80)
    path, path2 = tmp_path / "corpus.txt", tmp_path / "corpus_minus.txt"
    write_text(path, docs)
    # Remove the first document of the file (with ordinal keys every later key would shift).
    write_text(path2, docs[1:])
    full = build(path, notes_vocab, unit, corpus="text")
    minus = build(path2, notes_vocab, unit, corpus="text")
    # Held-out membership by content: every other document on the same side as before.
    train_rows, eval_rows = held_out_rows(full, docs, notes_vocab)
    train_rows2, eval_rows2 = held_out_rows(minus, docs[1:], notes_vocab)
    # Every document yields examples (with 'random next' B from elsewhere if need be), so
    # these are the two sides of the split.
    assert len(train_rows) + len(eval_rows) == 80 and eval_rows
    assert {r + 1 for r in train_rows2} == train_rows - {0}
    assert {r + 1 for r in eval_rows2} == eval_rows - {0}
    # The same by document key, which is the document's content key.
    keys = [set(np.asarray(ds.instances.doc_key).tolist()) for ds in (*full, *minus)]
    gone = (keys[0] | keys[1]) - (keys[2] | keys[3])
    assert gone == {documents.content_key(docs[0])}
    assert keys[2] == keys[0] - gone and keys[3] == keys[1] - gone
    if unit != "example":
        assert_neighbours(full, minus, unit, gone.pop())


def test_heldout_membership_is_a_function_of_the_identity():
    """The split draws from (seed, key) only; for text corpora the key is the content."""
    a = documents.content_key(["one sentence .", "another ."])
    assert a == documents.content_key(["one sentence .", "another ."]) and 0 <= a < 2**63
    assert a != documents.content_key(["one sentence . another ."])
    assert tokenized_corpus.heldout_draw(5, a) == tokenized_corpus.heldout_draw(5, a)


# ------------------------------------------------------------------------- duplicated ROW_ID

def test_rows_sharing_a_row_id_are_refused_or_merged(tmp_path, notes_vocab):
    """Two NOTEEVENTS rows with the same ROW_ID and different text are not one note: refused
    under either rule (issue 35, data_pipelines/identity.py). An identical copy is refused by
    default; merged (data.duplicate_ids='merge_identical') it is one note, and removing that
    note changes no other note's examples."""
    rows = notes(60)
    dup_of, dup = rows[10].note.row_id, 11  # row 11 (same patient) gets row 10's ROW_ID
    assert rows[dup].note.subject_id == rows[10].note.subject_id
    rows[dup] = dataclasses.replace(rows[dup], note=dataclasses.replace(rows[dup].note,
                                                                      row_id=dup_of))
    path = tmp_path / "NOTEEVENTS.csv"
    synthetic_notes.write_noteevents_csv(path, rows)
    for rule in identity.RULES:
        with pytest.raises(identity.DuplicateRecordsError, match="data rows 11 and 12"):
            build(path, notes_vocab, "note", eval_fraction=0.0, duplicate_ids=rule)
    rows = notes(60)
    dup_of = rows[10].note.row_id
    synthetic_notes.write_noteevents_csv(path, rows[:30] + [rows[10]] + rows[30:])
    with pytest.raises(identity.DuplicateRecordsError, match="all copies are identical"):
        build(path, notes_vocab, "note", eval_fraction=0.0)
    train, ev = build(path, notes_vocab, "note", eval_fraction=0.0,
                      duplicate_ids="merge_identical")
    assert ev is None and train.metadata["units"]["num_units"] == 60
    assert train.metadata["units"]["documents_per_unit_max"] == 1
    path2 = tmp_path / "NOTEEVENTS_minus.csv"
    synthetic_notes.write_noteevents_csv(path2, [r for r in rows if r.note.row_id != dup_of])
    train2, _ = build(path2, notes_vocab, "note", eval_fraction=0.0)
    assert_other_units_unchanged(examples_by_unit(train, "note"),
                                 examples_by_unit(train2, "note"), dup_of)

"""Record identity (issue 35): a duplicated ROW_ID / text document is refused, or merged when
its copies are identical and the user asks, the same in the vocabulary builder and in the
training data; fine-tuning keeps duplicated rows as separate examples and says so.

The issue's repro: a NOTEEVENTS file with every row twice (same ROW_IDs). Every note carries a
unique marker word: no message may contain it (no private text in messages)."""

import dataclasses
import json
import os
import pathlib
import subprocess
import sys

import pytest

from configs import common
from data_pipelines import corpora, dp_vocab, identity, pretraining, synthetic_notes
from dpbert.reporting import report as report_lib

REPO = pathlib.Path(__file__).resolve().parents[2]
MARKER = "zqxjsecretmarker"
VOCAB_ARGS = dict(fmt="noteevents", vocab_size=1000, epsilon=100.0, delta=1e-3,
                  max_words_per_example=64, seed=0, progress=False)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """once.csv (100 notes of ~30 patients), twice.csv (every row twice, as in the issue),
    differ.csv (row 5's ROW_ID again, with other text), and a vocabulary of once.csv."""
    root = tmp_path_factory.mktemp("identity")
    notes = [dataclasses.replace(n, text=f"{n.text}\n{MARKER} {n.row_id}.")
             for n in synthetic_notes.generate_notes(100, seed=3)]
    paths = {}
    for name, rows in (("once", notes), ("twice", notes + notes),
                       ("differ", notes + [dataclasses.replace(notes[4],
                                                               text=notes[4].text + " x")])):
        paths[name] = root / f"{name}.csv"
        synthetic_notes.write_noteevents_csv(paths[name], rows)
    paths["vocab"] = dp_vocab.build_vocab(paths["once"], out_dir=root / "vocab",
                                          **VOCAB_ARGS).vocab_path
    return paths


def _no_text(message: str) -> None:
    assert MARKER not in message.lower() and "\n" not in message


# --------------------------------------------------------------------------- vocabulary


@pytest.mark.parametrize("unit", ["document", "patient"])
def test_vocab_refuses_duplicated_row_ids(corpus, tmp_path, unit):
    with pytest.raises(identity.DuplicateRecordsError) as e:
        dp_vocab.build_vocab(corpus["twice"], out_dir=tmp_path / "v", unit=unit, **VOCAB_ARGS)
    msg = str(e.value)
    assert msg.startswith(f"{corpus['twice']}: 100 ROW_ID(s) occur more than once (100 extra "
                          "record(s) among 200; all copies are identical); the first: data "
                          "rows 1 and 101; 2 and 102; 3 and 103. Refused")
    assert "--duplicate_ids=merge_identical" in msg and "data.duplicate_ids" in msg
    _no_text(msg)
    assert not (tmp_path / "v").exists()


def test_vocab_merge_counts_each_note_once(corpus, tmp_path):
    once = json.loads((corpus["vocab"].parent / "vocab_privacy.json").read_text())
    merged = dp_vocab.build_vocab(corpus["twice"], out_dir=tmp_path / "v",
                                  duplicate_ids="merge_identical", **VOCAB_ARGS)
    report = merged.report
    assert report["num_examples"] == once["num_examples"] == 100
    # The same seed and the same records: the same DP word histogram (WordPiece's tie-breaks
    # are thread-dependent, so vocab.txt itself is not compared).
    assert merged.counts_path.read_text() == (corpus["vocab"].parent /
                                              "word_counts.tsv").read_text()
    assert (report["record_identity"], report["duplicate_ids"]) == ("ROW_ID", "merge_identical")
    assert once["duplicate_ids"] == "refuse"
    assert report["duplicates"] == {
        "duplicated_ids": 100, "copies_dropped": 100,
        "text": "duplicate ROW_IDs merged: 100 identical copies dropped (100 ROW_IDs had copies)"}
    # The count is private: never in what ships.
    assert "duplicates" in report["non_private_fields"]
    assert "duplicates" not in report_lib.public_vocab_report(report)
    # Per patient: the same 30-odd patients as the file without copies.
    patient = dp_vocab.build_vocab(corpus["twice"], out_dir=tmp_path / "p", unit="patient",
                                   duplicate_ids="merge_identical", **VOCAB_ARGS).report
    assert patient["num_examples"] == len({n.subject_id for n in
                                           corpora.read_noteevents(corpus["once"])})


def test_differing_copies_refused_even_with_merge(corpus, tmp_path):
    for rule in identity.RULES:
        with pytest.raises(identity.DuplicateRecordsError) as e:
            list(dp_vocab.iter_examples(corpus["differ"], "noteevents", duplicate_ids=rule))
        _no_text(str(e.value))
        assert "data rows 5 and 101" in str(e.value)
    assert "1 ROW_ID(s) occur more than once with different content" in str(e.value)
    assert "merge_identical' keeps one copy only where the copies are identical" in str(e.value)
    cfg = _data_config(corpus["differ"], "merge_identical")
    with pytest.raises(identity.DuplicateRecordsError, match="different content") as e:
        pretraining.build_datasets(cfg, corpus["vocab"], "note")
    _no_text(str(e.value))


def test_launcher_refuses_then_merges(corpus, tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO))
    args = [sys.executable, str(REPO / "launch" / "build_vocab.py"), f"--input={corpus['twice']}",
            "--format=noteevents", "--vocab_size=1000", "--epsilon=100", "--delta=1e-3",
            "--num_workers=1", "--seed=0"]
    proc = subprocess.run([*args, f"--out={tmp_path / 'a'}"], capture_output=True, text=True,
                          env=env, timeout=300, check=False)
    assert proc.returncode == 2 and not (tmp_path / "a").exists()
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"build_vocab: error: {corpus['twice']}: 100 ROW_ID(s) occur more "
                           "than once")
    assert MARKER not in proc.stderr + proc.stdout
    proc = subprocess.run([*args, f"--out={tmp_path / 'b'}", "--duplicate_ids=merge_identical"],
                          capture_output=True, text=True, env=env, timeout=300, check=False)
    assert proc.returncode == 0, proc.stderr
    assert ("build_vocab: NOTE: duplicate ROW_IDs merged: 100 identical copies dropped"
            in proc.stderr)
    assert json.loads((tmp_path / "b" / "vocab_privacy.json").read_text())["num_examples"] == 100


def test_text_documents_are_their_text(tmp_path):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text(f"one {MARKER} .\ntwo .\n\nthree .\n\none {MARKER} .\ntwo .\n")
    b.write_text("four .\n\nthree .\n")
    with pytest.raises(identity.DuplicateRecordsError) as e:
        list(dp_vocab.iter_examples(a, "text"))
    assert str(e.value).startswith(f"{a}: 1 document(s) occur more than once (1 extra record(s) "
                                   "among 3; all copies are identical); the first: documents "
                                   "1 and 3. Refused: a plain-text document's identity is its "
                                   "text")
    _no_text(str(e.value))
    merged = list(dp_vocab.iter_examples(a, "text", duplicate_ids="merge_identical"))
    assert merged == [f"one {MARKER} .\ntwo .", "three ."]
    # Across files of one training corpus: the positions name the files.
    cfg = common.data_config()
    cfg.corpus, cfg.paths, cfg.eval_fraction = "text", (str(a), str(b)), 0.0
    with pytest.raises(identity.DuplicateRecordsError) as e:
        list(pretraining._documents(cfg, []))  # noqa: SLF001
    assert (f"the first: document 1 of {a} and document 3 of {a}; document 2 of {a} and "
            f"document 2 of {b}.") in str(e.value)
    cfg.duplicate_ids = "merge_identical"
    summary: dict = {}
    docs = list(pretraining._documents(cfg, [], summary))  # noqa: SLF001
    assert [d.sentences for d in docs] == [[f"one {MARKER} .", "two ."], ["three ."], ["four ."]]
    assert summary["copies_dropped"] == 2 and summary["identity"] == identity.TEXT_IDENTITY


# --------------------------------------------------------------------------- training data


def _data_config(path, rule="refuse", unit="note"):
    cfg = common.data_config()
    cfg.corpus, cfg.paths, cfg.duplicate_ids = "noteevents", (str(path),), rule
    cfg.eval_fraction = 0.1
    cfg.eval_split_unit = "subject" if unit == "patient" else "document"
    return cfg


@pytest.mark.parametrize("unit", ["example", "note", "patient"])
def test_training_data_refuses_then_merges(corpus, unit):
    with pytest.raises(identity.DuplicateRecordsError) as e:
        pretraining.build_datasets(_data_config(corpus["twice"], unit=unit), corpus["vocab"],
                                   unit)
    assert "100 ROW_ID(s) occur more than once" in str(e.value)
    _no_text(str(e.value))
    merged, _ = pretraining.build_datasets(_data_config(corpus["twice"], "merge_identical", unit),
                                           corpus["vocab"], unit)
    once, _ = pretraining.build_datasets(_data_config(corpus["once"], unit=unit),
                                         corpus["vocab"], unit)
    # Exactly the examples (and units) of the file without copies.
    assert merged.metadata["content_sha256"] == once.metadata["content_sha256"]
    info = merged.metadata["record_identity"]
    assert info["copies_dropped"] == 100 and info["duplicate_ids"] == "merge_identical"
    assert once.metadata["record_identity"]["text"] == "duplicate ROW_IDs refused (none found)"
    assert merged.metadata["unit_multiplicity"]["record_identity"] == info
    if unit != "example":
        assert merged.metadata["units"]["num_units"] == once.metadata["units"]["num_units"]
        assert merged.metadata["units"]["record_identity"] == info
        assert merged.metadata["units"]["documents_per_unit_max"] == (
            1 if unit == "note" else once.metadata["units"]["documents_per_unit_max"])


def test_rule_is_checked_and_fingerprinted(corpus):
    cfg = _data_config(corpus["once"], "merge")
    with pytest.raises(ValueError, match="data.duplicate_ids='merge'"):
        pretraining.build_datasets(cfg, corpus["vocab"])
    fingerprint = pretraining._instances_fingerprint  # noqa: SLF001
    fingerprints = {fingerprint(_data_config(corpus["once"], rule), str(corpus["vocab"]))
                    for rule in identity.RULES}
    assert len(fingerprints) == 2


# --------------------------------------------------------------------------- fine-tuning


def test_fine_tuning_keeps_duplicates_and_says_so(tmp_path, capsys):
    from configs import finetune_classification, finetune_ner
    from data_pipelines import ner, tokenization
    from dpbert.tasks import classification as clf_task
    from dpbert.tasks import ner as ner_task
    from tests.dpbert.tasks import finetune_fixtures as fx

    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(fx.VOCAB) + "\n")
    tok = tokenization.WordPieceTokenizer(str(vocab), do_lower_case=True)
    rows = [f"{i % 2}\tgood movie {MARKER}{i}\n" for i in range(20)]
    train = tmp_path / "train.tsv"
    train.write_text("".join(rows + rows[:3] + rows[:1]))      # 4 exact copies
    (tmp_path / "eval.tsv").write_text("".join(rows[:4]))
    c = finetune_classification.get_config()
    c.data.train, c.data.eval, c.data.max_seq_length = str(train), str(tmp_path / "eval.tsv"), 16
    c.batch.expected_batch_size = 4
    task = clf_task.ClassificationTask()
    loaded = task.load(c, tok)
    assert loaded.num_train == 24                               # copies are examples
    out = capsys.readouterr().out
    assert (f"WARNING: {train}: 4 of the 24 training rows are exact copies of an earlier row; "
            "each copy is a separate training example") in out
    assert MARKER not in out
    assert "a row that appears twice in the file is two examples" in task.unit_definition(c)

    docs = ner.read_conll(fx.ner_conll(tmp_path / "n.conll", 12, seed=1))
    ner.write_conll(tmp_path / "train.conll", docs + docs[:2])
    c = finetune_ner.get_config()
    c.data.train, c.data.eval = str(tmp_path / "train.conll"), str(tmp_path / "n.conll")
    c.data.max_seq_length, c.data.stride = 16, 8
    task = ner_task.NerTask()
    assert task.load(c, tok).num_train == 14
    assert "2 of the 14 training documents are exact copies" in capsys.readouterr().out
    assert "a document that appears twice is two examples" in task.unit_definition(c)


# --------------------------------------------------------------------------- TFDS


def test_tfds_builder_and_tfds_documents(corpus, tmp_path):
    from data_pipelines import documents, tfds_data

    with pytest.raises(identity.DuplicateRecordsError, match="data rows 1 and 101") as e:
        tfds_data.prepare_noteevents(corpus["twice"], tmp_path / "refused")
    assert str(e.value).startswith(f"{corpus['twice']}: 100 ROW_ID(s)")   # not the temp link
    built = tfds_data.prepare_noteevents(corpus["twice"], tmp_path / "merged", "merge_identical")
    source = tfds_data.load_data_source(tfds_data.NOTEEVENTS_NAME, data_dir=str(tmp_path /
                                                                                "merged"))
    assert built and len(source) == 100
    # TFDS documents: one key across all sets; a text's key is its content.
    wiki = [documents.Document(["same text ."], key=identity.content_key(["same text ."])),
            documents.Document(["other ."], key=identity.content_key(["other ."]))]
    notes = [documents.Document(["a ."], 7, key=11), documents.Document(["b ."], 7, key=11)]
    sources = [identity.Source("TFDS wiki", identity.TEXT_IDENTITY, "document"),
               identity.Source("TFDS notes", identity.NOTE_IDENTITY, "document")]
    stream = [(0, wiki[0]), (1, notes[0]), (0, wiki[1]), (0, wiki[0]), (1, notes[1])]
    with pytest.raises(identity.DuplicateRecordsError) as e:
        list(identity.unique_documents(lambda: iter(stream), sources))
    assert ("the first: document 1 of TFDS wiki and document 3 of TFDS wiki; document 1 of "
            "TFDS notes and document 2 of TFDS notes.") in str(e.value)
    assert "the copies of 1 of them differ in content" in str(e.value)
    summary: dict = {}
    kept = list(identity.unique_documents(lambda: iter(stream[:4]), sources,
                                          "merge_identical", summary))
    assert kept == [wiki[0], notes[0], wiki[1]] and summary["copies_dropped"] == 1

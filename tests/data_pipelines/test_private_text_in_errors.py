"""No private text in any message or log line (issue 35): every reader, fed an input that carries
a unique marker in the offending private field, fails (or warns) on the path the case names, and
the marker appears in none of the exception message, stdout, stderr and log records. The
launchers that read data (finetune, build_vocab, train) are run as subprocesses on such inputs.
"""

import gzip
import json
import logging
import os
import pathlib
import subprocess
import sys

import pytest

from data_pipelines import canaries, corpora, dp_vocab, ner, tfds_data
from data_pipelines import classification as clf
from data_pipelines import tokenization

M = "Zqxmarker4711"
REPO = pathlib.Path(__file__).resolve().parents[2]
HEADER = ",".join(corpora.NOTEEVENTS_COLUMNS)


def note(row_id, text, subject=None, iserror="", hadm=None):
    subject = row_id if subject is None else subject
    hadm = row_id if hadm is None else hadm
    quoted = '"' + text.replace('"', '""') + '"'
    return f"{row_id},{subject},{hadm},2150-01-01,,,Radiology,CHEST,,{iserror},{quoted}\n"


def notes(bad_row: str, n_good: int = 20) -> str:
    return HEADER + "\n" + "".join(note(i, f"good note {i} .") for i in range(1, n_good)) + \
        bad_row


def tokenizer(tmp: pathlib.Path) -> tokenization.WordPieceTokenizer:
    chars = "abcdefghijklmnopqrstuvwxyz0123456789.-"
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *(f"##{c}" for c in chars)]
    (tmp / "vocab.txt").write_text("\n".join(vocab) + "\n")
    return tokenization.WordPieceTokenizer(tmp / "vocab.txt")


def ner_config(**data):
    from configs import finetune_ner

    c = finetune_ner.get_config()
    for k, v in data.items():
        c.data[k] = v
    return c


def w(tmp: pathlib.Path, name: str, content: str | bytes) -> str:
    path = tmp / name
    path.write_bytes(content.encode("utf-8", "surrogateescape") if isinstance(content, str)
                     else content)
    return str(path)


TRAIN_TSV = "pos\tgood film\nneg\tbad film\npos\tvery good\n"
CANARY = {"format_version": 1, "canaries": [
    {"canary_id": "HS-r1-0", "form": "HS", "tokens": ["the", M], "token_ids": [5, 6],
     "secret": M, "secret_id": 6, "secret_position": 1, "repetitions": 1}]}


def canary_with(**fields):
    record = json.loads(json.dumps(CANARY))
    record["canaries"][0].update(fields)
    return json.dumps(record)


# name: (function of a tmp folder that runs the reader, what the message or log must say)
CASES = {
    # ---- fine-tuning TSV (data_pipelines.classification)
    "tsv one column": (lambda t: clf.read_tsv(w(t, "a.tsv", f"{M} was here\n")),
                       "1 tab-separated columns"),
    "tsv four columns": (lambda t: clf.read_tsv(w(t, "a.tsv", f"1\t{M}\t{M}\t{M}\n")),
                         "4 tab-separated columns"),
    "tsv layout": (lambda t: clf.read_tsv(w(t, "a.tsv", f"1\t{M}\n0\t{M}\t{M}\n")),
                   "but line 1 has 2"),
    "tsv empty text": (lambda t: clf.read_tsv(w(t, "a.tsv", f"{M}\t  \n")), "empty text"),
    "tsv NUL": (lambda t: clf.read_tsv(w(t, "a.tsv", f"1\tgood {M}\x00 film\n")),
                "a.tsv:1:21: a NUL byte"),
    "tsv control": (lambda t: clf.read_tsv(w(t, "a.tsv", f"1\t{M}\x1b[0m\n")), "U+001B"),
    "tsv bad UTF-8": (lambda t: clf.read_tsv(w(t, "a.tsv", f"1\t{M} \udcff{M}\n")),
                      "a.tsv:1:17: a byte that is not valid UTF-8"),
    "tsv not gzip": (lambda t: clf.read_tsv(w(t, "a.tsv.gz", f"1\t{M}\n")), "not gzip data"),
    "tsv cut gzip": (lambda t: clf.read_tsv(w(t, "a.tsv", gzip.compress(
        f"1\t{M}\n".encode() * 500)[:60])), "the gzip data ends early"),
    "tsv UTF-16": (lambda t: clf.read_tsv(w(t, "a.tsv", f"1\t{M}\n".encode("utf-16"))),
                   "UTF-16 text"),
    "eval label unknown": (lambda t: clf.load_train_eval(
        w(t, "tr.tsv", TRAIN_TSV), w(t, "ev.tsv", f"pos\tgood\n{M}\tbad\n"), tokenizer(t)),
        "ev.tsv:2:1: unknown label (13 characters: letters, digits)"),
    "train label rare": (lambda t: clf.load_train_eval(
        w(t, "tr.tsv", TRAIN_TSV + f"{M}\tgood\n"), w(t, "ev.tsv", "pos\tgood\nneg\tbad\n"),
        tokenizer(t)), "has no row with 1 of the 3 labels"),
    "train one label": (lambda t: clf.load_train_eval(
        w(t, "tr.tsv", f"{M}\tgood\n{M}\tbad\n"), w(t, "ev.tsv", f"{M}\tbad\n"), tokenizer(t)),
        "only one label (every row's is 13 characters"),
    "train label vs given": (lambda t: clf.load_train_eval(
        w(t, "tr.tsv", TRAIN_TSV + f"{M}\tgood\n"), w(t, "ev.tsv", TRAIN_TSV), tokenizer(t),
        labels=["pos", "neg"]), "tr.tsv:4:1: unknown label (13 characters"),
    "eval is train": (lambda t: clf.load_train_eval(
        w(t, "tr.tsv", TRAIN_TSV + f"pos\t{M}\n"), w(t, "ev.tsv", TRAIN_TSV + f"pos\t{M}\n"),
        tokenizer(t)), "the evaluation file is the training file"),
    "eval pairs": (lambda t: clf.load_train_eval(
        w(t, "tr.tsv", TRAIN_TSV), w(t, "ev.tsv", f"pos\t{M}\t{M}\nneg\ta\tb\n"), tokenizer(t)),
        "pairs but"),
    "eval overlap (warning)": (lambda t: clf.load_train_eval(
        w(t, "tr.tsv", TRAIN_TSV + f"pos\tgood {M}\n"), w(t, "ev.tsv", f"pos\tgood {M}\nneg\tx\n"),
        tokenizer(t)), "1 of 2 evaluation rows (50.0 %) have a text that also occurs"),
    # ---- CoNLL (data_pipelines.ner, dpbert.tasks.ner)
    "conll untagged name": (lambda t: ner.read_conll(w(t, "a.conll", f"fever B-problem\nMr {M}\n")),
                            "a.conll:2:4: tag (13 characters: letters, digits) is not 'O'"),
    "conll note given as CoNLL": (lambda t: ner.read_conll(w(t, "a.conll", f"Seen by {M}\n")),
                                  "is not 'O' or"),
    "conll one column": (lambda t: ner.read_conll(w(t, "a.conll", f"{M}\n")), "one column"),
    "conll tag not in set": (lambda t: ner.read_conll(w(t, "a.conll", f"fever B-{M}\n"),
                                                      tags=ner.I2B2_TAGS),
                             "is not in the tag set ['B-problem'"),
    "conll NUL": (lambda t: ner.read_conll(w(t, "a.conll", f"{M}\x00 O\n")), "a NUL byte"),
    "conll bad UTF-8": (lambda t: ner.read_conll(w(t, "a.conll", f"{M}\udcfe O\n")),
                        "a.conll:1:14: a byte that is not valid UTF-8"),
    "conll eval tag unknown to train": (lambda t: __import__("dpbert.tasks.ner").tasks.ner
                                        .documents(ner_config(
                                            train=w(t, "tr.conll", "fever B-problem\nok O\n"),
                                            eval=w(t, "ev.conll", f"fever B-{M}\n"))),
                                        "ev.conll:1:7: tag (15 characters: letters, digits, "
                                        "punctuation) does not occur in the training documents"),
    "conll eval is train": (lambda t: __import__("dpbert.tasks.ner").tasks.ner.documents(
        ner_config(train=w(t, "tr.conll", f"{M} O\n"), eval=w(t, "ev.conll", f"{M} O\n"))),
        "the evaluation file is the training file"),
    "conll encode unknown tag": (lambda t: ner.encode_documents(
        [ner.Document("d", (ner.Sentence(("a",), (f"B-{M}",)),))], tokenizer(t),
        ner.I2B2_TAGS), "tag (15 characters: letters, digits, punctuation) is not one of"),
    # ---- plain-text corpora (data_pipelines.corpora; the vocabulary builder reads through it)
    "text NUL": (lambda t: list(corpora.read_text_documents(w(t, "c.txt", f"a\n{M}\x00\n"))),
                 "line 2, column 14: a NUL byte"),
    "text control": (lambda t: list(corpora.read_text_documents(w(t, "c.txt", f"{M}\x0b\n"))),
                     "line 1, column 14: a control character (U+000B)"),
    "text bad UTF-8": (lambda t: list(corpora.read_text_documents(w(t, "c.txt", f"\udce9{M}\n"))),
                       "line 1, column 1: a byte that is not valid UTF-8"),
    "text one bad line (warning)": (lambda t: list(corpora.read_text_documents(w(
        t, "c.txt", "".join(f"line {i}\n" for i in range(200)) + f"{M}\x00\n"))),
        "not UTF-8 text (bad bytes or control characters); the first unparseable one starts at "
        "line 201, column 14: a NUL byte"),
    "text is NOTEEVENTS": (lambda t: list(corpora.read_text_documents(w(
        t, "c.csv", HEADER + "\n" + note(1, M)))), "line 1 is a MIMIC-III NOTEEVENTS header"),
    "text via dp_vocab": (lambda t: list(dp_vocab.iter_examples(w(
        t, "c.txt", f"{M}\x00\n"), "text")), "cannot be parsed"),
    # ---- NOTEEVENTS
    "noteevents no header": (lambda t: list(corpora.read_noteevents(w(t, "n.csv", note(1, M)))),
                             "header line is probably missing"),
    "noteevents NUL in TEXT": (lambda t: list(corpora.read_noteevents(w(
        t, "n.csv", notes(note(50, f"a\n{M}\x00 b"), 5)))), "a NUL byte"),
    "noteevents SUBJECT_ID": (lambda t: list(corpora.read_noteevents(w(
        t, "n.csv", notes(note(50, "x", subject=M), 5)))), "SUBJECT_ID is not an integer"),
    "noteevents HADM_ID": (lambda t: list(corpora.read_noteevents(w(
        t, "n.csv", notes(note(50, "x", hadm=M), 5)))), "HADM_ID is not an integer"),
    "noteevents ISERROR": (lambda t: list(corpora.read_noteevents(w(
        t, "n.csv", notes(note(50, "x", iserror=M), 5)))), "ISERROR is not empty"),
    "noteevents field count": (lambda t: list(corpora.read_noteevents(w(
        t, "n.csv", notes(f"{M},{M}\n", 5)))), "2 fields, the header has 11"),
    "noteevents quote": (lambda t: list(corpora.read_noteevents(w(
        t, "n.csv", notes(note(50, "x").replace('"x"', f'"x"{M}'), 5)))), "CSV error"),
    "noteevents bad header": (lambda t: list(corpora.read_noteevents(w(
        t, "n.csv", f'"{M}"{M},b\n'))), "cannot parse the CSV header"),
    "noteevents one bad row (warning)": (lambda t: list(corpora.read_noteevents(w(
        t, "n.csv", notes(note(500, f"{M}\x00"), 200)))), "1 not UTF-8 text"),
    "noteevents per patient (dp_vocab)": (lambda t: list(dp_vocab.iter_examples(w(
        t, "n.csv", notes(note(50, "x", subject=M), 5)), "noteevents", unit="patient")),
        "SUBJECT_ID is not an integer"),
    # ---- the canary file
    "canary placement": (lambda t: canaries.load_canary_file(w(
        t, "c.json", canary_with(placement=M))), "placement (13 characters"),
    "canary version": (lambda t: canaries.load_canary_file(w(
        t, "c.json", json.dumps({**CANARY, "format_version": M}))), "unknown canary file version"),
    "canary field": (lambda t: canaries.load_canary_file(w(
        t, "c.json", canary_with(**{M: 1}))), "1 unknown field(s)"),
    "canary JSON": (lambda t: canaries.load_canary_file(w(t, "c.json", f'{{"{M}" {M}}}')),
                    "c.json:1:18: not a canary file (JSON: Expecting ':' delimiter)"),
    "canary NUL": (lambda t: canaries.load_canary_file(w(t, "c.json", f'{{"{M}\x00": 1}}')),
                   "c.json:1:16: a NUL byte"),
    "canary secret": (lambda t: canaries.load_canary_file(w(
        t, "c.json", canary_with(secret_id=7))), "disagree"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_marker_never_in_a_message_or_log(case, tmp_path, capsys, caplog):
    run, expect = CASES[case]
    caplog.set_level(logging.DEBUG)
    try:
        run(tmp_path)
        error = ""
    except (ValueError, OSError) as e:
        error = str(e)
    out = capsys.readouterr()
    logs = "\n".join(r.getMessage() for r in caplog.records)
    assert expect in error + logs, (case, error, logs)
    for where, text in (("message", error), ("stdout", out.out), ("stderr", out.err),
                        ("log", logs)):
        assert M.lower() not in text.lower(), (case, where, text)


def test_tfds_records_with_the_marker(monkeypatch, caplog):
    class Source:
        def __init__(self, texts):
            self.records = [{"text": x.encode("utf-8", "surrogateescape")} for x in texts]

        def __len__(self):
            return len(self.records)

        def __getitems__(self, indices):
            return [self.records[i] for i in indices]

    caplog.set_level(logging.DEBUG)
    for texts in ([f"{M}\x00 {M}."] * 3, ["a."] * 300 + [f"{M} \udcff"]):
        monkeypatch.setattr(tfds_data, "load_data_source", lambda *a, t=texts, **k: Source(t))
        try:
            list(tfds_data.tfds_documents("fake"))
            error = ""
        except ValueError as e:
            error = str(e)
        logs = "\n".join(r.getMessage() for r in caplog.records)
        assert "records" in error + logs and M not in error + logs


# ----------------------------------------------------------------------------- the launchers


def _config(path: pathlib.Path, base: str, **fields) -> str:
    lines = [f"from configs import {base}", "", "", "def get_config(arg=None):",
             f"    c = {base}.get_config()"]
    lines += [f"    c.{k} = {v!r}" for k, v in fields.items()]
    path.write_text("\n".join(lines + ["    return c", ""]))
    return f"--config={path}"


def test_launchers_on_inputs_with_the_marker(tmp_path):
    from tests.launch.test_launchers import drive

    # A Hugging Face folder is enough for the data to be read (the model is loaded after).
    hf = tmp_path / "hf"
    hf.mkdir()
    tokenizer(hf)
    (hf / "config.json").write_text(json.dumps({"vocab_size": 81, "max_position_embeddings": 512,
                                                "model_type": "bert"}))
    train = w(tmp_path, "train.tsv", "".join(f"{'pos' if i % 2 else 'neg'}\tgood {i}\n"
                                             for i in range(40)))
    ok = {"model.init_from_hf": str(hf), "data.train": train}

    def finetune(name, base="finetune_classification", **fields):
        return [_config(tmp_path / f"{name}.py", base, **{**ok, **fields}),
                f"--workdir={tmp_path / 'w' / name}"]

    nul_notes = w(tmp_path, "NOTEEVENTS.csv", notes(note(50, f"a\n{M}\x00 b"), 5))
    bad_ids = w(tmp_path, "ids.csv", notes(note(50, "x", subject=M), 5))
    nul_text = w(tmp_path, "c.txt", f"a\n\n{M}\x00\n\nb\n")
    cases = {
        "finetune.py": {
            "eval label": finetune("label", **{"data.eval": w(tmp_path, "e.tsv",
                                                              f"pos\tgood\n{M}\tbad\n")}),
            "eval is train": finetune("same", **{"data.eval": train}),
            "NUL": finetune("nul", **{"data.eval": w(tmp_path, "n.tsv", f"pos\t{M}\x00\n")}),
            "ner tag": finetune("ner", "finetune_ner", **{
                "data.train": w(tmp_path, "t.conll", f"fever B-problem\nMr {M}\n")}),
        },
        "build_vocab.py": {
            "nul notes": [f"--input={nul_notes}", "--format=noteevents", "--vocab_size=2000",
                          "--epsilon=8", "--delta=1e-6", f"--out={tmp_path / 'v1'}"],
            "bad ids": [f"--input={bad_ids}", "--format=noteevents", "--vocab_size=2000",
                        "--epsilon=8", "--delta=1e-6", f"--out={tmp_path / 'v2'}"],
            "nul text": [f"--input={nul_text}", "--format=text", "--vocab_size=2000",
                         "--epsilon=8", "--delta=1e-6", f"--out={tmp_path / 'v3'}"],
        },
        "train.py": {
            "nul notes": [_config(tmp_path / "t1.py", "demo_dp", **{
                "data.corpus": "noteevents", "data.paths": (nul_notes,)}),
                f"--workdir={tmp_path / 'w' / 't1'}"],
            "nul text": [_config(tmp_path / "t2.py", "demo_dp", **{
                "data.corpus": "text", "data.paths": (nul_text,)}),
                f"--workdir={tmp_path / 'w' / 't2'}"],
        },
    }
    expect = {"eval label": "unknown label (13 characters", "eval is train": "is the training",
              "NUL": "n.tsv:1:18: a NUL byte", "ner tag": "t.conll:2:4: tag (13 characters",
              "nul notes": "a NUL byte", "bad ids": "SUBJECT_ID is not an integer",
              "nul text": "line 3, column 14: a NUL byte"}
    for launcher, named in cases.items():
        results = drive(launcher, launcher[:-3], list(named.values()))
        for case, (code, out, err, _) in zip(named, results):
            assert code not in (0, "traceback"), (launcher, case, err)
            assert expect[case] in err, (launcher, case, err)
            assert M.lower() not in (out + err).lower(), (launcher, case, out, err)

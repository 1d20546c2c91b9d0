"""Your own corpus, one command: a tiny BERT pretrained with DP-SGD on a file you give.

    python launch/train.py --workdir=runs/mine \\
        --config=configs/own_corpus.py:path=/data/NOTEEVENTS.csv.gz,unit=patient
    python launch/train.py --workdir=runs/mine \\
        --config=configs/own_corpus.py:path=/data/books.txt.gz,unit=document

Config args (`key=value`, comma-separated):
  path    the corpus file (required to train): a MIMIC-III NOTEEVENTS.csv(.gz) (or a CSV with
          its columns: ROW_ID, SUBJECT_ID, TEXT, ...), or plain text (one sentence per line, a
          blank line between documents; .gz allowed). The format is read off the file's first
          line (a NOTEEVENTS header or not); `format=` forces it.
  unit    what one neighbouring record is (dp.privacy_unit): "patient" (one SUBJECT_ID with all
          their notes; NOTEEVENTS only, the default there), "note" or its synonym "document"
          (one NOTEEVENTS row, or one blank-line-separated document; the default for plain
          text), or "example" (one training sequence: a weak unit, see README).
  format  auto (default) | noteevents | text.
  size    the BERT size preset (default tiny).

What the config sets from them: data.corpus and data.paths; dp.privacy_unit; the held-out
split's unit (data.eval_split_unit: whole patients for unit=patient, whole documents
otherwise, so that no unit sits on both sides); the batch sizes in the unit's terms. Before
anything is built the run checks the corpus against the DP vocabulary's threshold
(data.preflight: too few records for a useful vocabulary at vocab.epsilon is refused
with the records, the vocab.epsilon or the public vocab.file that would do) and, with a fixed
dp.noise_multiplier, that a step fits dp.target_epsilon. Every field stays overridable:
`--config.dp.target_epsilon=4`, `--config.train.num_steps=50`, `--config.vocab.file=V.txt`.
"""

import csv
import gzip
import os

from configs import common

UNITS = ("patient", "note", "document", "example")
FORMATS = ("auto", "noteevents", "text")
_NAME = "configs/own_corpus.py"
_NOTEEVENTS_COLUMNS = {"ROW_ID", "SUBJECT_ID", "TEXT"}


def sniff_format(path: str) -> str:
    """"noteevents" when the file's first line is a CSV header with the NOTEEVENTS key columns
    (ROW_ID, SUBJECT_ID, TEXT), else "text"; a missing, empty or unreadable file is a
    ValueError naming it. (The readers check the rest of the file; this reads one line.)"""
    where = f"{_NAME}: path={path!r}"
    if not os.path.exists(path):
        raise ValueError(f"{where} does not exist (give the corpus file: a NOTEEVENTS.csv(.gz) "
                         "or a plain-text file)")
    if os.path.isdir(path):
        raise ValueError(f"{where} is a directory; give one corpus file")
    try:
        with open(path, "rb") as f:
            gzipped = f.read(2) == b"\x1f\x8b"
        opener = gzip.open if gzipped else open
        with opener(path, "rt", encoding="utf-8", errors="replace", newline="") as f:
            first = f.readline(1 << 16)
    except (OSError, EOFError) as e:
        raise ValueError(f"{where}: cannot read it ({e})") from None
    if not first.strip():
        raise ValueError(f"{where}: the file is empty or starts with a blank line; a "
                         "NOTEEVENTS CSV starts with its header, plain text with a sentence")
    header = next(csv.reader([first.lstrip("\ufeff")]), [])
    names = {h.strip().upper() for h in header}
    return "noteevents" if _NOTEEVENTS_COLUMNS <= names else "text"


def get_config(arg: str | None = None):
    args = common.parse_arg(arg, {"path": None, "unit": UNITS, "format": FORMATS,
                                  "size": common.MODEL_SIZES}, config=_NAME)
    path = os.path.expanduser(args.get("path", ""))
    fmt = args.get("format", "auto")
    if fmt == "auto":
        # Without a path (--config.data.paths given instead): the format the unit implies.
        fmt = sniff_format(path) if path else (
            "noteevents" if args.get("unit") == "patient" else "text")
    elif path and not os.path.isfile(path):
        sniff_format(path)  # the same message for a missing file
    unit = args.get("unit", "patient" if fmt == "noteevents" else "document")
    if unit == "patient" and fmt != "noteevents":
        raise ValueError(
            f"{_NAME}: unit=patient needs patients (SUBJECT_IDs), which only a NOTEEVENTS CSV "
            f"has; {path or 'the corpus'} is plain text, where a document is the largest "
            "record: use unit=document")
    privacy_unit = {"document": "note"}.get(unit, unit)
    per_unit = privacy_unit != "example"

    c = common.get_config()
    c.model.size = args.get("size", "tiny")
    c.model.max_position_embeddings = 64

    # A DP WordPiece vocabulary built from the corpus before training (WORKDIR/vocab), per
    # patient for unit=patient, else per document / note. A word survives only if about tau
    # records use it (tau ~ 91 at epsilon 8, K 64): small corpora need a large epsilon or a
    # public vocabulary (--config.vocab.file=.../vocab.txt). Its cost enters the run's total.
    c.vocab.size = 4096
    c.vocab.epsilon = 8.0
    c.vocab.delta = 1e-6
    c.vocab.max_words_per_example = 64

    c.data.corpus = fmt
    # Before anything is built: count the corpus's records and refuse a corpus too small for a
    # useful DP vocabulary at vocab.epsilon, or (note / patient) a batch or budget that cannot
    # fit it (configs/common.py).
    c.data.preflight = True
    c.data.paths = (path,) if path else ()
    # Short sequences and few of them per unit keep a step to about a second on 2 CPU cores;
    # on an accelerator raise them (128 / 20, dp.max_examples_per_unit=8, larger batches).
    c.data.max_seq_length = 64
    c.data.max_predictions_per_seq = 10
    c.data.eval_fraction = 0.05
    # Hold out whole units: all of a patient's notes, or whole documents.
    c.data.eval_split_unit = "subject" if privacy_unit == "patient" else "document"

    c.dp.enabled = True
    c.dp.privacy_unit = privacy_unit
    # sigma is calibrated so that train.num_steps steps spend exactly dp.target_epsilon (the
    # TRAINING's epsilon; the report's total adds the vocabulary's). Set a fixed
    # dp.noise_multiplier instead and the target caps the steps (refused, with the sigma or
    # the target that would fit, when not even one step fits).
    c.dp.noise_multiplier = None
    c.dp.target_epsilon = 8.0
    c.dp.delta = 1e-6
    c.dp.clip_norm = 1.0
    # Note / patient: at most K sequences of a sampled unit per logical batch (a fresh random
    # K each time it is sampled).
    c.dp.max_examples_per_unit = 4
    c.dp.overflow_probability = 1e-6
    if per_unit:
        # Expected UNITS (notes / patients) per logical batch; a call holds [units, K] slots,
        # and a Poisson batch of 16 fits 2 calls of 24 (overflow probability 1e-6).
        c.batch.expected_batch_size = 16
        c.batch.physical_batch_size = 24
        c.batch.microbatch_size = 8
    else:
        c.batch.expected_batch_size = 128
        c.batch.physical_batch_size = 192
        c.batch.microbatch_size = 96

    c.optimizer.learning_rate = 2e-3
    c.optimizer.warmup_steps = 20
    # About 2 s a step per note / patient on 2 CPU cores (8-10 units/s): 100 steps take a few
    # minutes. A real corpus wants more (sigma is calibrated to whatever is set).
    c.train.num_steps = 100
    c.train.log_every = 10
    c.train.eval_every = 50
    c.train.eval_batches = 4
    c.train.eval_batch_size = 64
    c.checkpoint.every_steps = 50
    return c

"""Sentence and sentence-pair classification data: `label<TAB>text[<TAB>text_b]` files -> features.

    tokenizer = classification.tokenizer_for_checkpoint(HF_FOLDER, vocab_size=config.vocab_size)
    data = classification.load_train_eval(TRAIN_TSV, EVAL_TSV, tokenizer, max_seq_len=128)
    data.train["input_ids"]    # int32 [N, 128]; data.labels.names: class id -> label

A first line whose first column is "label" is a header (skipped), as in
../shared/data/sentiment/*.tsv. Files are read under the byte-level rules of every text reader
(`data_pipelines.textcheck`): gzip is read (by its magic bytes), a UTF-8 byte-order mark is
skipped and said, bytes that are not UTF-8 and control characters other than tab and CR are
refused with their line and column.

Features (one row per example, in file order), BERT's layout:

    input_ids    int32 [N, S]  [CLS] a [SEP] (b [SEP]) [PAD]...
    segment_ids  int32 [N, S]  0 for [CLS] a [SEP], 1 for b [SEP], 0 on padding
    input_mask   int32 [N, S]  1 on real tokens
    label        int32 [N]     index into `LabelMap.names`
    example_id   int32 [N]     0-based row in the file: with the run's secret key it names the
                               example's dχ release (`dpbert.privacy.input_privacy`)

Truncation is BERT's `truncate_seq_pair`: drop the last token of the longer of the two texts
until the pair fits (ties drop from text_b), so a gets the extra token when the total is odd.
(`transformers`' "longest_first" splits ties the other way round: the two agree whenever at
most one text needs cutting.)

Tokenization is `data_pipelines.tokenization.WordPieceTokenizer` (HF `tokenizers`, behaving as
`BertTokenizerFast`); `tokenizer_for_checkpoint` reads the folder's vocab.txt and its
`do_lower_case`, and refuses a vocabulary that does not belong to the checkpoint.

Errors are `DataError`s naming the file, the LINE NUMBER and the column; they never quote a
value of the file, the label included (a rare label can identify a row): a bad label is
described by its length and classes of characters (`textcheck.describe`), a missing one by the
first training row that has it. Labels given by the caller (`labels=`, data.labels in a
config) are public and shown. The training file's label SET is part of what a fine-tuned model
releases (its config.json's id2label, the model card); the task prints it once when the data
loaded (`dpbert.tasks.classification`), never in an error.

The evaluation file must not be the training file (the same path, a link to it, or a
byte-identical copy: refused); evaluation rows whose text also occurs in the training file are
counted and a WARNING gives the count (no text).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
import re
from typing import Iterable, Sequence

import numpy as np
from absl import logging

from data_pipelines import textcheck, tokenization


class DataError(ValueError):
    """Bad fine-tuning input: names the file and line, never the text of a line."""


# ----------------------------------------------------------------------------- reading


@dataclasses.dataclass(frozen=True)
class TsvRow:
    label: str
    text_a: str
    text_b: str | None
    line: int          # 1-based line number in the file


def describe_label(label: str) -> str:
    """A label (or tag) read from a data file, for a message: its length and classes of
    characters in parentheses, never the value (a misplaced text column, a name in the tag
    column, a rare label must not end up in a log)."""
    return f"({textcheck.describe(label)})"


def describe_labels(labels: Iterable[str]) -> str:
    """Labels that are public (given by the caller or the config), for a message."""
    labels = list(labels)
    if len(labels) <= 20:
        return "[" + ", ".join(repr(x) for x in labels) + "]"
    return f"{len(labels)} labels"


HEADER_LABEL = "label"
# Layout checks of `read_tsv`: a file of at least this many rows whose first column is unique
# per row while its last column takes few values has its label in the last column.
_LABEL_LAST_MIN_ROWS = 20
# Numbers as labels ("1", "1.0", "-2", "1e3"): one class per number, whatever the spelling.
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")
# (file, size, mtime) of the files whose quoting was already reported.
_SAID_QUOTES: set[tuple] = set()


def _unquoted(field: str) -> str:
    field = field.strip()
    return field[1:-1] if len(field) >= 2 and field[0] == field[-1] == '"' else field


def _is_quoted(field: str) -> bool:
    field = field.strip()
    return len(field) >= 2 and field[0] == field[-1] == '"'


def numeric_value(label: str) -> float | None:
    """The number a label spells ("1", "1.0", "+1", "1e0" all spell 1.0), or None."""
    return float(label) if _NUMBER.fullmatch(label.strip()) else None


def read_tsv(path: str | os.PathLike, *, header: bool | None = None) -> list[TsvRow]:
    """Reads `label<TAB>text` or `label<TAB>text_a<TAB>text_b` lines (one layout per file).

    Blank lines are skipped. `header`: whether the first line names the columns; None (the
    default) = yes when its first column is "label" (as in ../shared/data/sentiment/*.tsv).
    gzip data is decompressed and a UTF-8 byte-order mark skipped (`textcheck`). Raises
    `DataError` (file, line and column) for a missing or empty file, bytes that are not UTF-8,
    a control character other than tab and CR, a line with another number of columns than 2 or
    3 or than the file's first line, and an empty label or text.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    rows: list[TsvRow] = []
    columns = None
    first = True
    number = 0
    quoted = 0
    with textcheck.open_text(path, DataError, newline="\n") as f:
        while True:
            try:
                line = next(f)
            except StopIteration:
                break
            except textcheck.READ_ERRORS as e:
                raise textcheck.read_error(str(path), number, e, DataError) from None
            number += 1
            line = line.rstrip("\r\n")
            problem = textcheck.line_problem(path, number, line)
            if problem:
                raise DataError(problem)
            if not line.strip():
                continue
            fields = line.split("\t")
            if first:
                first = False
                names = [_unquoted(x).lower() for x in fields]
                if header is None and names[0] != HEADER_LABEL and len(fields) > 1 \
                        and names[-1] == HEADER_LABEL:
                    raise DataError(
                        f"{path}:{number}: the header names column {len(fields)}, the LAST "
                        f"one, '{HEADER_LABEL}' (text<TAB>label, the GLUE/SST-2 layout); this "
                        "reader expects the label in the FIRST column: label<TAB>text"
                        "[<TAB>text_b]. Reorder the columns"
                        + (" (e.g. awk -F'\\t' -v OFS='\\t' '{print $2, $1}')"
                           if len(fields) == 2 else ""))
                is_header = names[0] == HEADER_LABEL if header is None else header
                if is_header:
                    continue
            if len(fields) not in (2, 3):
                raise DataError(
                    f"{path}:{number}: {len(fields)} tab-separated columns; expected 2 "
                    "(label<TAB>text) or 3 (label<TAB>text_a<TAB>text_b)")
            if columns is None:
                columns = (len(fields), number)
            elif len(fields) != columns[0]:
                raise DataError(f"{path}:{number}: {len(fields)} tab-separated columns, but "
                                f"line {columns[1]} has {columns[0]}; use one layout per file")
            label = fields[0].strip()
            if not label:
                raise DataError(f"{path}:{number}: empty label (column 1)")
            for i, text in enumerate(fields[1:], start=2):
                if not text.strip():
                    raise DataError(f"{path}:{number}: empty text (column {i})")
            rows.append(TsvRow(label, fields[1], fields[2] if len(fields) == 3 else None, number))
            quoted += all(_is_quoted(x) for x in fields)
    if not rows:
        raise DataError(f"{path}: no examples (the file is empty or has only a header)")
    _check_label_column(rows, path)
    if quoted == len(rows):
        _say_quoted(path, len(rows))
    return rows


def _check_label_column(rows: Sequence[TsvRow], path: pathlib.Path) -> None:
    """Refuses a file whose label is evidently its last column: at least
    `_LABEL_LAST_MIN_ROWS` rows, every first-column value different, and a last column of
    few values (text<TAB>label without a header)."""
    n = len(rows)
    if n < _LABEL_LAST_MIN_ROWS or len({r.label for r in rows}) != n:
        return
    last = {(r.text_b if r.text_b is not None else r.text_a).strip() for r in rows}
    if 4 * len(last) > n:
        return
    raise DataError(
        f"{path}: each of the {n} rows has a label of its own in column 1, and the last column "
        f"takes only {len(last)} value(s): is the label the last column (text<TAB>label, the "
        "GLUE/SST-2 layout)? This reader expects the label in the FIRST column: label<TAB>"
        "text[<TAB>text_b]; reorder the columns")


def _say_quoted(path: pathlib.Path, n: int) -> None:
    try:
        st = path.stat()
        key = (str(path.absolute()), st.st_size, st.st_mtime_ns)
    except OSError:
        key = (str(path.absolute()),)
    if key in _SAID_QUOTES:
        return
    _SAID_QUOTES.add(key)
    logging.warning(
        '%s: every field of all %d rows is wrapped in double quotes ("0"<TAB>"text", a '
        "CSV-style export?); this reader is not a CSV reader: the quotes stay part of the "
        "labels and the texts (a model would learn them, and its labels would be named with "
        "quotes). Write the file without quoting (e.g. pandas to_csv(sep='\\t', "
        "quoting=csv.QUOTE_NONE))", path, n)


def check_eval_file(train_path: str | os.PathLike, eval_path: str | os.PathLike) -> None:
    """Refuses an evaluation file that is the training file: the same path, a link to it, or
    a byte-identical copy (metrics on training rows are not held-out metrics)."""
    if os.path.isfile(train_path) and os.path.isfile(eval_path) and textcheck.same_file(
            train_path, eval_path):
        raise DataError(
            f"{eval_path}: the evaluation file is the training file {train_path} (the same "
            "file, or a byte-identical copy): metrics on the rows a model was trained on are "
            "not held-out metrics; give a separate evaluation file")


def eval_overlap(train_rows: Sequence[TsvRow], eval_rows: Sequence[TsvRow]) -> int:
    """How many evaluation rows have a text (pair) that also occurs verbatim in the training
    rows (surrounding whitespace ignored; the label is not compared)."""
    seen = {(r.text_a.strip(), (r.text_b or "").strip()) for r in train_rows}
    return sum((r.text_a.strip(), (r.text_b or "").strip()) in seen for r in eval_rows)


# ----------------------------------------------------------------------------- labels


def _label_sort_key(label: str):
    try:
        return (0, float(label), label)
    except ValueError:
        return (1, 0.0, label)


@dataclasses.dataclass(frozen=True)
class LabelMap:
    """Label names, index = class id (numeric labels in numeric order, then the rest sorted).

    declared: the names were given (labels=, data.labels), so messages may show them; names
      read from a training file (`from_rows`, `source` = that file) are never shown in a message.
    """

    names: tuple[str, ...]
    declared: bool = False
    source: str = ""

    @classmethod
    def from_rows(cls, rows: Sequence[TsvRow], source: str | os.PathLike = "") -> "LabelMap":
        """The labels of a training file's rows; a number written two ways (`1` and `1.0`)
        is a DataError naming the first row of each spelling (it would make two classes)."""
        first: dict[float, TsvRow] = {}
        for r in rows:
            value = numeric_value(r.label)
            if value is None:
                continue
            seen = first.setdefault(value, r)
            if seen.label != r.label:
                raise DataError(
                    f"{os.fspath(source) or 'the training file'}: numeric labels written two ways: lines {seen.line} and {r.line} "
                    f"hold the same number spelt differently ({textcheck.describe(seen.label)}; "
                    f"{textcheck.describe(r.label)}), which would make two classes of one; "
                    "write each label one way, or set data.labels to the label set (a numeric "
                    "label is then matched by its value)")
        return cls(tuple(sorted({r.label for r in rows}, key=_label_sort_key)),
                   source=os.fspath(source))

    def __len__(self) -> int:
        return len(self.names)

    def ids(self, rows: Sequence[TsvRow], path: str | os.PathLike) -> np.ndarray:
        """int32 [N] class ids; an unknown label is a `DataError` naming the line (never the
        label: its length and classes of characters)."""
        index = {n: i for i, n in enumerate(self.names)}
        by_value = {numeric_value(n): i for i, n in enumerate(self.names)
                    if numeric_value(n) is not None}
        out = np.empty(len(rows), np.int32)
        for j, r in enumerate(rows):
            if r.label in index:
                out[j] = index[r.label]
                continue
            value = numeric_value(r.label)
            if self.declared and value in by_value:
                out[j] = by_value[value]   # "1.0" is the given label "1"
                continue
            if self.declared:
                known = f"the labels given are {describe_labels(self.names)}"
            else:
                source = f" {self.source}" if self.source else ""
                known = (f"no row of the training file{source} has it "
                         f"({len(self.names)} labels)")
                if value in by_value:
                    known += ("; it is the number of a training label written another way: "
                              "write numeric labels one way in both files, or set data.labels "
                              "(a numeric label is then matched by its value)")
            raise DataError(f"{path}:{r.line}:1: unknown label {describe_label(r.label)}; "
                            f"{known}")
        return out


def check_label_sets(train: LabelMap, eval_rows: Sequence[TsvRow], train_path, eval_path,
                     train_rows: Sequence[TsvRow] = ()) -> None:
    """The eval file must use exactly the training labels (else accuracy means something else).
    A missing label is shown when it was given (`train.declared`), else named by the first
    training row that has it."""
    ids = train.ids(eval_rows, eval_path)   # an eval label unknown to training: names its line
    present = {train.names[i] for i in ids}
    missing = [n for n in train.names if n not in present]
    if not missing:
        return
    if train.declared:
        raise DataError(f"the label sets differ: {eval_path} has no row with the given "
                        f"label(s) {describe_labels(missing)}")
    first = next((r.line for r in train_rows if r.label in set(missing)), None)
    where = f" (the first training row with one: {train_path}:{first}:1)" if first else ""
    raise DataError(f"the label sets differ: {eval_path} has no row with {len(missing)} of the "
                    f"{len(train.names)} labels of {train_path}{where}")


# ----------------------------------------------------------------------------- tokenizer


def tokenizer_for_checkpoint(folder: str | os.PathLike | None = None, *,
                             vocab_file: str | os.PathLike | None = None,
                             vocab_size: int | None = None,
                             do_lower_case: bool | None = None
                             ) -> tokenization.WordPieceTokenizer:
    """The WordPiece tokenizer of a checkpoint, with its vocabulary checked against the model.

    Args:
      folder: HF BERT folder; its vocab.txt and tokenizer_config.json (do_lower_case) are used.
      vocab_file: an explicit vocab.txt (instead of, or checked against, the folder's).
      vocab_size: the model's vocab_size (config.json); must equal the vocab's token count.
      do_lower_case: overrides tokenizer_config.json (default True when neither says).

    Raises:
      DataError: no vocab, a vocab of another size than the model's, or an explicit vocab_file
        that differs from the folder's vocab.txt.
    """
    folder_vocab = None if folder is None else pathlib.Path(folder) / "vocab.txt"
    if vocab_file is None:
        if folder_vocab is None or not folder_vocab.is_file():
            raise DataError(f"{folder_vocab or 'no folder'}: no vocab.txt; pass the "
                            "checkpoint's vocab file")
        vocab_file = folder_vocab
    vocab_file = pathlib.Path(vocab_file)
    if not vocab_file.is_file():
        raise DataError(f"{vocab_file}: vocab file not found")
    if folder_vocab is not None and folder_vocab.is_file() and (
            tokenization.vocab_fingerprint(folder_vocab)
            != tokenization.vocab_fingerprint(vocab_file)):
        raise DataError(f"{vocab_file} differs from the checkpoint's {folder_vocab}: token ids "
                        "would not mean what the model learnt")
    if do_lower_case is None:
        do_lower_case = True
        cfg = None if folder is None else pathlib.Path(folder) / "tokenizer_config.json"
        if cfg is not None and cfg.is_file():
            do_lower_case = bool(json.loads(cfg.read_text()).get("do_lower_case", True))
    try:
        tokenizer = tokenization.WordPieceTokenizer(vocab_file, do_lower_case=do_lower_case)
    except ValueError as e:
        raise DataError(str(e)) from e
    if vocab_size is not None:
        check_vocab_size(tokenizer, vocab_size)
    return tokenizer


def check_vocab_size(tokenizer: tokenization.WordPieceTokenizer, vocab_size: int) -> None:
    if tokenizer.vocab_size != vocab_size:
        raise DataError(
            f"{tokenizer.vocab_file} has {tokenizer.vocab_size} tokens but the checkpoint's "
            f"vocab_size is {vocab_size}: the data would be tokenized with a vocabulary the "
            "model was not trained with")


# ----------------------------------------------------------------------------- features


def truncate_seq_pair(a: list, b: list, max_length: int) -> None:
    """BERT's truncation, in place: pop from the longer list (b on ties) until they fit."""
    while len(a) + len(b) > max_length:
        if len(a) > len(b):
            a.pop()
        else:
            b.pop()


def encode_examples(texts_a: Sequence[str], texts_b: Sequence[str] | None,
                    tokenizer: tokenization.WordPieceTokenizer, max_seq_len: int = 128
                    ) -> dict[str, np.ndarray]:
    """input_ids / segment_ids / input_mask, int32 [N, max_seq_len] (see the module docstring)."""
    pair = texts_b is not None
    if max_seq_len < (3 if pair else 2):
        raise DataError(f"max_seq_len={max_seq_len} leaves no room for text after [CLS]/[SEP]")
    n = len(texts_a)
    ids_a = tokenizer.encode_batch(list(texts_a))
    ids_b = tokenizer.encode_batch(list(texts_b)) if pair else [None] * n
    sp = tokenizer.special
    input_ids = np.full((n, max_seq_len), sp.pad, np.int32)
    segment_ids = np.zeros((n, max_seq_len), np.int32)
    input_mask = np.zeros((n, max_seq_len), np.int32)
    for i in range(n):
        a = ids_a[i].tolist()
        if pair:
            b = ids_b[i].tolist()
            truncate_seq_pair(a, b, max_seq_len - 3)
            seq = [sp.cls, *a, sp.sep, *b, sp.sep]
            seg = [0] * (len(a) + 2) + [1] * (len(b) + 1)
        else:
            a = a[:max_seq_len - 2]
            seq = [sp.cls, *a, sp.sep]
            seg = [0] * len(seq)
        input_ids[i, :len(seq)] = seq
        segment_ids[i, :len(seq)] = seg
        input_mask[i, :len(seq)] = 1
    return {"input_ids": input_ids, "segment_ids": segment_ids, "input_mask": input_mask}


def build_features(rows: Sequence[TsvRow], tokenizer: tokenization.WordPieceTokenizer,
                   labels: LabelMap, path: str | os.PathLike, max_seq_len: int = 128
                   ) -> dict[str, np.ndarray]:
    """The feature dict of a file's rows (see the module docstring)."""
    pair = rows[0].text_b is not None
    features = encode_examples([r.text_a for r in rows],
                               [r.text_b for r in rows] if pair else None, tokenizer,
                               max_seq_len)
    features["label"] = labels.ids(rows, path)
    features["example_id"] = np.arange(len(rows), dtype=np.int32)
    return features


@dataclasses.dataclass
class ClassificationData:
    """Train and eval features of one task and their label map."""

    train: dict[str, np.ndarray]
    eval: dict[str, np.ndarray]
    labels: LabelMap
    sentence_pair: bool
    eval_overlap: int = 0   # eval rows whose text is also in the training file


def label_map_of(train_rows: Sequence[TsvRow], eval_rows: Sequence[TsvRow],
                 train_path: str | os.PathLike, eval_path: str | os.PathLike,
                 labels: Sequence[str] | None = None) -> LabelMap:
    """The label map of a train and an eval file (`load_train_eval`'s `labels`), checked:
    given labels without duplicates and covering every training row; at least two labels;
    the eval file with exactly the training labels. A `DataError` otherwise. Cheap (no
    tokenizer): fine-tuning calls it before any work (`ClassificationTask.count_train_examples`)."""
    if labels is not None:
        label_map = LabelMap(tuple(str(x) for x in labels), declared=True)
        if len(set(label_map.names)) != len(label_map):
            raise DataError(f"labels {describe_labels(label_map.names)} has duplicates")
        values = [numeric_value(n) for n in label_map.names if numeric_value(n) is not None]
        if len(set(values)) != len(values):
            raise DataError(f"labels {describe_labels(label_map.names)} name one number twice "
                            "(written two ways); give each label once")
        label_map.ids(train_rows, train_path)
    else:
        label_map = LabelMap.from_rows(train_rows, train_path)
    if len(label_map) < 2:
        shown = (describe_labels(label_map.names) if label_map.declared else
                 f"(every row's is {textcheck.describe(label_map.names[0])})")
        raise DataError(f"{train_path}: only one label {shown}; classification needs at "
                        "least two")
    check_label_sets(label_map, eval_rows, train_path, eval_path, train_rows)
    return label_map


def load_train_eval(train_path: str | os.PathLike, eval_path: str | os.PathLike,
                    tokenizer: tokenization.WordPieceTokenizer, *, max_seq_len: int = 128,
                    labels: Sequence[str] | None = None, header: bool | None = None
                    ) -> ClassificationData:
    """Reads, checks and encodes a train and an eval file.

    `labels` fixes the label order (class ids); by default the training file's labels, numeric
    ones in numeric order. The eval file must use the same label set and the same layout
    (single sentence or pair) as the training file, and must not be the training file
    (`check_eval_file`); eval rows whose text is also in the training file are counted
    (`eval_overlap`, a WARNING). `header`: see `read_tsv`.
    """
    check_eval_file(train_path, eval_path)
    train_rows = read_tsv(train_path, header=header)
    eval_rows = read_tsv(eval_path, header=header)
    label_map = label_map_of(train_rows, eval_rows, train_path, eval_path, labels)
    pair = train_rows[0].text_b is not None
    if (eval_rows[0].text_b is not None) != pair:
        raise DataError(f"{eval_path}: {'pairs' if not pair else 'single sentences'} but "
                        f"{train_path} has {'pairs' if pair else 'single sentences'}")
    overlap = eval_overlap(train_rows, eval_rows)
    if overlap:
        logging.warning(
            "%s: %d of %d evaluation rows (%.1f %%) have a text that also occurs verbatim in "
            "the training file %s; the evaluation metrics are not fully held-out",
            eval_path, overlap, len(eval_rows), 100.0 * overlap / len(eval_rows), train_path)
    return ClassificationData(
        train=build_features(train_rows, tokenizer, label_map, train_path, max_seq_len),
        eval=build_features(eval_rows, tokenizer, label_map, eval_path, max_seq_len),
        labels=label_map, sentence_pair=pair, eval_overlap=overlap)

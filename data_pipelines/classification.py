"""Sentence and sentence-pair classification data: `label<TAB>text[<TAB>text_b]` files -> features.

    tokenizer = classification.tokenizer_for_checkpoint(HF_FOLDER, vocab_size=config.vocab_size)
    data = classification.load_train_eval(TRAIN_TSV, EVAL_TSV, tokenizer, max_seq_len=128)
    data.train["input_ids"]    # int32 [N, 128]; data.labels.names: class id -> label

A first line whose first column is "label" is a header (skipped), as in
../shared/data/sentiment/*.tsv.

Features (one row per example, in file order), BERT's layout:

    input_ids    int32 [N, S]  [CLS] a [SEP] (b [SEP]) [PAD]...
    segment_ids  int32 [N, S]  0 for [CLS] a [SEP], 1 for b [SEP], 0 on padding
    input_mask   int32 [N, S]  1 on real tokens
    label        int32 [N]     index into `LabelMap.names`
    example_id   int32 [N]     0-based row in the file: with the run's secret key it names the
                               example's dχ release (`dpbert.input_privacy`)

Truncation is BERT's `truncate_seq_pair`: drop the last token of the longer of the two texts
until the pair fits (ties drop from text_b), so a gets the extra token when the total is odd.
(`transformers`' "longest_first" splits ties the other way round: the two agree whenever at
most one text needs cutting.)

Tokenization is `data_pipelines.tokenization.WordPieceTokenizer` (HF `tokenizers`, behaving as
`BertTokenizerFast`); `tokenizer_for_checkpoint` reads the folder's vocab.txt and its
`do_lower_case`, and refuses a vocabulary that does not belong to the checkpoint.

Errors are `DataError`s naming the file and the LINE NUMBER; they never quote the text of a line
(it may be private). Label values are shown only when they look like labels (short, no spaces).
"""

from __future__ import annotations

import dataclasses
import json
import os
import pathlib
from typing import Iterable, Sequence

import numpy as np

from data_pipelines import tokenization


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
    """A label for an error message: itself when it looks like a label, else only its length
    (a misplaced text column must not end up in a log)."""
    if len(label) <= 32 and not any(c.isspace() for c in label):
        return repr(label)
    return f"(a {len(label)}-character value, not shown)"


def describe_labels(labels: Iterable[str]) -> str:
    labels = list(labels)
    if len(labels) <= 20:
        return "[" + ", ".join(describe_label(x) for x in labels) + "]"
    return f"{len(labels)} distinct values (not shown; is the label the first column?)"


HEADER_LABEL = "label"


def read_tsv(path: str | os.PathLike, *, header: bool | None = None) -> list[TsvRow]:
    """Reads `label<TAB>text` or `label<TAB>text_a<TAB>text_b` lines (one layout per file).

    Blank lines are skipped. `header`: whether the first line names the columns; None (the
    default) = yes when its first column is "label" (as in ../shared/data/sentiment/*.tsv).
    Raises `DataError` (file and line number) for a missing or empty file, undecodable bytes, a
    line with another number of columns than 2 or 3 or than the file's first line, and an empty
    label or text.
    """
    path = pathlib.Path(path)
    if not path.is_file():
        raise DataError(f"{path}: file not found")
    rows: list[TsvRow] = []
    columns = None
    first = True
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                line = raw.decode("utf-8")
            except UnicodeDecodeError:
                raise DataError(f"{path}:{number}: not valid UTF-8") from None
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            fields = line.split("\t")
            if first:
                first = False
                is_header = (fields[0].strip().lower() == HEADER_LABEL if header is None
                             else header)
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
    if not rows:
        raise DataError(f"{path}: no examples (the file is empty or has only a header)")
    return rows


# ----------------------------------------------------------------------------- labels


def _label_sort_key(label: str):
    try:
        return (0, float(label), label)
    except ValueError:
        return (1, 0.0, label)


@dataclasses.dataclass(frozen=True)
class LabelMap:
    """Label names, index = class id (numeric labels in numeric order, then the rest sorted)."""

    names: tuple[str, ...]

    @classmethod
    def from_rows(cls, rows: Sequence[TsvRow]) -> "LabelMap":
        return cls(tuple(sorted({r.label for r in rows}, key=_label_sort_key)))

    def __len__(self) -> int:
        return len(self.names)

    def ids(self, rows: Sequence[TsvRow], path: str | os.PathLike) -> np.ndarray:
        """int32 [N] class ids; an unknown label is a `DataError` naming the line."""
        index = {n: i for i, n in enumerate(self.names)}
        out = np.empty(len(rows), np.int32)
        for j, r in enumerate(rows):
            if r.label not in index:
                raise DataError(f"{path}:{r.line}: unknown label {describe_label(r.label)}; the "
                                f"labels are {describe_labels(self.names)}")
            out[j] = index[r.label]
        return out


def check_label_sets(train: LabelMap, eval_rows: Sequence[TsvRow], train_path, eval_path
                     ) -> None:
    """The eval file must use exactly the training labels (else accuracy means something else)."""
    train.ids(eval_rows, eval_path)   # an eval label unknown to training: names its line
    missing = [n for n in train.names if n not in {r.label for r in eval_rows}]
    if missing:
        raise DataError(
            f"the label sets differ: {train_path} has {describe_labels(train.names)} but "
            f"{eval_path} lacks {describe_labels(missing)}")


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


def load_train_eval(train_path: str | os.PathLike, eval_path: str | os.PathLike,
                    tokenizer: tokenization.WordPieceTokenizer, *, max_seq_len: int = 128,
                    labels: Sequence[str] | None = None, header: bool | None = None
                    ) -> ClassificationData:
    """Reads, checks and encodes a train and an eval file.

    `labels` fixes the label order (class ids); by default the training file's labels, numeric
    ones in numeric order. The eval file must use the same label set and the same layout
    (single sentence or pair) as the training file. `header`: see `read_tsv`.
    """
    train_rows = read_tsv(train_path, header=header)
    eval_rows = read_tsv(eval_path, header=header)
    if labels is not None:
        label_map = LabelMap(tuple(str(x) for x in labels))
        if len(set(label_map.names)) != len(label_map):
            raise DataError(f"labels {describe_labels(label_map.names)} has duplicates")
        label_map.ids(train_rows, train_path)
    else:
        label_map = LabelMap.from_rows(train_rows)
    if len(label_map) < 2:
        raise DataError(f"{train_path}: only one label {describe_labels(label_map.names)}; "
                        "classification needs at least two")
    check_label_sets(label_map, eval_rows, train_path, eval_path)
    pair = train_rows[0].text_b is not None
    if (eval_rows[0].text_b is not None) != pair:
        raise DataError(f"{eval_path}: {'pairs' if not pair else 'single sentences'} but "
                        f"{train_path} has {'pairs' if pair else 'single sentences'}")
    return ClassificationData(
        train=build_features(train_rows, tokenizer, label_map, train_path, max_seq_len),
        eval=build_features(eval_rows, tokenizer, label_map, eval_path, max_seq_len),
        labels=label_map, sentence_pair=pair)

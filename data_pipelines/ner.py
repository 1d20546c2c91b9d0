"""Token-classification (NER) data: documents of BIO-tagged sentences, CoNLL BIO files,
first-WordPiece labelling, 128-piece windows, and k-fold splits by document. The i2b2-2010-shaped
synthetic set is `data_pipelines.synthetic_ner`.

    docs = synthetic_ner.generate_i2b2_like(170, seed=0)     # or ner.read_conll(paths)
    for train_idx, test_idx in ner.kfold_documents(docs, k=5, seed=0):
        train = ner.encode_documents([docs[i] for i in train_idx], tokenizer, ner.I2B2_TAGS)
        test = ner.encode_documents([docs[i] for i in test_idx], tokenizer, ner.I2B2_TAGS)
        ...  # train on train.features; predict tags [N, S] on test.features
        words = ner.word_predictions(pred, test)             # doc -> sentence -> tags
        report = ner_metrics.entity_f1(ner.gold_tags(test_docs), flatten(words))

## CoNLL files

`read_conll`: one `token<space or TAB>...<TAB>tag` per line (the first column is the word, the
last the tag, so CoNLL-2003's 4-column layout reads too), a blank line between sentences, and
`-DOCSTART-` lines between documents, in any case (`-docstart-` of a lower-cased copy too;
CoNLL-2003 and most readers write and match the upper-case form). A file without them is one
document, which a WARNING says when it has more than one sentence: the document is the
fine-tuning privacy unit, so such a file is one example. Tags must be `O`
or `<B|I|E|S>-<type>`. Files are read under the byte-level rules of every text reader
(`data_pipelines.textcheck`: gzip read, a UTF-8 byte-order mark skipped and said, bytes that
are not UTF-8 and control characters other than tab and CR refused with line and column).
Errors name the file, line and column, never a word or a tag read from the file (a name in the
tag column, a word of a note given as CoNLL): a bad tag is described by its length and classes
of characters. A tag set given by the caller (`tags=`, data.labels) is public and shown.
`document_overlap` counts evaluation documents whose words also make a training document.

## Examples

Each word is labelled at its FIRST WordPiece; other pieces, [CLS], [SEP] and padding get -100
(`IGNORE_LABEL`). A unit (a sentence, or a whole document with `unit="document"`) longer than
`max_seq_len - 2` pieces is cut into windows of that many pieces every `stride` (64) pieces, so
neighbouring windows overlap. Every window is labelled for training; for evaluation each word
is scored once, in the window where its first piece has the most context on both sides
(`word_index`), and `word_predictions` maps piece-level predictions back to word-level tags
(`word_predictions(features["labels"])` gives back the gold tags exactly).

Windows of one unit share its `example_id` and give each piece its offset in the unit as
`position_ids`, so a dχ release (`dpbert.privacy.input_privacy`) privatizes a token in an overlap once,
not once per window.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
from typing import Iterable, Sequence

import numpy as np
from absl import logging

from data_pipelines import textcheck, tokenization
from data_pipelines.classification import DataError, describe_label, describe_labels
from data_pipelines import ner_metrics

TYPES = ("problem", "test", "treatment")
I2B2_TAGS = ("O", "B-problem", "I-problem", "B-test", "I-test", "B-treatment", "I-treatment")
IGNORE_LABEL = -100
DOCSTART = "-DOCSTART-"


@dataclasses.dataclass(frozen=True)
class Sentence:
    words: tuple[str, ...]
    tags: tuple[str, ...]

    def __post_init__(self):
        if len(self.words) != len(self.tags):
            raise ValueError(f"{len(self.words)} words but {len(self.tags)} tags")


@dataclasses.dataclass(frozen=True)
class Document:
    doc_id: str
    sentences: tuple[Sentence, ...]

    @property
    def num_words(self) -> int:
        return sum(len(s.words) for s in self.sentences)


def entity_counts(documents: Iterable[Document]) -> dict[str, int]:
    """Entities per type (conlleval rules)."""
    counts: dict[str, int] = {}
    for doc in documents:
        for s in doc.sentences:
            for kind, _, _ in ner_metrics.get_entities(s.tags):
                counts[kind] = counts.get(kind, 0) + 1
    return dict(sorted(counts.items()))


# ----------------------------------------------------------------------------- CoNLL files


def is_docstart(word: str) -> bool:
    """Whether a line's first column is the document separator `-DOCSTART-`, in any case: a
    lower-cased copy of a CoNLL-2003 file has `-docstart-`, which must not become a word of a
    document (tagged O) that then runs into the next one."""
    return word.upper() == DOCSTART


# (file, size, mtime) of the files already reported as one document.
_SAID_ONE_DOCUMENT: set[tuple] = set()


def _say_one_document(path: pathlib.Path, sentences: int) -> str:
    message = (f"{path}: no {DOCSTART} line, so the whole file ({sentences} sentences) is ONE "
               "document: one example and one privacy unit (a fine-tuning unit is a document); "
               f"put a '{DOCSTART} O' line before each document")
    try:
        st = path.stat()
        key = (str(path.absolute()), st.st_size, st.st_mtime_ns)
    except OSError:
        key = (str(path.absolute()),)
    if key not in _SAID_ONE_DOCUMENT:
        _SAID_ONE_DOCUMENT.add(key)
        logging.warning("%s", message)
    return message


def read_conll(paths: str | os.PathLike | Sequence[str | os.PathLike], *,
               tags: Sequence[str] | None = None, tags_from: str = "",
               min_documents: int = 1) -> list[Document]:
    """Documents of CoNLL-style BIO files (module docstring).

    tags: the allowed tag set. When it was given by the user (data.labels) it is shown in the
      message for a tag outside it; `tags_from` names instead where a set read from data comes
      from (e.g. "the training documents of train.conll"): that set is then not shown.
    min_documents: the fewest documents the files must hold together when one of them has no
      `-DOCSTART-` line (a DataError saying that such a file is one document); a file without
      one and with more than one sentence is said in a WARNING whatever this is.
    """
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    allowed = None if tags is None else set(tags)
    docs: list[Document] = []
    undivided: list[str] = []   # the one-document messages of files without -DOCSTART-
    for path in map(pathlib.Path, paths):
        if not path.is_file():
            raise DataError(f"{path}: file not found")
        file_docs: list[list[Sentence]] = []
        current: list[Sentence] = []
        words: list[str] = []
        labels: list[str] = []
        saw_docstart = False

        def end_sentence():
            if words:
                current.append(Sentence(tuple(words), tuple(labels)))
                words.clear()
                labels.clear()

        number = 0
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
                fields = line.split()
                if not fields:
                    end_sentence()
                    continue
                if is_docstart(fields[0]):
                    end_sentence()
                    if current:
                        file_docs.append(current)
                    current = []
                    saw_docstart = True
                    continue
                if len(fields) < 2:
                    raise DataError(f"{path}:{number}: expected 'token<space or TAB>tag', found "
                                    "one column")
                tag = fields[-1]
                at = f"{path}:{number}:{len(line.rstrip()) - len(tag) + 1}"
                try:
                    ner_metrics.split_tag(tag)
                except ValueError:
                    raise DataError(f"{at}: tag {describe_label(tag)} is not 'O' or "
                                    "'<B|I|E|S>-<type>' (is the tag the last column?)") from None
                if allowed is not None and tag not in allowed:
                    where = (f"does not occur in {tags_from}" if tags_from else
                             f"is not in the tag set {describe_labels(sorted(allowed))}")
                    raise DataError(f"{at}: tag {describe_label(tag)} {where}")
                words.append(fields[0])
                labels.append(tag)
        end_sentence()
        if current:
            file_docs.append(current)
        if not file_docs:
            raise DataError(f"{path}: no sentences (the file is empty)")
        if not saw_docstart and len(file_docs[0]) > 1:
            undivided.append(_say_one_document(path, len(file_docs[0])))
        for k, sentences in enumerate(file_docs):
            doc_id = f"{path.name}#{k}" if saw_docstart else path.name
            docs.append(Document(doc_id, tuple(sentences)))
    if undivided and len(docs) < min_documents:
        raise DataError(f"{undivided[0]}; at least {min_documents} documents are needed, "
                        f"{len(docs)} found")
    return docs


def document_overlap(train: Sequence[Document], test: Sequence[Document]) -> int:
    """How many `test` documents have exactly the words (sentence by sentence) of a `train`
    document (tags not compared)."""
    seen = {tuple(s.words for s in d.sentences) for d in train}
    return sum(tuple(s.words for s in d.sentences) in seen for d in test)


def write_conll(path: str | os.PathLike, documents: Iterable[Document]) -> int:
    """Writes documents as CoNLL (`-DOCSTART-` between documents, `word tag` lines); returns
    how many documents."""
    n = 0
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="utf-8") as f:
        for doc in documents:
            f.write(f"{DOCSTART} -X- -X- O\n\n")
            for s in doc.sentences:
                for w, t in zip(s.words, s.tags):
                    if not w or any(c.isspace() for c in w):
                        raise ValueError(f"{doc.doc_id}: a word is empty or contains whitespace")
                    if is_docstart(w):
                        raise ValueError(f"{doc.doc_id}: a word is the document separator "
                                         f"{DOCSTART} (in some case); it would be read back as "
                                         "one")
                    f.write(f"{w} {t}\n")
                f.write("\n")
            n += 1
    return n


def tag_names(documents: Iterable[Document]) -> tuple[str, ...]:
    """The tag set of documents: O, then per type (sorted) its B, I, E, S tags present."""
    seen = {t for d in documents for s in d.sentences for t in s.tags}
    order = {"B": 0, "I": 1, "E": 2, "S": 3}
    rest = sorted((t for t in seen if t != "O"),
                  key=lambda t: (ner_metrics.split_tag(t)[1], order[ner_metrics.split_tag(t)[0]]))
    return ("O", *rest)


# ----------------------------------------------------------------------------- folds


def document_fold(doc: Document, k: int, seed: int = 0) -> int:
    """The fold (0..k-1) of a document: a hash of (seed, its content), so a document's fold
    never depends on the other documents (removing one moves no other between train and test)."""
    h = hashlib.sha256(f"fold:{seed}:{k}:".encode())
    for sentence in doc.sentences:
        h.update(("\x1e".join(sentence.words) + "\x1f" + "\x1e".join(sentence.tags)
                  + "\x1d").encode())
    return int.from_bytes(h.digest()[:8], "little") % k


def kfold_documents(docs: Sequence[Document], k: int = 5, *, seed: int = 0
                    ) -> list[tuple[np.ndarray, np.ndarray]]:
    """k (train, test) splits of document indices: every document is in the test part of
    exactly one fold, `document_fold` (a hash of its content, not its position: the held-out
    membership of a document does not depend on which other documents exist); seeded. Folds are
    balanced in expectation, not exactly.

    Raises:
      ValueError: k < 2, fewer documents than folds, or a fold without a document.
    """
    if not isinstance(k, int) or isinstance(k, bool) or k < 2:
        raise ValueError(f"k must be an integer >= 2, got {k!r}")
    if len(docs) < k:
        raise ValueError(f"{len(docs)} documents cannot be split into {k} folds")
    fold = np.asarray([document_fold(d, k, seed) for d in docs], np.int64)
    folds = []
    for f in range(k):
        test = np.flatnonzero(fold == f)
        if not test.size:
            raise ValueError(f"{len(docs)} documents left fold {f} of {k} empty (folds are "
                             "drawn by a hash of each document); use fewer folds")
        folds.append((np.flatnonzero(fold != f), test))
    return folds


# ----------------------------------------------------------------------------- features


@dataclasses.dataclass
class NerFeatures:
    """Windows of a list of documents, and how to map predictions back to words.

    features: input_ids / segment_ids / input_mask / labels / position_ids int32 [N, S],
      example_id int32 [N] (the unit a window belongs to).
    word_index: int32 [N, S], the word (numbered over all documents in order) scored at this
      piece, -1 where none is.
    sentence_lengths: per document, the number of words of each sentence.
    tag_names: class id -> tag.
    """

    features: dict[str, np.ndarray]
    word_index: np.ndarray
    sentence_lengths: list[list[int]]
    tag_names: tuple[str, ...]

    @property
    def num_words(self) -> int:
        return sum(sum(x) for x in self.sentence_lengths)


def _word_pieces(words: Iterable[str], tokenizer: tokenization.WordPieceTokenizer
                 ) -> dict[str, list[int]]:
    unique = sorted(set(words))
    out = {}
    for w, ids in zip(unique, tokenizer.encode_batch(unique)):
        out[w] = ids.tolist() or [tokenizer.special.unk]   # a word must keep a piece
    return out


def _windows(length: int, size: int, stride: int) -> list[int]:
    """Window starts covering 0..length-1 with windows of `size`, every `stride` pieces."""
    if length <= size:
        return [0]
    return sorted(set(range(0, length - size, stride)) | {length - size})


def encode_documents(documents: Sequence[Document], tokenizer: tokenization.WordPieceTokenizer,
                     tags: Sequence[str], *, max_seq_len: int = 128, stride: int = 64,
                     unit: str = "sentence") -> NerFeatures:
    """Windows with first-WordPiece labels (module docstring).

    unit: "sentence" (a sentence is an example, split into windows only when too long) or
      "document" (a document's pieces are windowed as one stream).
    """
    if unit not in ("sentence", "document"):
        raise ValueError(f"unit must be 'sentence' or 'document', got {unit!r}")
    size = max_seq_len - 2
    if size < 1 or not 0 < stride <= size:
        raise ValueError(f"need max_seq_len >= 3 and 0 < stride <= max_seq_len - 2, got "
                         f"max_seq_len={max_seq_len}, stride={stride}")
    tag_id = {t: i for i, t in enumerate(tags)}
    pieces = _word_pieces((w for d in documents for s in d.sentences for w in s.words), tokenizer)
    sp = tokenizer.special

    units = []        # (piece ids, labels, word numbers) per unit
    lengths = []
    word = 0
    for d in documents:
        lengths.append([len(s.words) for s in d.sentences])
        doc_units = []
        for j, s in enumerate(d.sentences):
            ids, labels, words = [], [], []
            for w, t in zip(s.words, s.tags):
                if t not in tag_id:
                    raise DataError(f"document {d.doc_id}, sentence {j + 1}: tag "
                                    f"{describe_label(t)} is not one of the "
                                    f"{len(tag_id)} tags of the task")
                p = pieces[w]
                ids += p
                labels += [tag_id[t]] + [IGNORE_LABEL] * (len(p) - 1)
                words += [word] + [-1] * (len(p) - 1)
                word += 1
            doc_units.append((ids, labels, words))
        if unit == "document":
            doc_units = [tuple(sum((u[k] for u in doc_units), []) for k in range(3))]
        units += doc_units

    rows = {k: [] for k in ("input_ids", "labels", "position_ids", "word_index", "example_id")}
    for u, (ids, labels, words) in enumerate(units):
        if not ids:
            continue
        starts = _windows(len(ids), size, stride)
        # For each piece, the window in which it has the most context on both sides.
        best = np.full(len(ids), -1)
        best_score = np.full(len(ids), -1)
        for w, s in enumerate(starts):
            offsets = np.arange(s, min(s + size, len(ids)))
            score = np.minimum(offsets - s, s + size - 1 - offsets)
            better = score > best_score[offsets]
            best[offsets[better]] = w
            best_score[offsets[better]] = score[better]
        for w, s in enumerate(starts):
            e = min(s + size, len(ids))
            n = e - s
            row_ids = np.full(max_seq_len, sp.pad, np.int32)
            row_ids[0], row_ids[1:n + 1], row_ids[n + 1] = sp.cls, ids[s:e], sp.sep
            row_labels = np.full(max_seq_len, IGNORE_LABEL, np.int32)
            row_labels[1:n + 1] = labels[s:e]
            row_pos = np.zeros(max_seq_len, np.int32)
            row_pos[1:n + 1] = np.arange(s, e)
            row_words = np.full(max_seq_len, -1, np.int32)
            here = np.asarray(words[s:e]) >= 0
            mine = best[s:e] == w
            row_words[1:n + 1] = np.where(here & mine, np.asarray(words[s:e]), -1)
            for k, v in (("input_ids", row_ids), ("labels", row_labels),
                         ("position_ids", row_pos), ("word_index", row_words),
                         ("example_id", u)):
                rows[k].append(v)
    if not rows["input_ids"]:
        raise DataError("no words to encode (empty documents)")
    input_ids = np.stack(rows["input_ids"])
    mask = (input_ids != sp.pad).astype(np.int32)
    features = {"input_ids": input_ids, "segment_ids": np.zeros_like(input_ids),
                "input_mask": mask, "labels": np.stack(rows["labels"]),
                "position_ids": np.stack(rows["position_ids"]),
                "example_id": np.asarray(rows["example_id"], np.int32)}
    return NerFeatures(features, np.stack(rows["word_index"]), lengths, tuple(tags))


def word_predictions(pred: np.ndarray, encoded: NerFeatures) -> list[list[list[str]]]:
    """Piece-level class ids [N, S] -> tags per document, per sentence, per word."""
    pred = np.asarray(pred)
    if pred.shape != encoded.word_index.shape:
        raise ValueError(f"predictions have shape {pred.shape}, expected "
                         f"{encoded.word_index.shape}")
    flat = np.full(encoded.num_words, -1, np.int64)
    scored = encoded.word_index >= 0
    flat[encoded.word_index[scored]] = pred[scored]
    if (flat < 0).any():
        raise ValueError(f"{int((flat < 0).sum())} words have no prediction")
    names = encoded.tag_names
    out, k = [], 0
    for doc_lengths in encoded.sentence_lengths:
        doc = []
        for n in doc_lengths:
            doc.append([names[int(i)] for i in flat[k:k + n]])
            k += n
        out.append(doc)
    return out


def gold_tags(documents: Iterable[Document]) -> list[list[list[str]]]:
    """Tags per document, per sentence (the shape `word_predictions` returns)."""
    return [[list(s.tags) for s in d.sentences] for d in documents]


def sentences_of(nested: Iterable[Iterable[Sequence[str]]]) -> list[Sequence[str]]:
    """Flattens doc -> sentence -> tags to a list of sentences (for `ner_metrics`)."""
    return [s for doc in nested for s in doc]

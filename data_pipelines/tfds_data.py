"""TFDS: a MIMIC-III NOTEEVENTS builder (manual download) and TFDS corpora as documents.

Everything here runs WITHOUT TensorFlow: TFDS 4.9.10 builds a ``GeneratorBasedBuilder`` with
``file_format="array_record"`` and reads it back with ``tfds.data_source`` (random access, no
``tf.data``) when TensorFlow is not installed.

* ``MimicNoteevents`` (TFDS name ``mimic_noteevents``): features ``text``, ``row_id``,
  ``subject_id``, ``hadm_id`` (-1 when empty), ``category``; one ``train`` split (the held-out
  split is made by ``pretraining.build_datasets`` by document or subject). Built from the user's
  ``NOTEEVENTS.csv.gz`` (or ``.csv``) with ``corpora.read_noteevents`` (bad rows counted and
  skipped), one example per ROW_ID (a repeated ROW_ID is refused, or its identical copies
  merged with ``duplicate_ids="merge_identical"``: ``identity``; TFDS would otherwise fail on
  the duplicated example key). ``prepare_noteevents(path_or_dir, data_dir)`` builds it.
* ``tfds_documents(name, ...)``: documents from any prepared TFDS dataset with a text feature
  (``mimic_noteevents``, ``wikipedia/20230601.en``, a BookCorpus prepared as TFDS, ...). Either
  one example = one document (split into sentences), or one example = one sentence with
  ``sentences_per_document`` consecutive sentences grouped into a document (BookCorpus copies
  that come as sentences). Text features follow the byte-level rules of every text reader
  (``data_pipelines.textcheck``): a leading UTF-8 byte-order mark is dropped (and counted), a
  record whose text holds bytes that are not UTF-8 or a control character (other than tab,
  newline, CR) is skipped and counted, and more than ``max_bad_fraction`` of them is an error
  naming the first one's record, line and column (never its text).

CLI: ``python -m data_pipelines.tfds_data --noteevents=/path/NOTEEVENTS.csv.gz
--data_dir=~/tensorflow_datasets``.
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator

import numpy as np
import tensorflow_datasets as tfds
from absl import logging
from tensorflow_datasets.core import utils as tfds_utils

from data_pipelines import corpora, documents, identity, sentences, textcheck

NOTEEVENTS_NAME = "mimic_noteevents"
_NOTEEVENTS_FILES = ("NOTEEVENTS.csv.gz", "NOTEEVENTS.csv")


class DataNotPreparedError(FileNotFoundError):
    """A TFDS dataset is not prepared in the data directory (it cannot be downloaded here)."""


class MimicNoteevents(tfds.core.GeneratorBasedBuilder):
    """MIMIC-III clinical notes (NOTEEVENTS), one example per usable note."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "First release: text, row_id, subject_id, hadm_id, category."}
    # A ROW_ID that occurs twice in the file: "refuse" or "merge_identical" (keep the first of
    # identical copies): data_pipelines/identity.py, as the vocabulary and the training data.
    duplicate_ids = "refuse"
    MANUAL_DOWNLOAD_INSTRUCTIONS = """\
MIMIC-III is credentialed-access data and cannot be downloaded automatically.
1. Obtain access on PhysioNet (https://physionet.org/content/mimiciii/1.4/): complete the
   required training and sign the data use agreement.
2. Download NOTEEVENTS.csv.gz (about 1.1 GB compressed) from the MIMIC-III v1.4 files.
3. Put it (or the uncompressed NOTEEVENTS.csv) in the manual directory, by default
   <data_dir>/downloads/manual/, or pass its folder as `manual_dir`, e.g.
     python -m data_pipelines.tfds_data --noteevents=/secure/NOTEEVENTS.csv.gz \\
         --data_dir=/secure/tensorflow_datasets
Keep the prepared dataset under the same access controls as the original file."""

    @tfds_utils.classproperty
    @classmethod
    def code_path(cls):
        """No checksums file: there is nothing to download. (TFDS would otherwise locate this
        module with ``importlib_resources``, which TFDS' own install does not always bring.)"""
        return None

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description="MIMIC-III v1.4 NOTEEVENTS: de-identified clinical notes with the "
                        "patient (SUBJECT_ID) and admission (HADM_ID) of each note.",
            features=tfds.features.FeaturesDict({
                "text": tfds.features.Text(),
                "row_id": np.int64,
                "subject_id": np.int64,
                "hadm_id": np.int64,  # -1 when the note has no admission
                "category": tfds.features.Text(),
            }),
            homepage="https://physionet.org/content/mimiciii/1.4/",
            citation="Johnson, A. E. W. et al. MIMIC-III, a freely accessible critical care "
                     "database. Scientific Data 3, 160035 (2016).",
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        manual = dl_manager.manual_dir
        for name in _NOTEEVENTS_FILES:
            path = manual / name
            if path.exists():
                return {"train": self._generate_examples(os.fspath(path))}
        raise DataNotPreparedError(
            f"none of {', '.join(_NOTEEVENTS_FILES)} found in the manual directory {manual}.\n"
            f"{self.MANUAL_DOWNLOAD_INSTRUCTIONS}")

    def _generate_examples(self, path: str):
        # realpath: messages name the user's file, not the link in the manual directory.
        for note in identity.unique_notes(os.path.realpath(path), rule=self.duplicate_ids):
            yield note.row_id, {
                "text": note.text,
                "row_id": note.row_id,
                "subject_id": note.subject_id,
                "hadm_id": -1 if note.hadm_id is None else note.hadm_id,
                "category": note.category,
            }


def prepare_noteevents(noteevents: str | os.PathLike, data_dir: str | os.PathLike,
                       duplicate_ids: str = "refuse") -> str:
    """Builds ``mimic_noteevents`` (array_record) in ``data_dir`` from a NOTEEVENTS file (any
    name) or the folder holding ``NOTEEVENTS.csv(.gz)``; returns the dataset directory. Does
    nothing if it is already built. A ROW_ID that occurs twice is refused (``identity``), or
    with ``duplicate_ids="merge_identical"`` its identical copies are written once."""
    identity.check_rule(duplicate_ids)
    path = os.path.abspath(os.fspath(noteevents))
    with tempfile.TemporaryDirectory() as tmp:
        if os.path.isdir(path):
            manual_dir = path
        elif os.path.isfile(path):
            manual_dir = os.path.dirname(path)
            if os.path.basename(path) not in _NOTEEVENTS_FILES:
                # TFDS looks the file up by name in its manual directory: link it under it.
                manual_dir = tmp
                name = _NOTEEVENTS_FILES[0] if path.endswith(".gz") else _NOTEEVENTS_FILES[1]
                os.symlink(path, os.path.join(tmp, name))
        else:
            raise documents.CorpusNotFoundError(f"NOTEEVENTS file not found: {path!r}")
        builder = MimicNoteevents(data_dir=os.fspath(data_dir), file_format="array_record")
        builder.duplicate_ids = duplicate_ids
        builder.download_and_prepare(
            download_config=tfds.download.DownloadConfig(manual_dir=manual_dir))
    return os.fspath(builder.data_dir)


def _resolve_data_dir(data_dir: str | None) -> str:
    return os.path.expanduser(data_dir or os.environ.get("TFDS_DATA_DIR", "")
                              or tfds.core.constants.DATA_DIR)


def load_data_source(name: str, *, split: str = "train", data_dir: str | None = None):
    """``tfds.data_source`` for a dataset that must already be prepared (never downloads).

    Raises:
      DataNotPreparedError: naming the dataset, the split and the directory, with how to
        prepare it.
    """
    root = _resolve_data_dir(data_dir)
    # "wikipedia/20230601.en:1.0.0" lives in <root>/wikipedia/20230601.en/1.0.0/; checking the
    # folder first means TFDS never tries to download or to reach the network.
    base = re.sub(r":\d+\.\d+\.\d+$", "", name)
    dataset_dir = os.path.join(root, *re.split(r"[:/]", base))
    how = (f"prepare it on a machine with network access and copy it there, e.g. "
           f"`tfds build {base} --data_dir={root}` (wikipedia needs apache-beam), or for "
           f"{NOTEEVENTS_NAME}: `python -m data_pipelines.tfds_data --noteevents=... "
           f"--data_dir={root}`; then point data.tfds_data_dir at {root}")
    if not os.path.isdir(dataset_dir):
        raise DataNotPreparedError(
            f"TFDS dataset {name!r} is not prepared in {root} (no folder {dataset_dir}); {how}")
    try:
        return tfds.data_source(name, split=split, data_dir=root, download=False)
    except Exception as e:  # TFDS raises several types (not found, bad split, no files)
        raise DataNotPreparedError(
            f"cannot open TFDS dataset {name!r} split {split!r} in {root}: {e}; {how}") from e


def _text(value) -> str:
    """A text feature as str; bytes that are not UTF-8 become lone surrogates that
    ``textcheck.bad_char`` finds (never silently replaced)."""
    return (value.decode("utf-8", errors="surrogateescape") if isinstance(value, bytes)
            else str(value))


class _RecordCheck:
    """The byte-level rules on the text of TFDS records: counts, the first bad one's position,
    and the end-of-read verdict (as ``corpora``'s readers: skip and count, refuse above
    ``max_bad_fraction``)."""

    def __init__(self, name: str, split: str, max_bad_fraction: float):
        corpora._check_fraction(max_bad_fraction)
        self.where = f"TFDS dataset {name!r} split {split!r}"
        self.max_bad_fraction = max_bad_fraction
        self.read = self.bad = self.boms = 0
        self.first = ""

    def text(self, index: int, value) -> str | None:
        """The record's text, or None (counted) when it breaks the rules."""
        text = _text(value)
        self.read += 1
        if text.startswith("\ufeff"):
            text = text[1:]
            self.boms += 1
        bad = textcheck.bad_char(text)
        if bad is None:
            return text
        self.bad += 1
        if not self.first:
            at = bad[0]
            line = text.count("\n", 0, at) + 1
            column = at - (text.rfind("\n", 0, at) + 1) + 1
            self.first = f"record {index}, line {line}, column {column}: {bad[1]}"
        return None

    def finish(self) -> None:
        if self.boms:
            logging.warning("%s: dropped the UTF-8 byte-order mark at the start of %d "
                            "record(s)", self.where, self.boms)
        if not self.bad:
            return
        share = f"{self.bad} of {self.read} records ({100.0 * self.bad / self.read:.1f} %)"
        if self.bad > self.max_bad_fraction * self.read:
            raise corpora.CorpusError(
                f"{self.where}: {share} hold bytes that are not UTF-8 or control characters, "
                f"more than the {100.0 * self.max_bad_fraction:g} % allowed "
                f"(max_bad_fraction); the first is {self.first}")
        logging.warning("%s: skipped %s with bytes that are not UTF-8 or control characters "
                        "(the first: %s)", self.where, share, self.first)


def _read_in_order(source, chunk: int) -> Iterator[dict]:
    """All records of a TFDS data source in index order (the order TFDS wrote them).

    Chunked ``__getitems__`` reads: this one-pass offline scan measured 2-3x faster than a
    grain ``MapDataset.source(...).to_iter_dataset()`` loop (per-record overhead; the
    decoding is Python-bound, so reader threads do not help). Shuffling, sharding and
    prefetching of the training examples use grain (``datasets.prefetch``).
    """
    n = len(source)
    for start in range(0, n, chunk):
        yield from source.__getitems__(list(range(start, min(n, start + chunk))))


def tfds_documents(name: str, *, split: str = "train", data_dir: str | None = None,
                   text_key: str = "text", sentences_per_document: int = 0,
                   max_documents: int = 0, max_sentence_chars: int = 1000,
                   chunk: int = 256,
                   max_bad_fraction: float = corpora.DEFAULT_MAX_BAD_FRACTION
                   ) -> Iterator[documents.Document]:
    """Documents from a prepared TFDS dataset, read through ``tfds.data_source``.

    Args:
      name: TFDS name (``mimic_noteevents``, ``wikipedia/20230601.en``, ...).
      text_key: the text feature.
      sentences_per_document: 0 = each example is a document (split into sentences with
        ``sentences.split_sentences``); k > 0 = each example is one sentence and k consecutive
        examples form a document (sentence-level BookCorpus copies).
      max_documents: stop after this many documents (0 = all).
      chunk: records per read.
      max_bad_fraction: the largest share of records whose text breaks the byte-level rules
        (skipped and counted) before the read fails (checked when the iteration ends).

    Yields:
      ``documents.Document``; SUBJECT_ID and ROW_ID are used when the dataset has
      ``subject_id`` / ``row_id`` features, else -1 and ``documents.content_key`` of the
      sentences (never the position in the dataset: removing one record changes no other key).
    """
    source = load_data_source(name, split=split, data_dir=data_dir)
    n = len(source)
    if n == 0:
        raise DataNotPreparedError(f"TFDS dataset {name!r} split {split!r} is empty")
    records = _read_in_order(source, chunk)
    check = _RecordCheck(name, split, max_bad_fraction)
    produced = 0
    if sentences_per_document > 0:
        doc: list[str] = []
        for i, record in enumerate(records):
            text = check.text(i, record[text_key])
            text = " ".join(text.split()) if text is not None else ""
            if text:
                doc.append(text)
            if len(doc) == sentences_per_document or (i == n - 1 and doc):
                yield documents.Document(sentences=doc, key=documents.content_key(doc))
                produced += 1
                doc = []
                if max_documents and produced >= max_documents:
                    break
        check.finish()
        return
    for i, record in enumerate(records):
        if text_key not in record:
            raise KeyError(f"TFDS dataset {name!r} has no feature {text_key!r} "
                           f"(features: {sorted(record)})")
        text = check.text(i, record[text_key])
        if text is None:
            continue
        sents = sentences.split_sentences(text, max_chars=max_sentence_chars)
        if not sents:
            continue
        yield documents.Document(
            sentences=sents,
            subject_id=int(record.get("subject_id", documents.NO_SUBJECT)),
            key=(int(record["row_id"]) if "row_id" in record
                 else documents.content_key(sents)))
        produced += 1
        if max_documents and produced >= max_documents:
            break
    check.finish()


def main(argv: list[str] | None = None) -> None:
    """CLI: builds the mimic_noteevents TFDS dataset from a NOTEEVENTS file."""
    import argparse  # noqa: PLC0415 - CLI only

    parser = argparse.ArgumentParser(description="Build the mimic_noteevents TFDS dataset "
                                                 "(array_record, no TensorFlow needed).")
    parser.add_argument("--noteevents", required=True,
                        help="NOTEEVENTS.csv.gz / NOTEEVENTS.csv, or the folder holding it")
    parser.add_argument("--data_dir", default=_resolve_data_dir(None))
    parser.add_argument("--duplicate_ids", choices=identity.RULES, default=identity.DEFAULT_RULE,
                        help="a ROW_ID that occurs twice: refuse, or keep one of identical "
                             "copies (merge_identical)")
    args = parser.parse_args(argv)
    from data_pipelines import corpora  # noqa: PLC0415

    try:
        print(prepare_noteevents(args.noteevents, args.data_dir, args.duplicate_ids))
    except (corpora.CorpusError, documents.CorpusNotFoundError, DataNotPreparedError) as e:
        raise SystemExit(f"tfds_data: {e}") from None


if __name__ == "__main__":
    main()

"""BERT pretraining data, end to end: ``build_datasets(data_config, vocab_file)``.

Wires corpus reading (``documents``), sentence splitting, tokenization and the held-out split
(``tokenized_corpus``), an optional canary stage (``canaries``), instance creation (``instances``) and the
instance cache together, and returns random-access datasets with online masking
(``datasets``). The stages, as google-research/bert keeps them: offline instance creation (once
per fingerprint of corpus files, vocab and parameters, cached on disk) and online masking at
every load. The ``data`` section of an experiment config (every field documented in
``configs/common.py``) drives it.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import ml_collections
import numpy as np

from data_pipelines import identity, note_cache, tokenization
from data_pipelines.tokenized_corpus import heldout_draw, tokenize_and_split
from data_pipelines.datasets import PretrainingDataset
from data_pipelines.documents import NO_SUBJECT
from data_pipelines.instances import (INSTANCES_FORMAT_VERSION, InstanceParams, Instances,
                                      create_instances, unit_multiplicities)
from data_pipelines.masking import MaskingParams
from data_pipelines.unit_instances import unit_ids
from dpbert.core import units as privacy_units

_log = logging.getLogger(__name__)

CORPUS_KINDS = ("text", "noteevents", "synthetic", "tfds")


def check_config(cfg: ml_collections.ConfigDict, privacy_unit: str = "example") -> None:
    """One clear error per bad field (names the key and the value)."""
    def bad(key: str, why: str) -> ValueError:
        return ValueError(f"data.{key}={cfg.get(key)!r}: {why}")

    if privacy_unit not in privacy_units.NAMES:
        raise ValueError(f"privacy_unit={privacy_unit!r}: must be one of {privacy_units.NAMES}")
    unit = privacy_units.get(privacy_unit)
    if (unit.by_subject and cfg.corpus in ("noteevents", "synthetic")
            and cfg.eval_fraction > 0 and cfg.eval_split_unit != "subject"):
        raise bad("eval_split_unit", f"privacy_unit={unit.name!r} holds out whole patients: set "
                                     "data.eval_split_unit='subject'")

    if cfg.corpus not in CORPUS_KINDS:
        raise bad("corpus", f"must be one of {CORPUS_KINDS}")
    if cfg.max_seq_length < 5:
        raise bad("max_seq_length", "must be >= 5")
    if not 0.0 < cfg.masked_lm_prob < 1.0:
        raise bad("masked_lm_prob", "must be in (0, 1)")
    if cfg.max_predictions_per_seq < 1:
        raise bad("max_predictions_per_seq", "must be >= 1")
    if cfg.max_predictions_per_seq > cfg.max_seq_length - 3:
        raise bad("max_predictions_per_seq", f"must be <= max_seq_length - 3 = "
                                             f"{cfg.max_seq_length - 3}")
    if not 0.0 <= cfg.short_seq_prob <= 1.0:
        raise bad("short_seq_prob", "must be in [0, 1]")
    if cfg.dupe_factor < 1:
        raise bad("dupe_factor", "must be >= 1")
    if not 0.0 <= cfg.eval_fraction < 1.0:
        raise bad("eval_fraction", "must be in [0, 1)")
    if cfg.eval_split_unit not in ("document", "subject"):
        raise bad("eval_split_unit", "must be 'document' or 'subject'")
    if cfg.eval_split_unit == "subject" and cfg.corpus == "text":
        raise bad("eval_split_unit", "plain-text corpora have no subjects; use 'document'")
    if cfg.seed < 0:
        raise bad("seed", "must be >= 0")
    if cfg.max_documents < 0:
        raise bad("max_documents", "must be >= 0 (0 = all)")
    if not (isinstance(cfg.max_bad_fraction, (int, float)) and 0 <= cfg.max_bad_fraction < 1):
        raise bad("max_bad_fraction", "must be in [0, 1)")
    if cfg.get("duplicate_ids", identity.DEFAULT_RULE) not in identity.RULES:
        raise bad("duplicate_ids", f"must be one of {identity.RULES}")
    if isinstance(cfg.paths, str):
        raise bad("paths", "must be a tuple of paths, e.g. ('a.txt',)")
    if cfg.corpus in ("text", "noteevents") and not cfg.paths:
        raise bad("paths", f"the {cfg.corpus} corpus needs its file path(s)")
    if cfg.corpus == "noteevents" and len(cfg.paths) != 1:
        raise bad("paths", "noteevents needs exactly one NOTEEVENTS.csv(.gz) path")
    if cfg.corpus == "synthetic" and cfg.synthetic_num_notes < 2:
        raise bad("synthetic_num_notes", "must be >= 2")
    if cfg.corpus == "tfds" and not cfg.tfds_names:
        raise bad("tfds_names", "give at least one prepared TFDS dataset name")
    if cfg.canaries.enabled and not (cfg.cache_dir or cfg.canaries.output_file):
        raise ValueError("data.canaries.enabled=True needs data.canaries.output_file or "
                         "data.cache_dir (where the canary record is written)")
    if cfg.canaries.enabled and cfg.canaries.file and not os.path.isfile(cfg.canaries.file):
        raise FileNotFoundError(f"data.canaries.file={cfg.canaries.file!r}: file not found")


def _file_identity(path: str) -> dict[str, Any]:
    """Cheap identity of a (possibly huge) file: path, size, mtime and hashes of its ends."""
    st = os.stat(path)
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read(1 << 20))
        if st.st_size > 2 << 20:
            f.seek(-(1 << 20), os.SEEK_END)
            h.update(f.read(1 << 20))
    return {"path": os.path.abspath(path), "size": st.st_size, "mtime_ns": st.st_mtime_ns,
            "ends_sha256": h.hexdigest()}


def _tfds_identity(cfg: ml_collections.ConfigDict) -> list[dict[str, Any]]:
    from data_pipelines import tfds_data  # noqa: PLC0415 - TFDS import only when used

    root = tfds_data._resolve_data_dir(cfg.tfds_data_dir or None)  # noqa: SLF001
    out = []
    for name in cfg.tfds_names:
        folder = os.path.join(root, *name.replace(":", "/").split("/"))
        files = []
        if os.path.isdir(folder):
            for dirpath, _, filenames in sorted(os.walk(folder)):
                for fn in sorted(filenames):
                    st = os.stat(os.path.join(dirpath, fn))
                    files.append([os.path.relpath(os.path.join(dirpath, fn), folder),
                                  st.st_size, st.st_mtime_ns])
        out.append({"name": name, "root": root, "files": files})
    return out


def _corpus_spec(cfg: ml_collections.ConfigDict) -> dict[str, Any]:
    """What identifies the corpus (part of the cache fingerprint); checks files exist."""
    from data_pipelines import documents  # noqa: PLC0415

    spec: dict[str, Any] = {"corpus": cfg.corpus, "max_documents": cfg.max_documents,
                            "max_sentence_chars": cfg.max_sentence_chars}
    if cfg.corpus == "text":
        paths = documents.check_paths(list(cfg.paths), "text")
        spec["files"] = [_file_identity(p) for p in paths]
    elif cfg.corpus == "noteevents":
        paths = documents.check_paths(list(cfg.paths), "noteevents")
        spec["files"] = [_file_identity(p) for p in paths]
        spec["categories"] = sorted(cfg.noteevents_categories)
    elif cfg.corpus == "synthetic":
        spec["synthetic"] = [cfg.synthetic_num_notes, cfg.synthetic_seed]
    else:
        spec["tfds"] = _tfds_identity(cfg)
        spec["tfds_options"] = [cfg.tfds_split, cfg.tfds_text_key,
                                sorted(cfg.tfds_sentence_datasets),
                                cfg.tfds_sentences_per_document,
                                sorted(cfg.noteevents_categories)]
    return spec


def _capped(docs: Iterable[Any], limit: int) -> Iterator[Any]:
    for i, d in enumerate(docs):
        if limit and i >= limit:
            return
        yield d


def _documents(cfg: ml_collections.ConfigDict, read_stats: list,
               identity_summary: dict | None = None,
               note_counts: dict | None = None) -> Iterator[Any]:
    """All documents of the configured corpus, one per identity (ROW_ID, or a text's content:
    ``identity``): repeated ids are refused before the first document is yielded, or their
    identical copies dropped (``data.duplicate_ids``); ``identity_summary`` receives what
    was done, ``note_counts`` how many notes the category filter kept (``documents.
    note_documents``)."""
    from data_pipelines import corpora, documents  # noqa: PLC0415

    limit = cfg.max_documents
    rule = cfg.get("duplicate_ids", identity.DEFAULT_RULE)
    if cfg.corpus == "text":
        yield from _capped(documents.text_documents(
            list(cfg.paths), read_stats, max_bad_fraction=cfg.max_bad_fraction,
            duplicate_ids=rule, identity_summary=identity_summary), limit)
    elif cfg.corpus == "noteevents":
        st = corpora.ReadStats()
        read_stats.append(st)
        yield from _capped(documents.noteevents_documents(
            cfg.paths[0], categories=cfg.noteevents_categories,
            max_sentence_chars=cfg.max_sentence_chars, stats=st,
            max_bad_fraction=cfg.max_bad_fraction, duplicate_ids=rule,
            identity_summary=identity_summary, counts=note_counts), limit)
    elif cfg.corpus == "synthetic":
        yield from documents.synthetic_documents(cfg.synthetic_num_notes,
                                                 seed=cfg.synthetic_seed,
                                                 max_sentence_chars=cfg.max_sentence_chars,
                                                 duplicate_ids=rule,
                                                 identity_summary=identity_summary)
    else:
        from data_pipelines import tfds_data  # noqa: PLC0415

        names = list(cfg.tfds_names)
        if cfg.noteevents_categories and tfds_data.NOTEEVENTS_NAME in names:
            _log.warning("noteevents_categories is not applied to TFDS sources")

        def tfds_docs() -> Iterator[tuple[int, Any]]:
            for i, name in enumerate(names):
                per_doc = (cfg.tfds_sentences_per_document
                           if name in cfg.tfds_sentence_datasets else 0)
                for doc in tfds_data.tfds_documents(
                        name, split=cfg.tfds_split, data_dir=cfg.tfds_data_dir or None,
                        text_key=cfg.tfds_text_key, sentences_per_document=per_doc,
                        max_documents=limit, max_sentence_chars=cfg.max_sentence_chars):
                    yield i, doc

        # Keys are ROW_IDs or content hashes (never positions): the held-out split and the
        # note unit stay the same for every other document when one is removed. One key
        # across all the sets is one document (identity.unique_documents).
        sources = [identity.Source(
            f"TFDS {name}",
            identity.NOTE_IDENTITY if name == tfds_data.NOTEEVENTS_NAME
            else identity.TEXT_IDENTITY, "document") for name in names]
        yield from identity.unique_documents(tfds_docs, sources, rule, identity_summary)


def _instances_fingerprint(cfg: ml_collections.ConfigDict, vocab_file: str,
                           privacy_unit: str = "example") -> str:
    payload = {
        "format": INSTANCES_FORMAT_VERSION,
        "corpus": _corpus_spec(cfg),
        "vocab_sha256": tokenization.vocab_fingerprint(vocab_file),
        "do_lower_case": cfg.do_lower_case,
        "max_seq_length": cfg.max_seq_length,
        "short_seq_prob": cfg.short_seq_prob,
        "dupe_factor": cfg.dupe_factor,
        "eval": [cfg.eval_fraction, cfg.eval_split_unit],
        "seed": cfg.seed,
        "canaries": (cfg.canaries.to_dict() if cfg.canaries.enabled else None),
        # Record identity (duplicated ids refused or merged): entries made before the check
        # existed may hold a duplicated note twice, so every fingerprint names the rule.
        "duplicate_ids": cfg.get("duplicate_ids", identity.DEFAULT_RULE),
    }
    # Absent for a unit of one sequence: the cache keys of "example" stay as they were.
    if privacy_units.get(privacy_unit).per_unit:
        payload["privacy_unit"] = privacy_unit
    if payload["canaries"]:
        payload["canaries"].pop("output_file", None)
        if payload["canaries"].get("file"):
            with open(payload["canaries"]["file"], "rb") as f:
                payload["canaries"]["file"] = hashlib.sha256(f.read()).hexdigest()
    blob = json.dumps(payload, sort_keys=True, default=list).encode()
    return hashlib.sha256(blob).hexdigest()[:20]


def _build_instances(cfg: ml_collections.ConfigDict, tok: tokenization.WordPieceTokenizer,
                     privacy_unit: str = "example",
                     ) -> tuple[Instances, Instances | None, dict[str, Any], list]:
    """Reads, splits, tokenizes, plants canaries and creates instances (the offline stage)."""
    unit = privacy_units.get(privacy_unit)
    read_stats: list = []
    is_eval = None
    if cfg.eval_fraction > 0:
        by_subject = cfg.eval_split_unit == "subject"

        def is_eval(doc: Any) -> bool:
            if by_subject and doc.subject_id == NO_SUBJECT:
                raise ValueError(f"eval_split_unit='subject' but document {doc.key} has no "
                                 f"SUBJECT_ID")
            if unit.by_subject and not by_subject and doc.subject_id != NO_SUBJECT:
                raise ValueError(f"privacy_unit={unit.name!r} holds out whole patients but "
                                 f"document {doc.key} has a SUBJECT_ID and data.eval_split_unit"
                                 "='document': set data.eval_split_unit='subject'")
            key = doc.subject_id if by_subject else doc.key
            return heldout_draw(cfg.seed, key) < cfg.eval_fraction

    record_identity: dict[str, Any] = {}
    note_counts: dict[str, int] = {}
    train_corpus, eval_corpus = tokenize_and_split(
        _documents(cfg, read_stats, record_identity, note_counts), tok, is_eval=is_eval)
    info: dict[str, Any] = {
        "read_stats": [s.summary() for s in read_stats],
        # How duplicated ids were handled, with exact counts (private: the workdir's report).
        "record_identity": record_identity,
        "train_documents": train_corpus.num_documents,
        "eval_documents": eval_corpus.num_documents,
        "train_subjects": int(len(np.unique(train_corpus.subject_ids[
            train_corpus.subject_ids != NO_SUBJECT]))),
    }
    if train_corpus.num_documents == 0:
        raise ValueError(_no_training_document(cfg, read_stats, note_counts,
                                               eval_corpus.num_documents))
    if cfg.eval_fraction > 0 and eval_corpus.num_documents == 0:
        raise ValueError(f"data.eval_fraction={cfg.eval_fraction} held out no document of "
                         f"{train_corpus.num_documents}: raise it, or set 0 for no eval set"
                         + _single_documents(read_stats))
    canary_list: list = []
    if cfg.canaries.enabled:
        from data_pipelines import canaries  # noqa: PLC0415

        if cfg.canaries.file:
            canary_list, record = canaries.load_canary_file(cfg.canaries.file)
            if record["vocab_fingerprint"] != tokenization.vocab_fingerprint(tok.vocab_file):
                raise ValueError(f"data.canaries.file={cfg.canaries.file!r} was made for another "
                                 f"vocabulary ({record.get('vocab_file')})")
        else:
            canary_list = canaries.make_canaries(
                tok, forms=cfg.canaries.forms, repetitions=cfg.canaries.repetitions,
                canaries_per_setting=cfg.canaries.per_setting, seed=cfg.canaries.seed)
        train_corpus = canaries.insert_canaries(train_corpus, canary_list,
                                                seed=cfg.canaries.seed)
    params = InstanceParams(max_seq_length=cfg.max_seq_length,
                            short_seq_prob=cfg.short_seq_prob,
                            dupe_factor=cfg.dupe_factor, seed=cfg.seed,
                            privacy_unit=privacy_unit)
    train = create_instances(train_corpus, params)
    info["unit_multiplicity"] = unit_multiplicities(train, train_corpus.num_sentences,
                                                    train_corpus.num_documents)
    if record_identity:
        info["unit_multiplicity"]["record_identity"] = record_identity
    if unit.per_unit:
        # How many documents (vocabulary records, for a vocabulary DP per document) one unit
        # spans at most: a patient's notes (a note is one document: ids are unique, see
        # identity). Private: only CHECKED
        # against the public cap vocab.max_records_per_unit (dpbert.reporting.report.vocab_relation).
        subjects = np.asarray(train_corpus.subject_ids)
        keys = (subjects if unit.by_subject and (subjects != NO_SUBJECT).any()
                else np.asarray(train_corpus.doc_keys))
        info["documents_per_unit_max"] = int(np.unique(keys, return_counts=True)[1].max())
    if canary_list:
        train = canaries.append_canary_examples(train, canary_list)
    eval_instances = None
    if eval_corpus.num_documents:
        eval_instances = create_instances(
            eval_corpus, dataclasses.replace(params, dupe_factor=1, seed=cfg.seed + 1))
    return train, eval_instances, info, canary_list


def _single_documents(read_stats: list) -> str:
    """'; PATH: 1 document (no blank line between documents in N lines)' for each text file read
    as one document (``corpora.ReadStats.single_document``), or ''."""
    found = [s.single_document() for s in read_stats if hasattr(s, "single_document")]
    found = [f for f in found if f]
    if not found:
        return ""
    return ("; " + "; ".join(found) + " (a document is one record and one privacy unit: "
            "put a blank line between documents)")


def _no_training_document(cfg: ml_collections.ConfigDict, read_stats: list,
                          note_counts: dict[str, int], held_out: int) -> str:
    """Why the corpus left no training document: every document held out
    (data.eval_fraction), no note of the configured categories (data.noteevents_categories),
    or nothing usable read (the reader statistics)."""
    where = "; ".join(s.summary() for s in read_stats) or "no reader statistics"
    if held_out:
        return (f"data.eval_fraction={cfg.eval_fraction} held out all {held_out} document(s) "
                f"of the {cfg.corpus} corpus, leaving no training document (each document is "
                "held out with that probability): lower data.eval_fraction, or use more "
                "documents" + _single_documents(read_stats))
    if (cfg.corpus == "noteevents" and cfg.noteevents_categories
            and note_counts.get("notes") and not note_counts.get("in_categories")):
        return (f"data.noteevents_categories={tuple(cfg.noteevents_categories)!r} matched none "
                f"of the {note_counts['notes']} notes of {cfg.paths[0]} (CATEGORY values are "
                "compared case-insensitively, surrounding spaces ignored): correct the "
                "categories, or set data.noteevents_categories=() for every note")
    return (f"the {cfg.corpus} corpus yielded no training document with text ({where})"
            + _single_documents(read_stats))


def build_datasets(data_config: ml_collections.ConfigDict, vocab_file: str | os.PathLike,
                   privacy_unit: str = "example",
                   ) -> tuple[PretrainingDataset, PretrainingDataset | None]:
    """Corpus -> (train, eval) ``PretrainingDataset``s, through the instance cache.

    The offline stage (read, split held-out documents, tokenize, plant canaries, create
    instances) runs once per fingerprint of (corpus files, vocab, parameters) and is saved under
    ``cache_dir/<fingerprint>/``; later runs load it (memory-mapped). Every host computes the
    same result, so hosts may share the cache directory or each build their own.

    Args:
      data_config: ``configs.common.data_config()`` with overrides.
      vocab_file: a BERT ``vocab.txt``.
      privacy_unit: "example", "note" or "patient" (the training's ``dp.privacy_unit``): for
        note / patient, every unit's examples are made from the unit alone, 'random next'
        segments included (``instances`` module doc), so removing a unit from the corpus
        changes no other unit's examples; ``train_ds.unit_ids`` gives each example's unit.

    Returns:
      (train_ds, eval_ds); eval_ds is None when ``eval_fraction`` is 0. ``train_ds.metadata``
      holds the fingerprint, document / example counts and the canary file path, and for
      note / patient ``units`` (the unit, its key, the number of units, examples per unit).

    Raises:
      ValueError: a bad config value (naming the key), or a corpus without text.
      FileNotFoundError: a missing corpus file / vocab / unprepared TFDS dataset (naming it).
    """
    cfg = data_config
    check_config(cfg, privacy_unit)
    vocab_file = os.fspath(vocab_file)
    tok = tokenization.WordPieceTokenizer(vocab_file, do_lower_case=cfg.do_lower_case)
    fingerprint = _instances_fingerprint(cfg, vocab_file, privacy_unit)
    entry = os.path.join(os.path.expanduser(cfg.cache_dir), fingerprint) if cfg.cache_dir else ""
    meta_path = os.path.join(entry, "meta.json") if entry else ""
    if entry and os.path.isfile(meta_path):
        note_cache.clear()  # nothing to read (a vocabulary built here may have left the notes)
        _log.info("loading pretraining instances from the cache %s", entry)
        with open(meta_path, encoding="utf-8") as f:
            meta = json.load(f)
        train = Instances.load(os.path.join(entry, "train"))
        eval_instances = (Instances.load(os.path.join(entry, "eval"))
                          if meta["eval_examples"] else None)
        canary_file = meta.get("canary_file", "")
        if cfg.canaries.enabled and cfg.canaries.output_file and canary_file:
            if os.path.abspath(cfg.canaries.output_file) != os.path.abspath(canary_file):
                shutil.copyfile(canary_file, cfg.canaries.output_file)
                canary_file = os.path.abspath(cfg.canaries.output_file)
    else:
        try:
            train, eval_instances, info, canary_list = _build_instances(cfg, tok, privacy_unit)
        finally:
            note_cache.clear()  # the corpus is read: its notes need not stay in memory
        meta = {
            "fingerprint": fingerprint, "corpus": cfg.corpus, **info,
            "content_sha256": train.content_hash(),
            "train_examples": len(train),
            "eval_examples": len(eval_instances) if eval_instances is not None else 0,
            "train_tokens": int(len(train.tokens)),
            "max_seq_length": cfg.max_seq_length, "dupe_factor": cfg.dupe_factor,
            "privacy_unit_note": "one example = one instance ([CLS] A [SEP] B [SEP]); A and B "
                                 "may come from different documents/subjects "
                                 "(subject_id, b_subject_id)",
        }
        canary_file = ""
        write_canaries = None
        if canary_list:
            from data_pipelines import canaries  # noqa: PLC0415

            def write_canaries(target: str) -> None:
                canaries.write_canary_file(target, canary_list, tok, seed=cfg.canaries.seed,
                                           extra={"data_fingerprint": fingerprint,
                                                  "content_sha256": meta["content_sha256"]})

            meta["canaries"] = len(canary_list)
            if cfg.canaries.output_file:
                write_canaries(cfg.canaries.output_file)
                canary_file = os.path.abspath(cfg.canaries.output_file)
        if entry:
            meta["canary_file"] = os.path.join(entry, "canaries.json") if canary_list else ""
            _save_entry(entry, train, eval_instances, meta, write_canaries)
            canary_file = canary_file or meta["canary_file"]
    masking = MaskingParams(max_seq_length=cfg.max_seq_length,
                            max_predictions_per_seq=cfg.max_predictions_per_seq,
                            masked_lm_prob=cfg.masked_lm_prob,
                            whole_word_masking=cfg.whole_word_masking)
    common = dict(special=tok.special, vocab_size=tok.vocab_size,
                  is_continuation=tok.is_continuation)
    meta = {**meta, "canary_file": canary_file, "cache_entry": entry}
    units = None
    if privacy_units.get(privacy_unit).per_unit:
        units = unit_ids(train, privacy_unit)
        meta["units"] = _unit_summary(train, units, privacy_unit, meta)
    train_ds = PretrainingDataset(train, masking, seed=cfg.seed, metadata=meta, **common)
    train_ds.unit_ids = units
    eval_ds = None
    if eval_instances is not None:
        eval_ds = PretrainingDataset(eval_instances, masking, seed=cfg.seed + 1,
                                     metadata={**meta, "split": "eval"}, **common)
    _log.info("pretraining data: %d train examples, %s eval examples (fingerprint %s)",
              train_ds.num_examples, eval_ds.num_examples if eval_ds else 0, fingerprint)
    return train_ds, eval_ds


def _unit_summary(train: Instances, units: np.ndarray, privacy_unit: str,
                  meta: dict[str, Any]) -> dict[str, Any]:
    """What the report says about the units: their key, how many, examples per unit (exact
    corpus statistics, not privatized)."""
    per_unit = np.bincount(units)
    has_subjects = bool((np.asarray(train.subject_id) != NO_SUBJECT).any())
    key = privacy_units.get(privacy_unit).key(has_subjects)
    return {"privacy_unit": privacy_unit, "unit_key": key, "num_units": int(len(per_unit)),
            "num_examples": int(len(units)),
            "examples_per_unit": {"max": int(per_unit.max()),
                                  "mean": round(float(per_unit.mean()), 3),
                                  "median": float(np.median(per_unit))},
            "train_subjects": meta.get("train_subjects"),
            "train_documents": meta.get("train_documents"),
            "documents_per_unit_max": meta.get("documents_per_unit_max"),
            "record_identity": meta.get("record_identity")}


def _save_entry(entry: str, train: Instances, eval_instances: Instances | None,
                meta: dict[str, Any], write_canaries: Callable[[str], None] | None) -> None:
    """Writes a cache entry atomically (a temp folder renamed into place)."""
    parent = os.path.dirname(entry)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=".tmp-", dir=parent)
    try:
        train.save(os.path.join(tmp, "train"))
        if eval_instances is not None:
            eval_instances.save(os.path.join(tmp, "eval"))
        if write_canaries is not None:
            write_canaries(os.path.join(tmp, "canaries.json"))
        with open(os.path.join(tmp, "meta.json"), "w", encoding="utf-8") as f:
            json.dump(meta, f, indent=1)
        try:
            os.replace(tmp, entry)
        except OSError:
            # Another host/process finished the same entry first: identical content.
            if not os.path.isfile(os.path.join(entry, "meta.json")):
                raise
    finally:
        if os.path.isdir(tmp):
            shutil.rmtree(tmp, ignore_errors=True)

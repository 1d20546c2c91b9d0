"""Differentially private WordPiece vocabulary (Hoory et al. 2021, Sec. 3.2).

Pipeline (each stage a small function; :func:`build_vocab` runs them in order)::

    corpus --(examples)--> words per example (BERT normalizer + pre-tokenizer)
           --(contribution bounding: <= K distinct words, each once, random K)-->
           word histogram --(Laplace noise on every nonzero count, drop < threshold)-->
           noisy (word, count) pairs --(tokenizers WordPieceTrainer)--> vocab.txt

Only the noise + threshold stage touches the private data in a way that needs privacy
analysis; everything after it (WordPiece learning, the vocabulary file, the survivors'
alphabet) is post-processing of its DP output.  Character coverage comes from a public
alphabet embedded here (:func:`public_alphabet`), never from private counts, so unseen
text does not turn into ``[UNK]`` even when few words survive.

What an example is (the privacy unit of the vocabulary)
-------------------------------------------------------
``format="noteevents"``: one note (one ``NOTEEVENTS`` row).  ``format="text"``: one
document (a blank-line-separated block).  The guarantee is for adding or removing one
example.  With ``unit="patient"`` (noteevents only) the notes of one ``SUBJECT_ID`` are
grouped into ONE example before contribution bounding, so a patient's notes together
contribute at most K distinct words and the guarantee is per patient (add or remove one
patient with all their notes).  Grouping holds the corpus's text in memory, grouped by
patient, before counting.  An example is one IDENTITY, not one position
(``data_pipelines/identity.py``): a ROW_ID that occurs twice (or a text document that occurs
twice) is refused before anything is counted, or with ``duplicate_ids="merge_identical"``
its identical copies are one example; otherwise a duplicated note would count twice under a
per-note epsilon.  A training unit smaller than the vocabulary's example (a
sequence cut from a document, a note of a per-patient vocabulary) MODIFIES examples rather
than removing them, which costs more (replace-one: at most 2K counts move); a unit spanning
several examples (a sequence from two documents, a patient's notes) costs group privacy:
:func:`data_pipelines.vocab_privacy.histogram_guarantee` gives the guarantee under each.

Contribution bounding and the privacy analysis
----------------------------------------------
Each example contributes each of its distinct words **once**, and at most K of them
(``max_words_per_example``).  When an example has more than K distinct words, K are
chosen uniformly at random without replacement (seeded numpy Generator, one stream per
chunk of examples so the result does not depend on the number of workers).  Why random
and not the first K: the first K words of a note are its header ("FINAL REPORT
EXAMINATION ..."), so "first K" would systematically drop the words of the body of long
notes; a uniform choice gives every distinct word of the example the same inclusion
probability min(1, K/d), whatever its position.  Why each word once: it bounds every
count's change to 1 (L-infinity sensitivity 1, L0 sensitivity K).  Allowing a word up to
K times would let one example push a new word's count up to K, which the threshold
formula below does not cover.  So the released counts are "number of examples (among
those whose bounded sample contains it) that use the word", a document frequency.

Noise and threshold (Korolova et al. 2009; Bun, Nissim & Stemmer 2019 -- the histogram
of Hoory et al. Sec. 3.2): every word with a nonzero bounded count c gets
``c + Lap(b)``; words whose noisy count is below the threshold tau are dropped.  Zero
counts are never touched, so the output only names words that occur.

Two calibrations of (b, tau) from the example-level targets (epsilon, delta) are offered
(``accounting``):

* ``"basic"`` -- Hoory et al. literally: per-word parameters eps' = epsilon / K,
  delta' = delta / K, b = 2 / eps', tau = 1 + 2 ln(2 / delta') / eps', and the
  example-level guarantee (K eps', K delta') by basic composition.  Their per-word
  mechanism is analysed for *replacing* one word (sensitivity 2).  With our bounding an
  example changes at most K counts by 1 each when added or removed (at most 2K when
  replaced), so each touched word's release is (eps'/2, delta'/4)-DP and the claimed
  (epsilon, delta) holds for add/remove *and* for replace-one neighbours (conservative).
* ``"pld"`` (default) -- a tight analysis of the K-bounded histogram itself, for
  add/remove-one-example neighbours.  Split delta = delta_noise + delta_threshold
  (half each).  Words whose count is nonzero on both datasets see a Laplace mechanism
  of sensitivity 1 and scale b followed by post-processing (the threshold); there are
  at most K of them, so their joint privacy profile is at most that of K composed
  Laplace mechanisms, computed exactly (pessimistic PLD) by ``dp_accounting``;
  b is calibrated so that it is (epsilon, delta_noise).  A word that exists only on the
  larger dataset (count 1 there) is released with probability
  p = P[1 + Lap(b) >= tau] = exp(-(tau - 1)/b) / 2 and never otherwise: a
  (0, p)-DP release.  Composing a mechanism with privacy profile delta(eps) and at most
  K such releases gives delta(eps) + K p (couple each new-word release with
  total-variation distance p).  tau = 1 + b ln(K / (2 delta_threshold)) makes K p =
  delta_threshold, so the whole histogram is (epsilon, delta)-DP.  At epsilon=8, K=64,
  delta=1e-6 this gives tau ~ 91 against ~300 for "basic".

Reported per-word quantities: ``epsilon_per_word`` = 1/b for "pld" (eps' for "basic"),
``delta_per_word`` = p (delta' for "basic").  The conditions of the cited theorem,
0 < eps' < ln n and 0 < delta' < 1/n, are checked with n = the number of examples (the
size of the database, the usual reading of delta < 1/n).

Randomness: contribution bounding and noise use numpy ``Generator(PCG64)`` streams
spawned from one ``SeedSequence``.  With ``seed=None`` (the default for real releases)
the root entropy is 128 bits from the OS (``SeedSequence()``), so the noise cannot be
predicted; a given seed makes a build reproducible and must not be used for a release.
PCG64 is not a cryptographic generator, and the noise is floating-point Laplace
(Mironov 2012 describes attacks on the low-order bits of such values).  What is
released is the set of surviving words and their noisy counts rounded to integers, which
removes those low-order bits; the noisy floats themselves are never written.

Scale-out: the histogram -> noise -> threshold stage is exactly a DP count with private
partition selection (partitions = words, privacy id = example id, max partitions
contributed = K, max contributions per partition = 1).  In PipelineDP (Apache Beam or
Spark backends) that is ``DPEngine.aggregate`` with ``Metrics.PRIVACY_ID_COUNT``,
``NoiseKind.LAPLACE``, ``PartitionSelectionStrategy.LAPLACE_THRESHOLDING`` and
``post_aggregation_thresholding=True`` (or ``DPEngine.select_partitions`` for the word
set alone).  To keep this module's PLD calibration instead, run the same stages as
plain Beam transforms with (b, tau) from :func:`calibrate_histogram`.  Details in
``docs/dp_vocab.md``.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import multiprocessing
import os
import pathlib
import time
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
from absl import logging

from data_pipelines import corpora, fileio, identity
from data_pipelines.vocab_report import make_report
from dpbert.core import units as privacy_units
from data_pipelines.vocab_privacy import (  # noqa: F401 - dp_vocab's public API
    ACCOUNTING_MODES, MAX_PER_WORD_EPSILON, MAX_WORDS_PER_EXAMPLE, RELATIONS, Guarantee,
    HistogramPrivacy, VocabError, calibrate_histogram, check_conditions, histogram_guarantee,
    laplace_composition_epsilon, noisy_threshold, privacy_from_report)
from data_pipelines.wordpiece import (  # noqa: F401 - dp_vocab's public API
    DEFAULT_NUM_UNUSED, WordSplitter, learn_wordpiece, min_vocab_size, public_alphabet,
    special_tokens, vocab_size_floor)

FORMATS = ("text", "noteevents")
# What one example (record) of the vocabulary is (module doc): `dpbert.core.units`' records.
UNITS = privacy_units.VOCAB_RECORDS
# Examples per work item sent to a worker; fixed so results do not depend on workers.
CHUNK_SIZE = 256



MAX_VOCAB_SIZE = 1_000_000
# Below this share of the learnable slots actually learned, build_vocab warns: the rest of
# vocab.txt is [unusedN] padding and most words split into characters.
SMALL_VOCAB_SHARE = 0.5




# --------------------------------------------------------------------------- words


def bound_example(words: Iterable[str], max_words: int,
                  rng: np.random.Generator) -> list[str]:
    """Contribution bounding of one example: its distinct words, at most ``max_words``.

    Args:
      words: the example's words (repeats allowed).
      max_words: K.
      rng: the Generator that picks which K when there are more (uniform, no
        replacement); it is not used otherwise.

    Returns:
      Sorted distinct words, at most K of them; each contributes 1 to its count.
    """
    distinct = sorted(set(words))  # sorted: the choice must not depend on hash order
    if len(distinct) <= max_words:
        return distinct
    keep = rng.choice(len(distinct), size=max_words, replace=False)
    return [distinct[i] for i in sorted(keep)]


def _bounding_seed(entropy: int, chunk_index: int) -> np.random.SeedSequence:
    """The SeedSequence of one chunk's contribution-bounding stream."""
    return np.random.SeedSequence(entropy=entropy, spawn_key=(0, chunk_index))


def _noise_seed(entropy: int) -> np.random.SeedSequence:
    """The SeedSequence of the noise stream (disjoint from every bounding stream)."""
    return np.random.SeedSequence(entropy=entropy, spawn_key=(1,))


_WORKER_SPLITTER: WordSplitter | None = None


def _init_worker(do_lower_case: bool) -> None:
    """Pool initializer: one WordSplitter per worker process."""
    global _WORKER_SPLITTER
    _WORKER_SPLITTER = WordSplitter(do_lower_case)


def count_chunk(chunk_index: int, texts: Sequence[str], max_words: int | None,
                entropy: int, splitter: WordSplitter | None = None) -> collections.Counter:
    """Word counts of one chunk of examples.

    Args:
      chunk_index: position of the chunk in the corpus (selects the RNG stream).
      texts: the examples' texts.
      max_words: K for DP (distinct words, each once, at most K); None for raw counts.
      entropy: root entropy of the build's SeedSequence.
      splitter: the WordSplitter (defaults to the worker's).

    Returns:
      Counter word -> count over the chunk (an aggregate; no per-example output).
    """
    splitter = splitter or _WORKER_SPLITTER
    assert splitter is not None, "count_chunk needs a splitter (or _init_worker)"
    counts: collections.Counter = collections.Counter()
    if max_words is None:
        for text in texts:
            counts.update(splitter(text))
        return counts
    rng = np.random.default_rng(_bounding_seed(entropy, chunk_index))
    for text in texts:
        counts.update(bound_example(splitter(text), max_words, rng))
    return counts


def _chunks(examples: Iterable[str], size: int) -> Iterator[list[str]]:
    """Groups an iterable into lists of ``size`` (the last may be shorter)."""
    chunk: list[str] = []
    for text in examples:
        chunk.append(text)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def word_histogram(examples: Iterable[str], max_words_per_example: int | None,
                   entropy: int, do_lower_case: bool = True, num_workers: int = 1,
                   progress: bool = False,
                   chunk_size: int = CHUNK_SIZE) -> tuple[dict[str, int], int]:
    """Streams examples into a (bounded) word histogram.

    Workers count chunks of ``chunk_size`` examples; at most ``2 * num_workers`` chunks
    are in flight, so memory is bounded by the number of distinct words (plus those
    chunks), not by the corpus.  Results are merged in chunk order and each chunk has
    its own RNG stream, so the histogram does not depend on ``num_workers``.

    Args:
      examples: example texts.
      max_words_per_example: K (DP bounding) or None (raw counts, non-private).
      entropy: root entropy (see :func:`build_vocab`).
      do_lower_case: BERT uncased normalisation.
      num_workers: processes; 1 counts in this process.
      progress: show a tqdm bar (examples).
      chunk_size: examples per work item.

    Returns:
      (histogram word -> count (int), number of examples).
    """
    import tqdm  # lazy: workers never need it

    total: collections.Counter = collections.Counter()
    num_examples = 0
    bar = tqdm.tqdm(unit="ex", desc="word histogram", disable=not progress,
                    mininterval=1.0)

    def merge(result: tuple[int, collections.Counter]) -> None:
        nonlocal num_examples
        n, counts = result
        total.update(counts)
        num_examples += n
        bar.update(n)

    chunks = _chunks(examples, chunk_size)
    try:
        if num_workers <= 1:
            splitter = WordSplitter(do_lower_case)
            for i, chunk in enumerate(chunks):
                merge((len(chunk), count_chunk(i, chunk, max_words_per_example, entropy,
                                               splitter)))
        else:
            # spawn: forking a process whose tokenizers thread pool is running can
            # deadlock; spawned workers import only this module's light dependencies.
            ctx = multiprocessing.get_context("spawn")
            with ctx.Pool(num_workers, initializer=_init_worker,
                          initargs=(do_lower_case,)) as pool:
                pending: collections.deque = collections.deque()
                for i, chunk in enumerate(chunks):
                    pending.append((len(chunk), pool.apply_async(
                        count_chunk, (i, chunk, max_words_per_example, entropy))))
                    if len(pending) >= 2 * num_workers:
                        n, res = pending.popleft()
                        merge((n, res.get()))
                while pending:
                    n, res = pending.popleft()
                    merge((n, res.get()))
    finally:
        bar.close()
    return dict(total), num_examples


# --------------------------------------------------------------------------- build


def iter_examples(path: str | os.PathLike[str], fmt: str,
                  stats: corpora.ReadStats | None = None,
                  max_bad_fraction: float = corpora.DEFAULT_MAX_BAD_FRACTION,
                  unit: str = privacy_units.DOCUMENT_RECORD,
                  duplicate_ids: str = identity.DEFAULT_RULE,
                  identity_summary: dict | None = None) -> Iterator[str]:
    """Example texts of a corpus: one document (``text``) or one note (``noteevents``); with
    ``unit="patient"`` (noteevents) the notes of one SUBJECT_ID joined, patients in
    SUBJECT_ID order.

    One record per identity (``identity``: a note is its ROW_ID, a text document its text):
    a corpus whose ids repeat is refused (``identity.DuplicateRecordsError``) before the first
    example is yielded, or with ``duplicate_ids="merge_identical"`` the identical copies are
    dropped (``identity_summary`` receives what was done). Many notes of one patient are not
    duplicates; with ``unit="patient"`` a repeated ROW_ID is, as per note."""
    if unit == privacy_units.PATIENT_RECORD:
        if fmt != "noteevents":
            raise VocabError(f"unit='patient' needs format='noteevents' (SUBJECT_IDs), got "
                             f"{fmt!r}")
        by_subject: dict[int, list[str]] = collections.defaultdict(list)
        for note in identity.unique_notes(os.fspath(path), stats, max_bad_fraction,
                                          duplicate_ids, identity_summary):
            by_subject[note.subject_id].append(note.text)
        for subject in sorted(by_subject):
            yield "\n".join(by_subject.pop(subject))
        return
    if unit != privacy_units.DOCUMENT_RECORD:
        raise VocabError(f"unit must be one of {UNITS}, got {unit!r}")
    if fmt == "text":
        for doc, _ in identity.unique_text_documents(
                [os.fspath(path)], None if stats is None else [stats], max_bad_fraction,
                duplicate_ids, identity_summary):
            yield "\n".join(doc)
    elif fmt == "noteevents":
        for note in identity.unique_notes(os.fspath(path), stats, max_bad_fraction,
                                          duplicate_ids, identity_summary):
            yield note.text
    else:
        raise VocabError(f"format must be one of {FORMATS}, got {fmt!r}")


@dataclasses.dataclass(frozen=True)
class VocabResult:
    """What :func:`build_vocab` wrote.

    Attributes:
      vocab_path: ``<out>/vocab.txt``.
      privacy_path: ``<out>/vocab_privacy.json``.
      counts_path: ``<out>/word_counts.tsv`` (surviving words and their noisy counts,
        rounded; a DP release like the vocabulary).
      report: the content of ``vocab_privacy.json``.
    """

    vocab_path: pathlib.Path
    privacy_path: pathlib.Path
    counts_path: pathlib.Path
    report: dict[str, Any]


def build_vocab(input_path: str | os.PathLike[str], fmt: str, vocab_size: int,
                epsilon: float | None, delta: float | None, max_words_per_example: int,
                out_dir: str | os.PathLike[str], dp: bool = True,
                do_lower_case: bool = True, seed: int | None = None, num_workers: int = 1,
                accounting: str = "pld", num_unused: int = DEFAULT_NUM_UNUSED,
                progress: bool = True,
                max_bad_fraction: float = corpora.DEFAULT_MAX_BAD_FRACTION,
                min_learned_tokens: int = 0, unit: str = privacy_units.DOCUMENT_RECORD,
                duplicate_ids: str = identity.DEFAULT_RULE,
                knobs: tuple[str, str] = ("--epsilon", "--vocab_size")) -> VocabResult:
    """Builds ``vocab.txt`` (+ privacy report) from a private corpus.

    Every parameter is checked before the corpus is read, the per-word conditions after
    it is counted, and files are written only at the end (to a temporary name, then
    renamed), so a failed build leaves ``out_dir`` as it was.

    Args:
      input_path: the corpus file.
      fmt: "text" or "noteevents" (what an example is: ``vocab_report.EXAMPLE_DEFINITIONS``).
      vocab_size: lines of ``vocab.txt``.
      epsilon, delta: example-level targets (may be None when ``dp=False``; then they
        are only reported).
      max_words_per_example: K.
      out_dir: output folder (created); must not already hold a vocabulary.
      dp: False builds the non-private vocabulary from raw counts (no bounding, no
        noise, no threshold) and says so in the report.
      do_lower_case: uncased BERT normalisation.
      seed: None draws 128 bits of OS entropy (use this for a release); an int makes
        the build reproducible (tests, experiments).
      num_workers: counting processes.
      accounting: "pld" or "basic".
      num_unused: ``[unusedN]`` slots before ``[UNK]``.
      progress: tqdm bar while counting.
      max_bad_fraction: largest share of unreadable rows/lines the corpus reader accepts.
      min_learned_tokens: fewer learned tokens (beyond specials and the public alphabet) is
        a VocabError naming the threshold and the number of examples; launch/build_vocab.py
        passes 1 (a vocabulary of characters only is refused). 0 keeps the old behaviour
        (training's tiny test corpora), with the warning below.
      unit: "document" (one note / text document is one example) or "patient" (noteevents:
        the notes of one SUBJECT_ID together are one example).
      duplicate_ids: "refuse" (a corpus in which a ROW_ID, or a text document, occurs twice is
        refused before anything is counted) or "merge_identical" (identical copies are one
        example; copies that differ are still refused): ``identity``.

    Returns:
      :class:`VocabResult` (``report["warnings"]`` when the vocabulary learned fewer than
      half of its slots).

    Raises:
      VocabError: bad parameters, delta >= 1/n, violated per-word conditions, existing
        output, no learned token.
      corpora.CorpusError: missing/malformed/empty corpus;
        ``identity.DuplicateRecordsError`` for repeated ids (the rule above).
    """
    start = time.perf_counter()
    if os.path.isdir(input_path):
        raise corpora.CorpusError(f"{os.fspath(input_path)}: is a directory; expected a "
                                  "corpus file")
    if not os.path.isfile(input_path):
        raise corpora.CorpusError(f"corpus file not found: {os.fspath(input_path)!r}")
    if fmt not in FORMATS:
        raise VocabError(f"format must be one of {FORMATS}, got {fmt!r}")
    max_workers = 4 * (os.cpu_count() or 1)
    if not (isinstance(num_workers, int) and 1 <= num_workers <= max_workers):
        raise VocabError(f"num_workers must be an integer in [1, {max_workers}] (4 x the "
                         f"{os.cpu_count()} CPUs), got {num_workers!r}")
    _check_sizes(vocab_size, num_unused)
    if accounting not in ACCOUNTING_MODES:
        raise VocabError(f"accounting must be one of {ACCOUNTING_MODES}, got {accounting!r}")
    if unit not in UNITS:
        raise VocabError(f"unit={unit!r} must be one of {UNITS}")
    if unit == privacy_units.PATIENT_RECORD and fmt != "noteevents":
        raise VocabError(f"unit='patient' groups notes by SUBJECT_ID, which only "
                         f"format='noteevents' has (got format={fmt!r}); a document of a "
                         f"{fmt} corpus is its own record: use unit='document'")
    if duplicate_ids not in identity.RULES:
        raise VocabError(f"duplicate_ids must be one of {identity.RULES}, got "
                         f"{duplicate_ids!r}")
    privacy = calibrate_histogram(epsilon, delta, max_words_per_example,
                                  accounting) if dp else None
    if privacy is not None and privacy.epsilon_per_word >= MAX_PER_WORD_EPSILON:
        raise VocabError(
            f"epsilon={epsilon} with K={max_words_per_example} gives a per-word epsilon of "
            f"{privacy.epsilon_per_word:.4g}, which must be below ln n (n = the number of "
            f"examples) and no corpus has ln n >= {MAX_PER_WORD_EPSILON:g}; lower --epsilon "
            f"or raise --max_words_per_example")
    floor = min_vocab_size(do_lower_case, num_unused)
    if vocab_size < floor:
        raise VocabError(f"vocab_size={vocab_size} is below the "
                         f"{vocab_size_floor(do_lower_case, num_unused)}")
    out = pathlib.Path(out_dir)
    _check_writable_dir(out)
    paths = (out / "vocab.txt", out / "vocab_privacy.json", out / "word_counts.tsv")
    for p in paths:
        if p.exists():
            raise VocabError(f"{p} already exists; choose another --out (a DP vocabulary "
                             f"is a release: it is not silently replaced)")

    t_calibrate = time.perf_counter() - start
    root = np.random.SeedSequence(seed)
    entropy = int(root.entropy)
    stats = corpora.ReadStats()
    duplicates: dict[str, Any] = {}
    histogram, num_examples = word_histogram(
        iter_examples(input_path, fmt, stats, max_bad_fraction, unit, duplicate_ids,
                      duplicates),
        max_words_per_example if dp else None,
        entropy, do_lower_case, num_workers, progress)
    t_count = time.perf_counter() - start - t_calibrate

    if dp:
        assert privacy is not None
        check_conditions(privacy, num_examples)
        rng = np.random.Generator(np.random.PCG64(_noise_seed(entropy)))
        word_counts: Mapping[str, float] = noisy_threshold(
            histogram, privacy.noise_scale, privacy.threshold, rng)
    else:
        word_counts = histogram
    t_train = time.perf_counter()
    tokens, num_learned = learn_wordpiece(word_counts, vocab_size, do_lower_case,
                                          num_unused)
    t_train = time.perf_counter() - t_train
    warnings = _check_learned(num_learned, len(word_counts), vocab_size - floor,
                              num_examples, privacy, min_learned_tokens, knobs)

    report = make_report(privacy, fmt, epsilon, delta, max_words_per_example, vocab_size,
                         num_learned, num_unused, do_lower_case, seed, num_examples,
                         len(histogram), len(word_counts), stats, unit, duplicates)
    if warnings:
        report["warnings"] = warnings
    report["seconds"] = {"calibrate": round(t_calibrate, 3), "count": round(t_count, 3),
                         "wordpiece": round(t_train, 3),
                         "total": round(time.perf_counter() - start, 3)}
    try:
        out.mkdir(parents=True, exist_ok=True)
        fileio.atomic_write_text(paths[2], "".join(f"{w}\t{max(1, int(round(c)))}\n"
                                        for w, c in sorted(word_counts.items()))
                      if dp else "")
        fileio.atomic_write_text(paths[1], json.dumps(report, indent=2) + "\n")
        fileio.atomic_write_text(paths[0], "".join(t + "\n" for t in tokens))
    except OSError as e:
        raise VocabError(f"{out}: cannot write the vocabulary ({e.strerror or e})") from None
    logging.info("DP vocab: %d examples, %d surviving words, %d learned tokens -> %s",
                 num_examples, len(word_counts), num_learned, paths[0])
    return VocabResult(*paths, report=report)


def _check_writable_dir(out: pathlib.Path) -> None:
    """Raises VocabError unless ``out`` is (or can be created as) a writable folder."""
    problem = fileio.output_folder_problem(out)
    if problem:
        raise VocabError(f"{out}: {problem}")


def _check_sizes(vocab_size: Any, num_unused: Any) -> None:
    """Raises VocabError unless both are integers, 0 <= num_unused, 1 <= vocab_size, and
    both are at most MAX_VOCAB_SIZE."""
    for name, value, minimum in (("num_unused", num_unused, 0), ("vocab_size", vocab_size, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise VocabError(f"{name} must be an integer >= {minimum}, got {value!r}")
        if value > MAX_VOCAB_SIZE:
            raise VocabError(f"{name}={value} is above {MAX_VOCAB_SIZE} (BERT vocabularies have "
                             "30k-250k entries; the file would be mostly [unusedN] padding)")


def _check_learned(num_learned: int, num_surviving: int, slots: int, num_examples: int,
                   privacy: HistogramPrivacy | None, min_learned_tokens: int,
                   knobs: tuple[str, str] = ("--epsilon", "--vocab_size")) -> list[str]:
    """Refuses a vocabulary with fewer than ``min_learned_tokens`` learned tokens; returns
    warnings (also logged) when fewer than SMALL_VOCAB_SHARE of the ``slots`` beyond the
    fixed part were learned."""
    why = (f"a word survives only if about {privacy.threshold:.0f} of the {num_examples} "
           f"examples use it (DP threshold for epsilon={privacy.epsilon}, "
           f"delta={privacy.delta}, K={privacy.max_words_per_example})" if privacy else
           f"{num_examples} examples")
    if num_learned < min_learned_tokens:
        raise VocabError(
            f"{num_learned} learned tokens: {num_surviving} word(s) survived and "
            f"{'none adds' if num_learned == 0 else 'too few add'} a token beyond the public "
            f"alphabet; {why}. The corpus is too small for this vocabulary: use more text, a "
            f"larger {knobs[0]}, or an existing (public) vocab.txt")
    if slots > 0 and num_learned < SMALL_VOCAB_SHARE * slots:
        msg = (f"DP vocabulary too small to be useful? only {num_learned} learned tokens for "
               f"{slots} slots ({100.0 * num_learned / slots:.0f} %; the rest of vocab.txt is "
               f"[unusedN] padding and most words will split into characters): "
               f"{num_surviving} words survived; {why}. More text, a larger {knobs[0]} or a "
               f"smaller {knobs[1]} give a denser vocabulary")
        logging.warning("%s", msg)
        return [msg]
    return []

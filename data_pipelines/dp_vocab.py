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
example.  It is never weaker than a per-sequence guarantee: every pretraining sequence
is cut from documents, so a sequence-level unit is contained in this one.  With
``unit="patient"`` (noteevents only) the notes of one ``SUBJECT_ID`` are grouped into ONE
example before contribution bounding, so a patient's notes together contribute at most K
distinct words and the guarantee is per patient (add or remove one patient with all their
notes).  Grouping holds the corpus's text in memory, grouped by patient, before counting.

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
import functools
import json
import math
import multiprocessing
import os
import pathlib
import time
import unicodedata
from typing import Any, Iterable, Iterator, Mapping, Sequence

import numpy as np
from absl import logging
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

from data_pipelines import corpora, fileio

# BERT's own layout: [PAD]=0, [unused0..98]=1..99, [UNK]=100, [CLS]=101, [SEP]=102,
# [MASK]=103, so the special ids match bert-base vocabularies.
DEFAULT_NUM_UNUSED = 99
FORMATS = ("text", "noteevents")
ACCOUNTING_MODES = ("pld", "basic")
EXAMPLE_DEFINITIONS = {
    "text": "one document of the text corpus (a blank-line-separated block of sentences)",
    "noteevents": "one MIMIC-III note (one NOTEEVENTS row, i.e. one ROW_ID)",
    "patient": "one patient (SUBJECT_ID): all their MIMIC-III notes (NOTEEVENTS rows) together",
}
UNITS = ("document", "patient")  # what one example of the vocabulary is (see module doc)
# Examples per work item sent to a worker; fixed so results do not depend on workers.
CHUNK_SIZE = 256
# Cap on the words fed to the WordPiece trainer (see learn_wordpiece).
MAX_TRAINING_WORDS = 100_000_000
_CONTINUATION = "##"

# Public alphabet: Unicode blocks, not data.  Printable ASCII, Latin-1 Supplement,
# Latin Extended-A, Greek, Cyrillic, General Punctuation and a few common symbols.
_PUBLIC_RANGES = (
    (0x21, 0x7E), (0xA1, 0xFF), (0x100, 0x17F), (0x391, 0x3C9), (0x400, 0x45F),
    (0x2010, 0x2027), (0x2030, 0x203A), (0x20A0, 0x20BF), (0x2100, 0x2122),
    (0x2190, 0x2193), (0x2200, 0x2265),
)


# No corpus has ln(n) >= 40 (n >= 2e17 examples), so a per-word epsilon this large always
# fails the theorem's condition eps' < ln n; also the floor of the PLD calibration (smaller
# Laplace scales make dp_accounting's grid explode: minutes and gigabytes).
MAX_PER_WORD_EPSILON = 40.0
# Upper limits on sizes (far above any real use; beyond them time or memory explodes:
# K = 1e6 takes 80 s and 3 GB to calibrate, vocab_size = 1e9 a billion [unusedN] lines).
MAX_WORDS_PER_EXAMPLE = 10_000
MAX_VOCAB_SIZE = 1_000_000
# Below this share of the learnable slots actually learned, build_vocab warns: the rest of
# vocab.txt is [unusedN] padding and most words split into characters.
SMALL_VOCAB_SHARE = 0.5


class VocabError(ValueError):
    """A DP vocabulary cannot be built with the given parameters or data."""


# --------------------------------------------------------------------------- privacy


@dataclasses.dataclass(frozen=True)
class HistogramPrivacy:
    """Calibrated parameters of the noisy, thresholded word histogram.

    Attributes:
      epsilon, delta: the example-level targets (add/remove one example).
      max_words_per_example: K, the per-example contribution bound.
      accounting: "pld" or "basic" (see the module docstring).
      noise_scale: b, the Laplace scale added to every nonzero count.
      threshold: tau; noisy counts below it are dropped.
      epsilon_per_word: privacy of one word's count (1/b for "pld", eps' for "basic").
      delta_per_word: probability that a word present in one example only is released.
      delta_noise: the part of delta spent on the Laplace part ("pld"; 0 for "basic").
      delta_threshold: the part of delta spent on releasing new words.
    """

    epsilon: float
    delta: float
    max_words_per_example: int
    accounting: str
    noise_scale: float
    threshold: float
    epsilon_per_word: float
    delta_per_word: float
    delta_noise: float
    delta_threshold: float

    def mechanism(self) -> str:
        """One sentence naming the mechanism and its parameters."""
        return (f"per-example contribution bounding (each distinct word once, at most "
                f"K={self.max_words_per_example} words, chosen uniformly at random), "
                f"Laplace noise of scale {self.noise_scale:.6g} on every nonzero word count, "
                f"words with noisy count < {self.threshold:.6g} dropped "
                f"(Korolova et al. 2009; Bun et al. 2019; Hoory et al. 2021 Sec. 3.2); "
                f"accounting: {self.accounting}")


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _check_targets(epsilon: float, delta: float, max_words_per_example: int) -> None:
    """Raises VocabError unless 0 < epsilon < inf, 0 < delta < 1, K >= 1."""
    if not (_is_number(epsilon) and math.isfinite(epsilon) and epsilon > 0):
        raise VocabError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    if not (_is_number(delta) and 0 < delta < 1):
        raise VocabError(f"delta must be in (0, 1), got {delta!r}")
    if not (isinstance(max_words_per_example, int) and not isinstance(max_words_per_example, bool)
            and 1 <= max_words_per_example <= MAX_WORDS_PER_EXAMPLE):
        raise VocabError(f"max_words_per_example (K) must be an integer in [1, "
                         f"{MAX_WORDS_PER_EXAMPLE}], got {max_words_per_example!r}")


def laplace_composition_epsilon(noise_scale: float, num_compositions: int,
                                delta: float) -> float:
    """Epsilon of ``num_compositions`` Laplace mechanisms (sensitivity 1, scale b) at delta.

    Computed with ``dp_accounting``'s pessimistic PLD accountant (an upper bound).
    """
    import dp_accounting  # lazy: workers never need it
    from dp_accounting import pld

    accountant = pld.PLDAccountant()
    accountant.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.LaplaceDpEvent(noise_multiplier=noise_scale), num_compositions))
    return float(accountant.get_epsilon(delta))


@functools.lru_cache(maxsize=64)
def calibrate_histogram(epsilon: float, delta: float, max_words_per_example: int,
                        accounting: str = "pld",
                        threshold_delta_fraction: float = 0.5) -> HistogramPrivacy:
    """Derives the noise scale and threshold that give example-level (epsilon, delta).

    Args:
      epsilon, delta: example-level targets, add/remove-one-example neighbours.
      max_words_per_example: K.
      accounting: "pld" (tight, default) or "basic" (Hoory et al.'s formula).
      threshold_delta_fraction: for "pld", the share of delta spent on new words
        (the rest goes to the Laplace part).  The threshold is insensitive to it
        (within 2% over 0.3..0.9 at epsilon=8, K=64), so 0.5.

    Returns:
      The calibrated :class:`HistogramPrivacy`.

    Raises:
      VocabError: a target out of range or an unknown accounting mode.
    """
    _check_targets(epsilon, delta, max_words_per_example)
    k = max_words_per_example
    if accounting == "basic":
        eps_w, delta_w = epsilon / k, delta / k
        b = 2.0 / eps_w
        tau = 1.0 + 2.0 * math.log(2.0 / delta_w) / eps_w
        return HistogramPrivacy(epsilon, delta, k, accounting, b, tau, eps_w, delta_w,
                                delta_noise=0.0, delta_threshold=delta)
    if accounting != "pld":
        raise VocabError(f"accounting must be one of {ACCOUNTING_MODES}, got {accounting!r}")
    if not 0 < threshold_delta_fraction < 1:
        raise VocabError(f"threshold_delta_fraction must be in (0, 1), "
                         f"got {threshold_delta_fraction!r}")
    import dp_accounting
    from dp_accounting import mechanism_calibration, pld

    delta_threshold = delta * threshold_delta_fraction
    delta_noise = delta - delta_threshold
    b_basic = k / epsilon  # basic composition: K Laplace(b) mechanisms are (K/b, 0)-DP
    # A coarser grid than the default 1e-4 is 15x faster and, being pessimistic, still an
    # upper bound on epsilon (b moves by < 1e-5 relative at eps=8, K=64).
    make_accountant = functools.partial(pld.PLDAccountant, value_discretization_interval=1e-3)
    event = lambda scale: dp_accounting.SelfComposedDpEvent(  # noqa: E731
        dp_accounting.LaplaceDpEvent(noise_multiplier=scale), k)
    # Scales below 1/MAX_PER_WORD_EPSILON are never searched: their grid is huge and their
    # per-word epsilon fails check_conditions for any corpus. Taking the floor instead is
    # more noise than needed (still (epsilon, delta)-DP) and is refused by check_conditions.
    b_floor = 1.0 / MAX_PER_WORD_EPSILON
    if b_basic <= b_floor or make_accountant().compose(event(b_floor)).get_epsilon(
            delta_noise) <= epsilon:
        b = b_floor
    elif make_accountant().compose(event(b_basic)).get_epsilon(delta_noise) > epsilon:
        # A delta below what the PLD resolves (1e-300): the search has no bracket. Basic
        # composition needs none: K Laplace(K/eps) mechanisms are (eps, 0)-DP.
        b = b_basic
    else:
        b = dp_accounting.calibrate_dp_mechanism(
            make_accountant, event, target_epsilon=epsilon, target_delta=delta_noise,
            # Laplace(b_floor) exceeds epsilon (checked above); K/eps always meets it.
            bracket_interval=mechanism_calibration.ExplicitBracketInterval(b_floor, b_basic),
            tol=1e-4 * b_basic)
        b = float(min(b, b_basic))
    tau = 1.0 + b * math.log(k / (2.0 * delta_threshold))
    return HistogramPrivacy(epsilon, delta, k, accounting, b, tau, 1.0 / b,
                            delta_threshold / k, delta_noise, delta_threshold)


def check_conditions(privacy: HistogramPrivacy, num_examples: int) -> None:
    """Checks 0 < eps' < ln n and 0 < delta' < 1/n for n = ``num_examples``.

    Raises:
      VocabError: naming the violated condition and the values.
    """
    n = num_examples
    if n < 2:
        raise VocabError(f"need at least 2 examples for a DP vocabulary, got {n}")
    # The example-level rule, checked and worded exactly as training checks its delta.
    from dpbert.dp import accounting  # noqa: PLC0415 - lazy: workers never need it
    try:
        accounting.validate_delta(privacy.delta, n)
    except ValueError as e:
        raise VocabError(f"vocabulary {e}") from None
    eps_w, delta_w = privacy.epsilon_per_word, privacy.delta_per_word
    if not 0 < eps_w < math.log(n):
        raise VocabError(
            f"per-word epsilon {eps_w:.4g} must be in (0, ln n = {math.log(n):.4g}) for "
            f"n={n} examples (epsilon={privacy.epsilon}, K={privacy.max_words_per_example},"
            f" accounting={privacy.accounting}); lower --epsilon or raise "
            f"--max_words_per_example")
    if not 0 < delta_w < 1.0 / n:
        raise VocabError(
            f"per-word delta {delta_w:.4g} must be in (0, 1/n = {1.0 / n:.4g}) for "
            f"n={n} examples (delta={privacy.delta}, K={privacy.max_words_per_example}); "
            f"lower --delta")


# --------------------------------------------------------------------------- words


class WordSplitter:
    """Text -> words, exactly as a BERT tokenizer splits before WordPiece.

    Uses ``tokenizers``' ``BertNormalizer`` (clean text, CJK spacing, lowercase and
    accent stripping when ``do_lower_case``) and ``BertPreTokenizer`` (whitespace and
    punctuation), the same components ``BertTokenizerFast`` uses.
    """

    def __init__(self, do_lower_case: bool = True):
        self.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=None,
            lowercase=do_lower_case)
        self.pre_tokenizer = pre_tokenizers.BertPreTokenizer()

    def __call__(self, text: str) -> list[str]:
        """Returns the words of ``text`` in order (with repeats)."""
        # One call per example: the pre-tokenizer splits on newlines like on spaces.
        return [w for w, _ in self.pre_tokenizer.pre_tokenize_str(
            self.normalizer.normalize_str(text))]


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


# --------------------------------------------------------------------------- noise


def noisy_threshold(histogram: Mapping[str, int], noise_scale: float, threshold: float,
                    rng: np.random.Generator) -> dict[str, float]:
    """Adds Laplace(noise_scale) to every nonzero count and drops noisy counts < threshold.

    Words are processed in sorted order so that a seeded ``rng`` gives the same output
    whatever the histogram's insertion order.

    Args:
      histogram: word -> bounded count (int >= 0).
      noise_scale: b.
      threshold: tau.
      rng: the noise Generator.

    Returns:
      word -> noisy count (float64 >= threshold) for the survivors.
    """
    words = sorted(w for w, c in histogram.items() if c > 0)
    counts = np.fromiter((histogram[w] for w in words), dtype=np.float64, count=len(words))
    noisy = counts + rng.laplace(loc=0.0, scale=noise_scale, size=len(words))
    keep = np.flatnonzero(noisy >= threshold)
    return {words[i]: float(noisy[i]) for i in keep}


# --------------------------------------------------------------------------- WordPiece


@functools.lru_cache(maxsize=4)
def public_alphabet(do_lower_case: bool = True) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The public character set, normalised as the tokenizer will normalise text.

    Built from fixed Unicode blocks (``_PUBLIC_RANGES``), never from data.  Each
    character is passed through the BERT normaliser (so uncased ``É`` becomes ``e``) and
    every resulting character is kept.  A continuation ``##c`` is added for characters
    that can occur inside a word (the BERT pre-tokenizer does not split them off);
    punctuation is always a word of its own and needs no ``##`` form.

    Returns:
      (word-initial characters, ``##`` continuations), each sorted by code point.
    """
    splitter = WordSplitter(do_lower_case)
    chars: set[str] = set()
    for lo, hi in _PUBLIC_RANGES:
        for cp in range(lo, hi + 1):
            if unicodedata.category(chr(cp)) == "Cn":
                continue  # unassigned code point
            for ch in splitter.normalizer.normalize_str(chr(cp)):
                if not ch.isspace():
                    chars.add(ch)
    initial = tuple(sorted(chars))
    inside = tuple(_CONTINUATION + ch for ch in initial
                   if len(splitter.pre_tokenizer.pre_tokenize_str(f"a{ch}a")) == 1)
    return initial, inside


def special_tokens(num_unused: int = DEFAULT_NUM_UNUSED) -> list[str]:
    """``[PAD]``, ``[unused0..num_unused-1]``, ``[UNK]``, ``[CLS]``, ``[SEP]``, ``[MASK]``."""
    return (["[PAD]"] + [f"[unused{i}]" for i in range(num_unused)]
            + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"])


def min_vocab_size(do_lower_case: bool = True,
                   num_unused: int = DEFAULT_NUM_UNUSED) -> int:
    """Specials + the public alphabet: the smallest vocabulary this builder writes."""
    initial, inside = public_alphabet(do_lower_case)
    return len(special_tokens(num_unused)) + len(initial) + len(inside)


def _training_items(word_counts: Mapping[str, float], max_words: int,
                    batch_words: int = 1_000_000) -> Iterator[str]:
    """Strings that hold each word as many times as its (rounded, scaled) count.

    ``tokenizers`` trainers take text, not counts; repeating a word c times gives the
    trainer exactly the count c.  If the total exceeds ``max_words`` all counts are
    scaled by the same factor (keeping at least 1): merge ranks depend on relative
    frequencies, and this bounds the trainer's work.
    """
    rounded = {w: max(1, int(round(c))) for w, c in word_counts.items()}
    total = sum(rounded.values())
    scale = min(1.0, max_words / total) if total else 1.0
    batch: list[str] = []
    size = 0
    for word in sorted(rounded):
        reps = max(1, int(round(rounded[word] * scale)))
        batch.append(" ".join([word] * reps))
        size += reps
        if size >= batch_words:
            yield " ".join(batch)
            batch, size = [], 0
    if batch:
        yield " ".join(batch)


def learn_wordpiece(word_counts: Mapping[str, float], vocab_size: int,
                    do_lower_case: bool = True, num_unused: int = DEFAULT_NUM_UNUSED,
                    max_training_words: int = MAX_TRAINING_WORDS) -> tuple[list[str], int]:
    """Learns a BERT WordPiece vocabulary from (word, count) pairs.

    Learner: ``tokenizers``' ``WordPieceTrainer`` (frequency-ranked merges with ``##``
    continuations, the learner HF uses for BERT vocabularies), fed through
    ``train_from_iterator`` with each word repeated by its count and a whitespace-only
    pre-tokenizer (the words are already normalised and pre-tokenised).  sentencepiece
    trains from counts directly but its pieces would need converting to ``##`` form;
    the HF trainer emits it natively and matches ``BertTokenizerFast``.

    Reproducibility: the trainer breaks ties between equally frequent pairs in an
    order that depends on Rust's randomised hash maps, so two runs on the same counts
    can differ in a few tied merges (the noisy counts themselves are bit-identical for
    a given seed; ``word_counts.tsv`` keeps them).

    Layout of the result (``vocab_size`` lines): :func:`special_tokens`, the public
    alphabet (initial characters, then ``##`` characters), then learned tokens in the
    trainer's order (its alphabet, then merges, most frequent first), then
    ``[unused{num_unused}]``, ... padding if fewer tokens were learned than fit.

    Args:
      word_counts: word -> count (noisy counts for DP; they are rounded).
      vocab_size: total number of lines.
      do_lower_case: must match how the words were normalised.
      num_unused: ``[unusedN]`` slots between ``[PAD]`` and ``[UNK]``.
      max_training_words: cap on the total count fed to the trainer.

    Returns:
      (tokens, number of learned tokens beyond specials + public alphabet).

    Raises:
      VocabError: ``vocab_size`` below :func:`min_vocab_size`.
    """
    floor = min_vocab_size(do_lower_case, num_unused)
    if vocab_size < floor:
        raise VocabError(f"vocab_size={vocab_size} is below the {floor} tokens of the "
                         f"special tokens ({num_unused} unused) and the public alphabet")
    initial, inside = public_alphabet(do_lower_case)
    tokens = special_tokens(num_unused) + list(initial) + list(inside)
    seen = set(tokens)
    fixed = len(tokens)
    if word_counts:
        tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, min_frequency=0, special_tokens=[],
            initial_alphabet=list(initial), continuing_subword_prefix=_CONTINUATION,
            show_progress=False)
        tokenizer.train_from_iterator(_training_items(word_counts, max_training_words),
                                      trainer=trainer)
        learned = tokenizer.get_vocab()
        for token in sorted(learned, key=learned.get):
            if len(tokens) >= vocab_size:
                break
            if token not in seen:
                tokens.append(token)
                seen.add(token)
    num_learned = len(tokens) - fixed
    extra = num_unused
    while len(tokens) < vocab_size:
        tokens.append(f"[unused{extra}]")
        extra += 1
    return tokens, num_learned


# --------------------------------------------------------------------------- build


def iter_examples(path: str | os.PathLike[str], fmt: str,
                  stats: corpora.ReadStats | None = None,
                  max_bad_fraction: float = corpora.DEFAULT_MAX_BAD_FRACTION,
                  unit: str = "document") -> Iterator[str]:
    """Example texts of a corpus: one document (``text``) or one note (``noteevents``); with
    ``unit="patient"`` (noteevents) the notes of one SUBJECT_ID joined, patients in
    SUBJECT_ID order."""
    if unit == "patient":
        if fmt != "noteevents":
            raise VocabError(f"unit='patient' needs format='noteevents' (SUBJECT_IDs), got "
                             f"{fmt!r}")
        by_subject: dict[int, list[str]] = collections.defaultdict(list)
        for note in corpora.read_noteevents(path, stats, max_bad_fraction):
            by_subject[note.subject_id].append(note.text)
        for subject in sorted(by_subject):
            yield "\n".join(by_subject.pop(subject))
        return
    if unit != "document":
        raise VocabError(f"unit must be one of {UNITS}, got {unit!r}")
    if fmt == "text":
        for doc in corpora.read_text_documents(path, stats, max_bad_fraction):
            yield "\n".join(doc)
    elif fmt == "noteevents":
        for note in corpora.read_noteevents(path, stats, max_bad_fraction):
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
                min_learned_tokens: int = 0, unit: str = "document") -> VocabResult:
    """Builds ``vocab.txt`` (+ privacy report) from a private corpus.

    Every parameter is checked before the corpus is read, the per-word conditions after
    it is counted, and files are written only at the end (to a temporary name, then
    renamed), so a failed build leaves ``out_dir`` as it was.

    Args:
      input_path: the corpus file.
      fmt: "text" or "noteevents" (what an example is: ``EXAMPLE_DEFINITIONS``).
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

    Returns:
      :class:`VocabResult` (``report["warnings"]`` when the vocabulary learned fewer than
      half of its slots).

    Raises:
      VocabError: bad parameters, delta >= 1/n, violated per-word conditions, existing
        output, no learned token.
      corpora.CorpusError: missing/malformed/empty corpus.
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
    if unit not in UNITS or (unit == "patient" and fmt != "noteevents"):
        raise VocabError(f"unit={unit!r} must be one of {UNITS} ('patient' needs "
                         f"format='noteevents', got {fmt!r})")
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
        raise VocabError(f"vocab_size={vocab_size} is below the {floor} tokens of the "
                         f"special tokens ({num_unused} unused) and the public alphabet")
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
    histogram, num_examples = word_histogram(
        iter_examples(input_path, fmt, stats, max_bad_fraction, unit),
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
                              num_examples, privacy, min_learned_tokens)

    report = _report(privacy, fmt, epsilon, delta, max_words_per_example, vocab_size,
                     num_learned, num_unused, do_lower_case, seed, num_examples,
                     len(histogram), len(word_counts), stats, unit)
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
                   privacy: HistogramPrivacy | None, min_learned_tokens: int) -> list[str]:
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
            f"larger --epsilon, or an existing (public) vocab.txt")
    if slots > 0 and num_learned < SMALL_VOCAB_SHARE * slots:
        msg = (f"DP vocabulary too small to be useful? only {num_learned} learned tokens for "
               f"{slots} slots ({100.0 * num_learned / slots:.0f} %; the rest of vocab.txt is "
               f"[unusedN] padding and most words will split into characters): "
               f"{num_surviving} words survived; {why}. More text, a larger --epsilon or a "
               f"smaller --vocab_size give a denser vocabulary")
        logging.warning("%s", msg)
        return [msg]
    return []


def _finite_or_none(value: float | None) -> float | None:
    """``value`` as a float, or None when unset or not finite (JSON has no NaN)."""
    return float(value) if value is not None and math.isfinite(value) else None


def _report(privacy: HistogramPrivacy | None, fmt: str, epsilon: float, delta: float,
            k: int, vocab_size: int, num_learned: int, num_unused: int,
            do_lower_case: bool, seed: int | None, num_examples: int,
            num_distinct: int, num_surviving: int,
            stats: corpora.ReadStats, unit: str = "document") -> dict[str, Any]:
    """The content of ``vocab_privacy.json``."""
    report: dict[str, Any] = {
        "dp": privacy is not None,
        "epsilon": float(epsilon) if privacy else None,
        "delta": float(delta) if privacy else None,
        "K": k if privacy else None,
        "unit": unit,
        "neighbouring_relation": ("add or remove one patient (all their notes)"
                                  if unit == "patient" else "add or remove one example"),
        "example_definition": EXAMPLE_DEFINITIONS["patient" if unit == "patient" else fmt],
        "format": fmt,
    }
    if privacy is not None:
        report.update(
            mechanism=privacy.mechanism(),
            accounting=privacy.accounting,
            epsilon_per_word=privacy.epsilon_per_word,
            delta_per_word=privacy.delta_per_word,
            noise_scale=privacy.noise_scale,
            threshold=privacy.threshold,
            delta_noise=privacy.delta_noise,
            delta_threshold=privacy.delta_threshold,
            secret_randomness=seed is None,
            noise_rng=("numpy Generator(PCG64), " + (
                "seeded by --seed: reproducible, NOT for a release" if seed is not None
                else "seeded from 128 bits of OS entropy")),
        )
    else:
        report.update(
            mechanism="NON-PRIVATE: raw word counts (no contribution bounding, no noise, "
                      "no threshold); this vocabulary can contain any rare word of the "
                      "corpus",
            requested_epsilon=_finite_or_none(epsilon),
            requested_delta=_finite_or_none(delta), requested_K=k)
    report.update(
        num_examples=num_examples,
        num_distinct_words=num_distinct,
        num_surviving_words=num_surviving,
        vocab_size=vocab_size,
        num_learned_tokens=num_learned,
        num_unused=num_unused,
        do_lower_case=do_lower_case,
        special_token_ids={t: i for i, t in enumerate(special_tokens(num_unused))
                           if not t.startswith("[unused")},
        reader={"records_read": stats.records_read, "records_kept": stats.records_kept,
                "skipped_iserror": stats.skipped_iserror,
                "skipped_malformed": stats.skipped_malformed,
                "skipped_empty": stats.skipped_empty,
                "skipped_bad_utf8": stats.skipped_bad_utf8},
        non_private_fields=["num_examples", "num_distinct_words", "reader"],
        non_private_note=("these fields are exact counts from the corpus, not covered by "
                          "epsilon/delta (num_distinct_words counts the bounded histogram's "
                          "nonzero words); drop them before publishing this file"),
    )
    return report

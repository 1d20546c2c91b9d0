"""Privacy of the DP vocabulary's histogram: calibration of the Laplace noise and threshold
for a target (epsilon, delta) with K words per example, the theorem's conditions, and the
noisy threshold itself (Korolova et al. 2009; Bun et al. 2019; Hoory et al. 2021 Sec. 3.2).

The only stage of `data_pipelines.dp_vocab` that needs a privacy analysis; the rest is
post-processing of its output.  The calibration targets ADD/REMOVE of one vocabulary record
(one example: a note/document, or one patient with ``unit="patient"``; the argument is in
`data_pipelines.dp_vocab`'s module docstring).  :func:`histogram_guarantee` gives the
guarantee of the same mechanism under other neighbouring relations, as a run's total needs
when its training unit is not the vocabulary's record.

Neighbouring relations other than add/remove one record
-------------------------------------------------------
Setting.  After contribution bounding a record is a set S of at most K distinct words, each
adding 1 to its word's count.  When a record has more than K distinct words S is a uniform
random K-subset; modelling the generator as truly random, the bounding outcomes of
different records are independent, so (joint convexity of the hockey-stick divergence) it
suffices to bound every fixed outcome for the differing records, the others' outcomes
coupled identically.  Let h be the histogram of the records the neighbours share.  Every
word is noised independently, so both output distributions are products over words and
only words whose count differs matter.  b is the Laplace scale, tau the threshold,
p = P[1 + Lap(b) >= tau] = exp(-(tau - 1)/b)/2 the release probability of a word of count 1
(``delta_per_word``; K p = delta_threshold for "pld"), and H_eps(P||Q) = E_P[(1 - e^(eps-L))_+]
the hockey-stick divergence, L = ln(dP/dQ) the privacy loss.

Replace one record (S -> S', |S|, |S'| <= K).  Words of S & S' (and outside S | S') keep
their count; each word of S - S' loses 1 and each of S' - S gains 1: at most 2K counts
move, each by exactly 1 (a word is either dropped or added, never both), at most K in each
direction.  Fix the direction P = output with S, Q = output with S' (the other is the same
with S and S' swapped).  The moved words are of four kinds:

  (a) w in S - S' with h_w >= 1 and (b) w in S' - S with h_w >= 1: nonzero on both sides, a
      Laplace(b) mechanism of shift +1 or -1 (the same PLD, by symmetry) followed by
      post-processing (the threshold);
  (c) w in S - S' with h_w = 0: P releases it with probability p (loss +inf) and otherwise
      omits it (loss ln(1 - p) < 0); Q never releases it;
  (d) w in S' - S with h_w = 0: P never releases it, Q does with probability p, so under P
      the word is always absent with the deterministic loss lambda = ln(1/(1 - p)) > 0.

|a| + |c| <= K and |b| + |d| <= K.  Under P the losses are independent, so (either some
(c) word is released, or each (c) word adds ln(1 - p))

    H_eps(P||Q) = 1 - (1-p)^|c| + (1-p)^|c| * delta_ab(eps - (|d| - |c|) lambda),

with delta_ab the privacy profile of the (a) and (b) words: at most 2K post-processed
Laplace(b) mechanisms, so delta_ab <= the profile of SelfComposed(Laplace(b), 2K)
(post-processing and dropping mechanisms can only lower it), and non-increasing in eps.
Let eps_2K be that composition's epsilon at delta_noise by dp_accounting's pessimistic PLD
(an upper bound; or 2K/b, basic composition, when smaller).  At eps_r = eps_2K + K lambda
the argument of delta_ab is >= eps_2K, so H <= K p + delta_noise = delta: replace-one is
(eps_2K + K lambda, delta_noise + delta_threshold)-DP.  The (d) words are why K lambda is
there: the add/remove argument couples every new word away at a delta cost of p (total
variation), which works here too but costs 2K p = 2 delta_threshold (K new words on each
side); for P||Q a (d) word is a tiny deterministic epsilon cost lambda ~ p instead.
K lambda = -K ln(1 - p) ~ delta_threshold (5e-7 at delta = 1e-6): negligible, and delta
stays the calibrated one.  (Without it, (eps_2K, delta_noise + delta_threshold) is not what
this proves: with |c| = 0, |d| = K the profile is delta_ab(eps_2K - K lambda), which the
general bound H_(eps-s) <= H_eps + e^s - 1 only puts below delta_noise + e^(K lambda) - 1,
a hair above delta.)  At epsilon = 2, delta = 1e-6, K = 64 (b = 17.73): eps_r = 2.9656.

For "basic" accounting (b = 2/eps', tau = 1 + 2 ln(2/delta')/eps', eps' = epsilon/K,
delta' = delta/K): an (a) or (b) word is (eps'/2, 0)-DP (shift 1, scale 2/eps'), a (c) or
(d) word (0, delta'/4)-DP (total variation p = delta'/4, either direction); basic
composition over at most 2K words gives (K eps', K delta'/2) = (epsilon, delta/2), so the
claimed (epsilon, delta) holds for replace-one too (conservative) and is what is returned.

Groups of records (r > 1, a PUBLIC bound on the records a training unit touches, e.g. the
notes of one patient, or the documents one training sequence takes its text from): group
privacy over the one-record relation, (r eps_1, delta_1 sum_(i<r) e^(i eps_1)) by
induction along a chain of r one-record neighbours.  Why not a direct PLD: r records can
move one word's count by up to r, and a word moved by j is Laplace(b) with shift j, i.e.
Laplace(b/j) with shift 1, whose loss sits at its maximum j/b with probability 1/2 against
2^-j for j composed Laplace(b) mechanisms.  So the PLD of rK composed Laplace(b) (every
word moved by one) is NOT an upper bound: r = 2 records sharing K common words already
need eps = 4.23 (K composed Laplace(b/2)) at delta_noise for epsilon = 2, delta = 1e-6,
K = 64, above that PLD's 2.97.  A provable direct bound exists (every moved word is
dominated by Laplace(b/r) with shift 1, since Laplace(b) = Laplace(b/r) + independent
noise, and at most rK words move; new words are released with probability up to
p e^((r-1)/b) each), but it is looser than group privacy wherever group privacy is useful
(eps = 6.38 against 4 at epsilon = 2, K = 64, r = 2, at delta_noise).  Where e^(eps_1) is
large group privacy's delta grows fast (epsilon = 8, r = 3: vacuous); the guarantee's delta
is then capped at 1 (no guarantee) rather than claimed smaller.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from typing import Any, Mapping

import numpy as np

from dpbert.core.checks import validate_delta

# No corpus has ln(n) >= 40 (n >= 2e17 examples), so a per-word epsilon this large always
# fails the theorem's condition eps' < ln n; also the floor of the PLD calibration (smaller
# Laplace scales make dp_accounting's grid explode: minutes and gigabytes).
MAX_PER_WORD_EPSILON = 40.0

# Upper limits on sizes (far above any real use; beyond them time or memory explodes:
# K = 1e6 takes 80 s and 3 GB to calibrate, vocab_size = 1e9 a billion [unusedN] lines).
MAX_WORDS_PER_EXAMPLE = 10_000

ACCOUNTING_MODES = ("pld", "basic")

# Neighbouring relations of histogram_guarantee (see the module docstring).
RELATIONS = ("add_remove", "replace")

# The HistogramPrivacy fields that vocab_privacy.json stores (vocab_report.make_report) and
# privacy_from_report checks against a fresh calibration, when present.
REPORTED_PARAMETERS = ("noise_scale", "threshold", "epsilon_per_word", "delta_per_word",
                       "delta_noise", "delta_threshold")


class VocabError(ValueError):
    """A DP vocabulary cannot be built with the given parameters or data."""




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


def check_conditions(privacy: HistogramPrivacy, num_examples: int,
                     names: Mapping[str, str] | None = None) -> None:
    """Checks 0 < eps' < ln n and 0 < delta' < 1/n for n = ``num_examples``.

    ``names``: the flags to name for "epsilon", "delta", "max_words_per_example" (default
    launch/build_vocab.py's; a training run passes its --config.vocab.* fields).

    Raises:
      VocabError: naming the violated condition and the values.
    """
    flag = {k: f"--{k}" for k in ("epsilon", "delta", "max_words_per_example")}
    flag.update(names or {})
    n = num_examples
    if n < 2:
        raise VocabError(f"need at least 2 examples for a DP vocabulary, got {n}")
    # The example-level rule, checked and worded exactly as training checks its delta.
    try:
        validate_delta(privacy.delta, n)
    except ValueError as e:
        raise VocabError(f"vocabulary {e}") from None
    eps_w, delta_w = privacy.epsilon_per_word, privacy.delta_per_word
    if not 0 < eps_w < math.log(n):
        raise VocabError(
            f"per-word epsilon {eps_w:.4g} must be in (0, ln n = {math.log(n):.4g}) for "
            f"n={n} examples (epsilon={privacy.epsilon}, K={privacy.max_words_per_example},"
            f" accounting={privacy.accounting}); lower {flag['epsilon']} or raise "
            f"{flag['max_words_per_example']}")
    if not 0 < delta_w < 1.0 / n:
        raise VocabError(
            f"per-word delta {delta_w:.4g} must be in (0, 1/n = {1.0 / n:.4g}) for "
            f"n={n} examples (delta={privacy.delta}, K={privacy.max_words_per_example}); "
            f"lower {flag['delta']}")





@dataclasses.dataclass(frozen=True)
class Guarantee:
    """The vocabulary's (epsilon, delta) under one neighbouring relation.

    Attributes:
      epsilon, delta: the guarantee (delta is capped at 1: no guarantee).
      relation: "add_remove" or "replace" (see :func:`histogram_guarantee`).
      records: the public bound on the vocabulary records one neighbour changes.
      explanation: one sentence for a report: the relation, the records, how it was computed.
    """

    epsilon: float
    delta: float
    relation: str
    records: int
    explanation: str


def _pld_interval(noise_scale: float) -> float:
    """dp_accounting's loss grid for Laplace(noise_scale): the default 1e-4, coarser for
    scales below 1 (2/b / interval points per mechanism at most 2e4: K = 1e4 at b = 0.09
    takes 16 s and 3 GB on the default grid, 1 s on this one).  A pessimistic grid gives an
    upper bound on epsilon at any interval (at most one interval per composed mechanism
    above the exact value)."""
    return 1e-4 * max(1.0, 1.0 / noise_scale)


@functools.lru_cache(maxsize=256)
def _laplace_epsilon_cached(noise_scale: float, num_compositions: int,
                            delta: float) -> tuple[float, str]:
    """(epsilon, how) of ``num_compositions`` Laplace(noise_scale) mechanisms (sensitivity 1)
    at ``delta``: dp_accounting's pessimistic PLD, or basic composition (n/b, pure) when that
    is smaller (also when delta is below what the PLD resolves: it returns inf)."""
    import dp_accounting  # lazy: workers never need it
    from dp_accounting import pld

    accountant = pld.PLDAccountant(value_discretization_interval=_pld_interval(noise_scale))
    accountant.compose(dp_accounting.SelfComposedDpEvent(
        dp_accounting.LaplaceDpEvent(noise_multiplier=noise_scale), num_compositions))
    epsilon, basic = float(accountant.get_epsilon(delta)), num_compositions / noise_scale
    if basic <= epsilon:
        return basic, "basic composition"
    return epsilon, "dp_accounting's PLD"


def _group_delta(epsilon: float, delta: float, records: int) -> float:
    """delta * sum_(i<records) e^(i epsilon), capped at 1, without overflow."""
    if records == 1:
        return delta
    # ln((e^(r eps) - 1) / (e^eps - 1)) for eps > 0
    log_sum = (records * epsilon + math.log1p(-math.exp(-records * epsilon))
               - epsilon - math.log1p(-math.exp(-epsilon)))
    return math.exp(min(0.0, math.log(delta) + log_sum))


def histogram_guarantee(privacy: HistogramPrivacy, relation: str, records: int) -> Guarantee:
    """The (epsilon, delta) of the noisy thresholded histogram under a stated relation.

    Computed from the mechanism's public parameters (b, tau, K, the delta split) with
    dp_accounting, never from the data; the argument is in the module docstring.

    Args:
      privacy: the calibrated mechanism (:func:`calibrate_histogram`, or
        :func:`privacy_from_report` for a built vocabulary).
      relation: "add_remove": the neighbour adds or removes ``records`` whole vocabulary
        records; "replace": the neighbour MODIFIES ``records`` vocabulary records, each
        replaced by another record of at most K words (e.g. a vocabulary per patient under
        a training unit of one note: removing the note modifies its patient's record).
      records: r >= 1, a PUBLIC bound on the records one neighbour changes.

    Returns:
      :class:`Guarantee`.  add_remove with one record: the calibrated (epsilon, delta)
      exactly.  replace with one record: "pld", (eps_2K + K lambda, delta) with eps_2K the
      PLD epsilon of 2K composed Laplace(b) at delta_noise and lambda = ln(1/(1 - p));
      "basic", the calibrated (epsilon, delta).  r > 1: group privacy over the one-record
      guarantee (eps_1, delta_1), (r eps_1, min(1, delta_1 sum_(i<r) e^(i eps_1))).

    Raises:
      VocabError: an unknown relation, ``records`` not an integer >= 1, or ``privacy`` not
        a HistogramPrivacy.
    """
    if not isinstance(privacy, HistogramPrivacy):
        raise VocabError(f"privacy must be a HistogramPrivacy, got {type(privacy).__name__}")
    if relation not in RELATIONS:
        raise VocabError(f"relation must be one of {RELATIONS}, got {relation!r}")
    if isinstance(records, bool) or not isinstance(records, numbers.Integral) or records < 1:
        raise VocabError(f"records must be an integer >= 1 (a public bound on the vocabulary "
                         f"records one neighbour changes), got {records!r}")
    records = int(records)
    k = privacy.max_words_per_example
    if relation == "add_remove":
        eps1, delta1 = privacy.epsilon, privacy.delta
        how = f"as calibrated ({privacy.accounting} accounting, K={k})"
        what = "adding or removing"
    elif privacy.accounting == "basic":
        eps1, delta1 = privacy.epsilon, privacy.delta
        how = (f"as calibrated (basic accounting: at most 2K={2 * k} counts move by 1, each "
               f"word (epsilon/2K, delta/4K)-DP, so (epsilon, delta/2) by basic composition)")
        what = "replacing"
    else:
        eps_noise, method = _laplace_epsilon_cached(privacy.noise_scale, 2 * k,
                                                    privacy.delta_noise)
        shift = -k * math.log1p(-privacy.delta_per_word)
        eps1, delta1 = eps_noise + shift, privacy.delta
        how = (f"{method} of 2K={2 * k} composed Laplace(b={privacy.noise_scale:.6g}) "
               f"mechanisms at delta_noise={privacy.delta_noise:.3g} (epsilon {eps_noise:.6g}) "
               f"plus K ln(1/(1-p))={shift:.3g} for words only the replacement has, with "
               f"delta_threshold={privacy.delta_threshold:.3g} for released new words")
        what = "replacing"
    if records == 1:
        return Guarantee(float(eps1), float(delta1), relation, 1,
                         f"{what.capitalize()} one vocabulary record (of at most K={k} words) "
                         f"is ({eps1:.6g}, {delta1:.3g})-DP, {how}.")
    epsilon, delta = records * eps1, _group_delta(eps1, delta1, records)
    vacuous = " (vacuous: delta capped at 1)" if delta >= 1.0 else ""
    return Guarantee(float(epsilon), float(delta), relation, records,
                     f"{what.capitalize()} up to {records} vocabulary records is "
                     f"({epsilon:.6g}, {delta:.3g})-DP{vacuous} by group privacy, "
                     f"(r eps_1, delta_1 sum_(i<r) e^(i eps_1)) with r={records}, over "
                     f"one record's ({eps1:.6g}, {delta1:.3g}), {how}.")


def privacy_from_report(report: Mapping[str, Any]) -> HistogramPrivacy:
    """Rebuilds the :class:`HistogramPrivacy` of a built vocabulary from its report.

    Recalibrates from the report's epsilon, delta, K and accounting
    (:func:`calibrate_histogram`; a report without "accounting" is taken as "pld", the
    build's default and the more conservative one under replacement) and, for every
    parameter the report stores (``REPORTED_PARAMETERS``: noise_scale, threshold, ...),
    checks that it is the recalibrated value.  Reports without them (older ones, or the
    shippable subset of ``dpbert.reporting.report.public_vocab_report``) are recalibrated unchecked.

    Args:
      report: the content of ``vocab_privacy.json`` (``vocab_report.make_report``).

    Returns:
      The calibrated :class:`HistogramPrivacy`.

    Raises:
      VocabError: a non-DP report, a missing or malformed field, or a stored parameter
        that the recalibration does not reproduce (the vocabulary was built with other
        parameters, or another dp_accounting version: its guarantee cannot be derived from
        epsilon, delta and K).
    """
    if not isinstance(report, Mapping):
        raise VocabError(f"a vocabulary report must be a mapping, got {type(report).__name__}")
    if not report.get("dp", True):
        raise VocabError("the vocabulary was built without differential privacy (dp=false): "
                         "it has no (epsilon, delta)")
    missing = [name for name in ("epsilon", "delta", "K") if report.get(name) is None]
    if missing:
        raise VocabError(f"the vocabulary report lacks {', '.join(missing)}")
    epsilon, delta, k = report["epsilon"], report["delta"], report["K"]
    if not (_is_number(epsilon) and _is_number(delta) and _is_number(k)):
        raise VocabError(f"the vocabulary report's epsilon, delta and K must be numbers, got "
                         f"{epsilon!r}, {delta!r}, {k!r}")
    if math.isfinite(k) and float(k).is_integer():
        k = int(k)  # JSON may spell 64 as 64.0; calibrate_histogram refuses any other float
    privacy = calibrate_histogram(float(epsilon), float(delta), k,
                                  str(report.get("accounting", "pld")))
    wrong = []
    for name in REPORTED_PARAMETERS:
        stored = report.get(name)
        if stored is None:
            continue
        value = getattr(privacy, name)
        if not (_is_number(stored) and math.isclose(stored, value, rel_tol=1e-9, abs_tol=0.0)):
            wrong.append(f"{name}={stored!r} (recalibrated: {value!r})")
    if wrong:
        raise VocabError(
            f"the vocabulary report (epsilon={epsilon}, delta={delta}, K={k}, "
            f"accounting={privacy.accounting}) does not match its recalibration: "
            f"{'; '.join(wrong)}; it was built with other parameters or another "
            f"dp_accounting version, so its guarantee cannot be derived from epsilon, delta "
            f"and K")
    return privacy


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

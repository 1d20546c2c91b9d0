"""Privacy of the DP vocabulary's histogram: calibration of the Laplace noise and threshold
for a target (epsilon, delta) with K words per example, the theorem's conditions, and the
noisy threshold itself (Korolova et al. 2009; Bun et al. 2019; Hoory et al. 2021 Sec. 3.2).

The only stage of `data_pipelines.dp_vocab` that needs a privacy analysis; the rest is
post-processing of its output.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any, Mapping

import numpy as np

# No corpus has ln(n) >= 40 (n >= 2e17 examples), so a per-word epsilon this large always
# fails the theorem's condition eps' < ln n; also the floor of the PLD calibration (smaller
# Laplace scales make dp_accounting's grid explode: minutes and gigabytes).
MAX_PER_WORD_EPSILON = 40.0

# Upper limits on sizes (far above any real use; beyond them time or memory explodes:
# K = 1e6 takes 80 s and 3 GB to calibrate, vocab_size = 1e9 a billion [unusedN] lines).
MAX_WORDS_PER_EXAMPLE = 10_000

ACCOUNTING_MODES = ("pld", "basic")


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

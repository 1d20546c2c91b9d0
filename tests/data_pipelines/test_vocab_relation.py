"""Tests for vocab_privacy.histogram_guarantee and privacy_from_report: the DP vocabulary's
(epsilon, delta) under a stated neighbouring relation (add/remove or replace, one record or a
group), checked against a brute-force PLD written here with NumPy only (independent of
dp_accounting) and against the exact output distributions of the thresholded noisy
histogram on tiny datasets."""

import collections
import json
import math

import numpy as np
import pytest
import scipy.fft
import scipy.signal

from data_pipelines import corpora, vocab_privacy, vocab_report
from data_pipelines.vocab_privacy import (VocabError, calibrate_histogram, histogram_guarantee,
                                          privacy_from_report)

# --------------------------------------------------------------------------- brute-force PLD
#
# One Laplace(b) mechanism of sensitivity 1, P = Lap(1, b) against Q = Lap(0, b): the
# privacy loss L(x) = (|x| - |x - 1|)/b is -1/b for x <= 0 (P-mass e^(-1/b)/2), +1/b for
# x >= 1 (P-mass 1/2) and (2x - 1)/b in between, where its P-density is
# e^(-1/(2b)) e^(L/2) / 4 on (-1/b, 1/b).  Q against P has the same loss distribution
# (symmetry), so one direction suffices.  On a grid of step h = 1/(b M) the atoms are exact
# and each cell's continuous mass (exact integral) is put at the cell's upper end (every loss
# rounded up: an upper bound on delta(eps) = E_P[(1 - e^(eps - L))_+], which is increasing
# in every loss) or at its lower end (a lower bound).  n-fold composition = n-fold
# convolution (FFT, no wrap-around: the transform is as long as the composed support), so
# the two epsilons at the target delta bracket the exact one.


def _laplace_loss_pmf(b: float, m: int, up: bool) -> np.ndarray:
    """P-mass of the loss on the grid (i - m) h, i = 0..2m, h = 1/(b m)."""
    h = 1.0 / (b * m)
    pmf = np.zeros(2 * m + 1)
    pmf[2 * m] += 0.5
    pmf[0] += 0.5 * math.exp(-1.0 / b)
    lower = (np.arange(2 * m) - m) * h  # cells [lower, lower + h]
    cells = 0.5 * math.exp(-0.5 / b) * np.exp(lower / 2.0) * math.expm1(h / 2.0)
    if up:
        pmf[1:] += cells
    else:
        pmf[:-1] += cells
    assert abs(pmf.sum() - 1.0) < 1e-12
    return pmf


def _compose(pmf: np.ndarray, n: int) -> np.ndarray:
    support = n * (len(pmf) - 1) + 1
    size = scipy.fft.next_fast_len(support, real=True)
    out = scipy.fft.irfft(scipy.fft.rfft(pmf, size) ** n, size)[:support]
    return np.clip(out, 0.0, None)  # round-off: |error| ~ 1e-17 per entry


def _epsilon_at_delta(pmf: np.ndarray, losses: np.ndarray, delta: float) -> float:
    """The eps >= 0 where E[(1 - e^(eps - L))_+] = delta, exactly for this discrete L."""
    pos = losses > 0
    p, l = pmf[pos], losses[pos]
    tail = np.cumsum(p[::-1])[::-1]                       # A_k = sum_{j >= k} p_j
    tail_exp = np.cumsum((p * np.exp(-l))[::-1])[::-1]    # B_k = sum_{j >= k} p_j e^-l_j
    left = np.concatenate([[0.0], l[:-1]])
    # For eps in [l_(k-1), l_k): delta(eps) = A_k - e^eps B_k (decreasing in eps).
    k = np.flatnonzero(tail - np.exp(left) * tail_exp > delta)[-1]
    return float(np.log((tail[k] - delta) / tail_exp[k]))


def brute_force_laplace_epsilon(b: float, n: int, delta: float,
                                grid: int = 2**20) -> tuple[float, float]:
    """(lower, upper) bracket of the epsilon of n composed Laplace(b) at delta."""
    m = max(64, grid // n)
    losses = (np.arange(2 * n * m + 1) - n * m) / (b * m)
    lower, upper = (_epsilon_at_delta(_compose(_laplace_loss_pmf(b, m, up), n), losses, delta)
                    for up in (False, True))
    assert lower <= upper
    return lower, upper


def test_brute_force_single_laplace_is_exact():
    # One Laplace(b): delta(eps) = 1 - e^((eps - 1/b)/2) for |eps| <= 1/b in closed form,
    # so eps(delta) = 1/b + 2 ln(1 - delta).
    b, delta = 2.0, 1e-3
    lower, upper = brute_force_laplace_epsilon(b, 1, delta)
    exact = 1 / b + 2 * math.log1p(-delta)
    assert lower <= exact <= upper and upper - lower < 1e-5


# Tolerance for the function's epsilon above the brute-force bracket: dp_accounting's
# pessimistic PLD (connect-the-dots on a 1e-4 loss grid) lies within 1e-6 of the exact value
# in these cases (see the report); 1e-4 leaves room for its discretization while still
# catching a wrong mechanism count (2K - 1 instead of 2K moves epsilon by ~0.01).  The
# function adds K ln(1/(1 - p)) (~delta_threshold) to the PLD epsilon, allowed for on top.
PLD_TOLERANCE = 1e-4
CASES = [(2.0, 1e-6, 64), (8.0, 1e-6, 16), (1.0, 1e-5, 8), (4.0, 1e-8, 256)]


@pytest.mark.parametrize("eps,delta,k", CASES)
def test_replace_one_matches_brute_force_pld(eps, delta, k):
    privacy = calibrate_histogram(eps, delta, k)
    g = histogram_guarantee(privacy, "replace", 1)
    shift = -k * math.log1p(-privacy.delta_per_word)
    lower, upper = brute_force_laplace_epsilon(privacy.noise_scale, 2 * k, privacy.delta_noise)
    # Never below the exact epsilon of 2K Laplace mechanisms (it is an upper bound) ...
    assert g.epsilon >= lower + shift
    # ... and no looser than the PLD's discretization.
    assert g.epsilon <= upper + shift + PLD_TOLERANCE
    assert g.delta == privacy.delta == pytest.approx(privacy.delta_noise
                                                     + privacy.delta_threshold)
    assert (g.relation, g.records) == ("replace", 1)
    # Replacing costs more than adding or removing.
    assert g.epsilon > eps
    if (eps, delta, k) == (2.0, 1e-6, 64):
        assert g.epsilon == pytest.approx(2.9656, abs=1e-4)


@pytest.mark.parametrize("eps,delta,k", CASES)
def test_add_remove_one_reproduces_the_calibration(eps, delta, k):
    privacy = calibrate_histogram(eps, delta, k)
    g = histogram_guarantee(privacy, "add_remove", 1)
    assert (g.epsilon, g.delta) == (privacy.epsilon, privacy.delta)
    lower, upper = brute_force_laplace_epsilon(privacy.noise_scale, k, privacy.delta_noise)
    # The calibrated epsilon is valid for K Laplace(b) (at least the exact epsilon) ...
    assert lower <= eps
    # ... and tight: calibrate_histogram stops its search for b within 1e-4 K/eps, and
    # epsilon ~ 1/b, so it exceeds the exact epsilon by about 1e-4 K/b at most.
    assert eps - upper <= 2e-4 * k / privacy.noise_scale


def test_replace_below_pld_resolution_uses_basic_composition():
    # calibrate_histogram falls back to b = K/eps (basic composition) when delta_noise is
    # below what the PLD resolves; 2K such mechanisms are (2 eps, 0)-DP.
    privacy = calibrate_histogram(8.0, 1e-300, 64)
    g = histogram_guarantee(privacy, "replace", 1)
    assert g.epsilon == pytest.approx(16.0) and g.epsilon >= 16.0
    assert g.delta == 1e-300 and "basic composition" in g.explanation


def test_basic_accounting_claims_hold_for_replace():
    # Per-word (eps'/2, 0) or (0, delta'/4) for at most 2K words: (eps, delta/2) <= claim.
    privacy = calibrate_histogram(8.0, 1e-6, 64, "basic")
    k = privacy.max_words_per_example
    assert 2 * k * (1.0 / privacy.noise_scale) == pytest.approx(privacy.epsilon)
    p_new = 0.5 * math.exp(-(privacy.threshold - 1.0) / privacy.noise_scale)
    assert 2 * k * p_new == pytest.approx(privacy.delta / 2)
    for relation in vocab_privacy.RELATIONS:
        g = histogram_guarantee(privacy, relation, 1)
        assert (g.epsilon, g.delta) == (8.0, 1e-6)
    # The basic calibration is also far more private than claimed by the exact PLD.
    lower, _ = brute_force_laplace_epsilon(privacy.noise_scale, 2 * k, privacy.delta / 2)
    assert lower < privacy.epsilon


# --------------------------------------------------------------------------- exact, tiny
#
# The mechanism on a histogram: every word of nonzero count c outputs c + Lap(b) if that is
# >= tau, else nothing ("absent"); words of count 0 are always absent; words independent.
# For two histograms, only words whose counts differ matter, and the privacy loss is a sum
# of independent per-word losses under P.  Per word the loss distribution is computed from
# the output distribution itself (the absent atom, the released density on [tau, inf),
# +inf where only P can release), on a loss grid with rounding up / down as above, then
# convolved across words: a rigorous bracket of the hockey-stick divergence.

H = 1e-4  # loss grid


def _laplace_cdf(x: np.ndarray | float, b: float) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    return np.where(x < 0, 0.5 * np.exp(np.minimum(x, 0) / b),
                    1.0 - 0.5 * np.exp(-np.maximum(x, 0) / b))


def _absent(c: int, b: float, tau: float) -> float:
    return 1.0 if c == 0 else float(_laplace_cdf(tau - c, b))


def _word_loss(c: int, c2: int, b: float, tau: float, up: bool):
    """P-distribution of one word's loss (P: count c, Q: count c2) on the grid i*H.

    Returns (offset, pmf, infinite mass): pmf[j] is the mass at loss (j - offset) H.
    """
    rnd = np.ceil if up else np.floor
    losses, masses, inf_mass = [], [], 0.0
    p_abs, q_abs = _absent(c, b, tau), _absent(c2, b, tau)
    losses.append(math.log(p_abs / q_abs))
    masses.append(p_abs)
    if c > 0 and c2 == 0:
        inf_mass = 1.0 - p_abs  # only P releases it
    elif c > 0:
        lo, hi = max(tau, min(c, c2)), max(tau, c, c2)
        # [tau, lo): loss (c2 - c)/b; [lo, hi): linear; [hi, inf): (c - c2)/b.
        losses += [(c2 - c) / b, (c - c2) / b]
        masses += [float(_laplace_cdf(lo - c, b) - _laplace_cdf(tau - c, b)),
                   float(1.0 - _laplace_cdf(hi - c, b))]
        if hi > lo:
            ys = np.linspace(lo, hi, int(math.ceil((hi - lo) * 2 / (b * H))) + 1)
            ls = (np.abs(ys - c2) - np.abs(ys - c)) / b  # monotone in y
            ends = np.maximum(ls[:-1], ls[1:]) if up else np.minimum(ls[:-1], ls[1:])
            losses += list(ends)
            masses += list(np.diff(_laplace_cdf(ys - c, b)))
    idx = rnd(np.asarray(losses) / H).astype(np.int64)
    offset = -idx.min()
    pmf = np.bincount(idx + offset, weights=np.asarray(masses))
    assert abs(pmf.sum() + inf_mass - 1.0) < 1e-9
    return offset, pmf, inf_mass


def hockey_stick(counts_p: dict, counts_q: dict, b: float, tau: float, eps: float,
                 up: bool) -> float:
    """An upper (``up``) or lower bound on H_eps(M(counts_p) || M(counts_q))."""
    offset, pmf, finite = 0, np.ones(1), 1.0
    for w in sorted(set(counts_p) | set(counts_q)):
        c, c2 = counts_p.get(w, 0), counts_q.get(w, 0)
        if c == c2:
            continue
        o, p, inf_mass = _word_loss(c, c2, b, tau, up)
        offset, pmf = offset + o, np.clip(scipy.signal.fftconvolve(pmf, p), 0.0, None)
        finite *= 1.0 - inf_mass
    losses = (np.arange(len(pmf)) - offset) * H
    keep = losses > eps
    return (1.0 - finite) + float(np.sum(pmf[keep] * -np.expm1(eps - losses[keep])))


def _counts(records) -> dict:
    return dict(collections.Counter(w for r in records for w in r))


# K = 2 words per record, delta large enough to be resolved: b = 1.96, tau = 11.39.
TINY = calibrate_histogram(1.0, 1e-2, 2)
# Common words (far above tau), words near tau, and words only the differing records have
# (U, V, W, Z).
SHARED = [("A", "B")] * 40 + [("C", "D")] * 40 + [("E",)] * 11 + [("F", "G")] * 12
REPLACEMENTS = [(("A", "B"), ("C", "D")), (("A", "B"), ("U", "V")), (("U", "V"), ("W", "Z")),
                (("A", "U"), ("C", "W")), (("E", "F"), ("A", "U")), (("A",), ("C", "U")),
                (("E",), ("E", "F")), (("F", "G"), ("U",))]


def test_exact_model_is_noisy_threshold():
    # The exact computation's model of a word against the code: release rate of a count.
    b, tau = TINY.noise_scale, TINY.threshold
    rng = np.random.default_rng(0)
    n = 20_000
    for c in (1, 11, 12, 14):
        kept = len(vocab_privacy.noisy_threshold({f"w{i}": c for i in range(n)}, b, tau, rng))
        p = 1.0 - _absent(c, b, tau)
        assert abs(kept / n - p) < 4.5 * math.sqrt(p * (1 - p) / n) + 1e-4


def test_replace_one_exact_on_tiny_datasets():
    b, tau = TINY.noise_scale, TINY.threshold
    add_remove = histogram_guarantee(TINY, "add_remove", 1)
    replace = histogram_guarantee(TINY, "replace", 1)
    worst_at_add_remove_eps = 0.0
    for x, x2 in REPLACEMENTS:
        d, d2 = _counts(SHARED + [x]), _counts(SHARED + [x2])
        for p, q in ((d, d2), (d2, d)):
            assert hockey_stick(p, q, b, tau, replace.epsilon, up=True) <= replace.delta, (x, x2)
            worst_at_add_remove_eps = max(worst_at_add_remove_eps,
                                          hockey_stick(p, q, b, tau, add_remove.epsilon, up=False))
    # Under replacement the add/remove figure is false: four common counts move.
    assert worst_at_add_remove_eps > 2 * add_remove.delta
    # And the replace figure is nearly attained (not merely a large number): the
    # all-common pair spends most of delta_noise at eps_r.
    d, d2 = _counts(SHARED + [("A", "B")]), _counts(SHARED + [("C", "D")])
    assert hockey_stick(d, d2, b, tau, replace.epsilon, up=False) > 0.5 * TINY.delta_noise


def test_add_remove_one_exact_on_tiny_datasets():
    b, tau = TINY.noise_scale, TINY.threshold
    g = histogram_guarantee(TINY, "add_remove", 1)
    for x in {r for pair in REPLACEMENTS for r in pair}:
        d, d2 = _counts(SHARED + [x]), _counts(SHARED)
        for p, q in ((d, d2), (d2, d)):
            assert hockey_stick(p, q, b, tau, g.epsilon, up=True) <= g.delta, x


# --------------------------------------------------------------------------- groups


@pytest.mark.parametrize("relation", vocab_privacy.RELATIONS)
def test_group_privacy(relation):
    privacy = calibrate_histogram(2.0, 1e-6, 64)
    one = histogram_guarantee(privacy, relation, 1)
    previous = one
    for r in (2, 3, 5):
        g = histogram_guarantee(privacy, relation, r)
        assert (g.relation, g.records) == (relation, r)
        assert g.epsilon == pytest.approx(r * one.epsilon)
        assert g.delta == pytest.approx(one.delta * sum(math.exp(i * one.epsilon)
                                                        for i in range(r)), rel=1e-12)
        assert g.epsilon > previous.epsilon and g.delta > previous.delta
        assert f"r={r}" in g.explanation and "group privacy" in g.explanation
        previous = g
    # Vacuous groups: delta capped at 1, no overflow.
    for r in (40, 10**6):
        g = histogram_guarantee(privacy, relation, r)
        assert g.delta == 1.0 and g.epsilon == pytest.approx(r * one.epsilon)
        assert "vacuous" in g.explanation


def test_group_privacy_exact_on_tiny_datasets():
    b, tau = TINY.noise_scale, TINY.threshold
    add2 = histogram_guarantee(TINY, "add_remove", 2)
    rep2 = histogram_guarantee(TINY, "replace", 2)
    # Two added records: counts move by up to 2 (same words twice, new words at count 2).
    for pair in [(("A", "B"), ("A", "B")), (("U", "V"), ("U", "V")), (("A", "U"), ("C", "W")),
                 (("E", "F"), ("E", "F"))]:
        d, d2 = _counts(SHARED + list(pair)), _counts(SHARED)
        for p, q in ((d, d2), (d2, d)):
            assert hockey_stick(p, q, b, tau, add2.epsilon, up=True) <= add2.delta, pair
    for old, new in [((("A", "B"),) * 2, (("C", "D"),) * 2),
                     ((("U", "V"),) * 2, (("W", "Z"),) * 2),
                     ((("A", "B"), ("E", "F")), (("U", "V"), ("C", "D")))]:
        d, d2 = _counts(SHARED + list(old)), _counts(SHARED + list(new))
        for p, q in ((d, d2), (d2, d)):
            assert hockey_stick(p, q, b, tau, rep2.epsilon, up=True) <= rep2.delta, (old, new)


# --------------------------------------------------------------------------- validation


@pytest.mark.parametrize("relation,records,match", [
    ("remove", 1, "relation"), ("add/remove", 1, "relation"), ("", 1, "relation"),
    ("replace", 0, "records"), ("replace", -1, "records"), ("add_remove", 1.5, "records"),
    ("add_remove", 2.0, "records"), ("add_remove", True, "records"),
    ("add_remove", "2", "records"), ("add_remove", None, "records"),
])
def test_bad_inputs(relation, records, match):
    privacy = calibrate_histogram(2.0, 1e-6, 64)
    with pytest.raises(VocabError, match=match):
        histogram_guarantee(privacy, relation, records)


def test_bad_privacy_and_numpy_records():
    with pytest.raises(VocabError, match="HistogramPrivacy"):
        histogram_guarantee({"epsilon": 2.0}, "replace", 1)
    privacy = calibrate_histogram(2.0, 1e-6, 64)
    assert (histogram_guarantee(privacy, "replace", np.int64(2))
            == histogram_guarantee(privacy, "replace", 2))


def test_guarantee_is_frozen_and_explained():
    privacy = calibrate_histogram(2.0, 1e-6, 64)
    g = histogram_guarantee(privacy, "replace", 1)
    with pytest.raises(AttributeError):
        g.epsilon = 1.0  # type: ignore[misc]
    assert "2K=128" in g.explanation and "Laplace" in g.explanation
    assert g.explanation.count(". ") == 0 and g.explanation.endswith(".")
    a = histogram_guarantee(privacy, "add_remove", 1)
    assert "as calibrated" in a.explanation


# --------------------------------------------------------------------------- report


def _vocab_report(privacy, k=64, eps=2.0, delta=1e-6, unit="patient"):
    report = vocab_report.make_report(privacy, "noteevents", eps, delta, k, 1000, 500, 100,
                                      True, None, 50_000, 3000, 800, corpora.ReadStats(), unit)
    return json.loads(json.dumps(report))  # what vocab_privacy.json gives back


@pytest.mark.parametrize("accounting", vocab_privacy.ACCOUNTING_MODES)
def test_report_round_trip(accounting):
    privacy = calibrate_histogram(2.0, 1e-6, 64, accounting)
    report = _vocab_report(privacy)
    for name in ("noise_scale", "threshold"):  # public parameters, stored as numbers
        assert isinstance(report[name], float)
    assert privacy_from_report(report) == privacy
    # Reports without the parameters (older ones, or the shippable subset) still work.
    old = {k: v for k, v in report.items() if k not in vocab_privacy.REPORTED_PARAMETERS}
    assert privacy_from_report(old) == privacy
    if accounting == "pld":
        del old["accounting"]  # taken as "pld"
        assert privacy_from_report(old) == privacy
    # JSON may spell K as a float.
    assert privacy_from_report({**report, "K": 64.0}) == privacy


def test_report_per_patient_used_per_note():
    # The review's example: a per-patient vocabulary under per-note training.
    report = _vocab_report(calibrate_histogram(2.0, 1e-6, 64))
    g = histogram_guarantee(privacy_from_report(report), "replace", 1)
    assert g.epsilon == pytest.approx(2.9656, abs=1e-4) and g.delta == 1e-6


def test_report_mismatch_and_bad_reports_refused():
    privacy = calibrate_histogram(2.0, 1e-6, 64)
    report = _vocab_report(privacy)
    with pytest.raises(VocabError, match=r"noise_scale=.*recalibrated"):
        privacy_from_report({**report, "noise_scale": report["noise_scale"] * 1.01})
    with pytest.raises(VocabError, match=r"threshold="):
        privacy_from_report({**report, "threshold": "319.6"})
    with pytest.raises(VocabError, match="delta_threshold"):
        privacy_from_report({**report, "delta_threshold": 1e-7})
    with pytest.raises(VocabError, match="without differential privacy"):
        privacy_from_report({**report, "dp": False})
    with pytest.raises(VocabError, match="lacks K"):
        privacy_from_report({k: v for k, v in report.items() if k != "K"})
    with pytest.raises(VocabError, match="must be numbers"):
        privacy_from_report({**report, "K": "64"})
    with pytest.raises(VocabError, match="max_words_per_example"):
        privacy_from_report({**report, "K": 64.5})
    with pytest.raises(VocabError, match="accounting"):
        privacy_from_report({**report, "accounting": "rdp"})
    with pytest.raises(VocabError, match="mapping"):
        privacy_from_report([("epsilon", 2.0)])
    non_dp = vocab_report.make_report(None, "text", None, None, 64, 1000, 500, 100, True, None,
                                      50, 300, 300, corpora.ReadStats())
    with pytest.raises(VocabError, match="without differential privacy"):
        privacy_from_report(non_dp)

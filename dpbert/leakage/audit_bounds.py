"""jax-privacy's one-run audit bounds (`jax_privacy.auditing.CanaryScoreAuditor`) beside ours
(`dpbert.leakage.audit`), and the rule that makes one headline of them.

The bounds, on the same scores and inclusion bits:

    dpbert_steinke        ours (`audit.audit_bound`): Steinke, Nasr & Jagielski 2023, two-sided
                          guesses (the k+ highest scores "in", the k- lowest "out") over 4
                          (k+, k-) pairs fixed in advance, Bonferroni over the pairs.
    jax_privacy_one_run   jax-privacy's `epsilon_one_run`: the same theorem, one-sided guesses
                          (every score above a threshold "in"), Bonferroni over every threshold.
    jax_privacy_fdp       jax-privacy's `epsilon_one_run_fdp` (Mahloujifar, Melis & Chaudhuri
                          2024, arXiv 2410.22235): rejects "the run is as private as the Gaussian
                          mechanism that is (ε, δ)-DP" (Gaussian DP). Much tighter (a perfect
                          attack on 256 canaries: 6.1 vs 3.3), but a lower bound on the ε of an
                          (ε, δ)-DP claim only for a run whose trade-off curve is no worse than
                          that Gaussian's, and DP-SGD's is not: its privacy profile has a heavier
                          tail (at the ε the PLD gives for δ = 1e-5, the matched Gaussian's ε at
                          δ' = 1e-9 is 2.7 where the run's own is 3.0; q = 0.01, σ = 1, 1000
                          steps). A correct DP-SGD run can therefore fail that test; it is
                          reported beside the headline, never in it or against the claim.

The headline (`HEADLINE_BOUNDS`) is the larger of the bounds that hold for EVERY (ε, δ)-DP
training run, each computed at confidence 1 - (1 - c) / 2 so that their maximum holds at c
(Bonferroni: a maximum over two tests at c each would hold only at 2c - 1). The split costs
about 5 % of a bound (a perfect attack on 256 canaries: ours 3.34 alone at 0.95, 3.19 at
0.975), so the headline can be a little below the single bound the audit reported before when
jax-privacy's guesses do not do better.
"""

from __future__ import annotations

import numpy as np
from jax_privacy import auditing

STEINKE = "dpbert_steinke"
ONE_RUN = "jax_privacy_one_run"
FDP = "jax_privacy_fdp"
# The bounds that hold for every (ε, δ)-DP run: the headline is their maximum.
HEADLINE_BOUNDS = (STEINKE, ONE_RUN)
METHODS = {
    STEINKE: "Steinke, Nasr & Jagielski 2023, two-sided guesses over fixed (k+, k-) pairs "
             "(dpbert.leakage.audit)",
    ONE_RUN: "Steinke, Nasr & Jagielski 2023, one-sided guesses over every threshold "
             "(jax_privacy.auditing.CanaryScoreAuditor.epsilon_one_run)",
    FDP: "Mahloujifar, Melis & Chaudhuri 2024, f-DP against the Gaussian mechanism "
         "(jax_privacy.auditing.CanaryScoreAuditor.epsilon_one_run_fdp); a lower bound on "
         "epsilon only for a run whose trade-off curve is Gaussian (DP-SGD's is not: a heavier "
         "tail), so neither the headline nor compared with the claim",
}


def headline_confidence(confidence: float) -> float:
    """The confidence of each headline bound so that their maximum holds at `confidence`."""
    return 1.0 - (1.0 - confidence) / len(HEADLINE_BOUNDS)


def _auditor(scores: np.ndarray, included: np.ndarray) -> auditing.CanaryScoreAuditor:
    scores, included = np.asarray(scores, np.float64), np.asarray(included, bool)
    if scores.shape != included.shape or scores.ndim != 1:
        raise ValueError(f"scores and inclusion bits differ in shape: {scores.shape}, "
                         f"{included.shape}")
    if included.all() or not included.any():
        raise ValueError("the audit needs both included and excluded canaries")
    return auditing.CanaryScoreAuditor(scores[included], scores[~included])


def jax_privacy_bounds(scores: np.ndarray, included: np.ndarray, *, delta: float,
                       confidence: float, fdp_confidence: float | None = None
                       ) -> dict[str, float]:
    """{ONE_RUN: ε at `confidence`, FDP: ε at `fdp_confidence` (default `confidence`)}:
    jax-privacy's two lower bounds (Bonferroni over every threshold, its default). Scores
    higher = "included", as ours."""
    auditor = _auditor(scores, included)
    fdp_confidence = confidence if fdp_confidence is None else fdp_confidence
    return {ONE_RUN: float(auditor.epsilon_one_run(1.0 - confidence, delta)),
            FDP: float(auditor.epsilon_one_run_fdp(1.0 - fdp_confidence, delta))}


def headline(bounds: dict[str, float]) -> tuple[str, float]:
    """(name, ε) of the largest of the HEADLINE_BOUNDS in `bounds` (ours on a tie)."""
    name = max(HEADLINE_BOUNDS, key=lambda n: (bounds[n], n == STEINKE))
    return name, bounds[name]

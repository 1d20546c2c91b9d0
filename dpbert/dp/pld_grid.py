"""Bounded PLD grids: epsilons that finish in seconds whatever the noise (host side, no JAX).

A tiny noise multiplier (sigma = 0.01) makes the privacy loss span ~1/sigma^2 nats: on
dp_accounting's default grid one step's PLD has ~1e8 points and the composition runs for minutes
and past 4 GB. `pld_discretization_for` coarsens the grid (by powers of two, so grids stay
nested) when one step's PLD would exceed `MAX_PLD_POINTS_SINGLE` points or the composed PLD
`MAX_PLD_POINTS_COMPOSED` points (estimated on a coarse probe with dp_accounting's own truncation
bounds). A coarser pessimistic grid still gives an upper bound on epsilon, only a looser one;
reports say so (`dpbert.dp.accountants.PldAccountant.coarse_grid`). Too small a sigma (a grid
coarser than 1 nat) or more than 1e8 steps are refused with the reason (sigma above 1e6:
`dpbert.dp.noise_modes`). A sparse single-step PLD
(large sigma) composed many times goes to dp_accounting's dense path directly
(`accountant_equivalent_epsilon`, the same number), because its sparse path first computes
size ** steps exactly.
"""

from __future__ import annotations

import functools
import math

from dp_accounting.pld import common as pld_common
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import privacy_loss_distribution as pld_lib

# dp_accounting's own default grid; reported epsilons use it so they agree with a plain
# `PLDAccountant()`.
DEFAULT_PLD_DISCRETIZATION = 1e-4
# Grid size limits (see "Bounded PLD grids" above): a few seconds and < 1 GB per epsilon.
MAX_PLD_POINTS_SINGLE = 500_000
MAX_PLD_POINTS_COMPOSED = 4_000_000
# Coarsest grid (nats per point) accepted; a noise multiplier that needs more is refused.
MAX_PLD_DISCRETIZATION = 1.0
# Most steps the PLD accountant is asked to compose (dp_accounting's sparse self-composition
# computes size ** steps exactly: 1e12 steps never returns). max_steps_within_budget's limit.
MAX_PLD_STEPS = 10**8
# Points of the coarse probe PLD used to estimate the composed size.
_PLD_PROBE_POINTS = 2_000


def sparse_self_compose_is_slow(single: pld_lib.PrivacyLossDistribution, steps: int) -> bool:
    """Whether dp_accounting would compose this single-step PLD by first computing
    size ** steps as an exact integer for a sparse PMF (sigma = 5 at 1e7 steps: minutes)."""
    for pmf in (single._pmf_remove, single._pmf_add):  # private: representation only
        if isinstance(pmf, pld_pmf.SparsePLDPmf) and (
                pmf.size < 2 or steps * math.log2(pmf.size) > 1e5):
            return True
    return False


def accountant_equivalent_epsilon(single: pld_lib.PrivacyLossDistribution, steps: int,
                                   delta: float, discretization: float) -> float:
    """What `PLDAccountant().compose(event).get_epsilon(delta)` computes (identity composed
    with single.self_compose(steps)), taking dp_accounting's own dense path directly: where
    size ** steps exceeds its sparse limit it would convert to dense anyway, so the result is
    the same (tests/dpbert/dp/test_accounting.py checks equality)."""
    def compose(pmf):
        if isinstance(pmf, pld_pmf.SparsePLDPmf):
            pmf = pmf.to_dense_pmf()
        return pmf.self_compose(steps)

    remove = compose(single._pmf_remove)
    composed = (pld_lib.PrivacyLossDistribution(remove) if single._symmetric else
                pld_lib.PrivacyLossDistribution(remove, compose(single._pmf_add)))
    return float(pld_lib.identity(discretization).compose(composed)
                 .get_epsilon_for_delta(delta))


def pld_discretization_for(spec, steps: int,
                           discretization: float = DEFAULT_PLD_DISCRETIZATION) -> float:
    """The PLD grid used for `steps` compositions of one step of `spec` (BandMF: its rounds,
    `AccountingSpec.rounds`): `discretization`, or a coarser one (x 2^k) where the default grid
    would explode (see "Bounded PLD grids")."""
    return bounded_discretization(spec.effective_noise_multiplier, spec.q, spec.group_size,
                                   spec.max_batch_size, steps, discretization)


def _truncates(num_examples: int, max_batch_size: int | None) -> bool:
    return max_batch_size is not None and max_batch_size < num_examples


@functools.lru_cache(maxsize=256)
def _single_step_loss_range(sigma_eff: float, q: float, num_examples: int,
                            max_batch_size: int | None) -> float:
    """Width (nats) of one step's privacy-loss support on dp_accounting's truncated tails:
    the single-step PLD has about width / discretization points."""
    from dp_accounting.pld import privacy_loss_mechanism as plm
    from scipy import stats

    def width(sigma: float, prob: float, adjacency) -> float:
        loss = plm.GaussianPrivacyLoss(sigma, sampling_prob=prob, adjacency_type=adjacency)
        tail = loss.privacy_loss_tail()
        return (loss.privacy_loss(tail.lower_x_truncation)
                - loss.privacy_loss(tail.upper_x_truncation))

    adj = plm.AdjacencyType
    w = max(width(sigma_eff, q, adj.REMOVE), width(sigma_eff, q, adj.ADD) if q < 1 else 0.0)
    if _truncates(num_examples, max_batch_size):
        # dp_accounting mixes in a replace-one Gaussian of std sigma/2 (its conditional q).
        p_trunc = stats.binom.sf(max_batch_size - 1, num_examples - 1, q)
        if p_trunc > 0:
            cond_q = min(1.0, stats.binom.sf(max_batch_size, num_examples, q)
                         * max_batch_size / p_trunc / num_examples)
            w = max(w, width(sigma_eff / 2, cond_q, adj.REPLACE))
    return float(w)


@functools.lru_cache(maxsize=256)
def _probe_pmfs(sigma_eff: float, q: float, num_examples: int, max_batch_size: int | None,
                discretization: float) -> tuple:
    """Probability lists of a coarse single-step PLD (for size estimates only)."""
    pld = (pld_lib.from_truncated_subsampled_gaussian_mechanism(
               dataset_size=num_examples, sampling_probability=q,
               truncated_batch_size=max_batch_size, noise_multiplier=sigma_eff,
               value_discretization_interval=discretization)
           if _truncates(num_examples, max_batch_size) else
           pld_lib.from_gaussian_mechanism(standard_deviation=sigma_eff, sampling_prob=q,
                                           value_discretization_interval=discretization))
    out = []
    # Private attributes, read only to estimate sizes (the epsilon never depends on them).
    for pmf in (pld._pmf_remove, pld._pmf_add):
        if isinstance(pmf, pld_pmf.DensePLDPmf):
            out.append(pmf._probs)
        else:
            out.append(pld_common.dictionary_to_list(pmf._loss_probs)[1])
    return tuple(out)


@functools.lru_cache(maxsize=1024)
def bounded_discretization(sigma_eff: float, q: float, num_examples: int,
                            max_batch_size: int | None, steps: int,
                            discretization: float) -> float:
    """`discretization` x 2^k, the smallest k keeping the single-step PLD under
    MAX_PLD_POINTS_SINGLE points and the `steps`-fold composition (dp_accounting's own
    truncation bounds, on a coarse probe) under MAX_PLD_POINTS_COMPOSED points."""
    if steps > MAX_PLD_STEPS:
        raise ValueError(
            f"steps={steps} is more than the PLD accountant composes ({MAX_PLD_STEPS:.0e}); "
            "use accountant='rdp' (--accountant=rdp) for an upper bound")
    width = _single_step_loss_range(sigma_eff, q, num_examples, max_batch_size)
    needed = width / MAX_PLD_POINTS_SINGLE
    if needed > MAX_PLD_DISCRETIZATION:
        raise ValueError(
            f"noise multiplier {sigma_eff:g} (effective) is too small to account: one step's "
            f"privacy loss spans {width:.3g} nats (a PLD grid coarser than "
            f"{MAX_PLD_DISCRETIZATION:g} nat per point would be needed); such a run has an "
            "astronomically large epsilon, i.e. no meaningful privacy. Raise the noise "
            "multiplier (config.dp.noise_multiplier, --noise_multiplier) or lower the target "
            "epsilon (config.dp.target_epsilon, --target_epsilon)")
    if steps > 1 and width / discretization * steps > MAX_PLD_POINTS_COMPOSED:
        probe = min(MAX_PLD_DISCRETIZATION, max(discretization, width / _PLD_PROBE_POINTS))
        composed = 0.0
        for probs in _probe_pmfs(sigma_eff, q, num_examples, max_batch_size, probe):
            lo, hi = pld_common.compute_self_convolve_bounds(probs, steps, 1e-15)
            composed = max(composed, (hi - lo) * probe)
        needed = max(needed, composed / MAX_PLD_POINTS_COMPOSED)
        if needed > MAX_PLD_DISCRETIZATION:
            raise ValueError(
                f"{steps} steps at noise multiplier {sigma_eff:g} (effective) spread the "
                f"privacy loss over {composed:.3g} nats: too wide for the PLD accountant (an "
                "astronomically large epsilon); use fewer steps, more noise, or "
                "accountant='rdp' (--accountant=rdp) for an upper bound")
    if needed <= discretization:
        return discretization
    return discretization * 2.0 ** math.ceil(math.log2(needed / discretization))

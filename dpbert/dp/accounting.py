"""Privacy accounting for DP-SGD on top of `dp_accounting` (host side, no JAX).

Nothing here is a hand-written accountant: every epsilon comes from a
`dp_accounting` accountant composing a `dp_accounting` event.

Mechanism accounted (one *logical* step = one noise draw = one optimizer update):

* ``sampling="poisson"`` (default): every example enters the logical batch
  independently with probability ``q = expected_batch_size / num_examples``; the
  sum of per-example gradients clipped to norm C gets Gaussian noise of std
  ``sigma_eff * C``.  Event: ``SelfComposedDpEvent(PoissonSampledDpEvent(q,
  GaussianDpEvent(sigma_eff)), steps)``.
* Poisson with a maximum batch size (``max_batch_size``, what
  `dpbert.dp.sampling.PoissonSampler` really does because jitted shapes are
  fixed): a batch larger than the maximum is cut to a uniformly random subset of
  that size.  Event: ``SelfComposedDpEvent(TruncatedSubsampledGaussianDpEvent(N,
  q, max_batch_size, sigma_eff), steps)`` (PLD only; RDP does not support it).
* ``sampling="shuffle"``: fixed-size batches from a shuffled epoch.  Its epsilon
  is computed *as if* Poisson with the same q; that is NOT a proven bound and
  every report says so (``proven_bound=False``).

``sigma_eff`` is the noise multiplier really added: ``sigma`` in
``noise_mode="global"`` and ``sigma * sqrt(num_shards)`` in
``noise_mode="per_shard"`` (TF CrossShardOptimizer behaviour, Hoory et al. 2021
Eq. 3).

PLD discretization.  Every epsilon uses ``dp_accounting``'s default PLD grid
(``value_discretization_interval=1e-4``, pessimistic, so every epsilon is an
upper bound), so reported numbers agree with a plain `PLDAccountant()`.
Calibration (`calibrate_noise_multiplier`) and the step budget
(`max_steps_within_budget`) search with dp_accounting's PLD objects directly
(same grid, single-step PLD cached, see `_fast_pld_epsilon`) starting from an
RDP estimate, then verify the answer with a fresh accountant exactly as
`compute_epsilon` does: a calibrated sigma never reports more than its target,
and a budget never allows a step beyond it.  Calibration at 1,000,000 steps
takes about 1-3 s.  Measured accuracy of the default grid: the epsilon of a
calibrated sigma re-evaluated on a 10x finer grid is at most 1 % below the
target (tests/dpbert/dp/test_accounting.py; 7.9925 for target 8 at 1M steps in
BENCHMARKS.md), i.e. the grid costs at most ~1 % extra noise.

Bounded PLD grids.  A tiny noise multiplier (sigma = 0.01) makes the privacy loss
span ~1/sigma^2 nats: on the default grid one step's PLD has ~1e8 points and the
composition runs for minutes and past 4 GB.  `pld_discretization_for` therefore
coarsens the grid (by powers of two, so grids stay nested) when one step's PLD
would exceed `MAX_PLD_POINTS_SINGLE` points or the composed PLD
`MAX_PLD_POINTS_COMPOSED` points (estimated on a coarse probe with dp_accounting's
own truncation bounds).  A coarser pessimistic grid still gives an upper bound on
epsilon, only a looser one; reports say so (`privacy_report`'s note).  For the
noise multipliers of real runs (tested: sigma 0.3-1 at the demo's and MIMIC's
sizes) the grid is the default and every epsilon is unchanged.  Too small a sigma
(a grid coarser than 1 nat), more than 1e8 steps, or sigma above 1e6 are refused
with the reason.  A sparse single-step PLD (large sigma) composed many times is
composed on dp_accounting's dense path directly (`_accountant_equivalent_epsilon`,
the same number), because its sparse path first computes size ** steps exactly.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import dp_accounting
from scipy import optimize
from dp_accounting.pld import common as pld_common
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.rdp import rdp_privacy_accountant

ACCOUNTANTS = ("pld", "rdp")
SAMPLING_MODES = ("poisson", "shuffle")
NOISE_MODES = ("global", "per_shard")
# Usual privacy units ("example" = one pretraining sequence); any name is accepted.
PRIVACY_UNITS = ("example", "patient", "document")

# dp_accounting's own default grid; reported epsilons use it so they agree with a
# plain `PLDAccountant()` computation.
DEFAULT_PLD_DISCRETIZATION = 1e-4
# Grid size limits (see "Bounded PLD grids" above): a few seconds and < 1 GB per epsilon.
MAX_PLD_POINTS_SINGLE = 500_000
MAX_PLD_POINTS_COMPOSED = 4_000_000
# Largest effective noise multiplier accounted (dp_accounting overflows beyond ~1e150 and
# its RDP series stop converging near 1e10; epsilon is already ~1e-10 at 1e6).
MAX_NOISE_MULTIPLIER = 1e6
# Starts the sentence that privacy_report's note adds when the grid was coarsened.
COARSE_GRID_NOTE = "Noise multiplier too small for the default PLD grid"
# Coarsest grid (nats per point) accepted; a noise multiplier that needs more is refused.
MAX_PLD_DISCRETIZATION = 1.0
# Most steps the PLD accountant is asked to compose (dp_accounting's sparse self-composition
# computes size ** steps exactly: 1e12 steps never returns). max_steps_within_budget's limit.
MAX_PLD_STEPS = 10**8
# Points of the coarse probe PLD used to estimate the composed size.
_PLD_PROBE_POINTS = 2_000
# Relative tolerance of calibrated noise multipliers.
CALIBRATION_RTOL = 1e-3

SHUFFLE_NOTE = (
    "sampling='shuffle' (fixed-size batches from shuffled epochs): epsilon is "
    "computed as if batches were Poisson-sampled with q = batch_size / "
    "num_examples. This is NOT a proven differential-privacy bound for "
    "shuffled batches.")


# ----------------------------------------------------------------------------
# Validation
# ----------------------------------------------------------------------------

def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}={value!r} is not one of {list(choices)}")


def _check_positive(name: str, value: float, *, allow_inf: bool = False) -> None:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ValueError(f"{name}={value!r} must be a number")
    if not value > 0 or (math.isinf(value) and not allow_inf) or math.isnan(value):
        raise ValueError(f"{name}={value!r} must be a positive finite number")


def _check_int(name: str, value: Any, *, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) and not (
            isinstance(value, float) and value.is_integer()):
        raise ValueError(f"{name}={value!r} must be an integer")
    if int(value) < minimum:
        raise ValueError(f"{name}={value!r} must be >= {minimum}")
    return int(value)


def validate_delta(delta: float, num_examples: int | None) -> None:
    """Raises ValueError unless 0 < delta < 1/num_examples (when known)."""
    if not isinstance(delta, (int, float)) or isinstance(delta, bool) or not 0 < delta < 1:
        raise ValueError(f"delta={delta!r} must be in (0, 1)")
    if num_examples is not None and delta >= 1.0 / num_examples:
        raise ValueError(
            f"delta={delta!r} must be < 1/num_examples = {1.0 / num_examples:.3g} "
            f"(num_examples={num_examples}); a larger delta allows releasing a "
            "random example in the clear")


def sampling_probability(expected_batch_size: float, num_examples: int) -> float:
    """Returns q = expected_batch_size / num_examples, validated to 0 < q <= 1."""
    num_examples = _check_int("num_examples", num_examples, minimum=1)
    _check_positive("expected_batch_size", expected_batch_size)
    q = expected_batch_size / num_examples
    if not 0 < q <= 1:
        raise ValueError(
            f"sampling probability q = expected_batch_size / num_examples = "
            f"{expected_batch_size} / {num_examples} = {q:.6g} must be in (0, 1]")
    return q


def effective_noise_multiplier(noise_multiplier: float, noise_mode: str = "global",
                               num_shards: int = 1) -> float:
    """The noise multiplier the accountant must see (Hoory et al. Eq. 3).

    Args:
      noise_multiplier: sigma as configured (noise std per draw / clip norm).
      noise_mode: "global" (one draw of std sigma*C per logical batch, whatever
        the number of shards) or "per_shard" (every one of `num_shards` shards adds
        its own std sigma*C draw, like TF's CrossShardOptimizer).
      num_shards: P, the number of data shards (only used for "per_shard").

    Returns:
      sigma for "global", sigma * sqrt(P) for "per_shard".
    """
    _check_choice("noise_mode", noise_mode, NOISE_MODES)
    _check_positive("noise_multiplier", noise_multiplier)
    num_shards = _check_int("num_shards", num_shards, minimum=1)
    sigma = (noise_multiplier * math.sqrt(num_shards) if noise_mode == "per_shard"
             else float(noise_multiplier))
    if sigma > MAX_NOISE_MULTIPLIER:
        raise ValueError(
            f"noise_multiplier={noise_multiplier!r} (effective {sigma:g}) is above "
            f"{MAX_NOISE_MULTIPLIER:g}: dp_accounting's arithmetic overflows there (its "
            "epsilon would be ~0, and such noise drowns every gradient)")
    return sigma


# ----------------------------------------------------------------------------
# Events and accountants
# ----------------------------------------------------------------------------

def make_dp_event(effective_sigma: float, q: float, steps: int, *,
                  num_examples: int | None = None,
                  max_batch_size: int | None = None) -> dp_accounting.DpEvent:
    """The dp_accounting event of `steps` DP-SGD updates.

    Args:
      effective_sigma: noise multiplier really added (see
        `effective_noise_multiplier`).
      q: Poisson sampling probability.
      steps: number of logical steps (noise draws).
      num_examples: dataset size N (needed with `max_batch_size`).
      max_batch_size: if set and < N, batches larger than this are truncated to a
        uniformly random subset of this size (truncated Poisson sampling).

    Returns:
      `SelfComposedDpEvent` of a Poisson-subsampled (or truncated) Gaussian.
    """
    steps = _check_int("steps", steps, minimum=0)
    if max_batch_size is not None:
        max_batch_size = _check_int("max_batch_size", max_batch_size, minimum=1)
        if num_examples is None:
            raise ValueError("max_batch_size needs num_examples")
        if max_batch_size < num_examples:
            return dp_accounting.SelfComposedDpEvent(
                dp_accounting.TruncatedSubsampledGaussianDpEvent(
                    dataset_size=int(num_examples), sampling_probability=q,
                    truncated_batch_size=max_batch_size,
                    noise_multiplier=effective_sigma),
                steps)
    return dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(
            q, dp_accounting.GaussianDpEvent(effective_sigma)),
        steps)


def make_accountant(accountant: str = "pld", *,
                    pld_discretization: float = DEFAULT_PLD_DISCRETIZATION
                    ) -> dp_accounting.PrivacyAccountant:
    """A fresh dp_accounting accountant (add-or-remove-one neighbouring)."""
    _check_choice("accountant", accountant, ACCOUNTANTS)
    if accountant == "pld":
        return pld_privacy_accountant.PLDAccountant(
            value_discretization_interval=pld_discretization)
    return rdp_privacy_accountant.RdpAccountant()


def _event_epsilon(event: dp_accounting.DpEvent, delta: float, accountant: str,
                   pld_discretization: float) -> float:
    acc = make_accountant(accountant, pld_discretization=pld_discretization)
    if not acc.supports(event):
        raise ValueError(
            f"accountant={accountant!r} cannot account {type(event.event).__name__}"
            " (truncated Poisson sampling needs accountant='pld')")
    return float(acc.compose(event).get_epsilon(delta))


@dataclasses.dataclass(frozen=True)
class AccountingSpec:
    """Everything the accountant needs about a DP-SGD run, validated.

    Attributes:
      noise_multiplier: sigma as configured (std of each noise draw / C).
      expected_batch_size: q * N, the public expected logical batch size.
      num_examples: N, dataset size in privacy units.
      delta: target delta (< 1/N).
      sampling: "poisson" | "shuffle".
      noise_mode: "global" | "per_shard".
      num_shards: P (matters only for "per_shard").
      max_batch_size: truncation size of Poisson batches, or None.
      accountant: "pld" (default) | "rdp".
    """

    noise_multiplier: float
    expected_batch_size: float
    num_examples: int
    delta: float
    sampling: str = "poisson"
    noise_mode: str = "global"
    num_shards: int = 1
    max_batch_size: int | None = None
    accountant: str = "pld"

    def __post_init__(self):
        _check_choice("sampling", self.sampling, SAMPLING_MODES)
        _check_choice("accountant", self.accountant, ACCOUNTANTS)
        _check_int("num_examples", self.num_examples, minimum=1)
        validate_delta(self.delta, self.num_examples)
        sampling_probability(self.expected_batch_size, self.num_examples)
        effective_noise_multiplier(self.noise_multiplier, self.noise_mode, self.num_shards)
        if self.max_batch_size is not None:
            _check_int("max_batch_size", self.max_batch_size, minimum=1)
            if self.sampling != "poisson":
                raise ValueError("max_batch_size (truncation) applies to sampling='poisson' only")
            if self.accountant != "pld" and self.max_batch_size < self.num_examples:
                raise ValueError(
                    f"accountant={self.accountant!r} cannot account truncated Poisson "
                    f"sampling (max_batch_size={self.max_batch_size}); use accountant='pld'")

    @classmethod
    def from_sampler(cls, sampler: Any, *, noise_multiplier: float, delta: float,
                     noise_mode: str = "global", num_shards: int = 1,
                     accountant: str = "pld") -> "AccountingSpec":
        """The spec of a run fed by a `dpbert.dp.sampling` sampler.

        Takes sampling, N, expected batch size and, for Poisson sampling, the
        sampler's truncation size (calls_per_batch * physical_batch_size) from the
        sampler itself, so the accounted mechanism is the one really run.
        """
        max_batch = getattr(sampler, "max_batch_size", None)
        truncates = sampler.sampling == "poisson" and max_batch < sampler.num_examples
        return cls(noise_multiplier=noise_multiplier,
                   expected_batch_size=sampler.expected_batch_size,
                   num_examples=sampler.num_examples, delta=delta, sampling=sampler.sampling,
                   noise_mode=noise_mode, num_shards=num_shards,
                   max_batch_size=max_batch if truncates else None, accountant=accountant)

    @property
    def q(self) -> float:
        return sampling_probability(self.expected_batch_size, self.num_examples)

    @property
    def effective_noise_multiplier(self) -> float:
        return effective_noise_multiplier(self.noise_multiplier, self.noise_mode, self.num_shards)

    @property
    def proven_bound(self) -> bool:
        return self.sampling == "poisson"

    def event(self, steps: int) -> dp_accounting.DpEvent:
        return make_dp_event(self.effective_noise_multiplier, self.q, steps,
                             num_examples=self.num_examples,
                             max_batch_size=self.max_batch_size)

    def epsilon(self, steps: int, *,
                pld_discretization: float = DEFAULT_PLD_DISCRETIZATION) -> float:
        """Epsilon after `steps` logical steps at this spec's delta (PLD: on the grid of
        `pld_discretization(self, steps, ...)`, coarser only where the default explodes)."""
        if self.accountant == "pld":
            pld_discretization = pld_discretization_for(self, steps, pld_discretization)
            single = _single_step_pld(self.effective_noise_multiplier, self.q,
                                      self.num_examples, self.max_batch_size, pld_discretization)
            if steps > 1 and _sparse_self_compose_is_slow(single, steps):
                return _accountant_equivalent_epsilon(single, steps, self.delta,
                                                      pld_discretization)
        return _event_epsilon(self.event(steps), self.delta, self.accountant,
                              pld_discretization)

    def replace(self, **changes) -> "AccountingSpec":
        return dataclasses.replace(self, **changes)


def compute_epsilon(*, noise_multiplier: float, expected_batch_size: float,
                    num_examples: int, steps: int, delta: float,
                    accountant: str = "pld", sampling: str = "poisson",
                    noise_mode: str = "global", num_shards: int = 1,
                    max_batch_size: int | None = None,
                    pld_discretization: float = DEFAULT_PLD_DISCRETIZATION) -> float:
    """Epsilon of `steps` DP-SGD steps (see the module docstring for the event)."""
    spec = AccountingSpec(noise_multiplier=noise_multiplier,
                          expected_batch_size=expected_batch_size,
                          num_examples=num_examples, delta=delta, sampling=sampling,
                          noise_mode=noise_mode, num_shards=num_shards,
                          max_batch_size=max_batch_size, accountant=accountant)
    return spec.epsilon(steps, pld_discretization=pld_discretization)


def progress_epsilon(spec: AccountingSpec, steps: int) -> float:
    """Epsilon for progress logs during a run (PLD specs: reuses the cached single-step PLD).

    The same PLD composition as `spec.epsilon` (see `_fast_pld_epsilon`) without rebuilding
    the single-step distribution at every call, which for truncated Poisson sampling costs
    seconds. Reports and budgets use `spec.epsilon`, the accountant itself.
    """
    if steps <= 0:
        return 0.0
    if spec.accountant != "pld":
        return spec.epsilon(steps)
    return _fast_pld_epsilon(spec.effective_noise_multiplier, spec, steps)


# ----------------------------------------------------------------------------
# Calibration
# ----------------------------------------------------------------------------

@functools.lru_cache(maxsize=32)
def _single_step_pld(sigma_eff: float, q: float, num_examples: int,
                     max_batch_size: int | None, discretization: float
                     ) -> pld_lib.PrivacyLossDistribution:
    """dp_accounting's PLD of one step (cached: building it is the slow part for
    truncated sampling, ~1 s, while searches over the number of steps reuse it)."""
    if max_batch_size is not None and max_batch_size < num_examples:
        return pld_lib.from_truncated_subsampled_gaussian_mechanism(
            dataset_size=num_examples, sampling_probability=q,
            truncated_batch_size=max_batch_size, noise_multiplier=sigma_eff,
            value_discretization_interval=discretization)
    return pld_lib.from_gaussian_mechanism(
        standard_deviation=sigma_eff, sampling_prob=q,
        value_discretization_interval=discretization)


def _fast_pld_epsilon(sigma_eff: float, spec: AccountingSpec, steps: int,
                      discretization: float = DEFAULT_PLD_DISCRETIZATION) -> float:
    """PLD epsilon of `steps` steps, computed with dp_accounting's PLD objects.

    Mathematically the same as `spec.epsilon` with the PLD accountant.  It exists
    only for speed inside root searches: dp_accounting's sparse PMF
    ``self_compose(T)`` computes ``size ** T`` as an exact Python integer (about
    1.5 s at T = 1e6), so a sparse single-step PLD is composed in two stages
    (64 copies, then T // 64 copies of that, then the remainder), which differs
    from the one-stage result only through the 1e-15 tail truncation per stage.
    Dense single-step PLDs are composed exactly as the accountant does.  Every
    calibrated value is re-checked with the real accountant.
    """
    discretization = _bounded_discretization(sigma_eff, spec.q, spec.num_examples,
                                             spec.max_batch_size, steps, discretization)
    single = _single_step_pld(sigma_eff, spec.q, spec.num_examples, spec.max_batch_size,
                              discretization)
    # Private attribute, used only to pick the faster of two equivalent paths.
    sparse = isinstance(getattr(single, "_pmf_remove", None), pld_pmf.SparsePLDPmf)
    if sparse and steps > 64:
        blocks, rest = divmod(steps, 64)
        composed = single.self_compose(64).self_compose(blocks)
        if rest:
            composed = composed.compose(single.self_compose(rest))
    else:
        composed = single.self_compose(steps)
    return float(composed.get_epsilon_for_delta(spec.delta))


def _sparse_self_compose_is_slow(single: pld_lib.PrivacyLossDistribution, steps: int) -> bool:
    """Whether dp_accounting would compose this single-step PLD by first computing
    size ** steps as an exact integer for a sparse PMF (sigma = 5 at 1e7 steps: minutes)."""
    for pmf in (single._pmf_remove, single._pmf_add):  # private: representation only
        if isinstance(pmf, pld_pmf.SparsePLDPmf) and (
                pmf.size < 2 or steps * math.log2(pmf.size) > 1e5):
            return True
    return False


def _accountant_equivalent_epsilon(single: pld_lib.PrivacyLossDistribution, steps: int,
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


def pld_discretization_for(spec: AccountingSpec, steps: int,
                           discretization: float = DEFAULT_PLD_DISCRETIZATION) -> float:
    """The PLD grid used for `steps` steps of `spec`: `discretization`, or a coarser one
    (x 2^k) where the default grid would explode (see "Bounded PLD grids")."""
    return _bounded_discretization(spec.effective_noise_multiplier, spec.q, spec.num_examples,
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
def _bounded_discretization(sigma_eff: float, q: float, num_examples: int,
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
            "multiplier (or lower the target epsilon)")
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


def _calibrate_sigma_eff(spec: AccountingSpec, steps: int, target_epsilon: float,
                         rtol: float) -> float:
    """Smallest effective sigma (within rtol) whose reported epsilon is <= target.

    1. RDP calibration (`dp_accounting.calibrate_dp_mechanism`, ~0.01 s per
       evaluation) gives a starting point (RDP is looser, so it over-estimates).
    2. Brent's method on log(epsilon) versus log(sigma) (nearly linear) with the
       PLD on the reporting grid, typically 4-6 evaluations.
    The caller verifies the answer with the real accountant (`_round_up`).
    """
    q, delta = spec.q, spec.delta
    truncated = spec.max_batch_size is not None and spec.max_batch_size < spec.num_examples

    if spec.accountant == "rdp" or not truncated:
        start = float(dp_accounting.calibrate_dp_mechanism(
            rdp_privacy_accountant.RdpAccountant,
            lambda s: make_dp_event(s, q, steps), target_epsilon, delta,
            bracket_interval=dp_accounting.LowerEndpointAndGuess(1e-3, 1.0),
            tol=1e-6 if spec.accountant == "rdp" else 1e-4))
        if spec.accountant == "rdp":
            return start
    else:  # RDP cannot account truncation: start from plain Poisson via PLD.
        start = _calibrate_sigma_eff(spec.replace(max_batch_size=None), steps,
                                     target_epsilon, rtol)

    cache: dict[float, float] = {}

    def gap(log_sigma: float) -> float:
        if log_sigma not in cache:
            eps = _fast_pld_epsilon(math.exp(log_sigma), spec, steps)
            cache[log_sigma] = math.log(max(eps, 1e-300)) - math.log(target_epsilon)
        return cache[log_sigma]

    # Bracket the root in log(sigma).
    hi = math.log(start)
    while gap(hi) > 0:
        hi += 0.2
    lo = hi - 0.1
    while gap(lo) <= 0:
        lo, hi = lo - 0.2, lo
    root = optimize.brentq(gap, lo, hi, xtol=rtol / 4)
    # brentq's root may sit on either side; take the safe end within tolerance.
    candidates = [x for x in (root, root + rtol / 4, hi) if gap(x) <= 0]
    return math.exp(min(candidates))


def _round_up(sigma: float, rtol: float, ok) -> float:
    """Returns sigma * (1 + rtol)^k for the smallest k >= 0 with ok(.) True."""
    for _ in range(1000):
        if ok(sigma):
            return sigma
        sigma *= 1 + rtol
    raise RuntimeError("calibration verification did not converge")


def calibrate_noise_multiplier(*, target_epsilon: float, expected_batch_size: float,
                               num_examples: int, steps: int, delta: float,
                               accountant: str = "pld", sampling: str = "poisson",
                               noise_mode: str = "global", num_shards: int = 1,
                               max_batch_size: int | None = None,
                               rtol: float = CALIBRATION_RTOL) -> float:
    """Smallest configured sigma (within `rtol`) whose epsilon is <= target.

    The returned sigma is what goes into the training config: in
    ``noise_mode="per_shard"`` it is sigma_eff / sqrt(P).  The result is verified:
    `compute_epsilon` with the same arguments returns <= target_epsilon.
    """
    _check_positive("target_epsilon", target_epsilon)
    steps = _check_int("steps", steps, minimum=1)
    _check_positive("rtol", rtol)
    # noise_multiplier=1 is a placeholder; only the other fields are used.
    spec = AccountingSpec(noise_multiplier=1.0, expected_batch_size=expected_batch_size,
                          num_examples=num_examples, delta=delta, sampling=sampling,
                          noise_mode=noise_mode, num_shards=num_shards,
                          max_batch_size=max_batch_size, accountant=accountant)
    sigma_eff = _calibrate_sigma_eff(spec, steps, target_epsilon, rtol)
    sigma = sigma_eff / effective_noise_multiplier(1.0, noise_mode, num_shards)
    # Verified exactly as `compute_epsilon` will compute it (a fresh dp_accounting
    # accountant, the configured sigma), nudged up by factors (1 + rtol) if needed.
    return _round_up(sigma, rtol, lambda s: spec.replace(noise_multiplier=s).epsilon(steps)
                     <= target_epsilon)


def scale_noise_multiplier_sqrt(noise_multiplier: float, old_batch_size: float,
                                new_batch_size: float) -> float:
    """Hoory et al.'s rule: sigma proportional to sqrt(B).

    At a fixed number of *epochs* this keeps epsilon approximately (not exactly)
    constant: epsilon ~ q sqrt(T) / sigma = sqrt(epochs * B / N) / sigma.  Use
    `recalibrate_for_batch_size` for an exact answer.
    """
    _check_positive("noise_multiplier", noise_multiplier)
    _check_positive("old_batch_size", old_batch_size)
    _check_positive("new_batch_size", new_batch_size)
    return noise_multiplier * math.sqrt(new_batch_size / old_batch_size)


def recalibrate_for_batch_size(*, noise_multiplier: float, old_batch_size: float,
                               new_batch_size: float, num_examples: int, steps: int,
                               delta: float, **spec_kwargs) -> tuple[float, int]:
    """Noise multiplier and steps for a new batch size with the same epochs and epsilon.

    Args:
      noise_multiplier, old_batch_size, steps: the current plan.
      new_batch_size: the new expected batch size.
      num_examples, delta, **spec_kwargs: as for `compute_epsilon`.

    Returns:
      (sigma_new, steps_new) with steps_new = round(steps * old / new) (same
      number of epochs) and sigma_new calibrated so that epsilon(sigma_new,
      steps_new) <= epsilon(noise_multiplier, steps) (the old plan's epsilon).
    """
    target = compute_epsilon(noise_multiplier=noise_multiplier,
                             expected_batch_size=old_batch_size, num_examples=num_examples,
                             steps=steps, delta=delta, **spec_kwargs)
    new_steps = max(1, round(steps * old_batch_size / new_batch_size))
    sigma = calibrate_noise_multiplier(target_epsilon=target, expected_batch_size=new_batch_size,
                                       num_examples=num_examples, steps=new_steps, delta=delta,
                                       **spec_kwargs)
    return sigma, new_steps


# ----------------------------------------------------------------------------
# Budget
# ----------------------------------------------------------------------------

def max_steps_within_budget(spec: AccountingSpec, target_epsilon: float,
                            upper_limit: int = MAX_PLD_STEPS) -> int:
    """Largest T <= upper_limit with spec.epsilon(T) <= target_epsilon (0 if none).

    Exact for `spec.epsilon` (the reported epsilon): epsilon(T) <= target <
    epsilon(T + 1), unless T == upper_limit.  The search runs RDP first (fast,
    looser, so its T is a lower estimate), then the fast PLD path, and ends with
    dp_accounting's accountant on the final candidates.  One-off cost at the
    start of a run: a few seconds for T ~ 1e6.
    """
    _check_positive("target_epsilon", target_epsilon)
    upper_limit = _check_int("upper_limit", upper_limit, minimum=1)

    def ok(steps: int) -> bool:
        return steps == 0 or spec.epsilon(steps) <= target_epsilon

    if spec.accountant == "rdp":
        return _last_true(ok, 1, upper_limit, first_step=1)
    start = 1
    if spec.max_batch_size is None or spec.max_batch_size >= spec.num_examples:
        rdp_spec = spec.replace(accountant="rdp")
        start = max(1, _last_true(
            lambda t: t == 0 or rdp_spec.epsilon(t) <= target_epsilon, 1, upper_limit,
            first_step=1))
    sigma_eff = spec.effective_noise_multiplier
    fast = _last_true(
        lambda t: t == 0 or _fast_pld_epsilon(sigma_eff, spec, t) <= target_epsilon,
        start, upper_limit, first_step=max(1, start // 100))
    return _last_true(ok, max(fast, 1), upper_limit, first_step=1)


def _last_true(pred, start: int, upper_limit: int, first_step: int) -> int:
    """Last t in [0, upper_limit] with pred(t), for pred monotone (True then False).

    pred(0) must be True.  Gallops from `start` (steps doubling from
    `first_step`) to a bracket, then bisects.
    """
    step = first_step
    if pred(start):
        lo, hi = start, None
        while hi is None:
            if lo == upper_limit:
                return lo
            cand = min(lo + step, upper_limit)
            if pred(cand):
                lo, step = cand, step * 2
            else:
                hi = cand
    else:
        lo, hi = None, start
        while lo is None:
            cand = max(hi - step, 0)
            if cand == 0 or pred(cand):
                lo = cand
            else:
                hi, step = cand, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if pred(mid):
            lo = mid
        else:
            hi = mid
    return lo


class PrivacyBudget:
    """Answers "may the run take another DP-SGD step?" so epsilon never exceeds the target.

    One step = one noise draw (one optimizer update), not one physical batch.
    Usage in the training loop::

        budget = PrivacyBudget(spec, target_epsilon=8.0)
        budget.load_state_dict(ckpt["privacy_budget"])   # on resume
        while budget.may_take_step():
            ... one logical step ...
            budget.record_step()
        ckpt["privacy_budget"] = budget.state_dict()

    `state_dict()` is a plain dict of ints and floats; loading checks that it was
    produced under the same privacy parameters and raises otherwise.
    """

    def __init__(self, spec: AccountingSpec, target_epsilon: float,
                 max_steps: int | None = None):
        """Args:
          spec: the run's accounting parameters.
          target_epsilon: epsilon never to exceed.
          max_steps: optional precomputed `max_steps_within_budget(spec, target)`
            (computing it takes a few seconds at ~1M steps).
        """
        _check_positive("target_epsilon", target_epsilon)
        self.spec = spec
        self.target_epsilon = float(target_epsilon)
        self.max_steps = (max_steps_within_budget(spec, target_epsilon)
                          if max_steps is None else int(max_steps))
        self.steps_taken = 0

    def may_take_step(self) -> bool:
        return self.steps_taken < self.max_steps

    def record_step(self) -> None:
        if not self.may_take_step():
            raise RuntimeError(
                f"privacy budget exhausted: {self.steps_taken} steps taken, "
                f"epsilon target {self.target_epsilon} allows {self.max_steps}")
        self.steps_taken += 1

    @property
    def remaining_steps(self) -> int:
        return self.max_steps - self.steps_taken

    def epsilon_spent(self) -> float:
        return self.spec.epsilon(self.steps_taken) if self.steps_taken else 0.0

    def _fingerprint(self) -> dict[str, int | float]:
        s = self.spec
        return {
            "target_epsilon": self.target_epsilon,
            "delta": float(s.delta),
            "effective_noise_multiplier": float(s.effective_noise_multiplier),
            "expected_batch_size": float(s.expected_batch_size),
            "num_examples": int(s.num_examples),
            "max_batch_size": int(s.max_batch_size or 0),
            "poisson": int(s.sampling == "poisson"),
            "pld": int(s.accountant == "pld"),
        }

    def state_dict(self) -> dict[str, int | float]:
        return {"steps_taken": self.steps_taken, "max_steps": self.max_steps,
                **self._fingerprint()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        for key, value in self._fingerprint().items():
            if key not in state:
                raise ValueError(f"privacy budget checkpoint lacks key {key!r}")
            saved = state[key]
            if (float(saved) != float(value) if isinstance(value, float)
                    else int(saved) != value):
                raise ValueError(
                    f"privacy budget checkpoint has {key}={saved!r} but this run has "
                    f"{key}={value!r}; changing privacy parameters mid-run is not supported")
        # Keep the smaller limit if this run computes a different one (e.g. after a
        # dp_accounting upgrade): a resumed run never goes beyond either.
        self.max_steps = min(self.max_steps, int(state["max_steps"]))
        steps = int(state["steps_taken"])
        if steps > self.max_steps:
            raise ValueError(f"checkpoint steps_taken={steps} exceeds max_steps={self.max_steps}")
        self.steps_taken = steps


# ----------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------

def privacy_report(spec: AccountingSpec, steps: int, *, clip_norm: float | None,
                   privacy_unit: str = "example",
                   epsilon: float | None = None) -> dict[str, Any]:
    """The privacy statement of a run, JSON-serialisable.

    Args:
      spec: accounting parameters.
      steps: logical steps (noise draws) taken.
      clip_norm: C (None when unknown, e.g. in the CLI).
      privacy_unit: what one "example" is ("example" = one sequence, "patient", ...);
        the neighbouring relation adds or removes one such unit.
      epsilon: precomputed epsilon (else computed with `spec`).

    Returns:
      dict with epsilon, delta, noise_multiplier, effective_noise_multiplier,
      clip_norm, sampling, sampling_probability, expected_batch_size,
      max_batch_size, num_examples, steps, accountant, privacy_unit, noise_mode,
      num_shards, proven_bound and note.
    """
    if not isinstance(privacy_unit, str) or not privacy_unit:
        raise ValueError(f"privacy_unit={privacy_unit!r} must be a non-empty string "
                         f"(e.g. one of {list(PRIVACY_UNITS)})")
    if clip_norm is not None:
        _check_positive("clip_norm", clip_norm)
    steps = _check_int("steps", steps, minimum=0)
    if epsilon is None:
        epsilon = spec.epsilon(steps) if steps else 0.0
    unit_note = (f" The privacy unit ({privacy_unit!r}) must be what the sampler draws and "
                 "the clipper treats as ONE example (one dataset row); a unit spanning "
                 "several rows is not covered.")
    note = (SHUFFLE_NOTE if spec.sampling == "shuffle" else (
        "Poisson sampling; epsilon is an upper bound from dp_accounting "
        f"({spec.accountant.upper()} accountant, add-or-remove-one neighbouring "
        f"{privacy_unit}s).")) + unit_note
    if spec.accountant == "pld" and steps:
        grid = pld_discretization_for(spec, steps)
        if grid > DEFAULT_PLD_DISCRETIZATION:
            note += (f" {COARSE_GRID_NOTE} ({DEFAULT_PLD_DISCRETIZATION:g}: minutes and "
                     f"gigabytes); a coarser pessimistic grid ({grid:g}) was used: epsilon is "
                     "still an upper bound, only a looser one.")
    return {
        "epsilon": float(epsilon),
        "delta": float(spec.delta),
        "noise_multiplier": float(spec.noise_multiplier),
        "effective_noise_multiplier": float(spec.effective_noise_multiplier),
        "clip_norm": None if clip_norm is None else float(clip_norm),
        "sampling": spec.sampling,
        "sampling_probability": spec.q,
        "expected_batch_size": float(spec.expected_batch_size),
        "max_batch_size": spec.max_batch_size,
        "num_examples": int(spec.num_examples),
        "steps": steps,
        "accountant": spec.accountant,
        "privacy_unit": privacy_unit,
        "noise_mode": spec.noise_mode,
        "num_shards": int(spec.num_shards),
        "proven_bound": spec.proven_bound,
        "note": note,
    }

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
Calibration (`dpbert.dp.calibration.calibrate_noise_multiplier`) and the step budget
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
composition runs for minutes and past 4 GB.  `pld_discretization_for` (`dpbert.dp.pld_grid`)
therefore
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
from dp_accounting.pld import pld_pmf
from dp_accounting.pld import pld_privacy_accountant
from dp_accounting.pld import privacy_loss_distribution as pld_lib
from dp_accounting.rdp import rdp_privacy_accountant

from dpbert.dp import pld_grid
from dpbert.dp.pld_grid import (COARSE_GRID_NOTE, MAX_NOISE_MULTIPLIER, MAX_PLD_STEPS,  # noqa: F401
                                pld_discretization_for)
from dpbert.dp.sampling import SAMPLING_MODES, check_int

ACCOUNTANTS = ("pld", "rdp")
NOISE_MODES = ("global", "per_shard")
# Usual privacy units ("example" = one pretraining sequence); any name is accepted.
PRIVACY_UNITS = ("example", "patient", "document")

# dp_accounting's own default grid; reported epsilons use it so they agree with a
# plain `PLDAccountant()` computation.
DEFAULT_PLD_DISCRETIZATION = pld_grid.DEFAULT_PLD_DISCRETIZATION
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
    num_examples = check_int("num_examples", num_examples, minimum=1)
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
    num_shards = check_int("num_shards", num_shards, minimum=1)
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
    steps = check_int("steps", steps, minimum=0)
    if max_batch_size is not None:
        max_batch_size = check_int("max_batch_size", max_batch_size, minimum=1)
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


def event_epsilon(event: dp_accounting.DpEvent, delta: float, accountant: str,
                  pld_discretization: float = DEFAULT_PLD_DISCRETIZATION) -> float:
    """Epsilon of any dp_accounting event by a fresh accountant of the named kind."""
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
        check_int("num_examples", self.num_examples, minimum=1)
        validate_delta(self.delta, self.num_examples)
        sampling_probability(self.expected_batch_size, self.num_examples)
        effective_noise_multiplier(self.noise_multiplier, self.noise_mode, self.num_shards)
        if self.max_batch_size is not None:
            check_int("max_batch_size", self.max_batch_size, minimum=1)
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
        steps = check_int("steps", steps, minimum=0)
        if self.accountant == "pld":
            pld_discretization = pld_discretization_for(self, steps, pld_discretization)
            mechanism = _mechanism(self)
            single = _single_step_pld(*mechanism, pld_discretization)
            if steps > 1 and pld_grid.sparse_self_compose_is_slow(single, steps):
                return pld_grid.accountant_equivalent_epsilon(single, steps, self.delta,
                                                      pld_discretization)
            if steps > 0:
                return _accountant_composed_epsilon(((mechanism, steps),), self.delta,
                                                    pld_discretization)
        return event_epsilon(self.event(steps), self.delta, self.accountant,
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


def _mechanism(spec: "AccountingSpec") -> tuple:
    """The arguments of `_single_step_pld` that describe one step of `spec` (hashable)."""
    return (spec.effective_noise_multiplier, spec.q, spec.num_examples, spec.max_batch_size)


@functools.lru_cache(maxsize=256)
def _accountant_composed_epsilon(parts: tuple, delta: float, discretization: float) -> float:
    """What a fresh `PLDAccountant(discretization)` answers for the composition, in order,
    of `SelfComposedDpEvent(e_i, steps_i)` for `parts` = ((mechanism of e_i, steps_i), ...)
    (`_mechanism`): the same calls in the same order (identity, then composing each
    `steps_i`-fold self-composition of the single-step PLD, then the epsilon query), so the
    same float, but on the cached single-step PLDs instead of rebuilt ones (seconds each time
    for truncated Poisson, and a run asks at every checkpoint; cached too, as the last
    checkpoint and the final report ask for the same step).
    `tests/dpbert/dp/test_accounting.py` checks the equality with the accountant bit for bit.
    """
    composed = pld_lib.identity(value_discretization_interval=discretization)
    for mechanism, steps in parts:
        single = _single_step_pld(*mechanism, discretization)
        composed = composed.compose(single.self_compose(steps))
    return float(composed.get_epsilon_for_delta(delta))


def composed_epsilon(segments: list[tuple["AccountingSpec", int]]) -> float:
    """Epsilon of the segments [(spec, steps), ...] run one after the other (a resumed run
    whose mechanism changed), as a fresh accountant of their kind computes it for the
    `ComposedDpEvent` of their events, at the first spec's delta. Every spec must have the
    same delta and accountant (`dpbert.dp.ledger` checks). Segments of 0 steps are left out.
    """
    segments = [(spec, check_int("steps", steps, minimum=0)) for spec, steps in segments]
    segments = [(spec, steps) for spec, steps in segments if steps > 0]
    if not segments:
        return 0.0
    first = segments[0][0]
    if len(segments) == 1:
        return first.epsilon(segments[0][1])
    if first.accountant == "pld":
        parts = tuple((_mechanism(spec), steps) for spec, steps in segments)
        return _accountant_composed_epsilon(parts, first.delta, DEFAULT_PLD_DISCRETIZATION)
    return event_epsilon(dp_accounting.ComposedDpEvent(
        [spec.event(steps) for spec, steps in segments]), first.delta, first.accountant)


def _fast_pld_epsilon(sigma_eff: float, spec: AccountingSpec, steps: int,
                      discretization: float = DEFAULT_PLD_DISCRETIZATION,
                      prior: tuple = ()) -> float:
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
    # One grid for every segment (PLDs compose only on the same grid): the coarsest needed.
    discretization = max([pld_grid.bounded_discretization(
        s.spec.effective_noise_multiplier, s.spec.q, s.spec.num_examples,
        s.spec.max_batch_size, max(s.steps, 1), discretization) for s in prior] + [
        pld_grid.bounded_discretization(sigma_eff, spec.q, spec.num_examples,
                                        spec.max_batch_size, max(steps, 1), discretization)])
    composed = _composed_pld(sigma_eff, spec, steps, discretization)
    for segment in prior:  # earlier segments of a resumed run (`dpbert.dp.ledger`)
        earlier = _composed_pld(segment.spec.effective_noise_multiplier, segment.spec,
                                segment.steps, discretization)
        if earlier is not None:
            composed = earlier if composed is None else earlier.compose(composed)
    if composed is None:
        return 0.0
    return float(composed.get_epsilon_for_delta(spec.delta))


def _composed_pld(sigma_eff: float, spec: AccountingSpec, steps: int,
                  discretization: float) -> pld_lib.PrivacyLossDistribution | None:
    """The PLD of `steps` steps of `spec` (None for 0 steps)."""
    if steps <= 0:
        return None
    single = _single_step_pld(sigma_eff, spec.q, spec.num_examples, spec.max_batch_size,
                              discretization)
    # Private attribute, used only to pick the faster of two equivalent paths.
    sparse = isinstance(getattr(single, "_pmf_remove", None), pld_pmf.SparsePLDPmf)
    if sparse and steps > 64:
        blocks, rest = divmod(steps, 64)
        composed = single.self_compose(64).self_compose(blocks)
        if rest:
            composed = composed.compose(single.self_compose(rest))
        return composed
    return single.self_compose(steps)


def fast_pld_epsilon(spec: AccountingSpec, steps: int, prior: tuple = ()) -> float:
    """`_fast_pld_epsilon` at the spec's own noise, after the segments `prior` (for progress
    logs and budget searches of resumed runs; reports use the accountant itself)."""
    return _fast_pld_epsilon(spec.effective_noise_multiplier, spec, steps, prior=tuple(prior))


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
    steps = check_int("steps", steps, minimum=0)
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

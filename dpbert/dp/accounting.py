"""Privacy accounting for DP-SGD on top of `dp_accounting` (host side, no JAX).

Nothing here is a hand-written accountant: every epsilon comes from a `dp_accounting`
accountant composing a `dp_accounting` event, through the `Accountant` named by the spec
(`dpbert.dp.accountants`: "pld", the default, or "rdp").

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
  every report says so (``proven_bound=False``; the words are `dpbert.reporting.report`'s).

``sigma_eff`` is the noise multiplier really added: ``sigma`` in
``noise_mode="global"`` and ``sigma * sqrt(num_shards)`` in
``noise_mode="per_shard"`` (TF CrossShardOptimizer behaviour, Hoory et al. 2021
Eq. 3; the rule is `dpbert.dp.noise_modes.shard_factor`).

PLD discretization.  Every epsilon uses ``dp_accounting``'s default PLD grid
(``value_discretization_interval=1e-4``, pessimistic, so every epsilon is an
upper bound), so reported numbers agree with a plain `PLDAccountant()`.
Calibration (`dpbert.dp.calibration.calibrate_noise_multiplier`) and the step budget
(`max_steps_within_budget`) search with dp_accounting's PLD objects directly
(single-step PLD cached, `dpbert.dp.accountants`; calibration first on a 16x
coarser grid, then on the same grid) starting from an RDP estimate, then
verify the answer with a fresh accountant exactly as
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
epsilon, only a looser one; reports say so (`Accountant.coarse_grid` gives the grid,
`dpbert.reporting.report` the sentence).  For the
noise multipliers of real runs (tested: sigma 0.3-1 at the demo's and MIMIC's
sizes) the grid is the default and every epsilon is unchanged.  Too small a sigma
(a grid coarser than 1 nat), more than 1e8 steps, or sigma above 1e6 are refused
with the reason.  A sparse single-step PLD (large sigma) composed many times is
composed on dp_accounting's dense path directly (`pld_grid.accountant_equivalent_epsilon`,
the same number), because its sparse path first computes size ** steps exactly.

`privacy_report` gives the numbers and flags of one mechanism; the prose about them is written
by `dpbert.reporting.report` (`mechanism_report`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import dp_accounting

from dpbert.core import units as privacy_units
from dpbert.core.checks import check_choice, check_int, check_positive, validate_delta
from dpbert.dp import accountants, bandmf
from dpbert.dp.accountants import DEFAULT_PLD_DISCRETIZATION, make_dp_event  # noqa: F401
from dpbert.dp.noise_modes import NOISE_MODES, effective_noise_multiplier  # noqa: F401
from dpbert.dp.pld_grid import MAX_PLD_STEPS, pld_discretization_for  # noqa: F401
from dpbert.dp.sampling import SAMPLING_MODES

# The accountants' names (`dpbert.dp.accountants`).
ACCOUNTANTS = accountants.NAMES
# Relative tolerance of calibrated noise multipliers.
CALIBRATION_RTOL = 1e-3


def sampling_probability(expected_batch_size: float, num_examples: int) -> float:
    """Returns q = expected_batch_size / num_examples, validated to 0 < q <= 1."""
    num_examples = check_int("num_examples", num_examples, minimum=1)
    check_positive("expected_batch_size", expected_batch_size)
    q = expected_batch_size / num_examples
    if not 0 < q <= 1:
        raise ValueError(
            f"sampling probability q = expected_batch_size / num_examples = "
            f"{expected_batch_size} / {num_examples} = {q:.6g} must be in (0, 1]")
    return q


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
      accountant: the name of its `dpbert.dp.accountants.Accountant`: "pld" (default) |
        "rdp" (a name, so that specs round-trip through JSON: `accounted_by` is the object).
      mechanism: "dpsgd" (i.i.d. noise) | "bandmf" (`dpbert.dp.bandmf`: noise correlated by a
        banded strategy, cyclic Poisson sampling of `num_bands` groups of N // num_bands units
        with q = expected_batch_size / (N // num_bands), ceil(T / num_bands) rounds accounted).
      num_bands: b (1 for "dpsgd").
      strategy: BandMF's b Toeplitz coefficients (norm 1; () for "dpsgd"). They do not change
        epsilon, but the noise: part of the spec so that a resumed run keeps them.
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
    mechanism: str = "dpsgd"
    num_bands: int = 1
    strategy: tuple[float, ...] = ()

    def __post_init__(self):
        check_choice("sampling", self.sampling, SAMPLING_MODES)
        check_choice("mechanism", self.mechanism, bandmf.MECHANISMS)
        accountant = accountants.get(self.accountant)
        check_int("num_examples", self.num_examples, minimum=1)
        check_int("num_bands", self.num_bands, minimum=1)
        if self.mechanism == "dpsgd":
            if self.num_bands != 1 or self.strategy:
                raise ValueError("num_bands and strategy belong to mechanism='bandmf'")
        else:
            if self.sampling != "poisson":
                raise ValueError("mechanism='bandmf' samples by cyclic Poisson: "
                                 "sampling='poisson'")
            object.__setattr__(self, "strategy", bandmf.check_strategy(self.strategy))
            if len(self.strategy) != self.num_bands:
                raise ValueError(f"a {self.num_bands}-band strategy has {self.num_bands} "
                                 f"coefficients, not {len(self.strategy)}")
            if self.num_examples < self.num_bands:
                raise ValueError(f"num_examples={self.num_examples} is below "
                                 f"num_bands={self.num_bands}")
        validate_delta(self.delta, self.num_examples)
        sampling_probability(self.expected_batch_size, self.num_examples)
        effective_noise_multiplier(self.noise_multiplier, self.noise_mode, self.num_shards)
        if self.max_batch_size is not None:
            check_int("max_batch_size", self.max_batch_size, minimum=1)
            if self.sampling != "poisson":
                raise ValueError("max_batch_size (truncation) applies to sampling='poisson' only")
            if not accountant.supports(self):
                raise ValueError(
                    f"accountant={self.accountant!r} cannot account truncated Poisson "
                    f"sampling (max_batch_size={self.max_batch_size}); use accountant='pld'")

    @classmethod
    def from_sampler(cls, sampler: Any, *, noise_multiplier: float, delta: float,
                     noise_mode: str = "global", num_shards: int = 1,
                     accountant: str = "pld", mechanism: str = "dpsgd",
                     strategy: tuple[float, ...] = ()) -> "AccountingSpec":
        """The spec of a run fed by a `dpbert.dp.sampling` sampler.

        Takes sampling, N, expected batch size, the number of cyclic groups (BandMF's bands)
        and, for Poisson sampling, the sampler's truncation size (calls_per_batch *
        physical_batch_size) from the sampler itself, so the accounted mechanism is the one
        really run.
        """
        max_batch = getattr(sampler, "max_batch_size", None)
        group = getattr(sampler, "group_size", sampler.num_examples)
        truncates = sampler.sampling == "poisson" and max_batch < group
        return cls(noise_multiplier=noise_multiplier,
                   expected_batch_size=sampler.expected_batch_size,
                   num_examples=sampler.num_examples, delta=delta, sampling=sampler.sampling,
                   noise_mode=noise_mode, num_shards=num_shards,
                   max_batch_size=max_batch if truncates else None, accountant=accountant,
                   mechanism=mechanism, num_bands=getattr(sampler, "num_bands", 1),
                   strategy=tuple(strategy))

    @property
    def group_size(self) -> int:
        """The units one step samples from: N, or N // b for BandMF's cyclic groups."""
        return self.num_examples // self.num_bands

    def rounds(self, steps: int) -> int:
        """The steps one unit can take part in among `steps` (what is composed): T for DP-SGD,
        ceil(T / b) for BandMF."""
        return bandmf.rounds(steps, self.num_bands) if self.mechanism == "bandmf" else steps

    @property
    def q(self) -> float:
        return sampling_probability(self.expected_batch_size, self.group_size)

    @property
    def effective_noise_multiplier(self) -> float:
        return effective_noise_multiplier(self.noise_multiplier, self.noise_mode, self.num_shards)

    @property
    def proven_bound(self) -> bool:
        return self.sampling == "poisson"

    def event(self, steps: int) -> dp_accounting.DpEvent:
        """The dp_accounting event of `steps` steps (BandMF: jax-privacy's)."""
        if self.mechanism == "bandmf":
            return bandmf.dp_event(self.effective_noise_multiplier, steps,
                                   num_bands=self.num_bands, sampling_prob=self.q,
                                   group_size=self.group_size,
                                   max_batch_size=self.max_batch_size)
        return make_dp_event(self.effective_noise_multiplier, self.q, steps,
                             num_examples=self.num_examples,
                             max_batch_size=self.max_batch_size)

    @property
    def accounted_by(self) -> accountants.Accountant:
        """The `Accountant` named by `accountant`."""
        return accountants.get(self.accountant)

    def epsilon(self, steps: int, *,
                pld_discretization: float = DEFAULT_PLD_DISCRETIZATION) -> float:
        """Epsilon after `steps` logical steps at this spec's delta (PLD: on the grid of
        `pld_discretization_for(self, steps, ...)`, coarser only where the default explodes)."""
        steps = check_int("steps", steps, minimum=0)
        return self.accounted_by.epsilon(((self, steps),), self.delta, pld_discretization)

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

    The same composition as `spec.epsilon` by a faster path (`Accountant.progress_epsilon`)
    where there is one: rebuilding the single-step distribution at every call costs seconds for
    truncated Poisson sampling. Reports and budgets use `spec.epsilon`, the accountant itself.
    """
    return spec.accounted_by.progress_epsilon(spec, steps)


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
    return first.accounted_by.epsilon(segments, first.delta)


def privacy_report(spec: AccountingSpec, steps: int, *, clip_norm: float | None,
                   privacy_unit: str | privacy_units.PrivacyUnit = "example",
                   epsilon: float | None = None) -> dict[str, Any]:
    """The numbers and flags of one mechanism's privacy statement, JSON-serialisable (the
    sentences about them: `dpbert.reporting.report.mechanism_report`).

    Args:
      spec: accounting parameters.
      steps: logical steps (noise draws) taken.
      clip_norm: C (None when unknown, e.g. in the CLI).
      privacy_unit: the `dpbert.core.units.PrivacyUnit` (or its name) that one sampled,
        clipped "example" is; the neighbouring relation adds or removes one such unit.
      epsilon: precomputed epsilon (else computed with `spec`).

    Returns:
      dict with epsilon, delta, noise_multiplier, effective_noise_multiplier,
      clip_norm, sampling, sampling_probability, expected_batch_size,
      max_batch_size, num_examples, steps, accountant, privacy_unit (its name), noise_mode,
      num_shards, proven_bound and mechanism ("dpsgd" | "bandmf"; BandMF adds num_bands, its
      strategy's coefficients, group_size and the rounds accounted).
    """
    unit = privacy_units.get(privacy_unit)
    if clip_norm is not None:
        check_positive("clip_norm", clip_norm)
    steps = check_int("steps", steps, minimum=0)
    if epsilon is None:
        epsilon = spec.epsilon(steps) if steps else 0.0
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
        "privacy_unit": unit.name,
        "noise_mode": spec.noise_mode,
        "num_shards": int(spec.num_shards),
        "proven_bound": spec.proven_bound,
        "mechanism": spec.mechanism,
        **({"num_bands": spec.num_bands, "strategy": list(spec.strategy),
            "group_size": spec.group_size, "rounds": spec.rounds(steps)}
           if spec.mechanism == "bandmf" else {}),
    }
